"""One partitioning for every loader: an epoch's order of samples split over ranks.

Contract (docs/partitioning.md)
-------------------------------
An epoch puts the loader's N samples (rows, records, weighted repeats) in one
order that depends only on the data, ``seed`` and ``epoch`` — never on the
rank, the world size or the worker count. Rank ``r`` of ``W`` takes one
contiguous run of that order (:func:`rank_span`), cut into batches of
``batch_size``; the run's batches are then shared among DataLoader workers.

Three modes, chosen by ``drop_last`` and ``pad`` (:func:`mode_of`):

``exact`` (``drop_last=False, pad=False``, the library default)
    rank r takes positions ⌊r·N/W⌋ .. ⌊(r+1)·N/W⌋: every sample exactly once,
    nothing repeated, nothing dropped. Ranks differ by at most one sample,
    hence by at most one batch; a rank gets nothing when N < W.
``pad`` (``pad=True``)
    every rank takes ⌈N/W⌉ positions, rank r from r·⌈N/W⌉; positions past the
    end wrap to the start of the order, so up to W−1 samples are read twice.
    Every rank has the same number of samples and of batches.
``drop`` (``drop_last=True``)
    every rank takes ⌊N/(W·B)⌋·B positions (B = batch_size), rank r from
    r·⌊N/(W·B)⌋·B: only full batches, the same number on every rank. The last
    N − W·B·⌊N/(W·B)⌋ positions of the order (fewer than W·B) are read by no
    rank this epoch — the same tail for every rank.

``drop_last=True`` with ``pad=True`` asks for opposite things and is refused.

Resume across world sizes
-------------------------
A :class:`Remainder` is the order with the positions already consumed
(``done``, half-open intervals) taken out. A run resumed from the states of
*every* rank of the old world (:func:`check_all_ranks`) splits the remainder by
the same rules over the new world, so together with what was consumed before
every sample is read exactly once (``exact``) — whatever the old and new world
sizes and worker counts.

Pure Python and the standard library (numpy only inside :meth:`Remainder.array`).
"""

from __future__ import annotations

import bisect
from collections import Counter
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

from warpdata.partition.world import ShardingError

if TYPE_CHECKING:
    import numpy as np

MODES = ("exact", "pad", "drop")


def mode_of(drop_last: bool, pad: bool, where: str = "") -> str:
    """The split mode for ``drop_last`` / ``pad`` (see the module docstring)."""
    if drop_last and pad:
        raise ShardingError(f"{where + ': ' if where else ''}drop_last=True and pad=True ask for opposite things "
                            "(drop the uneven tail, or repeat samples to fill it)",
                            hint="pass one of them: pad=True repeats samples so every rank has as many; "
                                 "drop_last=True keeps only full batches")
    return "drop" if drop_last else "pad" if pad else "exact"


