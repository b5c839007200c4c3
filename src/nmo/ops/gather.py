"""``nmo gather``: a must-gather bundle of everything maintenance-related.

Support needs the same dozen objects for every maintenance problem: nodes,
the CRD and CRs, the medik8s leases, the maintenance events, the operator's
pods, logs, Deployment and webhook configuration, the PDBs that block a
drain, and node metrics. :class:`Gatherer` collects them into a timestamped
directory and a ``.tar.gz`` next to it, with ``summary.json`` and
``SUMMARY.txt`` saying what was collected and what was not.

Guarantees: Secrets are never read, the pods of workloads on maintained
nodes are cut down to the fields a diagnosis needs, credential-like values
are redacted by name and by shape in every file (:mod:`nmo.ops.bundle`), and
the bundle is private to its writer (directories 0700, files 0600, the
archive included); an item that fails (403, 404, an unserved API) is
recorded and the bundle is still written; only an unreachable API server
(:class:`Unreachable`) stops the gather. The same code backs the
``must-gather/collection-scripts/gather`` entrypoint.
"""

from __future__ import annotations

import json
import os
import tarfile
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml

from nmo import __version__
from nmo.api import constants as c
from nmo.kube.client import Kube, Params, api_path, nm_path, node_path
from nmo.kube.errors import Forbidden, KubeError, NotFound, Transient, Unauthorized
from nmo.ops.bundle import (
    MAINTENANCE_REASONS,
    Item,
    our_webhook_configs,
    pdbs_covering,
    pod_for_diagnosis,
    redact,
    redact_text,
    summary_text,
)

Obj = dict[str, Any]

NM_PATH = nm_path()
METRICS_GROUP = "metrics.k8s.io"


class Unreachable(Exception):
    """The API server cannot be reached (or refuses our credentials at all)."""


@dataclass(frozen=True)
class GatherSettings:
    dest: Path
    operator_namespace: str = c.OPERATOR_NAMESPACE
    lease_namespace: str = c.LEASE_NAMESPACE_DEFAULT
    since: float | None = None  # seconds of logs to keep; None is all


@dataclass(frozen=True)
class Bundle:
    directory: Path
    archive: Path
    items: list[Item]


def _status_of(exc: KubeError) -> str:
    if isinstance(exc, Forbidden):
        return "forbidden"
    if isinstance(exc, NotFound):
        return "not-found"
    return "error"


def _list(items: list[Obj], kind: str, api_version: str = "v1", **extra: Any) -> Obj:
    return {"apiVersion": api_version, "kind": f"{kind}List", "items": items, **extra}


