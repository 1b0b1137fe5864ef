"""ShardAwareSampler: DistributedSampler's contract with shard locality."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from warpdata.core.errors import ConfigError, UsageError
from warpdata.partition.sampler import ShardAwareSampler, torch_sampler
from warpdata.partition.world import ShardingError

shard_lists = st.lists(st.integers(0, 40), min_size=0, max_size=12)


def _all_ranks(sizes, world, **kw):
    return [ShardAwareSampler(sizes, world_size=world, rank=r, **kw) for r in range(world)]


@given(sizes=shard_lists, world=st.integers(1, 5), workers=st.integers(1, 4),
       batch=st.integers(1, 7), window=st.integers(1, 50), seed=st.integers(0, 2**31),
       epoch=st.integers(0, 5), shuffle=st.booleans())
def test_drop_last_yields_full_batches_equal_per_rank_each_sample_at_most_once(sizes, world, workers, batch,
                                                                               window, seed, epoch, shuffle):
    n = sum(sizes)
    if 0 < n < world * batch:
        with pytest.raises(ShardingError, match="no batch"):
            _all_ranks(sizes, world, batch_size=batch, drop_last=True)
        return
    samplers = _all_ranks(sizes, world, num_workers=workers, batch_size=batch, window=window,
                          seed=seed, shuffle=shuffle, drop_last=True)
    seen = []
    for s in samplers:
        s.set_epoch(epoch)
        got = list(s)
        assert len(got) == len(s) == n // (world * batch) * batch
        assert all(len(b) == batch for b in s.batches())
        seen.extend(got)
    assert len(seen) == len(set(seen)) == n // (world * batch) * batch * world
    assert set(seen) <= set(range(n))


@given(sizes=shard_lists, world=st.integers(1, 5), workers=st.integers(1, 4),
       batch=st.integers(1, 7), window=st.integers(1, 50), seed=st.integers(0, 2**31), shuffle=st.booleans())
def test_default_covers_every_sample_exactly_once(sizes, world, workers, batch, window, seed, shuffle):
    n = sum(sizes)
    samplers = _all_ranks(sizes, world, num_workers=workers, batch_size=batch, window=window,
                          seed=seed, shuffle=shuffle)
    lens = [len(s) for s in samplers]
    assert max(lens) - min(lens) <= 1
    seen = [i for s in samplers for i in s]
    assert sorted(seen) == list(range(n))


@given(sizes=shard_lists, world=st.integers(1, 5), workers=st.integers(1, 4),
       batch=st.integers(1, 7), window=st.integers(1, 50), seed=st.integers(0, 2**31),
       shuffle=st.booleans())
def test_pad_covers_every_sample_exactly_once_plus_padding(sizes, world, workers, batch, window,
                                                           seed, shuffle):
    n = sum(sizes)
    samplers = _all_ranks(sizes, world, num_workers=workers, batch_size=batch, window=window,
                          seed=seed, shuffle=shuffle, pad=True)
    lens = {len(s) for s in samplers}
    assert len(lens) == 1
    seen = [i for s in samplers for i in s]
    assert len(seen) == (-(-n // world) * world if n else 0)
    counts = np.bincount(np.asarray(seen, np.int64), minlength=n) if n else np.zeros(0)
    assert (counts >= 1).all()
    # padding repeats samples only as needed (DistributedSampler semantics)
    assert int(counts.sum()) - n == len(seen) - n
    if n >= world:
        assert counts.max() <= 2


@given(sizes=st.lists(st.integers(1, 30), min_size=1, max_size=10), workers=st.integers(1, 4),
       batch=st.integers(1, 6), seed=st.integers(0, 1000))
def test_worker_parts_partition_the_rank_and_interleave_batchwise(sizes, workers, batch, seed):
    s = ShardAwareSampler(sizes, num_workers=workers, batch_size=batch, seed=seed, window=7)
    parts = [s.worker_indices(w) for w in range(workers)]
    assert sorted(np.concatenate(parts).tolist()) == sorted(s.rank_indices().tolist())
    # overall batch j*W + w comes from worker w, as DataLoader assigns them
    flat = s.epoch_indices()
    batches = [flat[i:i + batch] for i in range(0, len(flat), batch)]
    pos = [0] * workers
    w = 0
    for b in batches:
        while pos[w] >= len(parts[w]):
            w = (w + 1) % workers
        exp = parts[w][pos[w]:pos[w] + batch]
        assert b.tolist() == exp.tolist()
        pos[w] += len(exp)
        w = (w + 1) % workers


def test_window_shuffle_keeps_shard_locality():
    sizes = [100] * 20
    s = ShardAwareSampler(sizes, seed=3, window=50)
    idx = s.epoch_indices()
    shards = idx // 100
    # every window of 50 consecutive samples touches at most 2 shards
    for start in range(0, len(idx), 50):
        assert len(set(shards[start:start + 50].tolist())) <= 2
    # and the order really is shuffled
    assert idx.tolist() != sorted(idx.tolist())


def test_epochs_and_seeds_change_order_deterministically():
    sizes = [10] * 8
    a = ShardAwareSampler(sizes, seed=1)
    b = ShardAwareSampler(sizes, seed=1)
    assert list(a) == list(b)
    first = list(a)
    a.set_epoch(1)
    assert list(a) != first
    assert sorted(list(a)) == sorted(first)
    assert list(ShardAwareSampler(sizes, seed=2)) != first
    assert list(ShardAwareSampler(sizes, shuffle=False)) == list(range(80))


@given(sizes=st.lists(st.integers(1, 25), min_size=1, max_size=8), world=st.integers(1, 3),
       workers=st.integers(1, 3), batch=st.integers(1, 5), data=st.data())
def test_resume_mid_epoch_yields_exactly_the_rest(sizes, world, workers, batch, data):
    kw = dict(world_size=world, num_workers=workers, batch_size=batch, seed=7, window=9)
    rank = data.draw(st.integers(0, world - 1))
    full = list(ShardAwareSampler(sizes, rank=rank, **kw))
    k = data.draw(st.integers(0, len(full)))
    s = ShardAwareSampler(sizes, rank=rank, **kw)
    s.set_epoch(0)
    it = iter(s)
    head = [next(it) for _ in range(k)]
    state = json.loads(json.dumps(s.state_dict()))
    fresh = ShardAwareSampler(sizes, rank=rank, **kw)
    fresh.load_state_dict(state)
    assert head + list(fresh) == full
    # the skip applies once: the next epoch is whole again
    assert len(list(fresh)) == len(full)


def test_batches_match_iteration_and_resume():
    s = ShardAwareSampler([13, 7, 22], batch_size=4, num_workers=2, seed=5)
    flat = list(s)
    bs = list(s.batches())
    assert np.concatenate(bs).tolist() == flat
    r = ShardAwareSampler([13, 7, 22], batch_size=4, num_workers=2, seed=5)
    r.load_state_dict(s.state_dict(consumed=8))
    assert np.concatenate(list(r.batches())).tolist() == flat[8:]


def test_state_fingerprints_are_hashed_once_and_unchanged(monkeypatch):
    """state_dict() reads the two fingerprints hashed when the sampler is made (a state saved every step
    hashes nothing again), and they are the hashes earlier releases wrote: SHA-256 of the shard sizes, a
    repr of the settings and the weights, so states saved before still load."""
    import hashlib

    sizes, rep = [13, 7, 22], np.arange(42) % 3 + 1
    kw = dict(world_size=2, num_workers=2, batch_size=4, seed=5, window=8, pad=True, repeats=rep)
    s, twin = ShardAwareSampler(sizes, rank=1, **kw), ShardAwareSampler(sizes, rank=1, **kw)
    s.set_epoch(3)
    first = s.state_dict(consumed=0)  # the epoch's sequence and order digest made once

    def expect(*settings):
        h = hashlib.sha256(np.asarray(sizes, np.int64).tobytes())
        h.update(repr(settings).encode())
        h.update(b"repeats")
        h.update(rep.astype(np.int64).tobytes())
        return h.hexdigest()[:16]

    assert first["data"] == expect(True, 5) and s.content == f"sampler:{first['data']}"
    assert first["fingerprint"] == expect(2, 1, 2, 4, True, 5, 8, "pad")
    calls, real = [], hashlib.sha256
    monkeypatch.setattr(hashlib, "sha256", lambda *a: calls.append(a) or real(*a))
    states = [s.state_dict(consumed=n) for n in range(0, len(s) + 1, 5)]
    assert not calls, f"{len(calls)} SHA-256 computations in {len(states)} states"
    assert {(st["fingerprint"], st["data"]) for st in states} == {(first["fingerprint"], first["data"])}
    monkeypatch.undo()
    twin.load_state_dict(states[2])
    assert list(twin) == s.epoch_indices()[10:].tolist()


def test_bad_settings_and_mismatched_state_are_typed_errors():
    with pytest.raises(ShardingError, match="rank 2 is not in"):
        ShardAwareSampler([3], world_size=2, rank=2)
    with pytest.raises(ShardingError, match="opposite"):
        ShardAwareSampler([3], drop_last=True, pad=True)
    with pytest.raises(ConfigError):
        ShardAwareSampler([-1])
    a = ShardAwareSampler([3, 4], seed=1)
    with pytest.raises(ConfigError, match="different shards"):
        ShardAwareSampler([3, 5], seed=1).load_state_dict(a.state_dict())
    with pytest.raises(ConfigError):
        ShardAwareSampler([3, 4], seed=1).load_state_dict({**a.state_dict(), "consumed": 99})


def test_torch_dataloader_with_workers_covers_the_rank():
    torch = pytest.importorskip("torch")
    from torch.utils.data import DataLoader, Dataset

    class Ids(Dataset):
        def __len__(self):
            return 60

        def __getitem__(self, i):
            return torch.tensor(i)

    inner = ShardAwareSampler([20, 25, 15], world_size=2, rank=1, num_workers=2, batch_size=4, seed=0)
    sampler = torch_sampler(inner)
    dl = DataLoader(Ids(), batch_size=4, sampler=sampler, num_workers=2)
    got = torch.cat(list(dl)).tolist()
    assert got == list(inner)
    assert len(got) == len(sampler) == 30
    sampler.set_epoch(1)
    assert inner.epoch == 1


def test_old_keywords_warn_and_map():
    with pytest.warns(DeprecationWarning, match="num_replicas"):
        s = ShardAwareSampler([5, 6], num_replicas=2, rank=1)
    assert (s.world_size, s.num_replicas) == (2, 2)
    with pytest.warns(DeprecationWarning, match="uneven"):
        assert ShardAwareSampler([5, 6], rank=0, world_size=2, uneven="pad").pad
    with pytest.warns(DeprecationWarning, match="uneven"):
        assert ShardAwareSampler([5, 6], rank=0, world_size=2, uneven="drop").drop_last
    with pytest.raises(UsageError, match="not both"):
        ShardAwareSampler([5, 6], rank=0, world_size=2, num_replicas=2)
    with pytest.raises(UsageError, match="not both"):
        ShardAwareSampler([5, 6], rank=0, world_size=2, pad=True, uneven="drop")


@given(sizes=st.lists(st.integers(0, 25), min_size=1, max_size=8), w1=st.integers(1, 3), w2=st.integers(1, 4),
       workers1=st.integers(1, 3), workers2=st.integers(1, 3), batch=st.integers(1, 5),
       reps=st.booleans(), data=st.data())
def test_resume_at_another_world_size_covers_the_rest_exactly_once(sizes, w1, w2, workers1, workers2, batch,
                                                                   reps, data):
    n = sum(sizes)
    repeats = np.arange(n) % 3 + 1 if reps else None
    weights = repeats if reps else np.ones(n, np.int64)
    seen: list[int] = []
    states = []
    for r in range(w1):
        s = ShardAwareSampler(sizes, rank=r, world_size=w1, num_workers=workers1, batch_size=batch, seed=4,
                              window=5, repeats=repeats)
        s.set_epoch(2)
        order = list(s)
        k = data.draw(st.integers(0, len(order)))
        seen += order[:k]
        states.append(json.loads(json.dumps(s.state_dict(consumed=k))))
    for r in range(w2):
        s = ShardAwareSampler(sizes, rank=r, world_size=w2, num_workers=workers2, batch_size=batch, seed=4,
                              window=3, repeats=repeats)
        s.load_state_dict(states)
        assert s.epoch == 2
        seen += list(s)
        assert len(list(s)) == len(ShardAwareSampler(sizes, rank=r, world_size=w2, repeats=repeats))  # next pass whole
    assert np.bincount(np.asarray(seen, np.int64), minlength=n).tolist() == list(weights)
    with pytest.raises(ShardingError, match="all"):
        if w1 > 1:
            ShardAwareSampler(sizes, rank=0, world_size=w2, seed=4, repeats=repeats).load_state_dict(states[1:])
        else:
            raise ShardingError("all (nothing to check with one rank)")
