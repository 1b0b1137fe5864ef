"""TBL v2 (formats/tbl.py) against the format conformance suite (tests/conformance/formats.py)."""

from __future__ import annotations

import importlib.util
import json
from dataclasses import dataclass
from pathlib import Path

from conformance.formats import TESTS, FormatConformance
from hypothesis import strategies as st
from warpdata.formats import tbl

GOLDEN = TESTS / "golden" / "tbl"
MALFORMED = TESTS / "malformed" / "tbl"


def _make_golden():
    spec = importlib.util.spec_from_file_location("tbl_make_golden_conformance", GOLDEN / "make_golden.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@dataclass(frozen=True)
class TblSample:
    records: tuple[tuple[bytes, object], ...]  # (payload, JSON metadata or None)
    compression: str = "auto"
    extensions: bool = True
    level: int | None = None
    warp_metadata: bool = False  # every record's metadata is a dict with "key"


_meta = st.one_of(st.none(), st.fixed_dictionaries({"i": st.integers(-5, 5), "s": st.text(max_size=4)}))
_payload = st.one_of(st.binary(max_size=300), st.binary(min_size=1, max_size=40).map(lambda b: b * 30))


@st.composite
def _tbl_samples(draw):
    compression = draw(st.sampled_from(["none", "lz4", "zstd", "auto"]))
    extensions = compression == "zstd" or draw(st.booleans())
    keyed = extensions and draw(st.booleans())
    n = draw(st.integers(0, 8))
    records = tuple((draw(_payload), {"key": f"k/{i}"} if keyed else draw(_meta)) for i in range(n))
    return TblSample(records, compression, extensions, None, keyed)


class TestTblConformance(FormatConformance):
    error = tbl.TblError
    checksum_error = tbl.ChecksumMismatch
    goldens = {v: GOLDEN / f"{v}.tbl" for v in ("plain_none", "plain_lz4", "warp_none", "warp_lz4", "warp_zstd")}
    malformed_dirs = (MALFORMED,)
    flip_case = "warp_lz4"
    regions = ("header", "index", "payload", "payload-crc32", "metadata", "metadata-crc-table")
    suffix = ".tbl"

    def write(self, path: Path, sample: TblSample) -> None:
        with tbl.TblWriter(path, compression=sample.compression, extensions=sample.extensions,
                           level=sample.level, fsync=False) as w:
            for data, meta in sample.records:
                w.add(data, metadata=meta)
            w.close(warp_metadata=sample.warp_metadata)

    def read(self, path: Path):
        with tbl.TblReader(path, verify=True) as r:
            return tuple((bytes(r.read(i)), r.metadata(i)) for i in range(len(r)))

    def expected(self, sample: TblSample):
        return sample.records

    def verify(self, path: Path) -> None:
        with tbl.TblReader(path, verify=True) as r:
            for i in range(len(r)):
                r.read(i)
                r.metadata(i)
            assert r.verify_all() == []  # the reads checked every CRC; the batch check agrees

    def golden_sample(self, case: str) -> TblSample:
        g = _make_golden()
        opts = g.VARIANTS[case]
        records = tuple((data, {"key": key, "name": f"{key}.{ext}"}) for key, ext, data in g.SAMPLES)
        return TblSample(records, opts["compression"], opts["extensions"], opts.get("level"), opts["extensions"])

    def samples(self):
        return _tbl_samples()

    def region(self, path: Path, name: str) -> tuple[str, int]:
        with tbl.TblReader(path, verify=False) as r:
            first, h = r.info(0), r.header
        return "", {
            "header": 9,  # the sample count (header CRC-32)
            "index": tbl.HEADER_SIZE + tbl.ENTRY_SIZE + 16,  # entry 1's width (index CRC-32)
            "payload": first.offset + 5,  # payload CRC-32 trailer
            "payload-crc32": first.offset + first.size + 1,  # the trailer itself
            "metadata": h.metadata_offset + tbl.META_BLOCK_SIZE + 3,  # first JSON block (block CRC-32s)
            "metadata-crc-table": h.metadata_offset + h.metadata_size + 1,  # the block CRC table (section CRC)
        }[name]

    def malformed_expected(self):
        return {name: (cls, None) for name, cls in json.loads((MALFORMED / "expected.json").read_text()).items()}
