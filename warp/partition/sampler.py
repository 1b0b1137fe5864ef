"""A shard-aware distributed sampler (pure numpy; torch optional).

Samples live in shards (``shard_sizes[i]`` samples in shard ``i``; global
index = shard offset + position). A plain global permutation makes every
reader touch every shard all the time, which collapses shard caches
(docs/design.md §4: 10.6 samples/s vs 350–640 shard-aware). This sampler keeps
locality while giving DistributedSampler's contract:

1. Each epoch the shard order is permuted with ``rng(seed, epoch)`` (the same
   on every rank) and the shards' samples are concatenated in that order.
2. ``uneven="pad"`` (the default, as in DistributedSampler) repeats samples from the start of that sequence until its
   length is a multiple of ``num_replicas``; ``"drop"`` cuts the tail. Rank
   ``r`` takes the ``r``-th contiguous slice, so every rank yields exactly
   ``len(sampler)`` samples (ceil or floor of N / num_replicas), every sample
   is yielded by exactly one rank per epoch (``pad``: the padding repeats the
   first samples once more; ``drop``: the dropped ones by none), and a rank
   touches about ``num_shards / num_replicas + 1`` shards.
3. A rank's slice is cut into ``num_workers`` contiguous parts at batch
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
reads one shard. Every count above (length, padding, rank slices, worker parts)
is over these weighted samples, so ranks keep equal step counts. Without
``repeats`` (or with all ones) the order is exactly the unweighted one.

``set_epoch`` changes the permutation; ``state_dict(consumed=)`` and
``load_state_dict`` resume mid-epoch: the next ``__iter__`` skips the samples
already consumed (pass ``consumed`` = samples the training loop has actually
used; by default the count this sampler has yielded, which includes
DataLoader prefetch). The same seed, epoch and settings give the same order
on any machine.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

from warpdata.core.errors import ConfigError

if TYPE_CHECKING:
    import numpy as np

UNEVEN_POLICIES = ("pad", "drop")


def _dist_defaults(num_replicas: int | None, rank: int | None) -> tuple[int, int]:
    """torch.distributed's world size / rank when it is initialised, else 1 / 0."""
    if num_replicas is not None and rank is not None:
        return num_replicas, rank
    import sys

    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        return (num_replicas if num_replicas is not None else dist.get_world_size(),
                rank if rank is not None else dist.get_rank())
    return (1 if num_replicas is None else num_replicas), (0 if rank is None else rank)


