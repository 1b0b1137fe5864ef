"""A small deterministic table-plus-media dataset: what the README's publish and read examples use.

``generate(out, count, seed)`` writes, under ``out``:

* ``data/p0.parquet``, ``data/p1.parquet``: the table ``main`` split in two
  parts, ``count`` rows in all, columns ``id`` (int64, 0..count-1), ``label``
  (a class name) and ``image`` (``img/NNNN.png``, a path inside ``imgs/``);
* ``imgs/img/0000.png`` ... : ``IMAGES`` small photo-like PNGs (Pillow),
  referenced round-robin by the ``image`` column (row ``i`` -> image ``i % IMAGES``);
* ``imgs/snd/0.wav``: a quarter-second 16-bit mono tone, a real RIFF/WAVE
  file written with the standard library's :mod:`wave`.

So ``warp publish NAME --table 'main=data/*.parquet' --artifact images=imgs
--bind main.image=images:image`` publishes it as is. Same seed and count →
byte-identical files.
"""

from __future__ import annotations

import io
import wave
from pathlib import Path

import numpy as np
from warpdata.core.atomic import atomic_file, atomic_write_bytes
from warpdata.core.errors import UsageError
from warpdata.sampledata.photos import encode_png, synthetic_photo
from warpdata.sampledata.wds import CLASSES

# lazy third-party imports: pyarrow (heavy) is imported by generate() alone

IMAGES = 10
WAV_RATE = 8000


def _wav(seed: int) -> bytes:
    """A 0.25 s tone (440 Hz + a seed-dependent overtone) as 16-bit mono PCM WAVE."""
    t = np.arange(WAV_RATE // 4, dtype=np.float64) / WAV_RATE
    tone = 0.6 * np.sin(2 * np.pi * 440 * t) + 0.2 * np.sin(2 * np.pi * (880 + 10 * (seed % 50)) * t)
    pcm = np.round(tone * 32767 * 0.8).astype("<i2")
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(WAV_RATE)
        w.writeframes(pcm.tobytes())
    return buf.getvalue()


def generate(out: Path, count: int = 500, seed: int = 0) -> dict:
    import pyarrow as pa
    import pyarrow.parquet as pq

    out = Path(out)
    count = int(count)
    if count < 1:
        raise UsageError(f"photos: --count must be at least 1 (got {count})")
    rng = np.random.default_rng(seed)
    n_images = min(IMAGES, count)
    files = []
    for i in range(n_images):
        side = int(rng.integers(12, 25))
        rel = f"imgs/img/{i:04d}.png"
        (out / rel).parent.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(out / rel, encode_png(synthetic_photo(rng, side, side)))
        files.append(rel)
    (out / "imgs" / "snd").mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(out / "imgs" / "snd" / "0.wav", _wav(seed))
    files.append("imgs/snd/0.wav")

    ids = np.arange(count, dtype=np.int64)
    labels = [CLASSES[int(c)] for c in rng.integers(len(CLASSES), size=count)]
    table = pa.table({"id": ids, "label": pa.array(labels, pa.string()),
                      "image": pa.array([f"img/{i % n_images:04d}.png" for i in range(count)], pa.string())})
    (out / "data").mkdir(parents=True, exist_ok=True)
    half = (count + 1) // 2
    for k, part in enumerate((table.slice(0, half), table.slice(half))):
        rel = f"data/p{k}.parquet"
        with atomic_file(out / rel) as f:
            pq.write_table(part, f, compression="zstd")
        files.append(rel)
    return {"kind": "photos", "rows": count, "images": n_images, "files": sorted(files),
            "publish": "warp publish NAME --table 'main=data/*.parquet' --artifact images=imgs "
                       "--bind main.image=images:image"}
