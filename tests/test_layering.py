"""The floor plan holds: docs/design.md §2 ("Floors") and CONTRIBUTING.md.

Every import of a warp module is counted: module-level ones, ``TYPE_CHECKING`` ones and the
ones inside functions. Each package (a folder under ``warp/``, or ``commands/``, ``formats/``,
``kernels/``) sits on one floor, all its modules with it. A module may import its own floor or a
lower one, never a higher one:

====  =========================================================================================
 0    ``core`` (and the package root, whose lazy table imports nothing when it is loaded)
 1    ``formats``, ``kernels``, ``partition``, ``sampledata``
 2    ``storage``
 3    the contracts: the dataset contract (``registry``: manifests, the store, versions,
      ``latest``, resolve, registrations), the artifact-kind table with its manifests, reports
      and drawing helpers (``artifacts``), the ``warp doctor`` check table (``checks``); and the
      ETL kit (``etl``: the driver, executors, receipts, quarantine, spools), which every
      system's build stands on
 4    ``read``
 5    the systems, each with its pipeline on the ETL driver: ``warehouse``, ``features``,
      ``tiles``, ``tbl``, ``lineage``
 6    ``publishing`` (publish, ingest, register, embeddings add, multipart uploads, ``--from``)
      and ``doctor`` (warp's own checks and the runners)
 7    ``cli`` and ``commands``
====  =========================================================================================

A system reaches the floors above it only through a table of dotted paths resolved on use
(:mod:`warpdata.artifacts.kinds`, :mod:`warpdata.checks.registry`, :mod:`warpdata.etl.pipelines`),
never by an import. Other rules:

* Library code never renders: only ``warpdata.cli`` and ``warpdata.commands`` import the output
  module.
* Command modules import only the CLI layer and ``core`` at top level (``warp --help`` stays fast).
* No module cycles and no package cycles (each package one node), in-function imports counted.
* Library code does not reach the library through the package's face (``warpdata.dataset(...)``):
  it imports the module that holds the name.
* In-function imports of warp modules in library code only shrink (a ratchet).

The graph is read from the source with :mod:`ast`, so the test imports nothing it checks.
"""

from __future__ import annotations

import ast
import re
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = {"warp": "warpdata", "commands": "warpdata.commands", "formats": "warpdata.formats",
           "kernels": "warpdata.kernels"}

# package -> floor: every module of a package sits on its package's floor (no module-level exceptions)
FLOORS: dict[str, int] = {
    "warpdata": 0, "warpdata.core": 0,
    "warpdata.formats": 1, "warpdata.kernels": 1, "warpdata.partition": 1, "warpdata.sampledata": 1,
    "warpdata.storage": 2,
    "warpdata.registry": 3, "warpdata.artifacts": 3, "warpdata.checks": 3, "warpdata.etl": 3,
    "warpdata.read": 4,
    "warpdata.warehouse": 5, "warpdata.features": 5, "warpdata.tiles": 5, "warpdata.tbl": 5,
    "warpdata.lineage": 5,
    "warpdata.publishing": 6, "warpdata.doctor": 6,
    "warpdata.cli": 7, "warpdata.commands": 7, "warpdata.__main__": 7,
}
FLOOR_NAMES = ["core", "formats/kernels/partition", "storage", "contracts/etl kit", "read", "systems",
               "publishing/doctor", "cli/commands"]

# Upward reaches still in files this change did not own, as exact (importer, imported) pairs.
# Each must shrink to zero: remove a pair when its import goes, never add one.
UPWARD_ALLOWED: frozenset[tuple[str, str]] = frozenset()

