"""Provable data order (docs/partitioning.md, "Digests"): the restart matrix, one test per loader.

Each of the four loaders — ``Table.to_torch``, the warehouse's ``make_loader``, the feature
cache's ``BigBatchLoader`` and ``TblIterableDataset`` — reads a small real artifact (built
by the project's writers) through real ``torch.utils.data.DataLoader``\\ s over one epoch
cut by three restarts that change the world size (1 → 3 → 2 → 5) and the DataLoader
worker count of rank 0 (0 → 1 → 2 → 4; the other ranks of a world are simulated in this
process with ``num_workers=0``). Every restart resumes from the list of every rank's
states of the run before it. For each split mode (exact, pad, drop_last), with and without
shuffle, cut at batch boundaries (every rank stops after the same number of batches) and
mid-batch (ranks stop after different numbers of batches; ``make_loader``'s states count
samples, so they also stop inside a batch, whose rest the next run reads):

* the samples yielded over the four runs are every sample exactly once (exact), plus
  fewer than world_size repeats (pad), or less one tail shorter than world_size × batch
  size (drop_last);
* ``combine_digests`` over the last run's states equals ``warp order``'s set digest, and
  the states' order digest equals its order digest; the pad and drop counts in the
  states are the repeats and the missing samples counted above;
* a state from another dataset version, seed, epoch or split mode is refused with a
  :class:`ResumeMismatchError`;
* a state after three restarts of up to five ranks is at most 1 KiB of JSON (the bound asked: 4 KiB).
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from torch.utils.data import DataLoader  # noqa: E402
from warpdata.core.errors import ConfigError  # noqa: E402
from warpdata.partition import combine_digests, digest_report  # noqa: E402
from warpdata.partition.world import ResumeMismatchError  # noqa: E402
from warpdata.read.order import epoch_order  # noqa: E402

N = 200  # samples in every artifact
BS = 4  # batch size (the feature cache: micro-batches of 2, 2 accumulation steps)
SEED = 7
WORLDS = (1, 3, 2, 5)  # the epoch's four runs: three restarts, each at another world size
WORKERS = (0, 1, 2, 4)  # rank 0's DataLoader workers in each run
pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create")  # 4 workers on 2 cores

TAKE = {"boundary": ((8,), (3, 3, 3), (4, 4)), "mid": ((7,), (2, 4, 3), (5, 3))}  # batches each rank uses


@pytest.fixture(autouse=True)
def _no_torchrun_env(monkeypatch):
    for v in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(v, raising=False)


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory):
    root = tmp_path_factory.mktemp("order")
    return {"tbl": _tbl(root, "x.tbl", 3), "other_tbl": _tbl(root, "y.tbl", 4), "features": _features(root),
            "warehouse": _warehouse(root), **_tables(root)}


def _tbl(root: Path, name: str, seed: int) -> Path:
    from warpdata.formats import tbl
    from warpdata.sampledata.photos import encode_jpeg, synthetic_photo

    p = root / name
    rng = np.random.default_rng(seed)
    with tbl.TblWriter(p, fsync=False) as w:
        for _ in range(N):
            w.add(encode_jpeg(synthetic_photo(rng, 8, 8), 70))
    return p


def _features(root: Path) -> Path:
    from PIL import Image
    from warpdata.etl.quarantine import Threshold, Thresholds
    from warpdata.features.writer import CacheSpec, build_cache

    src = root / "captions"
    src.mkdir()
    for i in range(N):
        Image.fromarray(np.full((8, 8, 3), i % 256, np.uint8)).save(src / f"{i:03d}.png")
        (src / f"{i:03d}.txt").write_text(f"sample {i}")
    build_cache(CacheSpec(source=str(src), output=str(root / "cache"), size=(8, 8), shard_size=16,
                          encoder="pool8-hash", caching_device="cpu", caching_batch_size=64,
                          thresholds=Thresholds(max_invalid_fraction=Threshold(fail=0.5))))
    return root / "cache"


def _warehouse(root: Path) -> Path:
    from warpdata.cli.app import main
    from warpdata.sampledata.detection import generate

    d = root / "coco"
    generate(d, count=N, seed=5, min_side=16, max_side=24, broken=False)
    cfg = d / "t.toml"
    cfg.write_text('[source]\nformat = "coco"\n[transform]\ntarget_size = [8, 8]\nmax_boxes = 2\n'
                   '[output]\nroot = "../wh"\nshard_samples = 16\n')
    assert main(["-q", "etl", "--config", str(cfg)]) == 0
    return next((root / "wh").glob("v*"))


def _tables(root: Path) -> dict[str, str]:
    from support.datasets import make_rows, publish

    store = str(root / "store")
    # shards of row groups of 10 rows: rank runs cross row groups and shards
    publish(store, "ws/order", {"main": [make_rows(70, payload=1), make_rows(60, 70, payload=1),
                                         make_rows(70, 130, payload=1)]}, root / "pub", row_group_size=10)
    old = publish(store, "ws/order", {"main": [make_rows(N, payload=1)]}, root / "pub-old", row_group_size=10)
    publish(store, "ws/order", {"main": [make_rows(70, payload=1), make_rows(60, 70, payload=1),
                                         make_rows(70, 130, payload=1)]}, root / "pub2", row_group_size=10)
    return {"store": store, "old_version": old.version_hash}


# -- one driver per loader: run one rank for some batches, give its sample ids and state -------

def _split(mode: str) -> dict[str, bool]:
    return {"exact": {}, "pad": {"pad": True}, "drop": {"drop_last": True}}[mode] | (
        {"drop_last": False} if mode != "drop" else {})


def _consume(it, take, ids):
    out: list[list[int]] = []
    for b in it:
        out.append(ids(b))
        if take is not None and len(out) == take:
            break
    return out


class TableDriver:
    kind = "table"

    def __init__(self, art, monkeypatch):
        import warpdata

        monkeypatch.setenv("WARP_STORE", art["store"])
        self.table = warpdata.dataset("ws/order").table("main")
        self.art = art

    def target(self):
        return "ws/order"

    def loader(self, rank, world, workers, mode, shuffle, resume, seed=SEED, epoch=None):
        kw = {"resume": resume} if resume is not None else {}
        if epoch is not None:
            kw["epoch"] = epoch
        return self.table.to_torch(batch_size=BS, columns=["id"], num_workers=workers, rank=rank,
                                   world_size=world, shuffle=shuffle, seed=seed, **_split(mode), **kw)

    def run(self, rank, world, workers, mode, shuffle, resume, take, partial):
        loader = self.loader(rank, world, workers, mode, shuffle, resume)
        got = _consume(iter(loader), take, lambda b: b["id"].tolist())
        return [i for b in got for i in b], loader.state_dict()

    def refuse(self, states, mode, shuffle, change):
        if "version" in change:
            import warpdata

            t = warpdata.dataset("ws/order", version=self.art["old_version"]).table("main")
            return t.to_torch(batch_size=BS, columns=["id"], rank=0, world_size=2, resume=states)
        return self.loader(0, 2, 0, change.get("mode", mode), shuffle, states, seed=change.get("seed", SEED),
                           epoch=change.get("epoch"))


class WarehouseDriver:
    kind = "warehouse"

    def __init__(self, art, monkeypatch):
        self.path = art["warehouse"]

    def target(self):
        return str(self.path)

    def loader(self, rank, world, workers, mode, shuffle, seed=SEED):
        from warpdata.warehouse.torch import make_loader

        return make_loader(self.path, batch_size=BS, num_workers=workers, seed=seed, rank=rank, world_size=world,
                           shuffle=shuffle, window=8, persistent_workers=False, **_split(mode))

    def run(self, rank, world, workers, mode, shuffle, resume, take, partial):
        dl = self.loader(rank, world, workers, mode, shuffle)
        if resume is not None:
            dl.sampler.load_state_dict(resume)
        got = [i for b in _consume(iter(dl), take, lambda b: b["index"].tolist()) for i in b]
        if take is not None and partial:
            got = got[:-1]  # the loop used only part of its last batch: the next run reads the rest
        return got, dl.sampler.state_dict(consumed=len(got))

    def refuse(self, states, mode, shuffle, change):
        dl = self.loader(0, 2, 0, change.get("mode", mode), shuffle, seed=change.get("seed", SEED))
        if "epoch" in change:
            dl.sampler.set_epoch(change["epoch"])
        if "version" in change:
            states = [{**s, "content": "another-version"} for s in states]
        dl.sampler.load_state_dict(states)


class FeaturesDriver:
    kind = "features"

    def __init__(self, art, monkeypatch):
        self.path = art["features"]

    def target(self):
        return str(self.path)

    def loader(self, rank, world, workers, mode, shuffle, seed=SEED):
        from warpdata.features.torch import BigBatchLoader

        return BigBatchLoader(self.path, micro_batch_size=2, accumulation_steps=2, num_workers=workers,
                              rank=rank, world_size=world, seed=seed, shuffle=shuffle, window=8,
                              fields=["caption", "caption_len"], persistent_workers=False, **_split(mode))

    def run(self, rank, world, workers, mode, shuffle, resume, take, partial):
        from warpdata.features.torch import decode_caption

        loader = self.loader(rank, world, workers, mode, shuffle)
        if resume is not None:
            loader.load_state_dict(resume)

        def ids(step):
            b = step.batch
            return [int(decode_caption(c, n).split()[1]) for c, n in zip(b["caption"], b["caption_len"], strict=True)]

        got = _consume(iter(loader), take, ids)
        return [i for b in got for i in b], loader.state_dict()

    def refuse(self, states, mode, shuffle, change):
        loader = self.loader(0, 2, 0, change.get("mode", mode), shuffle, seed=change.get("seed", SEED))
        if "epoch" in change:
            loader.set_epoch(change["epoch"])
        if "version" in change:
            states = [{**s, "sampler": {**s["sampler"], "content": "another-version"}} for s in states]
        loader.load_state_dict(states)


class TblDriver:
    kind = "tbl"

    def __init__(self, art, monkeypatch):
        self.art = art
        self.path = art["tbl"]

    def target(self):
        return str(self.path)

    def dataset(self, rank, world, mode, shuffle, seed=SEED, path=None):
        from warpdata.tbl.torch_adaptor import TblIterableDataset

        return TblIterableDataset(path or self.path, BS, rank=rank, world_size=world, shuffle=shuffle, seed=seed,
                                  **_split(mode))

    def run(self, rank, world, workers, mode, shuffle, resume, take, partial):
        ds = self.dataset(rank, world, mode, shuffle)
        if resume is not None:
            ds.load_state_dict(resume)
        got = _consume(iter(DataLoader(ds, batch_size=None, num_workers=workers)), take,
                       lambda b: b["indices"].tolist())
        return [i for b in got for i in b], ds.state_dict(len(got))

    def refuse(self, states, mode, shuffle, change):
        ds = self.dataset(0, 2, change.get("mode", mode), shuffle, seed=change.get("seed", SEED),
                          path=self.art["other_tbl"] if "version" in change else None)
        if "epoch" in change:
            ds.set_epoch(change["epoch"])
        ds.load_state_dict(states)


DRIVERS = {d.kind: d for d in (TableDriver, WarehouseDriver, FeaturesDriver, TblDriver)}


def _epoch(driver, mode: str, shuffle: bool, cut: str):
    """Run the four runs of one epoch; every sample id yielded, and the last run's states."""
    seen: list[int] = []
    states = None
    for k, (world, workers) in enumerate(zip(WORLDS, WORKERS, strict=True)):
        new = []
        for r in range(world):
            take = TAKE[cut][k][r] if k < len(TAKE[cut]) else None
            got, st = driver.run(r, world, workers if r == 0 else 0, mode, shuffle, states, take, cut == "mid")
            seen += got
            new.append(st)
        states = new
    return seen, states


