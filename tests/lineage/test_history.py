"""`warp ls WS/NAME --versions`: every version, oldest first, with dates and sizes."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest


def publish_versions(cli, tmp_path: Path, store, n: int, *extra) -> list[str]:
    out = []
    for i in range(n):
        f = tmp_path / f"v{i}.parquet"
        pq.write_table(pa.table({"key": [f"k{j}" for j in range(10 + i)]}), f)
        r = cli("publish", "ws/h", "--table", f"main={f}", "--store", store, "--json", *extra)
        assert r.code == 0, r.err
        out.append(r.json()["version_hash"])
    return out


def check_listing(cli, store, hashes: list[str]) -> None:
    r = cli("ls", "ws/h", "--versions", "--store", store, "--json")
    assert r.code == 0, r.err
    vs = r.json()["versions"]
    assert [v["version_hash"] for v in vs] == hashes  # oldest first
    assert [v["rows"] for v in vs] == [10 + i for i in range(len(hashes))]
    assert all(v["bytes"] > 0 and v["created_at"] for v in vs)
    assert [v["latest"] for v in vs] == [False] * (len(hashes) - 1) + [True]
    human = cli("ls", "ws/h", "--versions", "--store", store)
    assert human.code == 0 and human.err == ""
    lines = human.out.splitlines()
    assert lines[0].split() == ["version", "created", "rows", "size", "latest"]
    assert [ln.split()[0] for ln in lines[1:]] == [h[:12] for h in hashes] and lines[-1].rstrip().endswith("*")


def test_versions_on_a_local_store(cli, tmp_path):
    store = tmp_path / "store"
    check_listing(cli, store, publish_versions(cli, tmp_path, store, 3))
    r = cli("ls", "ws/", "--versions", "--store", store)
    assert r.code == 2 and "WORKSPACE/NAME" in r.err
    r = cli("ls", "ws/nope", "--versions", "--store", store)
    assert r.code == 66 and "ws/nope" in r.err


@pytest.mark.s3
def test_versions_on_s3_including_one_without_latest(cli, s3, tmp_path):
    url = s3.url("warp")
    hashes = publish_versions(cli, tmp_path, url, 2)
    check_listing(cli, url, hashes)
    extra = publish_versions(cli, tmp_path, url, 3, "--no-set-latest")[2]  # the first two: already there
    vs = cli("ls", "ws/h", "--versions", "--store", url, "--json").json()["versions"]
    assert [v["version_hash"] for v in vs] == [*hashes, extra] and vs[1]["latest"] and not vs[2]["latest"]
