"""``kill -9`` of the driver of ``warp etl -x process``: the fork server, its pool workers and the
resource tracker end too (warp/etl/lifeline.py), instead of staying for good."""

from __future__ import annotations

import os
import signal
import time

import pytest
from support.processes import spawn_etl
from support.warehouses import coco_config
from warpdata.sampledata.detection import generate

GONE_WITHIN_S = 10


def _session(sid: int) -> list[tuple[int, str]]:
    """Live processes of session ``sid`` (the driver's, started with ``start_new_session``)."""
    out = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace")[:100]
        except OSError:
            continue
        if int(fields[3]) == sid and fields[0] != "Z":
            out.append((int(pid), cmd))
    return out


def _driver_with_a_receipt(tmp_path, executor: str):
    """A `warp etl -x EXECUTOR -j 2` driver, once its first shard is receipted, and its children
    then (skips when the build finished before that could be seen)."""
    d = tmp_path / "coco"
    generate(d, count=40, seed=5, min_side=64, max_side=150)
    out = tmp_path / "wh"
    proc = spawn_etl(coco_config(d, out), "-x", executor, "-j", "2")
    deadline = time.monotonic() + 120
    while not list(out.glob(".warp-tmp-build-*/receipts/shard-*.json")) and proc.poll() is None \
            and time.monotonic() < deadline:
        time.sleep(0.01)
    children = [p for p in _session(proc.pid) if p[0] != proc.pid]
    if proc.poll() is not None:
        pytest.skip("the build finished before the driver could be killed")
    return proc, children


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="reads the process table from /proc (Linux)")
def test_children_of_a_killed_process_pool_driver_end_with_it(tmp_path):
    proc, children = _driver_with_a_receipt(tmp_path, "process")
    try:
        assert any("forkserver" in c for _, c in children), children  # the pool is up
        os.kill(proc.pid, signal.SIGKILL)  # the driver only, as the OOM killer would
        proc.communicate(timeout=60)
        deadline = time.monotonic() + GONE_WITHIN_S
        while _session(proc.pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _session(proc.pid) == []
    finally:
        if _session(proc.pid):
            os.killpg(proc.pid, signal.SIGKILL)


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="reads the process table from /proc (Linux)")
def test_a_killed_dask_driver_leaves_nothing_running(tmp_path):
    """``--executor dask``'s own LocalCluster runs a worker process per worker, forked from a fork
    server (warp/etl/daskrunner.py, OWN_CLUSTER_LAYOUT); each follows the driver
    (warp/etl/lifeline.py), so a ``kill -9`` of the driver leaves nothing of the run: no worker,
    no fork server, no resource tracker."""
    pytest.importorskip("distributed", reason="the dask extra (dask, distributed) is not installed")
    proc, children = _driver_with_a_receipt(tmp_path, "dask")
    try:
        # the cluster is up (a shard is receipted): its worker processes and their fork server
        assert sum("forkserver" in c for _, c in children) >= 1, children
        assert len(children) >= 3, children  # the fork server and two workers at least
        os.kill(proc.pid, signal.SIGKILL)
        proc.communicate(timeout=60)
        deadline = time.monotonic() + GONE_WITHIN_S
        while _session(proc.pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _session(proc.pid) == []
    finally:
        if _session(proc.pid):
            os.killpg(proc.pid, signal.SIGKILL)
