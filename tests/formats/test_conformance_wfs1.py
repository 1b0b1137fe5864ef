"""WFS1 feature shards (formats/featshard.py) against the format conformance suite
(tests/conformance/formats.py)."""

from __future__ import annotations

import json
import mmap
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from conformance.formats import TESTS, FormatConformance
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from warpdata.formats import featshard as wfs

GOLDEN = TESTS / "golden" / "featshard"
MALFORMED = GOLDEN / "malformed"


@dataclass(frozen=True)
class Wfs1Sample:
    fields: tuple[wfs.FieldSpec, ...]
    columns: tuple[tuple[str, tuple[int, ...], bytes], ...]  # per field: (dtype, (N, *shape), C-order bytes)
    meta: dict | None = None
    record_crc: bool = True

    def batch(self) -> dict[str, np.ndarray]:
        return {f.name: np.frombuffer(raw, np.dtype(dt)).reshape(shape)
                for f, (dt, shape, raw) in zip(self.fields, self.columns, strict=True)}


def _column(f: wfs.FieldSpec, a: np.ndarray) -> tuple[str, tuple[int, ...], bytes]:
    a = np.ascontiguousarray(a, dtype=np.dtype(f.dtype))
    return np.dtype(f.dtype).str, a.shape, a.tobytes()


_DTYPES = sorted({np.dtype(d).name for d in wfs.DTYPE_CODES.values()})
_names = st.text(st.characters(codec="utf-8", exclude_characters="\0"), min_size=1, max_size=12).filter(
    lambda s: len(s.encode()) <= wfs.MAX_NAME_BYTES)


@st.composite
def _wfs1_samples(draw):
    names = draw(st.lists(_names, min_size=1, max_size=4, unique=True))
    fields = tuple(wfs.FieldSpec(n, draw(st.sampled_from(_DTYPES)), tuple(draw(st.lists(st.integers(1, 4), max_size=3))))
                   for n in names)
    n = draw(st.integers(0, 5))
    columns = tuple(_column(f, draw(hnp.arrays(np.dtype(f.dtype), (n, *f.shape)))) for f in fields)
    meta = draw(st.one_of(st.none(), st.dictionaries(st.text(max_size=5), st.integers(-5, 5), min_size=1, max_size=3)))
    return Wfs1Sample(fields, columns, meta, draw(st.booleans()))


class TestWfs1Conformance(FormatConformance):
    error = wfs.FeatureShardError
    checksum_error = wfs.FeatureShardChecksumError
    goldens = {"v1-small": GOLDEN / "v1-small.wfs", "v1-empty": GOLDEN / "v1-empty.wfs"}
    malformed_dirs = (MALFORMED,)
    flip_case = "v1-small"
    regions = ("field-table", "meta", "header-crc", "records", "record-crc-table", "trailer-crc")
    suffix = ".wfs"

    def write(self, path: Path, sample: Wfs1Sample) -> None:
        wfs.write_shard(path, list(sample.fields), sample.batch(), meta=sample.meta, record_crc=sample.record_crc)

    def read(self, path: Path) -> Wfs1Sample:
        with wfs.FeatureShardReader(path) as r:
            r.verify()
            cols = tuple(_column(f, r.field(f.name)) for f in r.fields)
            return Wfs1Sample(tuple(r.fields), cols, r.meta or None, r.has_record_crc)

    def verify(self, path: Path) -> None:
        with wfs.FeatureShardReader(path) as r:
            r.verify()

    def golden_sample(self, case: str) -> Wfs1Sample:
        if case == "v1-empty":
            f = wfs.FieldSpec("x", "uint8")
            return Wfs1Sample((f,), (_column(f, np.zeros(0, np.uint8)),), None, False)
        exp = json.loads((GOLDEN / "v1-small.json").read_text())
        fields = tuple(wfs.FieldSpec(f["name"], f["dtype"], tuple(f["shape"])) for f in exp["fields"])
        return Wfs1Sample(fields, tuple(_column(f, np.asarray(exp["records"][f.name])) for f in fields), exp["meta"])

    def samples(self):
        return _wfs1_samples()

    def region(self, path: Path, name: str) -> tuple[str, int]:
        with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            p = wfs.parse(mm, str(path))
            size = len(mm)
        table_end = wfs.HEADER_SIZE + len(p.layout.fields) * wfs.FIELD_ENTRY_SIZE
        return "", {
            "field-table": wfs.HEADER_SIZE + 2,  # a byte of field 0's name (header CRC-32C)
            "meta": table_end + 3,  # the meta JSON (header CRC-32C)
            "header-crc": 25,  # the stored header CRC-32C itself
            "records": p.data_offset + 1,  # record 0 (its CRC-32C)
            "record-crc-table": p.footer_offset + 1,  # trailer CRC-32C covers the table
            "trailer-crc": size - wfs.TRAILER_SIZE + 25,  # the stored trailer CRC-32C itself
        }[name]

    def malformed_expected(self):
        doc = json.loads((MALFORMED / "expected.json").read_text())
        return {f"{name}.wfs": (None, re.escape(needle)) for name, needle in doc.items()}
