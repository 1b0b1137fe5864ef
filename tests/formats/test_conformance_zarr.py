"""Zarr v3 arrays as warp writes them (warp/tiles, formats/zarr_v3.py) against the format
conformance suite (tests/conformance/formats.py). An artifact is a folder: the array, or a
pyramid group whose levels are sub-arrays ``0``, ``1``, ...; its ``zarr.json`` documents carry
no checksum, so the flipped bytes are in chunk and shard objects."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from conformance.formats import TESTS, FormatConformance
from hypothesis import strategies as st
from warpdata.core.errors import DataError
from warpdata.formats import zarr_v3
from warpdata.storage import zarr_store

GOLDEN = TESTS / "golden" / "zarr"
DTYPES = ["uint8", "uint16", "uint32", "float32", "float64"]


@dataclass(frozen=True)
class ZarrSample:
    dtype: str
    shape: tuple[int, ...]
    data: bytes  # C order
    tile: tuple[int, ...]
    shards: tuple[int, ...] | None
    levels: int = 1
    fill_value: int = 0

    def array(self) -> np.ndarray:
        return np.frombuffer(self.data, np.dtype(self.dtype)).reshape(self.shape)


def _levels(root: Path) -> list[Path]:
    """The arrays of an artifact: the root, or each level of a pyramid group."""
    doc = zarr_v3.parse_json_document((root / zarr_v3.ZARR_JSON).read_bytes(), str(root / zarr_v3.ZARR_JSON)) \
        if (root / zarr_v3.ZARR_JSON).is_file() else None
    if isinstance(doc, dict) and doc.get("node_type") == "group":
        return sorted((p for p in root.iterdir() if p.name.isdigit()), key=lambda p: int(p.name))
    return [root]


@st.composite
def _zarr_samples(draw):
    d = draw(st.integers(1, 3))
    shape = tuple(draw(st.lists(st.integers(1, 12), min_size=d, max_size=d)))
    tile = tuple(draw(st.lists(st.integers(1, 5), min_size=d, max_size=d)))
    dtype = draw(st.sampled_from(DTYPES))
    shards = None
    if draw(st.booleans()):  # the slowest dimension of size > 1 keeps the tile's extent
        first = next((i for i, n in enumerate(shape) if n > 1), d - 1)
        shards = tuple(t if i == first else t * draw(st.integers(1, 3)) for i, t in enumerate(tile))
    n = int(np.prod(shape)) * np.dtype(dtype).itemsize
    return ZarrSample(dtype, shape, draw(st.binary(min_size=n, max_size=n)), tile, shards)


class TestZarrConformance(FormatConformance):
    error = DataError  # zarr_v3 raises DataError (ZarrChecksumError for CRC-32C mismatches)
    checksum_error = zarr_v3.ZarrChecksumError
    goldens = {"sharded": GOLDEN / "sharded.zarr", "unsharded": GOLDEN / "unsharded.zarr",
               "pyramid": GOLDEN / "pyramid.zarr"}
    malformed_dirs = (TESTS / "malformed" / "zarr", GOLDEN / "malformed")
    flip_case = "pyramid"
    regions = ("chunk-frame", "chunk-crc32c", "shard-index", "index-crc32c", "level1-chunk")
    suffix = ".zarr"

    def write(self, path: Path, sample: ZarrSample) -> None:
        from warpdata.tiles.writer import TileWriter

        a = sample.array()
        with TileWriter(path, a.shape, a.dtype, sample.tile, backend="cpu", fsync=False, shards=sample.shards,
                        levels=sample.levels, fill_value=sample.fill_value) as w:
            w.write_array(a)

    def read(self, path: Path):
        """Level 0 as (dtype, shape, bytes); every other level is read (and so checked) too."""
        arrays = [zarr_store.read_array(p) for p in _levels(path)]
        a = arrays[0]
        return a.dtype.name, a.shape, a.tobytes()

    def expected(self, sample: ZarrSample):
        return sample.dtype, sample.shape, sample.data

    def verify(self, path: Path) -> None:
        for p in _levels(path):
            zarr_store.read_array(p)

    def golden_sample(self, case: str) -> ZarrSample:
        a = np.arange(5 * 7 * 6, dtype=np.uint32).reshape(5, 7, 6)  # tests/golden/zarr/make_golden.py
        a = ((a * 2654435761) % 4093).astype(np.uint16)
        shards = None if case == "unsharded" else (2, 8, 8)
        return ZarrSample("uint16", a.shape, a.tobytes(), (2, 4, 4), shards, 2 if case == "pyramid" else 1)

    def samples(self):
        return _zarr_samples()

    def region(self, path: Path, name: str) -> tuple[str, int]:
        member = "1/c/0/0/0" if name == "level1-chunk" else "0/c/0/0/0"
        blob = (path / member).read_bytes()
        layout = zarr_v3.read_layout(zarr_store.Store(path / member.split("/")[0]))
        n = int(np.prod(layout.chunks_per_shard))
        (off, size), *_ = zarr_v3.decode_index(blob, n, member).tolist()
        return member, {
            "chunk-frame": off + 5,  # inside inner chunk 0's zstd frame (its CRC-32C)
            "chunk-crc32c": off + size - 2,  # the chunk's stored CRC-32C itself
            "shard-index": len(blob) - zarr_v3.CRC_SIZE - n * zarr_v3.INDEX_ENTRY + 3,  # (index CRC-32C)
            "index-crc32c": len(blob) - 1,  # the index's stored CRC-32C itself
            "level1-chunk": off + 5,
        }[name]

    def malformed_expected(self):
        needles = json.loads((TESTS / "malformed" / "zarr" / "expected.json").read_text())
        out: dict[str, tuple[str | None, str | None]] = {name: (None, pattern) for name, pattern in needles.items()}
        checksum = zarr_v3.ZarrChecksumError.__name__
        out.update({  # the chunk-level corpus of tests/golden/zarr/make_golden.py, as read_array sees it
            "bad-index-crc": (checksum, re.escape("shard index CRC-32C mismatch")),
            "bad-chunk-crc": (checksum, re.escape("c/0/0/0 (inner chunk 0): chunk CRC-32C mismatch")),
            "bad-frame": (checksum, "chunk CRC-32C mismatch"),
            "bad-level1-chunk": (checksum, re.escape("1/c/0/0/0 (inner chunk 0): chunk CRC-32C mismatch")),
            "changed-data": (checksum, "not the input's .* recorded in manifest.json"),
            "missing-shard": (checksum, "not the input's .* recorded in manifest.json"),
            "truncated-shard": (checksum, re.escape("c/1/0/0: shard index CRC-32C mismatch")),
            "bad-zarr-json": ("DataError", "not a Zarr v3 array"),
        })
        return out
