"""warpdata: the library behind the ``warp`` toolchain.

Importing ``warpdata`` is cheap: the public API below is resolved lazily so
``warp --help`` and TAB completion do not pay for numpy, pyarrow or DuckDB.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

# name -> "module:attribute"; filled in as the systems land.
_LAZY: dict[str, str] = {
    "TblReader": "warpdata.formats.tbl:TblReader",
    "dataset": "warpdata.read.dataset:dataset",
    "Store": "warpdata.registry.store:Store",
    "Manifest": "warpdata.registry.manifest:Manifest",
    "DatasetBuilder": "warpdata.publishing.publish:DatasetBuilder",
    "publish": "warpdata.publishing.publish:publish",
    "ShardCache": "warpdata.features.reader:ShardCache",
    "TileWriter": "warpdata.tiles.writer:TileWriter",
    "write_array": "warpdata.tiles:write_array",
    "open_warehouse": "warpdata.warehouse:open",
    "TWH1Shard": "warpdata.formats.twh1:TWH1Shard",
}


# Public sub-packages: ``import warpdata; warpdata.warehouse.open(...)`` works
# without importing each one up front (they pull numpy/pyarrow).
_SUBPACKAGES: frozenset[str] = frozenset({
    "commands", "formats", "kernels", "warehouse", "tiles", "registry", "features",
    "tbl", "sampledata", "etl", "cli", "core", "storage", "artifacts", "doctor", "read",
    "partition", "lineage", "publishing", "checks",
})


def __getattr__(name: str) -> Any:
    if name in _SUBPACKAGES:
        value = importlib.import_module(f"{__name__}.{name}")
        globals()[name] = value
        return value
    target = _LAZY.get(name)
    if target is None:
        raise AttributeError(f"module 'warpdata' has no attribute {name!r}")
    mod, _, attr = target.partition(":")
    value = getattr(importlib.import_module(mod), attr) if attr else importlib.import_module(mod)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY) | _SUBPACKAGES)
