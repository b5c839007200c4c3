"""The Go NMO's CSV runs nmo's image; nmo's CSV replaces it in place, as OLM and OpenShift would.

One sandbox for the module: kwok nodes ``node-1``/``node-2`` (put into
maintenance), one real node (a kubelet and a containerd) that runs the
operator, no cert-manager. The sandbox has no OLM: :mod:`nmo_sandbox.olm`
creates what OLM's install strategy creates for a CSV (the ServiceAccount,
the RBAC, with the namespaced rules lifted cluster-wide as a global
OperatorGroup does, the webhook Service, the serving certificate Secret
mounted at ``/apiserver.local.config/certificates`` and
``/tmp/k8s-webhook-server/serving-certs``, the Deployment, the webhook
configurations), and an admin's Subscription ``config.nodeSelector`` keeps
the pods on the real node (a kwok node would only pretend to run them).

1. **The Go CSV** (``bundle/manifests`` of the Go NMO, read from
   ../shared/third_party at run time) with only its image swapped for
   ``localhost/nmo:dev`` (``imagePullPolicy: Never``): ``command:
   [/manager]``, its Go flags, a read-only root filesystem without a volume
   at /tmp, its 100Mi memory and 200m CPU limits, its CRD. The pod turns
   Ready through the kubelet's probes, its webhook refuses a CR for a
   missing node through OLM's Service, and a NodeMaintenance drains a kwok
   node and Succeeds; nmo's idle and peak cgroup memory under the 100Mi
   limit are printed (``-rP``).
2. **An OLM upgrade to nmo's bundle** (``hack/olm_bundle.py``): OLM applies
   the new CRD and updates the Deployment of the same name (the API server
   refuses a changed selector), and OpenShift's restricted-v2 SCC admits the
   pods in a namespace whose UID range starts at 1000650000
   (:func:`nmo_sandbox.olm.restricted_v2`: it refuses a fixed UID or fsGroup
   outside the range, as it would have refused the chart's 65532). The new
   pods run as UID 1000650000, group 0, turn Ready, serve nmo's webhooks and
   finish a maintenance.

A missing prerequisite (binaries, packages, the image build, the Go tree)
FAILS the module with one line.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from test_in_cluster import Release, denial, nm, pod_ready, probes_passed, wait_for

from nmo.api import constants as c
from nmo_sandbox import MissingBinariesError, Sandbox, SandboxError, find_binaries
from nmo_sandbox.gonmo import GoBundle, go_nmo_bundle
from nmo_sandbox.olm import (
    CERT_MOUNTS,
    OlmCertificate,
    bundle_objects,
    csv_install_objects,
    restricted_v2,
    service_name,
)
from nmo_sandbox.release import ensure_image

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
GENERATOR = ROOT / "hack" / "olm_bundle.py"
DEPLOYMENT = "node-maintenance-operator-controller-manager"
NM_PATH = f"/apis/{c.API_VERSION}/{c.PLURAL}"
MiB = 2**20
GO_MEMORY_LIMIT = 100 * MiB  # the Go CSV's resources.limits.memory
# An OpenShift namespace's openshift.io/sa.scc.uid-range: first UID, size.
UID_RANGE = (1000650000, 10000)
REAL = {"type": "real"}  # the Subscription's config.nodeSelector
FIGURES: dict[str, str] = {}


def figure(name: str, value: str) -> None:
    FIGURES[name] = value
    print(f"FIGURE {name}: {value}")


@dataclass
class Cluster:
    """The sandbox (as test_in_cluster's Release), the image and the Go bundle."""

    rel: Release
    helm: Path
    image: str
    go: GoBundle
    namespace: str
    dir: Path

    @property
    def sb(self) -> Sandbox:
        return self.rel.sb

    @property
    def api(self) -> httpx.AsyncClient:
        return self.rel.api

    async def kubectl(self, *args: str, objects: list[dict[str, Any]] | None = None) -> str:
        stream = None if objects is None else yaml.safe_dump_all(objects)
        done = await self.sb.kubectl(*args, input=stream)
        assert done.returncode == 0, f"kubectl {' '.join(args)}: {done.stderr}"
        return done.stdout

    async def pods(self) -> list[dict[str, Any]]:
        """The operator's pods that are not terminating, oldest first."""
        got = await self.rel.get(
            f"/api/v1/namespaces/{self.namespace}/pods",
            labelSelector="control-plane=controller-manager,node-maintenance-operator=",
        )
        items = [
            p for p in (got or {}).get("items", []) if not p["metadata"].get("deletionTimestamp")
        ]
        return sorted(items, key=lambda p: p["metadata"]["creationTimestamp"])

    async def exec(self, pod: str, *argv: str) -> subprocess.CompletedProcess[str]:
        return await self.sb.kubectl(
            "exec", "-n", self.namespace, pod, "-c", "manager", "--", *argv
        )

    def certificate(self) -> OlmCertificate:
        """A serving certificate for OLM's Service, as OLM issues one (the sandbox CA signs)."""
        svc = service_name(DEPLOYMENT)
        issued = self.sb.issue_serving_cert(
            self.dir / "olm-cert",
            [f"{svc}.{self.namespace}", f"{svc}.{self.namespace}.svc"],
            name=f"olm-{uuid.uuid4().hex[:6]}",
        )
        return OlmCertificate(
            issued.cert_file.read_bytes(), issued.key_file.read_bytes(), issued.ca_bundle
        )


@pytest.fixture(scope="module")
async def cluster(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Cluster]:
    try:
        binaries = find_binaries()
        go = go_nmo_bundle()
    except (MissingBinariesError, SandboxError) as exc:
        pytest.fail(str(exc), pytrace=False)
    timings: dict[str, float] = {}
    t0 = time.monotonic()
    try:
        image = (await ensure_image()).ref
    except SandboxError as exc:
        pytest.fail(str(exc), pytrace=False)
    timings["image"] = time.monotonic() - t0
    directory = tmp_path_factory.mktemp("olm-csv")
    sandbox = Sandbox(directory / "sandbox", nodes=2, real_nodes=1, binaries=binaries)
    t1 = time.monotonic()
    try:
        await sandbox.start()
    except SandboxError as exc:
        pytest.fail(f"the sandbox with a real node did not start: {exc}", pytrace=False)
    try:
        timings["sandbox"] = time.monotonic() - t1
        t2 = time.monotonic()
        await sandbox.load_image(image)
        timings["load image"] = time.monotonic() - t2
        namespace = go.csv["metadata"]["annotations"]["operatorframework.io/suggested-namespace"]
        async with sandbox.client(user_agent="nmo-olm-csv-tests") as api:
            rel = Release(sandbox, api, {}, timings)
            yield Cluster(rel, binaries.path("helm"), image, go, namespace, directory)
        print("TIMINGS " + ", ".join(f"{k} {v:.1f}s" for k, v in timings.items()))
        for name, value in FIGURES.items():
            print(f"FIGURE {name}: {value}")
    finally:
        await sandbox.stop()


def defaulted(want: Any, got: Any) -> bool:
    """Whether ``got`` is ``want`` with the API server's defaults added."""
    if isinstance(want, dict):
        return isinstance(got, dict) and all(
            k in got and defaulted(v, got[k]) for k, v in want.items()
        )
    if isinstance(want, list):
        return isinstance(got, list) and len(got) == len(want) and all(map(defaulted, want, got))
    return bool(want == got)


def go_csv_with_nmos_image(go: GoBundle, image: str) -> dict[str, Any]:
    """The Go CSV with only its manager's image swapped (pulled from nowhere: Never)."""
    csv = json.loads(json.dumps(go.csv))
    [deployment] = csv["spec"]["install"]["spec"]["deployments"]
    [manager] = deployment["spec"]["template"]["spec"]["containers"]
    manager["image"] = image
    manager["imagePullPolicy"] = "Never"
    return csv


@dataclass
class Installed:
    csv: dict[str, Any]
    pod: dict[str, Any]


@pytest.fixture(scope="module")
async def go_csv(cluster: Cluster) -> Installed:
    """The Go CSV installed as OLM installs it, with nmo's image, its pod Ready."""
    ns = cluster.namespace
    csv = go_csv_with_nmos_image(cluster.go, cluster.image)
    started = time.monotonic()
    await cluster.kubectl("create", "-f", "-", objects=[
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}},
        *bundle_objects(cluster.go.manifests.values(), ns),
        *csv_install_objects(csv, ns, cluster.certificate(), node_selector=REAL),
    ])  # fmt: skip

    async def one_ready() -> list[dict[str, Any]] | None:
        pods = await cluster.pods()
        return pods if len(pods) == 1 and pod_ready(pods[0]) else None

    try:
        (pod,) = await wait_for(one_ready, timeout=120, what="the Go CSV's pod to be Ready")
    except BaseException:
        print(await cluster.kubectl("describe", "pods", "-n", ns))
        print(await cluster.kubectl("logs", "-n", ns, "-l", "control-plane=controller-manager"))
        raise
    cluster.rel.timings["Go CSV install to Ready"] = time.monotonic() - started
    return Installed(csv, pod)