class ShardAwareSampler:
    """Per-rank sample order over sharded data; see the module docstring.

    ``uneven`` defaults to ``"pad"``: when the samples do not split evenly the
    last ranks repeat samples from the start, so over all ranks an epoch yields
    up to ``num_replicas - 1`` samples twice. ``"drop"`` skips the tail instead.
    """

    def __init__(self, shard_sizes: Sequence[int], *, num_replicas: int | None = None,
                 rank: int | None = None, num_workers: int = 1, batch_size: int = 1,
                 shuffle: bool = True, seed: int = 0, window: int = 1024,
                 uneven: str = "pad", repeats: Sequence[int] | np.ndarray | None = None) -> None:
        import numpy as np

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
        num_replicas, rank = _dist_defaults(num_replicas, rank)
        if num_replicas < 1 or not 0 <= rank < num_replicas:
            raise ConfigError(f"rank {rank} is not in [0, num_replicas={num_replicas})")
        if num_workers < 1 or batch_size < 1 or window < 1:
            raise ConfigError("num_workers, batch_size and window must be >= 1")
        if uneven not in UNEVEN_POLICIES:
            raise ConfigError(f"uneven must be one of {UNEVEN_POLICIES}, got {uneven!r}",
                              hint="'pad' repeats samples like DistributedSampler; 'drop' drops the tail")
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
        self.num_replicas, self.rank = int(num_replicas), int(rank)
        self.num_workers, self.batch_size = int(num_workers), int(batch_size)
        self.shuffle, self.seed, self.window, self.uneven = bool(shuffle), int(seed), int(window), uneven
        self.epoch = 0
        self._skip = 0  # samples to skip at the next __iter__ (mid-epoch resume)
        self._yielded = 0
        n, r = self.num_samples_total, self.num_replicas
        if uneven == "pad" and n > 0:
            self.per_rank = -(-n // r)
        else:
            self.per_rank = n // r

    def __len__(self) -> int:
        return self.per_rank

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)

    def shard_order(self, epoch: int | None = None) -> np.ndarray:
        """Shard ids in this epoch's order (with ``repeats``: ids into the shard copies)."""
        import numpy as np

        e = self.epoch if epoch is None else epoch
        n = len(self.shard_sizes) if self._copies is None else len(self._copies)
        if not self.shuffle:
            return np.arange(n, dtype=np.int64)
        return np.random.default_rng([self.seed, e]).permutation(n).astype(np.int64)

    def global_order(self, epoch: int | None = None) -> np.ndarray:
        """All samples in shard-permuted order, padded or cut to ``per_rank * num_replicas``."""
        import numpy as np

        order = self.shard_order(epoch)
        if len(order) and self._copies is not None:
            parts = []
            for c in order:
                s, k = self._copies[c]
                idx = np.arange(self.offsets[s], self.offsets[s + 1], dtype=np.int64)
                parts.append(idx[self.repeats[idx] > k])
            seq = np.concatenate(parts)
        elif len(order):
            seq = np.concatenate([np.arange(self.offsets[s], self.offsets[s + 1], dtype=np.int64)
                                  for s in order])
        else:
            seq = np.zeros(0, np.int64)
        want = self.per_rank * self.num_replicas
        if want > len(seq):
            reps = -(-want // max(len(seq), 1))
            seq = np.tile(seq, reps)
        return seq[:want]

    def rank_indices(self, epoch: int | None = None) -> np.ndarray:
        """This rank's contiguous slice of :meth:`global_order` (before worker split)."""
        seq = self.global_order(epoch)
        return seq[self.rank * self.per_rank:(self.rank + 1) * self.per_rank]

    def _worker_bounds(self) -> np.ndarray:
        import numpy as np

        nb = -(-self.per_rank // self.batch_size)
        w = self.num_workers
        cuts = [(nb * k // w) * self.batch_size for k in range(w + 1)]
        return np.minimum(np.asarray(cuts, np.int64), self.per_rank)

    def worker_indices(self, worker_id: int, epoch: int | None = None,
                       _rank_seq: np.ndarray | None = None) -> np.ndarray:
        """The part of this rank's samples that DataLoader worker ``worker_id`` owns, in order."""
        import numpy as np

        if not 0 <= worker_id < self.num_workers:
            raise ConfigError(f"worker_id {worker_id} is not in [0, {self.num_workers})")
        e = self.epoch if epoch is None else epoch
        seq = self.rank_indices(e) if _rank_seq is None else _rank_seq
        b = self._worker_bounds()
        part = seq[b[worker_id]:b[worker_id + 1]].copy()
        if self.shuffle and len(part) > 1 and self.window > 1:
            rng = np.random.default_rng([self.seed, e, self.rank, worker_id])
            for start in range(0, len(part), self.window):
                block = part[start:start + self.window]
                block[:] = block[rng.permutation(len(block))]
        return part

    def epoch_indices(self, epoch: int | None = None) -> np.ndarray:
        """This rank's full epoch order as ``__iter__`` yields it (no resume skip)."""
        import numpy as np

        e = self.epoch if epoch is None else epoch
        seq = self.rank_indices(e)
        parts = [self.worker_indices(w, e, seq) for w in range(self.num_workers)]
        if self.num_workers == 1:
            return parts[0]
        bs = self.batch_size
        batches = [[p[j:j + bs] for j in range(0, len(p), bs)] for p in parts]
        out: list[np.ndarray] = []
        for j in range(max((len(b) for b in batches), default=0)):
            out.extend(b[j] for b in batches if j < len(b))
        return np.concatenate(out) if out else np.zeros(0, np.int64)

    def __iter__(self) -> Iterator[int]:
        idx = self.epoch_indices()
        skip, self._skip = self._skip, 0
        self._yielded = skip
        for i in idx[skip:].tolist():
            self._yielded += 1
            yield i

    def batches(self) -> Iterator[np.ndarray]:
        """The same order as ``__iter__``, as arrays of ``batch_size`` indices (last may be short)."""
        idx = self.epoch_indices()
        skip, self._skip = self._skip, 0
        self._yielded = skip
        for start in range(skip, len(idx), self.batch_size):
            b = idx[start:start + self.batch_size]
            self._yielded += len(b)
            yield b

    def _fingerprint(self) -> str:
        h = hashlib.sha256(self.shard_sizes.tobytes())
        h.update(repr((self.num_replicas, self.rank, self.num_workers, self.batch_size,
                       self.shuffle, self.seed, self.window, self.uneven)).encode())
        if self.repeats is not None:
            h.update(b"repeats")
            h.update(self.repeats.tobytes())
        return h.hexdigest()[:16]

    def state_dict(self, consumed: int | None = None) -> dict[str, Any]:
        """JSON-able resume state; ``consumed`` = samples used so far this epoch."""
        return {"epoch": self.epoch, "consumed": int(self._yielded if consumed is None else consumed),
                "fingerprint": self._fingerprint()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("fingerprint") != self._fingerprint():
            raise ConfigError("sampler state was saved with different shards or settings",
                              hint="resume with the same data, world size, workers, batch size, seed and window")
        consumed = int(state["consumed"])
        if not 0 <= consumed <= self.per_rank:
            raise ConfigError(f"sampler state consumed={consumed} is not in [0, {self.per_rank}]")
        self.epoch = int(state["epoch"])
        self._skip = consumed
        self._yielded = consumed


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
