"""Digests that prove an epoch's order: every sample once, over any restarts (docs/partitioning.md).

Sample key
----------
A *sample key* is ``(content, index)``: ``content`` names the artifact's bytes (a
content hash: a table's dataset version and table name, a warehouse's or feature
cache's manifest hash, a ``.tbl`` file's index hash; :func:`content_of_manifest`,
``TblLoader.content``) and ``index`` is the sample's index in it (a table's row in
manifest order, a warehouse or feature-cache record, a ``.tbl`` sample). A
weighted record read ``k`` times per epoch is ``k`` samples with one key.

Digests
-------
:class:`Digest`: two lanes, each the sum modulo the prime ``P = 2^61 - 1`` of a per-key
term ``g^index`` (``g_a``, ``g_b``: two numbers taken from SHA-256 of ``content``). A lane
is the multiset's characteristic polynomial ``Σ_i count(i)·x^i`` evaluated at a point
drawn from the content: two different multisets of keys whose indices are below ``n``
agree in a lane only where ``g`` is a root of their difference, a nonzero polynomial of
degree below ``n`` with fewer than ``n`` roots among the ``P`` residues (Schwartz–Zippel):
for a mistake that does not depend on ``g`` the chance is below ``n / 2^61`` per lane. A sum is order-independent;
unlike XOR a repeated key does not cancel: a missing, repeated or extra sample changes
it. A run of consecutive indices ``s .. t-1`` is a geometric series with a closed form,
``(g^t - g^s) / (g - 1)``, so an order made of runs (a table's row groups) is hashed a
run at a time in O(log n) per run, never per sample; single keys are hashed an array at a
time in numpy (``g^i`` looked up in a flat table of powers below 2^16, in two tables with one
product below 2^32, 10 bits of ``i`` at a time beyond). It guards
against accidents (lost, repeated or skipped samples), not against someone forging a
collision.

* The epoch's **set digest** (:func:`set_digest`) is the digest of the keys of
  every sample of the epoch, each once.
* The **order digest** (:func:`order_digest`) is SHA-256 of the content, the split
  mode, the seed, the epoch and the epoch's order (its maximal runs of consecutive
  indices): it depends on data, seed, epoch and mode, never on world size or workers.

Every loader's resume state carries a :class:`Tally` of what its rank consumed:
``consumed_digest`` over the samples it yielded in their own place of the order,
``pad_digest`` over the repeats ``pad=True`` added, ``dropped_digest`` over the
tail that ``drop_last=True`` leaves to no rank (held by rank 0 only), and
``carried``: what the ranks of earlier runs at another world size consumed (held
by rank 0 of the run that resumed from them). :func:`combine_digests` over the
final states of every rank of the last run is the set digest exactly when every
sample of the epoch was yielded once in its place (plus the documented pad
repeats, plus the documented dropped tail).
"""

from __future__ import annotations

import bisect
import functools
import hashlib
import json
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from warpdata.partition.split import (
    Remainder,
    check_drop_leaves_batches,
    merge_intervals,
    rank_span,
    subtract_intervals,
)
from warpdata.partition.world import ResumeMismatchError

if TYPE_CHECKING:
    import numpy as np

P = (1 << 61) - 1  # the Mersenne prime 2^61 - 1: each lane is a residue modulo P
_PIECE = 10  # exponents are looked up 10 bits at a time in tables of 1,024 powers
_M32 = (1 << 32) - 1
_M29 = (1 << 29) - 1
CHUNK = 1 << 20  # positions mapped to keys per step (bounds the temporaries at 8 MiB)
HASH_CHUNK = 1 << 14  # keys hashed per numpy pass (temporaries that stay in cache)
FLAT_BITS = 16  # exponents below 2^16 are looked up in one flat table of powers (at most 512 KiB a lane)
FLAT = 1 << FLAT_BITS
LITTLE = sys.byteorder == "little"  # a uint64 array read as uint32 pairs is (low, high)
FEW_RUNS = 256  # an order of at most this many runs has its prefixes summed in Python, not numpy
__all__ = ["Digest", "EpochKeys", "SampleKeys", "Tally", "combine_digests", "content_of_manifest", "digest_report",
           "order_digest", "sample_keys", "set_digest"]


