"""One partitioning for every loader (docs/partitioning.md), checked on each of them.

The four loaders — ``Table.to_torch`` (the read API), the warehouse's ``make_loader``,
the feature cache's ``BigBatchLoader`` and ``TblIterableDataset`` (``TblLoader`` in a
DataLoader) — read small real artifacts built by the project's own writers, each in a
real ``torch.utils.data.DataLoader`` with two worker processes. For every loader:

* the default (``drop_last=False``, no ``pad``) reads every sample exactly once over the ranks;
* ``pad=True`` gives every rank the same number of steps, repeating fewer than world_size samples;
* ``drop_last=True`` gives every rank the same number of full batches and drops one tail
  (fewer than world_size × batch_size samples) that no rank reads;
* the states of both ranks of a world-2 run, taken mid-epoch, resume at world 3 and read
  exactly what the world-2 run had not: every sample once over both runs;
* the old keyword names warn with a DeprecationWarning and map to the new ones.
"""

from __future__ import annotations

import warnings
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from torch.utils.data import DataLoader  # noqa: E402
from warpdata.core.errors import UsageError  # noqa: E402

N = 37  # samples in every artifact: splits unevenly over 2 and 3 ranks
BS = 4  # batch size (the feature cache: micro-batches of 2, 2 accumulation steps)
WORKERS = 2


@pytest.fixture(autouse=True)
def _no_torchrun_env(monkeypatch):
    for v in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(v, raising=False)


# -- artifacts, built once per module by the project's writers ------------------------------

@pytest.fixture(scope="module")
def artifacts(tmp_path_factory):
    root = tmp_path_factory.mktemp("partition")
    return {"root": root, "tbl": _tbl(root), "features": _features(root), "warehouse": _warehouse(root),
            "store": _table(root)}


def _tbl(root: Path) -> Path:
    from warpdata.formats import tbl
    from warpdata.sampledata.photos import encode_jpeg, synthetic_photo

    p = root / "x.tbl"
    rng = np.random.default_rng(3)
    with tbl.TblWriter(p, fsync=False) as w:
        for _ in range(N):
            w.add(encode_jpeg(synthetic_photo(rng, 24, 16), 85))
    return p


def _features(root: Path) -> Path:
    from PIL import Image
    from warpdata.etl.quarantine import Threshold, Thresholds
    from warpdata.features.writer import CacheSpec, build_cache

    src = root / "captions"
    src.mkdir()
    for i in range(N):
        Image.fromarray(np.full((20, 24, 3), i, np.uint8)).save(src / f"{i:03d}.png")
        (src / f"{i:03d}.txt").write_text(f"sample {i}")
    build_cache(CacheSpec(source=str(src), output=str(root / "cache"), size=(16, 16), shard_size=5,
                          encoder="pool8-hash", caching_device="cpu", caching_batch_size=8,
                          thresholds=Thresholds(max_invalid_fraction=Threshold(fail=0.5))))
    return root / "cache"


def _warehouse(root: Path) -> Path:
    from warpdata.cli.app import main
    from warpdata.sampledata.detection import generate

    d = root / "coco"
    generate(d, count=N, seed=5, min_side=48, max_side=90, broken=False)
    cfg = d / "t.toml"
    cfg.write_text('[source]\nformat = "coco"\n[transform]\ntarget_size = [32, 24]\nmax_boxes = 4\n'
                   '[output]\nroot = "../wh"\nshard_samples = 5\n')
    assert main(["-q", "etl", "--config", str(cfg)]) == 0
    return next((root / "wh").glob("v*"))


def _table(root: Path) -> str:
    from support.datasets import make_rows, publish

    store = str(root / "store")
    # three Parquet shards of row groups of 5 rows: rank runs cross row groups and shards
    publish(store, "ws/part", {"main": [make_rows(15), make_rows(12, 15), make_rows(10, 27)]}, root / "pub",
            row_group_size=5)
    return store


# -- one adapter per loader: run one rank, return its batches (sample ids) and state ----------

def _take(it, take: int | None, ids) -> list[list[int]]:
    out = []
    try:
        for b in it:
            out.append(ids(b))
            if take is not None and len(out) == take:
                break
    finally:
        close = getattr(it, "close", None)
        if close:
            close()
    return out


def run_table(art, monkeypatch, rank, world, *, take=None, resume=None, **split):
    import warpdata

    monkeypatch.setenv("WARP_STORE", art["store"])
    t = warpdata.dataset("ws/part").table("main")
    kw = {"resume": resume} if resume is not None else {}
    loader = t.to_torch(batch_size=BS, columns=["id"], num_workers=WORKERS, rank=rank, world_size=world,
                        shuffle=True, seed=7, **split, **kw)
    out = _take(iter(loader), take, lambda b: b["id"].tolist())
    return out, (loader.state_dict() if take is not None else None), len(loader)


