"""Deterministic sharding of a table over ranks × DataLoader workers, with resume.

Contract
--------
Input: the row counts of a table's *units* (Parquet row groups, in manifest
order), ``rank``/``world``, ``batch_size``, a ``policy`` and ``seed``/``epoch``.

* The units are put in one order (manifest order, or a permutation seeded by
  ``(seed, epoch)`` when ``shuffle``), giving a global row sequence of N rows.
  Every rank takes a contiguous range of R rows of it, so reads stay
  row-group sequential and a rank touches at most two partial row groups.
* ``policy="pad"``: R = ⌈N/world⌉; the last ranks' missing rows repeat the
  sequence from its start (like ``DistributedSampler``). ``policy="drop"``:
  R = ⌊N/world⌋ and the last N − R·world rows are skipped this epoch.
  Either way every rank has exactly R rows and ⌈R/batch_size⌉ batches, so DDP
  never waits on a rank that ran out; every row is read exactly once except
  the documented pad repeats (``pad_rows``) or drops (``dropped_rows``).
* ``policy="exact"``: rank r takes positions ⌊r·N/world⌋ .. ⌊(r+1)·N/world⌋,
  so every row is read exactly once, nothing repeats and nothing is dropped;
  ranks may differ by one row (and one batch), and a rank can get no rows when
  N < world. It is what ``warp stream --shard`` does unless ``--pad``; DDP
  training wants ``pad`` or ``drop``, which keep the batch counts equal.
* Batch ``j`` of a rank is its rows ``[j·bs, min((j+1)·bs, R))``. The batches
  not yet consumed are split into contiguous runs, one per DataLoader worker;
  fewer batches left than workers (some worker would get none) is a
  :class:`ShardingError` (fewer workers or a smaller batch size fixes it). A PyTorch DataLoader yields them round-robin
  across workers (:meth:`ShardPlan.yield_order`).
* :class:`ResumeState` is a tiny JSON document (manifest hash, table, seed,
  epoch, rank, world, batch size, policy, and ``consumed``: half-open intervals
  of batch indices already yielded). Resuming skips exactly those batches and
  may use a different worker count; resuming a resumed run works the same.

Pure Python and the standard library: it is imported in every worker.
"""

from __future__ import annotations

import bisect
import json
import random
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from warpdata.core import envvars
from warpdata.core.errors import UsageError

POLICIES = ("pad", "drop", "exact")


class ShardingError(UsageError):
    code = "sharding"


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

    @property
    def done(self) -> bool:
        return sum(b - a for a, b in self.consumed) >= self.num_batches > 0

    def to_json(self) -> str:
        d = dict(self.__dict__)
        d["consumed"] = [list(x) for x in self.consumed]
        d["v"] = 1
        return json.dumps(d, sort_keys=True, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str | bytes) -> ResumeState:
        try:
            d = json.loads(text)
            if d.pop("v", None) != 1:
                raise ValueError("unknown resume-state version")
            d["consumed"] = tuple((int(a), int(b)) for a, b in d.get("consumed", []))
            return cls(**d)
        except (ValueError, TypeError, KeyError) as e:
            raise UsageError(f"not a warp resume state: {e}",
                             hint="pass the JSON produced by state_dict()/ResumeState.to_json()") from None

    def next_epoch(self) -> ResumeState:
        return ResumeState(**{**self.__dict__, "epoch": self.epoch + 1, "consumed": ()})


def merge_intervals(iv: Iterable[tuple[int, int]]) -> tuple[tuple[int, int], ...]:
    out: list[list[int]] = []
    for a, b in sorted(iv):
        if a >= b:
            continue
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return tuple((a, b) for a, b in out)


