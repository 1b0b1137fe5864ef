"""Atomic writes: a crash leaves the old state or the new one, never a mix."""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import subprocess
import sys
import textwrap

import pytest
from warpdata.core.atomic import (
    TMP_PREFIX,
    atomic_dir,
    atomic_file,
    atomic_write_bytes,
    atomic_write_text,
    create_exclusive,
    rename_noreplace,
)


def leftovers(d) -> list[str]:
    return sorted(n for n in os.listdir(d) if n.startswith(TMP_PREFIX))


def test_atomic_file_writes_and_replaces(tmp_path):
    p = tmp_path / "sub" / "f.bin"
    with atomic_file(p) as f:
        f.write(b"one")
        assert not p.exists()  # nothing visible until the block completes
    assert p.read_bytes() == b"one"
    atomic_write_bytes(p, memoryview(b"two"))
    assert p.read_bytes() == b"two"
    atomic_write_text(p, "drei ü")
    assert p.read_text(encoding="utf-8") == "drei ü"
    assert oct(p.stat().st_mode & 0o777) == oct(0o644)
    assert leftovers(p.parent) == []


def test_atomic_file_exception_keeps_old_content(tmp_path):
    p = tmp_path / "f"
    p.write_bytes(b"old")
    with pytest.raises(RuntimeError), atomic_file(p) as f:
        f.write(b"half of the new")
        raise RuntimeError("crash mid-write")
    assert p.read_bytes() == b"old"
    assert leftovers(tmp_path) == []


KILLED_WRITER = textwrap.dedent("""
    import sys, time
    from warpdata.core.atomic import atomic_file, atomic_dir
    target, kind = sys.argv[1], sys.argv[2]
    if kind == "file":
        with atomic_file(target) as f:
            f.write(b"new" * 100000)
            f.flush()
            print("writing", flush=True)
            time.sleep(60)
    else:
        with atomic_dir(target, replace=True) as d:
            (d / "a").write_bytes(b"new")
            print("writing", flush=True)
            time.sleep(60)
""")


