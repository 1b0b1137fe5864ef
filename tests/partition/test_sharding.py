"""Sharding over rank × worker: exact-once, equal batch counts, resume."""

from __future__ import annotations

import copy
import dataclasses
import pickle
from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st
from warpdata.partition.digest import Tally, combine_digests
from warpdata.partition.plan import (
    PendingState,
    ResumeState,
    ShardingError,
    ShardPlan,
    auto_shard,
    merge_intervals,
)


def rows_of(plan: ShardPlan, batches) -> list[tuple[int, int]]:
    """(unit, row) pairs a list of batch indices reads."""
    out = []
    for j in batches:
        for s in plan.batch_slices(j):
            out.extend((s.unit, r) for r in range(s.start, s.stop))
    return out


def all_rows(unit_rows):
    return [(u, r) for u, n in enumerate(unit_rows) for r in range(n)]


unit_rows_st = st.lists(st.integers(min_value=0, max_value=40), min_size=1, max_size=12).filter(lambda x: sum(x) > 0)


@given(unit_rows=unit_rows_st, world=st.integers(1, 6), workers=st.integers(1, 4),
       bs=st.integers(1, 17), policy=st.sampled_from(["pad", "drop"]), shuffle=st.booleans(),
       seed=st.integers(0, 5))
def test_exact_once_and_equal_batches(unit_rows, world, workers, bs, policy, shuffle, seed):
    n = sum(unit_rows)
    if policy == "drop" and n < world * bs:
        with pytest.raises(ShardingError, match="no batch"):
            ShardPlan(unit_rows, rank=0, world=world, batch_size=bs, policy=policy)
        return
    plans = [ShardPlan(unit_rows, rank=r, world=world, batch_size=bs, policy=policy, shuffle=shuffle, seed=seed)
             for r in range(world)]
    assert len({p.num_batches for p in plans}) == 1  # DDP never hangs
    assert len({p.rows_per_rank for p in plans}) == 1
    seen: Counter = Counter()
    for p in plans:
        if p.num_batches < workers:
            with pytest.raises(ShardingError, match="would get no batches"):
                p.worker_batches(workers - 1, workers)
            per_worker = [p.worker_batches(0, 1)]
        else:
            per_worker = [p.worker_batches(w, workers) for w in range(workers)]
        flat = [j for ws in per_worker for j in ws]
        assert sorted(flat) == list(range(p.num_batches))  # workers partition the rank's batches
        assert sum(p.batch_len(j) for j in flat) == p.rows_per_rank
        seen.update(rows_of(p, flat))
    everything = all_rows(unit_rows)
    p0 = plans[0]
    if policy == "pad":
        assert set(seen) == set(everything)
        assert sum(seen.values()) == n + p0.pad_rows
        assert sum(c - 1 for c in seen.values()) == p0.pad_rows
        assert p0.pad_rows < world
    else:
        # drop_last: only full batches, the same tail of the sequence skipped on every rank
        assert all(c == 1 for c in seen.values())
        assert len(seen) == n - p0.dropped_rows and p0.dropped_rows < world * bs
        assert all(p.batch_len(j) == bs for p in plans for j in range(p.num_batches))


@given(unit_rows=unit_rows_st, world=st.integers(1, 3), bs=st.integers(1, 9),
       w1=st.integers(1, 3), w2=st.integers(1, 3), w3=st.integers(1, 3), data=st.data())
def test_resume_twice_with_other_worker_counts(unit_rows, world, bs, w1, w2, w3, data):
    rank = data.draw(st.integers(0, world - 1))
    full = ShardPlan(unit_rows, rank=rank, world=world, batch_size=bs, shuffle=True, seed=7, epoch=2)
    expected = Counter(rows_of(full, range(full.num_batches)))
    got: Counter = Counter()
    plan = full
    for w in (w1, w2, w3):
        left = len(plan.remaining())
        if left == 0:
            break
        w = min(w, left)
        order = plan.yield_order(w)
        k = data.draw(st.integers(0, len(order)))
        got.update(rows_of(plan, order[:k]))
        state = plan.state_after(k, w, manifest="m" * 64, table="main")
        state = ResumeState.from_json(state.to_json())  # travels as tiny JSON
        assert len(state.to_json()) < 700  # its digests (docs/partitioning.md) take about 250 bytes
        plan = ShardPlan.resume(unit_rows, state, manifest="m" * 64, table="main")
    got.update(rows_of(plan, plan.remaining()))
    assert got == expected


def test_yield_order_matches_real_dataloader():
    torch = pytest.importorskip("torch")
    from torch.utils.data import DataLoader, IterableDataset, get_worker_info

    plan = ShardPlan([7, 5, 9, 3, 11], rank=1, world=2, batch_size=2, shuffle=True, seed=3)

    class DS(IterableDataset):
        def __iter__(self):
            info = get_worker_info()
            wid, nw = (info.id, info.num_workers) if info else (0, 1)
            for j in plan.worker_batches(wid, nw):
                yield torch.tensor([j])

    for nw in (0, 2):
        got = [int(b) for b in DataLoader(DS(), batch_size=None, num_workers=nw)]
        assert got == plan.yield_order(max(nw, 1))