class Gatherer:
    """Collects one bundle; every item is reported through ``progress``."""

    def __init__(
        self,
        kube: Kube,
        settings: GatherSettings,
        *,
        progress: Callable[[Item], None] = lambda item: None,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self.kube = kube
        self.s = settings
        self.progress = progress
        self.clock = clock
        self.items: list[Item] = []
        self.root = Path()

    def _record(self, item: Item) -> Item:
        self.items.append(item)
        self.progress(item)
        return item

    def _write(self, rel: str, data: Any) -> None:
        """Write one file of the bundle, redacted, readable by its owner only."""
        path = self.root / rel
        _private_dirs(self.root, path.parent)
        text = redact_text(data) if isinstance(data, str) else _dump(redact(data))
        _private_write(path, text.encode())

    async def _get(self, name: str, rel: str, path: str) -> Obj | None:
        try:
            obj = await self.kube.get(path)
        except KubeError as exc:
            self._record(Item(name, status=_status_of(exc), detail=str(exc)))
            return None
        self._write(rel, obj)
        self._record(Item(name, file=rel))
        return obj

    async def _list(
        self, name: str, rel: str, path: str, *, params: Params | None = None
    ) -> list[Obj] | None:
        try:
            items = list((await self.kube.list_all(path, params=params)).get("items") or [])
        except KubeError as exc:
            self._record(Item(name, status=_status_of(exc), detail=str(exc)))
            return None
        kind = path.rstrip("/").rpartition("/")[2]
        self._write(rel, {"kind": "List", "apiVersion": "v1", "source": kind, "items": items})
        self._record(Item(name, file=rel, count=len(items)))
        return items

    async def run(self) -> Bundle:
        started = self.clock()
        try:
            await self.kube.get("/api/v1")  # discovery: readable by any authenticated user
        except (Transient, Unauthorized) as exc:
            raise Unreachable(f"cannot reach the API server {self.kube.server}: {exc}") from exc
        self.root = self._new_dir(started)
        ns = self.s.operator_namespace
        nodes = await self._list("nodes", "cluster/nodes.yaml", node_path()) or []
        await self._get(
            "nodemaintenance CRD",
            "cluster/crd-nodemaintenances.yaml",
            api_path("apiextensions.k8s.io/v1", "customresourcedefinitions", name=c.CRD_NAME),
        )
        nms = await self._list("nodemaintenances", "nodemaintenances.yaml", NM_PATH) or []
        maintained = sorted({str((m.get("spec") or {}).get("nodeName") or "") for m in nms} - {""})
        leases = api_path("coordination.k8s.io/v1", "leases", namespace=self.s.lease_namespace)
        await self._list("node leases", f"leases/{self.s.lease_namespace}.yaml", leases)
        await self._get(
            "leader-election lease",
            "operator/leader-election-lease.yaml",
            api_path("coordination.k8s.io/v1", "leases", namespace=ns, name=c.LEADER_ELECTION_ID),
        )
        await self._events(maintained)
        label = "=".join(c.OPERATOR_POD_LABEL)
        pods = await self._list(
            "operator pods",
            "operator/pods.yaml",
            api_path("v1", "pods", namespace=ns),
            params={"labelSelector": label},
        )
        await self._list(
            "operator deployments",
            "operator/deployments.yaml",
            api_path("apps/v1", "deployments", namespace=ns),
        )
        await self._webhooks()
        for pod in pods or []:
            await self._logs(pod)
        await self._pdbs(maintained)
        await self._metrics(len(nodes))
        return self._finish(started)

    def _new_dir(self, now: datetime) -> Path:
        base = f"nmo-gather-{now.astimezone(UTC).strftime('%Y%m%dT%H%M%SZ')}"
        root, n = self.s.dest / base, 1
        while root.exists() or root.with_name(root.name + ".tar.gz").exists():
            n += 1
            root = self.s.dest / f"{base}-{n}"
        root.parent.mkdir(parents=True, exist_ok=True)
        root.mkdir(mode=0o700)
        root.chmod(0o700)  # whatever the umask
        return root

    async def _events(self, nodes: list[str]) -> None:
        """Events with the five maintenance reasons, on the CRs, and on their nodes."""
        selectors = [f"reason={r}" for r in MAINTENANCE_REASONS]
        selectors.append(f"involvedObject.kind={c.KIND}")
        selectors += [f"involvedObject.kind=Node,involvedObject.name={n}" for n in nodes]
        found: dict[str, Obj] = {}
        failures: list[str] = []
        for selector in selectors:
            try:
                page = await self.kube.list_all(
                    api_path("v1", "events"), params={"fieldSelector": selector}
                )
            except KubeError as exc:
                failures.append(f"{selector}: {_status_of(exc)}: {exc}")
                continue
            for event in page.get("items") or []:
                meta = event.get("metadata") or {}
                found[f"{meta.get('namespace')}/{meta.get('name')}"] = event
        events = sorted(found.values(), key=_event_time)
        rel = "events.yaml"
        self._write(rel, _list(events, "Event"))
        if failures:
            status = "forbidden" if all(": forbidden:" in f for f in failures) else "error"
            detail = "; ".join(failures[:3]) + (" ..." if len(failures) > 3 else "")
            self._record(Item("events", file=rel, status=status, count=len(events), detail=detail))
        else:
            self._record(Item("events", file=rel, count=len(events)))

    async def _webhooks(self) -> None:
        path = api_path("admissionregistration.k8s.io/v1", "validatingwebhookconfigurations")
        try:
            configs = (await self.kube.list_all(path)).get("items") or []
        except KubeError as exc:
            self._record(Item("webhook configurations", status=_status_of(exc), detail=str(exc)))
            return
        ours = our_webhook_configs(list(configs))
        rel = "operator/validatingwebhookconfigurations.yaml"
        self._write(rel, _list(ours, "ValidatingWebhookConfiguration"))
        detail = "" if ours else f"none references {c.WEBHOOK_NAME}"
        self._record(Item("webhook configurations", file=rel, count=len(ours), detail=detail))

    async def _logs(self, pod: Obj) -> None:
        meta = pod.get("metadata") or {}
        name, ns = str(meta.get("name")), str(meta.get("namespace"))
        restarts = {
            s.get("name"): int(s.get("restartCount") or 0)
            for s in (pod.get("status") or {}).get("containerStatuses") or []
        }
        path = api_path("v1", "pods", namespace=ns, name=name, subresource="log")
        for container in (pod.get("spec") or {}).get("containers") or []:
            cname = str(container.get("name"))
            for previous in (False, True):
                label = f"logs {name}/{cname}" + (" (previous)" if previous else "")
                rel = f"operator/logs/{name}/{cname}{'.previous' if previous else ''}.log"
                if previous and not restarts.get(cname):
                    self._record(Item(label, status="skipped", detail="no restart"))
                    continue
                params: dict[str, str | int | bool] = {"container": cname}
                if previous:
                    params["previous"] = True
                if self.s.since:
                    params["sinceSeconds"] = max(1, int(self.s.since))
                try:
                    text = await self.kube.request_text(path, params=params)
                except KubeError as exc:
                    self._record(Item(label, status=_status_of(exc), detail=str(exc)))
                    continue
                self._write(rel, redact_text(text))
                self._record(Item(label, file=rel, count=text.count("\n")))

    async def _pdbs(self, nodes: list[str]) -> None:
        """PDBs selecting any pod on a node under maintenance (what blocks a drain)."""
        pods: list[Obj] = []
        try:
            for node in nodes:
                page = await self.kube.list_all(
                    api_path("v1", "pods"), params={"fieldSelector": f"spec.nodeName={node}"}
                )
                pods += page.get("items") or []
            pdbs = (await self.kube.list_all(api_path("policy/v1", "poddisruptionbudgets"))).get(
                "items"
            ) or []
        except KubeError as exc:
            self._record(Item("disruption budgets", status=_status_of(exc), detail=str(exc)))
            return
        covering = pdbs_covering(list(pdbs), pods)
        covers = {
            f"{p['metadata']['namespace']}/{p['metadata']['name']}": pods_ for p, pods_ in covering
        }
        rel = "pdbs.yaml"
        body = _list([p for p, _ in covering], "PodDisruptionBudget", "policy/v1", covers=covers)
        self._write(rel, body)
        self._write(
            "pods-on-maintained-nodes.yaml", _list([pod_for_diagnosis(p) for p in pods], "Pod")
        )
        self._record(
            Item(
                "disruption budgets",
                file=rel,
                count=len(covering),
                detail=f"covering {sum(len(v) for v in covers.values())} pod(s) "
                f"on {len(nodes)} node(s) under maintenance",
            )
        )

    async def _metrics(self, node_count: int) -> None:
        rel = "metrics/nodes.yaml"
        try:
            await self.kube.get(f"/apis/{METRICS_GROUP}/v1beta1")
            metrics = await self.kube.list_all(f"/apis/{METRICS_GROUP}/v1beta1/nodes")
        except (NotFound, Transient) as exc:
            note = (
                f"The metrics API ({METRICS_GROUP}/v1beta1) is not served by this cluster, "
                f"so node CPU/memory usage was not collected ({exc}).\n"
                "Install metrics-server to include it.\n"
            )
            self._write("metrics/NOT-SERVED.txt", note)
            self._record(
                Item(
                    "node metrics",
                    file="metrics/NOT-SERVED.txt",
                    status="not-served",
                    detail="metrics API not served",
                )
            )
            return
        except KubeError as exc:
            self._record(Item("node metrics", status=_status_of(exc), detail=str(exc)))
            return
        items = list(metrics.get("items") or [])
        self._write(rel, _list(items, "NodeMetrics", f"{METRICS_GROUP}/v1beta1"))
        self._record(Item("node metrics", file=rel, count=len(items)))

    def _finish(self, started: datetime) -> Bundle:
        meta = {
            "tool": "nmo gather",
            "version": __version__,
            "server": self.kube.server,
            "startedAt": started.astimezone(UTC).isoformat(),
            "finishedAt": self.clock().astimezone(UTC).isoformat(),
            "operatorNamespace": self.s.operator_namespace,
            "leaseNamespace": self.s.lease_namespace,
            "since": self.s.since,
        }
        problems = [i.to_json() for i in self.items if i.problem]
        summary = {**meta, "items": [i.to_json() for i in self.items], "problems": problems}
        self._write("summary.json", json.dumps(redact(summary), indent=2) + "\n")
        self._write("SUMMARY.txt", summary_text(meta, self.items))
        archive = self.root.with_name(self.root.name + ".tar.gz")
        fd = os.open(archive, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as out, tarfile.open(fileobj=out, mode="w:gz") as tar:
            tar.add(self.root, arcname=self.root.name)
        return Bundle(self.root, archive, self.items)


def _dump(data: Any) -> str:
    return yaml.safe_dump(data, sort_keys=False)


def _private_dirs(root: Path, directory: Path) -> None:
    """Create ``directory`` (under ``root``) and its parents with mode 0700."""
    missing: list[Path] = []
    while directory != root and not directory.exists():
        missing.append(directory)
        directory = directory.parent
    for path in reversed(missing):
        path.mkdir(mode=0o700)
        path.chmod(0o700)


def _private_write(path: Path, data: bytes) -> None:
    """Write ``path`` with mode 0600 from the start (no window where it is wider)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as out:
        os.fchmod(out.fileno(), 0o600)
        out.write(data)


def _event_time(event: Obj) -> str:
    return str(
        event.get("lastTimestamp")
        or event.get("eventTime")
        or (event.get("metadata") or {}).get("creationTimestamp")
        or ""
    )
