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
    assert lines[0].split() == ["version", "created", "rows", "size", "own", "shared", "latest"]
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


def test_versions_of_a_dataset_registered_in_place(cli, tmp_path):
    # issue 40: `warp ls WS/NAME --versions` of a registered dataset answered "did you mean" another name
    from warpdata.core.sizes import format_size

    f = tmp_path / "t.parquet"
    pq.write_table(pa.table({"key": ["a", "b", "c"]}), f)
    assert cli("publish", "ws/regs", "--table", f"main={f}", "-q").code == 0  # the default store: a near name
    r = cli("register", "ws/reg", "--table", f"main={f}", "-q")
    assert r.code == 0, r.err
    version = r.out.strip()
    r = cli("ls", "ws/reg", "--versions", "--json")
    assert r.code == 0, r.err
    doc = r.json()
    reg = doc["registered"]
    assert doc["versions"] == [] and doc["dataset"] == "ws/reg"
    assert (reg["version_hash"], reg["rows"], reg["tables"], reg["artifacts"]) == (version, 3, ["main"], [])
    assert reg["path"].endswith("/registered/ws/reg.json") and reg["registered_at"]
    r = cli("ls", "ws/reg", "--versions")
    assert r.code == 0
    lines = r.out.splitlines()
    assert lines[0].split() == ["version", "created", "rows", "size", "own", "shared", "latest"] and len(lines) == 2
    size = format_size(reg["bytes"]).split()
    assert lines[1].split() == [version[:12], "(registered)", reg["registered_at"], "3", *size, "reads"]
    assert r.err == (f"ws/reg is registered in place ({reg['path']}): a registration holds one version, the files "
                     "as last registered, and reads use it; registering again replaces it\n")
    # a registration shadowing a published name: its version first, then the store's
    assert cli("register", "ws/regs", "--table", f"main={f}", "--shadow", "-q").code == 0
    r = cli("ls", "ws/regs", "--versions")
    assert r.code == 0
    lines = r.out.splitlines()
    assert len(lines) == 3 and lines[1].endswith("reads") and lines[2].endswith("*") and "(registered)" in lines[1]
    assert r.err.endswith("; the store's 1 published version(s) follow it, read with --store or after "
                          "'warp unregister ws/regs'\n")