def test_resume_refuses_other_run():
    p = ShardPlan([10, 10], rank=0, world=2, batch_size=3)
    s = p.state_after(2, 1, manifest="a" * 64, table="main")
    with pytest.raises(ShardingError, match="manifest"):
        ShardPlan.resume([10, 10], s, manifest="b" * 64)
    with pytest.raises(ShardingError, match="rank"):
        ShardPlan.resume([10, 10], s, rank=1)
    with pytest.raises(ShardingError, match="batches"):
        ShardPlan.resume([10, 30], s)
    with pytest.raises(Exception, match="resume state"):
        ResumeState.from_json("{}")


def test_epoch_state_and_done():
    p = ShardPlan([4], batch_size=2)
    s = p.state_after(2)
    assert s.done and s.next_epoch().epoch == 1 and s.next_epoch().consumed == ()
    assert ShardPlan.resume([4], s).remaining() == []


def test_shuffle_is_deterministic_per_epoch():
    a = ShardPlan(list(range(1, 30)), shuffle=True, seed=1, epoch=0).order
    assert a == ShardPlan(list(range(1, 30)), shuffle=True, seed=1, epoch=0).order
    assert a != ShardPlan(list(range(1, 30)), shuffle=True, seed=1, epoch=1).order
    assert sorted(a) == list(range(29))


def test_bad_arguments():
    for kw in ({"rank": 2, "world": 2}, {"batch_size": 0}, {"policy": "wrap"}):
        with pytest.raises(ShardingError):
            ShardPlan([3], **kw)
    with pytest.raises(ShardingError, match="no rows"):
        ShardPlan([0, 0])


def test_auto_shard():
    assert auto_shard({}) == (0, 1)
    assert auto_shard({"RANK": "3", "WORLD_SIZE": "4"}) == (3, 4)
    with pytest.raises(ShardingError):
        auto_shard({"RANK": "4", "WORLD_SIZE": "4"})
    with pytest.raises(ShardingError):
        auto_shard({"RANK": "x", "WORLD_SIZE": "4"})


def test_merge_intervals():
    assert merge_intervals([(5, 7), (0, 2), (2, 3), (6, 9), (4, 4)]) == ((0, 3), (5, 9))


@given(unit_rows=st.lists(st.integers(0, 40), min_size=1, max_size=8).filter(lambda u: sum(u) > 0),
       world=st.integers(1, 9), bs=st.integers(1, 17), shuffle=st.booleans(), seed=st.integers(0, 5))
def test_exact_policy_reads_every_row_once_and_nothing_else(unit_rows, world, bs, shuffle, seed):
    """policy='exact' (warp stream --shard's default): no padding, no drops."""
    n = sum(unit_rows)
    seen: dict[tuple[int, int], int] = {}
    sizes = []
    for r in range(world):
        p = ShardPlan(unit_rows, rank=r, world=world, batch_size=bs, policy="exact", shuffle=shuffle, seed=seed)
        assert p.pad_rows == 0 and p.dropped_rows == 0
        sizes.append(p.rows_per_rank)
        for j in range(p.num_batches):
            for s in p.batch_slices(j):
                for i in range(s.start, s.stop):
                    seen[(s.unit, i)] = seen.get((s.unit, i), 0) + 1
    assert sum(sizes) == n and max(sizes) - min(sizes) <= 1
    assert len(seen) == n and set(seen.values()) == {1}


def test_pad_policy_repeats_rows_and_says_how_many():
    """500 rows over 8 ranks: pad gives 8 x 63 = 504 rows, 4 of them repeats; exact gives 500."""
    pad = [ShardPlan([500], rank=r, world=8, batch_size=64, policy="pad") for r in range(8)]
    assert sum(p.rows_per_rank for p in pad) == 504 and pad[0].pad_rows == 4
    exact = [ShardPlan([500], rank=r, world=8, batch_size=64, policy="exact") for r in range(8)]
    assert sum(p.rows_per_rank for p in exact) == 500 and exact[0].pad_rows == 0
    assert ShardPlan([3], rank=0, world=8, policy="exact").num_batches == 0  # fewer rows than ranks


@given(unit_rows=unit_rows_st, w1=st.integers(1, 4), w2=st.integers(1, 5), bs=st.integers(1, 7),
       shuffle=st.booleans(), data=st.data())
def test_resume_at_another_world_size_reads_the_rest_exactly_once(unit_rows, w1, w2, bs, shuffle, data):
    """States of every rank of a world-w1 run, merged, resume at world w2: each row once over both runs."""
    seen: Counter = Counter()
    states = []
    for r in range(w1):
        p = ShardPlan(unit_rows, rank=r, world=w1, batch_size=bs, shuffle=shuffle, seed=2, epoch=1)
        k = data.draw(st.integers(0, p.num_batches))
        seen.update(rows_of(p, p.yield_order(1)[:k]))
        states.append(ResumeState.from_json(p.state_after(k, manifest="m", table="t").to_json()))
    merged = ShardPlan.merge_states(unit_rows, states, manifest="m", table="t")
    merged = ResumeState.from_json(merged.to_json())
    assert merged.elastic
    for r in range(w2):
        p = ShardPlan.resume(unit_rows, merged, manifest="m", table="t", rank=r, world=w2)
        seen.update(rows_of(p, p.remaining()))
    assert seen == Counter(all_rows(unit_rows))


