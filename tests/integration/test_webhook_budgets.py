"""Forged requests cannot spend what real ones need (issue 20, item 2).

A real ``nmo run`` serves its webhook (registered with the sandbox apiserver)
and its secure ``/metrics`` (TokenReview and SubjectAccessReview against the
sandbox apiserver, as the chart's ServiceAccount). ``forgers.py``, in a
process of its own, sends 100 scrapes a second with random tokens and 100
forged CREATE reviews a second (the pods and PDBs of real nodes, GETs of
made-up ones), from ten pod-like loopback addresses (127.0.0.2 and up; the
apiserver and the legitimate clients use 127.0.0.1).

Meanwhile a Prometheus-like scraper, a ServiceAccount bound to ``get
/metrics``, that scraped once before, is answered every time, with a token
it never used before each time (as after a rotation: every scrape needs a
TokenReview and a SubjectAccessReview); and CREATEs through the apiserver
(ten dry runs, then a real one) for a node behind a PodDisruptionBudget that
allows no disruption are admitted, each with its warning: their lookups were
not starved. The apiserver's address is proven first, by a CR it admitted.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import statistics
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import pytest
from objects import NM, Api, uid
from operator_fixtures import wait_for
from test_drain_control import blocked_node
from test_webhook_abuse import FIGURES, Hooked, LoadProcess, nm, webhook_operator

from nmo_sandbox import Sandbox

if TYPE_CHECKING:
    from conftest import NodeFactory

pytestmark = pytest.mark.integration

Json = dict[str, Any]
FORGERS = Path(__file__).with_name("forgers.py")
BUDGET_FIGURES = FIGURES.with_name("webhook-budgets.json")
RBAC = "/apis/rbac.authorization.k8s.io/v1"


@pytest.fixture(scope="module")
async def guarded(
    sandbox: Sandbox, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Hooked]:
    """nmo with its webhook registered and its metrics behind authentication."""
    async with webhook_operator(sandbox, tmp_path_factory, extra=("--metrics-secure",)) as hook:
        yield hook


class Scraper:
    """A ServiceAccount allowed to ``get /metrics``; a new token for each scrape."""

    def __init__(self, api: Api, namespace: str, port: int) -> None:
        self.api, self.namespace, self.port = api, namespace, port
        self.role = f"nmo-scraper-{uid()}"

    async def __aenter__(self) -> Scraper:
        await self.api.create(
            f"/api/v1/namespaces/{self.namespace}/serviceaccounts", {"metadata": {"name": "prom"}}
        )
        await self.api.create(
            f"{RBAC}/clusterroles",
            {
                "metadata": {"name": self.role},
                "rules": [{"nonResourceURLs": ["/metrics"], "verbs": ["get"]}],
            },
        )
        await self.api.create(
            f"{RBAC}/clusterrolebindings",
            {
                "metadata": {"name": self.role},
                "roleRef": {
                    "apiGroup": "rbac.authorization.k8s.io",
                    "kind": "ClusterRole",
                    "name": self.role,
                },
                "subjects": [
                    {"kind": "ServiceAccount", "name": "prom", "namespace": self.namespace}
                ],
            },
        )
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.api.delete(f"{RBAC}/clusterrolebindings/{self.role}")
        await self.api.delete(f"{RBAC}/clusterroles/{self.role}")

    async def token(self) -> str:
        answer = await self.api.create(
            f"/api/v1/namespaces/{self.namespace}/serviceaccounts/prom/token",
            {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {}},
        )
        return str(answer["status"]["token"])

    async def scrape(self, token: str, *, source: str = "127.0.0.1") -> tuple[int, float]:
        """The status of ``GET /metrics`` with ``token`` from ``source``, and its seconds."""
        transport = httpx.AsyncHTTPTransport(local_address=source, verify=False)
        started = time.perf_counter()
        async with httpx.AsyncClient(transport=transport, timeout=10) as http:
            resp = await http.get(
                f"https://127.0.0.1:{self.port}/metrics",
                headers={"Authorization": f"Bearer {token}"},
            )
        return resp.status_code, time.perf_counter() - started


def unchecked(hook: Hooked, node: str) -> list[str]:
    """Why nmo could not check the PDBs of ``node`` for a CREATE's warnings, each time."""
    reasons = []
    for line in hook.op.logs().splitlines():
        with contextlib.suppress(ValueError):
            entry = json.loads(line)
            if entry.get("node") == node and "could not check the PodDisruptionBudgets" in str(
                entry.get("msg")
            ):
                reasons.append(str(entry.get("error")))
    return reasons


