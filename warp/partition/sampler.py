"""A shard-aware distributed sampler (pure numpy; torch optional).

Samples live in shards (``shard_sizes[i]`` samples in shard ``i``; global
index = shard offset + position). A plain global permutation makes every
reader touch every shard all the time, which collapses shard caches
(docs/design.md §4: 10.6 samples/s vs 350–640 shard-aware). This sampler keeps
locality while splitting an epoch over ranks by the one partitioning of every
warp loader (:mod:`warpdata.partition.split`, docs/partitioning.md):

1. Each epoch the shard order is permuted with ``rng(seed, epoch)`` (the same
   on every rank) and the shards' samples are concatenated in that order: the
   epoch's *sequence*, whose positions do not depend on rank, world size or
   workers.
2. Rank ``r`` of ``world_size`` takes one contiguous run of the sequence
   (:func:`~warpdata.partition.split.rank_span`). By default (``drop_last=False,
   pad=False``) the runs cover every sample exactly once and ranks differ by at
   most one sample; ``pad=True`` gives every rank ⌈N/world_size⌉ samples,
   repeating samples from the start of the sequence (DistributedSampler's
   padding); ``drop_last=True`` gives every rank the same number of full
   batches and skips the tail of the sequence. A rank touches about
   ``num_shards / world_size + 1`` shards.
3. A rank's run is cut into ``num_workers`` contiguous parts at batch
   boundaries, one per DataLoader worker, so each worker reads its own
   shards. With ``shuffle`` each part is shuffled inside consecutive windows
   of ``window`` samples (``rng(seed, epoch, rank, worker)``): at most
   ``window / shard_size + 1`` shards are hot per worker.
4. ``__iter__`` interleaves the workers' parts batch by batch (batch ``j`` of
   worker ``w`` is overall batch ``j * num_workers + w``), the round-robin
   order in which ``torch.utils.data.DataLoader`` hands batches to workers;
   ``worker_indices(w)`` gives one worker's part for iterable datasets.

Weighted records (``repeats``, the feature cache's ``[[directory]] num_repeats``,
docs/features-config.md): record ``i`` is yielded ``repeats[i]`` times per epoch
without being stored more than once. Shard ``s`` then stands in step 1 as
``max(repeats in s)`` *copies*, copy ``k`` holding the records of ``s`` with
``repeats > k`` (in shard order); the copies are permuted with all the others,
so a record's repeats land in different places of the epoch and each copy still
reads one shard. Every count above (length, padding, rank runs, worker parts)
is over these weighted samples. Without ``repeats`` (or with all ones) the
order is exactly the unweighted one.

``set_epoch`` changes the permutation; ``state_dict(consumed=)`` and
``load_state_dict`` resume mid-epoch: the next ``__iter__`` skips the samples
already consumed (pass ``consumed`` = samples the training loop has actually
used; by default the count this sampler has yielded, which includes
DataLoader prefetch). ``load_state_dict`` also takes the list of the states of
*every* rank of a run at another world size (or worker count, batch size,
window or split mode): the positions of the sequence they consumed are taken
out and the rest of the epoch is split over this run's ranks, so over both
runs every sample is read exactly once (exact split). The same seed, epoch
and settings give the same order on any machine.

Old keyword names: ``num_replicas`` (now ``world_size``) and ``uneven``
(``"pad"`` is ``pad=True``, ``"drop"`` is ``drop_last=True``) warn and map
for one release.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

from warpdata.core.errors import ConfigError
from warpdata.partition.digest import EpochKeys, RunOrder, carried_of, digest_of, sample_keys
from warpdata.partition.split import (
    Remainder,
    check_all_ranks,
    check_drop_leaves_batches,
    intervals_of_array,
    mode_of,
    rank_span,
)
from warpdata.partition.states import bad, check_carried, check_dict_state, check_done, compare
from warpdata.partition.tally import Tally
from warpdata.partition.world import (
    UNSET,
    ResumeMismatchError,
    renamed,
    resolve_world,
    split_policy,
)

if TYPE_CHECKING:
    import numpy as np

UNEVEN_POLICIES = ("pad", "drop")  # the deprecated ``uneven=`` values


class ShardAwareSampler:
    """Per-rank sample order over sharded data; see the module docstring.

    ``rank`` / ``world_size``: this rank and the number of ranks; each one not
    given comes from torch.distributed, then RANK / WORLD_SIZE, else 0 / 1
    (:func:`~warpdata.partition.world.resolve_world`). ``drop_last`` and
    ``pad`` choose the split (default: every sample exactly once; ranks may
    differ by one sample); ``pad=True`` is DistributedSampler's padding,
    ``drop_last=True`` keeps only full batches, the same number per rank.
    """

    def __init__(self, shard_sizes: Sequence[int], *, rank: int | None = None, world_size: int | None = None,
                 num_workers: int = 1, batch_size: int = 1, shuffle: bool = True, seed: int = 0,
                 window: int = 1024, drop_last: bool = False, pad: bool = False,
                 repeats: Sequence[int] | np.ndarray | None = None, content: str | None = None,
                 num_replicas: Any = UNSET, uneven: Any = UNSET) -> None:
        import numpy as np

        where = "ShardAwareSampler"
        world_size = renamed(where, "num_replicas", num_replicas, "world_size", world_size, None)
        if uneven is not UNSET:
            drop_last, pad = renamed(where, "uneven", uneven, "drop_last= / pad=", (drop_last, pad), (False, False),
                                     lambda v: split_policy(where, "uneven", v))
        self.mode = mode_of(drop_last, pad, where)
        sizes = np.asarray(list(shard_sizes), dtype=np.int64)
        if sizes.ndim != 1 or (sizes < 0).any():
            raise ConfigError("shard_sizes must be a list of non-negative sample counts")
        offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        rep = None
        if repeats is not None:
            rep = np.asarray(repeats)
            if rep.shape != (int(offsets[-1]),) or rep.dtype.kind not in "iu" or (rep < 1).any():
                raise ConfigError(f"repeats must hold one integer >= 1 per sample ({int(offsets[-1])}), "
                                  f"got shape {rep.shape} dtype {rep.dtype}")
            rep = rep.astype(np.int64)
            if (rep == 1).all():
                rep = None  # the unweighted order, bit for bit
        world = resolve_world(rank, world_size, worker=(0, 1))
        if num_workers < 1 or batch_size < 1 or window < 1:
            raise ConfigError("num_workers, batch_size and window must be >= 1")
        self.shard_sizes = sizes
        self.offsets = offsets
        self.repeats = rep
        if rep is None:
            self._copies = None
            self.num_samples_total = int(offsets[-1])
        else:
            # (shard, k) for copy k of shard s; its samples are those of s with repeats > k
            per_shard = [int(rep[offsets[s]:offsets[s + 1]].max(initial=1)) for s in range(len(sizes))]
            self._copies = np.asarray([(s, k) for s, m in enumerate(per_shard) for k in range(m)],
                                      np.int64).reshape(-1, 2)
            self.num_samples_total = int(rep.sum())
        self.world_size, self.rank = world.world_size, world.rank
        self.num_workers, self.batch_size = int(num_workers), int(batch_size)
        self.shuffle, self.seed, self.window = bool(shuffle), int(seed), int(window)
        self.drop_last, self.pad = self.mode == "drop", self.mode == "pad"
        if self.drop_last:
            check_drop_leaves_batches(self.num_samples_total, self.world_size, self.batch_size)
        self.epoch = 0
        self._epoch_pinned = False  # set_epoch() was called: a resume state must be of this epoch
        self._skip = 0  # samples to skip at the next __iter__ (mid-epoch resume)
        self._yielded = 0
        self.resumed_elsewhere = False
        self._complete = False  # a pass ended: the next one starts the epoch whole
        # the resume state's fingerprints, hashed once: they depend only on these settings, fixed for the
        # sampler's life (set_epoch changes no field of them), and a state saved every step reads them
        self._data_fp = self._hash_data()
        self._settings_fp = self._hash_settings()
        # the sample keys' content name (docs/partitioning.md); a bare sampler names its shards and weights
        self.content = content or f"sampler:{self._data_fp}"
        self._digests = EpochKeys(self.mode, self.seed)
        self._sequences: dict[int, np.ndarray] = {}
        self._set_done(())

    def _set_done(self, done) -> None:
        """Positions of this epoch's sequence consumed before this run (resume at another world size)."""
        self._rem = Remainder(self.num_samples_total, done)
        self._start, self.per_rank = rank_span(self._rem.size, self.rank, self.world_size, self.mode,
                                               self.batch_size)
        self._digests.ledger = None
        self._items = None  # (epoch, this rank's items in yield order)

    # the names of the first release
    @property
    def num_replicas(self) -> int:
        return self.world_size

    @property
    def uneven(self) -> str:
        return {"drop": "drop", "pad": "pad"}.get(self.mode, "exact")

    def __len__(self) -> int:
        return self.per_rank

    def set_epoch(self, epoch: int) -> None:
        """Choose the epoch; another epoch than the current one forgets any resume state."""
        if int(epoch) != self.epoch:
            self._skip = 0
            self._digests.carried = None
            self._complete = False
            self._set_done(())
        self.epoch = int(epoch)
        self._epoch_pinned = True

    def shard_order(self, epoch: int | None = None) -> np.ndarray:
        """Shard ids in this epoch's order (with ``repeats``: ids into the shard copies)."""
        import numpy as np

        e = self.epoch if epoch is None else epoch
        n = len(self.shard_sizes) if self._copies is None else len(self._copies)
        if not self.shuffle:
            return np.arange(n, dtype=np.int64)
        return np.random.default_rng([self.seed, e]).permutation(n).astype(np.int64)

    def sequence(self, epoch: int | None = None) -> np.ndarray:
        """The epoch's sequence: every (weighted) sample once, in shard-permuted order (read-only, kept
        for the last epoch asked: iteration, digests and resume share it)."""
        e = self.epoch if epoch is None else int(epoch)
        got = self._sequences.get(e)
        if got is None:
            got = self._sequence(e)
            got.flags.writeable = False
            self._sequences = {e: got}
        return got

    def sequence_runs(self, epoch: int | None = None) -> RunOrder | None:
        """The epoch's sequence as its runs, one per shard in the epoch's shard order: O(shards) memory
        however many samples the shards claim (``warp order``); None with ``repeats`` (a copy of a shard
        holds some of its samples, not a run)."""
        if self._copies is not None:
            return None
        order = self.shard_order(epoch)
        return RunOrder(self.offsets[order], self.shard_sizes[order])

    def _sequence(self, epoch: int) -> np.ndarray:
        import numpy as np

        order = self.shard_order(epoch)
        if len(order) and self._copies is not None:
            parts = []
            for c in order:
                s, k = self._copies[c]
                idx = np.arange(self.offsets[s], self.offsets[s + 1], dtype=np.int64)
                parts.append(idx[self.repeats[idx] > k])
            return np.concatenate(parts)
        if len(order):
            return np.concatenate([np.arange(self.offsets[s], self.offsets[s + 1], dtype=np.int64)
                                   for s in order])
        return np.zeros(0, np.int64)

    def global_order(self, epoch: int | None = None) -> np.ndarray:
        """All ranks' samples in rank order: the sequence (less what was consumed), padded or cut."""
        end = self._rem.size if self.mode == "exact" else self.per_rank * self.world_size
        return self.sequence(epoch)[self._rem.array(0, end)]

    def rank_positions(self) -> np.ndarray:
        """Positions in :meth:`sequence` of this rank's run (before the worker split)."""
        return self._rem.array(self._start, self._start + self.per_rank)

    def rank_indices(self, epoch: int | None = None) -> np.ndarray:
        """This rank's contiguous run of the sequence (before the worker split)."""
        return self.sequence(epoch)[self.rank_positions()]

    def _worker_bounds(self) -> np.ndarray:
        import numpy as np

        nb = -(-self.per_rank // self.batch_size)
        w = self.num_workers
        cuts = [(nb * k // w) * self.batch_size for k in range(w + 1)]
        return np.minimum(np.asarray(cuts, np.int64), self.per_rank)

    def _worker_part(self, worker_id: int, e: int, rank_pos: np.ndarray) -> np.ndarray:
        import numpy as np

        if not 0 <= worker_id < self.num_workers:
            raise ConfigError(f"worker_id {worker_id} is not in [0, {self.num_workers})")
        b = self._worker_bounds()
        part = rank_pos[b[worker_id]:b[worker_id + 1]].copy()
        if self.shuffle and len(part) > 1 and self.window > 1:
            rng = np.random.default_rng([self.seed, e, self.rank, worker_id])
            for start in range(0, len(part), self.window):
                block = part[start:start + self.window]
                block[:] = block[rng.permutation(len(block))]
        return part

    def worker_indices(self, worker_id: int, epoch: int | None = None,
                       _rank_seq: np.ndarray | None = None) -> np.ndarray:
        """The part of this rank's samples that DataLoader worker ``worker_id`` owns, in order."""
        e = self.epoch if epoch is None else epoch
        if _rank_seq is not None:
            return self._worker_part(worker_id, e, _rank_seq)
        return self.sequence(e)[self._worker_part(worker_id, e, self.rank_positions())]

    def epoch_positions(self, epoch: int | None = None) -> np.ndarray:
        """Positions in :meth:`sequence` of this rank's epoch, in the order ``__iter__`` yields them."""
        return self._rem.positions(self.epoch_items(epoch))

    def epoch_items(self, epoch: int | None = None) -> np.ndarray:
        """Items of the remainder (past its size: pad repeats) of this rank's epoch, in yield order."""
        import numpy as np

        e = self.epoch if epoch is None else epoch
        if self._items is not None and self._items[0] == e:
            return self._items[1]
        pos = np.arange(self._start, self._start + self.per_rank, dtype=np.int64)
        parts = [self._worker_part(w, e, pos) for w in range(self.num_workers)]
        if self.num_workers == 1:
            items = parts[0]
        else:
            bs = self.batch_size
            batches = [[p[j:j + bs] for j in range(0, len(p), bs)] for p in parts]
            out: list[np.ndarray] = []
            for j in range(max((len(b) for b in batches), default=0)):
                out.extend(b[j] for b in batches if j < len(b))
            items = np.concatenate(out) if out else np.zeros(0, np.int64)
        self._items = (e, items)
        return items

    def epoch_indices(self, epoch: int | None = None) -> np.ndarray:
        """This rank's full epoch order as ``__iter__`` yields it (no resume skip)."""
        return self.sequence(epoch)[self.epoch_positions(epoch)]

    def _pass(self) -> tuple[np.ndarray, int]:
        if self._complete:  # the last pass ended: this one reads the whole epoch again
            self._complete = False
            self._digests.carried = None
            self._set_done(())
        idx = self.epoch_indices()
        skip, self._skip = self._skip, 0
        self._yielded = skip
        return idx, skip

    def _finish(self) -> None:
        # a whole pass done: the next pass of this epoch (and the next epoch) is complete again; the
        # reset waits for that pass, so state_dict() after this one still describes it
        self._complete = True

    def __iter__(self) -> Iterator[int]:
        idx, skip = self._pass()
        for i in idx[skip:].tolist():
            self._yielded += 1
            yield i
        self._finish()

    def batches(self) -> Iterator[np.ndarray]:
        """The same order as ``__iter__``, as arrays of ``batch_size`` indices (last may be short)."""
        idx, skip = self._pass()
        for start in range(skip, len(idx), self.batch_size):
            b = idx[start:start + self.batch_size]
            self._yielded += len(b)
            yield b
        self._finish()

    # -- resume -----------------------------------------------------------------
    def _data_fingerprint(self) -> str:
        """The epoch sequences: shards, weights, seed and shuffle (not rank, world or workers)."""
        return self._data_fp

    def _fingerprint(self) -> str:
        """Everything that fixes this rank's order: the data and the split's settings."""
        return self._settings_fp

    def _hash_data(self) -> str:
        h = hashlib.sha256(self.shard_sizes.tobytes())
        h.update(repr((self.shuffle, self.seed)).encode())
        if self.repeats is not None:
            h.update(b"repeats")
            h.update(self.repeats.tobytes())
        return h.hexdigest()[:16]

    def _hash_settings(self) -> str:
        h = hashlib.sha256(self.shard_sizes.tobytes())
        h.update(repr((self.world_size, self.rank, self.num_workers, self.batch_size,
                       self.shuffle, self.seed, self.window, self.uneven)).encode())
        if self.repeats is not None:
            h.update(b"repeats")
            h.update(self.repeats.tobytes())
        return h.hexdigest()[:16]

    def order_digest(self, epoch: int | None = None) -> str:
        """The epoch's order digest (:func:`warpdata.partition.digest.order_digest`)."""
        e = self.epoch if epoch is None else int(epoch)
        return self._digests.order_digest(self.content, e, self.sequence(e))

    def tally(self, consumed: int) -> Tally:
        """The digests of the first ``consumed`` samples of this rank's epoch (and what it carries)."""
        return Tally.of(self.digest_fields(consumed))

    def digest_fields(self, consumed: int) -> dict[str, Any]:
        """The digest fields of a state after the first ``consumed`` samples of this rank's epoch: a row of
        prefix sums over the epoch's keys (made a chunk at a time, :meth:`Ledger.prefix_lanes`)."""
        dropped = self.per_rank * self.world_size if self.mode == "drop" and self.rank == 0 else None
        return self._digests.fields(self.content, self.epoch, self.sequence(), self._rem, self.epoch_items(),
                                    consumed, dropped)

    def state_dict(self, consumed: int | None = None) -> dict[str, Any]:
        """JSON-able resume state; ``consumed`` = samples used so far this epoch."""
        n = int(self._yielded if consumed is None else consumed)
        if not 0 <= n <= self.per_rank:
            raise ConfigError(f"consumed={n} is not in [0, {self.per_rank}] (this rank's samples this epoch)",
                              hint="pass the number of samples the training loop used this epoch")
        return {"epoch": self.epoch, "consumed": n,
                "fingerprint": self._fingerprint(), "data": self._data_fingerprint(),
                "rank": self.rank, "world_size": self.world_size, "num_workers": self.num_workers,
                "batch_size": self.batch_size, "window": self.window, "mode": self.mode,
                "done": [list(x) for x in self._rem.done], "seed": self.seed, "shuffle": self.shuffle,
                **self.digest_fields(n)}

    def _twin(self, state: dict[str, Any]) -> ShardAwareSampler:
        """The sampler of the rank that saved ``state`` (its world, workers, batch size, window, mode and done
        positions; this sampler's data, seed and epoch sequence), positioned at the state's epoch."""
        where = "sampler resume"
        for k in ("num_workers", "window"):
            if k not in state:
                raise bad(where, k, None, "every field state_dict() saves is expected")
        done = tuple(map(tuple, state.get("done", ())))
        check_done(where, done, self.num_samples_total)
        twin = ShardAwareSampler(
            self.shard_sizes.tolist(), rank=state["rank"], world_size=state["world_size"],
            num_workers=state["num_workers"], batch_size=state["batch_size"], shuffle=self.shuffle,
            seed=self.seed, window=state["window"], drop_last=state["mode"] == "drop",
            pad=state["mode"] == "pad", repeats=self.repeats, content=self.content)
        e = twin.epoch = int(state["epoch"])
        twin._sequences = {e: self.sequence(e)}  # the same data, seed and shuffle: the same sequence, made once
        twin._digests._order = self._digests._order
        twin._set_done(done)
        return twin

    def _verify(self, state: dict[str, Any]) -> None:
        """The state's digests, counts and what it carries agree with the samples it says it consumed: the
        first ``consumed`` of its rank's epoch (in the order its workers yield them), recomputed by its twin
        (:meth:`_twin`) and compared field by field (docs/partitioning.md, "Resume")."""
        where = "sampler resume"
        twin = self._twin(state)
        consumed = state["consumed"]
        if consumed > twin.per_rank:
            raise bad(where, "consumed", consumed, f"rank {twin.rank} of {twin.world_size} has {twin.per_rank} "
                                                   "samples this epoch")
        twin._digests.carried = carried_of(state)
        compare(where, state, twin.digest_fields(consumed), "consumed samples")
        seq = twin.sequence()
        check_carried(where, state.get("carried"), twin.rank == 0, twin._rem.done,
                      lambda: digest_of(sample_keys(self.content), seq[twin._rem.done_positions()]).hex())

    def _consumed_positions(self, state: dict[str, Any]) -> tuple[tuple[int, int], ...]:
        """Positions of the sequence consumed by the rank that saved ``state`` (its done ones too)."""
        twin = self._twin(state)
        consumed = int(state["consumed"])
        if not 0 <= consumed <= twin.per_rank:
            raise ConfigError(f"sampler state of rank {twin.rank} consumed={consumed} is not in [0, {twin.per_rank}]")
        items = twin.epoch_items()[:consumed]
        # a pad repeat (an item past the order's end) does not consume the sample it repeats
        pos = twin._rem.positions(items[items < twin._rem.size])
        return tuple(twin._rem.done) + intervals_of_array(pos)

    def load_state_dict(self, state: dict[str, Any] | Sequence[dict[str, Any]]) -> None:
        """Resume from this rank's own state, or from the list of every rank's states of a run.

        A list (one state per rank of the old run) may come from another world
        size, worker count, batch size, window or split mode: what those ranks
        consumed is taken out of the epoch and the rest is split over this run.
        """
        where = "sampler resume"
        if isinstance(state, (list, tuple)):
            states = [check_dict_state(where, st) for st in state]
            if len(states) == 1 and states[0].get("fingerprint") == self._fingerprint():
                return self.load_state_dict(states[0])
            return self._load_elastic(states)
        check_dict_state(where, state)
        if state.get("fingerprint") != self._fingerprint():
            if "data" in state and state["world_size"] == 1:
                return self._load_elastic([state])
            raise ConfigError("sampler state was saved with different shards or settings",
                              hint="resume with the same data, world size, workers, batch size, seed and window, "
                                   "or pass the list of the states of every rank of the old run")
        done = tuple(map(tuple, state.get("done", ())))
        check_done(where, done, self.num_samples_total)
        consumed = int(state["consumed"])
        per_rank = rank_span(Remainder(self.num_samples_total, done).size, self.rank, self.world_size, self.mode,
                             self.batch_size)[1]
        if not 0 <= consumed <= per_rank:
            raise ConfigError(f"sampler state consumed={consumed} is not in [0, {per_rank}]")
        self._check_states([state])
        self._set_done(done)
        self.epoch = int(state["epoch"])
        self._skip = consumed
        self._yielded = consumed
        self._complete = False
        self._digests.resumed([state], own=True, rank=self.rank)
        self.resumed_elsewhere = False

    def _load_elastic(self, states: list[dict[str, Any]]) -> None:
        if not states:
            raise ConfigError("no sampler states to resume from", hint="pass the state_dict() of every rank")
        for st in states:
            if st.get("data") != self._data_fingerprint():
                raise ConfigError("sampler state was saved with different shards, weights, seed or shuffle",
                                  hint="resume with the same data, seed and shuffle")
        epochs = {int(st["epoch"]) for st in states}
        if len(epochs) != 1:
            raise ConfigError(f"sampler states come from different epochs {sorted(epochs)}",
                              hint="pass the states every rank saved at one step")
        check_all_ranks("sampler resume", [(int(st["rank"]), int(st["world_size"])) for st in states])
        modes = sorted({str(st.get("mode")) for st in states} | {self.mode})
        if len(modes) > 1:
            raise ResumeMismatchError(f"sampler resume: the states' split mode and this sampler's differ {modes}",
                                      hint="resume with the drop_last / pad of the run that saved the states")
        self._check_states(states)
        done: list[tuple[int, int]] = []
        for st in states:
            done.extend(self._consumed_positions(st))
        self.epoch = epochs.pop()
        self._set_done(done)
        self._skip = self._yielded = 0
        self._complete = False
        # rank 0 carries what the old run consumed, so the final states sum to the epoch's digest
        self._digests.resumed(states, own=False, rank=self.rank)
        self.resumed_elsewhere = True  # this run splits what the old run's ranks left

    def _check_states(self, states: list[dict[str, Any]]) -> None:
        """Refuse states of another artifact, epoch order, or (after ``set_epoch``) epoch."""
        epochs = sorted({int(st["epoch"]) for st in states})
        if self._epoch_pinned and epochs != [self.epoch]:
            raise ResumeMismatchError(f"sampler resume: the state is for epoch {epochs[0]}, this sampler was set "
                                      f"to epoch {self.epoch}",
                                      hint="call set_epoch() with the state's epoch, or load the state first")
        self._digests.check("sampler resume", states, self.content, epochs[0], self.sequence(epochs[0]))
        for st in states:
            self._verify(st)


class BatchIndices:
    """A :class:`ShardAwareSampler`'s batches as lists of indices: a DataLoader's ``sampler=`` with
    ``batch_size=None`` (one dataset call a batch), with the sampler's ``set_epoch`` and resume state."""

    def __init__(self, inner: ShardAwareSampler) -> None:
        self.inner = inner

    def __iter__(self) -> Iterator[list[int]]:
        for b in self.inner.batches():
            yield b.tolist()

    def __len__(self) -> int:
        return -(-len(self.inner) // self.inner.batch_size)

    def set_epoch(self, epoch: int) -> None:
        self.inner.set_epoch(epoch)

    def state_dict(self, consumed: int | None = None) -> dict[str, Any]:
        return self.inner.state_dict(consumed)

    def load_state_dict(self, state: dict[str, Any] | Sequence[dict[str, Any]]) -> None:
        self.inner.load_state_dict(state)


def torch_sampler(sampler: ShardAwareSampler):
    """Wrap as a ``torch.utils.data.Sampler`` (same iteration, len, set_epoch, state)."""
    from torch.utils.data import Sampler

    class _TorchShardSampler(Sampler[int]):
        def __init__(self, inner: ShardAwareSampler) -> None:
            self.inner = inner

        def __iter__(self):
            return iter(self.inner)

        def __len__(self) -> int:
            return len(self.inner)

        def set_epoch(self, epoch: int) -> None:
            self.inner.set_epoch(epoch)

        def state_dict(self, consumed: int | None = None):
            return self.inner.state_dict(consumed)

        def load_state_dict(self, state) -> None:
            self.inner.load_state_dict(state)

    return _TorchShardSampler(sampler)
