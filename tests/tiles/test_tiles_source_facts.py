"""An object-store input of the tiled ETL is listed, not read, on an up-to-date rerun
(docs/formats/zarr-tiles.md, "Inputs on object storage"; warp/etl/sourcefacts.py).

Requests are counted by the moto S3 server: the no-op rerun lists the input once (one LIST) and
sends no GET or HEAD for it; an input overwritten with other bytes is read again, and the array
built from it is the one a cold build of the new input makes.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from warpdata.sampledata.volume import photo_like_volume

pytestmark = pytest.mark.s3

SHAPE = (24, 40, 48)


def tree(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def config(d: Path, src: str, out: str, fmt: str = "npy") -> Path:
    p = d / f"{Path(out).name}.toml"
    raw = "" if fmt == "npy" else f"shape = {list(SHAPE)}\ndtype = \"u16\"\n"
    p.write_text(f"""
[source]
path = "{src}"
format = "{fmt}"
{raw}
[tiles]
chunks = [4, 16, 16]
shards = "none"
backend = "cpu"

[multiscale]
levels = 2

[output]
path = "{out}"
""")
    return p


def npy_bytes(tmp: Path, seed: int) -> bytes:
    p = tmp / f"v{seed}.npy"
    np.save(p, photo_like_volume(SHAPE, "uint16", seed=seed))
    return p.read_bytes()


def source_requests(s3, key: str) -> dict[str, int]:
    """GETs and HEADs of the input object, and listings (key "") of the bucket."""
    return {"GET": s3.count("GET", key), "HEAD": s3.count("HEAD", key),
            "LIST": len([q for q in s3.requests("GET") if q["key"] == "" and "list-type" in q["query"]])}


@pytest.mark.parametrize("fmt", ["npy", "raw"])
def test_a_rerun_lists_the_input_once_and_reads_nothing_then_a_changed_input_is_read(
        cli, s3, tmp_path, monkeypatch, fmt):
    monkeypatch.setenv("WARP_CACHE_DIR", str(tmp_path / "cache"))
    first, second = npy_bytes(tmp_path, 3), npy_bytes(tmp_path, 4)
    header = len(first) - int(np.prod(SHAPE)) * 2
    body = (lambda b: b) if fmt == "npy" else (lambda b: b[header:])
    key = f"src/v.{fmt}"
    s3.client.put_object(Bucket=s3.bucket, Key=key, Body=body(first))
    out = tmp_path / "out.zarr"
    cfg = config(tmp_path, s3.url(key), str(out), fmt)

    s3.reset_counts()
    r = cli("etl", "--config", cfg, "--json")
    assert r.code == 0, r.err
    assert r.json()["status"] == "built"
    cold = source_requests(s3, key)
    assert cold["GET"] >= 1 and cold["HEAD"] <= 1 and cold["LIST"] == 1  # s3fs sizes the stream it opens

    s3.reset_counts()
    r = cli("etl", "--config", cfg, "--json")
    assert r.code == 0, r.err
    assert r.json()["status"] == "up-to-date"
    assert source_requests(s3, key) == {"GET": 0, "HEAD": 0, "LIST": 1}
    assert len(s3.requests()) == 1  # the listing is all this run asked of the store

    # the input overwritten with other bytes: its listed size/ETag differ, it is read again
    s3.client.put_object(Bucket=s3.bucket, Key=key, Body=body(second))
    s3.reset_counts()
    r = cli("etl", "--config", cfg, "--json")
    assert r.code == 0, r.err
    assert r.json()["status"] == "built"
    got = source_requests(s3, key)
    assert got["GET"] >= 1 and got["HEAD"] <= 1 and got["LIST"] == 1
    assert {q["key"] for q in s3.requests("GET") if q["key"]} == {key}  # that object, nothing else

    # the array is the one a cold build of the new input makes (another cache, a local copy of it)
    local = tmp_path / "local"
    local.mkdir()
    (local / f"v.{fmt}").write_bytes(body(second))
    monkeypatch.setenv("WARP_CACHE_DIR", str(tmp_path / "cold-cache"))
    ref = local / "ref.zarr"
    r = cli("etl", "--config", config(local, str(local / f"v.{fmt}"), str(ref), fmt), "--json")
    assert r.code == 0, r.err
    assert tree(out) == tree(ref)

    # and a second no-op rerun of the changed input reads nothing again
    monkeypatch.setenv("WARP_CACHE_DIR", str(tmp_path / "cache"))
    s3.reset_counts()
    r = cli("etl", "--config", cfg, "--json")
    assert r.code == 0 and r.json()["status"] == "up-to-date", r.err
    assert source_requests(s3, key) == {"GET": 0, "HEAD": 0, "LIST": 1}


def test_an_s3_output_rerun_reads_no_input_byte(cli, s3, tmp_path, monkeypatch):
    monkeypatch.setenv("WARP_CACHE_DIR", str(tmp_path / "cache"))
    key = "src/v.npy"
    s3.client.put_object(Bucket=s3.bucket, Key=key, Body=npy_bytes(tmp_path, 5))
    cfg = config(tmp_path, s3.url(key), s3.url("out.zarr"))
    r = cli("etl", "--config", cfg, "--json")
    assert r.code == 0 and r.json()["status"] == "built", r.err
    s3.reset_counts()
    r = cli("etl", "--config", cfg, "--json")
    assert r.code == 0 and r.json()["status"] == "up-to-date", r.err
    assert s3.count("GET", key) == 0 and s3.count("HEAD", key) == 0
    assert s3.count("PUT") == 0
