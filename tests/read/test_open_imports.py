"""What a fresh process imports to open a dataset and read its schema (issue 22: latency against
warpdata 3.0.27): the modules an operation does not need are not paid for at open."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from support.datasets import make_rows, publish

# never needed to open a dataset on a local store, nor for its schema. The readers of a version's parts
# load on first use (warpdata.read.base): the table reader (and with it the SQL gate's checker,
# warpdata.core.sqlgate, pure Python) when a table is opened, DuckDB only when a query runs
NOT_AT_OPEN = ["jsonschema", "numpy", "pyarrow", "duckdb", "boto3", "botocore", "fsspec", "s3fs", "pandas",
               "warpdata.core.sqlgate", "warpdata.read.table", "warpdata.partition.plan", "warpdata.read.refs",
               "warpdata.registry.tarpack", "warpdata.registry.embeddings"]
NOT_FOR_SCHEMA = ["jsonschema", "duckdb", "boto3", "botocore", "fsspec", "s3fs", "pandas",
                  "warpdata.registry.embeddings", "warpdata.read.refs", "warpdata.registry.tarpack"]


def _modules_after(tmp_path, store: str) -> dict:
    code = ("import json, sys, warpdata\n"
            f"ds = warpdata.dataset('ws/demo', store={store!r}, mode='remote')\n"
            "opened = sorted(sys.modules)\n"
            "sch = ds.table('main').schema()\n"
            "print(json.dumps({'open': opened, 'schema': sorted(sys.modules), 'names': sch.names}))\n")
    env = {**os.environ, "WARP_CACHE_DIR": str(tmp_path / "cache")}
    p = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


def test_open_and_schema_import_only_what_they_use(tmp_path):
    store = str(tmp_path / "store")
    publish(store, "ws/demo", {"main": [make_rows(20)]}, tmp_path)
    got = _modules_after(tmp_path, store)
    assert got["names"][:3] == ["id", "x", "label"]
    assert [m for m in NOT_AT_OPEN if m in got["open"]] == []
    assert "pyarrow" in got["schema"]  # schema() returns a pyarrow.Schema
    assert [m for m in NOT_FOR_SCHEMA if m in got["schema"]] == []


def test_cli_schema_and_info_print_without_pyarrow(tmp_path):
    """``warp schema`` and ``warp info`` render the manifest's text: no pyarrow, no numpy (format 4)."""
    import pyarrow.parquet as pq

    store = str(tmp_path / "store")
    pq.write_table(make_rows(20), tmp_path / "part.parquet")
    env = {**os.environ, "WARP_CACHE_DIR": str(tmp_path / "cache")}
    p = subprocess.run([sys.executable, "-m", "warpdata", "publish", "ws/demo", "--table",
                        f"main={tmp_path / 'part.parquet'}", "--store", store], env=env, capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    code = ("import atexit, json, sys, runpy\n"
            "atexit.register(lambda: print(json.dumps([m for m in ('pyarrow', 'numpy', 'jsonschema') "
            "if m in sys.modules]), file=sys.stderr))\n"
            f"sys.argv = ['warp', sys.argv[1], 'ws/demo', '--store', {store!r}]\n"
            "runpy.run_module('warpdata', run_name='__main__')\n")
    for cmd, shown in (("schema", "label"), ("info", "main")):
        p = subprocess.run([sys.executable, "-c", code, cmd], env=env, capture_output=True, text=True)
        assert p.returncode == 0, p.stderr
        assert shown in p.stdout
        assert json.loads(p.stderr.strip().splitlines()[-1]) == [], (cmd, p.stderr)
