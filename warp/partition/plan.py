"""Deterministic sharding of a table over ranks × DataLoader workers, with resume.

Contract
--------
Input: the row counts of a table's *units* (Parquet row groups, in manifest
order), ``rank``/``world``, ``batch_size``, a split ``policy`` and ``seed``/``epoch``.

* The units are put in one order (manifest order, or a permutation seeded by
  ``(seed, epoch)`` when ``shuffle``), giving a global row sequence of N rows.
  Every rank takes one contiguous range of it (:func:`warpdata.partition.split.rank_span`),
  so reads stay row-group sequential and a rank touches at most two partial
  row groups.
* ``policy`` is the split mode of :mod:`warpdata.partition.split`, the one
  partitioning of every loader (docs/partitioning.md): ``"exact"`` (the
  default; every row exactly once, ranks may differ by one row and one
  batch), ``"pad"`` (⌈N/world⌉ rows per rank, the missing ones repeating the
  sequence from its start: ``pad_rows``) or ``"drop"`` (only full batches, the
  same number per rank; the tail of the sequence is skipped: ``dropped_rows``).
* Batch ``j`` of a rank is its rows ``[j·bs, min((j+1)·bs, R))``. The batches
  not yet consumed are split into contiguous runs, one per DataLoader worker;
  fewer batches left than workers (some worker would get none) is a
  :class:`ShardingError` (fewer workers or a smaller batch size fixes it). A PyTorch DataLoader yields them round-robin
  across workers (:meth:`ShardPlan.yield_order`).
* :class:`ResumeState` is a tiny JSON document (manifest hash, table, seed,
  epoch, rank, world, batch size, policy, ``consumed``: half-open intervals
  of batch indices already yielded, and ``done``: row positions of the
  sequence consumed before this run). Resuming skips exactly those batches and
  may use a different worker count; resuming a resumed run works the same.
* Another world size: :meth:`ShardPlan.merge_states` folds the states of every
  rank of the old run into one state (``world`` 0, ``done`` = every row read);
  the new run's ranks split the rows left by the same rules, so each row is
  read exactly once over both runs (``exact``).

Pure Python and the standard library, but for the digests (numpy, :mod:`warpdata.partition.digest`).
"""

from __future__ import annotations

import bisect
import json
import random
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

from warpdata.partition.digest import carry, check_same_epoch
from warpdata.partition.keys import Digest, P, RunPrefix, merge_runs, order_digest, sample_keys
from warpdata.partition.split import (
    MODES,
    Remainder,
    check_all_ranks,
    check_drop_leaves_batches,
    merge_intervals,
    rank_span,
)
from warpdata.partition.states import (
    ResumeStateError,
    bad,
    check_carried,
    check_done,
    check_table_state,
    compare,
    load_json,
)
from warpdata.partition.tally import Ledger, Tally
from warpdata.partition.world import ResumeMismatchError, ShardingError, _from_env

POLICIES = MODES  # ("exact", "pad", "drop")
__all__ = ["POLICIES", "PendingState", "ResumeState", "ShardPlan", "ShardingError", "Slice", "auto_shard", "merge_intervals"]


@dataclass(frozen=True)
class Slice:
    """Rows ``[start, stop)`` of unit ``unit`` (an index into the unit list)."""

    unit: int
    start: int
    stop: int

    @property
    def rows(self) -> int:
        return self.stop - self.start


