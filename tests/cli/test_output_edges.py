"""Output edges: --pad says what it repeated, SIZE options all refuse a bare number, binary
output refuses a terminal unless --force.

Real stores and a real pseudo-terminal (``os.openpty``) as stdout; the CLI runs in-process.
"""

from __future__ import annotations

import io
import json
import os
import sys
from contextlib import contextmanager
from pathlib import Path

import pytest
from warpdata.cli.app import COMMANDS, build_app

# every option that takes a SIZE -> a command line that reaches its parsing (the rest may be bogus:
# the size is read before anything else is opened)
SIZE_RUNS: dict[tuple[str, str], list[str]] = {
    ("cache", "--limit"): ["cache", "gc", "--limit", "20"],
    ("ingest", "--max-file-size"): ["ingest", "imagefolder", "imgs", "demo/m", "--max-file-size", "100"],
    ("ingest", "--shard-size"): ["ingest", "imagefolder", "imgs", "demo/m", "--shard-size", "4096"],
    ("publish", "--shard-size"): ["publish", "demo/p", "--table", "main=data/*.parquet", "--shard-size", "4096"],
    ("warm", "--max-bytes"): ["warm", "demo/photos", "--max-bytes", "5"],
}


def _size_options() -> set[tuple[str, str]]:
    import typer.main

    group = typer.main.get_command(build_app())
    found = set()
    for spec in COMMANDS:
        for param in group.commands[spec.name].params:
            if getattr(param, "metavar", None) == "SIZE":
                found.update((spec.name, o) for o in param.opts if o.startswith("--"))
    return found


@pytest.fixture
def photos(tmp_path, monkeypatch, cli):
    from warpdata.sampledata.__main__ import main as sample

    assert sample(["photos", str(tmp_path), "--count", "20"]) == 0
    monkeypatch.setenv("WARP_STORE", str(tmp_path / "store"))
    monkeypatch.chdir(tmp_path)
    r = cli("publish", "demo/photos", "--table", "main=data/*.parquet", "--artifact", "media=imgs",
            "--bind", "main.image=media:image", "-q")
    assert r.code == 0, r.err
    return tmp_path


def test_every_size_option_refuses_a_bare_number(photos, cli):
    assert set(SIZE_RUNS) == _size_options()  # a new SIZE option must be listed here
    for (_cmd, option), argv in SIZE_RUNS.items():
        r = cli(*argv)
        assert r.code == 2, (argv, r.err)
        assert f"{option} {argv[argv.index(option) + 1]} has no unit" in r.err and "hint: " in r.err, r.err
        assert r.out == ""
    r = cli("warm", "demo/photos", "--max-bytes", "1MB")
    assert r.code == 0, r.err


def test_pad_says_how_many_rows_it_repeated(photos, cli):
    """20 rows over 3 ranks with --pad: 7 rows each; rank 2 repeats 1 row, and every rank says so."""
    notes = {}
    for rank in range(3):
        r = cli("stream", "demo/photos", "--columns", "id", "--shard", f"{rank}/3", "--pad")
        assert r.code == 0 and len(r.out.splitlines()) == 7, r.err
        notes[rank] = r.err
    assert "rank 2/3 streamed 7 rows, 1 of them repeated" in notes[2] and "1 repeats over all ranks" in notes[2]
    assert "rank 0/3 streamed 7 rows, none of them repeats" in notes[0]
    r = cli("stream", "demo/photos", "--columns", "id", "--shard", "2/3", "--pad", "--limit", "6")
    assert r.code == 0 and len(r.out.splitlines()) == 6
    assert "streamed 6 rows, none of them repeats (1 repeats over all ranks, cut off by --limit" in r.err
    r = cli("--json", "stream", "demo/photos", "--columns", "id", "--shard", "2/3", "--pad")
    assert r.code == 0, r.err
    [pad] = [json.loads(line)["pad"] for line in r.err.splitlines() if line.startswith('{"pad"')]
    assert pad == {"rank": 2, "world": 3, "rows": 7, "repeated": 1, "repeated_all_ranks": 1, "table_rows": 20}
    r = cli("stream", "demo/photos", "--columns", "id", "--shard", "2/3")
    assert r.code == 0 and "repeat" not in r.err  # exact: nothing to report


@contextmanager
def _stdout_on_a_terminal():
    """sys.stdout on the slave side of a real pseudo-terminal; yields a function reading what it got."""
    master, slave = os.openpty()
    saved = sys.stdout
    sys.stdout = io.TextIOWrapper(io.FileIO(slave, "w"), encoding="utf-8", write_through=True)
    os.set_blocking(master, False)

    def read() -> bytes:
        chunks = []
        while True:
            try:
                chunk = os.read(master, 1 << 16)
            except BlockingIOError:
                return b"".join(chunks)
            if not chunk:
                return b"".join(chunks)
            chunks.append(chunk)

    try:
        yield read
    finally:
        sys.stdout.close()
        sys.stdout = saved
        os.close(master)


def test_binary_output_refuses_a_terminal_unless_forced(photos, cli):
    with _stdout_on_a_terminal() as got:
        assert sys.stdout.isatty()
        r = cli("stream", "demo/photos", "--format", "arrow", "--limit", "2")
        assert r.code == 2 and "--format arrow writes binary Arrow IPC, and stdout is a terminal" in r.err
        assert "--force" in r.err and got() == b""
        r = cli("stream", "demo/photos", "--format", "arrow", "--limit", "2", "--force")
        assert r.code == 0, r.err
        assert got().startswith(b"\xff\xff\xff\xff")  # the IPC stream's first message reached the terminal
        r = cli("stream", "demo/photos", "--limit", "1")  # text: fine on a terminal
        assert r.code == 0 and b'"id":0' in got()
        r = cli("cat", "demo/photos", "--artifact", "media", "--ref", "img/0000.png")
        assert r.code == 2 and "img/0000.png is binary" in r.err and got() == b""
        r = cli("cat", "demo/photos", "--artifact", "media", "--ref", "img/0000.png", "--force")
        assert r.code == 0 and b"PNG" in got()
    r = cli("stream", "demo/photos", "--format", "arrow", "--limit", "2")  # not a terminal: as before
    assert r.code == 0


def test_text_member_prints_on_a_terminal(photos, cli):
    Path(photos / "notes").mkdir()
    (photos / "notes" / "readme.txt").write_text("hello\n")
    r = cli("publish", "demo/notes", "--artifact", "docs=notes", "-q")
    assert r.code == 0, r.err
    with _stdout_on_a_terminal() as got:
        r = cli("cat", "demo/notes", "--artifact", "docs", "--ref", "readme.txt")
        assert r.code == 0, r.err
        assert b"hello" in got()