@pytest.mark.parametrize("cut", ["boundary", "mid"])
@pytest.mark.parametrize("shuffle", [False, True], ids=["ordered", "shuffled"])
@pytest.mark.parametrize("mode", ["exact", "pad", "drop"])
@pytest.mark.parametrize("kind", sorted(DRIVERS))
def test_restarts_changing_world_and_workers_read_each_sample_once_and_prove_it(kind, mode, shuffle, cut,
                                                                                  artifacts, monkeypatch):
    driver = DRIVERS[kind](artifacts, monkeypatch)
    seen, final = _epoch(driver, mode, shuffle, cut)
    count = Counter(seen)
    order = epoch_order(driver.target(), seed=SEED, epoch=0, drop_last=mode == "drop", pad=mode == "pad",
                        shuffle=shuffle)
    universe = set(order.sequence.tolist())
    assert order.samples == N and set(count) <= universe
    report = digest_report(final)
    if mode == "exact":
        assert set(count) == universe and set(count.values()) == {1}
    elif mode == "pad":
        extra = sum(count.values()) - len(count)
        assert set(count) == universe and set(count.values()) <= {1, 2} and extra < WORLDS[-1]
        assert report.pad_samples == extra
    else:
        missing = universe - set(count)
        assert set(count.values()) == {1} and len(missing) < WORLDS[-1] * BS
        assert report.dropped_samples == len(missing)
    assert report.consumed_samples == len(count)
    assert report.consumed_samples + report.dropped_samples == N
    # the proof: the ranks' digests combine to the epoch's, with the epoch's order
    assert combine_digests(final) == order.set_digest()
    assert report.order_digest == order.order_digest()
    assert max(len(json.dumps(s if isinstance(s, dict) else json.loads(s.to_json()))) for s in final) <= 1024
    # a state of another dataset version, seed, epoch or split mode is refused
    other_mode = "pad" if mode != "pad" else "exact"
    for change in ({"version": True}, {"seed": SEED + 1}, {"epoch": 1}, {"mode": other_mode}):
        with pytest.raises((ResumeMismatchError, ConfigError)):
            driver.refuse(final, mode, shuffle, change)