# Library modules import warp modules at module level. These are the only imports of warp modules
# inside functions in library code (cli/ and commands/ import lazily for start-up), each with the
# measured reason; an (importer, imported) pair not listed here fails, and so does a listed one
# that is gone.
LAZY_ALLOWED: dict[tuple[str, str], str] = {
    # read/base.py's docstring has the figures: at the top, opening a dataset loaded 19 more modules
    # (dataset() 147 -> 210 ms CPU, `warp info` 190 -> 248 ms); these load on first use instead
    ("warpdata.read.base", "warpdata.read.table"): "the table reader (sqlgate, parquet stats) on table()",
    ("warpdata.read.base", "warpdata.registry.embeddings"): "embeddings (numpy search) on embeddings()",
    ("warpdata.read.dataset", "warpdata.read.refs"): "refs and the tar index on artifact()",
    ("warpdata.read.registered", "warpdata.read.refs"): "refs and the tar index on artifact()",
    ("warpdata.read.table", "warpdata.read.refs"): "refs on Table.batch_dicts() only",
    # the package's lazy table of public names (start-up): `import warpdata.tiles` loads no writer
    ("warpdata.tiles", "warpdata.tiles.writer"): "write_array() in the package face",
}


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


@cache
def _edges(path: Path) -> tuple[tuple[str, bool], ...]:
    """(imported warp module, whether the import is inside a function) for each import in ``path``."""
    tree = ast.parse(path.read_text(), str(path))
    found: list[tuple[str, bool]] = []

    def visit(nodes, in_function: bool) -> None:
        for n in nodes:
            if isinstance(n, ast.Import | ast.ImportFrom):
                if isinstance(n, ast.ImportFrom):
                    assert n.level == 0, f"{path}: relative import (use warpdata.* paths)"
                    base = n.module or ""
                    names = [f"{base}.{a.name}" for a in n.names] + [base]
                else:
                    names = [a.name for a in n.names]
                hit = {_resolve(name) for name in names if name.startswith("warpdata")} - {None}
                found.extend((m, in_function) for m in sorted(hit))
            elif isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
                visit(ast.iter_child_nodes(n), True)
            else:
                visit(ast.iter_child_nodes(n), in_function)

    visit(tree.body, False)
    return tuple(found)


def _imports(path: Path, module_level_only: bool) -> set[str]:
    return {m for m, inner in _edges(path) if not (inner and module_level_only)}


def _graph(module_level_only: bool) -> dict[str, set[str]]:
    return {m: _imports(p, module_level_only) - {m} for m, p in MODULES.items()}


def package(module: str) -> str:
    """The package a module belongs to: ``warpdata.registry.store`` -> ``warpdata.registry``."""
    return ".".join(module.split(".")[:2])


def floor(module: str) -> int:
    pkg = package(module)
    assert pkg in FLOORS, f"{pkg} is on no floor: add it to FLOORS (and to CONTRIBUTING.md's picture)"
    return FLOORS[pkg]


def _library(module: str) -> bool:
    return floor(module) < FLOORS["warpdata.cli"] and module != "warpdata"


def _upward() -> set[tuple[str, str]]:
    return {(m, d) for m, deps in _graph(False).items() for d in deps if floor(d) > floor(m)}


def test_every_module_is_on_a_floor():
    for m in MODULES:
        floor(m)


def test_every_package_on_the_floor_plan_exists():
    assert set(FLOORS) == {package(m) for m in MODULES}


def test_floors_are_counted_from_the_bottom_without_a_gap():
    assert sorted(set(FLOORS.values())) == list(range(len(FLOOR_NAMES)))


def _contributing_picture() -> dict[str, int]:
    """Package -> floor as CONTRIBUTING.md's "Floors" picture draws it (the folders, ``name/``, in its
    left column; a row that starts with a number starts that floor)."""
    text = (ROOT / "CONTRIBUTING.md").read_text("utf-8")
    block = text.split("## Floors", 1)[1].split("```", 2)[1]
    drawn: dict[str, int] = {}
    current = None
    for line in block.splitlines():
        left = line[:41]
        if m := re.match(r" ?(\d) ", left):
            current = int(m.group(1))
        for name in re.findall(r"(?<![\w<])(\w+)/", left):
            drawn[f"warpdata.{name}"] = current
    return drawn


def test_contributing_draws_the_floor_plan():
    drawn = {p: f for p, f in FLOORS.items() if p not in ("warpdata", "warpdata.__main__")}
    assert _contributing_picture() == drawn, "redraw CONTRIBUTING.md's floor picture from FLOORS"


