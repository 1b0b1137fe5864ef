"""The package's layers hold: docs/design.md §2.

* ``warpdata.core`` is a leaf: it imports nothing else of warp, anywhere.
* ``formats/`` and ``kernels/`` are codecs and backends: no CLI, storage, read or system module.
* Library code never renders: only ``warpdata.cli`` and ``warpdata.commands`` import the output
  module.
* No module cycles among module-level imports (``TYPE_CHECKING`` blocks included; imports
  inside functions are the deliberate way to defer heavy or upward dependencies).

The graph is read from the source with :mod:`ast`, so the test imports nothing it checks.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = {"warp": "warpdata", "commands": "warpdata.commands", "formats": "warpdata.formats",
           "kernels": "warpdata.kernels"}


def _modules() -> dict[str, Path]:
    mods = {}
    for folder, pkg in FOLDERS.items():
        for p in sorted((ROOT / folder).rglob("*.py")):
            rel = p.relative_to(ROOT / folder).with_suffix("")
            parts = [x for x in rel.parts if x != "__init__"]
            mods[".".join([pkg, *parts])] = p
    return mods


MODULES = _modules()


def _resolve(name: str) -> str | None:
    """The warp module an import of ``name`` loads (a package's ``__init__`` for a package)."""
    while name:
        if name in MODULES:
            return name
        name = name.rpartition(".")[0]
    return None


def _imports(path: Path, module_level_only: bool) -> set[str]:
    tree = ast.parse(path.read_text(), str(path))
    found: set[str] = set()

    def visit(nodes, top: bool) -> None:
        for n in nodes:
            if isinstance(n, ast.Import | ast.ImportFrom):
                if isinstance(n, ast.ImportFrom):
                    assert n.level == 0, f"{path}: relative import (use warpdata.* paths)"
                    base = n.module or ""
                    names = [f"{base}.{a.name}" for a in n.names] + [base]
                else:
                    names = [a.name for a in n.names]
                for name in names:
                    if name.startswith("warpdata"):
                        m = _resolve(name)
                        if m:
                            found.add(m)
            elif isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
                if not module_level_only:
                    visit(ast.iter_child_nodes(n), False)
            else:
                visit(ast.iter_child_nodes(n), top)

    visit(tree.body, True)
    return found


def _graph(module_level_only: bool) -> dict[str, set[str]]:
    return {m: _imports(p, module_level_only) - {m} for m, p in MODULES.items()}


def test_core_is_a_leaf():
    bad = {m: sorted(d for d in deps if not d.startswith("warpdata.core"))
           for m, deps in _graph(False).items() if m.startswith("warpdata.core")}
    bad = {m: d for m, d in bad.items() if d}
    assert not bad, f"warpdata.core must import nothing else of warp: {bad}"


def test_formats_and_kernels_import_no_upper_layer():
    allowed = ("warpdata.core", "warpdata.formats", "warpdata.kernels")
    bad = {}
    for m, deps in _graph(False).items():
        if m.startswith(("warpdata.formats", "warpdata.kernels")):
            up = sorted(d for d in deps if not d.startswith(allowed) and d != "warpdata")
            if up:
                bad[m] = up
    assert not bad, f"formats/ and kernels/ may import only core, formats and kernels: {bad}"


def test_only_the_cli_layer_renders():
    bad = sorted(m for m, deps in _graph(False).items()
                 if "warpdata.cli.output" in deps and not m.startswith(("warpdata.cli", "warpdata.commands")))
    assert not bad, f"library modules import the CLI's output module (log or return facts instead): {bad}"


def test_commands_import_only_the_cli_layer_at_top_level():
    bad = {}
    for m, deps in _graph(True).items():
        if m.startswith("warpdata.commands."):
            other = sorted(d for d in deps if not d.startswith(("warpdata.cli", "warpdata.core", "warpdata.commands"))
                           and d != "warpdata")
            if other:
                bad[m] = other
    assert not bad, f"command modules import heavy layers at top level (import inside the function): {bad}"


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def strong(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in graph:
        if v not in index:
            strong(v)
    return out


def test_no_module_cycles():
    graph = _graph(True)
    # a package's __init__ importing its own submodules is not a cycle of design
    for m in graph:
        graph[m] = {d for d in graph[m] if not (m != "warpdata" and d.startswith(m + "."))}
    assert _cycles(graph) == []


def test_the_cycle_finder_finds_cycles():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_storage_is_below_the_registry():
    """warp/storage is the storage layer: it imports no read, registry or higher module, not even
    inside a function (in-function imports are counted)."""
    above = ("warpdata.registry", "warpdata.read", "warpdata.cli", "warpdata.commands", "warpdata.doctor",
             "warpdata.etl")
    bad = {m: sorted(d for d in deps if d.startswith(above))
           for m, deps in _graph(False).items() if m.startswith("warpdata.storage")}
    bad = {m: d for m, d in bad.items() if d}
    assert not bad, f"warp/storage must not import the layers above it: {bad}"
