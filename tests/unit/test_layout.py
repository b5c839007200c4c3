"""The source layout's rules that import-linter cannot state (docs/architecture.md).

* one name per concept: no two modules (or packages) of ``nmo`` share a name;
* no aliases at import: a module is read under its own name everywhere
  (``constants as c`` is the one exception: a namespace of names, like a
  prefix; ``x as x`` is an explicit re-export);
* package ``__init__`` modules import nothing of nmo nor of third parties, so
  importing a package never loads its siblings (commands load only what they use);
* the pure rules (``nmo.core``) never read the clock: time comes in as an
  argument (``Observed.now``, ``tick``).
"""

from __future__ import annotations

import ast
import sys
from collections import Counter
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src" / "nmo"
ALLOWED_ALIASES = {("nmo.api", "constants", "c")}


def _modules() -> list[Path]:
    return sorted(SRC.rglob("*.py"))


def _dotted(path: Path) -> str:
    parts = path.relative_to(SRC.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def test_no_two_modules_share_a_name() -> None:
    names = Counter(_dotted(p).rsplit(".", 1)[-1] for p in _modules() if p.name != "__main__.py")
    shared = sorted(name for name, n in names.items() if n > 1)
    where = {n: [_dotted(p) for p in _modules() if _dotted(p).endswith("." + n)] for n in shared}
    assert not shared, f"modules sharing a name: {where}"


def test_no_aliases_at_import() -> None:
    found = []
    for path in _modules():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("nmo"):
                for alias in node.names:
                    key = (node.module, alias.name, alias.asname)
                    if alias.asname not in (None, alias.name) and key not in ALLOWED_ALIASES:
                        what = f"from {node.module} import {alias.name} as {alias.asname}"
                        found.append(f"{_dotted(path)}: {what}")
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.startswith("nmo") and alias.asname is not None:
                        found.append(f"{_dotted(path)}: import {alias.name} as {alias.asname}")
    assert not found, "\n".join(found)


def test_package_inits_import_nothing_of_nmo_or_third_parties() -> None:
    eager = []
    for path in _modules():
        if path.name != "__init__.py":
            continue
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            else:
                continue
            for name in names:
                if name.split(".")[0] not in sys.stdlib_module_names:
                    eager.append(f"{_dotted(path)} line {node.lineno}: {name}")
    assert not eager, f"package __init__ modules that import: {eager}"


def test_the_pure_rules_never_read_the_clock() -> None:
    reads = []
    for path in sorted((SRC / "core").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in {"now", "utcnow", "today", "monotonic", "time"}
            ):
                reads.append(f"{_dotted(path)} line {node.lineno}: .{node.func.attr}()")
    assert not reads, reads


def test_no_import_cycles() -> None:
    """No two modules of nmo import each other, directly or around a loop."""
    import grimp

    graph = grimp.build_graph("nmo", cache_dir=None)
    looped = sorted(
        m
        for m in graph.modules
        if any(
            graph.find_shortest_chain(importer=i, imported=m) is not None
            for i in graph.find_modules_directly_imported_by(m)
        )
    )
    assert not looped, f"modules on an import cycle: {looped}"
