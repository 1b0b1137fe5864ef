"""What a fresh process imports to open a dataset and read its schema (issue 22: latency against
warpdata 3.0.27): the modules an operation does not need are not paid for at open."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from support.datasets import make_rows, publish

# never needed to open a dataset on a local store, nor for its schema
NOT_AT_OPEN = ["jsonschema", "numpy", "pyarrow", "duckdb", "boto3", "botocore", "fsspec", "s3fs", "pandas",
               "warpdata.core.sqlgate"]
NOT_FOR_SCHEMA = ["jsonschema", "duckdb", "boto3", "botocore", "fsspec", "s3fs", "pandas", "warpdata.core.sqlgate"]


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