def test_no_upward_reach():
    up = _upward()
    new = sorted(up - UPWARD_ALLOWED)
    assert not new, "imports of a higher floor (register in a table instead, see CONTRIBUTING.md): " + "; ".join(
        f"{m} ({FLOOR_NAMES[floor(m)]}) -> {d} ({FLOOR_NAMES[floor(d)]})" for m, d in new)
    gone = sorted(UPWARD_ALLOWED - up)
    assert not gone, f"these allowed upward reaches are gone: remove them from UPWARD_ALLOWED: {gone}"


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
    return sorted(out)


def _module_graph() -> dict[str, set[str]]:
    graph = _graph(False)
    # a package's __init__ importing its own submodules is not a cycle of design
    return {m: {d for d in deps if not (m != "warpdata" and d.startswith(m + "."))} for m, deps in graph.items()}


def _package_graph() -> dict[str, set[str]]:
    """Package -> the packages it imports, each package one node (the root's lazy table aside)."""
    graph: dict[str, set[str]] = {}
    for m, deps in _module_graph().items():
        if m == "warpdata":
            continue
        graph.setdefault(package(m), set()).update(
            package(d) for d in deps if d != "warpdata" and package(d) != package(m))
    return graph


# Module and package cycles, every import counted (in-function and TYPE_CHECKING ones too): none.
MODULE_CYCLES_ALLOWED: list[list[str]] = []
PACKAGE_CYCLES_ALLOWED: list[list[str]] = []


def test_no_module_cycles():
    assert _cycles(_module_graph()) == MODULE_CYCLES_ALLOWED


def test_no_package_cycles():
    assert _cycles(_package_graph()) == PACKAGE_CYCLES_ALLOWED


def test_the_package_check_finds_a_cycle_through_two_packages():
    """Issue 40: with publishing inside ``registry`` the folders knotted (registry <-> read, lineage,
    features, warehouse); a module that brings the wing back makes the package check fail again."""
    graph = _package_graph()
    graph["warpdata.registry"] = graph["warpdata.registry"] | {"warpdata.lineage"}  # publish's card merge
    assert any({"warpdata.lineage", "warpdata.registry"} <= set(cycle) for cycle in _cycles(graph))


def test_the_cycle_finder_finds_cycles():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_the_floor_check_sees_in_function_imports(tmp_path):
    p = tmp_path / "m.py"
    p.write_text("import os\n\ndef f():\n    from warpdata.cli import app\n")
    assert ("warpdata.cli", True) in _edges(p)
    assert floor("warpdata.cli") > floor("warpdata.core.errors")


def test_storage_is_below_the_registry():
    """warp/storage imports no read, registry or higher module, not even inside a function."""
    bad = {m: sorted(d for d in deps if floor(d) > floor("warpdata.storage"))
           for m, deps in _graph(False).items() if m.startswith("warpdata.storage")}
    bad = {m: d for m, d in bad.items() if d}
    assert not bad, f"warp/storage must not import the layers above it: {bad}"


def _lazy_pairs() -> set[tuple[str, str]]:
    return {(m, d) for m, p in MODULES.items() if _library(m) for d, inner in _edges(p) if inner and d != m}


def test_library_imports_warp_modules_at_module_level():
    pairs = _lazy_pairs()
    new = sorted(pairs - LAZY_ALLOWED.keys())
    assert not new, (f"warp imports inside functions in library code: {new}; import them at the top of the "
                     "module (lazy imports are for cli/, commands/ and heavy third-party packages, saying so)")
    gone = sorted(LAZY_ALLOWED.keys() - pairs)
    assert not gone, f"these lazy imports are gone: remove them from LAZY_ALLOWED: {gone}"


def _face_reaches(path: Path) -> list[str]:
    """``warpdata.NAME`` attribute uses in ``path`` other than ``__version__``."""
    tree = ast.parse(path.read_text(), str(path))
    return [f"{path.relative_to(ROOT)}:{n.lineno}: warpdata.{n.attr}" for n in ast.walk(tree)
            if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id == "warpdata"
            and n.attr != "__version__"]


def test_library_does_not_reach_through_the_package_face():
    bad = [hit for m, p in MODULES.items() if _library(m) for hit in _face_reaches(p)]
    assert not bad, f"import the module that holds the name instead: {bad}"
