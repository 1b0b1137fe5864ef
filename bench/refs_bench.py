"""Ref reads/s: warp vs the registry design's own implementation (PyPI warpdata 3.0.27), same data.

2,000 images (64×64 PNG, ~12 KB) packed in tar shards of ``--shard-mb`` and bound to column
``image`` of a one-shard table, published twice to one moto S3 server on 127.0.0.1: once by
warp, once by the peer (its own publisher and layout). Each side iterates ``batch_dicts`` and
calls ``ref.read_bytes()`` on every ref, sequentially as a training loop would:

* cold: empty cache; epoch 2: a new dataset handle over the same cache (same process).
* runs alternate warp / peer; the median of ``--runs`` is reported.
* warp modes: ``auto`` (default; background shard fetch), ``remote`` (ranged GETs only), and
  ``auto`` with ``batch_dicts(read_refs=True)`` (each batch's refs read in parallel).
* requests (HEAD / GET) per warp cold epoch are counted by the server.

The peer runs in a subprocess with its own interpreter (``--peer-python``, default
/work/peer-venv/bin/python; install it there with
``python3 -m venv /work/peer-venv && /work/peer-venv/bin/python -m pip install warpdata==3.0.27``).
Without it, warp alone is measured.

Run: .venv/bin/python bench/refs_bench.py [--runs 3] [--images 2000] [--shard-mb 8]
"""

from __future__ import annotations

import argparse
import json
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


def make_media(root: Path, n: int) -> None:
    import numpy as np
    from PIL import Image

    (root / "img").mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    for i in range(n):
        Image.fromarray(rng.integers(0, 255, (64, 64, 3), dtype=np.uint8)).save(root / "img" / f"{i:05d}.png")


def warp_epochs(mode: str, cache: Path, read_refs: bool, batch: int, server) -> dict:
    import warpdata
    from warpdata.storage.blobcache import BlobCache

    out = {}
    for epoch in ("cold", "epoch2"):
        server.reset()
        t0 = time.perf_counter()
        ds = warpdata.dataset("bench/refs", mode=mode, cache=None if mode == "remote" else BlobCache(cache))
        n = 0
        kw = {"read_refs": True} if read_refs else {}
        for d in ds.table("main").batch_dicts(batch, columns=["id", "image"], **kw):
            for ref in d["image"]:
                ref.read_bytes()
                n += 1
        out[epoch] = n / (time.perf_counter() - t0)
        reqs = server.requests()
        out[epoch + "_req"] = {m: sum(1 for r in reqs if r["method"] == m and "/blobs/" in r["key"])
                               for m in ("HEAD", "GET")}
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--images", type=int, default=2000)
    ap.add_argument("--shard-mb", type=float, default=8)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--peer-python", default="/work/peer-venv/bin/python")
    a = ap.parse_args()

    from support.s3fixtures import s3_env, start_moto_server

    server = start_moto_server()
    tmp = Path(tempfile.mkdtemp(prefix="warp-refs-bench-"))
    try:
        run(a, server, s3_env, tmp)
    finally:
        server.stop()
        shutil.rmtree(tmp, ignore_errors=True)