def rank_span(n: int, rank: int, world_size: int, mode: str, batch_size: int = 1) -> tuple[int, int]:
    """``(start, count)``: rank ``rank`` reads positions ``start .. start+count-1`` of an ``n``-long order.

    With ``pad`` positions at or past ``n`` stand for ``position mod n``.
    """
    if mode == "exact":
        start = rank * n // world_size
        return start, (rank + 1) * n // world_size - start
    if mode == "pad":
        count = -(-n // world_size)
    elif mode == "drop":
        count = n // (world_size * batch_size) * batch_size
    else:
        raise ShardingError(f"unknown split mode {mode!r}", hint=f"use one of {', '.join(MODES)}")
    return rank * count, count


def num_batches(count: int, batch_size: int) -> int:
    return -(-count // batch_size)


def check_drop_leaves_batches(n: int, world_size: int, batch_size: int, what: str = "samples") -> None:
    """A fresh epoch with ``drop_last=True`` that would give every rank nothing is a usage error."""
    if 0 < n < world_size * batch_size:
        raise ShardingError(
            f"drop_last=True leaves no batch: {n} {what} are fewer than world_size × batch_size = "
            f"{world_size} × {batch_size}",
            hint="use a smaller batch_size or fewer ranks, pad=True, or the default (every sample once)")


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


def subtract_intervals(a: Iterable[tuple[int, int]], b: Iterable[tuple[int, int]]) -> tuple[tuple[int, int], ...]:
    """The merged half-open intervals of ``a`` less those of ``b``."""
    out: list[tuple[int, int]] = []
    cut = merge_intervals(b)
    for lo, hi in merge_intervals(a):
        for c, d in cut:
            if d <= lo or c >= hi:
                continue
            if c > lo:
                out.append((lo, c))
            lo = max(lo, d)
            if lo >= hi:
                break
        if lo < hi:
            out.append((lo, hi))
    return tuple(out)


def intervals_of(positions: Iterable[int]) -> tuple[tuple[int, int], ...]:
    """Sorted positions (any order, repeats allowed) as merged half-open intervals."""
    return merge_intervals((p, p + 1) for p in positions)


def intervals_of_array(positions: np.ndarray) -> tuple[tuple[int, int], ...]:
    """:func:`intervals_of` for a numpy array, without a Python loop per position."""
    import numpy as np

    p = np.unique(np.asarray(positions, np.int64))
    if not len(p):
        return ()
    cut = np.flatnonzero(np.diff(p) != 1) + 1
    starts = np.concatenate([[0], cut])
    stops = np.concatenate([cut, [len(p)]])
    return tuple((int(p[a]), int(p[b - 1]) + 1) for a, b in zip(starts.tolist(), stops.tolist(), strict=True))


class Remainder:
    """The positions ``0 .. n-1`` of an epoch order that are not in ``done``, in order."""

    def __init__(self, n: int, done: Iterable[tuple[int, int]] = ()) -> None:
        self.n = int(n)
        self.done = merge_intervals((max(0, a), min(self.n, b)) for a, b in done)
        avail: list[tuple[int, int]] = []
        at = 0
        for a, b in self.done:
            if a > at:
                avail.append((at, a))
            at = b
        if at < self.n:
            avail.append((at, self.n))
        self.avail = avail
        self._cum = [0]
        for a, b in avail:
            self._cum.append(self._cum[-1] + b - a)
        self.size = self._cum[-1]

    def ranges(self, lo: int, hi: int) -> list[tuple[int, int]]:
        """Positions of the order for items ``lo .. hi-1`` of the remainder (items past ``size`` wrap)."""
        out: list[tuple[int, int]] = []
        m = self.size
        if m == 0:
            return out
        while lo < hi:
            q = lo % m
            k = bisect.bisect_right(self._cum, q) - 1
            a, b = self.avail[k]
            start = a + q - self._cum[k]
            take = min(hi - lo, b - start)
            if out and out[-1][1] == start:
                out[-1] = (out[-1][0], start + take)
            else:
                out.append((start, start + take))
            lo += take
        return out

    def positions(self, items: np.ndarray) -> np.ndarray:
        """:meth:`array` for any items (an int64 array; items past ``size`` wrap), vectorised."""
        import numpy as np

        items = np.asarray(items, np.int64)
        if self.size == 0:
            return np.zeros(0, np.int64)
        q = items % self.size if len(items) and int(items.max()) >= self.size else items
        if self.avail == [(0, self.n)]:  # nothing taken out: items are positions
            return q
        if getattr(self, "_arrays", None) is None:
            self._arrays = (np.asarray(self._cum, np.int64), np.asarray([a for a, _ in self.avail], np.int64))
        cum, starts = self._arrays
        k = np.searchsorted(cum, q, side="right") - 1
        return starts[k] + q - cum[k]

    def done_positions(self) -> np.ndarray:
        """The positions in ``done``, as an int64 array."""
        import numpy as np

        parts = [np.arange(a, b, dtype=np.int64) for a, b in self.done]
        return np.concatenate(parts) if parts else np.zeros(0, np.int64)

    def array(self, lo: int, hi: int) -> np.ndarray:
        """:meth:`ranges` as an int64 array of positions."""
        import numpy as np

        parts = [np.arange(a, b, dtype=np.int64) for a, b in self.ranges(lo, hi)]
        return np.concatenate(parts) if parts else np.zeros(0, np.int64)


def check_all_ranks(where: str, ranks_worlds: Sequence[tuple[int, int]]) -> int:
    """The old world size of a set of resume states, which must be one state per rank of one world."""
    worlds = sorted({w for _, w in ranks_worlds})
    if len(worlds) != 1:
        raise ShardingError(f"{where}: resume states come from different world sizes {worlds}",
                            hint="pass the states saved by every rank of one run")
    world = worlds[0]
    ranks = sorted(r for r, _ in ranks_worlds)
    if len(ranks) != world or ranks != list(range(world)):  # never a list of a claimed world's ranks
        given = set(ranks)
        missing = [r for r in range(min(world, len(ranks) + 10)) if r not in given][:10]
        more = world - len(given & set(range(world))) - len(missing)
        counts = Counter(ranks)
        extra = sorted(r for r in counts if counts[r] > 1 or not 0 <= r < world)
        shown = ", ".join(map(str, missing)) + (f" and {more:,} more" if more > 0 else "")
        raise ShardingError(
            f"{where}: to resume at another world size pass the states of all {world:,} ranks of the old run; "
            f"got ranks {_few(ranks)}" + (f" (missing [{shown}])" if missing else "")
            + (f" (repeated or out of range {_few(extra)})" if extra else ""),
            hint="gather every rank's state_dict() (e.g. torch.distributed.all_gather_object) and pass the list")
    return world


def _few(xs: list[int]) -> str:
    return str(xs) if len(xs) <= 20 else f"[{', '.join(map(str, xs[:20]))}, ... {len(xs):,} in all]"
