"""CONTRIBUTING.md's references exist: every repository path and every `symbol` it names.

Read from its prose (fenced blocks are pictures and command lines, not references), each
backticked span is one of:

* a **path** (``warp/etl/driver.py``, ``tests/support/``, ``cli/``): it exists, from the
  repository root or, for the package's own folders (``cli/``, ``registry/``), under ``warp/``;
  a bare file name (``test_driver.py``) exists somewhere in the tree; a span with a
  ``<placeholder>`` is a pattern and is not looked up;
* a **dotted name** of the package (``warpdata.cli.app.COMMANDS``, ``core.registry.load(...)``,
  ``warpdata.features.manifest:sniff``): it imports and the attribute is there;
* a **symbol named beside its module**, ``SYM`` (``module.py``), ``module.py`` (``SYM``, ...)
  or ``module.py``: ``SYM``, as in "its line in ``WRITES`` and ``LIMITED``
  (``tests/cli/test_os_errors.py``)": the module defines it at top level (``Class.attr``: in the
  class's body); a signature to write (``run(request: EtlRequest) -> EtlResult``) names types the
  module defines. Issue 40: CONTRIBUTING pointed at ``test_output_edges.py`` for lists that live
  in ``test_os_errors.py``; a reference that moves, or is written against the wrong file, fails
  here.
* any other **identifier** in a paragraph or list item that names Python modules: one of those
  modules (or, failing that, one named in the same section) defines it, at any depth (a
  method, a class attribute, a keyword); or it is one of the ``WORDS`` below, which name
  something that is not a Python name (a manifest key, a task field, a command's word).
"""

from __future__ import annotations

import ast
import functools
import importlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CONTRIBUTING = ROOT / "CONTRIBUTING.md"

# spans that read as identifiers but name no Python definition, with what they are
WORDS = {
    "warpdata": "the import name",
    "typer": "a third-party package",
    "cli": "the `cli` pytest fixture (tests/conftest.py)",
    "main": "each command module's function (commands/<name>.py, a placeholder)",
    "fingerprint": "the manifest key naming a build's identity (buildconfig.IDENTITY's value)",
    "index": "the field every planned ETL task has",
    "previewer": "ArtifactKind's keyword (checked with ArtifactKind)",
    "store": "the conformance suite's fixture name",
    "run": "a pipeline's function (warp/<system>/etl.py, a placeholder)",
    "TYPE_CHECKING": "typing's constant",
    "SIZE": "the metavar of size options",
}

_SYMBOL = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)?")
_SPAN = re.compile(r"`([^`]+)`")
_JOIN = r"(?:,\s*(?:and\s+|or\s+|then\s+)?|\s+and\s+|\s+or\s+)"


def _prose() -> str:
    return re.sub(r"^```.*?^```[ \t]*$", "", CONTRIBUTING.read_text("utf-8"), flags=re.M | re.S)


def _is_path(span: str) -> bool:
    return (not re.search(r"[\s(=\"'<>]", span) and not span.startswith("-") and "://" not in span
            and ("/" in span or re.search(r"\.(py|md|toml|json|txt|cfg|sh)$", span) is not None)
            and not re.fullmatch(r"[\w.]+:[\w.]+", span))


def _placeholder(span: str) -> bool:
    return "<" in span


def _symbol(span: str) -> str | None:
    """The name a span refers to: ``drive(...)`` -> ``drive``, ``Journal.writer()`` -> ``Journal.writer``;
    None for a path, a command line (``warp --help``) or anything else that is not a name."""
    head = re.split(r"[(\[]", span, maxsplit=1)[0]
    return head if _SYMBOL.fullmatch(head) and not _is_path(span) else None


def _names(span: str) -> list[str]:
    """What a span asks a module to define: its symbol; for a signature of a function to write
    (``run(request: EtlRequest) -> EtlResult``), the types it names, which the module defines."""
    if "->" in span:
        return re.findall(r"\b[A-Z][A-Za-z0-9]+\b", span)
    name = _symbol(span)
    return [name] if name else []


