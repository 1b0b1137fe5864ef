"""Integration: commands and APIs that take a table name default sensibly.

Rule: the dataset's only table; else ``main`` when present; else a clear
error listing the tables. Checked through ``Dataset.table()``, ``warp stream``,
``warp init`` and ``warp inspect --head`` on local and S3 (moto) stores.
"""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from warpdata.core.errors import MissingInputError
from warpdata.publishing.publish import DatasetBuilder
from warpdata.read.dataset import dataset


def _parquet(path, start, n):
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table({"id": list(range(start, start + n)), "tag": [f"t{i}" for i in range(start, start + n)]}),
                   path)
    return str(path)


def _publish(store, name, tables, tmp_path):
    b = DatasetBuilder(name, store=store)
    for t, (start, n) in tables.items():
        b.add_table(t, _parquet(tmp_path / "in" / name.replace("/", "_") / f"{t}.parquet", start, n))
    return b.publish()


@pytest.fixture
def local_store(tmp_path, monkeypatch):
    url = str(tmp_path / "store")
    monkeypatch.setenv("WARP_STORE", url)
    monkeypatch.setenv("WARP_CACHE_DIR", str(tmp_path / "cache"))
    _publish(url, "ws/one", {"samples": (0, 7)}, tmp_path)
    _publish(url, "ws/withmain", {"main": (100, 3), "extra": (0, 2)}, tmp_path)
    _publish(url, "ws/many", {"alpha": (0, 2), "beta": (0, 3)}, tmp_path)
    return url


def test_dataset_table_defaults(local_store):
    assert dataset("ws/one").default_table == "samples"
    assert dataset("ws/one").table().num_rows == 7
    assert dataset("ws/withmain").table().name == "main"
    assert dataset("ws/withmain").table("extra").num_rows == 2
    with pytest.raises(MissingInputError) as e:
        dataset("ws/many").table()
    assert "alpha, beta" in e.value.message and "none is called 'main'" in e.value.message
    with pytest.raises(MissingInputError, match="no table 'main'"):
        dataset("ws/many").table("main")


def test_stream_defaults(cli, local_store):
    r = cli("stream", "ws/one", "--columns", "id", "--limit", "3")
    assert r.code == 0, r.err
    assert [json.loads(x)["id"] for x in r.out.splitlines()] == [0, 1, 2]
    r = cli("stream", "ws/withmain", "--columns", "id")
    assert r.code == 0 and [json.loads(x)["id"] for x in r.out.splitlines()] == [100, 101, 102]
    r = cli("stream", "ws/many")
    assert r.code == 66 and "alpha, beta" in r.err and "--table" in r.err and r.out == ""
    r = cli("stream", "ws/many", "--table", "beta", "--columns", "id", "--format", "csv")
    assert r.code == 0 and r.out.split() == ['"id"', "0", "1", "2"]


def test_init_and_inspect_head_default(cli, local_store, tmp_path):
    out = tmp_path / "loader.py"
    r = cli("init", "ws/one", "--out", str(out), "--json")
    assert r.code == 0, r.err
    assert r.json()["table"] == "samples" and "TABLE = 'samples'" in out.read_text()
    r = cli("init", "ws/many", "--out", str(tmp_path / "x.py"))
    assert r.code == 66 and "alpha, beta" in r.err and not (tmp_path / "x.py").exists()
    r = cli("inspect", "ws/one", "--head", "2", "--json")
    assert r.code == 0, r.err
    assert "samples" in r.out and "t1" in r.out


def test_stream_default_on_s3(cli, s3, tmp_path, monkeypatch):
    url = s3.url("warp")
    monkeypatch.setenv("WARP_STORE", url)
    monkeypatch.setenv("WARP_CACHE_DIR", str(tmp_path / "cache"))
    _publish(url, "ws/remote", {"records": (10, 4)}, tmp_path)
    r = cli("stream", "ws/remote", "--filter", "id >= 12", "--columns", "id", "--mode", "remote")
    assert r.code == 0, r.err
    assert [json.loads(x)["id"] for x in r.out.splitlines()] == [12, 13]
    # --shard auto with a filter: this process's rank of RANK/WORLD_SIZE (ranks split whole shard
    # files; the one file here is rank 0's), the same rows as --shard R/W
    for rank, want in (("0", [12, 13]), ("1", [])):
        monkeypatch.setenv("RANK", rank)
        monkeypatch.setenv("WORLD_SIZE", "2")
        for shard in ("auto", f"{rank}/2"):
            r = cli("stream", "ws/remote", "--filter", "id >= 12", "--columns", "id", "--mode", "remote",
                    "--shard", shard)
            assert r.code == 0, r.err
            assert [json.loads(x)["id"] for x in r.out.splitlines()] == want, (rank, shard)


def test_wd_dataset_callable_after_submodule_import(local_store):
    """Importing warpdata.read.dataset as a module must not hide wd.dataset(...)."""
    import subprocess
    import sys

    code = ("import warpdata.read.dataset\nfrom warpdata.read.dataset import Dataset\nimport warpdata as wd\n"
            "d = wd.dataset('ws/one')\nassert isinstance(d, Dataset)\nprint(d.table().num_rows)")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "7"
