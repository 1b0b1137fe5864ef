"""Publish throughput vs a plain ``s3fs.put`` of the same files, same moto S3 server, same run.

Dataset: 10 Parquet shards + 10,000 small files (2-8 KB). Each run uses
fresh buckets and a fresh stat cache, so warp's first publish includes
hashing every input and packing the files into tar shards.

* first publish: ``warp publish`` (library call) of tables + artifact;
* s3fs.put: ``S3FileSystem.put([...all files...])`` (s3fs's concurrent bulk upload);
* re-publish: the same publish again (unchanged inputs): time, blobs uploaded,
  S3 requests sent (counted by the server) and stat-cache hits.

Prints medians of ``--runs`` runs and the ratios the issue targets
(throughput >= 0.8x s3fs.put; re-publish <= 5 % of first publish, 0 uploads).

    .venv/bin/python bench/publish_registry.py [--runs 3] [--peer-runs 1] [--files 10000]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))


def make_data(root: Path, n_files: int) -> tuple[list[str], Path, int]:
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(0)
    (root / "tables").mkdir(parents=True)
    files_dir = root / "files"
    names = [f"{i % 100:02d}/{i:05d}.bin" for i in range(n_files)]
    for i in range(10):
        rows = n_files // 10
        pq.write_table(pa.table({"path": names[i * rows:(i + 1) * rows],
                                 "x": rng.standard_normal(rows), "y": rng.integers(0, 1000, rows)}),
                       root / "tables" / f"part-{i:02d}.parquet")
    total = 0
    for name in names:
        p = files_dir / name
        p.parent.mkdir(parents=True, exist_ok=True)
        data = rng.bytes(int(rng.integers(2048, 8192)))
        p.write_bytes(data)
        total += len(data)
    tables = sorted(str(p) for p in (root / "tables").glob("*.parquet"))
    total += sum(os.path.getsize(p) for p in tables)
    return tables, files_dir, total


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--files", type=int, default=10_000)
    # 10k single-object PUTs to moto take minutes: the peer runs once unless asked
    ap.add_argument("--peer-runs", type=int, default=1)
    args = ap.parse_args()

    import boto3
    from support.s3fixtures import s3_env, start_moto_server

    server = start_moto_server()
    os.environ.update(s3_env(server.endpoint))
    work = Path(tempfile.mkdtemp(prefix="warp-bench-publish-"))
    try:
        tables, files_dir, total = make_data(work / "data", args.files)
        all_files = tables + sorted(str(p) for p in files_dir.rglob("*.bin"))
        client = boto3.client("s3", endpoint_url=server.endpoint, region_name="us-east-1")
        from warpdata.publishing.publish import PublishRequest, publish
        from warpdata.registry.store import Store
        from warpdata.storage.locations import StorageConfig

        first, peer, again, again_uploads, again_requests, again_hits = [], [], [], [], [], []
        first_requests, first_blobs = [], []
        for run in range(args.runs):
            bw, bp = f"bench-warp-{uuid.uuid4().hex[:8]}", f"bench-s3fs-{uuid.uuid4().hex[:8]}"
            client.create_bucket(Bucket=bw)
            client.create_bucket(Bucket=bp)
            os.environ["WARP_CACHE_DIR"] = str(work / f"cache-{run}")  # cold stat cache: hashing is included
            req = PublishRequest("bench/publish", tables={"main": tables}, artifacts={"files": str(files_dir)},
                                 shard_size=64 << 20)
            store = Store(f"s3://{bw}/warp")
            server.reset()
            t = time.perf_counter()
            r1 = publish(req, store=store)
            first.append(time.perf_counter() - t)
            reqs = [r for r in server.requests() if r["bucket"] == bw]
            first_requests.append(reqs)
            first_blobs.append(r1.blobs_uploaded)
            server.reset()
            t = time.perf_counter()
            r2 = publish(req, store=store)
            again.append(time.perf_counter() - t)
            again_uploads.append(r2.blobs_uploaded)
            again_requests.append(sum(r["bucket"] == bw for r in server.requests()))
            again_hits.append(r2.stat_cache_hits)
            assert r2.version_hash == r1.version_hash

            if run >= args.peer_runs:
                print(f"run {run + 1}: warp first {first[-1]:.2f}s, re-publish {again[-1]:.3f}s "
                      f"({r2.blobs_uploaded} uploads, {again_requests[-1]} S3 requests, "
                      f"{r2.stat_cache_hits} stat-cache hits)", file=sys.stderr)
                continue
            fs = StorageConfig.from_env().s3fs()
            rpaths = [f"{bp}/raw/{os.path.relpath(p, work / 'data')}" for p in all_files]
            t = time.perf_counter()
            fs.put(all_files, rpaths)
            peer.append(time.perf_counter() - t)
            print(f"run {run + 1}: warp first {first[-1]:.2f}s ({r1.blobs_uploaded} blobs), "
                  f"re-publish {again[-1]:.3f}s ({r2.blobs_uploaded} uploads, {again_requests[-1]} S3 requests, "
                  f"{r2.stat_cache_hits} stat-cache hits), s3fs.put {peer[-1]:.2f}s "
                  f"({len(all_files)} objects)", file=sys.stderr)

        mf, mp, ma = statistics.median(first), statistics.median(peer), statistics.median(again)
        mb = total / 1e6
        print(f"\n10 Parquet shards + {args.files} small files, {mb:.1f} MB, moto S3 on 127.0.0.1, "
              f"median of {args.runs} runs (s3fs.put: {min(args.runs, args.peer_runs)})\n")
        print("| job | seconds | MB/s | vs s3fs.put |")
        print("|---|---|---|---|")
        print(f"| s3fs.put (one object per file) | {mp:.2f} | {mb / mp:.1f} | 1.00x |")
        print(f"| warp publish, first (hash + pack + upload) | {mf:.2f} | {mb / mf:.1f} | {mp / mf:.2f}x |")
        print(f"| warp publish, unchanged re-publish | {ma:.3f} | - | {mp / ma:.0f}x |")
        print(f"\nthroughput ratio warp/s3fs.put: {mp / mf:.2f}x (target >= 0.8x)")
        print(f"re-publish / first publish: {100 * ma / mf:.1f} % (target <= 5 %), "
              f"blobs uploaded on re-publish: {max(again_uploads)} (target 0), "
              f"S3 requests per re-publish: {max(again_requests)}, stat-cache hits: {min(again_hits)}")
        from collections import Counter

        kinds = Counter()
        for r in first_requests[-1]:
            listing = r["method"] == "GET" and r["key"] == "" and "list-type" in r["query"]
            kinds["LIST" if listing else r["method"]] += 1
        extra = [len(q) - b for q, b in zip(first_requests, first_blobs, strict=True)]
        print(f"first publish requests: {len(first_requests[-1])} for {first_blobs[-1]} blobs uploaded "
              f"({', '.join(f'{k} {v}' for k, v in sorted(kinds.items()))}); requests - blobs per run: {extra} "
              "(target: a constant)")
        print("re-publish / first publish per run: "
              + ", ".join(f"{100 * a / f:.1f} %" for a, f in zip(again, first, strict=True)))
        from _figures import emit, figure  # the summary's figures (bench/summary.py)

        emit("publish_registry", [
            figure("warp publish throughput / s3fs.put", mp / mf, "x", target=0.8, note=f"{mb:.1f} MB, moto S3"),
            figure("unchanged re-publish / first publish", 100 * ma / mf, "%", target=5, op="<="),
            figure("blobs uploaded on an unchanged re-publish", max(again_uploads), "", target=0, op="<=")])
    finally:
        server.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