def _resolve_path(span: str) -> Path | None:
    rel = span.rstrip("/")
    for base in (ROOT, ROOT / "warp"):
        if (base / rel).exists():
            return base / rel
    if "/" not in rel:  # a bare file name, named in prose beside its folder
        return next((p for top in _TREES for p in (ROOT / top).rglob(rel)), None)
    return None


_TREES = ("warp", "commands", "formats", "kernels", "tests", "docs", "bench", "examples")


@functools.cache
def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text("utf-8"))


def _top_level(path: Path) -> dict[str, ast.AST]:
    """Names a module binds at top level (also inside top-level if/try), with their nodes."""
    names: dict[str, ast.AST] = {}

    def visit(body) -> None:
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names[node.name] = node
            elif isinstance(node, (ast.Assign, ast.AnnAssign)):
                for t in node.targets if isinstance(node, ast.Assign) else [node.target]:
                    for n in ast.walk(t):
                        if isinstance(n, ast.Name):
                            names[n.id] = node
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                for a in node.names:
                    names[(a.asname or a.name).split(".")[0]] = node
            elif isinstance(node, (ast.If, ast.Try)):
                visit(node.body)
                visit(getattr(node, "orelse", []))
                for h in getattr(node, "handlers", []):
                    visit(h.body)

    visit(_tree(path).body)
    return names


def _anywhere(path: Path) -> set[str]:
    """Every name a module defines at any depth: functions, classes, assigned names and attributes,
    keyword arguments and parameters (a dataclass field, a Plug's hook, a conformance attribute)."""
    out: set[str] = set()
    for n in ast.walk(_tree(path)):
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out.add(n.name)
        elif isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store):
            out.add(n.id)
        elif isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Store):
            out.add(n.attr)
        elif (isinstance(n, ast.keyword) and n.arg) or isinstance(n, ast.arg):
            out.add(n.arg)
        elif isinstance(n, (ast.Import, ast.ImportFrom)):  # a face re-exporting its parts
            out.update((a.asname or a.name).split(".")[0] for a in n.names)
    return out


def _defines(path: Path, symbol: str) -> bool:
    head, _, attr = symbol.partition(".")
    node = _top_level(path).get(head)
    if node is None:
        return False
    if not attr:
        return True
    if isinstance(node, ast.ClassDef):
        return attr in {n.name for n in node.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))} | {
            t.id for n in node.body if isinstance(n, (ast.Assign, ast.AnnAssign))
            for t in (n.targets if isinstance(n, ast.Assign) else [n.target]) if isinstance(t, ast.Name)}
    return True  # a module attribute's attribute: the module binds the name, which is what is named


def _module_path(span: str) -> Path | None:
    if _placeholder(span) or not span.endswith(".py"):
        return None
    return _resolve_path(span)


def _flat(text: str) -> str:
    return re.sub(r"\s+", " ", text)


def _sections() -> list[list[str]]:
    """The prose as sections (headings), each a list of paragraphs and list items."""
    sections: list[list[str]] = [[]]
    para: list[str] = []

    def close() -> None:
        if para:
            sections[-1].append(_flat(" ".join(para)))
            para.clear()

    for line in _prose().splitlines():
        if line.startswith("#"):
            close()
            sections.append([])
        elif not line.strip() or re.match(r"\s*(\d+\.|[-*])\s", line):
            close()
            if line.strip():
                para.append(line)
        else:
            para.append(line)
    close()
    return sections


def paired() -> list[tuple[str, str]]:
    """(symbol, module path) for every symbol CONTRIBUTING names right beside its module."""
    text = _flat(_prose())
    sym = r"`([^`]+)`"
    pairs = []
    # `A`, `B` and `C` (`path.py` ...
    for m in re.finditer(rf"((?:`[^`]+`{_JOIN})*`[^`]+`) \(`([^`]+\.py)`", text):
        pairs += [(s, m.group(2)) for s in re.findall(sym, m.group(1))]
    # `path.py` (`A`, `B`, `C`) and `path.py`: `A`, then `B`
    for m in re.finditer(rf"`([^`]+\.py)`(?: \(|: )((?:`[^`]+`{_JOIN})*`[^`]+`)", text):
        pairs += [(s, m.group(1)) for s in re.findall(sym, m.group(2))]
    return [(n, p) for s, p in pairs if not _placeholder(p) and not _placeholder(s) for n in _names(s)]