def test_a_lost_or_repeated_batch_changes_the_combined_digest(artifacts, monkeypatch):
    """The digests catch what the ids show: one rank's batch repeated, or one rank's state lost."""
    driver = TblDriver(artifacts, monkeypatch)
    _seen, final = _epoch(driver, "exact", True, "boundary")
    order = epoch_order(driver.target(), seed=SEED, shuffle=True)
    assert combine_digests(final) == order.set_digest()
    ds = driver.dataset(1, 5, "exact", True)
    ds.load_state_dict(final[1])
    again = [ds.state_dict(0)]  # rank 1 resumed from its own final state reads nothing more
    assert combine_digests([final[0], *again, *final[2:]]) == order.set_digest()
    assert combine_digests(final[:1] + final[2:]) != order.set_digest()  # rank 1's samples missing
    assert combine_digests(final + final[1:2]) != order.set_digest()  # rank 1's samples twice


@pytest.mark.parametrize("kind", ["warehouse", "features"])
def test_a_published_artifact_orders_as_its_directory(kind, artifacts, monkeypatch, tmp_path, cli):
    """``warp order ws/name`` of a published warehouse or feature cache is ``warp order DIR`` of it."""
    monkeypatch.setenv("WARP_STORE", str(tmp_path / "store"))
    monkeypatch.setenv("WARP_CACHE_DIR", str(tmp_path / "cache"))
    r = cli("-q", "publish", f"ws/{kind}", "--from", artifacts[kind])
    assert r.code == 0, r.err
    published = json.loads(cli("--json", "order", f"ws/{kind}", "--seed", "3", "--epoch", "1").out)
    local = json.loads(cli("--json", "order", artifacts[kind], "--seed", "3", "--epoch", "1").out)
    assert published["kind"] == kind and published["shuffle"]
    assert {k: v for k, v in published.items() if k != "target"} == {k: v for k, v in local.items() if k != "target"}
