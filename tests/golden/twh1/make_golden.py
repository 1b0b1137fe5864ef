"""Write the TWH1 golden files and the malformed-input corpus (run by hand only).

    .venv/bin/python tests/golden/twh1/make_golden.py

The files are committed; tests compare fresh output against them and never
rewrite them. Rerun this only for a deliberate format change (which also
needs a new shard_version) and review the diff.
"""

from __future__ import annotations

import json
import struct
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent


def golden_builder(dtype: str):
    from warpdata.formats.twh1 import ShardBuilder

    b = ShardBuilder(capacity=3, width=5, height=4, max_boxes=3, dtype=dtype)
    rng = np.random.default_rng(1234)
    for i in range(3):
        img = rng.integers(0, 256, size=(3, 4, 5), dtype=np.uint8)
        slot = b.image_slot()
        slot[:] = img if dtype == "u8" else (img / 255.0).astype(slot.dtype)
        nb = i  # 0, 1 and 2 boxes
        boxes = np.array([[0.5 + k, 1.0, 3.25 + k, 3.5] for k in range(nb)], np.float32).reshape(-1, 4)
        b.commit(key=f"images/é{i}.jpg", boxes=boxes, classes=np.arange(nb) + 7, frame_id=100 + i,
                 run_id=f"run-{i % 2}", orig_size=(50 + i, 40 + i), affine=(0.1, 0.1, 0.0, 0.5))
    return b


def main() -> int:
    from warpdata.formats.twh1 import HEADER

    for dtype in ("u8", "f16", "f32"):
        sha = golden_builder(dtype).write_file(HERE / f"small_{dtype}.twh1")
        print(dtype, sha)
    good = (HERE / "small_u8.twh1").read_bytes()
    bad = HERE / "malformed"
    bad.mkdir(exist_ok=True)
    cases: dict[str, tuple[bytes, str, str]] = {}

    def patch(data: bytes, off: int, fmt: str, value) -> bytes:
        b = bytearray(data)
        struct.pack_into(fmt, b, off, value)
        return bytes(b)

    cases["bad_magic"] = (b"TWH2" + good[4:], "TWH1FormatError", "bad magic")
    cases["empty"] = (b"", "TWH1FormatError", "shorter than")
    cases["header_only"] = (good[:HEADER.size], "TWH1FormatError", "truncated")
    cases["truncated"] = (good[:-10], "TWH1FormatError", "truncated")
    cases["trailing_bytes"] = (good + b"\0", "TWH1FormatError", "trailing")
    cases["future_version"] = (patch(good, 4, "<I", 2), "TWH1FormatError", "shard_version 2")
    cases["unknown_dtype"] = (patch(good, 8, "<I", 9), "TWH1FormatError", "dtype code 9")
    cases["bad_endianness"] = (patch(good, 12, "<I", 7), "TWH1FormatError", "endianness 7")
    cases["zero_width"] = (patch(good, 16, "<I", 0), "TWH1FormatError", "zero dimension")
    cases["overlapping_boxes"] = (patch(good, 48, "<Q", 4100), "TWH1FormatError", "overlaps")
    cases["too_many_samples"] = (patch(good, 32, "<Q", 1000), "TWH1FormatError", "overlaps")
    meta_off = struct.unpack_from("<Q", good, 64)[0]
    cases["bad_meta_magic"] = (patch(good, meta_off, "<4s", b"XXXX"), "TWH1FormatError", "meta region")
    cases["meta_offsets_outside"] = (patch(good, meta_off + 8, "<Q", 10**9), "TWH1FormatError", "outside the meta")
    img_off = struct.unpack_from("<Q", good, 40)[0]
    flipped = bytearray(good)
    flipped[img_off + 7] ^= 0x01
    cases["flipped_pixel"] = (bytes(flipped), "TWH1ChecksumError", "SHA-256 mismatch")
    expected = {}
    for name, (data, err, msg) in sorted(cases.items()):
        (bad / f"{name}.twh1").write_bytes(data)
        expected[name] = {"error": err, "message_contains": msg}
    (bad / "expected.json").write_text(json.dumps(expected, indent=2, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
