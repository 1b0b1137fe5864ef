"""The feature cache and the tiled Zarr ETL on the ETL kit: executors side by side, one run.

* **features** — ``N`` captioned photo-like JPEGs (384×288 → 256×256) with the
  built-in pool8-hash encoder on the CPU, ``[cache] shard_size`` 64, on
  ``local`` 1 and 2 workers, ``process`` 2 and ``dask`` 2 (its own LocalCluster,
  start-up included). The limit measured in the same run: decoding the same
  JPEGs into 256×256 with 2 threads and nothing else (``load_image``).
* **tiles** — a ``Z×512×512`` u16 photo-like volume (zstd level 1, chunks
  16×128×128, two pyramid levels) on ``local`` 1 and 2 compression threads,
  ``process`` 2 and ``dask`` 2. The limit: reading the input file once.

Every build is a fresh ``warp etl --clear --json`` subprocess; configurations
alternate round by round and medians of ``--runs`` rounds are printed with the
load average (the machine may be shared). Each run also checks that the output
is byte-identical to the first configuration's.

    python bench/etl_kit.py [--images 512] [--slices 96] [--runs 3]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from features_data import DATA, OUT, jpeg_dir  # noqa: E402

FEATURES = """
[source]
format = "captions"
path = "{src}"

[transform]
resolution = 256

[encoder]
name = "pool8-hash"
caching_batch_size = 64
caching_device = "cpu"

[cache]
shard_size = 64

[output]
path = "{out}"
"""

TILES = """
[source]
format = "raw"
path = "{src}"
shape = [{z}, 512, 512]
dtype = "u16"

[tiles]
chunks = [16, 128, 128]
backend = "cpu"

[multiscale]
levels = 2

[output]
path = "{out}"

[build]
task_mb = 16
"""

CONFIGS = [("local", 1), ("local", 2), ("process", 2), ("dask", 2)]


def digest(root: Path) -> str:
    h = hashlib.sha256()
    for p in sorted(root.rglob("*")):
        if p.is_file() and p.name != "metrics.json":
            h.update(p.relative_to(root).as_posix().encode() + b"\0" + p.read_bytes())
    return h.hexdigest()


def run(cfg: Path, out: Path, executor: str, workers: int) -> tuple[float, str]:
    shutil.rmtree(out, ignore_errors=True)
    t = time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "warpdata", "etl", "--config", str(cfg), "--json", "--clear",
                        "--executor", executor, "-j", str(workers)], capture_output=True, text=True, timeout=1800)
    wall = time.perf_counter() - t
    if r.returncode:
        raise SystemExit(f"{executor}-{workers} failed: {r.stderr[-2000:]}")
    return wall, digest(out)


def decode_limit(src: Path, n: int) -> float:
    from concurrent.futures import ThreadPoolExecutor

    import numpy as np
    from warpdata.features.transform import load_image

    files = sorted(str(p) for p in src.rglob("*.jpg"))
    buf = [np.empty((3, 256, 256), np.uint8) for _ in range(2)]
    t = time.perf_counter()
    with ThreadPoolExecutor(2) as ex:
        list(ex.map(lambda a: load_image(a[1], (256, 256), buf[a[0] % 2]), enumerate(files)))
    return n / (time.perf_counter() - t)


def read_limit(path: Path) -> float:
    t = time.perf_counter()
    with open(path, "rb", buffering=0) as f:
        buf = bytearray(16 << 20)
        while f.readinto(buf):
            pass
    return path.stat().st_size / (time.perf_counter() - t) / 1e6


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--images", type=int, default=512)
    ap.add_argument("--slices", type=int, default=96)
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    load0 = os.getloadavg()[0]
    src = jpeg_dir(args.images)
    work = DATA / "etl-kit"
    work.mkdir(parents=True, exist_ok=True)
    fcfg = work / "features.toml"
    fcfg.write_text(FEATURES.format(src=src, out=work / "fc"))
    vol = work / f"vol-{args.slices}.raw"
    if not vol.exists():
        from warpdata.sampledata.volume import photo_like_volume

        vol.write_bytes(photo_like_volume((args.slices, 512, 512), "uint16", seed=3).tobytes())
    tcfg = work / "tiles.toml"
    tcfg.write_text(TILES.format(src=vol, z=args.slices, out=work / "t.zarr"))
    walls: dict[tuple[str, str, int], list[float]] = {}
    limits: dict[str, list[float]] = {"decode": [], "read": []}
    digests: dict[str, set[str]] = {"features": set(), "tiles": set()}
    for _ in range(args.runs):
        limits["decode"].append(decode_limit(src, args.images))
        limits["read"].append(read_limit(vol))
        for ex, n in CONFIGS:
            for what, cfg, out in (("features", fcfg, work / "fc"), ("tiles", tcfg, work / "t.zarr")):
                wall, d = run(cfg, out, ex, n)
                walls.setdefault((what, ex, n), []).append(wall)
                digests[what].add(d)
    dec, rd = statistics.median(limits["decode"]), statistics.median(limits["read"])
    mb = vol.stat().st_size / 1e6
    print(f"\nload average at start {load0:.2f}, at end {os.getloadavg()[0]:.2f}; {os.cpu_count()} CPUs; "
          f"medians of {args.runs} alternating rounds; wall of the whole command (start-up included)")
    print(f"features: {args.images} JPEGs -> 256x256 + pool8-hash; limit (decode only, 2 threads) {dec:.0f} img/s")
    rows = []
    for ex, n in CONFIGS:
        w = statistics.median(walls[("features", ex, n)])
        rows.append(("features", ex, n, args.images / w, args.images / w / dec))
        print(f"  {ex:8} {n}  {w:7.2f} s  {args.images / w:7.1f} img/s  {args.images / w / dec:5.2f} of the limit")
    print(f"tiles: {mb:.0f} MB u16, 2 levels; limit (read the input once) {rd:.0f} MB/s")
    for ex, n in CONFIGS:
        w = statistics.median(walls[("tiles", ex, n)])
        rows.append(("tiles", ex, n, mb / w, mb / w / rd))
        print(f"  {ex:8} {n}  {w:7.2f} s  {mb / w:7.1f} MB/s  {mb / w / rd:5.2f} of the limit")
    same = all(len(v) == 1 for v in digests.values())
    print(f"byte-identical outputs across executors and rounds: {same}")
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "etl_kit.json").write_text(json.dumps({"rows": rows, "identical": same, "load_start": load0}, indent=1))
    from _figures import emit, figure

    emit("etl_kit", [figure(f"{what} on {ex} x{n}", round(rate, 2), "img/s" if what == "features" else "MB/s",
                            note=f"{frac:.2f} of the limit; identical bytes: {same}")
                     for what, ex, n, rate, frac in rows])
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