# -- 1. the Go CSV, nmo's image ------------------------------------------------------


async def test_the_go_csv_runs_nmos_image_ready_through_the_kubelet_probes(
    cluster: Cluster, go_csv: Installed
) -> None:
    pod = go_csv.pod
    [want] = cluster.go.deployment["spec"]["template"]["spec"]["containers"]
    [got] = pod["spec"]["containers"]
    assert pod["spec"]["nodeName"] == "real-1" and pod["status"].get("podIP"), pod["status"]
    # The Go CSV's container as it is, but the image: its command, flags,
    # probes, limits and read-only root; OLM's two certificate mounts and
    # nothing at /tmp.
    assert (got["image"], got["imagePullPolicy"]) == (cluster.image, "Never")
    for key in ("command", "args", "ports", "livenessProbe", "readinessProbe", "securityContext"):
        assert defaulted(want[key], got[key]), (key, want[key], got[key])
    assert got["command"] == ["/manager"]
    assert (
        got["resources"]["limits"]
        == {"cpu": "200m", "memory": "100Mi"}
        == want["resources"]["limits"]
    )
    assert got["securityContext"]["readOnlyRootFilesystem"] is True
    assert [
        (m["name"], m["mountPath"])
        for m in got["volumeMounts"]
        if not m["mountPath"].startswith("/var/run/secrets")
    ] == [(name, path) for name, path, _ in CERT_MOUNTS]
    (status,) = pod["status"]["containerStatuses"]
    assert status["ready"] and status["restartCount"] == 0, status
    assert await probes_passed(cluster.rel, pod, "Readiness") > 0  # the kubelet's prober
    name = pod["metadata"]["name"]
    who = await cluster.exec(name, "id", "-u")
    assert who.stdout.strip() == "65532", who  # the image's USER: runAsNonRoot only
    tmp = await cluster.exec(name, "touch", "/tmp/nmo-probe")
    assert tmp.returncode != 0 and "Read-only file system" in tmp.stderr, tmp
    lease = await cluster.rel.get(
        f"/apis/coordination.k8s.io/v1/namespaces/{cluster.namespace}/leases/{c.LEADER_ELECTION_ID}"
    )
    assert lease is not None and lease["spec"]["holderIdentity"].startswith(name), lease
    figure(
        "Go CSV install",
        f"pod {name} Ready {cluster.rel.timings['Go CSV install to Ready']:.1f}s after create",
    )


