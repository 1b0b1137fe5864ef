"""A deterministic WebDataset tar: photo-like JPEGs with .json/.cls/.txt sidecars.

``generate(out, count, seed)`` writes ``out`` (a ``.tar`` path, or a
directory that receives ``shard-000000.tar``). Every sample has a ``.jpg``
(photo-like, see :mod:`warpdata.sampledata.photos`), a ``.cls`` label, a
``.json`` record and a ``.txt`` caption. The archive exercises what real
WebDataset tars contain and naive converters drop: one sample whose member
names exceed 100 characters and one with a non-ASCII key (both stored with
PAX headers), and samples under sub-directories. Same seed and count →
byte-identical archive (fixed mtimes, owners and modes).

:func:`write_tar` writes any ``(key, {ext: bytes})`` stream the same way.
"""

from __future__ import annotations

import io
import json
import tarfile
from collections.abc import Iterable, Iterator
from pathlib import Path

import numpy as np
from warpdata.sampledata.photos import encode_jpeg, synthetic_photo

CLASSES = ("cat", "dog", "bird", "car", "tree", "boat", "house", "flower")
LONG_DIR = "long-" + "d" * 60 + "/nested-" + "e" * 40


def write_tar(path: str | Path, samples: Iterable[tuple[str, dict[str, bytes]]]) -> dict:
    """Write WebDataset samples to ``path`` (PAX format, fixed metadata); returns counts."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    n = members = 0
    tmp = path.with_name(path.name + ".partial")
    with tarfile.open(tmp, "w", format=tarfile.PAX_FORMAT) as tf:
        for key, files in samples:
            for ext in sorted(files):
                data = files[ext]
                ti = tarfile.TarInfo(f"{key}.{ext}")
                ti.size, ti.mtime, ti.mode = len(data), 0, 0o644
                ti.uid = ti.gid = 0
                ti.uname = ti.gname = ""
                tf.addfile(ti, io.BytesIO(data))
                members += 1
            n += 1
    tmp.replace(path)
    return {"path": str(path), "samples": n, "members": members, "bytes": path.stat().st_size}


def samples(count: int, seed: int = 0, min_side: int = 48, max_side: int = 160,
            quality: int = 90) -> Iterator[tuple[str, dict[str, bytes]]]:
    """The generator's samples: (key, {ext: bytes})."""
    rng = np.random.default_rng(seed)
    for i in range(count):
        w, h = (int(x) for x in rng.integers(min_side, max_side + 1, size=2))
        label = int(rng.integers(len(CLASSES)))
        if i == 1:
            key = f"{LONG_DIR}/sample-{i:06d}"  # > 100 characters: needs a PAX path
        elif i == 2:
            key = f"unicode/échantillon-{i:06d}"  # non-ASCII: needs a PAX path
        else:
            key = f"part-{i // 100:03d}/sample-{i:06d}"
        caption = f"a photo of a {CLASSES[label]} number {i}"
        yield key, {
            "jpg": encode_jpeg(synthetic_photo(rng, w, h), quality),
            "cls": str(label).encode(),
            "json": json.dumps({"label": label, "class": CLASSES[label], "width": w, "height": h},
                               sort_keys=True).encode(),
            "txt": caption.encode(),
        }


def generate(out: Path, count: int = 64, seed: int = 0) -> dict:
    out = Path(out)
    target = out if out.suffix == ".tar" else out / "shard-000000.tar"
    return write_tar(target, samples(count, seed))
