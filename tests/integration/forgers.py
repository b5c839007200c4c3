"""Forged requests at a steady rate, as a process of its own (issue 20).

Two streams, each ``--rate`` requests a second, spread over ``--sources``
loopback addresses (127.0.0.2 and up, as pods' addresses; the sandbox
apiserver and the test's legitimate clients use 127.0.0.1), over kept-alive
connections:

* scrapes of ``/metrics`` with a random bearer token each (each costs nmo a
  TokenReview unless refused first);
* AdmissionReviews of a CREATE, dry run, for the nodes named (their pods and
  PDBs) or for a random missing node (a GET), alternately.

Runs until its stdin closes, then prints one line of JSON: the HTTP status
of every answer (or the error), per stream.

    python forgers.py METRICS_PORT WEBHOOK_PORT --rate N --sources N --node NAME...
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import secrets
import ssl
import sys
import uuid
from collections import Counter
from typing import Any

from objects import create_review

from nmo.api.constants import WEBHOOK_PATH as PATH


def review(node: str) -> dict[str, Any]:
    """A forged CREATE: a dry run, as any ServiceAccount could claim to send."""
    doc = create_review(node, name="forged")
    doc["request"].update(
        dryRun=True, userInfo={"username": "system:serviceaccount:default:default"}
    )
    return doc


class Forgers:
    """Each stream runs ``LANES`` kept-alive connections per source, each paced
    to its share of the rate (plain asyncio streams: an HTTP client library
    costs more CPU a request than the server's answer)."""

    LANES = 3

    def __init__(self, options: argparse.Namespace) -> None:
        self.options = options
        self.stop = asyncio.Event()
        self.answers: dict[str, Counter[str]] = {"metrics": Counter(), "webhook": Counter()}
        self.ctx = ssl.create_default_context()
        self.ctx.check_hostname, self.ctx.verify_mode = False, ssl.CERT_NONE

    def request(self, kind: str, i: int) -> bytes:
        options = self.options
        if kind == "metrics":
            token = secrets.token_urlsafe(24)
            return (
                f"GET /metrics HTTP/1.1\r\nHost: nmo\r\nAuthorization: Bearer {token}\r\n\r\n"
            ).encode()
        nodes = options.node
        node = nodes[i % len(nodes)] if i % 2 and nodes else f"forged-{uuid.uuid4().hex[:8]}"
        body = json.dumps(review(node)).encode()
        head = (
            f"POST {PATH} HTTP/1.1\r\nHost: nmo\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n"
        )
        return head.encode() + body

    async def lane(self, kind: str, source: str) -> None:
        options = self.options
        port = options.metrics_port if kind == "metrics" else options.webhook_port
        every = options.sources * self.LANES / options.rate
        loop = asyncio.get_running_loop()
        start, i = loop.time(), 0
        conn: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None
        while not self.stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.stop.wait(), max(0.0, start + i * every - loop.time()))
                break
            i += 1
            try:
                if conn is None:
                    conn = await asyncio.wait_for(
                        asyncio.open_connection(
                            "127.0.0.1", port, ssl=self.ctx, local_addr=(source, 0)
                        ),
                        10,
                    )
                reader, writer = conn
                writer.write(self.request(kind, i))
                head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
                lines = head.split(b"\r\n")
                length = next(
                    (
                        int(x.split(b":")[1])
                        for x in lines
                        if x.lower().startswith(b"content-length:")
                    ),
                    0,
                )
                await reader.readexactly(length)
                self.answers[kind][lines[0].split()[1].decode()] += 1
                if any(x.lower() == b"connection: close" for x in lines):
                    writer.close()
                    conn = None
            except (OSError, ssl.SSLError, TimeoutError, asyncio.IncompleteReadError) as exc:
                self.answers[kind][type(exc).__name__] += 1
                if conn is not None:
                    conn[1].close()
                conn = None
        if conn is not None:
            conn[1].close()


async def main(options: argparse.Namespace) -> None:
    forgers = Forgers(options)
    tasks = [
        asyncio.create_task(forgers.lane(kind, f"127.0.0.{2 + k}"))
        for kind in ("metrics", "webhook")
        for k in range(options.sources)
        for _ in range(Forgers.LANES)
    ]
    print("ready", flush=True)
    await asyncio.to_thread(sys.stdin.read)  # until the test closes it
    forgers.stop.set()
    await asyncio.wait(tasks, timeout=30)
    print(json.dumps({k: dict(v) for k, v in forgers.answers.items()}), flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("metrics_port", type=int)
    parser.add_argument("webhook_port", type=int)
    parser.add_argument("--rate", type=float, default=100.0)
    parser.add_argument("--sources", type=int, default=10)
    parser.add_argument("--node", action="append", default=[])
    asyncio.run(main(parser.parse_args()))
