"""Sample data is deterministic: same seed -> same bytes, different seed -> different data."""

from __future__ import annotations

import hashlib
import importlib
import io
from pathlib import Path

import numpy as np
import pytest
from warpdata.sampledata import GENERATORS
from warpdata.sampledata.photos import encode_jpeg, encode_png, real_photo_corpus, synthetic_photo


def test_synthetic_photo_same_seed_same_pixels_and_bytes():
    a = synthetic_photo(np.random.default_rng(7), 96, 64)
    b = synthetic_photo(np.random.default_rng(7), 96, 64)
    c = synthetic_photo(np.random.default_rng(8), 96, 64)
    assert a.shape == (64, 96, 3) and a.dtype == np.uint8
    assert np.array_equal(a, b) and not np.array_equal(a, c)
    assert encode_jpeg(a, 90) == encode_jpeg(b, 90)
    assert encode_png(a) == encode_png(b)


def test_synthetic_photo_is_photo_like():
    """Enough texture and noise that JPEG cannot squeeze it like a flat drawing (docs/design.md §7)."""
    from PIL import Image

    img = synthetic_photo(np.random.default_rng(1), 320, 240)
    flat = np.full_like(img, 128)
    assert len(encode_jpeg(img, 90)) > 4 * len(encode_jpeg(flat, 90))
    assert img.std() > 10
    decoded = np.asarray(Image.open(io.BytesIO(encode_jpeg(img, 95))))
    assert decoded.shape == img.shape
    assert np.abs(decoded.astype(int) - img.astype(int)).mean() < 8


def test_real_photo_corpus_is_deterministic():
    from PIL import Image

    first = list(real_photo_corpus(4, seed=3, min_side=64, max_side=160))
    again = list(real_photo_corpus(4, seed=3, min_side=64, max_side=160))
    other = list(real_photo_corpus(4, seed=4, min_side=64, max_side=160))
    assert first == again
    assert [j for j, _, _ in first] != [j for j, _, _ in other]
    for jpeg, w, h in first:
        im = Image.open(io.BytesIO(jpeg))
        assert im.format == "JPEG" and im.size == (w, h) and 64 <= w <= 160 and 64 <= h <= 160


def _tree(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("kind", sorted(GENERATORS))
def test_every_generator_is_byte_deterministic(tmp_path, kind):
    mod, _, fn = GENERATORS[kind].partition(":")
    gen = getattr(importlib.import_module(mod), fn)
    gen(tmp_path / "a", count=4, seed=11)
    gen(tmp_path / "b", count=4, seed=11)
    a, b = _tree(tmp_path / "a"), _tree(tmp_path / "b")
    assert a and a == b
