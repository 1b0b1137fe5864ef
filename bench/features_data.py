"""Shared corpus for the feature-cache benchmarks (bench/features_*.py).

``jpeg_dir(n)`` writes ``n`` captioned photo-like JPEGs under
``bench/data/features/src-<n>`` (64 distinct real-or-synthetic photos cycled
under distinct names, so decode cost is realistic without generating ``n``
photos); ``pixel_cache(n, shard_size)`` builds a 256×256 pixel cache from it
with warp's own ETL. Both are reused between runs when present.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

HERE = Path(__file__).resolve().parent
DATA = HERE / "data" / "features"
OUT = HERE / "out"


def jpeg_dir(n: int, *, width: int = 384, height: int = 288) -> Path:
    import numpy as np
    from warpdata.sampledata.captions import caption_for
    from warpdata.sampledata.photos import real_photo_corpus

    root = DATA / f"src-{n}"
    done = root / ".complete"
    if done.exists():
        return root
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    photos = [d for d, _, _ in real_photo_corpus(64, seed=1, min_side=min(width, height),
                                                  max_side=max(width, height))]
    rng = np.random.default_rng(0)
    for i in range(n):
        sub = root / f"part{i // 1000:03d}"
        sub.mkdir(exist_ok=True)
        (sub / f"{i:06d}.jpg").write_bytes(photos[i % len(photos)])
        (sub / f"{i:06d}.txt").write_text(caption_for(rng), encoding="utf-8")
    done.write_text("ok")
    return root


def pixel_cache(n: int, shard_size: int, size: int = 256) -> Path:
    from warpdata.features.writer import CacheSpec, build_cache

    src = jpeg_dir(n)
    out = DATA / f"pixels-{n}-{shard_size}-{size}"
    build_cache(CacheSpec(source=str(src), output=str(out), size=(size, size), shard_size=shard_size),
                workers=os.cpu_count())
    return out
