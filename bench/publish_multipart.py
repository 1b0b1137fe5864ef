"""Large-blob publish: parallel multipart uploads against one stream, same moto server, same run.

The issue's figure: a 1 GiB warehouse published to S3 with multipart uploads
reaches >= 1.5x the throughput of a single-stream upload. The warehouse is
built by ``warp etl`` from the sample detection corpus (2,000 photos at
416x416 u8, 256 samples per shard: 8 shards of ~130 MB, ~1.04 GB), then
published with ``warp publish --from``: every shard is one blob of 64 MB or
more, the size at which ``warp publish`` switches to multipart.

Systems, alternating round by round, each against a fresh moto server
(moto keeps objects in memory):

* ``warp``          — ``warp publish --from`` (subprocess) with the defaults:
                      ``WARP_UPLOAD_CONCURRENCY=8`` parts of 16 MB per blob, 8 workers;
* ``warp-1stream``  — the same with ``--workers 1`` and ``WARP_UPLOAD_CONCURRENCY=1``:
                      warp's own path, one part in flight;
* ``put_object``    — boto3 ``put_object`` of each file of the warehouse in turn: one
                      stream, no multipart (what an upload without parts does).

The limit here is the server: moto is a Python process on the same cores,
so its CPU seconds per GB are printed next to each system's wall time, with
the ingest rate its cheapest path allows.

    python bench/publish_multipart.py [--n 2000] [--size 416] [--runs 3]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))


def _proc_cpu(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        v = f.read().rsplit(")", 1)[1].split()
    return (int(v[11]) + int(v[12])) / os.sysconf("SC_CLK_TCK")


def make_data(n: int, size: int) -> Path:
    """A warehouse version directory of ``n`` photos at ``size``², 256 samples per shard."""
    import json

    sys.path.insert(0, str(HERE))
    from etl_scale import config, corpus

    d = corpus(n)
    out = HERE / "out" / f"publish-multipart-wh-{n}-{size}"
    versions = sorted(out.glob("v*/manifest.json")) if out.is_dir() else []
    if versions:
        return versions[-1].parent
    cfg = config(d, str(out), name=f"multipart-{size}.toml", size=size, shard_samples=256)
    r = subprocess.run([sys.executable, "-m", "warpdata", "etl", "--config", str(cfg), "--json", "-q"],
                       capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"warp etl failed ({r.returncode}):\n{r.stderr[-2000:]}")
    return Path(json.loads(r.stdout)["path"])


def run_one(name: str, data: Path) -> dict:
    import boto3
    from support.s3fixtures import s3_env, start_moto_server

    server = start_moto_server()
    try:
        env = {**os.environ, **s3_env(server.endpoint)}
        client = boto3.client("s3", endpoint_url=server.endpoint, region_name="us-east-1",
                              aws_access_key_id="testing", aws_secret_access_key="testing")
        client.create_bucket(Bucket="bench")
        cache = tempfile.mkdtemp(prefix="warp-bench-cache-")
        env["WARP_CACHE_DIR"] = cache
        s0 = _proc_cpu(server.proc.pid)
        t = time.perf_counter()
        if name == "put_object":
            for p in sorted(x for x in data.iterdir() if x.is_file()):
                with open(p, "rb") as f:
                    client.put_object(Bucket="bench", Key=f"single/{p.name}", Body=f)
        else:
            args = [sys.executable, "-m", "warpdata", "publish", "ws/big", "--from", str(data),
                    "--store", "s3://bench/reg", "--json"]
            if name == "warp-1stream":
                args += ["--workers", "1"]
                env["WARP_UPLOAD_CONCURRENCY"] = "1"
            r = subprocess.run(args, capture_output=True, text=True, env=env)
            if r.returncode != 0:
                raise SystemExit(f"{name} failed ({r.returncode}):\n{r.stderr[-2000:]}")
        wall = time.perf_counter() - t
        server_cpu = _proc_cpu(server.proc.pid) - s0
        reqs = server.requests()
        shutil.rmtree(cache, ignore_errors=True)
    finally:
        server.stop()
    return {"wall_s": wall, "server_cpu_s": server_cpu,
            "part_puts": sum(r["method"] == "PUT" and "partNumber" in r["query"] for r in reqs),
            "puts": sum(r["method"] == "PUT" for r in reqs)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=2000, help="photos in the warehouse")
    ap.add_argument("--size", type=int, default=416, help="sample side in pixels (416: ~1.04 GB for 2,000)")
    ap.add_argument("--runs", type=int, default=3)
    a = ap.parse_args()

    data = make_data(a.n, a.size)
    files = [p for p in data.iterdir() if p.is_file()]
    total = sum(p.stat().st_size for p in files)
    big = sum(p.stat().st_size >= 64 << 20 for p in files)
    # warm the page cache so every system reads the files from memory
    for p in files:
        with open(p, "rb") as f:
            while f.read(16 << 20):
                pass
    names = ["warp", "warp-1stream", "put_object"]
    res: dict[str, list[dict]] = {n: [] for n in names}
    loads = []
    for i in range(a.runs):
        for n in (names if i % 2 == 0 else names[::-1]):
            res[n].append(run_one(n, data))
            loads.append(os.getloadavg()[0])
    med = {n: {f: statistics.median(r[f] for r in v) for f in v[0]} for n, v in res.items()}
    gb = total / 1e9
    load = statistics.median(loads)
    print(f"warehouse {data.name}: {len(files)} files ({big} of 64 MB or more) = {total / 2**30:.2f} GiB, "
          f"{a.runs} rounds, {os.cpu_count()} CPUs, "
          f"load average (1 min, median) {load:.2f}")
    print(f"{'system':14} {'wall s':>8} {'MB/s':>8} {'moto CPU s/GB':>14} {'PUTs':>6} {'part PUTs':>10}")
    for n, m in med.items():
        print(f"{n:14} {m['wall_s']:8.2f} {total / 1e6 / m['wall_s']:8.1f} {m['server_cpu_s'] / gb:14.2f} "
              f"{m['puts']:6.0f} {m['part_puts']:10.0f}")
    over_single = med["put_object"]["wall_s"] / med["warp"]["wall_s"]
    over_own = med["warp-1stream"]["wall_s"] / med["warp"]["wall_s"]
    # moto serves requests in Python threads under one GIL: it ingests at most ~1 core's worth;
    # its cheapest path's CPU per byte bounds every upload method on this machine
    cheapest = min(m["server_cpu_s"] for m in med.values()) / total
    ceiling = 1 / cheapest / 1e6 if cheapest else float("inf")
    print(f"moto's ceiling (one core at its cheapest CPU per byte): {ceiling:.0f} MB/s; 1.5x single-stream "
          f"would need {1.5 * total / 1e6 / med['put_object']['wall_s']:.0f} MB/s")
    print(f"warp multipart / single-stream put_object: {over_single:.2f}x (target >= 1.5x)")
    print(f"warp multipart / warp one part at a time:  {over_own:.2f}x")

    from _figures import emit, figure

    note = (f"{total / 2**30:.2f} GiB warehouse, {big} shards of 64 MB or more, median of {a.runs}, load {load:.2f}, "
            "moto on the same cores")
    emit("publish_multipart", [
        figure("publish 1 GiB, multipart / single-stream put_object (MB/s)", round(over_single, 3), "x", target=1.5,
               note=note),
        figure("publish 1 GiB, multipart / one part at a time (MB/s)", round(over_own, 3), "x", note=note),
        figure("publish 1 GiB, warp multipart", round(total / 1e6 / med["warp"]["wall_s"], 1), "MB/s", note=note),
        figure("moto ingest ceiling (one core, cheapest CPU per byte)", round(ceiling, 1), "MB/s", note=note),
    ])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
