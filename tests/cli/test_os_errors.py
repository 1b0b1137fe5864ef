"""Every command meets the operating system's common refusals with a typed exit, never exit 70.

A table of one working command line per command (``RUNS``; a test checks that it names every
command of ``COMMANDS``) is run against real failures, in-process unless a limit needs a
process of its own:

* stdout is ``/dev/full`` (ENOSPC on write): exit 74 naming stdout where the command prints
  data, 0 where it prints none;
* stdout is a pipe whose reader has gone (EPIPE): exit 141 and no error, as Unix tools do;
* ``WARP_CACHE_DIR`` is a regular file: 0 where the command needs no cache, else 78 naming
  the variable;
* the output goes into a read-only directory (chmod 0555; as root, which ignores modes, the
  directory is made immutable with ``chattr +i``): 77 naming the path;
* ``RLIMIT_FSIZE`` (``ulimit -f``) below the output's size, in a subprocess: 74, "file too
  large" (CPython ignores SIGXFSZ, so the write fails with EFBIG).

Exit codes: warp(1) EXIT STATUS, ``warpdata.core.errors.ExitCode``.
"""

from __future__ import annotations

import io
import itertools
import os
import resource
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

import pytest
from warpdata.cli.app import COMMANDS, main

_seq = itertools.count()


def _n() -> int:
    return next(_seq)


# command -> argv (a function of the scratch world W, with its sample data and published store)
RUNS: dict[str, Callable[[Path], list[str]]] = {
    "etl": lambda w: ["etl", "--config", f"{w}/coco/transform.toml", "-o", f"{w}/etl-out-{_n()}", "-j", "1"],
    "ingest": lambda w: ["ingest", "imagefolder", f"{w}/imgs", f"demo/media{_n()}", "--workers", "1"],
    "embeddings": lambda w: ["embeddings", "list", "demo/photos"],
    "tar-to-tbl": lambda w: ["tar-to-tbl", f"{w}/shard.tar", f"{w}/tbl-{_n()}.tbl"],
    "publish": lambda w: ["publish", "demo/photos", "--table", f"main={w}/data/*.parquet", "--artifact",
                          f"media={w}/imgs", "--bind", "main.image=media:image"],
    "register": lambda w: ["register", "demo/local", "--table", f"main={w}/data/p0.parquet"],
    "unregister": lambda w: ["unregister", "demo/local"],
    "ls": lambda w: ["ls"],
    "info": lambda w: ["info", "demo/photos"],
    "schema": lambda w: ["schema", "demo/photos"],
    "head": lambda w: ["head", "demo/photos"],
    "inspect": lambda w: ["inspect", "demo/photos"],
    "stream": lambda w: ["stream", "demo/photos"],
    "cat": lambda w: ["cat", "demo/photos", "--artifact", "media", "--ref", "img/0000.png"],
    "warm": lambda w: ["warm", "demo/photos"],
    "cache": lambda w: ["cache", "stats"],
    "init": lambda w: ["init", "demo/photos", "--out", f"{w}/loader-{_n()}.py"],
    "doctor": lambda w: ["doctor", "--only", "store"],
    "order": lambda w: ["order", "demo/photos", "--seed", "1"],
    "why": lambda w: ["why", "demo/photos", "0"],
    "diff": lambda w: ["diff", "demo/photos", "--from", _version(w)],
    "card": lambda w: ["card", "demo/photos", "--out", f"{w}/card-{_n()}.md"],
    "gc": lambda w: ["gc", "--dry-run"],  # the world's store is shared by the tests: mark and count only
}
def _version(w: Path) -> str:
    """demo/photos' published version (diff of a version against itself: exit 0)."""
    import json

    return json.loads((w / "store" / "datasets" / "demo" / "photos" / "latest.json").read_text())["version_hash"]