def test_merge_states_needs_every_rank():
    states = [ShardPlan([10, 10], rank=r, world=3, batch_size=2).state_after(1) for r in range(3)]
    with pytest.raises(ShardingError, match=r"all 3 ranks.*missing \[1\]"):
        ShardPlan.merge_states([10, 10], [states[0], states[2]])
    with pytest.raises(ShardingError, match="world=3, this run has world=2"):
        ShardPlan.resume([10, 10], states[0], rank=0, world=2)
    merged = ShardPlan.merge_states([10, 10], states)
    with pytest.raises(ShardingError, match="rank and world_size"):
        ShardPlan.resume([10, 10], merged)


def test_states_saved_every_step_equal_states_saved_once():
    """state_after grows its consumed intervals batch by batch; any call order gives the same state."""
    plan = ShardPlan([40, 0, 33, 71, 9], rank=1, world=2, batch_size=4, seed=3, shuffle=True,
                     consumed=((2, 4), (9, 10)))
    for workers in (1, 3):
        n = len(plan.yield_order(workers))
        fresh = [ShardPlan.resume([40, 0, 33, 71, 9], plan.state_after(0, workers)).state_after(k, workers)
                 for k in range(n + 1)]
        assert [plan.state_after(k, workers) for k in range(n + 1)] == fresh  # growing
        assert [plan.state_after(k, workers) for k in (n, 5, 0, n)] == [fresh[n], fresh[5], fresh[0], fresh[n]]
        done = plan.yield_order(workers)
        assert fresh[n].consumed == merge_intervals(list(plan.consumed) + [(j, j + 1) for j in done])


def test_a_saved_state_computes_its_digests_when_read_and_reads_as_an_eager_state():
    """state_after defers the digests (PendingState); every way of reading it gives the eager state's fields."""
    unit_rows = [40, 0, 33, 71, 9]
    plan = ShardPlan(unit_rows, rank=1, world=2, batch_size=4, seed=3, shuffle=True, policy="pad",
                     consumed=((2, 4),))
    content = "m" * 64 + "/main"

    def eager(state):  # the digests computed at once, as a state was built before
        fields = plan.tally(state.consumed, content).fields()
        fields["carried"] = tuple(fields.get("carried", ()))
        keep = {k: getattr(state, k) for k in ("manifest", "table", "seed", "epoch", "rank", "world", "batch_size",
                                                 "policy", "shuffle", "consumed", "num_batches", "done_rows")}
        return ResumeState(**keep, **fields)

    readers = {
        "attribute": lambda s: s.consumed_digest,
        "values": lambda s: s.values(),
        "to_json": lambda s: s.to_json(),
        "==": lambda s: s == s,
        "hash": hash,
        "repr": repr,
        "pickle": lambda s: pickle.loads(pickle.dumps(s)),
        "copy": copy.deepcopy,
        "replace": lambda s: dataclasses.replace(s, epoch=s.epoch),
        "Tally.of": Tally.of,
        "combine_digests": lambda s: combine_digests([s]),
    }
    for k, (name, read) in enumerate(readers.items()):
        state = plan.state_after(k % 5, 2, manifest="m" * 64, table="main")
        assert "consumed_digest" not in vars(state), name  # nothing computed at save time
        nxt = state.next_epoch()  # the next epoch's state needs no digests of this one
        assert "consumed_digest" not in vars(state) and nxt.epoch == 1 and nxt.consumed_digest == "", name
        got = read(state)
        assert vars(state)["consumed_digest"], name  # computed once, on the first read
        want = eager(state)
        assert state.to_json() == want.to_json() and state == want and want == state, name
        assert hash(state) == hash(want) and repr(state) == repr(want), name
        saved = pickle.dumps(state)  # torch.save / all_gather_object: a ResumeState, nothing of the plan
        assert b"ResumeState" in saved and b"Pending" not in saved and b"ShardPlan" not in saved, name
        if name in ("pickle", "copy", "replace"):
            assert type(got) is (PendingState if name == "replace" else ResumeState), name
            assert got == want and got.to_json() == want.to_json() and "_pending" not in vars(got), name
    state = plan.state_after(3, 2, manifest="m" * 64, table="main")
    assert state.consumed_samples == 8 + 3 * 4  # batches 2, 3 and the first three it yields
    with pytest.raises(dataclasses.FrozenInstanceError):
        state.consumed_digest = "0" * 32
    assert ShardPlan.resume(unit_rows, ResumeState.from_json(state.to_json())).consumed == state.consumed
