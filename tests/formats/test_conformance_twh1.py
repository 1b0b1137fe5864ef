"""TWH1 warehouse shards (formats/twh1.py) against the format conformance suite
(tests/conformance/formats.py)."""

from __future__ import annotations

import importlib.util
import json
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from conformance.formats import TESTS, FormatConformance
from hypothesis import strategies as st
from warpdata.formats import twh1

GOLDEN = TESTS / "golden" / "twh1"
MALFORMED = GOLDEN / "malformed"


@dataclass(frozen=True)
class Record:
    image: bytes  # C*H*W values of the shard's dtype, little-endian
    boxes: tuple[tuple[float, float, float, float], ...]
    classes: tuple[int, ...]
    key: str
    run_id: str
    frame_id: int
    orig_size: tuple[int, int]
    affine: tuple[float, float, float, float]


@dataclass(frozen=True)
class Twh1Sample:
    dtype: str
    width: int
    height: int
    max_boxes: int
    records: tuple[Record, ...]
    channels: int = 3


def _np(dtype: str):
    return {"u8": np.uint8, "f16": np.float16, "f32": np.float32}[dtype]


def _from_builder(b: twh1.ShardBuilder) -> Twh1Sample:
    """The fixed input of make_golden.py's builder, as plain values."""
    recs = []
    for i in range(b.count):
        nb = int(np.count_nonzero(b.mask[i]))
        recs.append(Record(b.images[i].tobytes(), tuple(tuple(float(v) for v in row) for row in b.boxes[i, :nb]),
                           tuple(int(c) for c in b.classes[i, :nb]), b.keys[i].decode(), b.run_ids[i].decode(),
                           int(b.frame_ids[i]), tuple(int(v) for v in b.orig_size[i]),
                           tuple(float(v) for v in b.affine[i])))
    return Twh1Sample(b.dtype, b.width, b.height, b.max_boxes, tuple(recs), b.channels)


_text = st.text(st.characters(blacklist_categories=("Cs",)), max_size=10)


@st.composite
def _twh1_samples(draw):
    dtype = draw(st.sampled_from(["u8", "f16", "f32"]))
    w, h, mb = draw(st.integers(1, 8)), draw(st.integers(1, 8)), draw(st.integers(1, 4))
    isz = np.dtype(_np(dtype)).itemsize
    # boxes are stored as f16 in f16 shards: draw values that type holds exactly
    coord = st.integers(0, 2048).map(float)
    recs = []
    for _ in range(draw(st.integers(0, 4))):
        nb = draw(st.integers(0, mb))
        pixels = np.frombuffer(draw(st.binary(min_size=3 * h * w, max_size=3 * h * w)), np.uint8)
        image = pixels.tobytes() if dtype == "u8" else (pixels / 255.0).astype(_np(dtype)).tobytes()
        assert len(image) == 3 * h * w * isz
        recs.append(Record(image, tuple(draw(st.tuples(coord, coord, coord, coord)) for _ in range(nb)),
                           tuple(draw(st.integers(0, 2**31 - 1)) for _ in range(nb)), draw(_text), draw(_text),
                           draw(st.integers(-1, 2**62)), (draw(st.integers(0, 2**32 - 1)), draw(st.integers(0, 2**32 - 1))),
                           tuple(float(np.float32(draw(st.floats(-1e6, 1e6)))) for _ in range(4))))
    return Twh1Sample(dtype, w, h, mb, tuple(recs))


class TestTwh1Conformance(FormatConformance):
    error = (twh1.TWH1FormatError, twh1.TWH1ChecksumError)
    checksum_error = twh1.TWH1ChecksumError
    goldens = {d: GOLDEN / f"small_{d}.twh1" for d in ("u8", "f16", "f32")}
    malformed_dirs = (MALFORMED,)
    flip_case = "u8"
    regions = ("header-page", "images", "boxes", "mask", "meta-classes", "meta-keys", "checksum")
    suffix = ".twh1"

    def write(self, path: Path, sample: Twh1Sample) -> None:
        b = twh1.ShardBuilder(capacity=max(1, len(sample.records)), width=sample.width, height=sample.height,
                              max_boxes=sample.max_boxes, dtype=sample.dtype, channels=sample.channels)
        for r in sample.records:
            b.image_slot()[...] = np.frombuffer(r.image, _np(sample.dtype)).reshape(
                sample.channels, sample.height, sample.width)
            b.commit(key=r.key, boxes=np.array(r.boxes, np.float32).reshape(-1, 4),
                     classes=np.array(r.classes, np.int32), frame_id=r.frame_id, run_id=r.run_id,
                     orig_size=r.orig_size, affine=r.affine)
        sha = b.write_file(path)
        assert sha == path.read_bytes()[-32:].hex()

    def read(self, path: Path) -> Twh1Sample:
        with twh1.TWH1Shard(path, verify=True) as s:
            h = s.header
            recs = []
            for i in range(len(s)):
                nb = s.num_boxes(i)
                assert (s.mask[i, nb:] == 0).all() and (s.boxes[i, nb:] == 0).all() and (s.classes[i, nb:] == -1).all()
                recs.append(Record(s.images[i].tobytes(), tuple(tuple(float(v) for v in row) for row in s.boxes[i, :nb]),
                                   tuple(int(c) for c in s.classes[i, :nb]), s.key(i), s.run_id(i),
                                   int(s.frame_ids[i]), tuple(int(v) for v in s.orig_size[i]),
                                   tuple(float(v) for v in s.affine[i])))
            return Twh1Sample(h.dtype, h.width, h.height, h.max_boxes, tuple(recs), h.channels)

    def verify(self, path: Path) -> None:
        with twh1.TWH1Shard(path) as s:
            s.verify()

    def golden_sample(self, case: str) -> Twh1Sample:
        spec = importlib.util.spec_from_file_location("twh1_make_golden_conformance", GOLDEN / "make_golden.py")
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        return _from_builder(mod.golden_builder(case))

    def samples(self):
        return _twh1_samples()

    def region(self, path: Path, name: str) -> tuple[str, int]:
        raw = path.read_bytes()
        h = twh1.read_header(path)
        _magic, _ver, classes, _f, _o, _a, _ki, key_data, *_ = twh1.META_HEADER.unpack_from(raw, h.meta_offset)
        return "", {
            "header-page": twh1.HEADER.size + 100,  # the zero padding up to the image region
            "images": h.image_offset + 7,
            "boxes": h.boxes_offset + 3,
            "mask": h.mask_offset + 1,
            "meta-classes": classes + 2,
            "meta-keys": key_data + 2,
            "checksum": h.checksum_offset + 5,  # the stored SHA-256 itself
        }[name]

    def malformed_expected(self):
        doc = json.loads((MALFORMED / "expected.json").read_text())
        return {f"{name}.twh1": (e["error"], re.escape(e["message_contains"])) for name, e in doc.items()}
