"""The Go NMO's e2e suite, run against a sandbox shaped like its CI cluster.

Why this module exists: ``tests/e2e/test_go_e2e.py`` runs the Go medik8s
operator's own ``test/e2e`` (built unchanged by ``hack/go-e2e-bin.sh``)
against nmo installed in-cluster. That suite assumes the cluster its CI
(OpenShift) runs on; this module gives the sandbox that shape, runs the
binary as upstream's ``hack/functest.sh`` runs it, and reads back its
ginkgo JSON report. What the shape is, and why:

* Control-plane nodes carry both role labels (``node-role.kubernetes.io/master``
  and ``.../control-plane``, as OpenShift's masters do) and the master
  ``NoSchedule`` taint. Both labels matter: the suite's test Deployment keeps
  off control-plane nodes with two *ORed* node-selector terms (master absent,
  OR control-plane absent), which a node with only one of them satisfies.
  ``real-1`` (the kubelet node the operator runs on, so its logs can be read
  through ``pods/log``) is always one; the three-control-plane shape adds the
  kwok nodes ``cp-1`` and ``cp-2``, which sort before ``real-1``, so the
  suite's 1st and 2nd control-plane nodes are the kwok ones and the
  operator's own node is never drained.
* Workers are kwok nodes (``node-1``, ``node-2``): the suite's busybox
  workload lands there, needs no image (there is no registry), and stays
  Terminating for its 80 s grace period (the sandbox's pod-delete stage), so
  the Go NMO's 30 s drain timeout is hit as in its CI. :class:`PodTracer`
  records that it did.
* "OpenShift": the ``config.openshift.io/v1`` ClusterVersion CRD is served,
  so discovery lists the group and the webhook applies the etcd quorum rule;
  the quorum guard is OpenShift's pre-4.11 ``etcd-quorum-guard``: a
  Deployment in ``openshift-etcd`` with one pod per control-plane node
  (required anti-affinity, the pause image, Ready) behind the PDB of the
  same name, ``maxUnavailable`` 0 with one control-plane node and 1 with
  three. A guard pod evicted by a drain is replaced by a pod that cannot
  schedule (its node is cordoned, the others have one), so the PDB then
  allows no more disruptions, which is what the suite's "2nd control-plane
  node" spec checks.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import json
import os
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from nmo.api import constants as c
from nmo_sandbox import Sandbox
from nmo_sandbox.images import PAUSE

Json = dict[str, Any]

OPERATOR_NS = c.OPERATOR_NAMESPACE
TEST_NAMESPACE = "node-maintenance-test"  # what hack/functest.sh exports
OPERATOR_POD_LABEL = "node-maintenance-operator="  # the suite's getOperatorPod selector
MASTER = "node-role.kubernetes.io/master"
CONTROL_PLANE = "node-role.kubernetes.io/control-plane"
CP_LABELS = {MASTER: "", CONTROL_PLANE: ""}
CP_TAINT = {"key": MASTER, "effect": "NoSchedule"}
REAL_NODE = "real-1"
GUARD_NS = "openshift-etcd"
GUARD = "etcd-quorum-guard"
GUARD_LABELS = {"k8s-app": GUARD}
CLUSTER_VERSION_CRD = "clusterversions.config.openshift.io"
CRDS = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
SUITE_GRACE = 80  # the suite's test pods: its DrainerTimeout (30 s) + 50 s
GO_DRAIN_TIMEOUT = 30


@dataclass(frozen=True)
class Shape:
    """One cluster shape the suite runs against."""

    name: str
    kwok_control_planes: tuple[str, ...]
    guard_max_unavailable: int
    workers: int = 2  # the suite moves its workload to a second worker

    @property
    def control_planes(self) -> tuple[str, ...]:
        return (*self.kwok_control_planes, REAL_NODE)

    @property
    def worker_names(self) -> tuple[str, ...]:
        return tuple(f"node-{i}" for i in range(1, self.workers + 1))


ONE_CP = Shape("one-control-plane", (), guard_max_unavailable=0)
THREE_CP = Shape("three-control-planes", ("cp-1", "cp-2"), guard_max_unavailable=1)


async def until(
    check: Callable[[], Awaitable[bool]], *, timeout: float, what: str, poll: float = 0.5
) -> None:
    deadline = time.monotonic() + timeout
    while not await check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
        await asyncio.sleep(poll)


async def post(api: httpx.AsyncClient, path: str, body: Json) -> None:
    resp = await api.post(path, json=body)
    assert resp.status_code == 201, f"POST {path}: {resp.status_code} {resp.text}"


async def make_control_plane(api: httpx.AsyncClient, node: str) -> None:
    """Both role labels and the master taint, as on an OpenShift master."""
    resp = await api.patch(
        f"/api/v1/nodes/{node}",
        json={"metadata": {"labels": CP_LABELS}, "spec": {"taints": [CP_TAINT]}},
        headers={"Content-Type": "application/strategic-merge-patch+json"},
    )
    assert resp.status_code == 200, f"labelling {node} control-plane: {resp.text}"


def cluster_version_crd() -> Json:
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": CLUSTER_VERSION_CRD},
        "spec": {
            "group": "config.openshift.io",
            "names": {
                "kind": "ClusterVersion",
                "listKind": "ClusterVersionList",
                "plural": "clusterversions",
                "singular": "clusterversion",
            },
            "scope": "Cluster",
            "versions": [
                {
                    "name": "v1",
                    "served": True,
                    "storage": True,
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "x-kubernetes-preserve-unknown-fields": True,
                        }
                    },
                }
            ],
        },
    }


def guard_deployment(replicas: int) -> Json:
    """OpenShift's pre-4.11 etcd-quorum-guard: one Ready pod per control-plane node."""
    term = {"labelSelector": {"matchLabels": GUARD_LABELS}, "topologyKey": "kubernetes.io/hostname"}
    control_plane = {"matchExpressions": [{"key": CONTROL_PLANE, "operator": "Exists"}]}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": GUARD, "namespace": GUARD_NS},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": GUARD_LABELS},
            "template": {
                "metadata": {"labels": GUARD_LABELS},
                "spec": {
                    "affinity": {
                        "nodeAffinity": {
                            "requiredDuringSchedulingIgnoredDuringExecution": {
                                "nodeSelectorTerms": [control_plane]
                            }
                        },
                        "podAntiAffinity": {
                            "requiredDuringSchedulingIgnoredDuringExecution": [term]
                        },
                    },
                    # The master taint only: tolerating everything would
                    # tolerate a cordon too, and the replacement of an evicted
                    # guard would return to its drained node.
                    "tolerations": [{"key": MASTER, "operator": "Exists", "effect": "NoSchedule"}],
                    "terminationGracePeriodSeconds": 3,
                    # Runs for real on real-1: the sandbox's pause image is in
                    # every real node's containerd.
                    "containers": [
                        {"name": "guard", "image": PAUSE.ref, "imagePullPolicy": "Never"}
                    ],
                },
            },
        },
    }


