"""Shared pieces of the tensor-warehouse benchmarks (bench/warehouse_*.py).

* :func:`corpus` writes a cached, deterministic photo-like corpus (real photos
  from scikit-image/scikit-learn when installed: random crops, rescales,
  jitter; docs/design.md §7) with COCO labels, under ``bench/out/``.
* :func:`peer_transform` is the transform every peer runs: warp's own
  decode + letterbox code (simplejpeg + OpenCV), so all systems do the same
  work and differ only in how they parallelise and write.
* :func:`corpus_1080p` writes the same kind of corpus at 1920x1080 (the 640 px case).
* :func:`pixel_difference` compares the scaled decode with the full decode, image by image.
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


def corpus_1080p(n: int, seed: int = 0) -> Path:
    """``n`` 1920x1080 JPEGs cut from the same real photos (crops rescaled, jittered, noised, quality
    85-95) + annotations.json; reused when present."""
    from PIL import Image
    from warpdata.sampledata.photos import _real_sources, encode_jpeg

    d = OUT / f"warehouse-corpus-1080p-{n}-{seed}"
    if (d / "annotations.json").is_file():
        return d
    img_dir = d / "images"
    img_dir.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    sources = _real_sources()
    if not sources:
        raise SystemExit("the 1080p corpus needs scikit-image or scikit-learn's sample photos")
    w, h = 1920, 1080
    images, anns = [], []
    for i in range(n):
        src = sources[int(rng.integers(len(sources)))]
        sh, sw = src.shape[:2]
        cw = int(rng.integers(sw // 3, sw + 1))
        ch = max(1, min(sh, int(cw * h / w)))
        x0, y0 = int(rng.integers(0, sw - cw + 1)), int(rng.integers(0, sh - ch + 1))
        arr = np.asarray(Image.fromarray(src[y0:y0 + ch, x0:x0 + cw]).resize((w, h), Image.BILINEAR)).astype(np.int16)
        arr += rng.integers(-12, 13, size=3, dtype=np.int16)
        arr += rng.normal(0, 2.0, size=arr.shape).astype(np.int16)
        name = f"{i:06d}.jpg"
        (img_dir / name).write_bytes(encode_jpeg(np.clip(arr, 0, 255).astype(np.uint8), int(rng.integers(85, 96))))
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


def pixel_difference(corpus_dir: Path, size: int, limit: int | None = None) -> dict:
    """Scaled decode + letterbox against full decode + letterbox (warp's own Transformer, linear),
    over the content pixels of every image: max |d|, mean |d|, PSNR, and the same against a full
    decode resized with OpenCV's INTER_AREA (an antialiased reference)."""
    import cv2
    from warpdata.warehouse.images import probe
    from warpdata.warehouse.transform import Transformer, TransformSpec, dct_scale

    cv2.setNumThreads(1)
    spec = {m: TransformSpec(size, size, decode=m) for m in ("full", "scaled")}
    tr = {m: Transformer(s) for m, s in spec.items()}
    area = Transformer(TransformSpec(size, size, interpolation="area", decode="full"))
    out = {m: np.empty((3, size, size), np.uint8) for m in ("full", "scaled", "area")}
    rows: dict[str, list[tuple[float, float, float]]] = {"full": [], "area": []}
    hist = np.zeros(256, np.int64)
    scales: dict[int, int] = {}
    paths = [p for p, _, _ in items(corpus_dir)][:limit]
    for path in paths:
        with open(path, "rb") as f:
            data = f.read()
        pr = probe(data)
        scales[dct_scale(spec["scaled"], pr)] = scales.get(dct_scale(spec["scaled"], pr), 0) + 1
        tr["full"](data, pr, out["full"])
        g = tr["scaled"](data, pr, out["scaled"])
        area(data, pr, out["area"])
        sl = (slice(None), slice(g.py, g.py + g.nh), slice(g.px, g.px + g.nw))
        s = out["scaled"][sl].astype(np.int16)
        for ref in ("full", "area"):
            diff = np.abs(s - out[ref][sl])
            mse = float(np.mean(diff.astype(np.float64) ** 2))
            rows[ref].append((float(diff.max()), float(diff.mean()), 10 * np.log10(255 ** 2 / mse) if mse else 99.0))
            if ref == "full":
                hist += np.bincount(diff.ravel(), minlength=256)
    # the same two references against each other: what "full decode" itself differs by
    base = []
    for path in paths[:200]:
        with open(path, "rb") as f:
            data = f.read()
        pr = probe(data)
        g = tr["full"](data, pr, out["full"])
        area(data, pr, out["area"])
        sl = (slice(None), slice(g.py, g.py + g.nh), slice(g.px, g.px + g.nw))
        diff = np.abs(out["full"][sl].astype(np.int16) - out["area"][sl])
        mse = float(np.mean(diff.astype(np.float64) ** 2))
        base.append(10 * np.log10(255 ** 2 / mse) if mse else 99.0)

    def summary(r: list[tuple[float, float, float]]) -> dict:
        a = np.array(r)
        return {"max_abs": float(a[:, 0].max()), "max_abs_median": float(np.median(a[:, 0])),
                "mean_abs": float(a[:, 1].mean()), "mean_abs_worst": float(a[:, 1].max()),
                "psnr_min": float(a[:, 2].min()), "psnr_median": float(np.median(a[:, 2]))}

    cum = np.cumsum(hist) / hist.sum()
    return {"images": len(paths), "size": size, "scales": {f"1/{d}": n for d, n in sorted(scales.items())},
            "vs_full": summary(rows["full"]), "vs_full_area": summary(rows["area"]),
            "full_vs_area_psnr_median": float(np.median(base)),
            "abs_p99": int(np.searchsorted(cum, 0.99)), "abs_p999": int(np.searchsorted(cum, 0.999)),
            "share_over_8": float(1 - cum[8])}


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
                 durable: bool = True, decode: str = "scaled") -> Path:
    cfg = out_root.parent / f"{out_root.name}.toml"
    cfg.parent.mkdir(parents=True, exist_ok=True)
    cfg.write_text(f'[source]\nformat = "coco"\npath = "{corpus_dir}"\n[transform]\ntarget_size = {size}\n'
                   f'dtype = "u8"\nmax_boxes = 16\ndecode = "{decode}"\n[output]\nroot = "{out_root}"\nshard_size_mb = 192\n'
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
