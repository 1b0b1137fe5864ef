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
:class:`Digest`: two 64-bit lanes, each the sum modulo 2^64 of a per-key hash
(``fmix64(index·M + salt)``, MurmurHash3's finaliser, a bijection of the index, with a
salt taken from SHA-256 of ``content``; the second lane sums it rotated by 29 bits). A sum is order-independent, O(1) per
key and vectorised over a batch with numpy (no Python object per sample); unlike
XOR a repeated key does not cancel: a missing, repeated or extra sample changes
both lanes. It guards against accidents (lost, repeated or skipped samples), not
against someone forging a collision.

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

import hashlib
import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from warpdata.partition.split import Remainder, merge_intervals, subtract_intervals
from warpdata.partition.world import ResumeMismatchError

if TYPE_CHECKING:
    import numpy as np

MASK = (1 << 64) - 1
_M = 0x9E3779B97F4A7C15  # odd: index·M is a bijection modulo 2^64
_C1 = 0xFF51AFD7ED558CCD  # MurmurHash3's fmix64 constants
_C2 = 0xC4CEB9FE1A85EC53
CHUNK = 1 << 20  # positions mapped to keys per step (bounds the temporaries at 8 MiB)
HASH_CHUNK = 1 << 14  # keys hashed per numpy pass: two 128 KiB buffers that stay in cache
__all__ = ["Digest", "SampleKeys", "Tally", "combine_digests", "content_of_manifest", "digest_report",
           "order_digest", "set_digest"]


@dataclass(frozen=True)
class Digest:
    """A multiset digest: two lanes, each a sum of per-key hashes modulo 2^64."""

    a: int = 0
    b: int = 0

    def __add__(self, other: Digest) -> Digest:
        return Digest((self.a + other.a) & MASK, (self.b + other.b) & MASK)

    def __sub__(self, other: Digest) -> Digest:
        return Digest((self.a - other.a) & MASK, (self.b - other.b) & MASK)

    def hex(self) -> str:
        return f"{self.a:016x}{self.b:016x}"

    @classmethod
    def from_hex(cls, text: str | None) -> Digest:
        if not text:
            return cls()
        try:
            if len(text) != 32:
                raise ValueError(text)
            return cls(int(text[:16], 16), int(text[16:], 16))
        except ValueError:
            raise ResumeMismatchError(f"{text!r} is not a warp sample digest (32 hex digits)",
                                      hint="pass the states the loaders' state_dict() returned, unchanged") from None


class SampleKeys:
    """The sample keys of one artifact (``content``), hashed a batch at a time."""

    def __init__(self, content: str) -> None:
        self.content = content
        h = hashlib.sha256(b"warp-sample-key/1\0" + content.encode()).digest()
        self._salt = int.from_bytes(h[:8], "little")
        self._k: tuple | None = None  # the numpy scalars, made on first use

    def digest(self, indices: np.ndarray | Sequence[int]) -> Digest:
        """The digest of the keys of samples ``indices`` (repeats count each time).

        Lane a sums ``h = fmix64(index·M + salt)``; lane b sums ``h`` rotated left by 29 bits
        (the carries make it a second, non-linear check). In place on one buffer: 14 numpy
        passes over the keys, no Python object per key."""
        import numpy as np

        idx = np.ascontiguousarray(indices, dtype=np.int64).reshape(-1).view(np.uint64)
        a = b = 0
        size = min(len(idx), HASH_CHUNK)
        buf, tmp = np.empty(size, np.uint64), np.empty(size, np.uint64)  # cache-sized, reused
        if self._k is None:
            self._k = tuple(np.uint64(v) for v in (_M, self._salt, 33, 29, 35, _C1, _C2))
        m, salt, s33, s29, s35, c1, c2 = self._k
        for at in range(0, len(idx), HASH_CHUNK):
            part = idx[at:at + HASH_CHUNK]
            x, t = buf[:len(part)], tmp[:len(part)]
            np.multiply(part, m, out=x)
            x += salt
            for c in (c1, c2, None):  # MurmurHash3's fmix64
                np.right_shift(x, s33, out=t)
                x ^= t
                if c is not None:
                    x *= c
            a += int(x.sum(dtype=np.uint64))
            np.left_shift(x, s29, out=t)
            x >>= s35
            x |= t
            b += int(x.sum(dtype=np.uint64))
        return Digest(a & MASK, b & MASK)

    def digest_range(self, start: int, stop: int) -> Digest:
        """The digest of samples ``start .. stop-1``, a chunk at a time."""
        import numpy as np

        out = Digest()
        for at in range(start, stop, CHUNK):
            out += self.digest(np.arange(at, min(stop, at + CHUNK), dtype=np.int64))
        return out


def set_digest(content: str, indices: np.ndarray | Sequence[int]) -> str:
    """The set digest of an epoch whose samples are ``indices`` (any order)."""
    return SampleKeys(content).digest(indices).hex()


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


@dataclass(frozen=True)
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


