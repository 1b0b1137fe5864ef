"""Deterministic photo-like images for tests, demos and benchmarks.

``synthetic_photo`` draws smooth illumination, soft-edged blobs, a
high-frequency texture and sensor noise, so JPEG encodes it with realistic
entropy (drawn flat shapes decode several times faster than photos and make
speed claims dishonest; docs/design.md §7). ``real_photo_corpus`` uses the real
photographs that scikit-image / scikit-learn ship when either is installed
(random crops, rescales, jitter) and falls back to the synthetic generator.
"""

from __future__ import annotations

import io
from collections.abc import Iterator

import numpy as np

# lazy third-party imports: PIL (heavy) is imported inside the functions that use it, so importing
# this module does not load it


def synthetic_photo(rng: np.random.Generator, width: int, height: int) -> np.ndarray:
    """An HxWx3 uint8 image with photo-like statistics."""
    yy, xx = np.mgrid[0:height, 0:width].astype(np.float32)
    yy /= max(height - 1, 1)
    xx /= max(width - 1, 1)
    img = np.empty((height, width, 3), np.float32)
    base = rng.uniform(40, 200, size=3)
    grad = rng.uniform(-60, 60, size=(3, 2))
    for c in range(3):
        img[..., c] = base[c] + grad[c, 0] * xx + grad[c, 1] * yy
    for _ in range(int(rng.integers(3, 8))):
        cx, cy = rng.uniform(0, 1, size=2)
        r = rng.uniform(0.05, 0.35)
        col = rng.uniform(-90, 90, size=3)
        mask = np.exp(-(((xx - cx) ** 2 + (yy - cy) ** 2) / (2 * r * r)))
        img += mask[..., None] * col
    freq = rng.uniform(20, 80, size=2)
    tex = np.sin(xx * freq[0] + np.sin(yy * 7.0) * 2) * np.cos(yy * freq[1]) * rng.uniform(4, 14)
    img += tex[..., None]
    img += rng.normal(0, rng.uniform(2, 7), size=img.shape).astype(np.float32)
    return np.clip(img, 0, 255).astype(np.uint8)


def encode_jpeg(img: np.ndarray, quality: int = 90) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(img).save(buf, format="JPEG", quality=quality)
    return buf.getvalue()


def encode_png(img: np.ndarray) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(img).save(buf, format="PNG")
    return buf.getvalue()


def _real_sources() -> list[np.ndarray]:
    sources: list[np.ndarray] = []
    try:
        from skimage import data as skdata

        for name in ("astronaut", "coffee", "chelsea", "rocket", "motorcycle_left", "hubble_deep_field"):
            fn = getattr(skdata, name, None)
            if fn is None:
                continue
            try:
                a = fn()
                if isinstance(a, tuple):
                    a = a[0]
                if a.ndim == 3 and a.shape[2] >= 3:
                    sources.append(np.ascontiguousarray(a[..., :3]))
            except Exception:
                continue
    except ImportError:
        pass
    try:
        from sklearn.datasets import load_sample_images

        sources.extend(np.asarray(im) for im in load_sample_images().images)
    except ImportError:
        pass
    return sources


def real_photo_corpus(count: int, seed: int = 0, min_side: int = 300, max_side: int = 1000,
                      quality: tuple[int, int] = (85, 95)) -> Iterator[tuple[bytes, int, int]]:
    """Yield ``count`` JPEGs as (bytes, width, height): real photos when available."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    sources = _real_sources()
    for _ in range(count):
        w = int(rng.integers(min_side, max_side + 1))
        h = int(rng.integers(min_side, max_side + 1))
        if sources:
            src = sources[int(rng.integers(len(sources)))]
            sh, sw = src.shape[:2]
            cw, ch = int(rng.integers(sw // 3, sw + 1)), int(rng.integers(sh // 3, sh + 1))
            x0, y0 = int(rng.integers(0, sw - cw + 1)), int(rng.integers(0, sh - ch + 1))
            crop = Image.fromarray(src[y0:y0 + ch, x0:x0 + cw]).resize((w, h), Image.BILINEAR)
            arr = np.asarray(crop).astype(np.int16)
            arr += rng.integers(-12, 13, size=3, dtype=np.int16)
            arr += rng.normal(0, 2.0, size=arr.shape).astype(np.int16)
            img = np.clip(arr, 0, 255).astype(np.uint8)
        else:
            img = synthetic_photo(rng, w, h)
        yield encode_jpeg(img, int(rng.integers(quality[0], quality[1] + 1))), w, h