def test_every_path_contributing_names_exists():
    spans = [s for s in _SPAN.findall(_flat(_prose())) if _is_path(s) and not _placeholder(s)]
    generic = {"manifest.json", "expected.json"}  # what every such directory holds, not one file
    missing = [s for s in spans if s not in generic and _resolve_path(s) is None]
    assert len(spans) > 60  # the parse found the references
    assert missing == [], f"CONTRIBUTING.md names paths that do not exist: {missing}"


def test_every_dotted_name_of_the_package_resolves():
    names = [s for s in _SPAN.findall(_flat(_prose())) if re.match(r"(warpdata|core)\.\w", s)
             and not _placeholder(s)]
    assert len(names) >= 10
    broken = []
    for span in names:
        dotted = re.split(r"[(\[ ]", span, maxsplit=1)[0].replace(":", ".")
        if dotted.startswith("core."):
            dotted = "warpdata." + dotted
        parts = dotted.split(".")
        for cut in range(len(parts), 0, -1):
            try:
                obj = importlib.import_module(".".join(parts[:cut]))
            except ImportError:
                continue
            try:
                for attr in parts[cut:]:
                    obj = getattr(obj, attr)
            except AttributeError:
                broken.append(span)
            break
        else:
            broken.append(span)
    assert broken == [], f"CONTRIBUTING.md names package attributes that do not exist: {broken}"


def test_every_symbol_named_beside_its_module_is_defined_there():
    pairs = paired()
    # the references issue 40 found wrong, and a few others, are among those checked
    for want in [("RUNS", "tests/cli/test_os_errors.py"), ("WRITES", "tests/cli/test_os_errors.py"),
                 ("LIMITED", "tests/cli/test_os_errors.py"), ("SIZE_RUNS", "tests/cli/test_output_edges.py"),
                 ("FLOORS", "tests/test_layering.py"), ("Journal", "warp/etl/receipts.py"),
                 ("build_schema", "warp/etl/buildconfig.py")]:
        assert want in pairs, want
    wrong = [(s, p) for s, p in pairs if (m := _module_path(p)) is None or not _defines(m, s)]
    assert wrong == [], f"CONTRIBUTING.md names symbols beside modules that do not define them: {wrong}"


def test_every_other_identifier_is_defined_by_a_module_its_paragraph_names():
    unknown = []
    checked = 0
    for section in _sections():
        section_modules = [m for p in section for s in _SPAN.findall(p) if (m := _module_path(s))]
        for para in section:
            spans = _SPAN.findall(para)
            modules = [m for s in spans if (m := _module_path(s))]
            if not modules:
                continue
            for span in spans:
                if re.match(r"(warpdata|core)\.", span):
                    continue
                for name in _names(span):
                    if name in WORDS:
                        continue
                    checked += 1
                    last = name.split(".")[-1]
                    if not any(last in _anywhere(m) for m in modules + section_modules):
                        unknown.append(span)
    assert checked > 50
    assert unknown == [], (f"CONTRIBUTING.md names {unknown}, defined by none of the modules its paragraph or "
                           "section names: fix the reference, name the module, or add a word to WORDS")


@pytest.mark.parametrize("text, pairs", [
    ("its line in `WRITES` and `LIMITED` (`tests/cli/test_os_errors.py`) too",
     [("WRITES", "tests/cli/test_os_errors.py"), ("LIMITED", "tests/cli/test_os_errors.py")]),
    ("`warp/etl/buildconfig.py` (`build_schema`, `check_build_keys`, `thresholds`)",
     [("build_schema", "warp/etl/buildconfig.py"), ("check_build_keys", "warp/etl/buildconfig.py"),
      ("thresholds", "warp/etl/buildconfig.py")]),
    ("(`warp/etl/driver.py`: `split_receipted`, then `run_receipted` on any", [
        ("split_receipted", "warp/etl/driver.py"), ("run_receipted", "warp/etl/driver.py")]),
])
def test_the_pairing_reads_the_three_ways_a_module_is_named(monkeypatch, text, pairs):
    monkeypatch.setattr(f"{__name__}._prose", lambda: text)
    assert paired() == pairs
