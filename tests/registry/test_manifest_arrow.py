"""Format 4 manifests: each table's exact Arrow schema (base64 IPC schema message), hashed with the rest.

docs/formats/registry.md, "Arrow schemas (format 4)".
"""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pyarrow as pa
import pytest
from support.manifests import unsealed
from test_registry_stats import STATS0, H
from warpdata.core.errors import ManifestCorruptedError
from warpdata.registry.manifest import (
    Manifest,
    ShardRef,
    Table,
    decode_arrow_schema,
    encode_arrow_schema,
    seal_of,
    version_hash_of,
)

GOLDEN = Path(__file__).parents[1] / "golden" / "registry"
SCHEMA = pa.schema([pa.field("id", pa.int64(), nullable=False), pa.field("label", pa.string())])


def sample_manifest_v4(schema: pa.Schema = SCHEMA, **metadata) -> Manifest:
    fields = [{"name": f.name, "type": str(f.type), "nullable": f.nullable} for f in schema]
    return Manifest(
        dataset_id="vision/coco-mini",
        tables={"main": Table(shards=(ShardRef(H[0], 1000, row_count=10, stats=STATS0),),
                              schema={"fields": fields, "arrow": encode_arrow_schema(schema)})},
        metadata=metadata)


def test_golden_v4_manifest_hash_is_stable():
    data = (GOLDEN / "manifest-v4.json").read_bytes()
    expected = (GOLDEN / "manifest-v4.version").read_text().strip()
    assert version_hash_of(json.loads(data)) == expected and json.loads(data)["format_version"] == 4
    # the unsealed golden predates the seal by a day; format 4 must be sealed now (test_manifest_seal)
    m = Manifest.from_bytes((GOLDEN / "manifest-v4-sealed.json").read_bytes(), expected_hash=expected)
    assert m.version_hash == expected
    assert m.tables["main"].arrow_schema().equals(SCHEMA, check_metadata=True)
    assert unsealed(sample_manifest_v4(created_at="2025-01-01T00:00:00Z").to_bytes()) == data  # the golden predates the seal
    assert json.loads(data)["metadata"] == {"created_at": "2025-01-01T00:00:00Z"}  # envelope: not hashed


@pytest.mark.parametrize("schema", [
    SCHEMA,
    pa.schema([pa.field("t", pa.timestamp("us", tz="America/New_York")), pa.field("d", pa.decimal128(20, 4)),
               pa.field("l", pa.large_list(pa.struct([("a", pa.int8()), ("b", pa.dictionary(pa.int32(), pa.utf8()))]))),
               pa.field("m", pa.map_(pa.string(), pa.float64())), pa.field("f", pa.list_(pa.float16(), 8)),
               pa.field("u", pa.uint64(), nullable=False, metadata={"k": "v"})], metadata={"pandas": "{}"}),
], ids=["plain", "nested"])
def test_arrow_schema_round_trips_exactly(schema):
    m = sample_manifest_v4(schema)
    back = Manifest.from_bytes(m.to_bytes(), expected_hash=m.version_hash)
    got = back.tables["main"].arrow_schema()
    assert got.equals(schema, check_metadata=True) and got.field(0).metadata == schema.field(0).metadata
    assert decode_arrow_schema(encode_arrow_schema(schema)).equals(schema, check_metadata=True)


def test_the_arrow_schema_is_hashed():
    a = sample_manifest_v4()
    b = sample_manifest_v4(SCHEMA.with_metadata({"x": "y"}))  # same fields, other schema metadata
    assert a.version_hash != b.version_hash
    doc = json.loads(a.to_bytes())
    doc["tables"]["main"]["schema"]["arrow"] = json.loads(b.to_bytes())["tables"]["main"]["schema"]["arrow"]
    with pytest.raises(ManifestCorruptedError, match="hash mismatch"):  # swapped in without rehashing
        Manifest.from_dict(doc, expected_hash=a.version_hash)


def test_format_4_rules():
    doc = json.loads(sample_manifest_v4().to_bytes())
    assert doc["format_version"] == 4
    v2 = json.loads(sample_manifest_v4().to_bytes())
    del v2["tables"]["main"]["schema"]["arrow"]
    v2["version_hash"] = version_hash_of(v2)
    with pytest.raises(ManifestCorruptedError, match="format_version is 4, .* Arrow table schemas are absent"):
        Manifest.from_dict(v2)
    v2["format_version"] = 2
    del v2["metadata"]
    v2["version_hash"] = version_hash_of(v2)
    assert Manifest.from_dict(v2).tables["main"].arrow_schema() is None  # an older manifest: no schema, fine
    doc["format_version"] = 2
    doc["version_hash"] = version_hash_of(doc)
    with pytest.raises(ManifestCorruptedError, match="format_version is 2, .* Arrow table schemas are present"):
        Manifest.from_dict(doc)


def test_format_4_hashes_read_metadata_like_format_3():
    a = sample_manifest_v4(default_table="main")
    b = sample_manifest_v4()
    assert a.version_hash != b.version_hash
    assert json.loads(a.to_bytes())["format_version"] == 4


@pytest.mark.parametrize("arrow, match", [
    ("not base64!", "does not match"),
    (base64.b64encode(b"\xff\xff\xff\xff\x10\x00\x00\x00garbage!").decode(), "not a base64 Arrow IPC schema"),
    (encode_arrow_schema(pa.schema([("other", pa.int64()), ("label", pa.string())])), "names the columns"),
])
def test_a_bad_arrow_schema_is_a_typed_error(arrow, match):
    doc = json.loads(sample_manifest_v4().to_bytes())
    doc["tables"]["main"]["schema"]["arrow"] = arrow
    doc["version_hash"] = version_hash_of(doc)
    doc["metadata"].pop("seal_sha256")  # a consistent forgery: hash and seal recomputed
    doc["metadata"]["seal_sha256"] = seal_of(doc)
    with pytest.raises(ManifestCorruptedError, match=match):
        Manifest.from_dict(doc).tables["main"].arrow_schema("vision/coco-mini table main")
