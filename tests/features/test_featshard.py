"""WFS1 feature shards: golden files, malformed corpus, round-trips, safety properties."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from warpdata.core.errors import DataError, MissingInputError
from warpdata.formats.featshard import (
    DTYPE_CODES,
    FeatureShardChecksumError,
    FeatureShardError,
    FeatureShardReader,
    FeatureShardWriter,
    FieldSpec,
    Layout,
    crc32c,
    write_shard,
)

GOLDEN = Path(__file__).parents[1] / "golden" / "featshard"


def test_crc32c_check_value():
    assert crc32c(b"123456789") == 0xE3069283  # CRC-32C (Castagnoli) check value


def test_golden_v1_small_decodes_to_expected_values():
    exp = json.loads((GOLDEN / "v1-small.json").read_text())
    with FeatureShardReader(GOLDEN / "v1-small.wfs") as r:
        r.verify()
        assert [f.to_dict() for f in r.fields] == exp["fields"]
        assert r.meta == exp["meta"]
        assert len(r) == 3
        for name, values in exp["records"].items():
            np.testing.assert_array_equal(r.field(name).astype(np.float64), np.asarray(values, np.float64))


def test_golden_v1_writer_reproduces_bytes(tmp_path):
    """The writer is deterministic: the same records give the golden bytes exactly."""
    exp = json.loads((GOLDEN / "v1-small.json").read_text())
    fields = [FieldSpec(f["name"], f["dtype"], tuple(f["shape"])) for f in exp["fields"]]
    batch = {f.name: np.asarray(exp["records"][f.name]).astype(np.dtype(f.dtype)) for f in fields}
    write_shard(tmp_path / "x.wfs", fields, batch, meta=exp["meta"])
    assert (tmp_path / "x.wfs").read_bytes() == (GOLDEN / "v1-small.wfs").read_bytes()


def test_golden_v1_empty_shard():
    with FeatureShardReader(GOLDEN / "v1-empty.wfs") as r:
        assert len(r) == 0 and not r.has_record_crc
        assert r.field("x").shape == (0,)


MALFORMED = json.loads((GOLDEN / "malformed" / "expected.json").read_text())


@pytest.mark.parametrize("name", sorted(MALFORMED))
def test_malformed_corpus_is_rejected_with_a_precise_error(name):
    path = GOLDEN / "malformed" / f"{name}.wfs"
    with pytest.raises(FeatureShardError) as ei:
        r = FeatureShardReader(path)
        r.verify()
    err = ei.value
    assert MALFORMED[name] in err.message
    assert str(path) in err.message and "at byte" in err.message
    assert isinstance(err, DataError) and isinstance(err, ValueError)
    assert err.hint and "rebuild" in err.hint
    assert err.exit_code == 65


def test_record_bitflip_is_a_checksum_error_naming_the_record():
    with pytest.raises(FeatureShardChecksumError) as ei:
        FeatureShardReader(GOLDEN / "malformed" / "record-bitflip.wfs").verify_record(0)
    assert ei.value.details["record"] == 0
    # the other records are intact
    FeatureShardReader(GOLDEN / "malformed" / "record-bitflip.wfs").verify_record(1)


def test_missing_file_is_missing_input(tmp_path):
    with pytest.raises(MissingInputError):
        FeatureShardReader(tmp_path / "nope.wfs")


def test_reader_is_zero_copy_over_the_mapping():
    r = FeatureShardReader(GOLDEN / "v1-small.wfs")
    lat = r.field("latents")
    assert not lat.flags.writeable and not lat.flags.owndata
    assert lat.strides[0] == r.layout.record_size  # a strided view, not a gathered copy
    view = r.record(1)["scale"]
    r.close()  # views outlive the reader: the mapping closes when they are gone
    assert view.tolist() == [1.0, -1.0]


def test_layout_aligns_fields_naturally():
    lay = Layout.pack([FieldSpec("a", "uint8", (3,)), FieldSpec("b", "float64"), FieldSpec("c", "float16", (5,)),
                       FieldSpec("d", "int32")])
    assert lay.offsets == (0, 8, 16, 28)
    assert lay.record_size % 8 == 0 and lay.record_size == 32


def test_field_spec_rejects_bad_definitions():
    with pytest.raises(ValueError):
        FieldSpec("", "uint8")
    with pytest.raises(ValueError):
        FieldSpec("x", "complex64")
    with pytest.raises(ValueError):
        FieldSpec("x", "uint8", (0,))
    with pytest.raises(ValueError):
        FieldSpec("x", "uint8", (1,) * 7)
    with pytest.raises(ValueError):
        Layout.pack([FieldSpec("x", "uint8"), FieldSpec("x", "int8")])


def test_writer_rejects_wrong_shapes_dtypes_and_fields(tmp_path):
    fields = [FieldSpec("x", "int32", (2,))]
    with FeatureShardWriter(tmp_path / "a.wfs", fields) as w:
        with pytest.raises(ValueError, match="shape"):
            w.append_batch({"x": np.zeros((2, 3), np.int32)})
        with pytest.raises(ValueError, match="cannot store"):
            w.append_batch({"x": np.zeros((2, 2), np.float32)})
        with pytest.raises(ValueError, match="missing"):
            w.append_batch({"y": np.zeros((2, 2), np.int32)})
        w.append({"x": np.array([1, 2], np.int16)})  # safe widening is fine
    assert FeatureShardReader(tmp_path / "a.wfs").field("x").tolist() == [[1, 2]]


def test_killed_writer_leaves_no_shard(tmp_path):
    target = tmp_path / "a.wfs"
    with pytest.raises(RuntimeError), FeatureShardWriter(target, [FieldSpec("x", "uint8")]) as w:
        w.append({"x": np.uint8(1)})
        raise RuntimeError("killed")
    assert not target.exists()
    assert os.listdir(tmp_path) == []


def test_unfinished_file_is_rejected_as_truncated(tmp_path):
    """Append-only: until close() writes the trailer, the bytes on disk are not a shard."""
    w = FeatureShardWriter(tmp_path / "a.wfs", [FieldSpec("x", "float32", (4,))], fsync=False)
    w.append_batch({"x": np.ones((5, 4), np.float32)})
    w._f.flush()
    partial = tmp_path / "partial.wfs"
    partial.write_bytes(Path(w._tmp).read_bytes())
    w.abort()
    with pytest.raises(FeatureShardError, match="trailer|shorter"):
        FeatureShardReader(partial)


def test_batches_append_across_calls_and_info(tmp_path):
    fields = [FieldSpec("v", "float32", (3,)), FieldSpec("i", "int64")]
    w = FeatureShardWriter(tmp_path / "a.wfs", fields)
    for k in range(4):
        w.append_batch({"v": np.full((k + 1, 3), k, np.float32), "i": np.arange(k + 1)})
    info = w.close()
    assert info.records == 10 and info.bytes == (tmp_path / "a.wfs").stat().st_size
    from warpdata.core.canonical import sha256_file

    assert info.sha256 == sha256_file(tmp_path / "a.wfs")
    r = FeatureShardReader(tmp_path / "a.wfs")
    r.verify()
    assert r.field("i").tolist() == [0, 0, 1, 0, 1, 2, 0, 1, 2, 3]


_DTYPES = sorted({np.dtype(d).name for d in DTYPE_CODES.values()})


@st.composite
def shard_contents(draw):
    nfields = draw(st.integers(1, 5))
    names = draw(st.lists(st.text(st.characters(codec="utf-8", exclude_characters="\0"), min_size=1, max_size=12)
                          .filter(lambda s: len(s.encode()) <= 64), min_size=nfields, max_size=nfields,
                          unique=True))
    fields = [FieldSpec(n, draw(st.sampled_from(_DTYPES)), tuple(draw(st.lists(st.integers(1, 4), max_size=3))))
              for n in names]
    n = draw(st.integers(0, 6))
    batch = {f.name: draw(hnp.arrays(np.dtype(f.dtype), (n, *f.shape))) for f in fields}
    meta = draw(st.one_of(st.none(), st.dictionaries(st.text(max_size=5), st.integers(-5, 5), max_size=3)))
    return fields, batch, meta, draw(st.booleans())


@given(shard_contents())
def test_roundtrip_any_fields_and_values(tmp_path_factory, contents):
    fields, batch, meta, record_crc = contents
    path = tmp_path_factory.mktemp("rt") / "s.wfs"
    write_shard(path, fields, batch, meta=meta, record_crc=record_crc)
    with FeatureShardReader(path) as r:
        r.verify()
        assert r.fields == tuple(fields)
        assert r.meta == (meta or {})
        assert r.has_record_crc == record_crc
        for f in fields:
            got = r.field(f.name)
            assert got.dtype == np.dtype(f.dtype) and got.shape == batch[f.name].shape
            # bitwise equality: NaN payloads and -0.0 survive
            assert got.tobytes() == np.ascontiguousarray(batch[f.name]).tobytes()


@given(st.binary(min_size=0, max_size=700), st.integers(0, 851), st.integers(0, 255))
def test_random_corruption_never_crashes_the_reader(tmp_path_factory, junk, pos, byte):
    """Any mutation of a valid shard reads back correctly or raises FeatureShardError."""
    good = bytearray((GOLDEN / "v1-small.wfs").read_bytes())
    good[pos] ^= byte or 1
    for data in (bytes(good), bytes(good[:pos]) + junk):
        p = tmp_path_factory.mktemp("c") / "x.wfs"
        p.write_bytes(data)
        try:
            r = FeatureShardReader(p)
            r.verify()
            assert len(r) == 3  # only possible if the flip hit a byte no check covers (padding)
        except (FeatureShardError, MissingInputError):
            pass
