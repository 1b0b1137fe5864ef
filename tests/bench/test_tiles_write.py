"""bench/tiles_write.py's CPU accounting by thread role (the profile that holds under load)."""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

import tiles_write  # noqa: E402

pytestmark = pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="needs Linux /proc")


def _spin(cpu_s: float, spun: threading.Event, done: threading.Event) -> None:
    t0 = time.thread_time()
    while time.thread_time() - t0 < cpu_s:  # CPU time, whatever the machine's load
        pass
    spun.set()
    done.wait()


def test_cpu_is_attributed_to_the_thread_role_that_burned_it():
    spun, done = threading.Event(), threading.Event()
    worker = threading.Thread(target=_spin, args=(0.15, spun, done), name="warp-tiles-cpu_3")
    try:
        with tiles_write.ThreadRoles() as roles:
            worker.start()
            spun.wait()
    finally:
        done.set()
        worker.join()
    # the pool index is dropped from the name; the clock ticks are 10 ms
    assert roles.cpu["warp-tiles-cpu"] >= 0.15 - 0.02
    assert "bench-roles" not in roles.cpu and roles.cpu.get("warp-tiles-io", 0.0) == 0.0
