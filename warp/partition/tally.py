"""What one rank consumed of an epoch, as digests: :class:`Tally` and :class:`Ledger` (docs/partitioning.md).

Every loader's resume state carries a :class:`Tally` of what its rank consumed:
``consumed_digest`` over the samples it yielded in their own place of the order,
``pad_digest`` over the repeats ``pad=True`` added, ``dropped_digest`` over the
tail that ``drop_last=True`` leaves to no rank (held by rank 0 only), and
``carried``: what the ranks of earlier runs at another world size consumed (held
by rank 0 of the run that resumed from them).
:func:`~warpdata.partition.digest.combine_digests` over the
final states of every rank of the last run is the set digest exactly when every
sample of the epoch was yielded once in its place (plus the documented pad
repeats, plus the documented dropped tail).

The digests themselves (:class:`~warpdata.partition.keys.Digest`, the sample keys) are in
:mod:`warpdata.partition.keys`; :mod:`warpdata.partition.digest` re-exports the names of
this module.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from warpdata.partition.keys import CHUNK, LITTLE, Digest, P, RunPrefix, SampleKeys
from warpdata.partition.split import Remainder, merge_intervals, subtract_intervals
from warpdata.partition.world import ResumeMismatchError

if TYPE_CHECKING:
    import numpy as np

_M32 = (1 << 32) - 1  # a uint64's low 32-bit half
__all__ = ["Ledger", "Tally"]


@dataclass(slots=True)
class Tally:
    """What one rank consumed of an epoch, as digests and counts (see the module docstring)."""

    content: str = ""
    order_digest: str = ""
    consumed: Digest = Digest()
    consumed_samples: int = 0
    pad: Digest = Digest()
    pad_samples: int = 0
    dropped: Digest = Digest()
    dropped_samples: int = 0
    carried: Digest = Digest()
    carried_samples: int = 0
    carried_pad: Digest = Digest()
    carried_pad_samples: int = 0

    def fields(self) -> dict[str, Any]:
        """The JSON keys every loader's resume state carries."""
        out: dict[str, Any] = {"content": self.content, "order_digest": self.order_digest,
                               "consumed_digest": self.consumed.hex(), "consumed_samples": self.consumed_samples}
        if self.pad_samples:
            out.update(pad_digest=self.pad.hex(), pad_samples=self.pad_samples)
        if self.dropped_samples:
            out.update(dropped_digest=self.dropped.hex(), dropped_samples=self.dropped_samples)
        if self.carried_samples or self.carried_pad_samples:
            out["carried"] = [self.carried.hex(), self.carried_samples, self.carried_pad.hex(),
                              self.carried_pad_samples]
        return out

    @classmethod
    def of(cls, state: Any) -> Tally:
        """The tally in any loader's resume state (a dict, a ResumeState, their JSON, BigBatchLoader's)."""
        d = _as_mapping(state)
        try:
            carried = d.get("carried") or ("", 0, "", 0)
            return cls(content=str(d.get("content", "")), order_digest=str(d.get("order_digest", "")),
                       consumed=Digest.from_hex(d.get("consumed_digest")),
                       consumed_samples=int(d.get("consumed_samples", 0)),
                       pad=Digest.from_hex(d.get("pad_digest")), pad_samples=int(d.get("pad_samples", 0)),
                       dropped=Digest.from_hex(d.get("dropped_digest")),
                       dropped_samples=int(d.get("dropped_samples", 0)),
                       carried=Digest.from_hex(carried[0]), carried_samples=int(carried[1]),
                       carried_pad=Digest.from_hex(carried[2]), carried_pad_samples=int(carried[3]))
        except (TypeError, ValueError, IndexError) as e:
            raise ResumeMismatchError(f"a resume state's digests are malformed ({e})",
                                      hint="pass the states the loaders' state_dict() returned, unchanged") from None


_NONE = (Digest(), 0, Digest(), 0)
_ZERO = (0, 0, 0, 0, 0, 0)  # Ledger.prefix_lanes of nothing


