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


def test_stage_profile_times_every_stage_and_puts_the_writer_back(tmp_path):
    """--stages: each stage of a real write gets CPU seconds, and the writer is unpatched after."""
    import numpy as np
    from warpdata.formats import crc, zarr_v3
    from warpdata.kernels import cpu
    from warpdata.storage import zarr_store
    from warpdata.tiles import writer

    if cpu._zc is None:
        pytest.skip("zstandard without its cffi binding: the CPU backend has no direct path to time")
    before = (cpu._zc, cpu.crc32c, writer.crc32c, zarr_v3.shard_parts, writer.TileWriter.__dict__["_put_object"],
              writer.TileWriter.__dict__["_collect_loop"], zarr_store.Store.__dict__["put"],
              cpu.CpuBackend.__dict__["_compress_direct"], cpu.CpuBackend.__dict__["_tile_source"])
    rng = np.random.default_rng(0)
    a = (rng.integers(0, 64, (64, 256, 256)) + np.arange(256)).astype(np.uint16)  # 8 MiB, some structure
    prof = tiles_write.stage_profile(a, 1, str(tmp_path), chunks=(64, 64, 64), shards=(64, 128, 128))
    after = (cpu._zc, cpu.crc32c, writer.crc32c, zarr_v3.shard_parts, writer.TileWriter.__dict__["_put_object"],
             writer.TileWriter.__dict__["_collect_loop"], zarr_store.Store.__dict__["put"],
             cpu.CpuBackend.__dict__["_compress_direct"], cpu.CpuBackend.__dict__["_tile_source"])
    assert all(x is y for x, y in zip(before, after, strict=True))
    assert writer.crc32c is crc
    for stage in ("workers: zstd", "workers: tile gather", "workers: chunk CRC-32C", "io: SHA-256 of each object",
                  "io: put (write, fsync, rename)", "collector: input CRC-32C"):
        assert prof[stage] > 0, stage
    assert prof["workers: zstd"] > prof["workers: chunk CRC-32C"]
    parts = sum(v for k, v in prof.items() if k not in ("process", "other"))
    assert abs(parts + prof["other"] - prof["process"]) < 1e-9
    assert not list(tmp_path.iterdir())  # the outputs are removed
