"""Old import paths of moved modules keep working for one release, with a DeprecationWarning.

The publishing wing left ``warpdata.registry`` for ``warpdata.publishing`` and the ``warp doctor``
check table left ``warpdata.doctor`` for ``warpdata.checks`` (one floor per package:
tests/test_layering.py). Each old path imports the new module itself and warns the importer
(warp/core/moved.py); no warp code, test or benchmark uses an old path (this file aside).
"""

from __future__ import annotations

import ast
import importlib
import sys
import warnings
from pathlib import Path

import pytest
import warpdata
import warpdata.doctor
import warpdata.registry
from warpdata.core import moved

ROOT = Path(__file__).resolve().parents[1]

# old module path -> new one
MOVED = {
    "warpdata.registry.publish": "warpdata.publishing.publish",
    "warpdata.registry.ingest": "warpdata.publishing.ingest",
    "warpdata.registry.register_files": "warpdata.publishing.register_files",
    "warpdata.registry.embeddings_add": "warpdata.publishing.embeddings_add",
    "warpdata.registry.multipart": "warpdata.publishing.multipart",
    "warpdata.registry.from_artifacts": "warpdata.publishing.from_artifacts",
    "warpdata.doctor.registry": "warpdata.checks.registry",
}

# names a module of the contract kept importable after they moved up to the publishing wing
MOVED_NAMES = {
    ("warpdata.registry.register", name): "warpdata.publishing.register_files"
    for name in ("RegisterRequest", "RegisterResult", "ShadowsPublishedError", "published_in_store", "register")
} | {("warpdata.registry.embeddings", name): "warpdata.publishing.embeddings_add"
     for name in ("add", "AddResult", "load_embedder")}


def _forget(old: str) -> None:
    """Drop an earlier import of ``old`` in this process, so importing it runs the finder again."""
    sys.modules.pop(old, None)
    parent, _, child = old.rpartition(".")
    sys.modules[parent].__dict__.pop(child, None)


def test_the_list_is_the_finders_table():
    assert moved._FINDER.moved == MOVED


def test_the_old_paths_go_in_the_next_release():
    """When the version reaches REMOVED_IN, this fails: delete the old paths (and this file)."""
    def key(v: str) -> tuple[int, ...]:
        return tuple(int(x) for x in v.split("."))

    assert key(warpdata.__version__) < key(moved.REMOVED_IN)


@pytest.mark.parametrize("old, new", sorted(MOVED.items()))
def test_an_old_path_imports_the_new_module_and_warns_the_importer(old, new):
    _forget(old)
    module = importlib.import_module(new)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        exec(f"import {old} as via_old", ns := {"__name__": "user_code"})
    assert ns["via_old"] is module
    assert [(w.category, str(w.message)) for w in caught] == [(DeprecationWarning, (
        f"{old} moved to {new}: import it from there ({old} is removed in warp {moved.REMOVED_IN})"))]
    assert caught[0].filename == "<string>"  # the importer's line, not the import machinery's
    public = [n for n in vars(module) if not n.startswith("_")]
    assert len(public) > 3
    for name in public:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            got = importlib.import_module(old).__dict__[name]
        assert got is getattr(module, name), name


@pytest.mark.parametrize("old, new", sorted(MOVED.items()))
def test_from_an_old_path_import_a_name(old, new):
    _forget(old)
    name = sorted(n for n in vars(importlib.import_module(new)) if not n.startswith("_"))[0]
    with pytest.warns(DeprecationWarning, match=f"^{old} moved to {new}:"):
        exec(f"from {old} import {name} as got", ns := {})
    assert ns["got"] is getattr(importlib.import_module(new), name)


@pytest.mark.parametrize("old, name, new", sorted((m, n, new) for (m, n), new in MOVED_NAMES.items()))
def test_a_moved_name_resolves_with_a_warning(old, name, new):
    with pytest.warns(DeprecationWarning, match=f"^{old}.{name} moved to {new}.{name}:"):
        got = getattr(importlib.import_module(old), name)
    assert got is getattr(importlib.import_module(new), name)


def test_an_unknown_name_is_still_an_attribute_error():
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        importlib.import_module("warpdata.registry.register").nothing  # noqa: B018


def _uses_of_old_paths(path: Path) -> list[str]:
    """Imports of an old path, and strings naming one (a ``monkeypatch.setattr`` target), in ``path``."""
    olds = tuple(MOVED)
    hits = []
    for n in ast.walk(ast.parse(path.read_text("utf-8"), str(path))):
        names: list[str] = []
        if isinstance(n, ast.Import):
            names = [a.name for a in n.names]
        elif isinstance(n, ast.ImportFrom) and n.module:
            names = [n.module] + [f"{n.module}.{a.name}" for a in n.names]
        elif isinstance(n, ast.Constant) and isinstance(n.value, str):
            names = [n.value]
        hits += [f"{path.relative_to(ROOT)}:{n.lineno}: {x}" for x in names
                 if any(x == o or x.startswith((o + ".", o + ":")) for o in olds)]
    return hits


def test_nothing_of_warp_uses_an_old_path():
    declared = {ROOT / "warp" / "registry" / "__init__.py", ROOT / "warp" / "doctor" / "__init__.py",
                Path(__file__).resolve()}
    files = [p for top in ("warp", "commands", "formats", "kernels", "tests", "bench", "examples")
             for p in sorted((ROOT / top).rglob("*.py")) if p.resolve() not in declared]
    assert len(files) > 300
    hits = [h for p in files for h in _uses_of_old_paths(p)]
    assert hits == [], f"import the new path instead: {hits}"