# commands that run only after another (unregister needs a registration)
BEFORE: dict[str, list[str]] = {"unregister": ["register"]}


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> Path:
    """Sample data (photos, a WebDataset tar, detection labels) and demo/photos published in W/store."""
    from warpdata.sampledata.__main__ import main as sample

    w = tmp_path_factory.mktemp("os-world")
    assert sample(["photos", str(w), "--count", "12"]) == 0
    assert sample(["wds", str(w / "shard.tar"), "--count", "8"]) == 0
    assert sample(["detection", str(w / "coco"), "--count", "8"]) == 0
    with pytest.MonkeyPatch.context() as mp:
        _env(mp, w, w / "cache")
        assert main(RUNS["publish"](w)) == 0
    return w


def _env(mp: pytest.MonkeyPatch, w: Path, cache: Path) -> None:
    mp.setenv("WARP_STORE", str(w / "store"))
    mp.setenv("WARP_CACHE_DIR", str(cache))
    mp.chdir(w)


@pytest.fixture
def env(world, tmp_path, monkeypatch) -> Path:
    _env(monkeypatch, world, tmp_path / "cache")
    return world


def _run(name: str, w: Path, stdout: Callable[[], io.RawIOBase] | None = None) -> int:
    """Run command ``name`` (after the ones it needs), its stdout on ``stdout()`` when given."""
    for before in BEFORE.get(name, []):
        assert main(RUNS[before](w)) == 0
    if stdout is None:
        return main(RUNS[name](w))
    with _stdout_to(stdout()):
        return main(RUNS[name](w))


@contextmanager
def _stdout_to(raw: io.RawIOBase) -> Iterator[None]:
    saved = sys.stdout
    sys.stdout = io.TextIOWrapper(io.BufferedWriter(raw), encoding="utf-8")
    try:
        yield
    finally:
        sys.stdout = saved
        with suppress(OSError):  # /dev/full: the last flush of what the command left buffered
            raw.close()


@pytest.fixture
def prints(env, capfd) -> dict[str, bool]:
    """Whether each command prints data on stdout when nothing fails (the baseline)."""
    got = {}
    for name in RUNS:
        for before in BEFORE.get(name, []):
            assert main(RUNS[before](env)) == 0
        capfd.readouterr()
        code = main(RUNS[name](env))
        o, e = capfd.readouterr()
        assert code == 0 or (name == "doctor" and code == 1), (name, code, e)
        got[name] = bool(o)
    return got


def _closed_pipe() -> io.RawIOBase:
    r, w = os.pipe()
    os.close(r)
    return io.FileIO(w, "w")


def test_every_command_has_a_run():
    assert set(RUNS) == {c.name for c in COMMANDS}


def test_stdout_full_and_stdout_closed(env, prints, capfd):
    """`warp X > /dev/full`: 74 naming stdout; `warp X | (exit)`: 141, quietly. Never 70."""
    for name in RUNS:
        capfd.readouterr()
        code = _run(name, env, lambda: io.FileIO("/dev/full", "w"))
        err = capfd.readouterr().err
        assert "internal error" not in err and "Traceback" not in err, (name, err)
        if prints[name]:
            assert code == 74, (name, code, err)
            assert "error: no space left on the device writing stdout" in err, (name, err)
        else:
            assert code in (0, 1 if name == "doctor" else 0), (name, code, err)

        code = _run(name, env, _closed_pipe)
        err = capfd.readouterr().err
        assert "error" not in err.lower() or name == "doctor", (name, err)
        assert code == (141 if prints[name] else 0) or (name == "doctor" and code in (1, 141)), (name, code, err)


# commands that print data, run for real with stdout on /dev/full (the shell's `> /dev/full`)
PRINTERS = [["stream", "demo/photos"], ["stream", "demo/photos", "--format", "csv"],
            ["stream", "demo/photos", "--format", "arrow"], ["stream", "demo/photos", "--limit", "3"],
            ["head", "demo/photos"], ["ls"], ["info", "demo/photos"], ["schema", "demo/photos"],
            ["inspect", "demo/photos"], ["order", "demo/photos", "--seed", "1"], ["why", "demo/photos", "0"]]


