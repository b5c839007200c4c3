"""``nmo-sandbox up|env|down|load|demo``: the local real control plane from the shell.

Development tooling, installed by ``make venv`` beside nmo (the image and the
nmo wheel hold the operator only).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path

from nmo.telemetry import logsetup
from nmo_sandbox import certmanager, cluster


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="nmo-sandbox",
        description="a real local Kubernetes control plane for nmo's tests and demo",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    up = sub.add_parser("up", help="start the sandbox in DIR")
    up.add_argument("--dir", required=True)
    up.add_argument("--nodes", type=int, default=3, help="kwok nodes node-1..node-N")
    up.add_argument(
        "--real-nodes",
        type=int,
        default=0,
        metavar="M",
        help="real nodes real-1..real-M (label type=real): a kubelet and a containerd each "
        "on a bridge of the sandbox's own; needs root, containerd, runc, CNI plugins and "
        "`make sandbox-bin`'s kubelet. Cost: about 120 MiB per node (kubelet 77, "
        "containerd 43) and 2-5 s more start-up (a node is Ready about 2 s after its "
        "kubelet starts); load images with `nmo-sandbox load`",
    )
    up.add_argument(
        "--cert-manager",
        action="store_true",
        help="also run cert-manager's controller and cainjector (`make cert-manager-bin`); "
        "about 7 s more start-up, 80 + 40 MiB",
    )
    up.add_argument("--timeout", type=float, default=180.0)
    down = sub.add_parser("down", help="stop the sandbox in DIR and remove its state")
    down.add_argument("--dir", required=True)
    load = sub.add_parser(
        "load", help="copy an image from containers-storage (podman) into the real nodes"
    )
    load.add_argument("--dir", required=True)
    load.add_argument("image", help="e.g. localhost/nmo:dev (from `make image`)")
    env = sub.add_parser("env", help="print shell exports for eval")
    env.add_argument("--dir", required=True)
    demo = sub.add_parser("demo", help="the maintenance story on a local sandbox")
    demo.add_argument("--dir", default=None, help="sandbox dir (default: a temporary one)")
    demo.add_argument("--keep", action="store_true", help="leave the sandbox running")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "demo":
        from nmo_sandbox.demo import main as demo_main

        logsetup.setup("warning", "text")
        return asyncio.run(demo_main(Path(args.dir) if args.dir else None, keep=args.keep))
    directory = Path(args.dir).resolve()
    try:
        if args.command == "up":
            started = time.monotonic()
            sb = cluster.up(
                directory,
                nodes=args.nodes,
                real_nodes=args.real_nodes,
                cert_manager=args.cert_manager,
                timeout=args.timeout,
            )
            lines = [
                f"sandbox ready in {time.monotonic() - started:.1f}s: {sb.server}",
                f"  kubeconfig: {sb.kubeconfig}",
                f"  logs: {directory / 'logs'}",
            ]
            if args.real_nodes:
                lines.append(
                    f"  real nodes: {', '.join(sb.real_node_names)} on bridge {sb.bridge.name} "
                    f"({sb.bridge.subnet}); images: nmo-sandbox load --dir {args.dir} IMAGE"
                )
            if args.cert_manager:
                lines.append(
                    f"  cert-manager: {certmanager.VERSION} controller and cainjector "
                    "(logs/cert-manager-*.log)"
                )
            lines += [
                f'  use it:  eval "$(nmo-sandbox env --dir {args.dir})"',
                f"  stop it: nmo-sandbox down --dir {args.dir}",
            ]
            print("\n".join(lines))
            return 0
        if args.command == "down":
            cluster.down(directory)
            print(f"sandbox in {directory} stopped and removed")
            return 0
        if args.command == "load":
            started = time.monotonic()
            cluster.load_image(directory, args.image)
            print(f"{args.image} loaded into the real nodes in {time.monotonic() - started:.1f}s")
            return 0
        if args.command == "env":
            print(cluster.env(directory))
            return 0
    except cluster.SandboxError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 2


if __name__ == "__main__":
    sys.exit(main())