class Ledger:
    """One rank's consumed samples of a :class:`~warpdata.partition.split.Remainder`, as digests.

    Items are numbers of the remainder's order (:meth:`Remainder.ranges`): an item
    below ``rem.size`` is a sample in its own place, one past it a ``pad`` repeat.
    ``index_of`` maps positions of the epoch's order to sample indices. Tallies
    grow incrementally: a state saved every step costs O(1) more, not a rehash.
    """

    def __init__(self, keys: SampleKeys, rem: Remainder, index_of: Callable[[np.ndarray], np.ndarray],
                 runs: RunPrefix | None = None) -> None:
        # runs (optional): the order's prefix digests, for orders made of runs (a closed form per interval)
        self.keys, self.rem, self.index_of, self.runs = keys, rem, index_of, runs
        self._iv: tuple[tuple[int, int], ...] = ()
        self._sum = _NONE
        self._dropped: tuple[int, Digest] | None = None
        self.carried: tuple[Digest, int, Digest, int] | None = None  # what this rank carries (its owner sets it)
        # tally_prefix: prefix sums over items [_lo, _hi) of the array _items; _base is the tally of items[:_lo]
        self._items: np.ndarray | None = None
        self._lo = self._hi = 0
        self._base = _ZERO
        self._cum: np.ndarray | None = None

    def _digest(self, a: int, b: int) -> Digest:
        if self.runs is None:
            return self.keys.digest(self.index_of(self.rem.array(a, b)))
        pieces = self.rem.ranges(a, b)
        out = self.runs.digest(*pieces[0])
        for lo, hi in pieces[1:]:
            out += self.runs.digest(lo, hi)
        return out

    def _add(self, acc, intervals) -> tuple[Digest, int, Digest, int]:
        c, n, p, q = acc
        m = self.rem.size
        step = CHUNK if self.runs is None else 1 << 62  # key by key: bounded temporaries
        for lo, hi in intervals:
            for at in range(lo, hi, step):
                a, b = at, min(hi, at + step)
                if b <= m:
                    d = self._digest(a, b)
                    c, n = (c + d if n else d), n + b - a
                elif a >= m:
                    p, q = p + self._digest(a, b), q + b - a
                else:  # straddles the end of the order: split it
                    c, n, p, q = c + self._digest(a, m), n + m - a, p + self._digest(m, b), q + b - m
        return c, n, p, q

    def tally(self, items: Iterable[tuple[int, int]]) -> tuple[Digest, int, Digest, int]:
        """(consumed digest, samples, pad digest, pad samples) of item intervals ``items``."""
        items = merge_intervals(items)
        if self.runs is not None:  # closed form: O(intervals), nothing to keep
            m = self.rem.size
            ca, cb, n = self.runs.lanes(self.rem, ((lo, min(hi, m)) for lo, hi in items if lo < m))
            pad = [(max(lo, m), hi) for lo, hi in items if hi > m]
            if not pad:
                return Digest(ca % P, cb % P), n, _NONE[0], 0
            p, q = Digest(), 0
            for lo, hi in pad:  # pad repeats wrap: item m + k repeats item k
                p, q = p + self._digest(lo, hi), q + hi - lo
            return Digest(ca % P, cb % P), n, p, q
        if items == self._iv:
            return self._sum
        if subtract_intervals(self._iv, items):  # not a superset of the last tally: start again
            self._iv, self._sum = (), _NONE
        self._sum = self._add(self._sum, subtract_intervals(items, self._iv))
        self._iv = items
        return self._sum

    def tally_prefix(self, items: np.ndarray, count: int) -> tuple[Digest, int, Digest, int]:
        """The tally of ``items[:count]`` (an array of item numbers, each once): :meth:`prefix_lanes` as digests."""
        a, b, n, pa, pb, q = self.prefix_lanes(items, count)
        return Digest(a, b), n, Digest(pa, pb), q

    def prefix_lanes(self, items: np.ndarray, count: int) -> tuple[int, int, int, int, int, int]:
        """``(a, b, n, pad a, pad b, pad n)``: the lanes and counts of ``items[:count]``'s own samples and pad
        repeats (an array of item numbers, each once; lanes reduced modulo ``P``).

        The items' terms are summed a chunk at a time into prefix sums (a few numpy calls a chunk:
        chunks double from 4,096 to 65,536 items), so a state costs a row lookup once its chunk is made."""
        if self._items is not items or count < self._lo:
            self._items, self._lo, self._hi, self._base, self._cum = items, 0, 0, _ZERO, None
        count = min(count, len(items))
        while count > self._hi:
            self._base = self._lanes_at(self._hi)
            self._lo = self._hi
            self._hi = min(len(items), self._lo + min(1 << 16, max(1 << 12, self._lo)))
            self._cum = self._prefix_sums(items[self._lo:self._hi])
        return self._lanes_at(count)

    def _prefix_sums(self, part: np.ndarray) -> np.ndarray:
        """Per item of ``part``: the running sums of its terms' 32-bit halves (so uint64 never overflows):
        4 columns, lane a low and high, lane b low and high; where ``part`` holds pad repeats, 9: the own
        lanes' halves (high, low), the running count of own items, the pad lanes' halves (high, low)."""
        import numpy as np

        m = self.rem.size
        idx = self.index_of(self.rem.positions(part))
        pad = len(part) > 0 and int(part.max()) >= m
        if not pad and LITTLE:
            pairs = self.keys.pair_terms(idx)
            if pairs is not None:  # one lookup, and a uint64 read as its (low, high) 32-bit halves
                return np.cumsum(pairs.view(np.uint32), axis=0, dtype=np.uint64)
        ta, tb = self.keys.terms(idx)
        if not pad:
            cols = np.empty((len(part), 4), np.uint64)
            for k, x in enumerate((ta, tb)):
                np.bitwise_and(x, np.uint64(_M32), out=cols[:, 2 * k])
                np.right_shift(x, np.uint64(32), out=cols[:, 2 * k + 1])
            return np.cumsum(cols, axis=0, out=cols)
        own = part < m
        cols = np.empty((len(part), 9), np.uint64)
        for k, (x, keep) in enumerate(((ta, own), (tb, own), (ta, ~own), (tb, ~own))):
            x = np.where(keep, x, np.uint64(0))
            at = 2 * k + (k >= 2)  # columns 0-3 the own lanes' halves, 4 the own count, 5-8 the pad lanes'
            np.right_shift(x, np.uint64(32), out=cols[:, at])
            np.bitwise_and(x, np.uint64(_M32), out=cols[:, at + 1])
        cols[:, 4] = own
        return np.cumsum(cols, axis=0, out=cols)

    def _lanes_at(self, count: int) -> tuple[int, int, int, int, int, int]:
        j = count - self._lo
        if j <= 0 or self._cum is None:
            return self._base
        a, b, n, pa, pb, q = self._base
        row = self._cum[j - 1].tolist()
        if len(row) == 4:  # no pad repeat in this chunk
            al, ah, bl, bh = row
            return (a + (ah << 32) + al) % P, (b + (bh << 32) + bl) % P, n + j, pa, pb, q
        ah, al, bh, bl, k, pah, pal, pbh, pbl = row
        return ((a + (ah << 32) + al) % P, (b + (bh << 32) + bl) % P, n + k,
                (pa + (pah << 32) + pal) % P, (pb + (pbh << 32) + pbl) % P, q + j - k)

    def prefix_fields(self, items: np.ndarray, count: int, *, content: str, order: str,
                      carried: tuple[Digest, int, Digest, int] | None, dropped_from: int | None) -> dict[str, Any]:
        """The digest fields of a resume state (:meth:`Tally.fields`, byte for byte) whose rank consumed
        ``items[:count]``: :meth:`prefix_lanes` plus ``carried``, and the dropped tail when
        ``dropped_from``. The per-key loaders' state path: a row lookup and a few integers."""
        a, b, n, pa, pb, q = self.prefix_lanes(items, count)
        if carried is not None:
            cd, cn, cp, cq = carried
            a, b, n, pa, pb, q = (a + cd.a) % P, (b + cd.b) % P, n + cn, (pa + cp.a) % P, (pb + cp.b) % P, q + cq
        out: dict[str, Any] = {"content": content, "order_digest": order, "consumed_digest": f"{a:016x}{b:016x}",
                               "consumed_samples": n}
        if q:
            out.update(pad_digest=f"{pa:016x}{pb:016x}", pad_samples=q)
        if dropped_from is not None:
            dd, dn = self.dropped(dropped_from)
            if dn:
                out.update(dropped_digest=dd.hex(), dropped_samples=dn)
        if carried is not None and (cn or cq):
            out["carried"] = [cd.hex(), cn, cp.hex(), cq]
        return out

    def dropped(self, lo: int) -> tuple[Digest, int]:
        """The digest of items ``lo ..`` of the order, which no rank reads (``drop_last``)."""
        if self._dropped is None or self._dropped[0] != lo:
            d, _n, _p, _q = self._add(_NONE, [(lo, self.rem.size)] if lo < self.rem.size else [])
            self._dropped = (lo, d)
        return self._dropped[1], max(0, self.rem.size - lo)

    def make(self, *, content: str, order: str, own: tuple[Digest, int, Digest, int],
             carried: tuple[Digest, int, Digest, int] | None, dropped_from: int | None) -> Tally:
        """The tally of a state: ``own`` plus ``carried``, and the dropped tail when ``dropped_from``."""
        c, n, p, q = own
        dd, dn = self.dropped(dropped_from) if dropped_from is not None else (_NONE[0], 0)
        if carried is None:
            return Tally(content, order, c, n, p, q, dd, dn)
        cd, cn, cp, cq = carried
        return Tally(content=content, order_digest=order, consumed=c + cd, consumed_samples=n + cn,
                     pad=p + cp, pad_samples=q + cq, dropped=dd, dropped_samples=dn, carried=cd,
                     carried_samples=cn, carried_pad=cp, carried_pad_samples=cq)



def _as_mapping(state: Any) -> Mapping[str, Any]:
    if isinstance(state, (str, bytes)):
        try:
            state = json.loads(state)
        except ValueError:
            raise ResumeMismatchError("a resume state is not JSON",
                                      hint="pass the states the loaders' state_dict() returned") from None
    if not isinstance(state, Mapping):
        given = state
        names = getattr(state, "__dataclass_fields__", None)  # read by name: a pending state computes its digests
        state = {k: getattr(state, k) for k in names} if names else getattr(state, "__dict__", None)
        if state is None:
            raise ResumeMismatchError(f"{type(given).__name__} is not a warp resume state",
                                      hint="pass the states the loaders' state_dict() returned")
    if "sampler" in state and isinstance(state["sampler"], Mapping):  # BigBatchLoader's state
        state = state["sampler"]
    if "consumed_digest" not in state:
        raise ResumeMismatchError("a resume state carries no digests (saved by an older warp)",
                                  hint="save the states with this version of warp")
    return state
