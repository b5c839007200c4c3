"""One nmo webhook replica in the test process: its own API client, node and
NodeMaintenance caches, claims and TLS server on a free 127.0.0.1 port
(shared by the webhook tests; the certificate comes from the sandbox CA).
Its client is the chart's ServiceAccount (chart_identity.py), as a replica's.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path

from chart_identity import chart_identity

from nmo.api.constants import WEBHOOK_PATH
from nmo.kube.client import Kube
from nmo.kube.informer import Informer
from nmo.server.servers import Servers, ServerSettings
from nmo.telemetry.metrics import Metrics
from nmo.webhooks.lookups import MAINTENANCES_PATH, NODES_PATH, LookupSettings, build_lookups
from nmo_sandbox import Sandbox


@dataclass
class WebhookReplica:
    kube: Kube
    servers: Servers
    metrics: Metrics
    tasks: list[asyncio.Task[None]]

    @classmethod
    async def start(
        cls, sandbox: Sandbox, cert_dir: Path, *, settings: LookupSettings | None = None
    ) -> WebhookReplica:
        """Serve with the certificate ``apiserver.crt``/``apiserver.key`` in ``cert_dir``."""
        identity = await chart_identity(sandbox)
        client = await Kube.connect(kubeconfig=str(identity.kubeconfig))
        nodes = Informer(client, NODES_PATH, name="nodes")
        maintenances = Informer(client, MAINTENANCES_PATH, name="nodemaintenances")
        lookups = build_lookups(client, nodes=nodes, maintenances=maintenances, settings=settings)
        tasks = [asyncio.create_task(i.run(), name=i.name) for i in (nodes, maintenances)]
        metrics = Metrics()
        server_settings = ServerSettings(
            bind_address="127.0.0.1",
            webhook_port=0,
            probes_port=None,
            metrics_port=None,
            cert_dir=cert_dir,
            graceful_shutdown_seconds=1,
        )
        servers = Servers(server_settings, kube=client, lookups=lookups, metrics=metrics)
        await servers.start()
        return cls(client, servers, metrics, tasks)

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.servers.ports['webhook']}{WEBHOOK_PATH}"

    async def stop(self) -> None:
        await self.servers.stop()
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        await self.kube.close()