async def test_the_go_csvs_webhook_refuses_a_missing_node(
    cluster: Cluster, go_csv: Installed
) -> None:
    """The Go CSV's webhook definition, through OLM's Service and certificate."""
    ghost = f"ghost-{uuid.uuid4().hex[:6]}"
    resp = await cluster.api.post(NM_PATH, json=nm(f"nm-{ghost}", ghost))
    assert resp.status_code == 403, resp.text
    assert denial(ghost) in resp.json()["message"]
    resp = await cluster.api.post(NM_PATH, params={"dryRun": "All"}, json=nm("probe", "node-2"))
    assert resp.status_code == 201, resp.text


async def drain(cluster: Cluster, node: str, pods: int) -> float:
    """Put ``pods`` bare pods on kwok ``node``, maintain it to Succeeded and back: seconds taken.

    Each pod takes its 1 s grace period to terminate (the sandbox's kwok stages)."""
    ns = f"drain-{uuid.uuid4().hex[:6]}"
    names = [f"app-{i}" for i in range(pods)]
    await cluster.kubectl("create", "-f", "-", objects=[
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}},
        *({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": n, "namespace": ns},
           "spec": {"nodeName": node, "terminationGracePeriodSeconds": 1,
                    "containers": [{"name": "app", "image": "app"}]}}
          for n in names),
    ])  # fmt: skip

    async def running() -> bool:
        got = await cluster.rel.get(f"/api/v1/namespaces/{ns}/pods")
        phases = [p["status"].get("phase") for p in (got or {}).get("items", [])]
        return phases.count("Running") == pods

    await wait_for(running, timeout=60, what=f"{pods} pods running on {node}")
    name = f"nm-{uuid.uuid4().hex[:6]}"
    started = time.monotonic()
    resp = await cluster.api.post(NM_PATH, json=nm(name, node))
    assert resp.status_code == 201, resp.text

    async def succeeded() -> bool:
        return await cluster.rel.phase(name) == "Succeeded"

    await wait_for(succeeded, timeout=90, what=f"{name} to succeed")
    took = time.monotonic() - started
    left = await cluster.rel.get(f"/api/v1/namespaces/{ns}/pods")
    assert not (left or {}).get("items"), "the drained pods are still there"
    got = await cluster.rel.get(f"/api/v1/nodes/{node}")
    assert got is not None and got["spec"].get("unschedulable") is True
    assert set(c.MAINTENANCE_TAINT_KEYS) <= {t["key"] for t in got["spec"].get("taints") or []}
    assert (await cluster.api.delete(f"{NM_PATH}/{name}")).status_code == 200

    async def restored() -> bool:
        now = await cluster.rel.get(f"/api/v1/nodes/{node}")
        assert now is not None
        taints = {t["key"] for t in now["spec"].get("taints") or []}
        return (
            await cluster.rel.get(f"{NM_PATH}/{name}") is None
            and not now["spec"].get("unschedulable")
            and not taints & set(c.MAINTENANCE_TAINT_KEYS)
        )

    await wait_for(restored, timeout=60, what=f"{node} to be restored and {name} gone")
    return took