@pytest.mark.parametrize("kind", ["file", "dir"])
def test_process_killed_mid_write_leaves_old_state(tmp_path, kind):
    target = tmp_path / "target"
    if kind == "file":
        target.write_bytes(b"old")
    else:
        target.mkdir()
        (target / "a").write_bytes(b"old")
    p = subprocess.Popen([sys.executable, "-c", KILLED_WRITER, str(target), kind], stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline() == "writing\n"
        os.kill(p.pid, signal.SIGKILL)
    finally:
        p.wait(timeout=30)
    assert p.returncode == -signal.SIGKILL
    if kind == "file":
        assert target.read_bytes() == b"old"
    else:
        assert sorted(os.listdir(target)) == ["a"] and (target / "a").read_bytes() == b"old"
    # the killed run's temporary is recognisable for cleanup
    assert len(leftovers(tmp_path)) == 1


def test_create_exclusive(tmp_path):
    p = tmp_path / "d" / "x"
    assert create_exclusive(p, b"first") is True
    assert create_exclusive(p, b"second") is False
    assert p.read_bytes() == b"first"
    assert leftovers(p.parent) == []


def _racer(path, i, barrier, results):
    barrier.wait()
    results.put((i, create_exclusive(path, f"writer {i}".encode())))


@pytest.mark.parametrize("trial", range(3))
def test_racing_create_exclusive_has_exactly_one_winner(tmp_path, trial):
    ctx = mp.get_context("fork")
    n = 8
    barrier, results = ctx.Barrier(n), ctx.Queue()
    path = tmp_path / "latest"
    procs = [ctx.Process(target=_racer, args=(path, i, barrier, results)) for i in range(n)]
    for p in procs:
        p.start()
    got = dict(results.get(timeout=60) for _ in range(n))
    for p in procs:
        p.join(timeout=60)
    winners = [i for i, won in got.items() if won]
    assert len(winners) == 1
    assert path.read_bytes() == f"writer {winners[0]}".encode()
    assert leftovers(tmp_path) == []


def test_atomic_dir_builds_then_renames(tmp_path):
    target = tmp_path / "art"
    with atomic_dir(target) as d:
        (d / "sub").mkdir()
        (d / "sub" / "x").write_bytes(b"x")
        assert not target.exists() and d.name.startswith(TMP_PREFIX)
    assert (target / "sub" / "x").read_bytes() == b"x"
    assert leftovers(tmp_path) == []


def test_atomic_dir_failure_leaves_nothing(tmp_path):
    target = tmp_path / "art"
    with pytest.raises(ValueError), atomic_dir(target) as d:
        (d / "x").write_bytes(b"x")
        raise ValueError("bad sample")
    assert not target.exists() and leftovers(tmp_path) == []


def test_atomic_dir_refuses_existing_unless_replace(tmp_path):
    target = tmp_path / "art"
    target.mkdir()
    (target / "old").write_bytes(b"old")
    with pytest.raises(FileExistsError), atomic_dir(target):
        pytest.fail("the body must not run when the target exists")
    with atomic_dir(target, replace=True) as d:
        (d / "new").write_bytes(b"new")
    assert sorted(os.listdir(target)) == ["new"]
    assert leftovers(tmp_path) == []


def test_atomic_dir_loses_a_race_cleanly(tmp_path):
    target = tmp_path / "art"
    with pytest.raises(FileExistsError), atomic_dir(target) as d:
        (d / "mine").write_bytes(b"mine")
        target.mkdir()  # another writer finishes first
        (target / "theirs").write_bytes(b"theirs")
    assert sorted(os.listdir(target)) == ["theirs"]
    assert leftovers(tmp_path) == []


def test_atomic_dir_keeps_a_racing_writers_empty_directory(tmp_path):
    """rename(2) replaces an empty directory; the no-replace move keeps the other writer's."""
    target = tmp_path / "art"
    with pytest.raises(FileExistsError), atomic_dir(target) as d:
        (d / "mine").write_bytes(b"mine")
        target.mkdir()  # another writer has just claimed the name
    assert os.listdir(target) == [] and leftovers(tmp_path) == []


@pytest.mark.parametrize("route", ["renameat2", "link"])
def test_rename_noreplace(tmp_path, route, monkeypatch):
    """Moves a file to a free name; refuses a taken one (file or directory), leaving both as they were."""
    import warpdata.core.atomic as atomic

    if route == "link":  # the fallback where renameat2 is missing (old glibc, other systems)
        monkeypatch.setattr(atomic, "_renameat2", False)
    src, dst = tmp_path / "new", tmp_path / "out"
    src.write_bytes(b"new")
    rename_noreplace(src, dst)
    assert dst.read_bytes() == b"new" and not src.exists()
    src.write_bytes(b"second")
    with pytest.raises(FileExistsError):
        rename_noreplace(src, dst)
    assert dst.read_bytes() == b"new" and src.read_bytes() == b"second"
    (tmp_path / "d").mkdir()
    with pytest.raises(FileExistsError):
        rename_noreplace(src, tmp_path / "d")
    assert src.exists()


def test_atomic_file_exclusive_never_replaces(tmp_path):
    p = tmp_path / "loader.py"
    atomic_write_text(p, "first", exclusive=True)
    with pytest.raises(FileExistsError), atomic_file(p, exclusive=True) as f:
        f.write(b"second")
    assert p.read_text() == "first" and leftovers(tmp_path) == []


def test_exchange_swaps_two_directories_in_one_step(tmp_path):
    from warpdata.core.atomic import exchange

    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    (a / "x").write_text("new")
    (b / "x").write_text("old")
    if not exchange(a, b):
        pytest.skip("renameat2(RENAME_EXCHANGE) is not available here (documented two-rename fallback)")
    assert (b / "x").read_text() == "new" and (a / "x").read_text() == "old"


def test_atomic_dir_replace_leaves_no_temp_and_sweeps_killed_runs_leftovers(tmp_path):
    """Issue #5: a replace killed between its renames left temp trees forever; the next run removes them."""
    import os
    import subprocess
    import sys
    import time

    from warpdata.core.atomic import atomic_dir

    target = tmp_path / "cache"
    with atomic_dir(target) as d:
        (d / "f").write_text("1")
    # leftovers of a killed run: a dead writer's temp and an old-tree temp without a pid
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True, check=True).stdout.strip()
    stale = [tmp_path / f".warp-tmp-{dead}-abcd1234-cache", tmp_path / ".warp-tmp-old-abcd1234-cache"]
    for p in stale:
        p.mkdir()
        (p / "f").write_text("junk")
        os.utime(p, (time.time() - 10, time.time() - 10))
    live = tmp_path / f".warp-tmp-{os.getppid()}-abcd1234-cache"  # a running process's temp stays
    live.mkdir()
    os.utime(live, (time.time() - 10, time.time() - 10))
    with atomic_dir(target, replace=True) as d:
        (d / "f").write_text("2")
    assert (target / "f").read_text() == "2"
    left = sorted(p.name for p in tmp_path.iterdir())
    assert left == sorted(["cache", live.name]), left


def test_remove_stale_temps_recursive_keeps_fresh_and_live(tmp_path):
    import os
    import time

    from warpdata.core.atomic import remove_stale_temps

    sub = tmp_path / "blobs" / "sha256" / "ab"
    sub.mkdir(parents=True)
    old = sub / ".warp-tmp-zz-abc"
    old.write_text("x")
    os.utime(old, (time.time() - 100, time.time() - 100))
    fresh = sub / ".warp-tmp-yy-abc"
    fresh.write_text("x")
    mine_live = sub / f".warp-tmp-{os.getppid()}-abc"
    mine_live.write_text("x")
    os.utime(mine_live, (time.time() - 100, time.time() - 100))
    removed = remove_stale_temps([tmp_path / "blobs"], older_than=time.time() - 50, recursive=True)
    assert removed == [str(old)] and fresh.exists() and mine_live.exists()


def test_a_failed_rename_names_the_target_not_the_temporary_file(tmp_path):
    # review finding: writing over a directory said "cannot write /d/.warp-tmp-…-out -> /d/out"
    from warpdata.core.errors import CannotCreateError, os_failure

    (tmp_path / "out").mkdir()
    with pytest.raises(IsADirectoryError) as e:
        atomic_write_bytes(tmp_path / "out", b"x")
    err = os_failure(e.value)
    assert isinstance(err, CannotCreateError)
    assert err.message == f"cannot write {tmp_path / 'out'}: it is a directory"
    assert [p.name for p in tmp_path.iterdir()] == ["out"]
