"""Flame graphs from py-spy's collapsed stacks: ``flame.py stacks.txt out.svg``.

``py-spy record --format raw`` writes one line per distinct stack:
``frame;frame;...;frame <samples>``. This draws them as an SVG flame graph
(root at the bottom, width = share of samples, a tooltip per frame) with no
tool beyond Python, and prints the top frames by inclusive and self share,
the tables docs/performance.md quotes. ``--root`` keeps only the stacks
through a frame (e.g. ``run_forever`` drops the start-up imports);
``--min`` hides frames narrower than that share.

To record nmo during a drain: ``drain_bench.py --profile DIR`` (needs
``pip install py-spy``), or by hand
``py-spy record --pid <nmo> --rate 100 --format raw --nonblocking -o stacks.txt``.
"""

from __future__ import annotations

import argparse
import html
import sys
import zlib
from collections import Counter
from collections.abc import Iterable
from pathlib import Path

Stacks = list[tuple[tuple[str, ...], int]]

WIDTH = 1600
ROW = 17


def read_stacks(lines: Iterable[str], root: str | None = None) -> Stacks:
    """Parse collapsed stacks; with ``root``, each stack starts at its first frame
    containing ``root`` (stacks without one are dropped)."""
    out: Stacks = []
    for line in lines:
        line = line.rstrip("\n")
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        frames = tuple(stack.split(";"))
        if root is not None:
            at = next((i for i, f in enumerate(frames) if root in f), None)
            if at is None:
                continue
            frames = frames[at:]
        out.append((frames, int(count)))
    return out


def tops(
    stacks: Stacks, limit: int = 15
) -> tuple[list[tuple[str, float]], list[tuple[str, float]]]:
    """(inclusive, self) shares of the busiest frames."""
    total = sum(n for _, n in stacks) or 1
    inclusive: Counter[str] = Counter()
    own: Counter[str] = Counter()
    for frames, n in stacks:
        own[frames[-1]] += n
        for frame in set(frames):
            inclusive[frame] += n
    return (
        [(f, n / total) for f, n in inclusive.most_common(limit)],
        [(f, n / total) for f, n in own.most_common(limit)],
    )


def _color(name: str) -> str:
    h = zlib.crc32(name.encode())
    return f"rgb({205 + h % 50},{80 + (h >> 8) % 120},{30 + (h >> 16) % 40})"


def svg(stacks: Stacks, title: str, min_share: float = 0.002) -> str:
    """The flame graph: every frame a box as wide as its samples."""
    tree: dict[tuple[str, ...], int] = Counter()
    for frames, n in stacks:
        for depth in range(1, len(frames) + 1):
            tree[frames[:depth]] += n
    total = sum(n for _, n in stacks) or 1
    depth_max = max((len(k) for k in tree), default=0)
    height = (depth_max + 3) * ROW
    boxes: list[str] = []
    x_of: dict[tuple[str, ...], float] = {}
    next_x: dict[tuple[str, ...], float] = {(): 0.0}
    for path in sorted(tree):  # parents before children, siblings by name
        parent = path[:-1]
        x = next_x.get(parent, x_of.get(parent, 0.0))
        width = tree[path] / total * WIDTH
        next_x[parent] = x + width
        x_of[path], next_x[path] = x, x
        if tree[path] / total < min_share:
            continue
        y = height - (len(path) + 1) * ROW
        name = path[-1]
        label = html.escape(name)
        tip = f"{label} ({tree[path]} samples, {100 * tree[path] / total:.1f}%)"
        text = html.escape(name[: int(width / 7)]) if width > 21 else ""
        boxes.append(
            f'<g><title>{tip}</title><rect x="{x:.1f}" y="{y}" width="{max(width - 0.5, 0.1):.1f}"'
            f' height="{ROW - 1}" fill="{_color(name)}"/>'
            f'<text x="{x + 3:.1f}" y="{y + ROW - 5}">{text}</text></g>'
        )
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" '
        f'font-family="monospace" font-size="11">'
        f'<text x="4" y="14" font-size="14">{html.escape(title)} ({total} samples)</text>'
        + "".join(boxes)
        + "</svg>\n"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("stacks", type=Path, help="py-spy --format raw output")
    parser.add_argument("svg", type=Path, nargs="?", help="write the flame graph here")
    parser.add_argument("--root", help="keep stacks from the first frame containing this")
    parser.add_argument("--title", default=None)
    parser.add_argument("--min", type=float, default=0.002, help="hide frames below this share")
    parser.add_argument("--top", type=int, default=15)
    opts = parser.parse_args(argv)
    stacks = read_stacks(opts.stacks.read_text().splitlines(), opts.root)
    if not stacks:
        print(f"{opts.stacks}: no stacks" + (f" through {opts.root!r}" if opts.root else ""))
        return 1
    inclusive, own = tops(stacks, opts.top)
    print(f"{sum(n for _, n in stacks)} samples")
    print("inclusive:")
    for frame, share in inclusive:
        print(f"  {100 * share:5.1f}%  {frame}")
    print("self:")
    for frame, share in own:
        print(f"  {100 * share:5.1f}%  {frame}")
    if opts.svg is not None:
        opts.svg.write_text(svg(stacks, opts.title or opts.stacks.name, opts.min))
        print(f"flame graph: {opts.svg}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
