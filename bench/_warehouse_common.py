"""Shared pieces of the tensor-warehouse benchmarks (bench/warehouse_*.py).

* :func:`corpus` writes a cached, deterministic photo-like corpus (real photos
  from scikit-image/scikit-learn when installed: random crops, rescales,
  jitter; docs/design.md §7) with COCO labels, under ``bench/out/``.
* :func:`peer_transform` is the transform every peer runs: warp's own
  decode + letterbox code (simplejpeg + OpenCV), so all systems do the same
  work and differ only in how they parallelise and write.
* :func:`peer_env` runs a peer in a subprocess with the stand-in modules
  mosaicml-streaming needs to import (bench/_peer_stubs/README.md).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "bench" / "out"
STUBS = ROOT / "bench" / "_peer_stubs"


def corpus(n: int, seed: int = 0, min_side: int = 600, max_side: int = 900) -> Path:
    """``n`` JPEGs (~0.56 MP on average) + annotations.json; reused when present."""
    from warpdata.sampledata.photos import real_photo_corpus

    d = OUT / f"warehouse-corpus-{n}-{seed}-{min_side}-{max_side}"
    if (d / "annotations.json").is_file():
        return d
    img_dir = d / "images"
    img_dir.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed + 1)
    images, anns = [], []
    for i, (data, w, h) in enumerate(real_photo_corpus(n, seed=seed, min_side=min_side, max_side=max_side)):
        name = f"{i:06d}.jpg"
        (img_dir / name).write_bytes(data)
        images.append({"id": i + 1, "file_name": name, "width": w, "height": h})
        for _ in range(int(rng.integers(1, 6))):
            bw, bh = int(rng.integers(16, w // 2)), int(rng.integers(16, h // 2))
            x, y = int(rng.integers(0, w - bw)), int(rng.integers(0, h - bh))
            anns.append({"id": len(anns) + 1, "image_id": i + 1, "category_id": int(rng.integers(1, 4)),
                         "bbox": [x, y, bw, bh]})
    doc = {"images": images, "annotations": anns,
           "categories": [{"id": 1, "name": "a"}, {"id": 2, "name": "b"}, {"id": 3, "name": "c"}]}
    (d / "annotations.json").write_text(json.dumps(doc))
    return d


def items(corpus_dir: Path) -> list[tuple[str, list[list[float]], list[int]]]:
    """(image path, xyxy boxes, classes) per image, label order."""
    doc = json.loads((corpus_dir / "annotations.json").read_text())
    boxes: dict[int, list] = {}
    for a in doc["annotations"]:
        x, y, w, h = a["bbox"]
        boxes.setdefault(a["image_id"], []).append(([x, y, x + w, y + h], a["category_id"]))
    return [(str(corpus_dir / "images" / im["file_name"]), [b for b, _ in boxes.get(im["id"], [])],
             [c for _, c in boxes.get(im["id"], [])]) for im in doc["images"]]


def write_config(corpus_dir: Path, out_root: Path, size: int, workers: int, executor: str = "thread",
                 durable: bool = True) -> Path:
    cfg = out_root.parent / f"{out_root.name}.toml"
    cfg.parent.mkdir(parents=True, exist_ok=True)
    cfg.write_text(f'[source]\nformat = "coco"\npath = "{corpus_dir}"\n[transform]\ntarget_size = {size}\n'
                   f'dtype = "u8"\nmax_boxes = 16\n[output]\nroot = "{out_root}"\nshard_size_mb = 192\n'
                   f'[build]\nworkers = {workers}\nexecutor = "{executor}"\ndurable = {str(durable).lower()}\n')
    return cfg


_TR: dict = {}


def peer_transform(item, size: int = 640) -> dict:
    """Decode + letterbox one image with warp's transform code; a fresh array per sample."""
    from warpdata.warehouse.images import probe
    from warpdata.warehouse.transform import Transformer, TransformSpec, transform_boxes

    path, boxes, classes = item
    tr = _TR.get((os.getpid(), size))
    if tr is None:
        import cv2

        cv2.setNumThreads(1)
        tr = _TR[(os.getpid(), size)] = Transformer(TransformSpec(size, size))
    with open(path, "rb") as f:
        data = f.read()
    img = np.empty((3, size, size), np.uint8)
    g = tr(data, probe(data), img)
    b = transform_boxes(np.asarray(boxes, np.float64).reshape(-1, 4), g, tr.spec)
    return {"key": os.path.basename(path), "image": img, "boxes": b, "classes": np.asarray(classes, np.int32)}


def peer_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "bench"), str(STUBS), env.get("PYTHONPATH", "")])
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


def run_child(script: Path, args: list[str], timeout: int = 300) -> dict:
    r = subprocess.run([sys.executable, str(script), *args], env=peer_env(), capture_output=True, text=True,
                       timeout=timeout)
    if r.returncode != 0:
        return {"error": (r.stderr.strip().splitlines() or ["failed"])[-1][:200]}
    return json.loads(r.stdout.strip().splitlines()[-1])


def peer_available(module: str) -> str | None:
    """The version string if ``module`` imports in a peer subprocess, else None."""
    code = f"import {module} as m; print(getattr(m, '__version__', 'unknown'))"
    r = subprocess.run([sys.executable, "-c", code], env=peer_env(), capture_output=True, text=True, timeout=120)
    return r.stdout.strip() if r.returncode == 0 else None


def median(xs: list[float]) -> float:
    import statistics

    return statistics.median(xs)
