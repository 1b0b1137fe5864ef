"""`warp why` latency on a 1 M-sample tensor warehouse and feature cache (synthetic manifests).

    .venv/bin/python bench/why_latency.py [--samples 1000000] [--runs 20]

Builds a tiny real warehouse with `warp etl` (the synthetic COCO set) and a tiny real feature
cache, then grows each to ``--samples`` samples the way the writers would have written them:
the manifest's shard list (256 samples a shard), resealed, and the per-sample side tables
(``samples.parquet`` + ``sources.parquet``; ``records.parquet``) written with the writers' row
groups. Shard files are not written: `warp why` never opens a warehouse shard (a feature-cache
record's offset needs its shard's 64-byte header: the bench writes those headers only).
Times `warpdata.lineage.why.why` in-process (median and max of ``--runs`` lookups at random
indexes and keys, after a first call that recomputes the manifest's seal, hashes the side
tables it reads against the manifest's ``side_tables`` and stamps both: row "first"), and the CLI once in a subprocess for the start-up included. Timings on a
shared machine drift with load: the script prints ``uptime``'s load average.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PER_SHARD = 256


def _warehouse(tmp: Path, n: int) -> Path:
    import pyarrow as pa
    from warpdata.cli.app import main
    from warpdata.core import sidetables
    from warpdata.core.canonical import seal
    from warpdata.sampledata.detection import generate
    from warpdata.warehouse.etl import LOOKUP_ROW_GROUP, _write_parquet

    d = tmp / "coco"
    generate(d, count=4, seed=1, min_side=64, max_side=96)
    (d / "t.toml").write_text('[source]\nformat = "coco"\npath = "."\nlabels = "annotations.json"\n'
                              '[transform]\ntarget_size = 32\n[validation]\n'
                              'max_invalid_fraction = { warn = 1.0, fail = 1.0 }\n'
                              'max_missing_fraction = { warn = 1.0, fail = 1.0 }\n'
                              '[output]\nroot = "../wh"\n')
    assert main(["-q", "etl", "--config", str(d / "t.toml")]) == 0
    v = next((tmp / "wh").glob("v*"))
    doc = json.loads((v / "manifest.json").read_text())
    tmpl = doc["shards"][0]
    shards = []
    for s in range(0, n, PER_SHARD):
        k = s // PER_SHARD
        shards.append({**tmpl, "id": f"shard-{k:05d}", "relative_path": f"shard-{k:05d}.twh1",
                       "first_sample": s, "samples": min(PER_SHARD, n - s), "checksum_sha256": f"{k:064x}"})
    doc.update(shards=shards, num_samples=n)
    keys = [f"images/img_{i:08d}.jpg" for i in range(n)]
    _write_parquet(v / "samples.parquet", pa.table({
        "sample": pa.array(range(n), pa.int64()), "key": keys,
        "shard_id": [f"shard-{i // PER_SHARD:05d}" for i in range(n)],
        "shard_index": pa.array([i % PER_SHARD for i in range(n)], pa.int32()),
        "n_boxes": pa.array([1] * n, pa.int32()), "class_ids": pa.array([[1]] * n, pa.list_(pa.int32())),
        "frame_id": pa.array([-1] * n, pa.int64()), "run_id": [""] * n, "source_path": keys,
        "label_source": ["annotations.json"] * n}), LOOKUP_ROW_GROUP)
    _write_parquet(v / "sources.parquet", {"key": keys, "sha256": [f"{i:064x}" for i in range(n)],
                                           "size": list(range(n))}, LOOKUP_ROW_GROUP)
    doc["side_tables"] = sidetables.record(v, doc["side_tables"])  # the grown tables, as the writer records them
    (v / "manifest.json").write_text(json.dumps(seal(doc), sort_keys=True, separators=(",", ":")))
    return v


def _feature_cache(tmp: Path, n: int) -> Path:
    import importlib.util

    import pyarrow as pa
    import pyarrow.parquet as pq
    from warpdata.core import sidetables
    from warpdata.core.canonical import seal

    spec = importlib.util.spec_from_file_location("g", ROOT / "tests/golden/features/make_golden.py")
    golden = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(golden)
    golden.make_sources(tmp / "fc-src")
    c = Path(golden.build("pixels-one", tmp / "fc-src", workers=1, executor="local"))
    doc = json.loads((c / "manifest.json").read_text())
    head = (c / doc["shards"][0]["path"]).read_bytes()[:64]
    for p in c.glob("shard-*.wfs"):
        p.unlink()
    shards = []
    for s in range(0, n, PER_SHARD):
        name = f"shard-{s // PER_SHARD:05d}.wfs"
        (c / name).write_bytes(head)
        shards.append({"path": name, "records": min(PER_SHARD, n - s), "bytes": 1, "sha256": f"{s:064x}"})
    doc.update(shards=shards, records=n, shard_size=PER_SHARD)
    doc.pop("sources", None)
    keys = [f"d0/img_{i:08d}.jpg" for i in range(n)]
    pq.write_table(pa.table({
        "record": pa.array(range(n), pa.int64()), "key": keys, "caption": ["a photo"] * n,
        "is_video": [False] * n, "height": pa.array([32] * n, pa.int32()), "width": pa.array([32] * n, pa.int32()),
        "shard": [f"shard-{i // PER_SHARD:05d}.wfs" for i in range(n)],
        "shard_index": pa.array([i % PER_SHARD for i in range(n)], pa.int32())}),
        c / "records.parquet", compression="zstd", row_group_size=16384)
    doc["side_tables"] = sidetables.record(c, doc["side_tables"])
    (c / "manifest.json").write_text(json.dumps(seal(doc), sort_keys=True, separators=(",", ":")))
    return c


def _time(target: Path, samples: list[str]) -> list[float]:
    from warpdata.lineage.why import WhyRequest, why

    out = []
    for s in samples:
        t = time.perf_counter()
        why(WhyRequest(str(target), s))
        out.append((time.perf_counter() - t) * 1000)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", type=int, default=1_000_000)
    ap.add_argument("--runs", type=int, default=20)
    a = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="warp-why-bench-"))
    os.environ.setdefault("WARP_CACHE_DIR", str(tmp / "cache"))
    try:
        rng = random.Random(0)
        wh = _warehouse(tmp, a.samples)
        fc = _feature_cache(tmp, a.samples)
        idx = [str(rng.randrange(a.samples)) for _ in range(a.runs)]
        rows = []
        for name, target, key in (("warehouse", wh, "images/img_{:08d}.jpg"), ("feature cache", fc, "d0/img_{:08d}.jpg")):
            _time(target, idx[:1])  # the imports and the page cache
            shutil.rmtree(Path(os.environ["WARP_CACHE_DIR"]) / "lineage-seals", ignore_errors=True)
            rows.append((name, "first", *[_time(target, idx[1:2])[0]] * 2))  # the seal recomputed and stamped
            for how, samples in (("index", idx), ("key", [key.format(int(i)) for i in idx])):
                ms = _time(target, samples)
                rows.append((name, how, statistics.median(ms), max(ms)))
        t = time.perf_counter()
        subprocess.run([sys.executable, "-m", "warpdata", "why", str(wh), idx[0], "--json"], check=True,
                       capture_output=True)
        cli_ms = (time.perf_counter() - t) * 1000
        print(f"warp why, {a.samples:,} samples, {a.runs} lookups each (load average {os.getloadavg()[0]:.2f})")
        print(f"{'artifact':<14} {'by':<6} {'median ms':>10} {'max ms':>8}")
        for name, how, med, mx in rows:
            print(f"{name:<14} {how:<6} {med:>10.1f} {mx:>8.1f}")
        print(f"CLI (python -m warpdata why, one warehouse lookup incl. start-up): {cli_ms:.0f} ms")
        return 0
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