def mib(n: int) -> str:
    return f"{n / MiB:.1f} MiB"


async def test_a_maintenance_drains_a_kwok_node_within_the_go_csvs_memory_limit(
    cluster: Cluster, go_csv: Installed
) -> None:
    container = go_csv.pod["status"]["containerStatuses"][0]["containerID"]
    idle = cluster.sb.container_memory(container)
    assert idle["limit"] == GO_MEMORY_LIMIT, idle
    took = await drain(cluster, "node-1", pods=30)
    after = cluster.sb.container_memory(container)
    assert idle["rss"] > 0 and after["peak"] < GO_MEMORY_LIMIT, after
    [pod] = await cluster.pods()
    assert pod["status"]["containerStatuses"][0]["restartCount"] == 0  # never OOM-killed
    figure(
        "Go CSV memory (cgroup, limit 100 MiB)",
        f"idle: rss {mib(idle['rss'])}, usage {mib(idle['usage'])}; "
        f"after a 30-pod drain: rss {mib(after['rss'])}, usage {mib(after['usage'])}; "
        f"peak usage since start {mib(after['peak'])}",
    )
    figure("Go CSV maintenance", f"30 pods drained, Succeeded {took:.1f}s after create")


# -- 2. OLM replaces it with nmo's bundle; restricted-v2 admits the pods ---------------


