"""Plug-ins by name: the one helper behind warp's registries.

Every registry in warp (ETL pipelines by ``[source] format``, tile backends, ``warp doctor``
check modules, ``warp inspect`` detectors, feature encoders) maps a name to a dotted target,
``"package.module:attribute"`` or ``"package.module"``, imported only when used, so a missing
optional package never breaks ``import warpdata`` or ``warp --help`` (fsspec's
``known_implementations`` and numcodecs' registry work the same way).
"""

from __future__ import annotations

import importlib
from typing import Any

from warpdata.core.errors import ConfigError


def load(target: str, what: str = "plug-in") -> Any:
    """The object named by ``target`` (``module:attr``, or a module); ConfigError naming ``what`` when absent."""
    mod, _, attr = target.partition(":")
    if not mod:
        raise ConfigError(f"{what} {target!r} must look like 'package.module:name'")
    try:
        module = importlib.import_module(mod)
    except ImportError as e:
        if e.name and mod.startswith(e.name) or e.name == mod:
            raise ConfigError(f"{what} module {mod!r} cannot be imported: {e}",
                              hint="install the package that provides it, or fix the name") from e
        raise  # the module exists but one of its own imports is missing: let the caller's hint speak
    if not attr:
        return module
    try:
        return getattr(module, attr)
    except AttributeError:
        raise ConfigError(f"{what} {target!r}: module {mod!r} has no attribute {attr!r}",
                          hint="check the name after the colon") from None
