"""The training side: zero-copy reader, batches, checksums, torch DataLoader, live loader, example."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from warpdata.core.errors import DataError
from warpdata.formats import twh1
from warpdata.sampledata.detection import generate

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    from warpdata.cli.app import main

    d = tmp_path_factory.mktemp("rd") / "coco"
    generate(d, count=26, seed=21, min_side=64, max_side=150)
    cfg = d / "t.toml"
    cfg.write_text('[source]\nformat = "coco"\n[transform]\ntarget_size = [80, 64]\nmax_boxes = 8\n'
                   '[validation]\nmax_invalid_fraction = { fail = 0.3 }\nmax_missing_fraction = { fail = 0.3 }\n'
                   '[output]\nroot = "../wh"\nshard_samples = 4\n')
    assert main(["-q", "etl", "--config", str(cfg)]) == 0
    path = next((d.parent / "wh").glob("v*"))
    return cfg, path


def test_samples_are_zero_copy_views(built):
    import warpdata.warehouse as wh

    _, path = built
    w = wh.open(path)
    assert len(w) == 22 and w.num_shards == 6 and (w.width, w.height) == (80, 64)
    s = w[5]
    sh, j = w.locate(5)
    assert (sh, j) == (1, 1)
    shard = w.shard(sh)
    assert np.shares_memory(s.image, shard.images) and not s.image.flags.writeable
    assert s.image.shape == (3, 64, 80) and s.image.dtype == np.uint8
    assert s.boxes.shape == (8, 4) and s.classes.shape == (8,) and s.mask.shape == (8,)
    assert s.key == shard.key(j) and s.key.startswith("images/img_")
    assert w[-1].index == -1 or w[-1].key == w[21].key
    with pytest.raises(IndexError):
        w[22]


def test_batch_copies_into_reused_buffers(built):
    import warpdata.warehouse as wh

    _, path = built
    w = wh.open(path)
    buf = w.alloc_batch(8)
    idx = [21, 0, 7, 7, 13]
    b = w.batch(idx, out=buf)
    assert b["image"].base is buf["image"] or np.shares_memory(b["image"], buf["image"])
    for k, i in enumerate(idx):
        s = w[i]
        assert (b["image"][k] == s.image).all() and (b["boxes"][k] == s.boxes).all()
        assert (b["classes"][k] == s.classes).all() and b["frame_id"][k] == s.frame_id
    assert b["index"].tolist() == idx
    with pytest.raises(ValueError):
        w.batch(range(9), out=buf)


def test_lazy_verification_catches_corruption_on_first_touch(built, tmp_path):
    import shutil

    import warpdata.warehouse as wh

    _, path = built
    copy = tmp_path / path.name
    shutil.copytree(path, copy)
    shard = copy / "shard-00002.twh1"
    raw = bytearray(shard.read_bytes())
    raw[4096 + 100] ^= 0x40
    shard.write_bytes(bytes(raw))
    w = wh.open(copy)  # opening reads only the manifest
    assert w[0].key  # shard 0 is fine
    with pytest.raises(twh1.TWH1ChecksumError, match="SHA-256 mismatch"):
        w[9]
    with pytest.raises(twh1.TWH1ChecksumError):
        wh.open(copy, verify="full")
    assert wh.open(copy, verify="off")[9].key  # explicitly unchecked
    assert set(w.shard_load_s) == {0}


def test_manifest_shard_mismatch_and_schema_errors(built, tmp_path):
    import json
    import shutil

    import warpdata.warehouse as wh

    _, path = built
    copy = tmp_path / "c"
    shutil.copytree(path, copy)
    from warpdata.core.canonical import seal

    m = json.loads((copy / "manifest.json").read_text())
    m["shards"][0]["samples"] = 3
    (copy / "manifest.json").write_text(json.dumps(seal(m)))  # a consistent manifest, wrong for the shard
    with pytest.raises(DataError, match="disagrees with the manifest"):
        wh.open(copy, verify="off")[0]
    del m["version"]
    (copy / "manifest.json").write_text(json.dumps(seal(m)))
    with pytest.raises(DataError, match="schema"):
        wh.open(copy)


@pytest.mark.parametrize("edit", ["classes", "transform", "drop_shard", "version"])
def test_manifest_edits_fail_the_content_hash(built, tmp_path, edit):
    """Issue #3: any edit of a field readers use (class names, transform, shard list) is refused on open."""
    import json
    import shutil

    import warpdata.warehouse as wh

    _, path = built
    copy = tmp_path / "c"
    shutil.copytree(path, copy)
    m = json.loads((copy / "manifest.json").read_text())
    if edit == "classes":
        m["classes"][0]["name"] = m["classes"][0]["name"][::-1] + "x"
    elif edit == "transform":
        m["transform"]["max_boxes"] += 1
    elif edit == "drop_shard":
        m["shards"].pop()
        m["num_samples"] -= 1
    else:
        m["version"] = "0" * 64
    (copy / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(DataError, match="content_sha256") as ei:
        wh.open(copy, verify="off")
    assert ei.value.exit_code == 65 and str(copy / "manifest.json") in ei.value.message


def test_unsealed_old_manifest_is_refused_with_a_rebuild_hint(built, tmp_path):
    import json
    import shutil

    import warpdata.warehouse as wh

    _, path = built
    copy = tmp_path / "c"
    shutil.copytree(path, copy)
    m = json.loads((copy / "manifest.json").read_text())
    del m["content_sha256"]
    m["manifest_version"] = 1
    m["created_at_ms"] = 1
    (copy / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(DataError, match="without a content hash") as ei:
        wh.open(copy)
    assert "warp etl" in ei.value.hint


@pytest.mark.parametrize("rel", ["../../outside/x.twh1", "sub/../../x.twh1", "link/x.twh1"])
def test_shard_paths_outside_the_root_are_refused(built, tmp_path, rel):
    """Issue #7: a manifest's shard path must resolve inside the warehouse root (symlinks followed)."""
    import json
    import os
    import shutil

    import warpdata.warehouse as wh
    from warpdata.core.canonical import seal

    _, path = built
    copy = tmp_path / "a" / "b" / "c"
    shutil.copytree(path, copy)
    outside = tmp_path / "a" / "outside"
    outside.mkdir()
    shutil.copy(copy / "shard-00000.twh1", outside / "x.twh1")
    shutil.copy(copy / "shard-00000.twh1", tmp_path / "a" / "x.twh1")
    os.symlink(outside, copy / "link")
    m = json.loads((copy / "manifest.json").read_text())
    m["shards"][0]["relative_path"] = rel
    (copy / "manifest.json").write_text(json.dumps(seal(m)))
    with pytest.raises(DataError, match="climbs out of the artifact|resolves outside the artifact"):
        wh.open(copy, verify="off")


def test_pickle_carries_no_shard_data(built):
    import warpdata.warehouse as wh

    _, path = built
    w = wh.open(path)
    w.batch(range(len(w)))  # every shard mapped
    blob = pickle.dumps(w)
    assert len(blob) < 20_000
    w2 = pickle.loads(blob)
    assert w2._shards == {} and (w2[3].image == w[3].image).all()


def test_torch_loader_with_workers_covers_each_sample_once(built):
    torch = pytest.importorskip("torch")
    import warpdata.warehouse as wh
    from warpdata.warehouse.torch import WarehouseDataset, make_loader

    _, path = built
    w = wh.open(path)
    dl = make_loader(path, batch_size=4, num_workers=2, seed=3)
    seen = []
    for b in dl:
        assert b["image"].dtype == torch.uint8 and b["image"].shape[1:] == (3, 64, 80)
        ref = w.batch(b["index"].numpy())
        assert (b["image"].numpy() == ref["image"]).all() and (b["boxes"].numpy() == ref["boxes"]).all()
        seen.extend(b["index"].tolist())
    assert sorted(seen) == list(range(len(w)))
    # two ranks, drop_last: equal counts of full batches, disjoint samples (22 // (2 x 3) x 3 = 9 each)
    per_rank = []
    for rank in (0, 1):
        dl = make_loader(path, batch_size=3, num_workers=2, seed=3, world_size=2, rank=rank, drop_last=True)
        per_rank.append([i for b in dl for i in b["index"].tolist()])
    assert len(per_rank[0]) == len(per_rank[1]) == 9 and not set(per_rank[0]) & set(per_rank[1])
    ds = WarehouseDataset(path)
    one = ds[2]
    assert one["image"].shape == (3, 64, 80) and torch.equal(one["image"], torch.from_numpy(w[2].image.copy()))
    assert len(pickle.dumps(ds)) < 20_000


def test_live_loader_gives_identical_tensors(built):
    import warpdata.warehouse as wh
    from warpdata.warehouse.live import LiveDataset

    cfg, path = built
    w = wh.open(path)
    live = LiveDataset(cfg)
    keys = w.keys()
    failed = 0
    for i, key in enumerate(keys):
        s = w[i]
        L = live[live.index_of(key)]
        assert L["image"].tobytes() == s.image.tobytes(), key
        assert L["boxes"].tobytes() == s.boxes.tobytes() and L["classes"].tobytes() == s.classes.tobytes()
        assert L["mask"].tobytes() == s.mask.tobytes()
    # samples only the full decode rejects are in the live set but not the warehouse
    for key in set(s.key for s in live.samples) - set(keys):
        with pytest.raises(DataError):
            live[live.index_of(key)]
        failed += 1
    assert failed == 1


def test_example_trains_from_the_warehouse(built):
    _, path = built
    r = subprocess.run([sys.executable, str(ROOT / "examples" / "train_detector.py"), "--tensor-warehouse",
                        str(path), "--steps", "3", "--batch-size", "4", "--workers", "1"],
                       capture_output=True, text=True, timeout=180, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert r.returncode == 0, r.stderr
    assert "trained 3 steps, 12 samples" in r.stdout


def test_example_live_loader_and_refusal(built, tmp_path):
    cfg, path = built
    r = subprocess.run([sys.executable, str(ROOT / "examples" / "train_detector.py"), "--live-loader",
                        "--config", str(cfg), "--steps", "2", "--batch-size", "2"],
                       capture_output=True, text=True, timeout=180, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert r.returncode == 0, r.stderr
    assert "dev fallback" in r.stderr and "trained 2 steps" in r.stdout
    r = subprocess.run([sys.executable, str(ROOT / "examples" / "train_detector.py"), "--steps", "1"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2  # neither --tensor-warehouse nor --live-loader: refuse


def test_loader_resumes_mid_epoch(built):
    pytest.importorskip("torch")
    from warpdata.warehouse.torch import make_loader

    _, path = built
    full = [b["index"].tolist() for b in make_loader(path, batch_size=4, seed=9)]
    dl = make_loader(path, batch_size=4, seed=9)
    it = iter(dl)
    head = [next(it)["index"].tolist() for _ in range(2)]
    state = dl.sampler.state_dict(consumed=8)
    fresh = make_loader(path, batch_size=4, seed=9)
    fresh.sampler.load_state_dict(state)
    rest = [b["index"].tolist() for b in fresh]
    assert head + rest == full
    fresh.sampler.set_epoch(1)
    assert sorted(i for b in fresh for i in b["index"].tolist()) == sorted(i for b in full for i in b)
