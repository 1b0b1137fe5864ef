"""Peer side of bench/store_latency.py: run ONLY with the peer's interpreter (PyPI warpdata 3.0.27 in its
own venv), never with warp's: the peer installs a module also called ``warpdata``.

  publish S3_BASE PARQUET...   publish dataset bench/lat (table main) with the peer's own publisher
  op OP                        in this fresh process: import, open bench/lat, then OP (info, schema,
                               head, filter); prints one JSON line {"op": seconds, "total": seconds}

S3 endpoint and credentials come from the environment (WARPDATASETS_S3_ENDPOINT_URL, AWS_*). Its
table reader loads DuckDB's httpfs extension (``INSTALL httpfs``): offline, HOME must hold it under
``.duckdb/extensions/v<duckdb>/linux_amd64/`` (from the ``duckdb-extension-httpfs`` wheel, which pins
duckdb 1.5.5 in the peer's venv), and plain-HTTP endpoints need :func:`_plain_http_endpoint`.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path

T0 = time.perf_counter()


def publish(base: str, parquets: list[str]) -> None:
    import dataclasses

    from warpdata.publish.builder import ManifestBuilder
    from warpdata.publish.storage import S3Storage
    from warpdata.publish.uploader import Uploader

    tmp = Path(tempfile.mkdtemp(prefix="peer-pack-"))
    b = ManifestBuilder("bench/lat", base, temp_dir=tmp)
    b.add_table("main", [Path(p) for p in parquets])
    plan = b.build_plan()
    # 3.0.27's builder stores the manifest under the hash of its placeholder draft while latest.json
    # names the final manifest's hash; store it under the name the reader looks up (bench/_peer_refs.py)
    plan = dataclasses.replace(plan, manifest_uri=b._manifest_uri(plan.manifest.version_hash))
    storage = S3Storage(region="us-east-1", endpoint_url=os.environ["WARPDATASETS_S3_ENDPOINT_URL"])
    res = Uploader(storage).execute_plan(plan)
    if not res.success:
        raise SystemExit(f"peer publish failed: {res.errors}")
    print(json.dumps({"version": res.version_hash}))


def _plain_http_endpoint() -> None:
    """3.0.27's DuckDB engine has no setting for a plain-HTTP S3 endpoint (moto on 127.0.0.1): DuckDB's
    httpfs then speaks https to it. Add ``SET s3_use_ssl=false`` to each connection it makes."""
    from warpdata.engines import duckdb as engine

    make = engine.DuckDBEngine._create_connection

    def create(self):
        conn = make(self)
        if (os.environ.get("WARPDATASETS_S3_ENDPOINT_URL") or "").startswith("http://"):
            conn.execute("SET s3_use_ssl = false;")
        return conn

    engine.DuckDBEngine._create_connection = create


def op(name: str) -> None:
    import warpdata as wd

    _plain_http_endpoint()

    t0 = time.perf_counter()
    ds = wd.dataset("bench/lat")
    opened = time.perf_counter() - t0
    t0 = time.perf_counter()
    if name == "info":
        ds.info()
    elif name == "schema":
        ds.table("main").schema()
    elif name == "head":
        ds.table("main").head(5).fetchall()
    elif name == "filter":
        n = ds.table("main").filter("id BETWEEN 100 AND 200").aggregate("count(*)").fetchone()[0]
        assert n == 101, n
    print(json.dumps({"open": opened, name: time.perf_counter() - t0, "total": time.perf_counter() - T0}))


if __name__ == "__main__":
    if sys.argv[1] == "publish":
        publish(sys.argv[2], sys.argv[3:])
    else:
        op(sys.argv[2])