class Digest:
    """A multiset digest: two lanes, each a sum of per-key terms modulo ``P`` = 2^61 - 1 (immutable)."""

    __slots__ = ("a", "b")

    def __init__(self, a: int = 0, b: int = 0) -> None:
        self.a, self.b = a, b

    def __add__(self, other: Digest) -> Digest:
        return Digest((self.a + other.a) % P, (self.b + other.b) % P)

    def __sub__(self, other: Digest) -> Digest:
        return Digest((self.a - other.a) % P, (self.b - other.b) % P)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Digest) and self.a == other.a and self.b == other.b

    def __hash__(self) -> int:
        return hash((self.a, self.b))

    def __repr__(self) -> str:
        return f"Digest({self.hex()})"

    def hex(self) -> str:
        return f"{self.a:016x}{self.b:016x}"

    @classmethod
    def from_hex(cls, text: str | None) -> Digest:
        if not text:
            return cls()
        try:
            if len(text) != 32:
                raise ValueError(text)
            a, b = int(text[:16], 16), int(text[16:], 16)
            if a >= P or b >= P:
                raise ValueError(text)
            return cls(a, b)
        except ValueError:
            raise ResumeMismatchError(f"{text!r} is not a warp sample digest (32 hex digits, two lanes below "
                                      "2^61 - 1)",
                                      hint="pass the states the loaders' state_dict() returned, unchanged") from None