def run_warehouse(art, monkeypatch, rank, world, *, take=None, resume=None, **split):
    from warpdata.warehouse.torch import make_loader

    dl = make_loader(art["warehouse"], batch_size=BS, num_workers=WORKERS, seed=7, rank=rank, world_size=world,
                     persistent_workers=False, **split)
    if resume is not None:
        dl.sampler.load_state_dict(resume)
    steps = len(dl)
    out = _take(iter(dl), take, lambda b: b["index"].tolist())
    state = dl.sampler.state_dict(consumed=sum(map(len, out))) if take is not None else None
    return out, state, steps


def run_features(art, monkeypatch, rank, world, *, take=None, resume=None, **split):
    from warpdata.features.torch import BigBatchLoader, decode_caption

    split.setdefault("drop_last", False)  # this loader's own default is drop_last=True
    loader = BigBatchLoader(art["features"], micro_batch_size=2, accumulation_steps=2, num_workers=WORKERS,
                            rank=rank, world_size=world, seed=7, fields=["caption", "caption_len"],
                            persistent_workers=False, **split)
    if resume is not None:
        loader.load_state_dict(resume)
    steps = len(loader)

    def ids(step):
        b = step.batch
        return [int(decode_caption(c, n).split()[1]) for c, n in zip(b["caption"], b["caption_len"], strict=True)]

    out = _take(iter(loader), take, ids)
    return out, (loader.state_dict() if take is not None else None), steps


def run_tbl(art, monkeypatch, rank, world, *, take=None, resume=None, **split):
    from warpdata.tbl.torch_adaptor import TblIterableDataset

    ds = TblIterableDataset(art["tbl"], BS, rank=rank, world_size=world, shuffle=True, seed=7, **split)
    if resume is not None:
        ds.load_state_dict(resume)
    steps = len(ds)
    out = _take(iter(DataLoader(ds, batch_size=None, num_workers=WORKERS)), take, lambda b: b["indices"].tolist())
    return out, (ds.state_dict(len(out)) if take is not None else None), steps


LOADERS = {"table": run_table, "warehouse": run_warehouse, "features": run_features, "tbl": run_tbl}


@pytest.fixture(params=sorted(LOADERS))
def loader(request, artifacts, monkeypatch):
    run = LOADERS[request.param]

    def go(rank, world, **kw):
        return run(artifacts, monkeypatch, rank, world, **kw)

    go.name = request.param
    return go


def _epoch(loader, world, **split):
    """Every rank's batches (lists of sample ids) and its advertised step count."""
    ranks = [loader(r, world, **split) for r in range(world)]
    for batches, _state, steps in ranks:
        assert len(batches) == steps  # len() tells the truth
    return [b for b, _s, _n in ranks]


# -- the contract ---------------------------------------------------------------------------

def test_default_reads_every_sample_exactly_once_without_padding(loader):
    per_rank = _epoch(loader, 3)
    seen = Counter(i for batches in per_rank for b in batches for i in b)
    assert sorted(seen) == list(range(N)) and set(seen.values()) == {1}
    sizes = [sum(map(len, batches)) for batches in per_rank]
    assert sum(sizes) == N and max(sizes) - min(sizes) <= 1  # 12, 12, 13


