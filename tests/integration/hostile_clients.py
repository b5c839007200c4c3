"""Hostile clients of a webhook port, as a process of its own (issue 20).

Two kinds of sockets, each reconnecting as soon as the server closes it:

* keep-alive *holders*: a TLS connection that sends one cheap request, then
  idles through the keep-alive, poking again every few seconds (to look
  recently used) — what locked the apiserver out when answered connections
  were never closed for a newcomer;
* byte-a-second *tricklers*: a TLS connection that sends a review's headers
  and then its body at one byte a second — what held the 32 upload slots.

They come from loopback addresses other than 127.0.0.1 (``--sources`` of
them, 127.0.0.2 and up; Linux answers for the whole of 127/8), as a pod's
traffic comes from the pod's address and the apiserver's from its own; the
apiserver of the sandbox calls the webhook from 127.0.0.1. The load runs in
its own process so that its event loop, not the test's, carries it.

Prints ``ready`` once every socket has been tried once; when its stdin
closes, one line of JSON: the sockets open (connected, not yet closed by the
server) sampled every 0.2 s, and counters.

    python hostile_clients.py PORT CA_FILE --holders N --tricklers N --sources N
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import ssl
import statistics
import sys
from collections import Counter
from collections.abc import Awaitable, Callable

from nmo.api.constants import WEBHOOK_PATH as PATH

RECONNECT = 0.5  # after the server closed a socket
POKE = 5.0  # a holder's next request
Use = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]
ERRORS = (OSError, ssl.SSLError, TimeoutError, asyncio.IncompleteReadError, ConnectionError)


class Load:
    def __init__(self, options: argparse.Namespace) -> None:
        self.port: int = options.port
        self.ctx = ssl.create_default_context(cafile=options.ca_file)
        self.ctx.check_hostname, self.ctx.verify_mode = False, ssl.CERT_NONE  # cheaper
        self.sources = [f"127.0.0.{2 + i}" for i in range(options.sources)]
        self.stop = asyncio.Event()
        self.open: Counter[str] = Counter()
        self.counts: Counter[str] = Counter()
        self.samples: dict[str, list[int]] = {"holders": [], "tricklers": []}
        self.untried = options.holders + options.tricklers
        self.all_tried = asyncio.Event()

    def tried(self) -> None:
        self.untried -= 1
        if self.untried == 0:
            self.all_tried.set()

    async def connect(self, i: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter] | None:
        try:
            return await asyncio.wait_for(
                asyncio.open_connection(
                    "127.0.0.1",
                    self.port,
                    ssl=self.ctx,
                    server_hostname="127.0.0.1",
                    local_addr=(self.sources[i % len(self.sources)], 0),
                ),
                10,
            )
        except ERRORS:
            self.counts["refused"] += 1  # closed before or during the handshake
            return None

    async def keep(self, i: int, use: Use) -> None:
        """One hostile socket: connected, used until the server closes it, again."""
        first = True
        while not self.stop.is_set():
            conn = await self.connect(i)
            if first:
                first = False
                self.tried()
            if conn is not None:
                await use(*conn)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.stop.wait(), RECONNECT)

    async def hold(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.counts["holder_connects"] += 1
        self.open["holders"] += 1
        try:
            while not self.stop.is_set():
                writer.write(b"GET / HTTP/1.1\r\nHost: webhook\r\n\r\n")
                head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
                length = next(
                    int(line.split(b":")[1])
                    for line in head.split(b"\r\n")
                    if line.lower().startswith(b"content-length:")
                )
                await reader.readexactly(length)
                self.counts["holder_requests"] += 1
                try:
                    if await asyncio.wait_for(reader.read(1), POKE) == b"":
                        break  # closed for a newcomer, or at the keep-alive's end
                except TimeoutError:
                    continue  # still open: poke
        except ERRORS:
            pass
        finally:
            self.open["holders"] -= 1
            self.counts["holders_closed"] += 1
            writer.close()

    async def trickle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.counts["trickler_connects"] += 1
        self.open["tricklers"] += 1
        try:
            writer.write(
                f"POST {PATH} HTTP/1.1\r\nHost: webhook\r\nContent-Type: application/json\r\n"
                "Content-Length: 100000\r\n\r\n".encode()
            )
            while not self.stop.is_set():
                writer.write(b" ")
                self.counts["trickled_bytes"] += 1
                try:
                    answer = await asyncio.wait_for(reader.read(), 1.0)
                except TimeoutError:
                    continue  # nothing yet: one more byte
                if answer.startswith(b"HTTP/1.1 408"):
                    self.counts["trickler_408"] += 1
                break
        except ERRORS:
            pass
        finally:
            self.open["tricklers"] -= 1
            self.counts["tricklers_closed"] += 1
            writer.close()

    async def sample(self) -> None:
        while not self.stop.is_set():
            self.samples["holders"].append(self.open["holders"])
            self.samples["tricklers"].append(self.open["tricklers"])
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.stop.wait(), 0.2)


async def main(options: argparse.Namespace) -> None:
    load = Load(options)
    tasks = [asyncio.create_task(load.keep(i, load.hold)) for i in range(options.holders)]
    tasks += [asyncio.create_task(load.keep(i, load.trickle)) for i in range(options.tricklers)]
    await load.all_tried.wait()
    print("ready", flush=True)
    sampler = asyncio.create_task(load.sample())
    await asyncio.to_thread(sys.stdin.read)  # until the test closes it
    load.stop.set()
    await asyncio.wait([*tasks, sampler], timeout=15)
    report = {
        kind: {
            "mean": round(statistics.fmean(values), 1) if values else 0,
            "max": max(values, default=0),
        }
        for kind, values in load.samples.items()
    }
    print(json.dumps({"open": report, "counts": dict(load.counts)}), flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("port", type=int)
    parser.add_argument("ca_file")
    parser.add_argument("--holders", type=int, default=1000)
    parser.add_argument("--tricklers", type=int, default=1000)
    parser.add_argument("--sources", type=int, default=16)
    asyncio.run(main(parser.parse_args()))
