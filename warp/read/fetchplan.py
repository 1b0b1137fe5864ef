"""What each rank of a job will fetch in an epoch, before the job is launched (``warp inspect
WS/NAME --plan --world N``; docs/partitioning.md, "The plan of an epoch").

For every rank and DataLoader worker the plan walks the same split (:class:`ShardPlan`) and
the same row-group keys as :class:`~warpdata.read.batches.BatchStream`, and prices each read
the way the reader makes it: a small shard read in full is one GET of the object; a row group
read in full is its column chunks; part of a row group is the column chunks' offset indexes,
then their dictionary pages and the pages holding the rows. Ranged GETs are counted as the
reader coalesces them (:func:`warpdata.storage.ranges.plan_ranges`). A shard whose manifest
entry carries its page index (docs/formats/registry.md, "Page index in the manifest") costs no
footer and no offset index, for the ranks or for the plan; for the others, the footers and offset
indexes this needs are fetched once by the plan itself (its own cost is reported apart).
Caches are left out: this is a cold epoch on every node.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from warpdata.formats import parquet_pages as pp
from warpdata.partition.plan import ShardPlan
from warpdata.partition.split import mode_of
from warpdata.read.batches import (
    PAGE_WASTE,
    WHOLE_SHARD_BYTES,
    BatchStream,
    _ShardFiles,
    chunk_ranges,
)
from warpdata.storage.ranges import plan_ranges

__all__ = ["EpochPlan", "ReaderPlan", "epoch_plan"]


@dataclass
class ReaderPlan:
    rank: int
    worker: int
    rows: int = 0
    requests: int = 0
    bytes: int = 0
    objects: set = field(default_factory=set)
    # bytes by what they are: whole shards, row groups' column chunks, footers, offset indexes, pages
    kinds: dict = field(default_factory=dict)

    def add(self, kind: str, requests: int, nbytes: int) -> None:
        self.requests += requests
        self.bytes += nbytes
        self.kinds[kind] = self.kinds.get(kind, 0) + nbytes

    def to_dict(self) -> dict[str, Any]:
        return {"rank": self.rank, "worker": self.worker, "rows": self.rows, "requests": self.requests,
                "bytes": self.bytes, "objects": len(self.objects), "bytes_by_kind": dict(sorted(self.kinds.items()))}


@dataclass
class EpochPlan:
    dataset: str
    version: str
    table: str
    world: int
    workers: int
    columns_bytes: int  # the column chunks one reading of the table moves at least
    readers: list[ReaderPlan]
    planning: dict[str, int]  # what making this plan cost (footers, offset indexes)

    @property
    def bytes(self) -> int:
        return sum(r.bytes for r in self.readers)

    @property
    def requests(self) -> int:
        return sum(r.requests for r in self.readers)

    def bytes_by_kind(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for r in self.readers:
            for k, v in r.kinds.items():
                out[k] = out.get(k, 0) + v
        return dict(sorted(out.items()))

    def to_dict(self) -> dict[str, Any]:
        return {"dataset": self.dataset, "version": self.version, "table": self.table, "world": self.world,
                "workers": self.workers, "columns_bytes": self.columns_bytes, "bytes": self.bytes,
                "requests": self.requests, "bytes_ratio": self.bytes / max(1, self.columns_bytes),
                "bytes_by_kind": self.bytes_by_kind(),
                "readers": [r.to_dict() for r in self.readers], "planning": self.planning}


def epoch_plan(table: Any, world: int, workers: int = 0, batch_size: int = 8192,
               columns: Sequence[str] | None = None, *, drop_last: bool = False, pad: bool = False,
               shuffle: bool = False, seed: int = 0, epoch: int = 0) -> EpochPlan:
    """The plan of one epoch of ``table`` (a :class:`~warpdata.read.table.Table`) over ``world``
    ranks with ``workers`` DataLoader workers each (0: the rank's own process)."""
    ds = table.ds
    cols = table._check_columns(columns)
    names = set(cols) if cols is not None else None
    before = ds.remote.stats.snapshot() if hasattr(ds.remote.stats, "snapshot") else None
    files = _ShardFiles(ds, table.shards)
    counts = table._row_counts()
    mode = mode_of(drop_last, pad, "inspect --plan")
    bounds: dict[int, list[int]] = {}

    def bounds_of(unit: int) -> list[int]:
        if unit not in bounds:
            b = [0]
            for n in files.row_groups(unit):
                b.append(b[-1] + n)
            bounds[unit] = b
        return bounds[unit]

    all_cols = cols is None or set(cols) >= set(table.schema_names())
    oi_memo: dict[tuple[int, int, int], pp.ChunkPages] = {}

    def chunk_pages(unit: int, g: int, leaf: int) -> pp.ChunkPages | None:
        key = (unit, g, leaf)
        if key not in oi_memo:
            raw = files._footers.get(unit)
            if raw is None:
                return None
            fmd = pp.footer_of(raw)
            index = files._index.get(unit)
            if index is not None:  # the manifest's page index (no request)
                oi_memo[key] = index.chunk(fmd, g, leaf)
                return oi_memo[key]
            r = pp.offset_index(fmd, g, leaf)
            if r is None:
                return None
            oi_memo[key] = pp.pages_for_rows(fmd, g, leaf, files._src[unit].read_at(r[1], r[0]))
        return oi_memo[key]

    readers = []
    column_total = 0
    for unit in range(len(table.shards)):
        md = files.get(unit).metadata
        column_total += sum(n for _, n in chunk_ranges(md, range(md.num_row_groups), cols))
    for rank in range(world):
        plan = ShardPlan(counts, rank=rank, world=world, batch_size=batch_size, policy=mode, seed=seed,
                         epoch=epoch, shuffle=shuffle)
        for worker in range(max(1, workers)):
            rp = ReaderPlan(rank, worker)
            ids = plan.worker_batches(worker, max(1, workers)) if plan.remaining() else []
            stream = BatchStream(table, plan, ids, cols, None, 0)
            keys = list(stream._row_group_keys(bounds_of))
            rp.rows = sum(hi - lo for _, _, lo, hi in keys)
            by_unit: dict[int, list[tuple[int, int, int]]] = {}
            for unit, g, lo, hi in keys:
                by_unit.setdefault(unit, []).append((g, lo, hi))
            for unit, groups in by_unit.items():
                s = table.shards[unit]
                rp.objects.add(s.hash)
                b = bounds_of(unit)
                full = [lo == 0 and hi == b[g + 1] - b[g] for g, lo, hi in groups]
                if all_cols and all(full) and len(groups) == len(b) - 1 and s.byte_size <= WHOLE_SHARD_BYTES \
                        and files.whole_candidate(unit):
                    rp.add("shards", 1, s.byte_size)
                    continue
                md = files.get(unit).metadata  # opened: its page index taken from the manifest if it has one
                indexed = unit in files._index
                if not indexed:  # the manifest's page index carries the footer
                    rp.add("footers", 1, (s.stats or {}).get("footer_size") or 0)
                leaves = [j for j in range(md.num_columns)
                          if names is None or md.schema.column(j).path.split(".")[0] in names]
                whole = [g for (g, _, _), f in zip(groups, full, strict=True) if f]
                data = chunk_ranges(md, whole, cols)
                ois, pages = [], []
                for (g, lo, hi), f in zip(groups, full, strict=True):
                    if f:
                        continue
                    cps = {leaf: chunk_pages(unit, g, leaf) for leaf in leaves}
                    if any(cp is None for cp in cps.values()):  # no page index: the whole row group
                        data += chunk_ranges(md, [g], cols)
                        continue
                    if not indexed:
                        fmd = pp.footer_of(files._footers[unit])
                        ois += [pp.offset_index(fmd, g, leaf) for leaf in leaves]
                    for cp in cps.values():
                        k, m, _, _ = cp.covering(lo, hi)
                        pages += ([cp.dict_range] if cp.dict_range else []) + [cp.byte_range(k, m)]
                for kind, ranges, waste in (("row groups", data, None), ("page indexes", ois, PAGE_WASTE),
                                            ("pages", pages, PAGE_WASTE)):
                    got = plan_ranges(ranges, waste=waste)
                    rp.add(kind, len(got), sum(n for _, n in got))
            readers.append(rp)
    after = ds.remote.stats.snapshot() if before is not None else None
    cost = {k: after[k] - before[k] for k in ("requests", "bytes")} if after else {}
    files.close()
    return EpochPlan(ds.id, ds.version, table.name, world, workers, column_total, readers, cost)
