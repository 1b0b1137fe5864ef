"""Old import paths of modules and names that moved, kept for one release with a DeprecationWarning.

When a module moves to the package of its floor (docs/design.md §2 "Floors"), the package it
left names it here, old dotted path -> new one: ``import warpdata.registry.publish`` (and
``from warpdata.registry.publish import publish``) then loads ``warpdata.publishing.publish``
itself (the same module object, so a name read or patched through either path is one name) and
warns the importer once per path. Nothing is left at the old file path, so a change made there on
another branch follows the file to its new folder when the branches merge. ``REMOVED_IN`` is the
release that drops the old paths.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import sys
import warnings
from collections.abc import Mapping
from types import ModuleType
from typing import Any

REMOVED_IN = "0.2.0"


def _message(old: str, new: str) -> str:
    return f"{old} moved to {new}: import it from there ({old} is removed in warp {REMOVED_IN})"


class _MovedModules:
    """Finds each old dotted path and loads it as the module at its new path: a meta path finder
    and its loader (the protocols of importlib.abc, not its classes: importing that module loads
    importlib.resources and pathlib, ~20 ms, on every read that loads the registry)."""

    def __init__(self) -> None:
        self.moved: dict[str, str] = {}

    def find_spec(self, fullname: str, path: Any = None, target: ModuleType | None = None
                  ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in self.moved:
            return None
        return importlib.machinery.ModuleSpec(fullname, self)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        new = self.moved[spec.name]
        # stacklevel 2: the frame that imports (the import machinery's own frames are skipped)
        warnings.warn(_message(spec.name, new), DeprecationWarning, stacklevel=2)
        return importlib.import_module(new)

    def exec_module(self, module: ModuleType) -> None:
        """The module ran when it was imported at its new path."""


_FINDER = _MovedModules()


def moved_modules(moved: Mapping[str, str]) -> None:
    """Make each old dotted module path import its new module, with a DeprecationWarning."""
    _FINDER.moved.update(moved)
    if _FINDER not in sys.meta_path:
        sys.meta_path.append(_FINDER)


def moved_name(old_module: str, name: str, new_module: str) -> Any:
    """``name`` from ``new_module``, for a module ``__getattr__`` that kept it importable from ``old_module``."""
    warnings.warn(_message(f"{old_module}.{name}", f"{new_module}.{name}"), DeprecationWarning, stacklevel=3)
    return getattr(importlib.import_module(new_module), name)