@pytest.mark.parametrize("argv", PRINTERS, ids=" ".join)
def test_stdout_on_dev_full_in_a_process_names_stdout(argv, env, tmp_path):
    """Issue 36: `warp stream X > /dev/full` named `<stderr>` (an object in the failing frame held
    stderr, and was looked at before the stdout the frame wrote to): 74 naming stdout."""
    with open("/dev/full", "w") as full:
        p = subprocess.run([sys.executable, "-m", "warpdata", *argv], cwd=env, stdout=full, stderr=subprocess.PIPE,
                           env={**os.environ, "WARP_CACHE_DIR": str(tmp_path / "cache")}, text=True, timeout=300)
    assert p.returncode == 74, (p.returncode, p.stderr)
    assert p.stderr.startswith("error: no space left on the device writing stdout\n"), p.stderr
    assert "<stderr>" not in p.stderr and "Traceback" not in p.stderr


def test_cache_dir_is_a_file(env, tmp_path, monkeypatch, capfd):
    """WARP_CACHE_DIR naming a regular file: 78 naming the variable, or 0 for commands that need no cache."""
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("a file\n")
    monkeypatch.setenv("WARP_CACHE_DIR", str(blocker))
    failed = []
    for name in RUNS:
        capfd.readouterr()
        code = _run(name, env) if name not in BEFORE else main(RUNS[name](env))
        err = capfd.readouterr().err
        assert "internal error" not in err and "Traceback" not in err, (name, err)
        if name == "doctor":
            assert code == 1 and "WARP_CACHE_DIR" in err or code == 0, (name, code, err)
            continue
        assert code in (0, 78), (name, code, err)
        if code == 78:
            assert f"WARP_CACHE_DIR={blocker} is not a directory" in err, (name, err)
            failed.append(name)
    # the commands that keep state in the cache directory cannot have run
    assert {"warm", "register", "cache", "stream"} <= set(failed), failed


@contextmanager
def _read_only_dir(path: Path) -> Iterator[Path]:
    """A directory no write can go into: mode 0555, and immutable for root (who ignores modes)."""
    path.mkdir()
    path.chmod(0o555)
    immutable = os.geteuid() == 0
    if immutable and (not shutil.which("chattr") or subprocess.run(["chattr", "+i", str(path)]).returncode):
        pytest.skip("running as root without chattr +i: no directory is read-only to root")
    try:
        yield path
    finally:
        if immutable:
            subprocess.run(["chattr", "-i", str(path)], check=True)
        path.chmod(0o755)


# command -> argv writing under the read-only directory RO (W: the world)
WRITES: dict[str, Callable[[Path, Path], list[str]]] = {
    "etl": lambda w, ro: ["etl", "--config", f"{w}/coco/transform.toml", "-o", f"{ro}/out", "-j", "1"],
    "tar-to-tbl": lambda w, ro: ["tar-to-tbl", f"{w}/shard.tar", f"{ro}/train.tbl"],
    "init": lambda w, ro: ["init", "demo/photos", "--out", f"{ro}/loader.py"],
    "publish": lambda w, ro: [*RUNS["publish"](w), "--store", f"{ro}/store"],
    "warm": lambda w, ro: ["warm", "demo/photos"],  # WARP_CACHE_DIR=RO/cache
    "inspect": lambda w, ro: ["inspect", "demo/photos", "--preview", f"{ro}/sheet.png"],
}


