"""Crash/resume and concurrent publishers, with real processes (local store and moto S3)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from warpdata.registry.store import Store

HASH = re.compile(r"^[0-9a-f]{64}$")


def _env(extra: dict[str, str]) -> dict[str, str]:
    return {**os.environ, **extra}


def _store_for(kind, s3_or_none, tmp_path):
    if kind == "s3":
        return s3_or_none.url("warp"), s3_or_none.env
    return str(tmp_path / "store"), {}


def _count_blobs(store: Store) -> int:
    if store.protocol == "file":
        root = os.path.join(store.location.path, "blobs")
        # only whole blobs count: a killed writer may leave a .warp-tmp-* file, never a blob
        return sum(1 for _, _, fs in os.walk(root) for f in fs if HASH.match(f)) if os.path.isdir(root) else 0
    store.fs.invalidate_cache()
    try:
        return len(store.fs.find(store.location.join("blobs").path))
    except FileNotFoundError:
        return 0


@pytest.fixture(params=["local", pytest.param("s3", marks=[pytest.mark.s3, pytest.mark.slow])])
def backend(request, tmp_path):
    if request.param == "s3":
        return "s3", request.getfixturevalue("s3")
    return "local", None


def test_killed_publish_resumes(backend, tmp_path):
    kind, s3 = backend
    url, extra = _store_for(kind, s3, tmp_path)
    src = tmp_path / "raw"
    src.mkdir()
    for i in range(48):
        (src / f"{i:03d}.bin").write_bytes(os.urandom(150_000))
    cmd = [sys.executable, "-m", "warpdata", "publish", "ws/crash", "--artifact", f"raw={src}",
           "--shard-size", "160KB", "--workers", "1", "--store", url, "--json"]
    store = Store(url)
    proc = subprocess.Popen(cmd, env=_env(extra), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    # Let the publisher run in 10 ms slices and count while it is stopped: the count cannot race
    # ahead of the kill (a busy CI once saw all 49 blobs land during one slow S3 listing).
    deadline = time.monotonic() + 120
    while proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
        proc.send_signal(signal.SIGSTOP)
        if _count_blobs(store) >= 3:
            break
        proc.send_signal(signal.SIGCONT)
    proc.send_signal(signal.SIGKILL)
    proc.communicate()
    assert proc.returncode == -signal.SIGKILL, "the publish finished before it could be killed"

    present = _count_blobs(store)
    assert 3 <= present < 49  # 48 shards + index: some, not all
    assert store.list_versions("ws/crash") == []  # no manifest can point at missing blobs
    assert store.read_latest("ws/crash") is None

    done = subprocess.run(cmd, env=_env(extra), capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    res = json.loads(done.stdout)
    assert res["blobs_total"] == 49
    assert res["blobs_uploaded"] == 49 - present  # only what was missing
    m = store.resolve("ws/crash")
    for b in m.blobs():
        store.get_blob(b.hash)  # whole and verified: no torn blob survived the kill


def _write_table(path, seed: int) -> None:
    pq.write_table(pa.table({"path": [f"{i:03d}.bin" for i in range(8)], "seed": [seed] * 8}), path)


def test_concurrent_publishers(backend, tmp_path):
    """Parallel processes publish different versions of one dataset (sharing an artifact's blobs)."""
    kind, s3 = backend
    url, extra = _store_for(kind, s3, tmp_path)
    shared = tmp_path / "shared"
    shared.mkdir()
    for i in range(8):
        (shared / f"{i:03d}.bin").write_bytes(os.urandom(20_000))
    procs = []
    for p in range(4):
        t = tmp_path / f"t{p}.parquet"
        _write_table(t, p)
        cmd = [sys.executable, "-m", "warpdata", "publish", "ws/conc", "--table", f"main={t}",
               "--artifact", f"raw={shared}", "--bind", "main.path=raw:file", "--shard-size", "64KB",
               "--store", url, "--json"]
        procs.append(subprocess.Popen(cmd, env=_env(extra), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    versions = set()
    for proc in procs:
        out, err = proc.communicate(timeout=180)
        assert proc.returncode == 0, err
        versions.add(json.loads(out)["version_hash"])
    assert len(versions) == 4
    store = Store(url)
    assert set(store.list_versions("ws/conc")) == versions
    for v in versions:  # every version landed whole
        m = store.get_manifest("ws/conc", v)
        for b in m.blobs():
            store.get_blob(b.hash)
    latest = store.read_latest("ws/conc")
    assert latest is not None and latest.version_hash in versions  # one of them, never torn
