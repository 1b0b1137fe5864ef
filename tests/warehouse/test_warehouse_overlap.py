"""The header pass overlapped with the build (warp/warehouse/overlap.py): the same shard bytes and
version as without it, on local threads, a process pool and a Dask LocalCluster; shard tasks reach
the workers while the pass still has images to read (counts, never timings)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from warpdata.sampledata.detection import generate

# 300 images, 4 per shard: the pass reads at most 2 x 8 header threads' batches of 4 records ahead
# of the plan (warp/warehouse/validate.py, ProbeStream), so the first task goes out long before the
# last image is read, however fast the threads are
N = 300


@pytest.fixture(scope="module")
def photos(tmp_path_factory):
    d = tmp_path_factory.mktemp("overlap") / "coco"
    generate(d, count=N, seed=11, min_side=48, max_side=96)
    return d


def _cfg(d: Path, out: Path, overlap: bool, executor: str, shards: str = "shard_samples = 4") -> Path:
    from support.warehouses import coco_config

    name = f"ov-{executor}-{overlap}-{abs(hash((str(out), shards))) % 10**8}.toml"
    build = f'workers = 2\nexecutor = "{executor}"\ndurable = false\noverlap = {"true" if overlap else "false"}'
    return coco_config(d, out, name=name, build=build, fail=0.3, labels="annotations.json", shards=shards)


def etl(cli, cfg: Path, *args: str) -> dict:
    r = cli("etl", "--config", cfg, "--json", *args)
    assert r.code == 0, r.err
    return r.json()


def shards_bytes(path: str) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(Path(path).glob("*.twh1"))}


def _metrics(res: dict) -> dict:
    return json.loads((Path(res["path"]) / "metrics.json").read_text())


def _manifest_version(res: dict) -> str:
    return json.loads((Path(res["path"]) / "manifest.json").read_text())["version"]


def _leftovers(root: Path) -> list[str]:
    return sorted(p.name for p in root.iterdir() if p.name.startswith(".warp-tmp"))


@pytest.mark.parametrize("executor", ["local", "process", pytest.param("dask", marks=pytest.mark.slow)])
def test_overlap_gives_the_same_shards_and_version(cli, photos, tmp_path, executor):
    if executor == "dask":
        pytest.importorskip("distributed", reason="the dask extra (dask, distributed) is not installed")
    off = etl(cli, _cfg(photos, tmp_path / "off", False, executor))
    on = etl(cli, _cfg(photos, tmp_path / "on", True, executor))
    assert on["version"] == off["version"] == _manifest_version(on) == _manifest_version(off)
    assert on["fingerprint"] == off["fingerprint"]
    ref = shards_bytes(off["path"])
    assert len(ref) == on["shards"] == off["shards"] > 40 and shards_bytes(on["path"]) == ref
    assert (Path(on["path"]) / "samples.parquet").read_bytes() == (Path(off["path"]) / "samples.parquet").read_bytes()
    assert "overlap" not in _metrics(off)
    ov = _metrics(on)["overlap"]
    # shard tasks went to the workers while the header pass still had images to read ...
    assert ov["images"] == N and ov["images_read_before_first_task"] < N
    assert ov["tasks_handed_during_pass"] >= 1
    # ... and what they built is the version's (every task is plan()'s own: 4 per shard either way)
    assert ov["speculated"] == ov["adopted"] == on["shards"]
    assert on["receipts"]["built"] == on["shards"] and on["receipts"]["written"] == on["shards"]
    assert _leftovers(tmp_path / "on") == []
    if executor == "dask":
        assert _metrics(on)["cluster"]["cluster"] == "LocalCluster"


def test_rerun_is_up_to_date_and_speculates_nothing(cli, photos, tmp_path):
    cfg = _cfg(photos, tmp_path / "wh", True, "local")
    first = etl(cli, cfg)
    assert _metrics(first)["overlap"]["adopted"] == first["shards"]
    again = cli("etl", "--config", cfg, "--json")
    assert again.code == 0 and again.json()["shards_built"] == 0  # up to date: nothing built, nothing speculated
    assert _leftovers(tmp_path / "wh") == []
    cleared = etl(cli, cfg, "--clear")  # --clear overlaps again, same bytes
    assert cleared["version"] == first["version"] and _metrics(cleared)["overlap"]["adopted"] == cleared["shards"]


def test_shard_size_known_only_after_the_pass_drops_the_speculation(cli, photos, tmp_path):
    """``samples_per_shard`` from the label records (300 -> 16 with 16 shards, a power of two) is not the one from
    the kept samples once 60 images are missing (240 -> 8): no speculative shard is plan()'s, all
    are dropped and built again, and the bytes are those of the build without overlap."""
    d = tmp_path / "some-missing"
    shutil.copytree(photos, d)
    for p in sorted((d / "images").iterdir())[:60]:
        p.unlink()
    off = etl(cli, _cfg(d, tmp_path / "off", False, "local", "shard_samples = 0\nmin_shards = 16"))
    on = etl(cli, _cfg(d, tmp_path / "on", True, "local", "shard_samples = 0\nmin_shards = 16"))
    assert on["version"] == off["version"] and shards_bytes(on["path"]) == shards_bytes(off["path"])
    ov = _metrics(on)["overlap"]
    assert ov["samples_per_shard"] == 16 and ov["speculated"] >= 1 and ov["adopted"] == 0
    assert on["shards"] == off["shards"] and on["receipts"]["built"] == on["shards"]
    assert _leftovers(tmp_path / "on") == []


def test_failed_verdict_leaves_no_speculative_shards(cli, photos, tmp_path):
    d = tmp_path / "half-missing"
    shutil.copytree(photos, d)
    for p in sorted((d / "images").iterdir())[:150]:
        p.unlink()
    r = cli("etl", "--config", _cfg(d, tmp_path / "wh", True, "local"), "--json")
    assert r.code == 65
    assert _leftovers(tmp_path / "wh") == [] and not any((tmp_path / "wh").glob("v*"))


def test_a_filesystem_clock_behind_the_process_clock_keeps_the_speculative_shards(cli, photos, tmp_path,
                                                                                   monkeypatch):
    """A file's time is the filesystem's clock: coarse (it lags ``time.time()`` by up to a kernel
    tick, so a folder made a millisecond after the run started can look older than the run), and on
    some mounts another machine's. The leftovers sweep at the start of the build tells a temporary of
    this process by its time alone, so the overlapped pass's folder must be named to it: here the
    folder is dated an hour back when the pass ends, and every speculative shard is still adopted."""
    import os
    import time

    from warpdata.warehouse import overlap as woverlap

    real = woverlap.scan_building

    def pass_then_age(cfg, workers, get_runner, folder, spec, ready=lambda: True):
        out = real(cfg, workers, get_runner, folder, spec, ready)
        past = time.time() - 3600
        os.utime(folder, (past, past))
        return out

    monkeypatch.setattr(woverlap, "scan_building", pass_then_age)
    on = etl(cli, _cfg(photos, tmp_path / "on", True, "local"))
    ov = _metrics(on)["overlap"]
    assert ov["speculated"] == ov["adopted"] == on["shards"] > 40
    assert on["receipts"]["built"] == on["shards"]
    assert _leftovers(tmp_path / "on") == []
