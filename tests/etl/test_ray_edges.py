"""``--executor ray`` has the edges the Dask path has: every node's access to the run's sources and
output is probed before any task (a missing S3 setting is exit 78 naming it and the node), and a
Ray started for the run ends with the driver, even after a ``kill -9`` of it
(warp/etl/access.py, warp/etl/lifeline.py)."""

from __future__ import annotations

import os
import signal
import time

import pytest
from support.processes import spawn_etl
from support.warehouses import coco_config
from warpdata.core.errors import AuthenticationError, ExitCode
from warpdata.etl.executors import make_runner, parse_executor
from warpdata.etl.lifeline import descendants
from warpdata.sampledata.detection import generate

ray = pytest.importorskip("ray")
pytestmark = [pytest.mark.slow, pytest.mark.skipif(not os.path.isdir("/proc"), reason="reads /proc (Linux)")]

GONE_WITHIN_S = 10


def _endpoint() -> str | None:
    return os.environ.get("WARP_S3_ENDPOINT")


def test_a_ray_node_without_s3_credentials_stops_the_run_naming_the_setting(s3, monkeypatch):
    # the nodes of a Ray started here take this process's environment: the S3 endpoint without keys
    for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.delenv(k)
    with pytest.raises(AuthenticationError) as e:
        make_runner(parse_executor("ray"), 1, access=[("source", f"s3://{s3.bucket}/src")])
    msg = str(e.value)
    assert "AWS_ACCESS_KEY_ID" in msg and "ray node" in msg and f"s3://{s3.bucket}/src" in msg
    assert e.value.exit_code == ExitCode.CONFIG == 78
    assert not ray.is_initialized()  # the Ray it started is shut down
    assert all("raylet" not in _cmd(p) for p in descendants(os.getpid()))


def test_ray_nodes_with_access_run_the_tasks_with_the_driver_store_settings(s3):
    r = make_runner(parse_executor("ray"), 1, access=[("source", f"s3://{s3.bucket}")])
    try:
        assert list(r.imap_unordered(os.getenv, ["WARP_S3_ENDPOINT"])) == [_endpoint()]
    finally:
        r.close()
    assert r.guard is None  # the watchdog was told the run ended (it kills nothing)


def _cmd(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def test_a_ray_started_for_the_run_ends_with_a_killed_driver(tmp_path):
    d = tmp_path / "coco"
    generate(d, count=400, seed=5, min_side=64, max_side=150)
    out = tmp_path / "wh"
    proc = spawn_etl(coco_config(d, out), "-x", "ray", "-j", "2")
    children: dict[int, str] = {}
    cmds: dict[int, str] = {}  # each noted process's last command line read (a Ray worker renames itself)

    def note() -> None:
        children.update(descendants(proc.pid))
        for p in children:
            cmds[p] = _cmd(p) or cmds.get(p, "")

    try:
        # killed once its first shard is receipted: Ray is up, its workers run the build, and the
        # driver is not yet shutting Ray down (a fixed wait here once let a quiet machine finish
        # the build first: the GCS server was gone before the kill)
        deadline = time.monotonic() + 180
        while proc.poll() is None and time.monotonic() < deadline:
            note()
            if list(out.glob(".warp-tmp-build-*/receipts/shard-*.json")):
                break
            time.sleep(0.05)
        note()
        if proc.poll() is not None:
            pytest.skip("the build finished before the driver could be killed")
        children = {p: s for p, s in children.items() if "lifeline" not in cmds[p]}
        for part in ("gcs_server", "raylet", "ray::"):  # the tree is up and noted, workers too
            assert any(part in cmds[p] for p in children), (part, {p: cmds[p] for p in children})
        os.kill(proc.pid, signal.SIGKILL)  # the driver only, as the OOM killer would
        proc.communicate(timeout=60)
        deadline = time.monotonic() + GONE_WITHIN_S
        while _alive(children) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert {p: _cmd(p) for p in _alive(children)} == {}
    finally:
        for pid in _alive(children):
            os.kill(pid, signal.SIGKILL)


def _alive(noted: dict[int, str]) -> list[int]:
    from warpdata.etl.lifeline import _start_time

    return [p for p, s in noted.items() if _start_time(p) == s and _state(p) != "Z"]


def _state(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "Z"