@pytest.mark.parametrize("name", sorted(WRITES))
def test_output_in_a_read_only_directory(name, env, tmp_path, monkeypatch, cli):
    with _read_only_dir(tmp_path / "ro") as ro:
        if name == "warm":
            monkeypatch.setenv("WARP_CACHE_DIR", str(ro / "cache"))
        r = cli(*WRITES[name](env, ro))
    # a local store directory the OS will not let us write is a permission failure too (77), not a
    # bucket policy (StorePermissionError, 78, is for object stores that refuse)
    assert r.code == 77, (r.code, r.err)
    assert "bucket policy" not in r.err
    assert str(ro) in r.err and "error: " in r.err and "hint: " in r.err, r.err
    assert "internal error" not in r.err


# command -> argv whose output is larger than the file-size limit below
LIMITED: dict[str, Callable[[Path, Path], list[str]]] = {
    "etl": lambda w, out: ["etl", "--config", f"{w}/coco/transform.toml", "-o", f"{out}/etl", "-j", "1"],
    "tar-to-tbl": lambda w, out: ["tar-to-tbl", f"{w}/shard.tar", f"{out}/train.tbl"],
    "publish": lambda w, out: [*RUNS["publish"](w), "--store", f"{out}/store"],
    "warm": lambda w, out: ["warm", "demo/photos"],  # WARP_CACHE_DIR=OUT/cache
}
FSIZE_LIMIT = 8192  # bytes: every one of these writes a larger file


@pytest.mark.parametrize("name", sorted(LIMITED))
def test_file_size_limit(name, env, tmp_path):
    """`ulimit -f` under the output's size: the write fails with EFBIG (CPython ignores SIGXFSZ): 74."""
    out = tmp_path / "out"
    out.mkdir()
    environ = {**os.environ, "WARP_CACHE_DIR": str(out / "cache"), "PYTHONDONTWRITEBYTECODE": "1"}

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (FSIZE_LIMIT, resource.RLIM_INFINITY))

    p = subprocess.run([sys.executable, "-m", "warpdata", *LIMITED[name](env, out)], cwd=env, env=environ,
                       preexec_fn=limit, capture_output=True, text=True, timeout=300)
    assert p.returncode == 74, (p.returncode, p.stderr)
    # the file named is the one being written: under OUT (publish stages in WARP_CACHE_DIR=OUT/cache)
    assert f"error: file too large writing {out}/" in p.stderr and "ulimit -f" in p.stderr, p.stderr
    assert "internal error" not in p.stderr and "Traceback" not in p.stderr
    if name == "tar-to-tbl":  # the output as the user named it, not a temporary beside it
        assert f"error: file too large writing {out}/train.tbl: " in p.stderr, p.stderr


@pytest.mark.parametrize("limit", [0, FSIZE_LIMIT])
@pytest.mark.parametrize("source", ["tar", "tar.gz", "stdin"])
def test_tar_to_tbl_over_the_file_size_limit_names_its_output(source, limit, env, tmp_path):
    """Issue 36: under `ulimit -f` tar-to-tbl named its input (the frame that failed also held the
    input file) or a temporary name: 74 naming OUT, whatever the input, whenever the limit bites."""
    import gzip

    tar = env / "shard.tar"
    if source == "tar.gz":
        src = tmp_path / "shard.tar.gz"
        src.write_bytes(gzip.compress(tar.read_bytes()))
    argv = ["tar-to-tbl", "-" if source == "stdin" else str(src if source == "tar.gz" else tar),
            str(tmp_path / "out.tbl")]

    def cap() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.RLIM_INFINITY))

    with open(tar, "rb") as stdin:
        p = subprocess.run([sys.executable, "-m", "warpdata", *argv], env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"},
                           preexec_fn=cap, stdin=stdin, capture_output=True, text=True, timeout=300)
    assert p.returncode == 74, (p.returncode, p.stderr)
    assert p.stderr.startswith(f"error: file too large writing {tmp_path}/out.tbl: "), p.stderr
    assert "hint: raise the limit (ulimit -f unlimited)" in p.stderr and "Traceback" not in p.stderr
    assert sorted(f.name for f in tmp_path.iterdir()) == (["shard.tar.gz"] if source == "tar.gz" else [])
