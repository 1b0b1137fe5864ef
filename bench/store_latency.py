"""Store latency: opening a dataset, ``info``, ``schema``, ``head`` and a filtered read, per store kind.

One small dataset (20,000 rows in 4 Parquet files) is published by warp to a local folder, to moto S3 on
127.0.0.1 (tests/support/s3fixtures.py) and served over HTTP from the local folder
(tests/support/httpserve.py). For each store the script times, as medians of ``--runs``:

* in a fresh interpreter per run (what a user's first call pays, imports included):
  ``warp info``, ``warp schema`` and ``warp head -n 5`` (the CLI, whole process);
* in one process: ``warpdata.dataset()`` (open: pointer + manifest), ``Table.schema()``,
  ``Table.head(5)`` and ``Table.filter("id BETWEEN 100 AND 200").count()``, each on a freshly opened
  dataset with the process's manifest memo cleared.

The peer (PyPI ``warpdata`` 3.0.27, the registry design's own implementation) installs a module of the
same name, so it can only run from its own interpreter (``--peer-python``); it is not driven here:
its table reader downloads DuckDB's httpfs extension at run time (BENCHMARKS.md, "Remote refs"),
which this offline machine cannot do. Ratios against it need a networked machine.

    python bench/store_latency.py --runs 5
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))


def make_data(tmp: Path) -> list[str]:
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    files = []
    for k in range(4):
        ids = np.arange(k * 5000, (k + 1) * 5000)
        t = pa.table({"id": ids, "x": ids * 0.5, "label": [f"label-{i % 13}" for i in ids]})
        p = tmp / f"part-{k}.parquet"
        pq.write_table(t, p, row_group_size=1000)
        files.append(str(p))
    return files


def cli_seconds(args: list[str], env: dict, runs: int) -> float:
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        p = subprocess.run([sys.executable, "-m", "warpdata", *args], env=env, capture_output=True)
        times.append(time.perf_counter() - t0)
        if p.returncode != 0:
            raise SystemExit(f"warp {' '.join(args)} failed: {p.stderr.decode()[-2000:]}")
    return statistics.median(times)


def api_seconds(store: str, runs: int) -> dict[str, float]:
    import warpdata
    from warpdata.read import dataset as dataset_module

    out: dict[str, list[float]] = {"open": [], "schema": [], "head": [], "filter": []}
    for _ in range(runs):
        dataset_module._MANIFESTS.clear()
        t0 = time.perf_counter()
        ds = warpdata.dataset("bench/lat", store=store, mode="remote")
        out["open"].append(time.perf_counter() - t0)
        t = ds.table("main")
        t0 = time.perf_counter()
        t.schema()
        out["schema"].append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        t.head(5)
        out["head"].append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        n = t.filter("id BETWEEN 100 AND 200").count()
        out["filter"].append(time.perf_counter() - t0)
        assert n == 101, n
    return {k: statistics.median(v) for k, v in out.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=5)
    a = ap.parse_args()
    from support.httpserve import StaticServer
    from support.s3fixtures import s3_env, start_moto_server

    tmp = Path(tempfile.mkdtemp(prefix="warp-lat-"))
    make_data(tmp)
    server = start_moto_server()
    try:
        import boto3

        senv = s3_env(server.endpoint)
        os.environ.update(senv)
        os.environ["WARP_CACHE_DIR"] = str(tmp / "cache")
        boto3.client("s3", endpoint_url=server.endpoint, region_name="us-east-1").create_bucket(Bucket="bench")
        stores = {"local": str(tmp / "store"), "s3 (moto)": "s3://bench/store"}
        for url in stores.values():
            subprocess.run([sys.executable, "-m", "warpdata", "publish", "bench/lat", "--table",
                            f"main={tmp}/part-*.parquet", "--store", url], env=dict(os.environ), check=True,
                           capture_output=True)
        with StaticServer(tmp / "store") as host:
            stores["http"] = host.url
            load = os.getloadavg()
            print(f"store latency, medians of {a.runs} runs, load avg {load[0]:.2f} (2 shared cores)\n")
            print(f"{'store':<10} {'CLI info':>9} {'schema':>8} {'head':>8} | {'open':>7} {'schema()':>9} "
                  f"{'head(5)':>8} {'filter':>8}   (seconds)")
            for name, url in stores.items():
                env = {**os.environ, "WARP_STORE": url, "WARP_CACHE_DIR": str(tmp / f"cache-{len(url)}")}
                cli = [cli_seconds([cmd, "bench/lat", *extra], env, a.runs)
                       for cmd, extra in (("info", []), ("schema", []), ("head", ["-n", "5", "--mode", "remote"]))]
                api = api_seconds(url, a.runs)
                print(f"{name:<10} {cli[0]:>9.3f} {cli[1]:>8.3f} {cli[2]:>8.3f} | {api['open']:>7.4f} "
                      f"{api['schema']:>9.4f} {api['head']:>8.4f} {api['filter']:>8.4f}")
    finally:
        server.stop()


if __name__ == "__main__":
    main()
