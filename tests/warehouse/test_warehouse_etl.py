"""warp etl for tensor warehouses: label formats, validation, versions, reuse, crash safety."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from warpdata.formats import twh1
from warpdata.sampledata.detection import CLASSES, generate

SMALL = dict(min_side=64, max_side=150)


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    d = tmp_path_factory.mktemp("det") / "coco"
    info = generate(d, count=24, seed=3, **SMALL)
    return d, info


def config(d: Path, fmt: str = "coco", *, out: str = "../warehouse", extra: str = "", transform: str = "",
           validation: str = "", source: str = "") -> Path:
    labels = {"coco": 'labels = "annotations.json"', "yolo": 'labels = "labels"',
              "jsonl": 'labels = "labels.jsonl"'}[fmt]
    names = ", ".join(f'"{n}"' for _, n, _ in CLASSES)
    classes = f"classes = [{names}]" if fmt != "coco" else ""
    text = f"""
[source]
format = "{fmt}"
path = "."
{labels}
{classes}
{source}

[transform]
target_size = 96
max_boxes = 8
{transform}

[validation]
max_invalid_fraction = {{ warn = 0.0, fail = 0.3 }}
max_missing_fraction = {{ warn = 0.0, fail = 0.3 }}
{validation}

[output]
root = "{out}"
shard_samples = 5
{extra}
"""
    p = d / f"t-{fmt}-{abs(hash(text)) % 10**8}.toml"
    p.write_text(text)
    return p


def etl(cli, cfg, *args):
    r = cli("etl", "--config", cfg, "--json", *args)
    assert r.code == 0, r.err
    return r.json()


def shards_bytes(path: str) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(Path(path).glob("*.twh1"))}


def test_coco_build_counts_reasons_and_manifest(cli, dataset, tmp_path):
    d, info = dataset
    res = etl(cli, config(d, out=str(tmp_path / "wh")))
    assert res["status"] == "built" and res["kind"] == "tensor-warehouse"
    c = res["counts"]
    assert c["total"] == 24 and c["missing"] == 1
    assert c["by_reason"] == {"missing-file": 1, "truncated": 2, "box-out-of-bounds": 1}
    assert c["kept"] == res["samples"] == 20
    path = Path(res["path"])
    assert path.name.startswith("v") and path.name.endswith(res["version"][:12])
    m = json.loads((path / "manifest.json").read_bytes())
    from warpdata.warehouse.manifest import validate_manifest

    validate_manifest(m)
    assert m["kind"] == "tensor-warehouse" and m["dataset_root"] == "."
    assert m["default_dtype"] == "U8" and [s["samples"] for s in m["shards"]] == [5, 5, 5, 4, 1] or \
        sum(s["samples"] for s in m["shards"]) == 20
    assert m["classes"] == [{"id": cid, "name": n} for cid, n, _ in CLASSES]
    recipe = json.loads(m["version_recipe"])
    assert recipe["libraries"]["simplejpeg"] and recipe["sources_sha256"]
    from warpdata.core.canonical import identity

    assert identity(recipe) == m["version"]
    for sh in m["shards"]:
        with twh1.TWH1Shard(path / sh["relative_path"]) as s:
            assert s.verify(sh["checksum_sha256"]) == sh["checksum_sha256"]
    metrics = json.loads((path / "metrics.json").read_text())
    assert set(metrics["cpu_s"]) == {"read", "decode", "resize", "hash", "write"}
    assert metrics["skip_reasons"]["truncated"] == 2
    import duckdb

    con = duckdb.connect()
    rows = con.execute(f"select reason, count from '{path}/reasons.parquet' where scope='aggregate' order by reason").fetchall()
    assert rows == [("box-out-of-bounds", 1), ("missing-file", 1), ("truncated", 2)]
    q = con.execute(f"select sample_id from '{path}/quarantine.parquet' where reason='missing-file'").fetchall()
    assert q == [(info["broken"]["missing"],)]
    tot = con.execute(f"select total, kept from '{path}/summary.parquet' where scope='aggregate'").fetchall()
    assert tot == [(24, 20)]


def test_three_label_formats_give_the_same_samples(cli, dataset, tmp_path):
    d, _ = dataset
    results = {fmt: etl(cli, config(d, fmt, out=str(tmp_path / fmt))) for fmt in ("coco", "yolo", "jsonl")}
    import warpdata.warehouse as wh

    whs = {f: wh.open(r["path"], verify="full") for f, r in results.items()}
    keys = {f: w.keys() for f, w in whs.items()}
    # YOLO cannot see the missing image (no file to list): it reports an orphan label instead
    assert results["yolo"]["counts"]["by_reason"].get("orphan-label") == 1
    assert keys["coco"] == keys["jsonl"] == keys["yolo"]
    a, b, c = whs["coco"].batch(range(len(whs["coco"]))), whs["jsonl"].batch(range(20)), whs["yolo"].batch(range(20))
    assert (a["image"] == b["image"]).all() and (a["image"] == c["image"]).all()
    assert (a["mask"] == b["mask"]).all() and (a["mask"] == c["mask"]).all()
    np.testing.assert_array_equal(a["boxes"], b["boxes"])
    np.testing.assert_allclose(a["boxes"], c["boxes"], atol=0.01)  # YOLO's 6-decimal normalized text
    # COCO keeps category ids 1..3; YOLO/JSONL use 0..2 over the same names
    np.testing.assert_array_equal(np.where(a["classes"] >= 0, a["classes"] - 1, -1), b["classes"])
    np.testing.assert_array_equal(b["classes"], c["classes"])
    assert whs["jsonl"][3].run_id in ("run0", "run1") and whs["jsonl"][3].frame_id >= 0


def test_exif_rotated_image_is_oriented_with_its_boxes(cli, dataset, tmp_path):
    d, info = dataset
    res = etl(cli, config(d, out=str(tmp_path / "wh"), transform='resize_mode = "letterbox"'))
    import warpdata.warehouse as wh

    w = wh.open(res["path"])
    key = info["broken"]["exif-rotated"]
    i = w.keys().index(key)
    s = w[i]
    coco = json.loads((d / "annotations.json").read_text())
    im = next(x for x in coco["images"] if x["file_name"] == Path(key).name)
    colors = {cid: col for cid, _, col in CLASSES}
    assert s.num_boxes >= 1
    for k in range(s.num_boxes):
        x1, y1, x2, y2 = s.boxes[k]
        # the centre of each drawn box has the class colour: pixels and boxes agree
        cx, cy = int((x1 + x2) / 2), int((y1 + y2) / 2)
        pix = s.image[:, cy, cx].astype(int)
        assert np.abs(pix - np.array(colors[int(s.classes[k])])).max() < 40, (k, pix)
    # the oriented frame is the labelled one (portrait/landscape as labelled)
    ow, oh = im["width"], im["height"]
    sh, j = w.locate(i)
    assert tuple(w.shard(sh).orig_size[j]) == (ow, oh)


def test_every_sample_boxes_match_pixels(cli, dataset, tmp_path):
    d, _ = dataset
    res = etl(cli, config(d, out=str(tmp_path / "wh"), transform='resize_mode = "resize"\ninterpolation = "nearest"'))
    import warpdata.warehouse as wh

    w = wh.open(res["path"])
    colors = {cid: col for cid, _, col in CLASSES}
    checked = 0
    for i in range(len(w)):
        s = w[i]
        for k in range(s.num_boxes):
            x1, y1, x2, y2 = s.boxes[k]
            if x2 - x1 < 12 or y2 - y1 < 12:  # tiny boxes blur under 4:2:0 chroma subsampling
                continue
            # most of the box interior shows a class colour (boxes may overlap, JPEG blurs edges);
            # a misaligned box would cover the photo-like background instead
            inner = s.image[:, int(y1) + 3:int(y2) - 3, int(x1) + 3:int(x2) - 3].astype(int).reshape(3, -1).T
            near = np.min([np.abs(inner - np.array(c)).max(axis=1) for c in colors.values()], axis=0) < 60
            assert near.mean() > 0.6, (s.key, k, near.mean())
            checked += 1
    assert checked > 10


def test_deterministic_across_worker_counts_and_executors(cli, dataset, tmp_path):
    d, _ = dataset
    a = etl(cli, config(d, out=str(tmp_path / "a"), extra='[build]\nworkers = 1'))
    b = etl(cli, config(d, out=str(tmp_path / "b"), extra='[build]\nworkers = 2\nexecutor = "process"\ndurable = false'))
    c = etl(cli, config(d, out=str(tmp_path / "c")), "--workers", "3")
    assert a["version"] == b["version"] == c["version"]
    assert shards_bytes(a["path"]) == shards_bytes(b["path"]) == shards_bytes(c["path"])


def test_same_inputs_elsewhere_give_the_same_version(cli, tmp_path):
    generate(tmp_path / "x" / "coco", count=10, seed=5, **SMALL)
    generate(tmp_path / "y" / "deeper" / "coco", count=10, seed=5, **SMALL)
    a = etl(cli, config(tmp_path / "x" / "coco"))
    b = etl(cli, config(tmp_path / "y" / "deeper" / "coco"))
    assert a["version"] == b["version"]
    assert shards_bytes(a["path"]) == shards_bytes(b["path"])


def test_reuse_invalidation_and_clear(cli, tmp_path, monkeypatch):
    d = tmp_path / "coco"
    generate(d, count=12, seed=7, **SMALL)
    cfg = config(d)
    first = etl(cli, cfg)
    p = Path(first["path"])
    stamps = {f.name: f.stat().st_mtime_ns for f in p.iterdir()}
    again = etl(cli, cfg)
    assert again["status"] == "up-to-date" and again["path"] == first["path"]
    assert {f.name: f.stat().st_mtime_ns for f in p.iterdir()} == stamps  # nothing rewritten
    # a same-size edit of one image: bump one quantization-table entry. The file keeps its
    # size (and its mtime, restored below) but decodes to different pixels.
    img = d / "images" / "img_00000.jpg"
    st = img.stat()
    data = bytearray(img.read_bytes())
    dqt = data.index(b"\xff\xdb")
    data[dqt + 5 + 10] = min(255, data[dqt + 5 + 10] + 7)
    img.write_bytes(bytes(data))
    os.utime(img, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert img.stat().st_size == st.st_size
    edited = etl(cli, cfg)
    assert edited["status"] == "built" and edited["version"] != first["version"]
    # --clear rebuilds the current version in place
    cleared = etl(cli, cfg, "--clear")
    assert cleared["status"] == "built" and cleared["version"] == edited["version"]
    monkeypatch.setenv("WAREHOUSE_CLEAR", "1")
    env_cleared = etl(cli, cfg)
    assert env_cleared["status"] == "built"
    monkeypatch.delenv("WAREHOUSE_CLEAR")
    assert etl(cli, cfg)["status"] == "up-to-date"
    # a corrupted shard is not reused: the version is rebuilt
    shard = next(Path(edited["path"]).glob("*.twh1"))
    raw = bytearray(shard.read_bytes())
    raw[5000] ^= 0xFF
    shard.write_bytes(bytes(raw))
    r = etl(cli, cfg)
    assert r["status"] == "built" and r["version"] == edited["version"]
    assert not list(tmp_path.glob("warehouse/.warp-tmp-*"))


def test_quiet_prints_only_the_version_path(cli, dataset, tmp_path):
    d, _ = dataset
    cfg = config(d, out=str(tmp_path / "wh"))
    r = cli("etl", "-q", "--config", cfg)
    assert r.code == 0
    lines = r.out.splitlines()
    assert len(lines) == 1 and Path(lines[0]).is_dir() and Path(lines[0], "manifest.json").is_file()
    r2 = cli("etl", "--config", cfg)
    assert r2.code == 0 and "up-to-date" in r2.err and r2.out.strip().splitlines() == [lines[0]]


def test_thresholds_fail_with_exit_65_and_worst_offenders(cli, dataset, tmp_path):
    d, info = dataset
    cfg = config(d, out=str(tmp_path / "wh"), validation="")
    strict = cfg.with_name("strict.toml")
    strict.write_text(cfg.read_text().replace("fail = 0.3 }\nmax_missing", "fail = 0.01 }\nmax_missing"))
    r = cli("etl", "--config", strict)
    assert r.code == 65
    assert "failed validation" in r.err and "invalid_fraction" in r.err
    assert "truncated x" in r.err and info["broken"]["truncated"] in r.err
    assert "--allow-invalid" in r.err
    assert not (tmp_path / "wh").exists() or not list((tmp_path / "wh").glob("v*"))
    ok = cli("etl", "--config", strict, "--allow-invalid", "--json")
    assert ok.code == 0, ok.err
    res = ok.json()
    assert res["verdict"] == "fail" and res["allowed_invalid"] is True
    import warpdata.warehouse as wh
    from warpdata.core.errors import DataError

    with pytest.raises(DataError, match="failed its validation thresholds"):
        wh.open(res["path"])
    assert len(wh.open(res["path"], allow_invalid=True)) == 20


def test_warn_threshold_warns_but_builds(cli, dataset, tmp_path):
    d, _ = dataset
    r = cli("etl", "--config", config(d, out=str(tmp_path / "wh")))
    assert r.code == 0 and "warning:" in r.err and "exceeds warn limit" in r.err


def test_empty_fraction_and_skip_empty(cli, tmp_path):
    d = tmp_path / "coco"
    generate(d, count=16, seed=11, broken=False, **SMALL)
    res = etl(cli, config(d, transform="skip_empty = true"))
    c = res["counts"]
    assert c["empty"] >= 1 and c["skipped"] == c["empty"] and res["samples"] == c["non_empty"]
    import warpdata.warehouse as wh

    w = wh.open(res["path"])
    assert all(w[i].num_boxes > 0 for i in range(len(w)))
    r = cli("etl", "--config", config(d, validation="max_empty_fraction = { fail = 0.0 }"))
    assert r.code == 65 and "empty_fraction" in r.err


def test_config_errors_name_file_line_and_key(cli, dataset, tmp_path):
    d, _ = dataset
    bad = tmp_path / "bad.toml"
    bad.write_text('[source]\nformat = "coco"\npath = "."\n\n[transform]\ntarget_sise = 64\n')
    r = cli("etl", "--config", bad)
    assert r.code == 78 and f"{bad}:6" in r.err and "target_size" in r.err
    bad.write_text('[source]\nformat = "coco"\n[transform]\ndtype = "f64"\n')
    r = cli("etl", "--config", bad)
    assert r.code == 78 and "transform.dtype" in r.err and "'u8'" in r.err
    bad.write_text('[source]\nformat = "coco"\npath = "nowhere"\n')
    r = cli("etl", "--config", bad)
    assert r.code == 66 and "nowhere" in r.err
    bad.write_text('[source]\nformat = "coco"\n[validation]\nmax_invalid_fraction = { warn = 0.5, fail = 0.1 }\n')
    r = cli("etl", "--config", bad)
    assert r.code == 78 and "warn" in r.err


def test_f16_and_f32_store_x_over_255_of_the_u8_pixels(cli, dataset, tmp_path):
    d, _ = dataset
    import warpdata.warehouse as wh

    u8 = wh.open(etl(cli, config(d, out=str(tmp_path / "u8")))["path"])
    for dt in ("f16", "f32"):
        w = wh.open(etl(cli, config(d, out=str(tmp_path / dt), transform=f'dtype = "{dt}"'))["path"])
        a, b = u8.batch(range(len(u8))), w.batch(range(len(w)))
        assert b["image"].dtype == (np.float16 if dt == "f16" else np.float32)
        assert (np.rint(b["image"].astype(np.float64) * 255).astype(np.uint8) == a["image"]).all()
        np.testing.assert_allclose(b["boxes"].astype(np.float32), a["boxes"], atol=0.13)


def test_kill_mid_build_leaves_no_version_and_rerun_reuses_shards(tmp_path):
    d = tmp_path / "coco"
    generate(d, count=40, seed=13, broken=False, min_side=300, max_side=500)
    cfg = d / "slow.toml"
    cfg.write_text('[source]\nformat = "coco"\n[transform]\ntarget_size = 256\n'
                   '[output]\nroot = "../wh"\nshard_samples = 2\n[build]\nworkers = 1\n')
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "warpdata", "etl", "--config", str(cfg)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    root = tmp_path / "wh"
    deadline = time.time() + 60
    while time.time() < deadline:
        receipts = list(root.glob(".warp-tmp-build-*/receipts/shard-*.json"))
        if len(receipts) >= 3 or proc.poll() is not None:
            break
        time.sleep(0.01)
    assert proc.poll() is None, "the build finished before it could be killed; make it slower"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert not list(root.glob("v*")), "a killed ETL must not leave a visible version"
    assert list(root.glob(".warp-tmp-build-*/shard-*.twh1"))
    r = subprocess.run([sys.executable, "-m", "warpdata", "etl", "--config", str(cfg), "--json"],
                       env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    res = json.loads(r.stdout)
    metrics = json.loads((Path(res["path"]) / "metrics.json").read_text())
    assert metrics["shards_reused"] >= 3
    assert not list(root.glob(".warp-tmp-*"))
    clean = subprocess.run([sys.executable, "-m", "warpdata", "etl", "--config", str(cfg), "--json", "--clear",
                            "--output", str(tmp_path / "clean")], env=env, capture_output=True, text=True, timeout=120)
    assert clean.returncode == 0, clean.stderr
    assert shards_bytes(res["path"]) == shards_bytes(json.loads(clean.stdout)["path"])


def test_full_decode_failures_count_against_thresholds(cli, dataset, tmp_path):
    """The corrupt-scan JPEG passes the header pass and fails only in the full decode."""
    d, info = dataset
    cfg = config(d, out=str(tmp_path / "wh"))
    # header pass: 2 invalid of 24 (0.083); after the full decode: 3 of 24 (0.125)
    cfg.write_text(cfg.read_text().replace("fail = 0.3 }\nmax_missing", "fail = 0.1 }\nmax_missing"))
    r = cli("etl", "--config", cfg)
    assert r.code == 65 and info["broken"]["corrupt-scan"] in r.err
    assert not list((tmp_path / "wh").glob("v*"))
    ok = cli("etl", "--config", cfg, "--allow-invalid", "--json")
    assert ok.code == 0, ok.err
    m = json.loads((Path(ok.json()["path"]) / "metrics.json").read_text())
    assert m["shards_reused"] == m["shards"]  # the refused build's shards were kept and reused
    again = cli("etl", "--config", cfg)
    assert again.code == 65 and "built with --allow-invalid" in again.err
    assert cli("etl", "--config", cfg, "--allow-invalid").code == 0


@pytest.mark.parametrize("direct", ["0", "1"])
def test_pixels_written_while_the_shard_fills_give_the_same_shards(cli, dataset, tmp_path, monkeypatch, direct):
    """Pages of pixels handed to the disk after every sample (O_DIRECT on or off), with a sample that
    fails only in the full decode mid-shard, give the same shards as one write at the end."""
    from warpdata.warehouse import shards

    d, _ = dataset
    ref = etl(cli, config(d, out=str(tmp_path / "ref")))
    monkeypatch.setattr(shards, "FLUSH_BYTES", 1)
    monkeypatch.setattr(shards, "DIRECT_MIN_SHARD_BYTES", 0)
    monkeypatch.setenv("WARP_DIRECT_IO", direct)
    got = etl(cli, config(d, out=str(tmp_path / "got"), extra="[build]\nworkers = 2"))
    assert got["version"] == ref["version"]
    assert shards_bytes(got["path"]) == shards_bytes(ref["path"])
    assert not list(Path(got["path"]).glob(".warp-tmp-*"))
    for p in Path(got["path"]).glob("*.twh1"):
        twh1.TWH1Shard(p, verify=True).close()


def test_metrics_say_how_shards_reached_the_disk(cli, dataset, tmp_path, monkeypatch):
    from warpdata.core.directio import wants_direct

    d, _ = dataset
    monkeypatch.setenv("WARP_DIRECT_IO", "0")
    off = etl(cli, config(d, out=str(tmp_path / "off")))
    assert json.loads((Path(off["path"]) / "metrics.json").read_text())["direct_io_fraction"] == 0
    monkeypatch.setenv("WARP_DIRECT_IO", "auto")
    small = etl(cli, config(d, out=str(tmp_path / "small")))  # shards far below DIRECT_MIN_SHARD_BYTES
    assert json.loads((Path(small["path"]) / "metrics.json").read_text())["direct_io_fraction"] == 0
    from warpdata.warehouse import shards

    monkeypatch.setattr(shards, "DIRECT_MIN_SHARD_BYTES", 0)
    on = etl(cli, config(d, out=str(tmp_path / "on")))
    frac = json.loads((Path(on["path"]) / "metrics.json").read_text())["direct_io_fraction"]
    # every byte (images of 96x96x3, not whole pages) goes through aligned blocks
    assert (frac == 1.0) if wants_direct(tmp_path) else (frac == 0)
    assert shards_bytes(on["path"]) == shards_bytes(small["path"]) == shards_bytes(off["path"])


def test_rerun_removes_leftovers_of_killed_builds_but_not_running_ones(tmp_path):
    """Issue #5: build folders and old trees of killed ETLs stayed forever."""
    import fcntl
    import os
    import time

    from warpdata.warehouse.finalize import BUILD_PREFIX, remove_leftovers

    root = tmp_path / "wh"
    dead = root / f"{BUILD_PREFIX}aaaaaaaaaaaa"
    running = root / f"{BUILD_PREFIX}bbbbbbbbbbbb"
    mine = root / f"{BUILD_PREFIX}cccccccccccc"
    old_tree = root / ".warp-tmp-old-v20250101-aaaaaaaaaaaa"
    for d in (dead, running, mine, old_tree):
        d.mkdir(parents=True)
        (d / "shard-00000.twh1").write_bytes(b"x")
    os.utime(old_tree, (time.time() - 60, time.time() - 60))
    fd = os.open(root / f"{running.name}.lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # an ETL of that version is running
        removed = remove_leftovers(root, keep=mine, older_than=time.time())
    finally:
        os.close(fd)
    assert sorted(removed) == sorted([str(dead), str(old_tree)])
    assert running.is_dir() and mine.is_dir() and not dead.exists() and not old_tree.exists()


def test_worker_preload_holds_the_functions_shipped_to_workers():
    """A Dask LocalCluster's workers import WORKER_PRELOAD before they fork; the shard task and the
    worker initializer are pickled by reference to their module, so that module must be preloaded."""
    import pickle

    from warpdata.warehouse import etl as wetl
    from warpdata.warehouse import shards

    for fn in (shards.build_shard, shards.init_process_worker):
        assert fn.__module__ in shards.WORKER_PRELOAD
        assert pickle.loads(pickle.dumps(fn)) is fn
    assert wetl.build_shard is shards.build_shard  # the pipeline ships the same function


def test_live_loader_does_not_load_the_pipeline():
    """The live (dev) loader shares the header pass with `warp etl` (warehouse.scan) without importing
    the pipeline and its driver (docs/design.md §2, floors: systems below pipelines)."""
    code = ("import sys, warpdata.warehouse.live\n"
            "print(sorted(m for m in sys.modules if m in ('warpdata.warehouse.etl', 'warpdata.etl.driver')))\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]"
