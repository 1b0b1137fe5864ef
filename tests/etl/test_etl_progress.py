"""Progress on stderr: a Rich bar for `warp etl` (local, object-storage source, distributed) and `warp publish`
on a terminal (FORCE_COLOR stands in for one), none when stderr is not a terminal or under -q/--json; a
distributed run names its cluster."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from support.warehouses import coco_config
from warpdata.sampledata.detection import generate


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    d = tmp_path_factory.mktemp("prog") / "coco"
    generate(d, count=12, seed=5, min_side=64, max_side=100)
    return d


def config(d: Path, out: Path) -> Path:
    return coco_config(d, out, name=f"{out.name}.toml", fail=0.9)


def warp(*args: str, tty: bool, env: dict | None = None) -> subprocess.CompletedProcess:
    e = {k: v for k, v in os.environ.items() if k not in ("FORCE_COLOR", "NO_COLOR")}
    e.update(env or {})
    if tty:
        e["FORCE_COLOR"] = "1"
    r = subprocess.run([sys.executable, "-m", "warpdata", *args], capture_output=True, text=True, env=e,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    return r


@pytest.mark.parametrize(("extra", "tty", "shown"), [
    ((), True, True), (("--json",), True, False), (("-q",), True, False), ((), False, False)],
    ids=["terminal", "json", "quiet", "pipe"])
def test_etl_progress_bar_only_on_a_terminal(dataset, tmp_path, extra, tty, shown):
    r = warp("etl", "--config", str(config(dataset, tmp_path / "wh")), *extra, tty=tty)
    assert ("building shards" in r.stderr) is shown, r.stderr


def test_etl_from_object_storage_shows_the_read_progress(dataset, tmp_path, s3):
    for p in sorted(dataset.rglob("*")):
        rel = p.relative_to(dataset).as_posix()
        if p.is_file() and (rel == "annotations.json" or rel.startswith("images/")):
            s3.client.put_object(Bucket=s3.bucket, Key=f"src/{rel}", Body=p.read_bytes())
    env = {**s3.env, "WARP_CACHE_DIR": str(tmp_path / "cache")}
    cfg = str(config(dataset, tmp_path / "wh"))
    r = warp("etl", "--config", cfg, "--input", s3.url("src"), tty=True, env=env)
    assert "reading images" in r.stderr and "building shards" in r.stderr
    r = warp("etl", "--config", cfg, "--input", s3.url("src"), "--clear", tty=False, env=env)
    assert "reading images" not in r.stderr


def test_publish_progress_bar_only_on_a_terminal(tmp_path):
    (tmp_path / "data").mkdir()
    pq.write_table(pa.table({"x": list(range(10))}), tmp_path / "data" / "p.parquet")
    args = ("publish", "ws/prog", "--store", str(tmp_path / "store"), "--table", f"main={tmp_path}/data/*.parquet")
    assert "uploading" in warp(*args, tty=True).stderr
    (tmp_path / "data" / "q.parquet").write_bytes((tmp_path / "data" / "p.parquet").read_bytes())
    pq.write_table(pa.table({"x": list(range(11))}), tmp_path / "data" / "q.parquet")
    assert "uploading" not in warp(*args, tty=False).stderr


@pytest.mark.slow
def test_distributed_etl_names_its_cluster_on_stderr(dataset, tmp_path):
    pytest.importorskip("distributed", reason="the dask extra (dask, distributed) is not installed")
    r = warp("etl", "--config", str(config(dataset, tmp_path / "wh")), "--executor", "dask", "-j", "2", tty=False)
    line = next(ln for ln in r.stderr.splitlines() if "etl cluster:" in ln)
    # an own LocalCluster runs a worker process per worker (warp/etl/daskrunner.py, OWN_CLUSTER_LAYOUT)
    assert "scheduler tcp://127.0.0.1:" in line and "workers 2" in line and "threads 2" in line and "layout processes" in line
