"""Captioned media for the feature cache: photo-like images with .txt captions.

``generate(out, count, seed)`` writes ``count`` good samples spread over two
groups (``media/group_000/``, ``media/group_001/``): photo-like JPEGs (one with an EXIF
rotation) and PNGs, each with a same-name caption, plus one short video with
a caption when OpenCV can encode one. Beside them it writes the broken cases
the build must quarantine: an image with no caption, one with an empty
caption, a garbage "JPEG", a truncated JPEG and an unsupported file. It also
writes ``captions.toml`` beside ``media/``, a config that builds a pool8-hash
cache (``cache/``) from it with thresholds loose enough for the planted failures. Same seed
and count → byte-identical files.
"""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
from warpdata.sampledata.photos import encode_jpeg, encode_png, real_photo_corpus, synthetic_photo

# lazy third-party imports: PIL (heavy) is imported inside the functions that use it, so importing
# this module does not load it

_ADJ = ("red", "misty", "golden", "quiet", "crowded", "snowy", "old", "bright", "tiny", "wooden")
_NOUN = ("harbor", "cat", "bicycle", "mountain", "street market", "lighthouse", "forest path", "teapot",
         "train station", "garden")
_WHERE = ("at dawn", "in the rain", "under a clear sky", "at night", "in autumn", "seen from above",
          "in soft light", "on a busy day")

CONFIG = """\
# Build a feature cache from this directory: warp etl --config captions.toml
[source]
format = "captions"
path = "media"
caption_prefix = ""

[transform]
resolution = 64            # sides rounded to a multiple of 16

[encoder]
name = "pool8-hash"        # built-in weight-free encoder; "" stores pixels
caching_batch_size = 16
caching_device = "auto"

[validation]
# the sample data plants broken files on purpose
max_invalid_fraction = {{ warn = 0.0, fail = 0.5 }}
max_missing_fraction = {{ warn = 0.0, fail = 0.5 }}

[output]
path = "{output}"
"""


def caption_for(rng: np.random.Generator) -> str:
    return (f"a {_ADJ[int(rng.integers(len(_ADJ)))]} {_NOUN[int(rng.integers(len(_NOUN)))]} "
            f"{_WHERE[int(rng.integers(len(_WHERE)))]}")


def _rotated_jpeg(img: np.ndarray) -> bytes:
    from PIL import Image

    im = Image.fromarray(img)
    exif = im.getexif()
    exif[0x0112] = 6  # stored sideways: viewers rotate 90° clockwise
    buf = io.BytesIO()
    im.save(buf, format="JPEG", quality=90, exif=exif.tobytes())
    return buf.getvalue()


def _video(path: Path, rng: np.random.Generator, frames: int = 12) -> bool:
    try:
        import cv2
    except ImportError:
        return False
    w = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"MJPG"), 8, (160, 96))
    if not w.isOpened():
        return False
    base = synthetic_photo(rng, 200, 96)
    for i in range(frames):
        w.write(np.ascontiguousarray(base[:, i * 3:i * 3 + 160, ::-1]))
    w.release()
    return path.is_file() and path.stat().st_size > 0


def generate(out: Path, count: int = 48, seed: int = 0) -> dict:
    out = Path(out)
    groups = [out / "media" / "group_000", out / "media" / "group_001"]
    for g in groups:
        g.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    jpegs = real_photo_corpus(count, seed=seed, min_side=80, max_side=320)
    good = 0
    for i in range(count):
        g = groups[i % 2]
        name = f"{i:05d}"
        if i % 7 == 3:
            img = synthetic_photo(rng, int(rng.integers(80, 240)), int(rng.integers(80, 240)))
            (g / f"{name}.png").write_bytes(encode_png(img))
            next(jpegs)
        elif i == 5:
            img = synthetic_photo(rng, 180, 120)
            (g / f"{name}.jpg").write_bytes(_rotated_jpeg(img))
            next(jpegs)
        else:
            data, _, _ = next(jpegs)
            (g / f"{name}.jpg").write_bytes(data)
        (g / f"{name}.txt").write_text(caption_for(rng) + "\n", encoding="utf-8")
        good += 1
    broken = groups[1]
    img = synthetic_photo(rng, 120, 90)

    jpeg = encode_jpeg(img)
    (broken / "no_caption.jpg").write_bytes(jpeg)
    (broken / "empty_caption.jpg").write_bytes(jpeg)
    (broken / "empty_caption.txt").write_text("   \n", encoding="utf-8")
    (broken / "corrupt.jpg").write_bytes(b"\xff\xd8\xff\xe0" + bytes(rng.integers(0, 256, 200, dtype=np.uint8)))
    (broken / "corrupt.txt").write_text("this file is not an image\n", encoding="utf-8")
    (broken / "truncated.jpg").write_bytes(jpeg[: len(jpeg) // 3])
    (broken / "truncated.txt").write_text("a photo cut short\n", encoding="utf-8")
    (broken / "notes.pdf").write_bytes(b"%PDF-1.4\n% not media\n")
    (broken / "notes.txt").write_text("a document, not an image\n", encoding="utf-8")
    video = _video(groups[0] / "clip.avi", rng)
    if video:
        (groups[0] / "clip.txt").write_text("a short clip of a sunlit wall\n", encoding="utf-8")
    (out / "captions.toml").write_text(CONFIG.format(output="cache"), encoding="utf-8")
    return {"kind": "captions", "path": str(out / "media"), "images": good, "video": video,
            "broken": ["no_caption.jpg (missing-caption)", "empty_caption.jpg (empty-caption)",
                       "corrupt.jpg (decode-error)", "truncated.jpg (truncated)", "notes.pdf (unsupported-format)"],
            "config": str(out / "captions.toml")}
