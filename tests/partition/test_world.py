"""resolve_world: explicit values, then torch.distributed, then RANK/WORLD_SIZE, then (0, 1)."""

from __future__ import annotations

import socket
import warnings

import pytest
from warpdata.core.errors import UsageError
from warpdata.partition.split import Remainder, check_all_ranks, mode_of, rank_span
from warpdata.partition.world import UNSET, ShardingError, World, renamed, resolve_world


@pytest.fixture(autouse=True)
def _no_torchrun_env(monkeypatch):
    for v in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(v, raising=False)


def test_default_env_and_explicit(monkeypatch):
    assert resolve_world() == World(0, 1, 0, 1, "default")
    monkeypatch.setenv("RANK", "2")
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("LOCAL_RANK", "7")  # plays no part
    w = resolve_world()
    assert (w.rank, w.world_size, w.source) == (2, 4, "env")
    w = resolve_world(1, 3)
    assert (w.rank, w.world_size, w.source) == (1, 3, "explicit")
    assert resolve_world(rank=3).world_size == 4  # the missing value from the environment
    assert resolve_world(environ={"RANK": "0", "WORLD_SIZE": "2"}).world_size == 2


@pytest.mark.parametrize(("kw", "env", "match"), [
    ({"rank": 2, "world_size": 2}, {}, r"rank 2 is not in 0..1 .*rank from argument"),
    ({"rank": 0, "world_size": 0}, {}, "world size must be at least 1, not 0"),
    ({"rank": 1}, {}, r"rank 1 is not in 0..0 \(world size 1; rank from argument, world size from default"),
    ({"rank": "1", "world_size": 2}, {}, "not an integer"),
    ({"rank": True, "world_size": 2}, {}, "not an integer"),
    ({}, {"RANK": "4", "WORLD_SIZE": "4"}, r"rank 4 is not in 0..3 .*rank from RANK"),
    ({}, {"RANK": "x", "WORLD_SIZE": "4"}, "not integers"),
    ({}, {"WORLD_SIZE": "4"}, "WORLD_SIZE='4' is set but RANK is not"),
    ({}, {"RANK": "1"}, "RANK='1' is set but WORLD_SIZE is not"),
])
def test_bad_values_are_typed_errors_naming_them(monkeypatch, kw, env, match):
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    with pytest.raises(ShardingError, match=match) as ei:
        resolve_world(**kw)
    assert isinstance(ei.value, UsageError) and ei.value.hint


def test_torch_distributed_wins_over_env(monkeypatch):
    dist = pytest.importorskip("torch.distributed")
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("WORLD_SIZE", "4")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    try:
        w = resolve_world()
        assert (w.rank, w.world_size, w.source) == (0, 1, "torch.distributed")
        assert resolve_world(0, 2).world_size == 2  # explicit values still win
    finally:
        dist.destroy_process_group()
    assert resolve_world().source == "env"


def test_worker_info_from_a_real_dataloader_worker():
    torch = pytest.importorskip("torch")
    from torch.utils.data import DataLoader, IterableDataset

    class DS(IterableDataset):
        def __iter__(self):
            w = resolve_world(0, 1)
            yield torch.tensor([w.worker_id, w.num_workers])

    got = sorted(tuple(t.tolist()) for t in DataLoader(DS(), batch_size=None, num_workers=2))
    assert got == [(0, 2), (1, 2)]
    assert resolve_world(0, 1).num_workers == 1  # main process


def test_renamed_warns_maps_and_refuses_both():
    with pytest.warns(DeprecationWarning, match="num_replicas= is deprecated.*world_size="):
        assert renamed("f", "num_replicas", 4, "world_size", None, None) == 4
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert renamed("f", "num_replicas", UNSET, "world_size", 2, None) == 2
    with pytest.raises(UsageError, match="not both"):
        renamed("f", "num_replicas", 4, "world_size", 2, None)


def test_split_modes():
    assert mode_of(False, False) == "exact" and mode_of(True, False) == "drop" and mode_of(False, True) == "pad"
    with pytest.raises(ShardingError, match="opposite"):
        mode_of(True, True)
    # 10 samples over 3 ranks, batch 2
    assert [rank_span(10, r, 3, "exact", 2) for r in range(3)] == [(0, 3), (3, 3), (6, 4)]
    assert [rank_span(10, r, 3, "pad", 2) for r in range(3)] == [(0, 4), (4, 4), (8, 4)]
    assert [rank_span(10, r, 3, "drop", 2) for r in range(3)] == [(0, 2), (2, 2), (4, 2)]


def test_remainder_and_rank_check():
    r = Remainder(10, [(2, 4), (7, 8), (3, 5)])
    assert r.avail == [(0, 2), (5, 7), (8, 10)] and r.size == 6
    assert r.ranges(1, 5) == [(1, 2), (5, 7), (8, 9)]
    assert r.ranges(5, 8) == [(9, 10), (0, 2)]  # pad wraps
    assert r.array(0, 6).tolist() == [0, 1, 5, 6, 8, 9]
    assert check_all_ranks("x", [(1, 2), (0, 2)]) == 2
    with pytest.raises(ShardingError, match=r"all 3 ranks.*missing \[2\]"):
        check_all_ranks("x", [(0, 3), (1, 3)])
    with pytest.raises(ShardingError, match="different world sizes"):
        check_all_ranks("x", [(0, 2), (0, 3)])