def run(a, server, s3_env, tmp: Path) -> None:
    import boto3
    import pyarrow as pa
    import pyarrow.parquet as pq
    from support.datasets import publish

    env = s3_env(server.endpoint)
    os.environ.update(env)
    os.environ["WARP_CACHE_SIZE_GB"] = "20"
    boto3.client("s3", endpoint_url=server.endpoint, region_name="us-east-1").create_bucket(Bucket="bench")
    store = "s3://bench/warp"
    os.environ["WARP_STORE"] = store
    make_media(tmp / "media", a.images)
    table = pa.table({"id": pa.array(range(a.images), pa.int64()),
                      "image": pa.array([f"img/{i:05d}.png" for i in range(a.images)]),
                      "audio": pa.nulls(a.images, pa.string())})  # the publish helper also binds 'audio'
    shard_bytes = int(a.shard_mb * 1e6)
    m = publish(store, "bench/refs", {"main": [table]}, tmp / "w", row_group_size=a.images,
                media=tmp / "media", tar_target=shard_bytes)
    n_shards = len(m.artifacts["media"].shards)
    media_bytes = sum(s.byte_size for s in m.artifacts["media"].shards)

    peer = Path(a.peer_python)
    peer_env = None
    if peer.exists():
        pq.write_table(table, tmp / "main.parquet")
        peer_env = {**os.environ, "WARPDATASETS_S3_ENDPOINT_URL": server.endpoint,
                    "WARPDATASETS_MANIFEST_BASE": "s3://bench/peer", "WARPDATASETS_S3_REGION": "us-east-1",
                    "WARPDATASETS_SCOPE": "published", "WARPDATASETS_MODE": "hybrid", "PYTHONPATH": ""}
        r = subprocess.run([str(peer), str(HERE / "_peer_refs.py"), "publish", str(tmp / "media"),
                            str(tmp / "main.parquet"), "s3://bench/peer", str(shard_bytes)],
                           env=peer_env, capture_output=True, text=True, cwd=tmp)
        if r.returncode:
            print(f"peer publish failed; measuring warp alone:\n{r.stderr[-2000:]}")
            peer_env = None

    def peer_run() -> dict:
        ws = tmp / f"peer-ws-{time.monotonic_ns()}"
        e = {**peer_env, "WARPDATASETS_WORKSPACE_ROOT": str(ws), "WARPDATASETS_CACHE_DIR": str(ws / "cache"),
             "HOME": str(ws)}
        r = subprocess.run([str(peer), str(HERE / "_peer_refs.py"), "read", "2", str(a.batch),
                            str(tmp / "main.parquet")], env=e,
                           capture_output=True, text=True, cwd=tmp)
        if r.returncode:
            raise SystemExit(f"peer read failed:\n{r.stderr[-3000:]}")
        ep = json.loads(r.stdout.strip().splitlines()[-1])["epochs"]
        shutil.rmtree(ws, ignore_errors=True)
        return {"cold": ep[0], "epoch2": ep[1]}

    from warpdata.read.table import Table

    variants = [("auto", "auto", False), ("auto+read_refs", "auto", True), ("remote", "remote", False)]
    if "read_refs" not in Table.batch_dicts.__code__.co_varnames:
        variants = [v for v in variants if not v[2]]  # an older warp (before/after comparisons)
    results: dict[str, list[dict]] = {name: [] for name, _, _ in variants}
    results["peer"] = []
    for k in range(a.runs):
        for name, mode, rr in variants:
            cache = tmp / f"cache-{name}-{k}"
            results[name].append(warp_epochs(mode, cache, rr, a.batch, server))
            shutil.rmtree(cache, ignore_errors=True)
        if peer_env is not None:
            results["peer"].append(peer_run())

    def med(name: str, key: str) -> float:
        return statistics.median(r[key] for r in results[name])

    load = os.getloadavg()
    print(f"\n{a.images} images, {n_shards} tar shard(s), {media_bytes / 1e6:.1f} MB, batch {a.batch}, "
          f"runs={a.runs} (median, alternating), moto S3 on 127.0.0.1, load avg {load[0]:.2f} {load[1]:.2f}\n")
    print(f"{'reader':<18} {'cold refs/s':>12} {'epoch-2 refs/s':>15}   blob requests cold (HEAD/GET)")
    peer_cold = med("peer", "cold") if results["peer"] else None
    peer_e2 = med("peer", "epoch2") if results["peer"] else None
    for name, _, _ in variants:
        c, e2 = med(name, "cold"), med(name, "epoch2")
        req = results[name][-1]["cold_req"]
        ratio = f"  ({c / peer_cold:.2f}x / {e2 / peer_e2:.2f}x peer)" if peer_cold else ""
        print(f"warp {name:<13} {c:>12.0f} {e2:>15.0f}   {req['HEAD']}/{req['GET']}{ratio}")
    if peer_cold:
        print(f"{'peer 3.0.27 hybrid':<18} {peer_cold:>12.0f} {peer_e2:>15.0f}")
    else:
        print("peer: not run (no interpreter at --peer-python)")


if __name__ == "__main__":
    main()
