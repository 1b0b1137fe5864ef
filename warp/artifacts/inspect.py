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


@dataclass(frozen=True)
class Target:
    """What ``warp inspect`` can be pointed at: a name, its inspector module and its previewer (dotted paths)."""

    name: str
    inspector: str
    previewer: str = ""
    # "module:function" answering sniff(target, head, is_dir) without loading the inspector: every
    # target is sniffed by the entries before its own, so a sniff that imports a reader taxes them all
    sniffer: str = ""

    def sniff(self, target: str, head: bytes | None, is_dir: bool) -> bool:
        fn = load(self.sniffer, "sniffer") if self.sniffer else load(self.inspector, "inspector").sniff
        return bool(fn(target, head, is_dir))


# tried in this order (the first whose sniff() claims the target wins): the artifact kinds'
# inspectors and previewers from their table (warpdata.artifacts.kinds), plus .tbl files and any
# other manifest
INSPECTORS: tuple[Target, ...] = (
    Target(FEATURE_CACHE, KINDS[FEATURE_CACHE].inspector, KINDS[FEATURE_CACHE].previewer,
           sniffer="warpdata.features.manifest:sniff"),
    Target("tbl", "warpdata.tbl.inspect", "warpdata.artifacts.preview:tbl"),
    Target(TENSOR_WAREHOUSE, KINDS[TENSOR_WAREHOUSE].inspector, KINDS[TENSOR_WAREHOUSE].previewer),
    Target(ZARR_ARRAY, KINDS[ZARR_ARRAY].inspector, KINDS[ZARR_ARRAY].previewer),
    Target("manifest", "warpdata.artifacts.inspect_manifest"),
    Target(DATASET, KINDS[DATASET].inspector, KINDS[DATASET].previewer),
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


def find_target(target: str) -> Target | None:
    """The first entry of :data:`INSPECTORS` whose inspector sniffs ``target``, or None."""
    head, is_dir = read_head(target)
    for t in INSPECTORS:
        if t.sniff(target, head, is_dir):
            return t
    return None


def find_inspector(target: str):
    """The inspector module of ``target`` (see :func:`find_target`), or None."""
    found = find_target(target)
    return load(found.inspector, "inspector") if found else None
