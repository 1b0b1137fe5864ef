"""Sample keys and their digests: the primitives of the digests that prove an epoch's order (docs/partitioning.md).

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

The running tallies of what a rank consumed are in :mod:`warpdata.partition.tally`; the
resume states' side (carrying, checking and combining them) in :mod:`warpdata.partition.digest`,
which re-exports the names of this module.
"""

from __future__ import annotations

import bisect
import functools
import hashlib
import json
import sys
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from warpdata.partition.split import Remainder
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
__all__ = ["CHUNK", "FEW_RUNS", "P", "Digest", "RunPrefix", "SampleKeys", "content_of_manifest", "digest_of",
           "merge_runs", "order_digest", "runs_of", "sample_keys", "set_digest"]



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


def digest_of(keys: SampleKeys, sequence: np.ndarray | RunOrder) -> Digest:
    """The digest of ``sequence``: by its runs of consecutive indices when they are long (a table's row
    groups, a warehouse's shards), else key by key."""
    starts, lengths = runs_of(sequence)
    if isinstance(sequence, RunOrder) or len(starts) * 8 <= len(sequence):
        return keys.digest_runs(starts, lengths)
    return keys.digest(sequence)


class RunOrder:
    """An epoch's order given as its runs of consecutive indices (a table's row groups, a warehouse's shards
    in their shuffled order): O(runs) memory however many samples the runs claim. Reads as the int64 array
    it stands for: ``len``, indexing by a position, a slice or an array of positions (each position
    mapped by a binary search over the runs), ``tolist()``, ``numpy.asarray``."""

    def __init__(self, starts: Sequence[int] | np.ndarray, lengths: Sequence[int] | np.ndarray) -> None:
        import numpy as np

        self.starts, self.lengths = merge_runs(zip(np.asarray(starts, np.int64).tolist(),
                                                   np.asarray(lengths, np.int64).tolist(), strict=True))
        self.cum = np.concatenate([[0], np.cumsum(self.lengths)]).astype(np.int64)

    def __len__(self) -> int:
        return int(self.cum[-1])

    def runs(self) -> tuple[np.ndarray, np.ndarray]:
        return self.starts, self.lengths

    def __getitem__(self, pos: Any) -> Any:
        import numpy as np

        if isinstance(pos, slice):
            pos = np.arange(*pos.indices(len(self)), dtype=np.int64)
        p = np.asarray(pos, np.int64)
        if p.size and (int(p.min()) < 0 or int(p.max()) >= len(self)):
            raise IndexError(f"positions outside 0..{len(self) - 1}")
        k = np.searchsorted(self.cum, p, side="right") - 1
        got = self.starts[k] + p - self.cum[k]
        return int(got) if got.ndim == 0 else got

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        import numpy as np

        out = self[np.arange(len(self), dtype=np.int64)]
        return out if dtype is None else out.astype(dtype)

    def tolist(self) -> list[int]:
        return self.__array__().tolist()


def runs_of(sequence: np.ndarray | RunOrder) -> tuple[np.ndarray, np.ndarray]:
    """``(starts, lengths)`` of the maximal runs of consecutive increasing indices of ``sequence``."""
    import numpy as np

    if isinstance(sequence, RunOrder):
        return sequence.runs()
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
