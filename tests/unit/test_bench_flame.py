"""benchmarks/flame.py: collapsed stacks in, shares and an SVG flame graph out."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import flame

STACKS = [
    "<module> (nmo:6);main (nmo/cli:1);run_forever (asyncio:1);_evict (evictor:1) 60",
    "<module> (nmo:6);main (nmo/cli:1);run_forever (asyncio:1);plan (planner:1) 30",
    "<module> (nmo:6);<module> (nmo/cli/runner:25);_find_and_load (importlib:1) 10",
    "not a stack line",
]


def test_read_stacks_skips_garbage_and_cuts_at_the_root() -> None:
    assert len(flame.read_stacks(STACKS)) == 3
    rooted = flame.read_stacks(STACKS, root="run_forever")
    assert [(frames[0], n) for frames, n in rooted] == [
        ("run_forever (asyncio:1)", 60),
        ("run_forever (asyncio:1)", 30),
    ]


def test_tops_are_shares_of_all_samples() -> None:
    inclusive, own = flame.tops(flame.read_stacks(STACKS), limit=3)
    assert inclusive[0] == ("<module> (nmo:6)", 1.0)
    assert dict(inclusive)["main (nmo/cli:1)"] == 0.9
    assert own[0] == ("_evict (evictor:1)", 0.6)


def test_the_svg_draws_each_frame_as_wide_as_its_samples() -> None:
    out = flame.svg(flame.read_stacks(STACKS, root="run_forever"), "drain")
    assert out.startswith("<svg") and "drain (90 samples)" in out
    # run_forever spans the whole width, _evict two thirds of it
    assert f'width="{flame.WIDTH - 0.5:.1f}"' in out
    assert f'width="{flame.WIDTH * 60 / 90 - 0.5:.1f}"' in out
    assert "_evict (evictor:1) (60 samples, 66.7%)" in out


def test_main_prints_the_tables_and_writes_the_svg(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    stacks = tmp_path / "s.txt"
    stacks.write_text("\n".join(STACKS))
    assert flame.main([str(stacks), str(tmp_path / "f.svg"), "--root", "run_forever"]) == 0
    printed = capsys.readouterr().out
    assert "90 samples" in printed and "66.7%  _evict (evictor:1)" in printed
    assert (tmp_path / "f.svg").read_text().startswith("<svg")
    assert flame.main([str(stacks), "--root", "nowhere"]) == 1
