"""AlignedFile: aligned pieces bypass the page cache where allowed, everything else is written normally."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from warpdata.core.directio import BLOCK, AlignedFile, aligned_empty


def test_aligned_empty_is_aligned_zeroed_and_sized():
    for n in (0, 1, BLOCK, 3 * BLOCK + 5):
        a = aligned_empty(n)
        assert a.nbytes == n and not a.any()
        assert n == 0 or a.ctypes.data % BLOCK == 0


def test_pieces_land_at_their_offsets_aligned_or_not(tmp_path):
    path = tmp_path / "f"
    path.touch()
    rng = np.random.default_rng(0)
    whole = aligned_empty(4 * BLOCK)
    whole[:] = rng.integers(0, 256, whole.size)
    odd = rng.integers(0, 256, 1000).astype(np.uint8)
    with AlignedFile(path) as f:
        f.write(BLOCK, whole)                  # aligned everything: O_DIRECT if the filesystem allows it
        f.write(5 * BLOCK + 3, odd)           # unaligned offset and length: buffered
        f.write(0, whole[1:BLOCK + 1])         # misaligned memory: buffered
        assert f.direct_bytes + f.buffered_bytes == 4 * BLOCK + 1000 + BLOCK
        assert f.buffered_bytes >= 1000 + BLOCK
    data = np.fromfile(path, np.uint8)
    assert len(data) == 5 * BLOCK + 3 + 1000
    assert (data[:BLOCK] == whole[1:BLOCK + 1]).all()
    assert (data[BLOCK:5 * BLOCK] == whole).all()
    assert (data[5 * BLOCK + 3:] == odd).all()


def test_direct_false_never_uses_o_direct(tmp_path):
    (tmp_path / "f").touch()
    with AlignedFile(tmp_path / "f", direct=False) as f:
        f.write(0, aligned_empty(BLOCK))
        assert not f.direct and f.direct_bytes == 0 and f.buffered_bytes == BLOCK


def test_submit_runs_in_the_background_and_wait_reraises(tmp_path):
    (tmp_path / "f").touch()
    seen = []
    with ThreadPoolExecutor(1) as io:
        f = AlignedFile(tmp_path / "f", io=io)
        orig = f.write

        def spy(offset, buf):
            seen.append(threading.current_thread().name)
            orig(offset, buf)

        f.write = spy
        f.submit(0, aligned_empty(2 * BLOCK))
        f.wait()
        assert seen and seen[0] != threading.current_thread().name
        f.submit(0, np.zeros(10, np.uint8)[::2])  # not contiguous: the write fails in the background thread
        with pytest.raises((TypeError, ValueError, BufferError)):
            f.wait()
        f.close()
    assert (tmp_path / "f").stat().st_size == 2 * BLOCK


def test_truncate_sets_the_final_size(tmp_path):
    (tmp_path / "f").touch()
    with AlignedFile(tmp_path / "f") as f:
        f.write(0, aligned_empty(2 * BLOCK))
        f.truncate(BLOCK + 17)
    assert (tmp_path / "f").stat().st_size == BLOCK + 17


def test_filesystem_type_and_the_direct_io_switch(tmp_path, monkeypatch):
    from warpdata.core.directio import DIRECT_FILESYSTEMS, filesystem_type, wants_direct

    fs = filesystem_type(tmp_path)
    assert fs  # this suite runs on Linux with /proc
    assert filesystem_type(tmp_path / "not" / "yet" / "made") == fs  # nearest existing ancestor
    monkeypatch.delenv("WARP_DIRECT_IO", raising=False)
    assert wants_direct(tmp_path) is (fs in DIRECT_FILESYSTEMS)
    if filesystem_type("/dev/shm") == "tmpfs":
        assert not wants_direct("/dev/shm")  # tmpfs copies into memory either way
    monkeypatch.setenv("WARP_DIRECT_IO", "0")
    assert not wants_direct(tmp_path)
    monkeypatch.setenv("WARP_DIRECT_IO", "1")
    assert wants_direct("/dev/shm")


def test_aligned_buffers_are_pooled_and_reused(monkeypatch):
    from warpdata.core import directio
    from warpdata.core.directio import give_aligned, take_aligned

    monkeypatch.setattr(directio, "_POOL", [])  # other tests in this process may have pooled some

    a = take_aligned(5 << 20)
    assert a.nbytes >= 5 << 20 and a.ctypes.data % BLOCK == 0
    give_aligned(a)
    b = take_aligned(1 << 20)  # a free buffer that fits is reused, not allocated
    assert b is a
    c = take_aligned(1 << 20)  # none free now: a new one
    assert c is not a
    give_aligned(b)
    give_aligned(c)
    big = take_aligned(40 << 20)
    give_aligned(big)  # pool: a, c (16 MiB), big (48 MiB)
    assert take_aligned(20 << 20) is big  # the only one that fits, not first in the pool
    got = take_aligned(1 << 20)
    assert got is a or got is c


def test_filesystem_type_falls_back_to_the_longest_mount_point(tmp_path, monkeypatch):
    """btrfs subvolumes report st_dev values that mountinfo does not list: match by mount point."""
    from warpdata.core import directio
    table = ({}, [(str(tmp_path / "sub"), "xfs"), (str(tmp_path), "btrfs"), ("/", "ext4")])
    monkeypatch.setattr(directio, "_mounts", lambda: table)
    (tmp_path / "sub" / "deeper").mkdir(parents=True)
    (tmp_path / "subway").mkdir()
    assert directio.filesystem_type(tmp_path / "sub" / "deeper" / "new.bin") == "xfs"
    assert directio.filesystem_type(tmp_path / "subway") == "btrfs"  # a prefix of the name is not a parent
    assert directio.filesystem_type(tmp_path) == "btrfs"
    assert directio.filesystem_type("/") == "ext4"
