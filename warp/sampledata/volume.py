"""Deterministic photo-like volumes (microscope-like u16 stacks) for tests and benchmarks.

:func:`photo_like_volume` builds smooth structure (soft blobs, gradients and
a cell-like texture: a sum of separable terms, evaluated as one matrix
product per slab so a 1 GiB volume takes seconds) plus sensor noise of a few
bits. zstd level 1 compresses it about 2× — like real microscopy, unlike
zeros (ratio ~1000×) or pure noise (~1×), which would make speed figures
meaningless. :func:`generate` writes ``volume.raw``, ``volume.npy`` and a
ready ``volume.toml`` for ``warp etl``. Same seed and size → same bytes.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from warpdata.core.atomic import atomic_file, atomic_write_bytes, atomic_write_text
from warpdata.formats.tiling import normalize_dtype

_SLAB_ELEMENTS = 1 << 24  # rows generated per step: bounded float32 temporaries


def _profiles(rng: np.random.Generator, n: int, k: int, wave: bool) -> np.ndarray:
    """k smooth 1-D profiles of length n: narrow-to-broad gaussian bumps (and waves)."""
    x = np.linspace(0.0, 1.0, max(n, 1), dtype=np.float64)[:n]
    out = np.empty((k, n), dtype=np.float64)
    for i in range(k):
        c, w = rng.uniform(0, 1), rng.uniform(0.03, 0.15)
        out[i] = np.exp(-((x - c) ** 2) / (2 * w * w))
        if wave and i % 4 == 3:  # cell-like texture inside some blobs
            out[i] *= 0.75 + 0.25 * np.sin(2 * np.pi * rng.uniform(10, 40) * x + rng.uniform(0, 6.3))
    return out


#: (background, peak, noise bits) per dtype: about 2x at zstd level 1 for u16
_LEVELS = {"uint8": (10.0, 200.0, 2), "uint16": (100.0, 3000.0, 4), "uint32": (1000.0, 48000.0, 6),
           "float32": (0.03, 0.9, 0), "float64": (0.03, 0.9, 0)}


def photo_like_volume(shape: Sequence[int], dtype="uint16", seed: int = 0) -> np.ndarray:
    """A C-contiguous array of ``shape`` with photo-like statistics."""
    dt = normalize_dtype(dtype)
    shape = tuple(int(s) for s in shape)
    rng = np.random.default_rng(seed)
    k = 12
    rows = shape[0] if shape else 1
    inner = int(np.prod(shape[1:])) if len(shape) > 1 else 1
    # a sum of k separable blobs: (rows, k) profiles of dimension 0 @ (k, inner) products of the others
    p0 = _profiles(rng, rows, k, False).T * rng.uniform(0.2, 1.0, size=k)
    rest = np.ones((k, 1), dtype=np.float64)
    for n in shape[1:]:
        rest = (rest[:, :, None] * _profiles(rng, n, k, True)[:, None, :]).reshape(k, -1)
    bg, peak, noise_bits = _LEVELS[dt.name]
    scale = peak / max(float(p0.sum(axis=1).max() * rest.max()), 1e-12)
    p0 = (p0 * scale).astype(np.float32)
    rest = rest.astype(np.float32)
    out = np.empty((rows, inner), dtype=dt)
    step = max(1, _SLAB_ELEMENTS // max(inner, 1))
    for r0 in range(0, rows, step):
        r1 = min(rows, r0 + step)
        smooth = p0[r0:r1] @ rest
        smooth += np.float32(bg)
        if dt.kind == "f":
            smooth += rng.normal(0.0, 0.01, size=smooth.shape).astype(np.float32)
            out[r0:r1] = smooth
        else:
            noise = rng.integers(0, 2 ** noise_bits, size=smooth.shape, dtype=np.uint16)
            np.add(smooth.astype(dt), noise.astype(dt, copy=False), out=out[r0:r1])
    return out.reshape(shape)


VOLUME_TOML = """\
# Tiled tensor compression: a u16 volume to a sharded Zarr v3 pyramid.
#   warp etl --config {toml}
#   cat {raw} | warp etl --config {toml} --input -
[source]
format = "raw"            # raw little-endian bytes; "npy" reads the shape and dtype from the file
path = "{raw}"
shape = {shape}
dtype = "uint16"

[output]
path = "volume.zarr"      # a local directory or s3://bucket/prefix

[tiles]
chunks = {chunks}
shards = {shards}
level = 1                 # zstd level
backend = "auto"          # auto | cpu | gpu (WARP_BACKEND overrides)

[multiscale]
levels = 3                # 1 = full resolution only
method = "median"
"""


def generate(out: Path, count: int = 64, seed: int = 0) -> dict:
    """Write a ``count``×256×256 u16 volume as .raw and .npy plus volume.toml."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    shape = (int(count), 256, 256)
    vol = photo_like_volume(shape, "uint16", seed)

    atomic_write_bytes(out / "volume.raw", vol.tobytes())
    with atomic_file(out / "volume.npy") as f:
        np.save(f, vol, allow_pickle=False)
    chunks = [min(32, shape[0]), 64, 64]
    toml = VOLUME_TOML.format(toml="volume.toml", raw="volume.raw", shape=json.dumps(list(shape)),
                              chunks=json.dumps(chunks), shards=json.dumps([chunks[0], 256, 256]))
    atomic_write_text(out / "volume.toml", toml)
    return {"kind": "volume", "shape": list(shape), "dtype": "uint16", "bytes": vol.nbytes,
            "files": ["volume.raw", "volume.npy", "volume.toml"], "config": str(out / "volume.toml")}
