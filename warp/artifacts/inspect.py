"""The registry of ``warp inspect`` detectors.

Each inspector module exposes

* ``sniff(target: str, head: bytes | None, is_dir: bool) -> bool``: cheap
  recognition by magic bytes, file name or manifest type (``head`` is the
  first 4 KiB of a file, ``None`` for directories and non-paths);
* ``inspect(target: str, *, verify: bool, head: int) -> Report``.

``INSPECTORS`` is tried in order; the first that sniffs the target wins.
A :class:`Report` is a JSON-able summary plus sections for humans.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from warpdata.artifacts.kinds import KINDS
from warpdata.core.names import DATASET, FEATURE_CACHE, TENSOR_WAREHOUSE, ZARR_ARRAY
from warpdata.core.registry import load

# tried in this order (the first whose sniff() claims the target wins): the artifact kinds'
# inspectors from their table (warpdata.artifacts.kinds), plus .tbl files and any other manifest
INSPECTORS: tuple[tuple[str, str], ...] = tuple(
    (name, KINDS[name].inspector if name in KINDS else module)
    for name, module in (
        (FEATURE_CACHE, ""),
        ("tbl", "warpdata.tbl.inspect"),
        (TENSOR_WAREHOUSE, ""),
        (ZARR_ARRAY, ""),
        ("manifest", "warpdata.artifacts.inspect_manifest"),
        (DATASET, ""),
    )
)


@dataclass
class Report:
    kind: str
    target: str
    summary: dict[str, Any]
    # (title, columns, rows) tables shown after the summary for humans
    tables: list[tuple[str, list[str], list[list[Any]]]] = field(default_factory=list)
    ok: bool = True  # False: --verify found a problem (exit 1)
    problems: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        d = {"kind": self.kind, "target": self.target, "ok": self.ok, **self.summary}
        if self.problems:
            d["problems"] = self.problems
        for title, cols, rows in self.tables:
            d.setdefault("tables", {})[title] = [dict(zip(cols, r, strict=False)) for r in rows]
        return d


def read_head(target: str, n: int = 4096) -> tuple[bytes | None, bool]:
    if os.path.isdir(target):
        return None, True
    if os.path.isfile(target):
        with open(target, "rb") as f:
            return f.read(n), False
    return None, False


def find_inspector(target: str):
    head, is_dir = read_head(target)
    for _name, modname in INSPECTORS:
        mod = load(modname, "inspector")
        if mod.sniff(target, head, is_dir):
            return mod
    return None
