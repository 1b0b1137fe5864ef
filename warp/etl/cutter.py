"""Shards cut where the items' keys say, so an edit moves no later shard (docs/formats/twh1.md,
"Layout across versions").

Counting cuts (every ``cap`` items, :func:`warpdata.etl.cut`) move the first item of every later
shard into the shard before when one item is removed from (or inserted into) the middle, so every
later shard changes its bytes. :class:`KeyCutter` ends a shard after an item whose key hash is the
smallest within ``cap // 3`` items on either side, or at ``cap``: where a shard ends depends on the
keys around that point only.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")

# the rule, as version recipes name it (a build cut another way is another version)
RULE = "key-sha256 strict local minimum over +-cap/3 keys, none within cap/3 of either end, at most cap; fixed below 8"

# the window past either end of the items: below every key hash, so no cut falls within w of the
# first or the last item (no one-sample shard at either end)
_PAD = 0


def key_hash(key: str) -> int:
    """63 bits of the SHA-256 of a key: what :class:`KeyCutter` compares."""
    return int.from_bytes(hashlib.sha256(key.encode("utf-8", "surrogatepass")).digest()[:8], "little") >> 1


class KeyCutter(Generic[T]):
    """Cuts items, pushed in their canonical order, into the runs that become shards.

    ``fixed`` (``[output] shard_samples`` set, or a cap under 8): every ``per_shard`` samples, as
    asked. Otherwise the cut is content-defined over the sample keys (docs/formats/twh1.md, "Layout
    across versions"): a shard ends after a sample whose key hash (:func:`key_hash`) is smaller
    than every other within ``w = per_shard // 3`` samples on either side, and at ``per_shard``
    samples at the latest (the capacity the memory check sized). Where a shard ends depends on
    the keys around that point only, never on how many samples came before, so a sample removed
    from (or inserted into) the middle changes the shard it is in (and, rarely, a neighbour), and
    every later shard keeps its samples and its bytes. Shards hold about ``2w + 1`` ≈ 0.67 ×
    ``per_shard`` samples; two cuts are at least ``w + 1`` samples apart unless the cap cut.

    The window past either end counts as lower than any key, so no cut falls within ``w`` of the
    first or the last sample: neither end makes a shard of a sample or two. A decision needs the
    ``w`` keys after a sample, so runs come out a little behind the pushes; :meth:`finish` decides
    the rest. :func:`plan` and the overlapped pass (warp/warehouse/overlap.py) push the same
    samples in the same order, hence cut the same runs."""

    def __init__(self, per_shard: int, fixed: bool, key: Callable[[T], str]) -> None:
        self.key = key
        self.per = max(1, per_shard)
        self.w = 0 if fixed or per_shard < 8 else per_shard // 3
        self.batch = max(32, self.per // 4)  # decisions are made this many at a time (numpy)
        self.hashes: list[int] = []
        self.pending: list[T] = []  # from the start of the current run to the newest push
        self.decided = 0  # samples whose cut is decided
        self.run = 0  # samples of the current run decided so far

    def push(self, item: T) -> list[list[T]]:
        """Add the next item; returns the runs this completes (often none)."""
        self.pending.append(item)
        if not self.w:
            if len(self.pending) >= self.per:
                out, self.pending = [self.pending], []
                return out
            return []
        self.hashes.append(key_hash(self.key(item)))
        if len(self.hashes) - self.decided >= self.w + self.batch:
            return self._decide(len(self.hashes) - self.w)
        return []

    def finish(self) -> list[list[T]]:
        """The runs left once every sample is pushed."""
        out = self._decide(len(self.hashes)) if self.w else []
        if self.pending:
            out.append(self.pending)
            self.pending = []
        return out

    def _decide(self, upto: int) -> list[list[T]]:
        import numpy as np
        from numpy.lib.stride_tricks import sliding_window_view

        w, lo, n = self.w, self.decided, len(self.hashes)
        # the hashes of [lo - w, upto + w), the window past either end of the items padded below all
        seg = np.full(upto - lo + 2 * w, _PAD, dtype=np.uint64)
        a, b = max(0, lo - w), min(n, upto + w)
        seg[a - (lo - w):b - (lo - w)] = self.hashes[a:b]
        win = sliding_window_view(seg, 2 * w + 1)
        mid = seg[w:w + upto - lo]
        flags = (mid < win[:, :w].min(axis=1)) & (mid < win[:, w + 1:].min(axis=1))
        out = []
        for f in flags.tolist():
            self.run += 1
            if f or self.run >= self.per:
                out.append(self.pending[:self.run])
                del self.pending[:self.run]
                self.run = 0
        self.decided = upto
        return out


def expected_runs(n: int, per_shard: int, fixed: bool) -> int:
    """About how many runs ``n`` items make (:class:`KeyCutter`): a runner sizes batches by it."""
    mean = per_shard if fixed or per_shard < 8 else 2 * (per_shard // 3) + 1
    return -(-n // max(1, mean))


def cut_by_keys(items: list[T], per_shard: int, fixed: bool, key: Callable[[T], str]) -> list[list[T]]:
    """``items`` in order, cut as :class:`KeyCutter` cuts them."""
    c = KeyCutter(per_shard, fixed, key)
    runs = [r for it in items for r in c.push(it)]
    return runs + c.finish()
