"""Digests that prove an epoch's order: every sample once, over any restarts (docs/partitioning.md).

Three modules, each on the one below it:

* :mod:`warpdata.partition.keys`: sample keys, the :class:`Digest` of a multiset of them
  (two lanes modulo ``2^61 - 1``), the set and order digests of an epoch;
* :mod:`warpdata.partition.tally`: what one rank consumed, as digests (:class:`Tally`, the
  digest fields of every loader's resume state, and :class:`Ledger`, which grows them);
* this module: the resume states' side: :class:`EpochKeys` (a loader's digests of an
  epoch), carrying what earlier runs consumed (:func:`carry`), refusing states of another
  epoch (:func:`check_same_epoch`), combining the final states of every rank
  (:func:`combine_digests`), and :class:`EpochOrder`, the ground truth ``warp order``
  prints. It re-exports the names of the other two: ``warpdata.partition.digest`` is the
  public face.

:func:`combine_digests` over the final states of every rank of the last run is the set
digest exactly when every sample of the epoch was yielded once in its place (plus the
documented pad repeats, plus the documented dropped tail).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from warpdata.partition.keys import (
    CHUNK,
    FEW_RUNS,
    FLAT,
    FLAT_BITS,
    HASH_CHUNK,
    LITTLE,
    Digest,
    P,
    RunOrder,
    RunPrefix,
    SampleKeys,
    content_of_manifest,
    digest_of,
    merge_runs,
    order_digest,
    runs_of,
    sample_keys,
    set_digest,
)
from warpdata.partition.split import Remainder, check_drop_leaves_batches, rank_span
from warpdata.partition.states import bad, check_carried, check_dict_state, check_done, compare
from warpdata.partition.tally import Ledger, Tally
from warpdata.partition.world import ResumeMismatchError

if TYPE_CHECKING:
    import numpy as np

__all__ = ["CHUNK", "FEW_RUNS", "FLAT", "FLAT_BITS", "HASH_CHUNK", "LITTLE", "P", "Digest", "DigestReport", "EpochKeys",
           "EpochOrder", "Ledger", "RankShare", "RunOrder", "RunPrefix", "SampleKeys", "Tally", "carried_of", "carry",
           "check_same_epoch", "combine_digests", "content_of_manifest", "digest_of", "digest_report",
           "merge_runs", "order_digest", "runs_of", "sample_keys", "set_digest"]


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
        """Refuse malformed states (:func:`~warpdata.partition.states.check_dict_state`: every field's type and
        range), states of another artifact or epoch order (:func:`check_same_epoch`), and a ``TblLoader`` state
        (``kind`` ``"tbl"``) whose digests and counts are not those of the batches it says it consumed
        (:meth:`verify_span`). A sampler verifies its states itself (its workers interleave a rank's span)."""
        for st in states:
            check_dict_state(where, st)
        order = self.order_digest(content, epoch, sequence)
        check_same_epoch(where, states, content=content, order=order)
        for st in states:
            if st.get("kind") == "tbl":
                self.verify_span(where, st, content, epoch, sequence)

    def verify_span(self, where: str, st: Any, content: str, epoch: int, sequence: np.ndarray) -> None:
        """A state of a rank that reads its span of the order in order, ``consumed`` batches of it (``TblLoader``):
        its digest fields recomputed from the first ``consumed × batch_size`` items of that span (each consumed
        sample hashed once) and compared, and what it carries from its ``done`` positions."""
        import numpy as np

        n = len(sequence)
        done = tuple(tuple(x) for x in st.get("done", ()))
        check_done(where, done, n)
        rem = Remainder(n, done)
        rank, world, bs = st["rank"], st["world_size"], st["batch_size"]
        start, count = rank_span(rem.size, rank, world, st["mode"], bs)
        k = st["consumed"]
        if k > -(-count // bs):
            raise bad(where, "consumed", k, f"rank {rank} of {world} has {-(-count // bs)} batch(es) this epoch")
        items = np.arange(start, start + min(k * bs, count), dtype=np.int64)
        ledger = Ledger(sample_keys(content), rem, sequence.__getitem__)
        dropped = count * world if st["mode"] == "drop" and rank == 0 else None
        want = ledger.prefix_fields(items, len(items), content=content, order=self.order_digest(content, epoch, sequence),
                                    carried=carried_of(st), dropped_from=dropped)
        compare(where, st, want, "consumed batches")
        check_carried(where, st.get("carried"), rank == 0, rem.done,
                      lambda: digest_of(ledger.keys, sequence[rem.done_positions()]).hex())

    def resumed(self, states: Sequence[Any], *, own: bool, rank: int) -> None:
        """Carry what ``states`` carried (``own``: this rank's own state), else, on rank 0, what they consumed."""
        self.carried = carried_of(states[0]) if own else carry(states) if rank == 0 else None


def carried_of(state: Any) -> tuple[Digest, int, Digest, int] | None:
    """The ``carried`` part of a state's tally (None when it carries nothing)."""
    t = Tally.of(state)
    if not (t.carried_samples or t.carried_pad_samples):
        return None
    return t.carried, t.carried_samples, t.carried_pad, t.carried_pad_samples


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

    ``sequence``: the sample indices in the epoch's order (before the split over ranks): an int64 array, or
    a :class:`~warpdata.partition.keys.RunOrder` (its runs: memory O(runs) however many samples they claim;
    ``warp order`` and ``warp doctor --states`` on a table, warehouse or unweighted feature cache).
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
        return digest_of(sample_keys(self.content), self.sequence).hex()

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
        """Rank ``rank`` of ``world_size``'s share of this epoch, read from its start: its own samples and its
        pad repeats (items past the end, wrapping to the start) digested a range of positions at a time."""
        start, count = self._span(rank, world_size, batch_size)
        n = self.samples
        end = start + count
        keys = sample_keys(self.content)
        own_hi = min(end, n)
        pad_lo = max(start, n)
        own = self._digest_items(keys, start, own_hi)
        pad = self._digest_items(keys, pad_lo, end)
        dropped = n - world_size * count if self.mode == "drop" else 0
        return RankShare(rank, world_size, start, max(0, own_hi - start), own.hex(), max(0, end - pad_lo), pad.hex(),
                         dropped)

    def _digest_items(self, keys: SampleKeys, lo: int, hi: int) -> Digest:
        """The digest of items ``lo .. hi-1`` of the order (items past its end wrap to its start): by the
        closed form over the runs of a :class:`RunOrder` (O(runs), whatever the sample count), else over
        slices of the array (views, no copy)."""
        n, out = self.samples, Digest()
        prefix = RunPrefix(keys, *self.sequence.runs()) if isinstance(self.sequence, RunOrder) and hi > lo else None
        while lo < hi and n:
            a = lo % n
            take = min(hi - lo, n - a)
            out += prefix.digest(a, a + take) if prefix is not None else digest_of(keys, self.sequence[a:a + take])
            lo += take
        return out

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
