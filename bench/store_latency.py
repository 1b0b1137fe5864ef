"""Store latency: opening a dataset, ``info``, ``schema``, ``head`` and a filtered read, per store kind.

One small dataset (20,000 rows in 4 Parquet files) is published by warp to a local folder, to moto S3 on
127.0.0.1 (tests/support/s3fixtures.py) and served over HTTP from the local folder
(tests/support/httpserve.py). For each store the script times, as medians of ``--runs``:

* in a fresh interpreter per run (what a user's first call pays, imports included): open
  (``warpdata.dataset``: pointer + manifest), then one of ``info()``, ``schema()``, ``head(5)`` or a
  filtered count (``id BETWEEN 100 AND 200``); the open, the operation and the whole process;
* ``warp info``, ``warp schema`` and ``warp head -n 5`` (the CLI, whole process).

Both sides run from compiled bytecode, as installed packages do: the peer's wheel was compiled by
pip, and warp's children write and reuse theirs under a cache folder (``PYTHONPYCACHEPREFIX``; this
checkout is an editable install, and a shell with ``PYTHONDONTWRITEBYTECODE=1`` would otherwise
make every warp process compile its modules from source). One untimed run per operation and side
comes first.

The peer (PyPI ``warpdata`` 3.0.27, the registry design's own implementation) installs a module of the
same name, so it runs from its own interpreter (``--peer-python``, bench/_peer_latency.py), on the S3
store only (its own publisher and layout, same Parquet files), alternating with warp run by run; the
ratios are peer seconds ÷ warp seconds (above 1: warp is faster).

    python bench/store_latency.py --runs 5 [--only s3] [--no-cli]

Install the peer outside the project (``python3 -m venv /tmp/peer-venv && /tmp/peer-venv/bin/pip install
warpdata==3.0.27 duckdb==1.5.5 duckdb-extension-httpfs``) and copy the wheel's
``httpfs.duckdb_extension`` to ``/tmp/peer-home/.duckdb/extensions/v1.5.5/linux_amd64/`` (``--peer-home``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

T0 = time.perf_counter()
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


def compiled(env: dict, tmp: Path) -> dict:
    """``env`` for a warp child that reads and writes compiled bytecode (module docstring)."""
    out = {k: v for k, v in env.items() if k != "PYTHONDONTWRITEBYTECODE"}
    out["PYTHONPYCACHEPREFIX"] = str(tmp / "pycache")
    return out


def cli_seconds(args: list[str], env: dict, runs: int) -> float:
    times = []
    subprocess.run([sys.executable, "-m", "warpdata", *args], env=env, capture_output=True)  # untimed
    for _ in range(runs):
        t0 = time.perf_counter()
        p = subprocess.run([sys.executable, "-m", "warpdata", *args], env=env, capture_output=True)
        times.append(time.perf_counter() - t0)
        if p.returncode != 0:
            raise SystemExit(f"warp {' '.join(args)} failed: {p.stderr.decode()[-2000:]}")
    return statistics.median(times)


def child(op: str, store: str) -> None:
    """In this fresh process: import, open bench/lat, then ``op``; one JSON line (the peer's shape)."""
    import warpdata

    t0 = time.perf_counter()
    ds = warpdata.dataset("bench/lat", store=store, mode="remote")
    opened = time.perf_counter() - t0
    t0 = time.perf_counter()
    if op == "info":
        ds.info()
    elif op == "schema":
        ds.table("main").schema()
    elif op == "head":
        ds.table("main").head(5)
    elif op == "filter":
        n = ds.table("main").filter("id BETWEEN 100 AND 200").count()
        assert n == 101, n
    print(json.dumps({"open": opened, op: time.perf_counter() - t0, "total": time.perf_counter() - T0}))


def run_child(argv: list[str], env: dict, cwd: Path) -> dict:
    t0 = time.perf_counter()
    p = subprocess.run(argv, env=env, capture_output=True, text=True, cwd=cwd)
    if p.returncode:
        raise SystemExit(f"{' '.join(argv[:3])} failed:\n{p.stderr[-3000:]}")
    doc = json.loads(p.stdout.strip().splitlines()[-1])
    doc["process"] = time.perf_counter() - t0
    return doc


OPS = ("info", "schema", "head", "filter")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--peer-python", default="/tmp/peer-venv/bin/python")
    ap.add_argument("--peer-home", default="/tmp/peer-home",
                    help="HOME for the peer: holds DuckDB's httpfs extension (see bench/_peer_latency.py)")
    ap.add_argument("--only", choices=("local", "s3", "http"), help="time one store kind only")
    ap.add_argument("--no-cli", action="store_true", help="skip the warp CLI timings")
    ap.add_argument("--child", nargs=2, metavar=("OP", "STORE"), help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        child(*a.child)
        return
    from support.httpserve import StaticServer
    from support.s3fixtures import s3_env, start_moto_server

    tmp = Path(tempfile.mkdtemp(prefix="warp-lat-"))
    files = make_data(tmp)
    server = start_moto_server()
    try:
        import boto3

        os.environ.update(s3_env(server.endpoint))
        os.environ["WARP_CACHE_DIR"] = str(tmp / "cache")
        boto3.client("s3", endpoint_url=server.endpoint, region_name="us-east-1").create_bucket(Bucket="bench")
        stores = {"local": str(tmp / "store"), "s3 (moto)": "s3://bench/store"}
        for url in stores.values():
            subprocess.run([sys.executable, "-m", "warpdata", "publish", "bench/lat", "--table",
                            f"main={tmp}/part-*.parquet", "--store", url], env=dict(os.environ), check=True,
                           capture_output=True)
        peer_env = None
        if Path(a.peer_python).exists():
            peer_env = {**os.environ, "WARPDATASETS_S3_ENDPOINT_URL": server.endpoint, "PYTHONPATH": "",
                        "WARPDATASETS_MANIFEST_BASE": "s3://bench/peer", "WARPDATASETS_S3_REGION": "us-east-1",
                        "WARPDATASETS_SCOPE": "published", "WARPDATASETS_MODE": "remote", "HOME": a.peer_home}
            subprocess.run([a.peer_python, str(HERE / "_peer_latency.py"), "publish", "s3://bench/peer", *files],
                           env=peer_env, check=True, capture_output=True, cwd=tmp)
        with StaticServer(tmp / "store") as host:
            stores["http"] = host.url
            if a.only:
                stores = {k: v for k, v in stores.items() if k.startswith(a.only)}
            load = os.getloadavg()
            print(f"store latency, medians of {a.runs} runs, load avg {load[0]:.2f} (2 shared cores), "
                  "both sides from compiled bytecode\n")
            print("fresh process each: import + open + the operation (seconds); peer = warpdata 3.0.27")
            print(f"{'store':<10} {'op':<7} {'warp open':>9} {'op':>7} {'process':>8} | {'peer open':>9} {'op':>7} "
                  f"{'process':>8} | {'speed vs peer (process)':>23}")
            for name, url in stores.items():
                for op in OPS:
                    w, p = [], []
                    for k in range(-1, a.runs):  # run -1: untimed (bytecode written, files read once)
                        env = compiled({**os.environ, "WARP_CACHE_DIR": str(tmp / f"cache-w{k}")}, tmp)
                        w.append(run_child([sys.executable, __file__, "--child", op, url], env, tmp))
                        if peer_env is not None and name == "s3 (moto)":
                            ws = tmp / f"peer-ws-{op}-{k}"
                            e = {**peer_env, "WARPDATASETS_WORKSPACE_ROOT": str(ws),
                                 "WARPDATASETS_CACHE_DIR": str(ws / "cache")}
                            p.append(run_child([a.peer_python, str(HERE / "_peer_latency.py"), "op", op], e, tmp))
                    w, p = w[1:], p[1:]

                    def med(rows: list[dict], key: str) -> float:
                        return statistics.median(r[key] for r in rows)

                    line = f"{name:<10} {op:<7} {med(w, 'open'):>9.3f} {med(w, op):>7.3f} {med(w, 'process'):>8.3f}"
                    if p:
                        line += (f" | {med(p, 'open'):>9.3f} {med(p, op):>7.3f} {med(p, 'process'):>8.3f} | "
                                 f"open {med(p, 'open') / med(w, 'open'):.2f}x, op+open "
                                 f"{(med(p, 'open') + med(p, op)) / (med(w, 'open') + med(w, op)):.2f}x, "
                                 f"process {med(p, 'process') / med(w, 'process'):.2f}x")
                    print(line, flush=True)
            print("\nwarp CLI, whole process (seconds)")
            for name, url in stores.items() if not a.no_cli else ():
                env = compiled({**os.environ, "WARP_STORE": url, "WARP_CACHE_DIR": str(tmp / f"cache-cli-{len(url)}")},
                               tmp)
                cli = [cli_seconds([cmd, "bench/lat", *extra], env, a.runs)
                       for cmd, extra in (("info", []), ("schema", []), ("head", ["-n", "5", "--mode", "remote"]))]
                print(f"{name:<10} info {cli[0]:.3f}  schema {cli[1]:.3f}  head {cli[2]:.3f}", flush=True)
    finally:
        server.stop()


if __name__ == "__main__":
    main()
