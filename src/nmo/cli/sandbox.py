"""``nmo sandbox up|down|env``: the local real control plane from the shell."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from nmo.sandbox import cluster


def main(args: argparse.Namespace) -> int:
    directory = Path(args.dir).resolve()
    try:
        if args.sandbox_command == "up":
            started = time.monotonic()
            sb = cluster.up(directory, nodes=args.nodes, timeout=args.timeout)
            print(
                f"sandbox ready in {time.monotonic() - started:.1f}s: {sb.server}\n"
                f"  kubeconfig: {sb.kubeconfig}\n  logs: {directory / 'logs'}\n"
                f'  use it:  eval "$(nmo sandbox env --dir {args.dir})"\n'
                f"  stop it: nmo sandbox down --dir {args.dir}"
            )
            return 0
        if args.sandbox_command == "down":
            cluster.down(directory)
            print(f"sandbox in {directory} stopped and removed")
            return 0
        if args.sandbox_command == "env":
            print(cluster.env(directory))
            return 0
    except cluster.SandboxError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 2