@dataclass(frozen=True)
class ResumeState:
    manifest: str
    table: str
    seed: int
    epoch: int
    rank: int
    world: int
    batch_size: int
    policy: str
    shuffle: bool = False
    consumed: tuple[tuple[int, int], ...] = ()
    num_batches: int = 0
    done_rows: tuple[tuple[int, int], ...] = ()  # sequence positions read before this run (any rank)
    # digests of what this rank consumed (warpdata.partition.digest, docs/partitioning.md)
    content: str = ""
    order_digest: str = ""
    consumed_digest: str = ""
    consumed_samples: int = 0
    pad_digest: str = ""
    pad_samples: int = 0
    dropped_digest: str = ""
    dropped_samples: int = 0
    carried: tuple = ()

    @property
    def done(self) -> bool:
        return sum(b - a for a, b in self.consumed) >= self.num_batches > 0

    @property
    def elastic(self) -> bool:
        """A merged state (:meth:`ShardPlan.merge_states`): resumable at any rank and world size."""
        return self.world == 0

    def values(self) -> dict[str, Any]:
        """The state's fields by name (a pending state's digests computed here: :class:`PendingState`)."""
        return {k: getattr(self, k) for k in _FIELDS}

    def to_json(self) -> str:
        d = self.values()
        d["consumed"] = [list(x) for x in self.consumed]
        d["done_rows"] = [list(x) for x in self.done_rows]
        d["carried"] = list(self.carried)
        d["v"] = 1
        return json.dumps(d, sort_keys=True, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str | bytes) -> ResumeState:
        """The state in ``text``; its size, nesting, fields and their ranges are checked before any is used
        (:mod:`warpdata.partition.states`; what it consumed is checked against the plan by
        :meth:`ShardPlan.resume`)."""
        where = "ResumeState.from_json"
        return cls.from_dict(load_json(text, where), where)

    @classmethod
    def from_dict(cls, d: Any, where: str = "ResumeState.from_dict") -> ResumeState:
        """The state of a parsed :meth:`to_json` document, its fields and their ranges checked."""
        if not isinstance(d, dict):
            raise bad(where, "state", d, "a JSON object (ResumeState.to_json()) is expected")
        d = dict(d)
        if d.pop("v", None) != 1:
            raise bad(where, "v", None, "1 (the resume-state version this warp writes) is expected")
        unknown = sorted(set(d) - set(_FIELDS))
        missing = [k for k in _REQUIRED if k not in d]
        if unknown or missing:
            k = (unknown or missing)[0]
            raise bad(where, k, d.get(k), "a field of ResumeState.to_json() is expected" if unknown else
                      "every field ResumeState.to_json() writes is expected")
        d = {**{f.name: f.default for f in fields(ResumeState) if f.name not in _REQUIRED}, **d}
        check_table_state(where, d)
        d["consumed"] = tuple((a, b) for a, b in d["consumed"])
        d["done_rows"] = tuple((a, b) for a, b in d["done_rows"])
        d["carried"] = tuple(d["carried"] or ())
        return cls(**d)

    def next_epoch(self) -> ResumeState:
        fresh = {k: getattr(self, k) for k in _FIELDS if k not in _TALLY_FIELDS}  # no digest computed
        return ResumeState(**{**fresh, "epoch": self.epoch + 1, "consumed": (), "done_rows": ()})


_FIELDS = tuple(f.name for f in fields(ResumeState))
_REQUIRED = ("manifest", "table", "seed", "epoch", "rank", "world", "batch_size", "policy")
_TALLY_FIELDS = ("order_digest", "consumed_digest", "consumed_samples", "pad_digest", "pad_samples",
                 "dropped_digest", "dropped_samples", "carried")


def _resume_state(values: dict[str, Any]) -> ResumeState:
    return ResumeState(**values)


def _tally_field(name: str) -> property:
    def get(self: PendingState) -> Any:
        d = self.__dict__
        if name not in d:
            self._fill()
        return d[name]

    def put(self: PendingState, value: Any) -> None:  # the dataclass __init__ (dataclasses.replace) sets it
        self.__dict__[name] = value

    return property(get, put, doc=f"``{name}``, computed when the state is first read or serialised")


class PendingState(ResumeState):
    """A :class:`ResumeState` whose digests are computed when first read (an attribute, :meth:`values`,
    :meth:`to_json`, ``==``, ``hash``, ``repr``, pickling or a copy), not when it is saved.

    :meth:`ShardPlan.state_after` returns one: a loop that saves a state every step pays for
    the digests of the states it keeps, not of every state it drops (docs/partitioning.md,
    "Digests"). Reading one gives the fields an eager state has, byte for byte; a copy or an
    unpickled one is a plain :class:`ResumeState`.
    """

    @classmethod
    def pending(cls, plan: ShardPlan, n_yielded: int, num_workers: int, **values: Any) -> PendingState:
        self = object.__new__(cls)  # the dataclass __init__ would set every field, digests included
        self.__dict__.update(values)
        self.__dict__["_pending"] = (plan, n_yielded, num_workers)
        return self

    def _fill(self) -> None:
        d = self.__dict__
        pending = d.get("_pending")
        if pending is None:  # filled by another thread between the check and here
            return
        plan, n, workers = pending
        d.update(plan.digest_fields(self.consumed, self.content, after=(n, workers)))
        # every digest field first, then the plan is let go: a reader never sees half
        d.pop("_pending", None)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, ResumeState):
            return self.values() == other.values()
        return NotImplemented

    def __hash__(self) -> int:
        return hash(_resume_state(self.values()))

    def __repr__(self) -> str:
        return repr(_resume_state(self.values()))

    def __reduce__(self) -> tuple:  # unpickled as the plain state it reads as: the one class to allow-list
        return ResumeState, tuple(getattr(self, k) for k in _FIELDS)