def guard_pdb(max_unavailable: int) -> Json:
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": GUARD, "namespace": GUARD_NS},
        "spec": {"maxUnavailable": max_unavailable, "selector": {"matchLabels": GUARD_LABELS}},
    }


async def apply_shape(sb: Sandbox, api: httpx.AsyncClient, shape: Shape) -> None:
    """Give a started sandbox (kwok workers, ``real-1``) the shape; returns when settled."""
    await post(api, CRDS, cluster_version_crd())
    for name in shape.kwok_control_planes:
        await sb.create_node(name, labels=CP_LABELS)
    for name in shape.control_planes:
        await make_control_plane(api, name)

    async def openshift() -> bool:
        return (await api.get("/apis/config.openshift.io/v1")).status_code == 200

    await until(openshift, timeout=60, what="discovery to serve config.openshift.io/v1")
    ns = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": GUARD_NS}}
    await post(api, "/api/v1/namespaces", ns)

    async def service_account() -> bool:
        path = f"/api/v1/namespaces/{GUARD_NS}/serviceaccounts/default"
        return (await api.get(path)).status_code == 200

    await until(service_account, timeout=60, what=f"the default ServiceAccount of {GUARD_NS}")
    count = len(shape.control_planes)
    await post(api, f"/apis/apps/v1/namespaces/{GUARD_NS}/deployments", guard_deployment(count))
    await post(
        api,
        f"/apis/policy/v1/namespaces/{GUARD_NS}/poddisruptionbudgets",
        guard_pdb(shape.guard_max_unavailable),
    )

    async def guarded() -> bool:
        pods = (await api.get(f"/api/v1/namespaces/{GUARD_NS}/pods")).json()["items"]
        ready = {p["spec"].get("nodeName") for p in pods if pod_ready(p)}
        pdb = (
            await api.get(f"/apis/policy/v1/namespaces/{GUARD_NS}/poddisruptionbudgets/{GUARD}")
        ).json()
        status = pdb.get("status") or {}
        return (
            ready == set(shape.control_planes)
            and status.get("observedGeneration") == pdb["metadata"]["generation"]
            and status.get("currentHealthy") == count
            and status.get("disruptionsAllowed") == shape.guard_max_unavailable
        )

    await until(
        guarded,
        timeout=120,
        what=f"a Ready guard pod on each of {shape.control_planes} and the PDB computed",
    )


