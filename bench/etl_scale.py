"""Scale-out of ``warp etl`` (tensor warehouse): Dask overhead, object-store output, 1 → 2 workers.

The corpus is ``warp.sampledata.detection`` (COCO labels + JPEGs, 160-480 px),
transformed to 320×320 u8. Every run is a fresh ``warp etl --clear --json``
subprocess; configurations are interleaved round by round and the medians of
``--runs`` rounds are printed, with the load average (the machine may be shared).

* ``local-N``  — the default executor (threads), N workers;
* ``dask-N``   — ``--executor dask``: a LocalCluster of N single-threaded worker
                 processes started by the run (its start-up is included);
* ``s3out-N``  — local executor, ``--output s3://…`` on a moto server on
                 127.0.0.1 (staged build + create-only upload, manifest last).

Rates are samples / wall second of the whole command (scan, build, finalize,
upload), plus the build phase's own rate. From dask-1 and dask-2 walls the
script fits T(n) = s + p/n (s: serial driver part, p: parallel work) and
prints what 64 workers would give.

    python bench/etl_scale.py [--n 2000] [--runs 3] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "bench" / "out"


def corpus(n: int) -> Path:
    from warpdata.sampledata.detection import generate

    d = OUT / f"etl-scale-corpus-{n}"
    if not (d / "annotations.json").is_file():
        shutil.rmtree(d, ignore_errors=True)
        generate(d, count=n, seed=11)
    return d


def config(d: Path, out: str) -> Path:
    p = d / "scale.toml"
    p.write_text(f"""
[source]
format = "coco"
path = "."

[transform]
target_size = 320
max_boxes = 32

[validation]
max_invalid_fraction = {{ warn = 0.0, fail = 0.5 }}
max_missing_fraction = {{ warn = 0.0, fail = 0.5 }}

[output]
root = "{out}"
shard_samples = 64

[build]
durable = false
""")
    return p


def run(cfg: Path, args: list[str], env: dict[str, str]) -> dict:
    t = time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "warpdata", "etl", "--config", str(cfg), "--json", "--clear", *args],
                       capture_output=True, text=True, env=env)
    wall = time.perf_counter() - t
    if r.returncode != 0:
        raise SystemExit(f"warp etl {' '.join(args)} failed ({r.returncode}):\n{r.stderr[-2000:]}")
    doc = json.loads(r.stdout)
    return {"wall_s": wall, "samples": doc["samples"], "rate": doc["samples"] / wall,
            "build_rate": doc.get("rate_samples_per_s") or 0.0, "shards": doc["shards"]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=2000)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()

    sys.path.insert(0, str(ROOT / "tests"))
    from support.s3fixtures import s3_env, start_moto_server

    d = corpus(a.n)
    work = OUT / "etl-scale-work"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    env = {**os.environ, "WARP_CACHE_DIR": str(work / "cache")}
    cfg = config(d, str(work / "wh"))
    server = start_moto_server()
    try:
        s3env = {**env, **s3_env(server.endpoint)}
        import boto3

        boto3.client("s3", endpoint_url=server.endpoint, region_name="us-east-1", aws_access_key_id="testing",
                     aws_secret_access_key="testing").create_bucket(Bucket="bench")
        systems = {
            "local-2": (["-j", "2"], env),
            "dask-2": (["-j", "2", "--executor", "dask"], env),
            "dask-1": (["-j", "1", "--executor", "dask"], env),
            "local-1": (["-j", "1"], env),
            "s3out-2": (["-j", "2", "--output", "s3://bench/wh-{i}"], s3env),  # a fresh prefix per round
        }
        res: dict[str, list[dict]] = {k: [] for k in systems}
        loads = []
        for i in range(a.runs):
            order = list(systems) if i % 2 == 0 else list(reversed(systems))
            for name in order:
                args, e = systems[name]
                args = [x.format(i=i) for x in args]
                if name.startswith("s3out"):
                    server.reset()
                res[name].append(run(cfg, args, e))
                if name.startswith("s3out"):
                    reqs = server.requests()
                    res[name][-1]["puts"] = sum(r["method"] == "PUT" for r in reqs)
                    res[name][-1]["gets"] = sum(r["method"] == "GET" for r in reqs)
                loads.append(os.getloadavg()[0])
    finally:
        server.stop()

    med = {k: {f: statistics.median(r[f] for r in v) for f in v[0]} for k, v in res.items()}
    t1, t2 = med["dask-1"]["wall_s"], med["dask-2"]["wall_s"]
    p = max(0.0, 2 * (t1 - t2))
    s = max(0.0, t1 - p)
    n = med["local-2"]["samples"]
    model = {"serial_s": round(s, 3), "parallel_s": round(p, 3),
             "predicted_rate_64": round(n / (s + p / 64), 1) if s + p / 64 > 0 else None,
             "max_rate_serial_bound": round(n / s, 1) if s else None}
    ratios = {
        "dask2_over_local2": round(med["dask-2"]["rate"] / med["local-2"]["rate"], 3),
        "dask2_over_local2_build": round(med["dask-2"]["build_rate"] / med["local-2"]["build_rate"], 3),
        "s3out2_over_local2": round(med["s3out-2"]["rate"] / med["local-2"]["rate"], 3),
        "dask2_over_dask1": round(med["dask-2"]["rate"] / med["dask-1"]["rate"], 3),
        "local2_over_local1": round(med["local-2"]["rate"] / med["local-1"]["rate"], 3),
        "puts_per_shard_s3out": round(med["s3out-2"]["puts"] / max(1, med["s3out-2"]["shards"]), 3),
    }
    report = {"n": a.n, "runs": a.runs, "cpus": os.cpu_count(), "loadavg_1m_median": round(statistics.median(loads), 2),
              "median": {k: {f: round(v, 3) for f, v in m.items()} for k, m in med.items()},
              "ratios": ratios, "model": model}
    if a.json:
        print(json.dumps(report, indent=2))
    else:
        print(f"{a.n} photos, {a.runs} rounds, {os.cpu_count()} CPUs, load average (1 min, median) "
              f"{report['loadavg_1m_median']}")
        print(f"{'config':10} {'wall s':>8} {'img/s':>8} {'build img/s':>12}")
        for k, m in med.items():
            print(f"{k:10} {m['wall_s']:8.2f} {m['rate']:8.1f} {m['build_rate']:12.1f}")
        for k, v in ratios.items():
            print(f"{k:28} {v}")
        print(f"model T(n) = {model['serial_s']} s + {model['parallel_s']} s / n  ->  64 workers: "
              f"{model['predicted_rate_64']} img/s (serial bound {model['max_rate_serial_bound']} img/s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