def _mulmod(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``a·b mod P`` for uint64 arrays below 2^61, in 64-bit pieces (numpy has no 128-bit product)."""
    import numpy as np

    a0, a1 = a & _M32, a >> 32
    b0, b1 = b & _M32, b >> 32
    lo = a0 * b0  # a·b = hi·2^64 + mid·2^32 + lo, and 2^61 ≡ 1 (mod P)
    mid = a0 * b1 + a1 * b0
    r = (lo & P) + (lo >> 61) + ((a1 * b1) << 3) + (mid >> 29) + ((mid & _M29) << 32)
    r = (r & P) + (r >> 61)
    return np.where(r >= P, r - P, r)


def _sum_mod(x: np.ndarray) -> int:
    """The sum modulo ``P`` of a uint64 array of residues (summed as 32-bit halves: no overflow)."""
    return ((int((x >> 32).sum()) << 32) + int((x & _M32).sum())) % P


class SampleKeys:
    """The sample keys of one artifact (``content``): a key's term in lane ``x`` is ``g_x ** index mod P``.

    A run of consecutive indices has a closed form (a geometric series), so the digest of
    ``start .. stop-1`` costs a few multiplications however long the run; single keys are
    hashed a batch at a time in numpy. Use :func:`sample_keys` (one per content, cached)."""

    def __init__(self, content: str) -> None:
        self.content = content
        h = hashlib.sha256(b"warp-sample-key/2\0" + content.encode()).digest()
        self.g = tuple(2 + int.from_bytes(h[8 * k:8 * k + 8], "little") % (P - 3) for k in (0, 1))
        self._inv = tuple(pow(g - 1, P - 2, P) for g in self.g)  # 1 / (g - 1) for the series
        self._py: tuple[list[list[int]], list[list[int]]] = ([], [])  # lane → piece k → g^(d·2^(10k)), d < 1024
        self._np: tuple[list[Any], list[Any]] = ([], [])
        self._flats: tuple[list[Any], list[Any]] = ([None, None], [None, None])  # lane → [low, high] flat tables
        self._pairs: Any = None  # both lanes' low flat tables side by side, (n, 2)

    def _tables(self, lane: int, pieces: int) -> list[list[int]]:
        tables = self._py[lane]
        while len(tables) < pieces:
            step = pow(self.g[lane], 1 << (_PIECE * len(tables)), P)
            t, x = [], 1
            for _ in range(1 << _PIECE):
                t.append(x)
                x = x * step % P
            tables.append(t)
        return tables

    def power(self, lane: int, e: int) -> int:
        """``g_lane ** e mod P`` (``e`` >= 0) from the tables: one multiplication per 10 bits of ``e``."""
        tables = self._py[lane]
        if len(tables) * _PIECE < e.bit_length() or not tables:
            tables = self._tables(lane, max(1, -(-e.bit_length() // _PIECE)))
        r = tables[0][e & 1023]
        e >>= _PIECE
        k = 1
        while e:
            r = r * tables[k][e & 1023] % P
            e >>= _PIECE
            k += 1
        return r

    def _flat(self, lane: int, size: int, high: bool) -> np.ndarray:
        """``g^i`` (``high``: ``g^(i·2^16)``) for ``i < size`` (rounded up to a power of two, at most 2^16), as
        uint64: made by doubling (``T[k:2k] = T[:k]·g^k``), a few numpy passes; kept for this content."""
        import numpy as np

        tables = self._flats[lane]
        got = tables[high]
        if got is not None and len(got) >= size:
            return got
        t = got if got is not None else np.ones(1, np.uint64)
        while len(t) < size:
            step = self.power(lane, len(t) << FLAT_BITS if high else len(t))
            t = np.concatenate([t, _mulmod(t, np.uint64(step))])
        tables[high] = t  # one assignment: a reader in another thread sees the old table or this one
        return t

    def powers(self, lane: int, e: np.ndarray) -> np.ndarray:
        """:meth:`power` of a uint64 array of exponents, vectorised: one lookup in a flat table of powers for
        exponents below 2^16, a lookup in two tables and one product below 2^32, else 10 bits at a time."""
        import numpy as np

        top = int(e.max()) if len(e) else 0
        if top >> FLAT_BITS == 0:  # (indices as int64: numpy converts uint64 ones first, 3x slower)
            return self._flat(lane, top + 1, False)[e.view(np.int64)]
        if top >> (2 * FLAT_BITS) == 0:
            low = self._flat(lane, 1 << FLAT_BITS, False)
            high = self._flat(lane, (top >> FLAT_BITS) + 1, True)
            return _mulmod(low[(e & np.uint64(FLAT - 1)).view(np.int64)],
                           high[(e >> np.uint64(FLAT_BITS)).view(np.int64)])
        pieces = max(1, -(-top.bit_length() // _PIECE))
        tables = self._tables(lane, pieces)
        arrays = self._np[lane]
        while len(arrays) < pieces:
            arrays.append(np.asarray(tables[len(arrays)], np.uint64))
        r = arrays[0][e & 1023]
        for k in range(1, pieces):
            r = _mulmod(r, arrays[k][(e >> (_PIECE * k)) & 1023])
        return r

    def pair_terms(self, indices: np.ndarray) -> np.ndarray | None:
        """Each key's terms in lanes a and b as the rows of a ``(n, 2)`` uint64 array: one lookup in a flat
        table of both lanes' powers. None unless every index is below 2^16 (then :meth:`terms`)."""
        import numpy as np

        top = int(indices.max()) if len(indices) else 0
        if top >> FLAT_BITS:
            return None
        pairs = self._pairs
        if pairs is None or len(pairs) <= top:
            a, b = self._flat(0, top + 1, False), self._flat(1, top + 1, False)
            n = min(len(a), len(b))
            pairs = self._pairs = np.stack([a[:n], b[:n]], axis=1)
        return np.take(pairs, indices, axis=0)  # (not pairs[indices]: numpy's 2-D fancy indexing is 8x slower)

    def terms(self, indices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Each key's term in lanes a and b (uint64 residues), for prefix sums."""
        import numpy as np

        e = np.ascontiguousarray(indices, dtype=np.int64).reshape(-1).view(np.uint64)
        return self.powers(0, e), self.powers(1, e)

    def digest(self, indices: np.ndarray | Sequence[int]) -> Digest:
        """The digest of the keys of samples ``indices`` (repeats count each time)."""
        import numpy as np

        idx = np.ascontiguousarray(indices, dtype=np.int64).reshape(-1)
        a = b = 0
        for at in range(0, len(idx), HASH_CHUNK):
            ta, tb = self.terms(idx[at:at + HASH_CHUNK])
            a, b = a + _sum_mod(ta), b + _sum_mod(tb)
        return Digest(a % P, b % P)

    def digest_range(self, start: int, stop: int) -> Digest:
        """The digest of samples ``start .. stop-1``: ``(g^stop - g^start) / (g - 1)`` per lane, O(log n)."""
        if stop <= start:
            return Digest()
        inv, power = self._inv, self.power
        return Digest((power(0, stop) - power(0, start)) * inv[0] % P, (power(1, stop) - power(1, start)) * inv[1] % P)

    def run_terms(self, starts: np.ndarray, lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Each run's digest in lanes a and b (uint64 residues): runs ``starts[k] .. starts[k]+lengths[k]-1``."""
        import numpy as np

        s = np.ascontiguousarray(starts, dtype=np.int64).reshape(-1).view(np.uint64)
        n = np.ascontiguousarray(lengths, dtype=np.int64).reshape(-1).view(np.uint64)
        out = []
        for lane in (0, 1):
            series = self.powers(lane, n) - np.uint64(1)  # g^n - 1 (g^n is never 0), / (g - 1), · g^start
            series = _mulmod(series, np.uint64(self._inv[lane]))
            out.append(_mulmod(self.powers(lane, s), series))
        return out[0], out[1]

    def digest_runs(self, starts: np.ndarray, lengths: np.ndarray) -> Digest:
        """The digest of runs ``starts[k] .. starts[k]+lengths[k]-1``, vectorised over the runs."""
        import numpy as np

        s = np.ascontiguousarray(starts, dtype=np.int64).reshape(-1)
        n = np.ascontiguousarray(lengths, dtype=np.int64).reshape(-1)
        keep = n > 0
        s, n = s[keep], n[keep]
        a = b = 0
        for at in range(0, len(s), HASH_CHUNK):
            ta, tb = self.run_terms(s[at:at + HASH_CHUNK], n[at:at + HASH_CHUNK])
            a, b = a + _sum_mod(ta), b + _sum_mod(tb)
        return Digest(a % P, b % P)


class RunPrefix:
    """Digests of the prefixes of an order made of runs of consecutive indices (a table's row groups).

    ``at(pos)`` is the digest of the order's first ``pos`` samples: the runs before ``pos``
    summed once (prefix sums), plus part of one run in closed form: O(log n) whatever ``pos``.
    """

    def __init__(self, keys: SampleKeys, starts: Sequence[int], lengths: Sequence[int]) -> None:
        self.keys = keys
        self.starts = [int(x) for x in starts]
        self.cum = [0]
        for n in lengths:
            self.cum.append(self.cum[-1] + int(n))
        self._first = [(keys.power(0, x), keys.power(1, x)) for x in self.starts]  # g^start of each run
        self._lanes: list[tuple[int, int]] | None = None  # the prefixes' reduced lanes, for a few runs
        self._sums: Any = None  # else their 32-bit halves (numpy), a row per prefix
        if len(self.starts) <= FEW_RUNS:  # a few multiplications per run cost less than numpy's calls
            a = b = 0
            lanes, (ia, ib) = [(0, 0)], keys._inv
            for (fa, fb), x, n in zip(self._first, self.starts, lengths, strict=True):
                stop = x + int(n)  # run x .. stop-1: (g^stop - g^x) / (g - 1)
                a = (a + (keys.power(0, stop) - fa) * ia) % P
                b = (b + (keys.power(1, stop) - fb) * ib) % P
                lanes.append((a, b))
            self._lanes = lanes
        else:
            import numpy as np

            ta, tb = keys.run_terms(np.asarray(self.starts, np.int64), np.asarray(lengths, np.int64))
            halves = np.zeros((len(self.starts) + 1, 4), np.uint64)  # 32-bit halves: the sums never overflow
            halves[1:] = np.stack([ta >> np.uint64(32), ta & np.uint64(_M32), tb >> np.uint64(32),
                                   tb & np.uint64(_M32)], axis=1)
            self._sums = np.cumsum(halves, axis=0)
        self._memo: dict[int, tuple[int, int]] = {}
        self._arrays: tuple | None = None  # for at_array, made on first use

    def at(self, pos: int) -> tuple[int, int]:
        """The two lanes of the digest of the order's first ``pos`` samples."""
        got = self._memo.get(pos)
        if got is not None:
            return got
        k = bisect.bisect_right(self.cum, pos) - 1
        if self._lanes is not None:
            a, b = self._lanes[k]
        else:
            ah, al, bh, bl = self._sums[k].tolist()
            a, b = (ah << 32) + al, (bh << 32) + bl
        if pos > self.cum[k]:  # part of run k in closed form: (g^stop - g^start) / (g - 1)
            stop, (fa, fb), keys = self.starts[k] + pos - self.cum[k], self._first[k], self.keys
            a += (keys.power(0, stop) - fa) * keys._inv[0]
            b += (keys.power(1, stop) - fb) * keys._inv[1]
        if len(self._memo) > 64:
            self._memo.clear()
        got = self._memo[pos] = (a % P, b % P)
        return got

    def at_array(self, pos: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`at` of an int64 array of positions (0 .. the order's length), vectorised: uint64 lanes."""
        import numpy as np

        if self._arrays is None:
            lanes = []
            for lane in (0, 1):
                if self._lanes is not None:
                    cum = [x[lane] for x in self._lanes]
                else:
                    sums = self._sums[:, 2 * lane:2 * lane + 2]  # the lane's (high, low) halves
                    cum = [((h << 32) + lo) % P for h, lo in sums.tolist()]
                first = [f[lane] for f in self._first] + [1]  # a sentinel run at the end: start 0, g^0
                lanes.append((np.asarray(cum, np.uint64), np.asarray(first, np.uint64)))
            self._arrays = (np.asarray(self.cum, np.int64), np.asarray(self.starts + [0], np.int64), lanes)
        cum, starts, lanes = self._arrays
        k = np.searchsorted(cum, pos, side="right") - 1
        stop = (starts[k] + pos - cum[k]).view(np.uint64)
        out = []
        for lane, (sums, first) in enumerate(lanes):
            part = self.keys.powers(lane, stop) + (np.uint64(P) - first[k])  # g^stop - g^start, + P
            part = _mulmod(np.where(part >= P, part - np.uint64(P), part), np.uint64(self.keys._inv[lane]))
            total = sums[k] + part
            out.append(np.where(total >= P, total - np.uint64(P), total))
        return out[0], out[1]

    def digest(self, lo: int, hi: int) -> Digest:
        """The digest of positions ``lo .. hi-1`` of the order."""
        if hi <= lo:
            return Digest()
        (a1, b1), (a0, b0) = self.at(hi), self.at(lo)
        return Digest((a1 - a0) % P, (b1 - b0) % P)

    def lanes(self, rem: Remainder, intervals: Iterable[tuple[int, int]]) -> tuple[int, int, int]:
        """Unreduced lanes and count of items ``intervals`` of ``rem`` (each within ``0 .. rem.size``)."""
        a = b = n = 0
        at, whole = self.at, len(rem.avail) == 1 and rem.avail[0] == (0, rem.n)
        for lo, hi in intervals:
            n += hi - lo
            for x, y in ((lo, hi),) if whole else rem.ranges(lo, hi):
                (a1, b1), (a0, b0) = at(y), at(x)
                a, b = a + a1 - a0, b + b1 - b0
        return a, b, n


@functools.lru_cache(maxsize=8)
def sample_keys(content: str) -> SampleKeys:
    """The :class:`SampleKeys` of ``content``, shared in this process (its power tables are built once: up
    to ~3 MiB for an artifact of 65,536 samples or more, so the 8 most recent contents are kept)."""
    return SampleKeys(content)


def set_digest(content: str, indices: np.ndarray | Sequence[int]) -> str:
    """The set digest of an epoch whose samples are ``indices`` (any order)."""
    return sample_keys(content).digest(indices).hex()


def _digest_of(keys: SampleKeys, sequence: np.ndarray) -> Digest:
    """The digest of ``sequence``: by its runs of consecutive indices when they are long (a table's row
    groups, a warehouse's shards), else key by key."""
    starts, lengths = runs_of(sequence)
    if len(starts) * 8 <= len(sequence):
        return keys.digest_runs(starts, lengths)
    return keys.digest(sequence)


def runs_of(sequence: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(starts, lengths)`` of the maximal runs of consecutive increasing indices of ``sequence``."""
    import numpy as np

    seq = np.asarray(sequence, np.int64).reshape(-1)
    if not len(seq):
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    cut = np.flatnonzero(np.diff(seq) != 1) + 1
    begin = np.concatenate([[0], cut]).astype(np.int64)
    ends = np.concatenate([cut, [len(seq)]]).astype(np.int64)
    return seq[begin], ends - begin


def merge_runs(runs: Iterable[tuple[int, int]]) -> tuple[np.ndarray, np.ndarray]:
    """Runs ``(start, length)`` in order, adjacent ones joined: the canonical form of :func:`runs_of`."""
    import numpy as np

    starts: list[int] = []
    lengths: list[int] = []
    for s, n in runs:
        if n <= 0:
            continue
        if starts and starts[-1] + lengths[-1] == s:
            lengths[-1] += n
        else:
            starts.append(int(s))
            lengths.append(int(n))
    return np.asarray(starts, np.int64), np.asarray(lengths, np.int64)


def order_digest(content: str, mode: str, seed: int, epoch: int, runs: tuple[np.ndarray, np.ndarray]) -> str:
    """SHA-256 (128 bits, hex) of the epoch's order given as its runs (:func:`runs_of`, :func:`merge_runs`)."""
    h = hashlib.sha256(b"warp-order/1\0")
    import numpy as np

    h.update(json.dumps([content, mode, int(seed), int(epoch)], separators=(",", ":")).encode())
    starts, lengths = runs
    pairs = np.empty((len(starts), 2), "<i8")
    pairs[:, 0], pairs[:, 1] = starts, lengths
    h.update(pairs.tobytes())
    return h.hexdigest()[:32]


def content_of_manifest(doc: Mapping[str, Any]) -> str:
    """An artifact's content name: its manifest's ``content_sha256``, else SHA-256 of the manifest."""
    got = doc.get("content_sha256")
    if isinstance(got, str) and got:
        return got
    return hashlib.sha256(json.dumps(doc, sort_keys=True, separators=(",", ":"), default=str).encode()).hexdigest()


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


class EpochKeys:
    """The digest side of a loader of single keys (:class:`~warpdata.partition.sampler.ShardAwareSampler`,
    ``TblLoader``): the order digest of an epoch's sequence (kept for the last epoch asked), the
    :class:`Ledger` of this rank's items, and ``carried``, what the ranks of earlier runs at another world
    size consumed (rank 0 of the run that resumed from them)."""

    def __init__(self, mode: str, seed: int) -> None:
        self.mode, self.seed = mode, seed
        self.carried: tuple[Digest, int, Digest, int] | None = None
        self.ledger: Ledger | None = None  # dropped by its owner when its remainder or epoch changes
        self._order: tuple[Any, str] = (None, "")

    def order_digest(self, content: str, epoch: int, sequence: np.ndarray) -> str:
        key = (content, epoch)
        if self._order[0] != key:
            self._order = (key, order_digest(content, self.mode, self.seed, epoch, runs_of(sequence)))
        return self._order[1]

    def fields(self, content: str, epoch: int, sequence: np.ndarray, rem: Remainder, items: np.ndarray, count: int,
               dropped_from: int | None) -> dict[str, Any]:
        """A state's digest fields: this rank consumed ``items[:count]`` of ``rem`` over ``sequence``."""
        ledger = self.ledger
        if ledger is None:
            ledger = self.ledger = Ledger(sample_keys(content), rem, sequence.__getitem__)
        return ledger.prefix_fields(items, count, content=content, order=self.order_digest(content, epoch, sequence),
                                    carried=self.carried, dropped_from=dropped_from)

    def check(self, where: str, states: Sequence[Any], content: str, epoch: int, sequence: np.ndarray) -> None:
        """Refuse states of another artifact or epoch order (:func:`check_same_epoch`)."""
        check_same_epoch(where, states, content=content, order=self.order_digest(content, epoch, sequence))

    def resumed(self, states: Sequence[Any], *, own: bool, rank: int) -> None:
        """Carry what ``states`` carried (``own``: this rank's own state), else, on rank 0, what they consumed."""
        self.carried = carried_of(states[0]) if own else carry(states) if rank == 0 else None


def carried_of(state: Any) -> tuple[Digest, int, Digest, int] | None:
    """The ``carried`` part of a state's tally (None when it carries nothing)."""
    t = Tally.of(state)
    if not (t.carried_samples or t.carried_pad_samples):
        return None
    return t.carried, t.carried_samples, t.carried_pad, t.carried_pad_samples


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


def carry(states: Sequence[Any]) -> tuple[Digest, int, Digest, int]:
    """What the ranks of one run consumed (their own and what they carried), for the run resuming from them."""
    c, n, p, q = Digest(), 0, Digest(), 0
    for t in map(Tally.of, states):
        c, n, p, q = c + t.consumed, n + t.consumed_samples, p + t.pad, q + t.pad_samples
    return c, n, p, q


def check_same_epoch(where: str, states: Sequence[Any], *, content: str = "", order: str = "") -> None:
    """States of one epoch of one artifact, and (when given) of this loader's ``content`` and ``order``."""
    tallies = [Tally.of(s) for s in states]
    for k, what, hint in (("content", "dataset version (artifact content)", "resume against the same dataset "
                           "version"),
                          ("order_digest", "epoch order (data, seed, epoch, shuffle or split mode)",
                           "resume with the seed, epoch, shuffle and drop_last / pad of the run that saved it")):
        want = content if k == "content" else order
        got = sorted({getattr(t, k) for t in tallies})
        if len(got) > 1:
            raise ResumeMismatchError(f"{where}: resume states come from different runs: their {what} differs",
                                      hint="pass the states every rank of one run saved at one step")
        if want and got and got[0] and got[0] != want:
            raise ResumeMismatchError(f"{where}: the resume state is for another {what}: {got[0][:16]}…, "
                                      f"this loader has {want[:16]}…", hint=hint)


@dataclass(frozen=True)
class DigestReport:
    """The digests of a set of final states (:func:`digest_report`)."""

    content: str
    order_digest: str
    digest: str  # consumed + dropped: the set digest when every sample was yielded once
    consumed_samples: int
    pad_digest: str
    pad_samples: int
    dropped_samples: int
    ranks: int


def digest_report(states: Sequence[Any]) -> DigestReport:
    """Combine the final states of every rank of a run (see :func:`combine_digests`)."""
    states = list(states)
    if not states:
        raise ResumeMismatchError("no resume states to combine", hint="pass the final state of every rank")
    check_same_epoch("combine_digests", states)
    total, pad, n, p, dropped = Digest(), Digest(), 0, 0, 0
    for t in map(Tally.of, states):
        total += t.consumed + t.dropped
        pad += t.pad
        n, p, dropped = n + t.consumed_samples, p + t.pad_samples, dropped + t.dropped_samples
    first = Tally.of(states[0])
    return DigestReport(first.content, first.order_digest, total.hex(), n, pad.hex(), p, dropped, len(states))


def combine_digests(states: Sequence[Any]) -> str:
    """The epoch's digest from the final states of every rank: equal to ``warp order``'s set digest
    exactly when every sample was yielded once over all runs (pad repeats and the dropped tail
    are accounted for: docs/partitioning.md)."""
    return digest_report(states).digest


@dataclass(frozen=True)
class RankShare:
    """What one rank of a fresh epoch reads (:meth:`EpochOrder.share`)."""

    rank: int
    world_size: int
    start: int  # its first position in the epoch's order
    samples: int  # in their own place
    digest: str
    pad_samples: int
    pad_digest: str
    dropped_samples: int  # of the whole epoch, read by no rank (drop_last)


@dataclass(frozen=True)
class EpochOrder:
    """One epoch of one artifact as a loader orders it: the ground truth ``warp order`` prints.

    ``sequence``: the sample indices in the epoch's order (before the split over ranks).
    """

    kind: str
    content: str
    mode: str
    seed: int
    epoch: int
    shuffle: bool
    sequence: Any  # np.ndarray of int64

    @property
    def samples(self) -> int:
        return len(self.sequence)

    def set_digest(self) -> str:
        return _digest_of(sample_keys(self.content), self.sequence).hex()

    def order_digest(self) -> str:
        return order_digest(self.content, self.mode, self.seed, self.epoch, runs_of(self.sequence))

    def _span(self, rank: int, world_size: int, batch_size: int) -> tuple[int, int]:
        if world_size < 1 or not 0 <= rank < world_size:
            raise ResumeMismatchError(f"rank {rank} is not in 0..{world_size - 1} (world size {world_size})",
                                      hint="pass --world-size W and --rank R with 0 <= R < W")
        if self.mode == "drop":
            check_drop_leaves_batches(self.samples, world_size, batch_size)
        return rank_span(self.samples, rank, world_size, self.mode, batch_size)

    def share(self, rank: int, world_size: int, batch_size: int = 1) -> RankShare:
        """Rank ``rank`` of ``world_size``'s share of this epoch, read from its start."""
        import numpy as np

        start, count = self._span(rank, world_size, batch_size)
        n = self.samples
        items = np.arange(start, start + count, dtype=np.int64)
        keys = sample_keys(self.content)
        own, pad = items[items < n], items[items >= n]
        dropped = n - world_size * count if self.mode == "drop" else 0
        return RankShare(rank, world_size, start, len(own), _digest_of(keys, self.sequence[own]).hex(), len(pad),
                         _digest_of(keys, self.sequence[pad % n]).hex(), dropped)

    def keys(self, rank: int | None = None, world_size: int = 1, batch_size: int = 1):
        """The sample indices in order (of one rank's share when ``rank`` is given), a chunk at a time."""
        if rank is None:
            lo, hi = 0, self.samples
        else:
            lo, count = self._span(rank, world_size, batch_size)
            hi = lo + count
        import numpy as np

        for at in range(lo, hi, CHUNK):
            yield self.sequence[np.arange(at, min(hi, at + CHUNK), dtype=np.int64) % self.samples]
