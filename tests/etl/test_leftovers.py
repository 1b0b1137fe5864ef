"""Nothing left behind: after a ``warp etl`` from an S3 source to an S3 output, built or failed, on
each executor (this process's threads, a process pool, a Dask LocalCluster, workers started by hand
with caches of their own), the cache holds no spool, no staging folder and no lock: only what the
next run reuses (the source facts, ``etl-source-facts/``)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from support.warehouses import coco_config
from warpdata.sampledata.detection import generate

pytestmark = pytest.mark.s3

# what the cache keeps on purpose: the listing facts of each source, so a rerun reads no object
KEPT = ("etl-source-facts",)


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    d = tmp_path_factory.mktemp("leftovers") / "coco"
    generate(d, count=16, seed=3, min_side=64, max_side=120)
    return d


def _upload(s3, dataset: Path, prefix: str, images: bool = True) -> None:
    for p in sorted(dataset.rglob("*")):
        rel = p.relative_to(dataset).as_posix()
        if p.is_file() and (rel == "annotations.json" or (images and rel.startswith("images/"))):
            s3.client.put_object(Bucket=s3.bucket, Key=f"{prefix}/{rel}", Body=p.read_bytes())


def _listing(cache: Path) -> list[str]:
    """Everything under ``cache`` but what it keeps on purpose."""
    if not cache.exists():
        return []
    return sorted(p.relative_to(cache).as_posix() for p in cache.rglob("*")
                  if p.relative_to(cache).parts[0] not in KEPT)


def _etl(cfg: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "warpdata", "etl", "--config", str(cfg), "--json", *args],
                          capture_output=True, text=True, timeout=600, env={**os.environ, **env})


@pytest.mark.parametrize("executor", ["local", "process", "dask"])
def test_a_build_and_a_failed_build_leave_nothing_in_the_cache(dataset, tmp_path, s3, executor):
    if executor == "dask":
        pytest.importorskip("distributed", reason="the dask extra (dask, distributed) is not installed")
    cache = tmp_path / "cache"
    env = {**s3.env, "WARP_CACHE_DIR": str(cache)}
    cfg = coco_config(dataset, tmp_path / "unused")
    _upload(s3, dataset, "src")
    _upload(s3, dataset, "noimg", images=False)
    args = ("--executor", executor, "-j", "2")
    for i in range(2):  # a second build of another output: still nothing left, nothing piles up
        r = _etl(cfg, env, "--input", s3.url("src"), "--output", s3.url(f"wh{i}"), *args)
        assert r.returncode == 0, r.stderr
        assert '"status": "built"' in r.stdout or '"shards_built"' in r.stdout
        assert _listing(cache) == [], (i, _listing(cache))
    # to a local folder too
    r = _etl(cfg, env, "--input", s3.url("src"), "--output", str(tmp_path / "local"), *args)
    assert r.returncode == 0, r.stderr
    assert _listing(cache) == []
    # failed: every image missing, the verdict fails (exit 65)
    r = _etl(cfg, env, "--input", s3.url("noimg"), "--output", s3.url("wh-failed"), *args)
    assert r.returncode == 65, r.stderr
    assert _listing(cache) == []


def test_a_shard_for_the_store_is_staged_in_the_workers_own_cache(tmp_path, monkeypatch):
    from warpdata.warehouse.shards import upload_staging

    driver = tmp_path / "driver-cache" / "etl-staging" / "abc" / ".warp-tmp-build-0123"
    driver.mkdir(parents=True)
    monkeypatch.setenv("WARP_CACHE_DIR", str(tmp_path / "driver-cache"))
    assert upload_staging(str(driver)) == str(driver)  # threads, a process pool, a LocalCluster: one cache
    monkeypatch.setenv("WARP_CACHE_DIR", str(tmp_path / "node-cache"))  # a worker started by hand
    assert upload_staging(str(driver)) == os.path.realpath(tmp_path / "node-cache")
    assert (tmp_path / "node-cache").is_dir()
    assert upload_staging(str(tmp_path / "elsewhere" / "build")) == os.path.realpath(tmp_path / "node-cache")


def test_workers_started_by_hand_leave_nothing_in_their_caches_or_the_drivers(dataset, tmp_path, s3):
    pytest.importorskip("distributed", reason="the dask extra (dask, distributed) is not installed")
    from support.clusters import dask_processes

    _upload(s3, dataset, "src")
    cache = tmp_path / "driver-cache"
    cfg = coco_config(dataset, tmp_path / "unused")
    with dask_processes(tmp_path / "cluster", workers=1, env=s3.env) as cl:
        r = _etl(cfg, {**s3.env, "WARP_CACHE_DIR": str(cache)}, "--input", s3.url("src"), "--output",
                 s3.url("wh"), "--executor", f"dask://{cl.address}")
        assert r.returncode == 0, r.stderr
        node_caches = sorted((tmp_path / "cluster").glob("node-*/cache"))
    assert _listing(cache) == []
    for node in node_caches:
        assert _listing(node) == [], _listing(node)