def pod_ready(pod: Mapping[str, Any]) -> bool:
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(x.get("type") == "Ready" and x.get("status") == "True" for x in conditions)


# -- the suite's workload, watched while it runs ------------------------------------


@dataclass
class PodTrace:
    """What the tracer saw of one pod of the suite's test namespace."""

    name: str
    node: str = ""
    grace: int | None = None
    deleting_since: float | None = None  # monotonic, first poll that saw a deletionTimestamp
    deletion_grace: int | None = None  # metadata.deletionGracePeriodSeconds
    gone_at: float | None = None  # monotonic, first poll that no longer saw it

    @property
    def terminating_for(self) -> float | None:
        if self.deleting_since is None or self.gone_at is None:
            return None
        return self.gone_at - self.deleting_since


@dataclass
class PodTracer:
    """Polls the suite's namespace every second: where its pods ran, how they ended."""

    api: httpx.AsyncClient
    pods: dict[str, PodTrace] = field(default_factory=dict)
    errors: int = 0
    _stop: asyncio.Event = field(default_factory=asyncio.Event)

    async def run(self) -> None:
        path = f"/api/v1/namespaces/{TEST_NAMESPACE}/pods"
        while not self._stop.is_set():
            try:
                resp = await self.api.get(path)
            except httpx.TransportError:
                self.errors += 1
            else:
                if resp.status_code == 200:
                    self.observe(resp.json()["items"], time.monotonic())
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), 1.0)

    def observe(self, items: list[Json], now: float) -> None:
        seen = set()
        for pod in items:
            uid = pod["metadata"]["uid"]
            seen.add(uid)
            trace = self.pods.setdefault(uid, PodTrace(pod["metadata"]["name"]))
            trace.node = pod["spec"].get("nodeName") or trace.node
            trace.grace = pod["spec"].get("terminationGracePeriodSeconds")
            if pod["metadata"].get("deletionTimestamp") and trace.deleting_since is None:
                trace.deleting_since = now
                trace.deletion_grace = pod["metadata"].get("deletionGracePeriodSeconds")
        for uid, trace in self.pods.items():
            if uid not in seen and trace.gone_at is None:
                trace.gone_at = now

    def stop(self) -> None:
        self._stop.set()


# -- the ginkgo JSON report ---------------------------------------------------------


@dataclass(frozen=True)
class SpecResult:
    """One entry of the report: a spec (``It``) or a suite node (``[BeforeSuite]``)."""

    text: str
    state: str
    seconds: float
    message: str
    location: str
    output: str


def read_report(path: Path) -> tuple[bool, dict[str, SpecResult]]:
    """(SuiteSucceeded, results by full text) from ``--ginkgo.json-report``."""
    (suite,) = json.loads(path.read_text())
    results: dict[str, SpecResult] = {}
    for spec in suite.get("SpecReports") or []:
        kind = spec.get("LeafNodeType", "")
        if kind == "It":
            text = " ".join([*(spec.get("ContainerHierarchyTexts") or []), spec["LeafNodeText"]])
        else:
            text = f"[{kind}]"
        failure = spec.get("Failure") or {}
        where = failure.get("Location") or {}
        results[text] = SpecResult(
            text=text,
            state=spec.get("State", ""),
            seconds=int(spec.get("RunTime") or 0) / 1e9,
            message=str(failure.get("Message") or ""),
            location=f"{where.get('FileName', '')}:{where.get('LineNumber', '')}" if where else "",
            output=str(spec.get("CapturedGinkgoWriterOutput") or "")
            + str(spec.get("CapturedStdOutErr") or ""),
        )
    return bool(suite.get("SuiteSucceeded")), results


def suite_command(binary: Path, out_dir: Path) -> list[str]:
    """hack/functest.sh's ginkgo flags (--vv, --no-color) for the compiled suite, plus reports."""
    return [
        str(binary),
        "--ginkgo.vv",
        "--ginkgo.no-color",
        f"--ginkgo.json-report={out_dir / 'report.json'}",
        f"--ginkgo.junit-report={out_dir / 'junit.xml'}",
    ]


def suite_env(sb: Sandbox) -> dict[str, str]:
    """The suite's environment: hack/functest.sh's variables and the sandbox's kubeconfig."""
    return {
        **os.environ,
        "KUBECONFIG": str(sb.kubeconfig),
        "OPERATOR_NS": OPERATOR_NS,
        "TEST_NAMESPACE": TEST_NAMESPACE,
    }


def stamp() -> str:
    return dt.datetime.now(dt.UTC).strftime("%H:%M:%S")