async def proven_by_a_real_cr(api: Api, node_factory: NodeFactory) -> None:
    """A CR admitted and stored: its review's address (the apiserver's) is proven."""
    (node,) = await node_factory(1)
    name = f"warmup-{uid()}"
    await api.create_nm(name, node)

    async def seen() -> bool:  # nmo's informer has it: it wrote the status
        return bool(((await api.nm(name)) or {}).get("status", {}).get("phase"))

    await wait_for(seen, timeout=30, what="nmo to see the warm-up CR")
    await api.delete_nm_and_wait_gone(name)


@pytest.mark.solo  # 200 forged requests a second: alone, not beside other sandboxes
async def test_forgeries_leave_real_scrapes_and_creates_their_budget(
    guarded: Hooked, kube: httpx.AsyncClient, namespace: str, node_factory: NodeFactory
) -> None:
    api = Api(kube)
    node, _pods = await blocked_node(api, namespace, node_factory)  # its PDB allows 0
    others = [n["metadata"]["name"] for n in (await kube.get("/api/v1/nodes")).json()["items"]]
    await proven_by_a_real_cr(api, node_factory)
    name = f"real-{uid()}"
    async with Scraper(api, namespace, guarded.op.metrics_port) as scraper:
        assert (await scraper.scrape(await scraper.token()))[0] == 200  # scraped before
        forgers = LoadProcess(
            FORGERS,
            str(guarded.op.metrics_port),
            str(guarded.port),
            "--rate=100",
            "--sources=10",
            *(f"--node={n}" for n in others[:8] if n != node),
        )
        scrapes: list[tuple[int, float]] = []
        creates: list[tuple[httpx.Response, float]] = []

        async def create(obj: Json, *, dry_run: bool = False) -> tuple[httpx.Response, float]:
            started = time.perf_counter()
            params = {"dryRun": "All"} if dry_run else None
            created = await kube.post(NM, json=obj, params=params)
            return created, time.perf_counter() - started

        try:
            await forgers.ready()
            forging = time.monotonic()

            newcomers = iter(range(100, 255))

            async def unproven_spent() -> bool:
                # A first scrape from a new address (one let in would be proven):
                # refused once the forgeries spend the budget of callers never let in.
                source = f"127.0.0.{next(newcomers)}"
                status, _ = await scraper.scrape(await scraper.token(), source=source)
                return status == 429

            await wait_for(unproven_spent, timeout=30, what="the forgeries to spend the budget")
            start = time.monotonic()
            for i in range(10):  # a scrape a second, a new token each; a CREATE (dry run) too
                await asyncio.sleep(max(0.0, start + i - time.monotonic()))
                scrapes.append(await scraper.scrape(await scraper.token()))
                creates.append(await create(nm(f"dry-{uid()}", node), dry_run=True))
            creates.append(await create(nm(name, node)))
        finally:
            forged = forgers.finish()
            forged_seconds = time.monotonic() - forging
    try:
        warned = [
            any("allows no disruption now" in w for w in resp.headers.get_list("warning"))
            for resp, _ in creates
        ]
        sent = {kind: sum(answers.values()) for kind, answers in forged.items()}
        slowest = max(s for _, s in creates)
        figures = {
            "forged": forged,
            "forged_per_second": {k: round(n / forged_seconds) for k, n in sent.items()},
            "scrapes_answered": sum(status == 200 for status, _ in scrapes),
            "scrapes": len(scrapes),
            "scrape_statuses": [status for status, _ in scrapes],
            "scrape_p50_s": round(statistics.median(s for _, s in scrapes), 3),
            "scrape_max_s": round(max(s for _, s in scrapes), 3),
            "creates_admitted": sum(resp.status_code == 201 for resp, _ in creates),
            "creates_warned": sum(warned),
            "creates": len(creates),
            "create_p50_s": round(statistics.median(s for _, s in creates), 3),
            "create_max_s": round(slowest, 3),
            "a_warning": creates[-1][0].headers.get_list("warning"),
        }
        BUDGET_FIGURES.parent.mkdir(parents=True, exist_ok=True)
        BUDGET_FIGURES.write_text(json.dumps(figures, indent=1))
        print(figures)
        # The forgeries were there, and refused (401 for some, 429 for most).
        assert forged["metrics"].get("429", 0) >= 100, figures
        assert forged["webhook"].get("200", 0) >= 100, figures
        assert figures["scrapes_answered"] == 10, figures
        # Every CREATE admitted, with its warning: its lookups were never refused
        # for want of budget (a slow apiserver, past the warnings' 2 s, is no budget's
        # doing: such a CREATE is admitted without one, and the log says why).
        assert figures["creates_admitted"] == figures["creates"] == 11, figures
        refused = [e for e in unchecked(guarded, node) if "too many API requests" in e]
        assert refused == [], refused[:3]
        assert figures["creates_warned"] + len(unchecked(guarded, node)) >= 11, figures
        assert figures["creates_warned"] >= 1, figures
    finally:
        await kube.delete(f"{NM}/{name}")
