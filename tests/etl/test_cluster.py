"""``warp etl`` on a cluster a user started by hand: a wrong address, an empty cluster, a scheduler
that dies, workers without the store settings. Every case ends with warp's typed line, never a hang
or a library traceback.

Real components only: ``dask scheduler`` / ``dask worker`` processes (each worker a simulated node
with its own cache directory and a fresh machine's environment) and moto's S3 server.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from support.clusters import dask_processes
from support.processes import kill_when, spawn_etl
from support.warehouses import coco_config
from warpdata.sampledata.detection import generate

pytest.importorskip("distributed", reason="the dask extra (dask, distributed) is not installed")

# a hang of the old driver ends here instead of never; never a timing assertion
HANG_GUARD_S = 150


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    d = tmp_path_factory.mktemp("cluster") / "coco"
    generate(d, count=24, seed=5, min_side=64, max_side=150)
    return d


def _etl(cfg: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "warpdata", "etl", "--config", str(cfg), *args],
                          capture_output=True, text=True, timeout=HANG_GUARD_S, env={**os.environ, **(env or {})})


def test_a_port_that_is_not_a_scheduler_fails_naming_the_address(dataset, tmp_path):
    with socket.socket() as srv:  # accepts connections and never answers: the silent hang of before
        srv.bind(("127.0.0.1", 0))
        srv.listen(8)
        port = srv.getsockname()[1]
        held = []
        threading.Thread(target=lambda: held.extend(srv.accept() for _ in range(8)), daemon=True).start()
        r = _etl(coco_config(dataset, tmp_path / "wh"), "--executor", f"dask://127.0.0.1:{port}")
    assert r.returncode == 75, r.stderr
    assert f"127.0.0.1:{port} did not answer as a Dask scheduler" in r.stderr
    assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) <= 3, r.stderr


def test_an_empty_cluster_says_it_waits_then_fails_and_a_worker_address_is_refused(dataset, tmp_path):
    with dask_processes(tmp_path / "cluster") as cl:
        r = _etl(coco_config(dataset, tmp_path / "wh"), "--executor", f"dask://{cl.address}",
                 env={"WARP_CLUSTER_WAIT": "2"})
        assert r.returncode == 75, r.stderr
        assert f"waiting up to 2 s for a worker to join the Dask scheduler dask://{cl.address}" in r.stderr
        assert "no Dask worker joined the scheduler within 2 s" in r.stderr and "dask worker" in r.stderr
        assert "Traceback" not in r.stderr and not list((tmp_path / "wh").glob("v*"))

        bad = _etl(coco_config(dataset, tmp_path / "wh"), "--executor", f"dask://{cl.address}",
                   env={"WARP_CLUSTER_WAIT": "soon"})
        assert bad.returncode == 78 and "WARP_CLUSTER_WAIT='soon'" in bad.stderr

        cl.add_worker()
        cl.wait_for_workers(1)
        from distributed import Client

        with Client(f"tcp://{cl.address}", set_as_default=False, timeout="30s") as c:
            (worker,) = c.scheduler_info(n_workers=-1)["workers"]
        w = _etl(coco_config(dataset, tmp_path / "wh"), "--executor", "dask://" + worker.split("://", 1)[1])
        assert w.returncode == 78 and "is a Dask Worker, not a scheduler" in w.stderr, w.stderr


def test_a_scheduler_that_dies_mid_run_ends_with_one_line(dataset, tmp_path):
    out = tmp_path / "wh"
    with dask_processes(tmp_path / "cluster", workers=1) as cl:
        proc = spawn_etl(coco_config(dataset, out), "--executor", f"dask://{cl.address}", "-j", "1")
        try:
            # the scheduler is killed once the first shard is receipted (the rest still to build)
            kill_when(cl.scheduler, lambda: bool(list(out.glob(".warp-tmp-build-*/receipts/shard-*.json"))),
                      timeout=HANG_GUARD_S)
            _, err = proc.communicate(timeout=HANG_GUARD_S)
        finally:
            if proc.poll() is None:
                proc.kill()
    err = err.decode()
    assert proc.returncode == 75, err
    assert "Traceback" not in err and "distributed" not in err, err
    assert len(err.strip().splitlines()) <= 3, err  # "etl cluster: ...", the error, its hint
    assert "the Dask scheduler" in err and "rerun the same command" in err


def _upload_source(s3, dataset: Path, prefix: str) -> int:
    n = 0
    for p in sorted(dataset.rglob("*")):
        rel = p.relative_to(dataset).as_posix()
        if p.is_file() and (rel == "annotations.json" or rel.startswith("images/")):
            s3.client.put_object(Bucket=s3.bucket, Key=f"{prefix}/{rel}", Body=p.read_bytes())
            n += rel.startswith("images/")
    return n


# a machine with nothing configured: no AWS files, no instance metadata service
BARE = {"AWS_EC2_METADATA_DISABLED": "true", "AWS_CONFIG_FILE": os.devnull, "AWS_SHARED_CREDENTIALS_FILE": os.devnull}


@pytest.mark.s3
def test_a_worker_without_credentials_is_a_config_error_naming_it_and_settings_travel(dataset, tmp_path, s3):
    _upload_source(s3, dataset, "src")
    cfg = coco_config(dataset, tmp_path / "wh")
    driver_env = {**s3.env, "WARP_CACHE_DIR": str(tmp_path / "driver-cache")}
    # node-0 has credentials only (no endpoint, region or path style: those come from the driver)
    creds = {**BARE, "AWS_ACCESS_KEY_ID": s3.env["AWS_ACCESS_KEY_ID"],
             "AWS_SECRET_ACCESS_KEY": s3.env["AWS_SECRET_ACCESS_KEY"]}
    with dask_processes(tmp_path / "cluster") as cl:
        cl.add_worker(creds, name="node-0")
        bare = cl.add_worker(BARE, name="node-1")  # started as a user would on another machine: no S3 env
        cl.wait_for_workers(2)
        s3.reset_counts()
        r = _etl(cfg, "--input", s3.url("src"), "--executor", f"dask://{cl.address}", env=driver_env)
        assert r.returncode == 78, r.stderr
        assert "worker node-1 (tcp://127.0.0.1:" in r.stderr and "has no S3 credentials" in r.stderr, r.stderr
        assert "AWS_ACCESS_KEY_ID" in r.stderr and "Traceback" not in r.stderr
        assert s3.count("GET", "src/images/") == 0  # stopped before any task
        cl.stop(bare)
        ok = _etl(cfg, "--input", s3.url("src"), "--executor", f"dask://{cl.address}", "--json", env=driver_env)
    assert ok.returncode == 0, ok.stderr
    assert '"status": "built"' in ok.stdout or '"shards_built"' in ok.stdout
