"""Feature-cache build: is the encoder kept busy? Encoder time vs I/O+decode wait per batch.

Builds a cache from 1,024 captioned photo-like JPEGs (384×288 → 256×256)
with the built-in pool8-hash encoder on the CPU (caching_batch_size 64), with
1 and 2 decode threads, and a pixel-only cache for reference. The build
decodes up to two batches ahead of the encoder on a thread pool; per batch
it records how long the main thread waited for decoded pixels (I/O +
decode), the encoder call and the shard write (metrics.json). Medians of 3
builds; prints a table.

    .venv/bin/python bench/features_build.py
"""

from __future__ import annotations

import json
import shutil
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from features_data import DATA, OUT, jpeg_dir

N = 1024
RUNS = 3


def build(encoder: str, workers: int, batch: int = 64) -> dict:
    from warpdata.features.writer import CacheSpec, build_cache

    out = DATA / f"build-{encoder or 'pixels'}-{workers}"
    shutil.rmtree(out, ignore_errors=True)
    res = build_cache(CacheSpec(source=str(jpeg_dir(N)), output=str(out), size=(256, 256), encoder=encoder,
                                caching_batch_size=batch, caching_device="cpu"), workers=workers)
    m = res.metrics
    shutil.rmtree(out, ignore_errors=True)
    b = m["batches"]
    return {"rate": m["records_per_s"], "wall": m["wall_s"],
            "wait_ms": 1000 * statistics.mean(x["io_decode_wait_s"] for x in b),
            "enc_ms": 1000 * statistics.mean(x["encode_s"] for x in b),
            "write_ms": 1000 * statistics.mean(x["write_s"] for x in b)}


def main() -> int:
    jpeg_dir(N)
    build("pool8-hash", 2)  # warm-up: page cache, torch import
    rows = []
    for encoder, workers in (("pool8-hash", 1), ("pool8-hash", 2), ("", 2)):
        runs = [build(encoder, workers) for _ in range(RUNS)]
        med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
        busy = med["enc_ms"] / (med["wait_ms"] + med["enc_ms"] + med["write_ms"]) if encoder else 0.0
        rows.append({"encoder": encoder or "none (pixels)", "threads": workers, **med, "encoder_busy": busy})
    print(f"\nfeature-cache build: {N} JPEGs 384x288 -> 256x256, batches of 64, medians of {RUNS}")
    print(f"{'encoder':15} {'threads':>7} {'rec/s':>7} {'wait ms/batch':>14} {'encode ms/batch':>16} "
          f"{'write ms/batch':>15} {'encoder busy':>13}")
    for r in rows:
        print(f"{r['encoder']:15} {r['threads']:7d} {r['rate']:7.0f} {r['wait_ms']:14.1f} {r['enc_ms']:16.1f} "
              f"{r['write_ms']:15.1f} {100 * r['encoder_busy']:12.0f}%")
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "features_build.json").write_text(json.dumps(rows, indent=1))
    from _figures import emit, figure  # for bench/summary.py (the build has no targets)

    emit("features_build", [figure(f"build, encoder {r['encoder']}, {r['threads']} decode thread(s)", r["rate"],
                                   "rec/s", note=f"encoder busy {100 * r['encoder_busy']:.0f} %") for r in rows])
    return 0


if __name__ == "__main__":
    sys.exit(main())
