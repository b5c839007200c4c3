"""The Go NMO's own e2e suite passes against nmo, unchanged (issue 19, item 2).

The Go medik8s operator's ``test/e2e`` (ginkgo), built from
``../shared/third_party``'s snapshot by ``hack/go-e2e-bin.sh`` (``make
go-e2e-bin``), runs as upstream's ``hack/functest.sh`` runs it (its
``OPERATOR_NS`` and ``TEST_NAMESPACE``, ``--vv --no-color``) against nmo
installed in-cluster as a user installs it (the image from ``make image``
loaded into the real node, the chart with :func:`install_args` and
cert-manager's certificate), on sandboxes shaped like the suite's CI
cluster (:mod:`go_suite` says how and why):

* ``one-control-plane``: ``real-1`` is the only control-plane node, so the
  webhook must refuse its maintenance (etcd quorum);
* ``three-control-planes``: ``cp-1``, ``cp-2`` (kwok) and ``real-1``, so the
  1st may go into maintenance and the 2nd then may not.

Both run at once (the suite spends most of its 8 minutes waiting out its own
180 s "no event" checks), each in its own sandbox. One chart value differs
from the defaults: ``deployment.replicas=1``, the Go NMO's own replica count;
the suite reads the operator's log from the first pod it lists with the
operator label, which must be the leader.

Each spec is a test here, asserted against the table :data:`EXPECTED`: every
spec passes, except that the suite itself skips the specs that need another
number of control-plane nodes; each of those passes in the other shape, and
is listed with the suite's reason. Per-spec states and durations are printed
(``-rP``). A missing prerequisite (the suite binary, the sandbox binaries,
the image) FAILS with one line.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from go_suite import (
    GO_DRAIN_TIMEOUT,
    ONE_CP,
    OPERATOR_NS,
    OPERATOR_POD_LABEL,
    SUITE_GRACE,
    THREE_CP,
    PodTrace,
    PodTracer,
    Shape,
    SpecResult,
    apply_shape,
    read_report,
    stamp,
    suite_command,
    suite_env,
)

from nmo_sandbox import Binaries, Sandbox, SandboxError, find_binaries
from nmo_sandbox.certmanager import find_cert_manager
from nmo_sandbox.realnodes import check_host_tools
from nmo_sandbox.release import ensure_image, install_args

ROOT = Path(__file__).resolve().parents[2]
SUITE_SCRIPT = ROOT / "hack" / "go-e2e-bin.sh"
START_TIMEOUT = 240.0  # two sandboxes with a real node and cert-manager start at once
SUITE_TIMEOUT = 1200.0  # the suite's waits add up to about 8 minutes per shape
SHAPES = (ONE_CP, THREE_CP)

# The module fixture runs both shapes (about 10 minutes) inside the first test.
pytestmark = [pytest.mark.integration, pytest.mark.timeout(1800)]

PASS = "passed"
SMALL = "cluster has less than 3 master/control-plane nodes and is to small for running this test"
TOO_SMALL = (
    "cluster has less than 3 master/control-plane nodes and is too small for running this test"
)
BIG = "with 3 or more master/control-plane it should not fail"
SM = "Starting Maintenance"
# spec text -> shape -> PASS, or the reason the suite gives when it skips the
# spec for that shape. Every spec passes in at least one shape.
EXPECTED: dict[str, dict[str, str]] = {
    f"{SM} for the 1st master/control-plane node should succeed": {
        ONE_CP.name: SMALL,
        THREE_CP.name: PASS,
    },
    f"{SM} for the 1st master/control-plane node should fail": {
        ONE_CP.name: PASS,
        THREE_CP.name: BIG,
    },
    f"{SM} for the 2nd master/control-plane node should fail": {
        ONE_CP.name: TOO_SMALL,
        THREE_CP.name: PASS,
    },
    f"{SM} for a not existing node should fail": {ONE_CP.name: PASS, THREE_CP.name: PASS},
    f"{SM} for a worker node shoud put the node under maintenance": {
        ONE_CP.name: PASS,
        THREE_CP.name: PASS,
    },
}
SUITE_NODES = ("[BeforeSuite]", "[AfterSuite]")


@dataclass
class Run:
    """One shape's sandbox, install and suite run."""

    shape: Shape
    setup_seconds: float
    seconds: float
    returncode: int
    succeeded: bool
    specs: dict[str, SpecResult]
    log: Path
    operator_log: str
    pods: dict[str, PodTrace]


def tail(text: str, n: int = 3000) -> str:
    return text[-n:]


class SetupError(Exception):
    """A shape's sandbox, install or suite could not run; its tests fail with this."""