class Ledger:
    """One rank's consumed samples of a :class:`~warpdata.partition.split.Remainder`, as digests.

    Items are numbers of the remainder's order (:meth:`Remainder.ranges`): an item
    below ``rem.size`` is a sample in its own place, one past it a ``pad`` repeat.
    ``index_of`` maps positions of the epoch's order to sample indices. Tallies
    grow incrementally (a state saved every few steps hashes each sample once).
    """

    def __init__(self, keys: SampleKeys, rem: Remainder, index_of: Callable[[np.ndarray], np.ndarray],
                 ranges_of: Callable[[int, int], Iterable[tuple[int, int]]] | None = None) -> None:
        # ranges_of (optional): items [a, b) as runs of consecutive sample indices, for orders made of runs
        self.keys, self.rem, self.index_of, self.ranges_of = keys, rem, index_of, ranges_of
        self._iv: tuple[tuple[int, int], ...] = ()
        self._prefix: tuple[int, int] = (0, 0)  # (id of the items array, items tallied)
        self._sum = (Digest(), 0, Digest(), 0)

    def _digest(self, a: int, b: int) -> Digest:
        if self.ranges_of is None:
            return self.keys.digest(self.index_of(self.rem.array(a, b)))
        out = Digest()
        for lo, hi in self.ranges_of(a, b):
            out += self.keys.digest_range(lo, hi)
        return out

    def _add(self, acc, intervals) -> tuple[Digest, int, Digest, int]:
        c, n, p, q = acc
        m = self.rem.size
        for lo, hi in intervals:
            for at in range(lo, hi, CHUNK):
                a, b = at, min(hi, at + CHUNK)
                if b <= m:
                    c, n = c + self._digest(a, b), n + b - a
                elif a >= m:
                    p, q = p + self._digest(a, b), q + b - a
                else:  # straddles the end of the order: split it
                    c, n, p, q = c + self._digest(a, m), n + m - a, p + self._digest(m, b), q + b - m
        return c, n, p, q

    def tally(self, items: Iterable[tuple[int, int]]) -> tuple[Digest, int, Digest, int]:
        """(consumed digest, samples, pad digest, pad samples) of item intervals ``items``."""
        items = merge_intervals(items)
        if subtract_intervals(self._iv, items):  # not a superset of the last tally: start again
            self._iv, self._sum = (), (Digest(), 0, Digest(), 0)
        self._sum = self._add(self._sum, subtract_intervals(items, self._iv))
        self._iv = items
        return self._sum

    def tally_prefix(self, items: np.ndarray, count: int) -> tuple[Digest, int, Digest, int]:
        """The tally of ``items[:count]`` (an array of item numbers, each once)."""
        key, done = self._prefix
        if key != id(items) or done > count:
            done, self._sum = 0, (Digest(), 0, Digest(), 0)
        part = items[done:count]
        m = self.rem.size
        own, pad = part[part < m], part[part >= m]
        c, n, p, q = self._sum
        if len(own):
            c, n = c + self.keys.digest(self.index_of(self.rem.positions(own))), n + len(own)
        if len(pad):
            p, q = p + self.keys.digest(self.index_of(self.rem.positions(pad))), q + len(pad)
        self._sum = (c, n, p, q)
        self._prefix = (id(items), count)
        return self._sum

    def dropped(self, lo: int) -> tuple[Digest, int]:
        """The digest of items ``lo ..`` of the order, which no rank reads (``drop_last``)."""
        d, _n, _p, _q = self._add((Digest(), 0, Digest(), 0), [(lo, self.rem.size)] if lo < self.rem.size else [])
        return d, max(0, self.rem.size - lo)

    def make(self, *, content: str, order: str, own: tuple[Digest, int, Digest, int],
             carried: tuple[Digest, int, Digest, int] | None, dropped_from: int | None) -> Tally:
        """The tally of a state: ``own`` plus ``carried``, and the dropped tail when ``dropped_from``."""
        cd, cn, cp, cq = carried or (Digest(), 0, Digest(), 0)
        c, n, p, q = own
        dd, dn = self.dropped(dropped_from) if dropped_from is not None else (Digest(), 0)
        return Tally(content=content, order_digest=order, consumed=c + cd, consumed_samples=n + cn,
                     pad=p + cp, pad_samples=q + cq, dropped=dd, dropped_samples=dn, carried=cd,
                     carried_samples=cn, carried_pad=cp, carried_pad_samples=cq)


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
        given, state = state, getattr(state, "__dict__", None)
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
        return SampleKeys(self.content).digest(self.sequence).hex()

    def order_digest(self) -> str:
        return order_digest(self.content, self.mode, self.seed, self.epoch, runs_of(self.sequence))

    def _span(self, rank: int, world_size: int, batch_size: int) -> tuple[int, int]:
        from warpdata.partition.split import check_drop_leaves_batches, rank_span

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
        keys = SampleKeys(self.content)
        own, pad = items[items < n], items[items >= n]
        dropped = n - world_size * count if self.mode == "drop" else 0
        return RankShare(rank, world_size, start, len(own), keys.digest(self.sequence[own]).hex(), len(pad),
                         keys.digest(self.sequence[pad % n]).hex() if len(pad) else Digest().hex(), dropped)

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