def test_pad_gives_equal_steps_by_repeating_fewer_than_world_size_samples(loader):
    world = 3
    per_rank = _epoch(loader, world, pad=True)
    assert len({len(batches) for batches in per_rank}) == 1  # DDP never waits on a rank that ran out
    sizes = [sum(map(len, batches)) for batches in per_rank]
    assert sizes == [-(-N // world)] * world
    seen = Counter(i for batches in per_rank for b in batches for i in b)
    assert sorted(seen) == list(range(N))
    assert sum(seen.values()) - N == world * -(-N // world) - N < world  # 39 - 37 = 2 repeats


def test_drop_last_drops_one_tail_with_equal_full_batches(loader):
    world = 3
    per_rank = _epoch(loader, world, drop_last=True)
    assert len({len(batches) for batches in per_rank}) == 1
    assert all(len(b) == BS for batches in per_rank for b in batches)
    seen = [i for batches in per_rank for b in batches for i in b]
    assert len(seen) == len(set(seen)) == N // (world * BS) * world * BS  # 36 read, 1 dropped
    assert set(seen) <= set(range(N))


def test_resume_at_another_world_size_reads_the_rest_exactly_once(loader):
    """World 2 stops after 2 batches per rank; its two states resume the epoch at world 3."""
    states, seen = [], Counter()
    for rank in range(2):
        batches, state, _ = loader(rank, 2, take=2)
        assert len(batches) == 2
        seen.update(i for b in batches for i in b)
        states.append(state)
    assert sum(seen.values()) == 2 * 2 * BS
    rest = Counter()
    for rank in range(3):
        batches, _, steps = loader(rank, 3, resume=states)
        assert len(batches) == steps
        rest.update(i for b in batches for i in b)
    assert not set(rest) & set(seen)
    assert seen + rest == Counter(range(N))
    # the states of only one rank of the old world cannot resume at another world size
    with pytest.raises(UsageError, match="all 2 ranks"):
        loader(0, 3, resume=states[:1])


# -- old keyword names ---------------------------------------------------------------------

def test_old_keywords_warn_and_map(artifacts, monkeypatch):
    import warpdata
    from warpdata.features.reader import ShardCache
    from warpdata.features.torch import BigBatchLoader
    from warpdata.tbl.loader import TblLoader
    from warpdata.warehouse import open as open_warehouse
    from warpdata.warehouse.torch import make_loader

    monkeypatch.setenv("WARP_STORE", artifacts["store"])
    t = warpdata.dataset("ws/part").table("main")

    def ids(stream):
        return [i for b in stream for i in b.column("id").to_pylist()]

    with pytest.warns(DeprecationWarning, match=r"shard= is deprecated.*rank= and world_size="):
        old = ids(t.batches(BS, ["id"], shard=(1, 3)))
    assert old == ids(t.batches(BS, ["id"], rank=1, world_size=3))
    with pytest.warns(DeprecationWarning, match="policy= is deprecated"):
        old = ids(t.batches(BS, ["id"], rank=2, world_size=3, policy="pad"))
    assert old == ids(t.batches(BS, ["id"], rank=2, world_size=3, pad=True))
    with pytest.warns(DeprecationWarning, match="shard= is deprecated"):
        assert len(t.to_torch(batch_size=BS, columns=["id"], shard="0/3")) == \
            len(t.to_torch(batch_size=BS, columns=["id"], rank=0, world_size=3))
    with pytest.raises(UsageError, match="not both"):
        t.batches(BS, shard=(0, 2), rank=0, world_size=2)

    wh = artifacts["warehouse"]
    with pytest.warns(DeprecationWarning) as rec:
        dl = make_loader(wh, batch_size=BS, num_replicas=3, rank=1, uneven="drop", seed=7)
    assert {str(w.message).split(":")[1].split("=")[0].strip() for w in rec} >= {"num_replicas", "uneven"}
    new = make_loader(wh, batch_size=BS, world_size=3, rank=1, drop_last=True, seed=7)
    assert [b["index"].tolist() for b in dl] == [b["index"].tolist() for b in new]
    with pytest.raises(UsageError, match="not both"):
        make_loader(wh, batch_size=BS, world_size=3, num_replicas=3, rank=0)

    with pytest.warns(DeprecationWarning, match="num_replicas"):
        big = BigBatchLoader(artifacts["features"], micro_batch_size=2, num_workers=0, num_replicas=2, rank=1)
    assert big.world_size == 2

    # verify: the first release's names of each loader, and the read API's
    for make, old_name, level in [
        (lambda v: open_warehouse(wh, verify=v), "lazy", "fast"),
        (lambda v: open_warehouse(wh, verify=v), "all", "full"),
        (lambda v: open_warehouse(wh, verify=v), "none", "off"),
        (lambda v: ShardCache(artifacts["features"], verify=v), "record", "fast"),
        (lambda v: ShardCache(artifacts["features"], verify=v), "shard", "full"),
        (lambda v: ShardCache(artifacts["features"], verify=v), "none", "off"),
        (lambda v: TblLoader(artifacts["tbl"], BS, verify=v), True, "fast"),
        (lambda v: TblLoader(artifacts["tbl"], BS, verify=v), False, "off"),
    ]:
        with pytest.warns(DeprecationWarning, match=f"verify={old_name!r} is deprecated.*verify={level!r}"):
            obj = make(old_name)
        got = getattr(obj, "verify_mode", None) or obj.verify
        assert got == level
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            make(level)
    for bad in ("lazy", "sometimes"):
        with pytest.raises(UsageError, match="not one of 'off', 'fast', 'full'"):
            warpdata.dataset("ws/part", verify=bad)
    for level in ("off", "fast", "full"):
        ds = warpdata.dataset("ws/part", verify=level)
        assert ds.verify == level and ds.table("main").head(3).num_rows == 3