for _name in _TALLY_FIELDS:
    setattr(PendingState, _name, _tally_field(_name))


@dataclass
class ShardPlan:
    """Which rows of which units each (rank, worker) reads, batch by batch."""

    unit_rows: Sequence[int]
    rank: int = 0
    world: int = 1
    batch_size: int = 1024
    policy: str = "exact"
    seed: int = 0
    epoch: int = 0
    shuffle: bool = False
    consumed: tuple[tuple[int, int], ...] = ()
    done_rows: tuple[tuple[int, int], ...] = ()
    carried: tuple = ()  # what earlier runs at another world size consumed (rank 0 only; digest.Tally)
    order: list[int] = field(init=False)
    total_rows: int = field(init=False)
    rows_per_rank: int = field(init=False)
    num_batches: int = field(init=False)

    def __post_init__(self) -> None:
        if self.world < 1:
            raise ShardingError(f"world_size must be at least 1, not {self.world}",
                                hint="pass rank= and world_size=, e.g. rank=0, world_size=8 for the first of 8 ranks")
        if not 0 <= self.rank < self.world:
            raise ShardingError(f"rank {self.rank} is not in 0..{self.world - 1} (world_size {self.world})",
                                hint="pass rank= and world_size= with 0 <= rank < world_size")
        if self.batch_size < 1:
            raise ShardingError(f"batch_size must be >= 1, not {self.batch_size}")
        if self.policy not in POLICIES:
            raise ShardingError(f"unknown uneven-split policy {self.policy!r}",
                                hint="use drop_last= / pad= (policies 'exact', 'pad', 'drop')")
        if any(r < 0 for r in self.unit_rows):
            raise ShardingError("a unit has a negative row count")
        self.order = list(range(len(self.unit_rows)))
        if self.shuffle:
            random.Random(self.seed * 1_000_003 + self.epoch).shuffle(self.order)
        self._cum = [0]
        for u in self.order:
            self._cum.append(self._cum[-1] + int(self.unit_rows[u]))
        n = self.total_rows = self._cum[-1]
        if n == 0:
            raise ShardingError("the table has no rows to shard")
        self.done_rows = merge_intervals(self.done_rows)
        self._rem = Remainder(n, self.done_rows)
        if self.policy == "drop" and not self.done_rows:
            check_drop_leaves_batches(n, self.world, self.batch_size, "rows")
        self._base, self.rows_per_rank = rank_span(self._rem.size, self.rank, self.world, self.policy,
                                                   self.batch_size)
        self.num_batches = -(-self.rows_per_rank // self.batch_size)
        self.consumed = merge_intervals(self.consumed)

    # -- facts --------------------------------------------------------------
    @property
    def rows_left(self) -> int:
        """Rows of the sequence this run splits (all of them unless resumed at another world size)."""
        return self._rem.size

    @property
    def pad_rows(self) -> int:
        """Rows repeated across all ranks this epoch (``pad`` only)."""
        return max(0, self.rows_per_rank * self.world - self._rem.size) if self.policy == "pad" else 0

    @property
    def dropped_rows(self) -> int:
        """Rows no rank reads this epoch (``drop`` only)."""
        return max(0, self._rem.size - self.rows_per_rank * self.world) if self.policy == "drop" else 0

    def batch_len(self, j: int) -> int:
        return min(self.batch_size, self.rows_per_rank - j * self.batch_size)

    # -- rows -----------------------------------------------------------------
    def _global_slices(self, lo: int, hi: int, out: list[Slice]) -> None:
        """Append slices covering sequence positions [lo, hi) (lo, hi <= total_rows)."""
        while lo < hi:
            k = bisect.bisect_right(self._cum, lo) - 1
            u_start = self._cum[k]
            take = min(hi - lo, self._cum[k + 1] - lo)
            unit = self.order[k]
            if out and out[-1].unit == unit and out[-1].stop == lo - u_start:
                out[-1] = Slice(unit, out[-1].start, out[-1].stop + take)
            else:
                out.append(Slice(unit, lo - u_start, lo - u_start + take))
            lo += take

    def _positions(self, j: int) -> list[tuple[int, int]]:
        lo = self._base + j * self.batch_size
        return self._rem.ranges(lo, lo + self.batch_len(j))

    def batch_slices(self, j: int) -> list[Slice]:
        if not 0 <= j < self.num_batches:
            raise IndexError(j)
        out: list[Slice] = []
        for a, b in self._positions(j):
            self._global_slices(a, b, out)
        return out

    def rows_read(self, batches: Iterable[int]) -> tuple[tuple[int, int], ...]:
        """Sequence positions (merged intervals) that batches ``batches`` of this rank read."""
        return merge_intervals(iv for j in batches for iv in self._positions(j))

    def _items(self, batches: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
        """Items of the remainder (pad repeats past its size) that batch intervals ``batches`` read."""
        bs, base, r = self.batch_size, self._base, self.rows_per_rank
        return [(base + a * bs, base + min(b * bs, r)) for a, b in batches if a < b and a * bs < r]

    # -- digests (docs/partitioning.md) -----------------------------------------
    def row_indices(self, positions):
        """Row indices (manifest order of units) of sequence positions ``positions`` (an int64 array)."""
        import numpy as np

        if getattr(self, "_np", None) is None:
            rows = np.asarray(self.unit_rows, np.int64)
            offsets = np.concatenate([[0], np.cumsum(rows)]).astype(np.int64)
            order = np.asarray(self.order, np.int64)
            self._np = (np.asarray(self._cum, np.int64), offsets[order] if len(order) else order)
        cum, first = self._np
        k = np.searchsorted(cum, positions, side="right") - 1
        return first[k] + positions - cum[k]

    def runs(self) -> list[tuple[int, int]]:
        """The epoch's order as runs ``(first row, rows)``, one per unit."""
        offsets = [0]
        for n in self.unit_rows:
            offsets.append(offsets[-1] + int(n))
        return [(offsets[u], int(self.unit_rows[u])) for u in self.order]

    def order_digest(self, content: str) -> str:
        cached = getattr(self, "_order_digest", None)
        if cached is None or cached[0] != content:
            self._order_digest = (content, order_digest(content, self.policy, self.seed, self.epoch,
                                                        merge_runs(self.runs())))
        return self._order_digest[1]

    def tally(self, consumed: Iterable[tuple[int, int]], content: str, after: tuple[int, int] | None = None) -> Tally:
        """The digests (:class:`~warpdata.partition.digest.Tally`) of batch intervals ``consumed``
        (``after``: see :meth:`digest_fields`)."""
        d = self.digest_fields(tuple(consumed), content, after)
        return Tally.of({**d, "content": content, "carried": list(d["carried"])})

    def _ledger_of(self, content: str) -> Ledger:
        ledger = getattr(self, "_ledger", None)
        if ledger is None or ledger.keys.content != content:
            keys = sample_keys(content)
            runs = self.runs()
            prefix = RunPrefix(keys, [a for a, _ in runs], [n for _, n in runs])
            ledger = self._ledger = Ledger(keys, self._rem, self.row_indices, prefix)
            ledger.carried = _carried(self.carried)
            self._run = None
            self._fields_template = {"order_digest": self.order_digest(content), "consumed_digest": "",
                                     "consumed_samples": 0, "pad_digest": "", "pad_samples": 0,
                                     "dropped_digest": "", "dropped_samples": 0, "carried": ()}
        return ledger

    def digest_fields(self, consumed: tuple[tuple[int, int], ...], content: str,
                      after: tuple[int, int] | None = None) -> dict[str, Any]:
        """Every digest field of a :class:`ResumeState` (its defaults where empty) whose rank consumed batch
        intervals ``consumed``.

        ``after=(n, num_workers)`` says ``consumed`` is this plan's ``consumed`` plus the first ``n``
        batches of :meth:`yield_order` (what :meth:`state_after` passes): the digest is then read from
        running lanes that the states read in turn advance batch by batch (:meth:`_running`): O(1) a state
        read every step."""
        ledger = self._ledger_of(content)
        own = self._running(ledger, consumed, *after) if after is not None else None
        if own is None:
            c, n, p, q = ledger.tally(self._items(consumed))
            a, b, pa, pb = c.a, c.b, p.a, p.b
        else:
            (a, b, n), pa, pb, q = own, 0, 0, 0
        carried = ledger.carried
        drops = self.policy == "drop" and self.rank == 0
        if carried is None and not q and not drops:  # a state's usual fields: two of them change
            got = self._fields_template.copy()
            got["consumed_digest"], got["consumed_samples"] = f"{a:016x}{b:016x}", n
            return got
        if carried is not None:
            cd, cn, cp, cq = carried
            a, b, n, pa, pb, q = (a + cd.a) % P, (b + cd.b) % P, n + cn, (pa + cp.a) % P, (pb + cp.b) % P, q + cq
        dd, dn = ledger.dropped(self.rows_per_rank * self.world) if drops else (None, 0)
        return {"order_digest": self.order_digest(content), "consumed_digest": f"{a:016x}{b:016x}",
                "consumed_samples": n, "pad_digest": f"{pa:016x}{pb:016x}" if q else "", "pad_samples": q,
                "dropped_digest": dd.hex() if dn else "", "dropped_samples": dn,
                "carried": (cd.hex(), cn, cp.hex(), cq) if carried is not None and (cn or cq) else ()}

    def _running(self, ledger: Ledger, consumed: tuple[tuple[int, int], ...], n: int,
                 num_workers: int) -> tuple[int, int, int] | None:
        """``(a, b, rows)``: the own lanes of ``consumed``, this plan's ``consumed`` plus the first ``n`` batches
        of the yield order; None where this path does not apply (an epoch resumed at another world size,
        or pad repeats in this rank's run: by intervals).

        The lanes are kept as integers and advanced a batch at a time from the last state read: by the
        batch's lanes, made for every batch at once (:meth:`_batch_lanes`) when the rank has at most
        ``BATCH_LISTS`` batches; else in closed form: a full batch inside one run of rows (a row group)
        is ``g^s · (g^bs - 1) / (g - 1)`` for its first row ``s``, and the next batch of its worker starts
        at ``g^s · g^bs``, a few multiplications a batch (docs/partitioning.md, "Digest"). A jump of more
        than ``ADVANCE`` batches, or back, starts again from the intervals (O(workers) closed forms)."""
        if self.done_rows or self._base + self.rows_per_rank > self._rem.size:
            return None
        run = self._run
        if run is None or run[0] != num_workers or not run[1] <= n <= run[1] + ADVANCE:
            c, k, _p, _q = ledger.tally(self._items(consumed))
            order = run[5] if run is not None and run[0] == num_workers else None  # made when first advanced
            self._run = [num_workers, n, c.a, c.b, k, order, {}]
            return c.a, c.b, k
        _, m, a, b, k, order, nxt = run
        if n > m:
            if order is None:
                order = run[5] = self.yield_order(num_workers)
            if self.num_batches <= BATCH_LISTS:  # every batch's lanes made once, in numpy: a lookup a batch
                da, db, dk = self._batch_lanes(ledger)
                for j in order[m:n]:
                    a, b, k = a + da[j], b + db[j], k + dk[j]
                a, b = a % P, b % P
                run[1:5] = n, a, b, k
                return a, b, k
            prefix, keys = ledger.runs, ledger.keys
            cum, starts = prefix.cum, prefix.starts
            bs, base, rows = self.batch_size, self._base, self.rows_per_rank
            (ca, step_a), (cb, step_b) = self._batch_series(keys)
            for j in order[m:n]:
                lo = base + j * bs
                hi = lo + bs
                got = nxt.pop(j, None)  # (g^s of its first row, the end of its run): left by its worker's last batch
                if got is None:
                    u = bisect.bisect_right(cum, lo) - 1
                    s, end = starts[u] + lo - cum[u], cum[u + 1]
                    got = (keys.power(0, s), keys.power(1, s), end)
                fa, fb, end = got
                if hi <= end and j * bs + bs <= rows:  # a full batch inside one run: closed form
                    a += fa * ca  # reduced once, after the loop
                    b += fb * cb
                    k += bs
                    if hi < end:  # its worker's next batch starts in this run: g^(s + bs)
                        nxt[j + 1] = (fa * step_a % P, fb * step_b % P, end)
                else:
                    hi = base + min(j * bs + bs, rows)
                    (a1, b1), (a0, b0) = prefix.at(hi), prefix.at(lo)
                    a, b, k = a + a1 - a0, b + b1 - b0, k + hi - lo
            a, b = a % P, b % P
            run[1:5] = n, a, b, k
        return a, b, k

    def _batch_lanes(self, ledger: Ledger) -> tuple[list[int], list[int], list[int]]:
        """Each batch's lanes and rows, indexed by batch number (this rank's run, nothing taken out):
        the order's prefix digests at the batch boundaries (:meth:`RunPrefix.at_array`), differenced."""
        got = getattr(self, "_lanes_of_batches", None)
        if got is None or got[0] is not ledger:
            import numpy as np

            bounds = self._base + np.minimum(np.arange(self.num_batches + 1, dtype=np.int64) * self.batch_size,
                                             self.rows_per_rank)
            lanes = []
            for x in ledger.runs.at_array(bounds):
                d = x[1:] + (np.uint64(P) - x[:-1])  # (at(hi) - at(lo)) mod P, below 2P
                lanes.append(np.where(d >= P, d - np.uint64(P), d).tolist())
            got = self._lanes_of_batches = (ledger, lanes[0], lanes[1], np.diff(bounds).tolist())
        return got[1], got[2], got[3]

    def _batch_series(self, keys) -> tuple[tuple[int, int], tuple[int, int]]:
        """Per lane ``((g^bs - 1) / (g - 1), g^bs)``: a full batch's digest from its first row's term, and
        the next batch's first term."""
        got = getattr(self, "_series", None)
        if got is None or got[0] is not keys:
            bs = self.batch_size
            lanes = [((keys.power(x, bs) - 1) * keys._inv[x] % P, keys.power(x, bs)) for x in (0, 1)]
            got = self._series = (keys, lanes[0], lanes[1])
        return got[1], got[2]

    # -- workers ----------------------------------------------------------------
    def remaining(self) -> list[int]:
        out: list[int] = []
        j = 0
        for a, b in self.consumed:  # merged and sorted
            out.extend(range(j, min(a, self.num_batches)))
            j = max(j, b)
        out.extend(range(j, self.num_batches))
        return out

    def worker_batches(self, worker: int = 0, num_workers: int = 1) -> list[int]:
        """Batch indices worker ``worker`` of ``num_workers`` yields, in order."""
        num_workers = max(1, num_workers)
        if not 0 <= worker < num_workers:
            raise ShardingError(f"worker {worker} is not in 0..{num_workers - 1}")
        rem = self.remaining()
        m = len(rem)
        if m == 0:  # an exact split of fewer rows than ranks, or a resumed rank with nothing left
            return []
        # checked for every worker, not just the empty ones, so the mistake surfaces
        # in the first worker to start rather than as a silent idle worker
        if m < num_workers:
            raise ShardingError(
                f"DataLoader worker {worker} of {num_workers} on rank {self.rank} would get no batches: "
                f"the rank has {m} batch(es) left ({self.rows_per_rank} rows, batch_size {self.batch_size})",
                hint=f"use at most {max(1, m)} DataLoader worker(s) or a smaller batch_size",
                rank=self.rank, worker=worker, num_workers=num_workers, batches_left=m)
        return rem[worker * m // num_workers:(worker + 1) * m // num_workers]

    def yield_order(self, num_workers: int = 1) -> list[int]:
        """The order a PyTorch DataLoader (in_order=True) yields the workers' batches."""
        num_workers = max(1, num_workers)
        per = [self.worker_batches(w, num_workers) for w in range(num_workers)]
        out = []
        for k in range(max(len(p) for p in per)):
            for p in per:
                if k < len(p):
                    out.append(p[k])
        return out

    def state_after(self, n_yielded: int, num_workers: int = 1, *, manifest: str = "",
                    table: str = "") -> ResumeState:
        """Resume state once the first ``n_yielded`` batches of this run were consumed."""
        workers = max(1, num_workers)
        consumed = self._consumed_after(n_yielded, workers)
        # the digests wait until the state is read: a state saved every step and dropped costs no tally
        return PendingState.pending(self, n_yielded, workers, manifest=manifest, table=table, seed=self.seed,
                                    epoch=self.epoch, rank=self.rank, world=self.world,
                                    batch_size=self.batch_size, policy=self.policy, shuffle=self.shuffle,
                                    consumed=consumed, num_batches=self.num_batches, done_rows=self.done_rows,
                                    content=content_of_table(manifest, table))

    def _consumed_after(self, n_yielded: int, num_workers: int) -> tuple[tuple[int, int], ...]:
        """``consumed`` plus the first ``n_yielded`` batches of :meth:`yield_order`, merged: grown batch
        by batch from the last call (a state saved every step costs O(intervals), not O(batches))."""
        memo = getattr(self, "_after", None)
        if memo is None or memo[0] != num_workers or memo[1] > n_yielded:
            memo = self._after = [num_workers, 0, self.yield_order(num_workers), [list(x) for x in self.consumed]]
        _, done, order, ivs = memo
        for j in order[done:n_yielded]:
            k = bisect.bisect_right(ivs, [j, float("inf")]) - 1  # the interval starting at or before j
            if k >= 0 and ivs[k][1] > j:
                continue
            if k >= 0 and ivs[k][1] == j:
                ivs[k][1] = j + 1
                if k + 1 < len(ivs) and ivs[k + 1][0] == j + 1:
                    ivs[k][1] = ivs[k + 1][1]
                    del ivs[k + 1]
            elif k + 1 < len(ivs) and ivs[k + 1][0] == j + 1:
                ivs[k + 1][0] = j
            else:
                ivs.insert(k + 1, [j, j + 1])
        memo[1] = max(done, min(n_yielded, len(order)))
        return tuple((a, b) for a, b in ivs)

    @classmethod
    def resume(cls, unit_rows: Sequence[int], state: ResumeState, *, manifest: str = "",
               table: str = "", rank: int | None = None, world: int | None = None) -> ShardPlan:
        """The plan for the rest of ``state``'s epoch; refuses a state of another run.

        A merged state (:meth:`merge_states`, ``state.elastic``) resumes at any
        ``rank`` / ``world`` (both required); a rank's own state only at its own.
        """
        values = _checked(state, unit_rows)
        checks = (("manifest", manifest), ("table", table))
        if not state.elastic:
            checks += (("rank", rank), ("world", world))
        mismatch = [(k, getattr(state, k), v) for k, v in checks
                    if v not in (None, "") and getattr(state, k) not in ("", v)]
        if mismatch:
            k, old, new = mismatch[0]
            hint = ("resume with the same dataset version and table" if k in ("manifest", "table") else
                    "to resume at another rank or world size, pass the states of every rank of the old run "
                    "(a list); one rank's state resumes only that rank")
            error = ResumeMismatchError if k in ("manifest", "table") else ShardingError
            raise error(f"resume state is for {k}={old!r}, this run has {k}={new!r}", hint=hint)
        if state.elastic:
            if rank is None or world is None:
                raise ShardingError("a merged resume state needs this run's rank and world_size",
                                    hint="pass rank= and world_size= (or run under torchrun)")
            plan = cls(unit_rows, rank=rank, world=world, batch_size=state.batch_size, policy=state.policy,
                       seed=state.seed, epoch=state.epoch, shuffle=state.shuffle, done_rows=state.done_rows,
                       carried=state.carried if rank == 0 else ())
            plan._verify(values, elastic=True)
            return plan
        plan = cls(unit_rows, rank=state.rank, world=state.world, batch_size=state.batch_size,
                   policy=state.policy, seed=state.seed, epoch=state.epoch, shuffle=state.shuffle,
                   consumed=state.consumed, done_rows=state.done_rows, carried=state.carried)
        if state.num_batches and state.num_batches != plan.num_batches:
            raise ShardingError(f"resume state counts {state.num_batches} batches, the table now gives "
                                f"{plan.num_batches}", hint="resume against the same dataset version")
        plan._verify(values, elastic=False)
        return plan

    def _verify(self, values: dict[str, Any], *, elastic: bool) -> None:
        """The state's consumed set, counts and digests agree with one another and with this plan
        (docs/partitioning.md, "Resume"): its digest fields are recomputed from its ``consumed`` batch
        intervals by the closed form over this plan's runs (O(intervals · log n)) and compared, field by
        field; what rank 0 (or a merged state) carries is recomputed from ``done_rows``."""
        where = "resume"
        content = values["content"]
        if not values["consumed_digest"] and not values["order_digest"]:  # next_epoch(): nothing consumed
            for k in ("consumed", "done_rows", "carried", "consumed_samples", "pad_samples", "dropped_samples"):
                if values[k]:
                    raise bad(where, "consumed_digest", "", f"a state with {k} carries the digests of what it "
                                                            "consumed")
            return
        want_content = content_of_table(values["manifest"], values["table"])
        if content != want_content:
            raise bad(where, "content", content, f"the content of its manifest and table ({want_content[:40]}) "
                                                 "is expected")
        if elastic:
            compare(where, values, {**values, "order_digest": self.order_digest(content)}, "fields")
        else:
            compare(where, values, self.digest_fields(self.consumed, content), "consumed batch intervals")
        runs = self._ledger_of(content).runs

        def done_digest() -> str:
            got = Digest()
            for a, b in self.done_rows:
                got += runs.digest(a, b)
            return got.hex()

        check_carried(where, values["carried"], elastic or self.rank == 0, self.done_rows, done_digest)

    @classmethod
    def merge_states(cls, unit_rows: Sequence[int], states: Sequence[ResumeState], *, manifest: str = "",
                     table: str = "") -> ResumeState:
        """One state from the states of every rank of a run, resumable at any world size.

        Its ``done_rows`` are every sequence position any rank read (before or
        during that run); its ``world`` is 0 (:attr:`ResumeState.elastic`).
        """
        states = list(states)
        if not states:
            raise ShardingError("no resume states to merge", hint="pass the state_dict() of every rank")
        first = states[0]
        for s in states[1:]:
            for k in ("manifest", "table", "seed", "epoch", "batch_size", "policy", "shuffle"):
                if getattr(s, k) != getattr(first, k):
                    raise ShardingError(f"resume states differ in {k} ({getattr(first, k)!r} vs {getattr(s, k)!r})",
                                        hint="pass the states saved by the ranks of one run, at one step")
        elastic = [s for s in states if s.elastic]
        if elastic and len(states) > 1:
            raise ShardingError("a merged resume state cannot be merged again with other states",
                                hint="pass it alone")
        if elastic:
            return first
        check_all_ranks("resume", [(s.rank, s.world) for s in states])
        check_same_epoch("resume", [s for s in states if s.consumed_digest])
        done: list[tuple[int, int]] = []
        for s in states:
            plan = cls.resume(unit_rows, s, manifest=manifest, table=table)
            done.extend(plan.done_rows)
            # a pad repeat (an item past the order's end) does not consume the sample it repeats
            m = plan.rows_left
            for lo, hi in plan._items(plan.consumed):
                done.extend(plan._rem.ranges(lo, min(hi, m)))
        carried = carry(states)  # a state without digests (next_epoch()) consumed nothing: it adds nothing
        with_digests = next((s for s in states if s.consumed_digest), first)
        return ResumeState(manifest=first.manifest, table=first.table, seed=first.seed, epoch=first.epoch,
                           rank=0, world=0, batch_size=first.batch_size, policy=first.policy,
                           shuffle=first.shuffle, consumed=(), num_batches=0, done_rows=merge_intervals(done),
                           content=with_digests.content, order_digest=with_digests.order_digest,
                           carried=(carried[0].hex(), carried[1], carried[2].hex(), carried[3]))


ADVANCE = 64  # a state read at most this many batches after the last one advances its lanes batch by batch
BATCH_LISTS = 1 << 16  # a rank of at most this many batches keeps every batch's lanes (else: closed forms)


def _checked(state: ResumeState, unit_rows: Sequence[int]) -> dict[str, Any]:
    """A state's values, their types and ranges checked (and ``done_rows`` within the table) before a plan
    is made of them."""
    if not isinstance(state, ResumeState):
        raise ResumeStateError(f"{type(state).__name__} is not a warp resume state",
                               hint="pass a ResumeState (state_dict()) or its JSON", field="state")
    values = state.values()
    check_table_state("resume", values)
    check_done("resume", values["done_rows"], sum(int(r) for r in unit_rows))
    return values


def content_of_table(manifest: str, table: str) -> str:
    """A table's content name in its sample keys: the dataset version (manifest hash) and table name."""
    return f"{manifest}/{table}"


def _carried(carried: tuple):
    if not carried:
        return None
    c, n, p, q = carried
    return Digest.from_hex(c), int(n), Digest.from_hex(p), int(q)


def auto_shard(environ: Mapping[str, str] | None = None) -> tuple[int, int]:
    """(rank, world) from torchrun's RANK / WORLD_SIZE; (0, 1) when they are unset.

    Loaders resolve their world with :func:`warpdata.partition.world.resolve_world`
    (explicit values, torch.distributed, then these variables).
    """
    rank, world = _from_env(environ) or (0, 1)
    if world < 1 or not 0 <= rank < world:
        raise ShardingError(f"RANK={rank} is not in 0..{world - 1} (WORLD_SIZE={world})")
    return rank, world