def nmo_bundle(cluster: Cluster) -> list[dict[str, Any]]:
    """nmo's bundle as `make bundle` writes it, running the loaded image."""
    out = cluster.dir / "nmo-olm"
    done = subprocess.run(
        [sys.executable, str(GENERATOR), "--out", str(out), "--image", cluster.image,
         "--helm", str(cluster.helm), "--set", "image.pullPolicy=Never"],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return [yaml.safe_load(p.read_text()) for p in sorted((out / "bundle" / "manifests").iterdir())]


async def test_nmos_csv_replaces_it_in_place_and_runs_as_restricted_v2_assigns(
    cluster: Cluster, go_csv: Installed
) -> None:
    ns = cluster.namespace
    manifests = nmo_bundle(cluster)
    [csv] = [m for m in manifests if m["kind"] == "ClusterServiceVersion"]
    [dep] = csv["spec"]["install"]["spec"]["deployments"]
    # What the SCC does to each pod, done to the template the pods come from.
    dep["spec"]["template"] = restricted_v2(dep["spec"]["template"], UID_RANGE)
    objects = bundle_objects(manifests, ns) + csv_install_objects(
        csv, ns, cluster.certificate(), node_selector=REAL
    )
    started = time.monotonic()
    # OLM: the new CRD and objects applied, the Deployment of the same name
    # updated (PUT), new webhook configurations, then the old CSV's removed.
    by_update = ("Deployment", "ValidatingWebhookConfiguration")
    await cluster.kubectl(
        "apply", "--server-side", "--force-conflicts", "-f", "-",
        objects=[o for o in objects if o["kind"] not in by_update],
    )  # fmt: skip
    await cluster.kubectl(
        "replace", "-f", "-", objects=[o for o in objects if o["kind"] == "Deployment"]
    )
    await cluster.kubectl(
        "create",
        "-f",
        "-",
        objects=[o for o in objects if o["kind"] == "ValidatingWebhookConfiguration"],
    )
    old = f"olm.owner={go_csv.csv['metadata']['name']}"
    await cluster.kubectl(
        "delete", "validatingwebhookconfigurations,clusterroles,clusterrolebindings", "-l", old
    )
    await cluster.kubectl("delete", "roles,rolebindings", "-n", ns, "-l", old)

    deployment = await cluster.rel.get(f"/apis/apps/v1/namespaces/{ns}/deployments/{DEPLOYMENT}")
    assert deployment is not None
    replicas = csv["spec"]["install"]["spec"]["deployments"][0]["spec"]["replicas"]

    async def rolled() -> list[dict[str, Any]] | None:
        pods = await cluster.pods()
        new = [p for p in pods if p["metadata"]["name"] != go_csv.pod["metadata"]["name"]]
        ready = [p for p in new if pod_ready(p)]
        return ready if len(ready) == replicas == len(pods) else None

    try:
        pods = await wait_for(rolled, timeout=150, what=f"{replicas} pods of nmo's CSV to be Ready")
    except BaseException:
        print(await cluster.kubectl("describe", "pods", "-n", ns))
        raise
    took = time.monotonic() - started
    for pod in pods:
        name = pod["metadata"]["name"]
        assert pod["spec"]["nodeName"] == "real-1"
        assert pod["status"]["containerStatuses"][0]["restartCount"] == 0
        assert await probes_passed(cluster.rel, pod, "Readiness") > 0
        ids = [(await cluster.exec(name, "id", flag)).stdout.split() for flag in ("-u", "-g", "-G")]
        assert ids == [["1000650000"], ["0"], ["0", "1000650000"]], ids  # uid, group 0, fsGroup
    hooks = await cluster.rel.get(
        "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations"
    )
    names = sorted(h["name"] for cfg in (hooks or {}).get("items", []) for h in cfg["webhooks"])
    assert names == sorted([c.WEBHOOK_NAME, "vnodemaintenance-update.kb.io"]), names
    crd = await cluster.rel.get(
        f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{c.CRD_NAME}"
    )
    assert crd is not None and crd["spec"]["versions"][0].get("additionalPrinterColumns"), (
        "nmo's CRD"
    )

    ghost = f"ghost-{uuid.uuid4().hex[:6]}"
    resp = await cluster.api.post(NM_PATH, json=nm(f"nm-{ghost}", ghost))
    assert resp.status_code == 403 and denial(ghost) in resp.json()["message"], resp.text
    drained = await drain(cluster, "node-2", pods=10)
    figure(
        "OLM upgrade to nmo's CSV",
        f"{replicas} pods Ready as uid 1000650000 gid 0 {took:.1f}s after the update; "
        f"a 10-pod drain Succeeded {drained:.1f}s after create",
    )