def locate_suite() -> Path:
    res = subprocess.run(
        ["bash", str(SUITE_SCRIPT), "--check"], capture_output=True, text=True, check=False
    )
    if res.returncode != 0:
        pytest.fail(
            "the Go NMO's e2e suite is not built: run `make go-e2e-bin` (hack/go-e2e-bin.sh)",
            pytrace=False,
        )
    return Path(res.stdout.strip().splitlines()[-1])


async def run_shape(
    shape: Shape, binary: Path, bins: Binaries, ref: str, *, out: Path, sandbox_dir: Path
) -> Run:
    """A sandbox in ``sandbox_dir``: shape it, install, run the suite; artifacts in ``out``."""
    t0 = time.monotonic()
    sb = Sandbox(
        sandbox_dir, nodes=shape.workers, real_nodes=1, cert_manager=True, binaries=bins,
        timeout=START_TIMEOUT,
    )  # fmt: skip
    try:
        await sb.start()
    except SandboxError as exc:
        raise SetupError(f"{shape.name}: the sandbox did not start: {exc}") from exc
    try:
        await sb.load_image(ref)
        async with sb.client(user_agent="nmo-go-e2e") as api:
            await apply_shape(sb, api, shape)
            installed = await sb.helm(
                "install", *install_args(ref), "--set", "deployment.replicas=1",
                "--wait", "--timeout", "180s",
            )  # fmt: skip
            if installed.returncode != 0:
                pods = await sb.kubectl("get", "pods", "-A", "-o", "wide")
                raise SetupError(
                    f"{shape.name}: helm install failed: {installed.stderr.strip()}\n{pods.stdout}"
                )
            setup = time.monotonic() - t0
            print(f"{stamp()} {shape.name}: sandbox shaped and chart installed in {setup:.0f}s")
            tracer = PodTracer(api)
            tracing = asyncio.create_task(tracer.run(), name=f"trace-{shape.name}")
            log = out / "suite.log"
            t1 = time.monotonic()
            try:
                with log.open("wb") as sink:
                    proc = await asyncio.create_subprocess_exec(
                        *suite_command(binary, out), cwd=out, env=suite_env(sb),
                        stdin=subprocess.DEVNULL, stdout=sink, stderr=subprocess.STDOUT,
                    )  # fmt: skip
                    try:
                        code = await asyncio.wait_for(proc.wait(), SUITE_TIMEOUT)
                    except TimeoutError:
                        with contextlib.suppress(ProcessLookupError):
                            proc.kill()
                        await proc.wait()
                        raise SetupError(
                            f"{shape.name}: the suite ran past {SUITE_TIMEOUT:.0f}s; "
                            f"its log: {log}\n{log.read_text(errors='replace')[-3000:]}"
                        ) from None
            finally:
                tracer.stop()
                await tracing
            seconds = time.monotonic() - t1
            logs = await sb.kubectl(
                "logs", "-n", OPERATOR_NS, "-l", OPERATOR_POD_LABEL, "-c", "manager", "--tail=-1"
            )
            (out / "operator.log").write_text(logs.stdout + logs.stderr)
        report = out / "report.json"
        if not report.exists():
            raise SetupError(
                f"{shape.name}: the suite wrote no report (exit {code}); its log: {log}\n"
                + log.read_text(errors="replace")[-3000:]
            )
        succeeded, specs = read_report(report)
        return Run(shape, setup, seconds, code, succeeded, specs, log, logs.stdout, tracer.pods)
    finally:
        await sb.stop()
        keep_logs(sb.layout.logs_dir, out / "sandbox-logs")


def keep_logs(logs: Path, to: Path) -> None:
    """The components' logs (not the audit log), before the sandbox directory goes."""
    if logs.is_dir():
        shutil.copytree(logs, to, ignore=shutil.ignore_patterns("audit*"))


def make_dirs(path: Path) -> Path:
    path.mkdir(parents=True)
    return path


