"""Common new-user mistakes: each gets its documented exit code, names what is wrong, and never a traceback.

The table below is the first-contact grade sheet (README "Conventions"): every row is a
mistake a new user makes in the first hour, with the exit code `warp(1)` documents and the
words the one-line error must contain (the file, key, value or dataset at fault). A row
fails if the code differs, the words are missing, a traceback leaks, or an error writes
anything to stdout. ``python tests/cli/test_first_contact.py`` prints the sheet as a table.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

# (id, argv, extra env, exit code, substrings that must appear in stderr)
CASES: list[tuple[str, list[str], dict[str, str], int, list[str]]] = [
    ("etl-no-config", ["etl"], {}, 2, ["--config"]),
    ("etl-config-missing", ["etl", "--config", "missing.toml"], {}, 66, ["missing.toml", "does not exist"]),
    ("etl-toml-syntax", ["etl", "--config", "bad.toml"], {}, 78, ["bad.toml:1", "TOML"]),
    ("etl-no-format", ["etl", "--config", "coco/unk.toml"], {}, 78, ["[source] format", "coco, jsonl"]),
    ("etl-image-folder-missing", ["etl", "--config", "coco/imgz.toml"], {}, 66, ["imagez", "does not exist"]),
    ("etl-workers-not-a-number", ["etl", "--config", "coco/transform.toml"], {"WARP_WORKERS": "abc"}, 78,
     ["WARP_WORKERS", "abc"]),
    ("etl-workers-zero", ["etl", "--config", "vol/volume.toml", "--workers", "0"], {}, 2, ["--workers"]),
    ("etl-raw-size-mismatch", ["etl", "--config", "vol/short.toml"], {}, 65, ["short.raw", "3000", "shape"]),
    ("publish-nothing", ["publish", "demo/x"], {}, 2, ["nothing to publish", "--table"]),
    ("publish-from-missing", ["publish", "demo/x", "--from", "nowhere"], {}, 66, ["nowhere", "does not exist"]),
    ("publish-bad-name", ["publish", "BadName", "--from", "coco"], {}, 2, ["BadName", "workspace/name"]),
    ("publish-glob-matches-nothing", ["publish", "demo/y", "--table", "main=nomatch/*.parquet"], {}, 66,
     ["nomatch/*.parquet", "no file matches"]),
    ("publish-malformed-csv", ["publish", "demo/y", "--table", "main=bad.csv"], {}, 65, ["bad.csv", "CSV"]),
    ("publish-dangling-bind", ["publish", "demo/dang", "--table", "main=data/*.parquet", "--artifact",
                               "media=coco/images", "--bind", "main.image=media:image"], {}, 65,
     ["500 of 500", "img/0000.png", "--allow-dangling"]),
    ("publish-shard-size-no-unit", ["publish", "demo/y", "--table", "main=data/*.parquet", "--shard-size", "4096"],
     {}, 2, ["4096", "unit"]),
    ("stream-unknown-dataset", ["stream", "unknown/ds"], {}, 66, ["unknown/ds", "not published"]),
    ("stream-no-latest", ["stream", "demo/dry"], {}, 66, ["no latest", "--version"]),
    ("stream-unknown-table", ["stream", "demo/photos", "--table", "nope"], {}, 66, ["nope", "tables: main"]),
    ("stream-unknown-column", ["stream", "demo/photos", "--columns", "nope"], {}, 2, ["nope", "id, label, image"]),
    ("stream-filter-injection", ["stream", "demo/photos", "--filter", "1=1; COPY (SELECT 1) TO 'pwned.csv'"], {}, 2,
     ["filter"]),
    ("stream-filter-bad-column", ["stream", "demo/photos", "--filter", "nope > 3"], {}, 2, ["nope"]),
    ("stream-negative-limit", ["stream", "demo/photos", "--limit", "-1"], {}, 2, ["--limit"]),
    ("stream-rank-out-of-range", ["stream", "demo/photos", "--shard", "3/2"], {}, 2, ["rank 3", "world size 2"]),
    ("stream-unknown-version", ["stream", "demo/photos", "--version", "deadbeef"], {}, 66, ["deadbeef"]),
    ("store-folder-missing", ["ls"], {"WARP_STORE": "{tmp}/nostore"}, 66, ["nostore", "does not exist"]),
    ("warm-unknown-dataset", ["warm", "unknown/ds"], {}, 66, ["unknown/ds"]),
    ("warm-cache-size-not-a-number", ["warm", "demo/photos"], {"WARP_CACHE_SIZE_GB": "abc"}, 78,
     ["WARP_CACHE_SIZE_GB", "abc"]),
    ("cat-unknown-artifact", ["cat", "demo/photos", "--artifact", "nope", "--ref", "x"], {}, 66, ["nope", "media"]),
    ("cat-unknown-member", ["cat", "demo/photos", "--artifact", "media", "--ref", "missing.png"], {}, 66,
     ["missing.png"]),
    ("cache-gc-bare-number", ["cache", "gc", "--limit", "20"], {}, 2, ["20", "20GB"]),
    ("cache-gc-not-a-size", ["cache", "gc", "--limit", "lots"], {}, 2, ["lots", "not a size"]),
    ("inspect-missing", ["inspect", "missing.bin"], {}, 66, ["missing.bin", "does not exist"]),
    ("inspect-not-an-artifact", ["inspect", "notes.txt"], {}, 65, ["notes.txt", "not a warp artifact"]),
    ("inspect-verify-corrupt-tbl", ["inspect", "--verify", "flip.tbl"], {}, 1, ["flip.tbl", "CRC"]),
    ("tbl-input-missing", ["tar-to-tbl", "missing.tar", "out.tbl"], {}, 66, ["missing.tar"]),
    ("tbl-input-empty", ["tar-to-tbl", "empty.tar", "out.tbl"], {}, 65, ["empty.tar", "empty"]),
    ("tbl-input-not-a-tar", ["tar-to-tbl", "notes.txt", "out.tbl"], {}, 65, ["notes.txt", "not a tar"]),
    ("tbl-input-truncated", ["tar-to-tbl", "cut.tar", "cut.tbl"], {}, 65, ["cut.tar", "truncated"]),
    ("tbl-bad-compression", ["tar-to-tbl", "shard.tar", "out.tbl", "--compression", "brotli"], {}, 2,
     ["brotli", "auto, none, lz4, zstd"]),
    ("doctor-unknown-group", ["doctor", "--only", "nonsense"], {}, 2, ["nonsense", "install"]),
    ("unknown-command", ["nonsense"], {}, 2, ["No such command", "nonsense"]),
]


def _sampledata(*args: str, cwd: Path) -> None:
    subprocess.run([sys.executable, "-m", "warpdata.sampledata", *args], cwd=cwd, check=True,
                   stdout=subprocess.DEVNULL)


@pytest.fixture(scope="module")
def workspace(tmp_path_factory):
    """Sample inputs, a published dataset (demo/photos) and a version without `latest` (demo/dry)."""
    ws = tmp_path_factory.mktemp("first-contact")
    _sampledata("detection", "coco", "--count", "16", cwd=ws)
    _sampledata("wds", "shard.tar", "--count", "8", cwd=ws)
    _sampledata("volume", "vol", "--count", "16", cwd=ws)
    _sampledata("photos", ".", cwd=ws)
    (ws / "notes.txt").write_text("x\n")
    (ws / "empty.tar").write_bytes(b"")
    (ws / "bad.csv").write_text('a,b\n1\n"x')
    (ws / "bad.toml").write_text('[source\nformat="coco"')
    transform = (ws / "coco" / "transform.toml").read_text()
    (ws / "coco" / "unk.toml").write_text(transform.replace("\nformat", "\nformatt", 1))
    images = next(line for line in transform.splitlines() if line.startswith("images"))
    (ws / "coco" / "imgz.toml").write_text(transform.replace(images, 'images = "imagez"'))
    (ws / "vol" / "short.raw").write_bytes((ws / "vol" / "volume.raw").read_bytes()[:3000])
    (ws / "vol" / "short.toml").write_text((ws / "vol" / "volume.toml").read_text().replace("volume.raw", "short.raw"))
    raw = (ws / "shard.tar").read_bytes()
    (ws / "cut.tar").write_bytes(raw[:5000])
    env = {**os.environ, "WARP_STORE": str(ws / "store"), "WARP_CACHE_DIR": str(ws / "cache")}
    warp = [sys.executable, "-m", "warpdata"]
    subprocess.run([*warp, "tar-to-tbl", "shard.tar", "good.tbl", "-q"], cwd=ws, env=env, check=True,
                   stdout=subprocess.DEVNULL)
    tbl = bytearray((ws / "good.tbl").read_bytes())
    tbl[-40] ^= 1  # inside the metadata section
    (ws / "flip.tbl").write_bytes(bytes(tbl))
    for extra in (["demo/photos", "--artifact", "media=imgs", "--bind", "main.image=media:image"],
                  ["demo/dry", "--no-set-latest"]):
        subprocess.run([*warp, "publish", extra[0], "--table", "main=data/*.parquet", *extra[1:], "-q"],
                       cwd=ws, env=env, check=True, stdout=subprocess.DEVNULL)
    return ws


@pytest.mark.parametrize(("argv", "env", "code", "words"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_mistake_is_named_with_its_exit_code(cli, workspace, monkeypatch, argv, env, code, words):
    monkeypatch.chdir(workspace)
    monkeypatch.setenv("WARP_STORE", str(workspace / "store"))
    monkeypatch.setenv("WARP_CACHE_DIR", str(workspace / "cache"))
    for k, v in env.items():
        monkeypatch.setenv(k, v.replace("{tmp}", str(workspace)))
    r = cli(*argv)
    assert r.code == code, (r.code, r.err)
    assert "Traceback" not in r.err
    assert r.out == "" or code == 1, r.out  # a negative verify result may print its report
    for w in words:
        assert w in r.err, (w, r.err)
    assert not (workspace / "pwned.csv").exists()


def test_every_case_has_a_unique_id():
    ids = [c[0] for c in CASES]
    assert len(ids) == len(set(ids)) and len(ids) >= 40


if __name__ == "__main__":  # the grade sheet: python tests/cli/test_first_contact.py
    print(f"{'case':34} {'exit':>4}  must name")
    for cid, _argv, _env, code, words in CASES:
        print(f"{cid:34} {code:>4}  {', '.join(words)}")