@dataclass
class ShardPlan:
    """Which rows of which units each (rank, worker) reads, batch by batch."""

    unit_rows: Sequence[int]
    rank: int = 0
    world: int = 1
    batch_size: int = 1024
    policy: str = "pad"
    seed: int = 0
    epoch: int = 0
    shuffle: bool = False
    consumed: tuple[tuple[int, int], ...] = ()
    order: list[int] = field(init=False)
    total_rows: int = field(init=False)
    rows_per_rank: int = field(init=False)
    num_batches: int = field(init=False)

    def __post_init__(self) -> None:
        if self.world < 1:
            raise ShardingError(f"world size must be at least 1, not {self.world}",
                                hint="pass shard=(rank, world_size), e.g. '0/8' for the first of 8 ranks")
        if not 0 <= self.rank < self.world:
            raise ShardingError(f"rank {self.rank} is not in 0..{self.world - 1} (world size {self.world})",
                                hint="pass shard=(rank, world_size) with 0 <= rank < world_size")
        if self.batch_size < 1:
            raise ShardingError(f"batch_size must be >= 1, not {self.batch_size}")
        if self.policy not in POLICIES:
            raise ShardingError(f"unknown uneven-split policy {self.policy!r}", hint="use 'pad', 'drop' or 'exact'")
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
        if self.policy == "exact":
            self._base = self.rank * n // self.world
            self.rows_per_rank = (self.rank + 1) * n // self.world - self._base
        else:
            self.rows_per_rank = -(-n // self.world) if self.policy == "pad" else n // self.world
            self._base = self.rank * self.rows_per_rank
        if self.rows_per_rank == 0 and self.policy != "exact":
            raise ShardingError(f"policy 'drop' leaves rank {self.rank} no rows: {n} rows over {self.world} ranks",
                                hint="use policy 'pad' or fewer ranks")
        self.num_batches = -(-self.rows_per_rank // self.batch_size)
        self.consumed = merge_intervals(self.consumed)

    # -- facts --------------------------------------------------------------
    @property
    def pad_rows(self) -> int:
        """Rows repeated across all ranks this epoch (``pad`` only)."""
        return max(0, self.rows_per_rank * self.world - self.total_rows) if self.policy == "pad" else 0

    @property
    def dropped_rows(self) -> int:
        """Rows no rank reads this epoch (``drop`` only)."""
        return max(0, self.total_rows - self.rows_per_rank * self.world) if self.policy == "drop" else 0

    def batch_len(self, j: int) -> int:
        return min(self.batch_size, self.rows_per_rank - j * self.batch_size)

    # -- rows -----------------------------------------------------------------
    def _global_slices(self, lo: int, hi: int) -> list[Slice]:
        """Slices covering global sequence positions [lo, hi) (wrapping past N for pad)."""
        n = self.total_rows
        out: list[Slice] = []
        while lo < hi:
            p = lo % n
            k = bisect.bisect_right(self._cum, p) - 1
            u_start = self._cum[k]
            take = min(hi - lo, self._cum[k + 1] - p)
            unit = self.order[k]
            if out and out[-1].unit == unit and out[-1].stop == p - u_start:
                out[-1] = Slice(unit, out[-1].start, out[-1].stop + take)
            else:
                out.append(Slice(unit, p - u_start, p - u_start + take))
            lo += take
        return out

    def batch_slices(self, j: int) -> list[Slice]:
        if not 0 <= j < self.num_batches:
            raise IndexError(j)
        base = self._base
        return self._global_slices(base + j * self.batch_size, base + j * self.batch_size + self.batch_len(j))

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
        done = self.yield_order(num_workers)[:n_yielded] if n_yielded else []
        consumed = merge_intervals(list(self.consumed) + [(j, j + 1) for j in done])
        return ResumeState(manifest=manifest, table=table, seed=self.seed, epoch=self.epoch, rank=self.rank,
                           world=self.world, batch_size=self.batch_size, policy=self.policy,
                           shuffle=self.shuffle, consumed=consumed, num_batches=self.num_batches)

    @classmethod
    def resume(cls, unit_rows: Sequence[int], state: ResumeState, *, manifest: str = "",
               table: str = "", rank: int | None = None, world: int | None = None) -> ShardPlan:
        """The plan for the rest of ``state``'s epoch; refuses a state of another run."""
        mismatch = [(k, getattr(state, k), v) for k, v in
                    (("manifest", manifest), ("table", table), ("rank", rank), ("world", world))
                    if v not in (None, "") and getattr(state, k) not in ("", v)]
        if mismatch:
            k, old, new = mismatch[0]
            raise ShardingError(f"resume state is for {k}={old!r}, this run has {k}={new!r}",
                                hint="resume with the same dataset version, table, rank and world size; "
                                     "only the DataLoader worker count may change")
        plan = cls(unit_rows, rank=state.rank, world=state.world, batch_size=state.batch_size,
                   policy=state.policy, seed=state.seed, epoch=state.epoch, shuffle=state.shuffle,
                   consumed=state.consumed)
        if state.num_batches and state.num_batches != plan.num_batches:
            raise ShardingError(f"resume state counts {state.num_batches} batches, the table now gives "
                                f"{plan.num_batches}", hint="resume against the same dataset version")
        return plan


def auto_shard(environ: Mapping[str, str] | None = None) -> tuple[int, int]:
    """(rank, world) from torchrun's RANK / WORLD_SIZE; (0, 1) when they are unset."""
    if environ is None:
        rank_s, world_s = envvars.get("RANK"), envvars.get("WORLD_SIZE")
    else:
        rank_s, world_s = environ.get("RANK"), environ.get("WORLD_SIZE")
    if rank_s in (None, "") or world_s in (None, ""):
        return 0, 1
    try:
        rank, world = int(rank_s), int(world_s)
    except ValueError:
        raise ShardingError(f"RANK={rank_s!r} / WORLD_SIZE={world_s!r} are not integers",
                            hint="torchrun sets them; unset them for single-process runs") from None
    if not 0 <= rank < world:
        raise ShardingError(f"RANK={rank} is not in 0..{world - 1} (WORLD_SIZE={world})")
    return rank, world
