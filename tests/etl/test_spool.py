"""No spool outlives its run: the local mirror of an S3 source (labels, spooled image bytes) is
removed on success, on failure and on Ctrl-C, and the next run sweeps the one a ``kill -9`` left."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support.processes import kill_when, spawn_etl
from support.warehouses import coco_config
from warpdata.sampledata.detection import generate

pytestmark = pytest.mark.s3


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    d = tmp_path_factory.mktemp("spool") / "coco"
    generate(d, count=120, seed=7, min_side=64, max_side=120)
    return d


def _upload(s3, dataset: Path, prefix: str, images: bool = True) -> None:
    for p in sorted(dataset.rglob("*")):
        rel = p.relative_to(dataset).as_posix()
        if p.is_file() and (rel == "annotations.json" or (images and rel.startswith("images/"))):
            s3.client.put_object(Bucket=s3.bucket, Key=f"{prefix}/{rel}", Body=p.read_bytes())


def _runs(cache: Path) -> list[Path]:
    return sorted(cache.glob("etl-source/*/run-*"))


def _spooled(cache: Path) -> bool:
    return any(run.glob(".spool/*") for run in _runs(cache))


def test_spools_go_on_failure_ctrl_c_and_after_a_kill(dataset, tmp_path, s3):
    cache = tmp_path / "cache"
    env = {**os.environ, **s3.env, "WARP_CACHE_DIR": str(cache)}
    cfg = coco_config(dataset, tmp_path / "wh")

    # failure: labels without images (every image missing: the verdict fails, exit 65)
    _upload(s3, dataset, "noimg", images=False)
    r = subprocess.run([sys.executable, "-m", "warpdata", "etl", "--config", str(cfg), "--input", s3.url("noimg")],
                       capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 65, r.stderr
    assert _runs(cache) == []

    _upload(s3, dataset, "src")
    args = ("--input", s3.url("src"), "-j", "1")
    # Ctrl-C during the header pass, once bytes are spooled
    proc = subprocess.Popen([sys.executable, "-m", "warpdata", "etl", "--config", str(cfg), *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, start_new_session=True)
    deadline = time.monotonic() + 120
    while not _spooled(cache) and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.005)
    if proc.poll() is not None:
        pytest.skip("the header pass finished before Ctrl-C")
    os.killpg(proc.pid, signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err.decode()
    assert _runs(cache) == []

    # kill -9 with bytes spooled: the mirror stays; the next run sweeps it, and leaves none itself
    kill_when(spawn_etl(cfg, *args, env=env), lambda: _spooled(cache))
    left = _runs(cache)
    if not left:
        pytest.skip("the run finished before it could be killed")
    _wait_unlocked(left)  # the killed run's children (which share its lock) are gone too
    r = subprocess.run([sys.executable, "-m", "warpdata", "etl", "--config", str(cfg), "--json", *args],
                       capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["samples"] > 0
    assert _runs(cache) == [] and not any(p.exists() for p in left)


@pytest.mark.slow
def test_an_up_to_date_rerun_of_an_s3_source_reads_no_image_and_a_changed_one_is_read(tmp_path, s3):
    d = tmp_path / "many"
    generate(d, count=210, seed=11, min_side=32, max_side=48)
    _upload(s3, d, "src")
    n_images = len(list((d / "images").iterdir()))
    assert n_images >= 200
    env = {**os.environ, **s3.env, "WARP_CACHE_DIR": str(tmp_path / "cache")}
    cfg = coco_config(d, tmp_path / "wh")

    def run() -> dict:
        r = subprocess.run([sys.executable, "-m", "warpdata", "etl", "--config", str(cfg), "--json",
                            "--input", s3.url("src"), "-j", "2"], capture_output=True, text=True, timeout=300, env=env)
        assert r.returncode == 0, r.stderr
        return json.loads(r.stdout)

    first = run()
    assert first["shards_built"] > 0
    s3.reset_counts()
    again = run()
    assert again["version"] == first["version"] and again["shards_built"] == 0
    gets = s3.count("GET", "src/images/")
    assert gets <= 0.01 * n_images, (gets, n_images)  # the target: LISTs, not a GET per image
    assert gets == 0  # and in fact none: every object is recognised by its listed size and ETag
    assert s3.count("HEAD", "src/images/") == 0

    # one image replaced by other bytes: its ETag changes, it is read and hashed again
    name = sorted((d / "images").iterdir())[7].name
    other = sorted((d / "images").iterdir())[8].read_bytes()
    s3.client.put_object(Bucket=s3.bucket, Key=f"src/images/{name}", Body=other)
    s3.reset_counts()
    changed = run()
    assert changed["version"] != first["version"]
    assert any(q["key"] == f"src/images/{name}" for q in s3.requests("GET", "src/images/"))


def _wait_unlocked(runs, timeout: float = 60.0) -> None:
    """Wait until no process holds the lock of any of ``runs`` (a killed run's forked children share
    its ``flock`` and die a moment after it): the next run may then take them for dead, as it should."""
    import fcntl

    from warpdata.etl.spool import OWNER

    deadline = time.monotonic() + timeout
    for run in runs:
        try:
            fd = os.open(run / OWNER, os.O_RDWR)
        except FileNotFoundError:
            continue
        try:
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    fcntl.flock(fd, fcntl.LOCK_UN)
                    break
                except BlockingIOError:
                    assert time.monotonic() < deadline, f"{run}: still locked {timeout:.0f}s after its run was killed"
                    time.sleep(0.05)
        finally:
            os.close(fd)