@pytest.fixture(scope="module")
async def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Run | str]:
    binary = locate_suite()
    try:  # every prerequisite up front: a missing one fails the module with one line
        bins = find_binaries().check_real_nodes()
        check_host_tools()
        find_cert_manager()
    except SandboxError as exc:
        pytest.fail(str(exc), pytrace=False)
    try:
        image = await ensure_image()
    except SandboxError as exc:
        pytest.fail(str(exc), pytrace=False)
    base = tmp_path_factory.mktemp("go-e2e")  # reports and logs, kept
    started = time.monotonic()
    # The sandboxes in a short directory: a real node's unix socket paths
    # must fit the kernel's 107 bytes, and an xdist worker's tmp path is long.
    with tempfile.TemporaryDirectory(prefix="nmo-go-e2e-") as short:
        jobs = []
        for s in SHAPES:
            out, sandbox_dir = make_dirs(base / s.name), Path(short) / f"{len(s.control_planes)}cp"
            jobs.append(run_shape(s, binary, bins, image.ref, out=out, sandbox_dir=sandbox_dir))
        done = await asyncio.gather(*jobs, return_exceptions=True)
    results: dict[str, Run | str] = {}
    for shape, got in zip(SHAPES, done, strict=True):
        if isinstance(got, Run):
            results[shape.name] = got
        elif isinstance(got, SetupError):
            results[shape.name] = str(got)
        elif isinstance(got, AssertionError):  # the shape did not settle (go_suite.until)
            results[shape.name] = f"{shape.name}: {got}"
        else:
            raise got
    print(
        f"GO E2E both shapes in {time.monotonic() - started:.0f}s (image {image.seconds:.0f}s); "
        f"reports and logs in {base}"
    )
    for name, run in results.items():
        if isinstance(run, str):
            print(f"GO E2E {name}: NOT RUN: {run}")
            continue
        print(
            f"GO E2E {name}: exit {run.returncode} after {run.seconds:.0f}s "
            f"(setup {run.setup_seconds:.0f}s)"
        )
        for spec in run.specs.values():
            why = f"  ({spec.message})" if spec.state != PASS else ""
            print(f"  {spec.state:8} {spec.seconds:6.1f}s  {spec.text}{why}")
    return results


def run_of(runs: dict[str, Run | str], shape: str) -> Run:
    run = runs[shape]
    if isinstance(run, str):
        pytest.fail(run, pytrace=False)
    return run


CASES = [(shape.name, spec) for spec in EXPECTED for shape in SHAPES]


@pytest.mark.parametrize(
    ("shape", "spec"), CASES, ids=[f"{s}:{t.removeprefix(SM + ' ')}" for s, t in CASES]
)
def test_spec(runs: dict[str, Run | str], shape: str, spec: str) -> None:
    run = run_of(runs, shape)
    got = run.specs.get(spec)
    assert got is not None, f"the suite reported no spec {spec!r}: {sorted(run.specs)}"
    want = EXPECTED[spec][shape]
    if want == PASS:
        assert got.state == PASS, (
            f"{got.state} after {got.seconds:.1f}s at {got.location}: {got.message}\n"
            f"--- the spec's output (tail) ---\n{tail(got.output)}\n"
            f"--- the operator's log (tail) ---\n{tail(run.operator_log)}\n"
            f"--- full suite log: {run.log}"
        )
        print(f"{shape}: passed in {got.seconds:.1f}s: {spec}")
    else:
        assert (got.state, got.message) == ("skipped", want), (got.state, got.message)
        others = [
            f"{s}: {r.specs[spec].state}"
            for s, r in runs.items()
            if s != shape and isinstance(r, Run) and spec in r.specs
        ]
        print(f"{shape}: skipped by the suite for the cluster's shape ({want}); {others}")


@pytest.mark.parametrize("shape", [s.name for s in SHAPES])
def test_the_suite_ran_exactly_its_specs_and_exited_0(
    runs: dict[str, Run | str], shape: str
) -> None:
    run = run_of(runs, shape)
    assert set(run.specs) == {*EXPECTED, *SUITE_NODES}, sorted(run.specs)
    for node in SUITE_NODES:
        got = run.specs[node]
        assert got.state == PASS, f"{node}: {got.state}: {got.message}\n{tail(got.output)}"
    assert run.succeeded and run.returncode == 0, (run.returncode, run.log)


@pytest.mark.parametrize("shape", [s.name for s in SHAPES])
def test_the_workload_ran_on_kwok_workers_and_stayed_terminating_past_the_drain_timeout(
    runs: dict[str, Run | str], shape: str
) -> None:
    """The premise of the worker spec, as in the Go NMO's CI: its busybox pods
    run on workers (here kwok ones, which need no image) and an evicted one
    stays Terminating for its own grace period, past the Go NMO's 30 s drain
    timeout, so the operator has to requeue with its fixed duration."""
    run = run_of(runs, shape)
    spec = SHAPES[[s.name for s in SHAPES].index(shape)]
    pods = list(run.pods.values())
    assert len(pods) >= 2, pods  # the original and its replacement
    assert {p.node for p in pods} <= set(spec.worker_names), pods
    assert all(p.grace == SUITE_GRACE for p in pods), pods
    evicted = [p for p in pods if p.terminating_for is not None]
    assert evicted, f"no pod of the suite was seen to terminate and go: {pods}"
    for pod in evicted:
        assert pod.deletion_grace == SUITE_GRACE, pod  # its own grace period, as kubectl drain
        assert pod.terminating_for is not None
        assert pod.terminating_for >= SUITE_GRACE - 5 > GO_DRAIN_TIMEOUT, pod
    print(
        f"{shape}: pods {[(p.name, p.node) for p in pods]}; "
        + ", ".join(f"{p.name} Terminating {p.terminating_for:.0f}s" for p in evicted)
    )
