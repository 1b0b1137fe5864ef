"""Dataset manifests: schema, canonical identity, invariant I1, corruption detection."""

from __future__ import annotations

import json
import unicodedata
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from support.manifests import unsealed
from warpdata.core.canonical import canonical_json
from warpdata.core.errors import DataError, LocalPathError, ManifestCorruptedError, UsageError
from warpdata.registry.manifest import (
    Artifact,
    Binding,
    Manifest,
    ShardRef,
    Table,
    blob_key,
    normalize,
    validate_dataset_id,
    version_hash_of,
)

GOLDEN = Path(__file__).parents[1] / "golden" / "registry"
H = [f"{i:064x}" for i in range(1, 10)]


def sample_manifest(**metadata) -> Manifest:
    return Manifest(
        dataset_id="vision/coco-mini",
        tables={"main": Table(
            shards=(ShardRef(H[0], 1000, row_count=10), ShardRef(H[1], 2000, row_count=20)),
            schema={"fields": [{"name": "image", "type": "string", "nullable": False},
                               {"name": "label", "type": "int64", "nullable": True}]})},
        artifacts={"raw": Artifact(shards=(ShardRef(H[2], 4096, member_count=30),),
                                   index=ShardRef(H[3], 300, format="warp-tar-index-1"), member_count=30)},
        bindings=(Binding("main", "image", "raw", "image"),),
        metadata=metadata,
    )


def test_golden_manifest_hash_is_stable():
    """The committed golden manifest still hashes to its committed version: identity is stable across runs."""
    data = (GOLDEN / "manifest-v1.json").read_bytes()
    expected = (GOLDEN / "manifest-v1.version").read_text().strip()
    m = Manifest.from_bytes(data, expected_hash=expected)
    assert m.version_hash == expected
    assert unsealed(sample_manifest(created_at="2025-01-01T00:00:00Z").to_bytes()) == data  # the golden predates the seal


def test_roundtrip_and_blobs():
    m = sample_manifest()
    back = Manifest.from_bytes(m.to_bytes())
    assert back == m and back.to_bytes() == m.to_bytes()
    assert [b.hash for b in m.blobs()] == H[:4]
    assert m.stats == {"total_rows": 30, "total_bytes": 1000 + 2000 + 4096 + 300}
    assert m.tables["main"].shards[0].uri == blob_key(H[0]) == f"blobs/sha256/00/{H[0]}"


def test_metadata_is_not_hashed():
    a = sample_manifest(created_at="2025-01-01T00:00:00Z", note="x")
    b = sample_manifest(created_at="2026-06-06T12:00:00Z")
    assert a.version_hash == b.version_hash
    assert a.to_bytes() != b.to_bytes()


def test_content_changes_hash():
    a = sample_manifest()
    b = Manifest(dataset_id="vision/coco-mini", tables={"main": Table(shards=(ShardRef(H[0], 1000, row_count=11),))})
    c = Manifest(dataset_id="vision/coco-mini", tables={"main": Table(shards=(ShardRef(H[0], 1000, row_count=10),))})
    assert len({a.version_hash, b.version_hash, c.version_hash}) == 3


def test_shard_order_matters_binding_order_does_not():
    s0, s1 = ShardRef(H[0], 1, row_count=1), ShardRef(H[1], 1, row_count=1)
    t = {"t": Table(shards=(s0, s1), schema={"fields": [{"name": "a", "type": "string", "nullable": True},
                                                         {"name": "b", "type": "string", "nullable": True}]})}
    arts = {"x": Artifact(shards=(ShardRef(H[2], 5),))}
    b1, b2 = Binding("t", "a", "x", "image"), Binding("t", "b", "x", "file")
    m1 = Manifest("w/d", tables=t, artifacts=arts, bindings=(b1, b2))
    m2 = Manifest("w/d", tables=t, artifacts=arts, bindings=(b2, b1))
    m3 = Manifest("w/d", tables={"t": Table(shards=(s1, s0), schema=t["t"].schema)}, artifacts=arts, bindings=(b1,))
    assert m1.version_hash == m2.version_hash
    assert m1.version_hash != m3.version_hash


@pytest.mark.parametrize("uri", [
    "file:///home/user/data.parquet", "/home/user/data.parquet", "~/data/x.parquet",
    "C:\\data\\x.parquet", "blobs/../../etc/passwd", "data\\x.parquet", "ftp+local://x",
])
def test_local_paths_rejected(uri):
    m = Manifest("w/d", tables={"t": Table(shards=(ShardRef(H[0], 1, uri=uri, row_count=1),))})
    with pytest.raises(LocalPathError, match="invariant I1") as e:
        m.to_bytes()
    assert isinstance(e.value, DataError)
    assert "$.tables.t.shards[0].uri" in str(e.value)


@pytest.mark.parametrize("uri", ["s3://bucket/x.parquet", "https://host/x.parquet", "blobs/sha256/00/" + H[0]])
def test_remote_and_relative_uris_allowed(uri):
    m = Manifest("w/d", tables={"t": Table(shards=(ShardRef(H[0], 1, uri=uri, row_count=1),))})
    Manifest.from_bytes(m.to_bytes())


def test_local_path_in_metadata_rejected():
    with pytest.raises(LocalPathError, match=r"\$\.metadata\.source"):
        sample_manifest(source="/home/alice/datasets/coco").to_bytes()


def test_local_path_rejected_on_read():
    doc = json.loads(sample_manifest().to_bytes())
    doc["tables"]["main"]["shards"][0]["uri"] = "file:///tmp/x.parquet"
    doc["version_hash"] = version_hash_of(doc)
    with pytest.raises(LocalPathError):
        Manifest.from_dict(doc)


@pytest.mark.parametrize("bad", ["Vision/coco", "vision", "vision/coco/x", "vision/co co", "", "a/b.c"])
def test_bad_dataset_ids(bad):
    with pytest.raises(UsageError, match="workspace/name"):
        validate_dataset_id(bad)


def test_tampered_manifest_detected():
    doc = json.loads(sample_manifest().to_bytes())
    doc["tables"]["main"]["shards"][0]["row_count"] = 999
    with pytest.raises(ManifestCorruptedError, match="hash mismatch"):
        Manifest.from_bytes(canonical_json(doc))


def test_wrong_expected_hash_detected():
    m = sample_manifest()
    with pytest.raises(ManifestCorruptedError, match="hash mismatch"):
        Manifest.from_bytes(m.to_bytes(), expected_hash=H[5])


@pytest.mark.parametrize("mutate, match", [
    (lambda d: d.pop("tables"), "'tables' is a required property"),
    (lambda d: d.__setitem__("extra", 1), "Additional properties"),
    (lambda d: d["tables"]["main"].__setitem__("format", "csv"), "'csv' is not one of"),
    (lambda d: d["bindings"][0].__setitem__("ref_type", "pdf"), "'pdf' is not one of"),
    (lambda d: d["bindings"][0].__setitem__("artifact", "nope"), "names artifact 'nope'"),
    (lambda d: d["bindings"][0].__setitem__("column", "nope"), "binds column 'nope'"),
    (lambda d: d["stats"].__setitem__("created_at", "2025-01-01"), "created_at"),
    (lambda d: d["tables"]["main"]["shards"][0].__setitem__("hash", "XYZ"), "does not match"),
])
def test_schema_violations(mutate, match):
    doc = json.loads(sample_manifest().to_bytes())
    mutate(doc)
    if "version_hash" in doc:
        doc["version_hash"] = version_hash_of(doc)
    with pytest.raises(ManifestCorruptedError, match=match):
        Manifest.from_dict(doc)


@pytest.mark.parametrize("data", [b"", b"{", b"[]", b"\xff\xfe", b'{"kind": "dataset"}'])
def test_garbage_is_corrupted(data):
    with pytest.raises(ManifestCorruptedError):
        Manifest.from_bytes(data)


# -- properties --------------------------------------------------------------

json_scalars = st.one_of(st.none(), st.booleans(), st.integers(-2**40, 2**40),
                         st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=8))
json_values = st.recursive(json_scalars, lambda c: st.one_of(
    st.lists(c, max_size=4), st.dictionaries(st.text(max_size=6), c, max_size=4)), max_leaves=12)


def _shuffled(value, rnd):
    if isinstance(value, dict):
        items = list(value.items())
        rnd.shuffle(items)
        return {k: _shuffled(v, rnd) for k, v in items}
    if isinstance(value, list):
        return [_shuffled(v, rnd) for v in value]
    return value


@given(doc=st.dictionaries(st.text(max_size=6), json_values, max_size=6), rnd=st.randoms())
def test_canonicalization_deterministic(doc, rnd):
    """Key order never changes the identity; normalising twice changes nothing."""
    assert version_hash_of(doc) == version_hash_of(_shuffled(doc, rnd))
    assert normalize(normalize(doc)) == normalize(doc)
    assert canonical_json(normalize(doc)) == canonical_json(normalize(_shuffled(doc, rnd)))


@given(s=st.text(max_size=10), n=st.integers(-2**50, 2**50))
def test_normalized_types(s, n):
    """NFC/NFD spellings and int/integral-float spellings hash the same."""
    a = {"k": unicodedata.normalize("NFD", s), "n": float(n) if abs(n) < 2**53 else n}
    b = {"k": unicodedata.normalize("NFC", s), "n": n}
    assert version_hash_of(a) == version_hash_of(b)


shard_st = st.builds(lambda h, size, rows: ShardRef(f"{h:064x}", size, row_count=rows),
                     st.integers(0, 2**64), st.integers(0, 2**40), st.integers(0, 2**31))
names = st.from_regex(r"[a-z][a-z0-9_]{0,8}", fullmatch=True)


@given(tables=st.dictionaries(names, st.lists(shard_st, max_size=4), max_size=3),
       meta=st.dictionaries(names, st.text(alphabet="abc", max_size=5), max_size=3))
def test_version_hash_stable_roundtrip(tables, meta):
    """Writing, re-reading and re-writing a manifest never changes its bytes or its version."""
    m = Manifest("ws/ds", tables={k: Table(shards=tuple(v)) for k, v in tables.items()}, metadata=meta)
    data = m.to_bytes()
    back = Manifest.from_bytes(data, expected_hash=m.version_hash)
    assert back.version_hash == m.version_hash
    assert back.to_bytes() == data
    stripped = Manifest("ws/ds", tables={k: Table(shards=tuple(v)) for k, v in tables.items()})
    assert stripped.version_hash == m.version_hash


def test_read_affecting_metadata_is_hashed_in_format_3():
    """Issue #3: metadata.default_table (and sources) decide what readers open, so the version hash covers them."""
    plain = sample_manifest(created_at="2025-01-01T00:00:00Z")
    assert plain.to_dict()["format_version"] == 1
    a = sample_manifest(default_table="main", created_at="2025-01-01T00:00:00Z")
    b = sample_manifest(default_table="main", created_at="2026-06-06T00:00:00Z", description="other")
    assert a.to_dict()["format_version"] == 3
    assert a.version_hash == b.version_hash != plain.version_hash  # the envelope stays outside
    doc = json.loads(a.to_bytes())
    doc["metadata"]["default_table"] = "other"
    doc["tables"]["other"] = doc["tables"]["main"]
    with pytest.raises(ManifestCorruptedError, match="hash mismatch"):
        Manifest.from_dict(doc, expected_hash=a.version_hash)
    doc = json.loads(a.to_bytes())
    doc["metadata"]["sources"] = [{"artifact": "raw", "kind": "tensor-warehouse"}]
    with pytest.raises(ManifestCorruptedError, match="hash mismatch"):
        Manifest.from_dict(doc, expected_hash=a.version_hash)
    doc = json.loads(a.to_bytes())
    doc["metadata"]["created_at"] = "1999-01-01T00:00:00Z"  # the envelope: not read-affecting, but sealed
    with pytest.raises(ManifestCorruptedError, match="seal"):
        Manifest.from_dict(doc, expected_hash=a.version_hash)
    doc["metadata"].pop("seal_sha256")  # as written before the seal: the version still checks
    assert Manifest.from_dict(doc, expected_hash=a.version_hash).version_hash == a.version_hash


def test_older_manifest_with_unhashed_read_metadata_is_refused():
    doc = json.loads(sample_manifest().to_bytes())
    doc["metadata"] = {"default_table": "main"}
    doc["version_hash"] = version_hash_of(doc)  # format 1: the old rule left metadata out
    with pytest.raises(ManifestCorruptedError, match="older warp") as ei:
        Manifest.from_dict(doc)
    assert ei.value.exit_code == 65 and "republish" in ei.value.hint


def test_default_table_must_name_a_table():
    doc = json.loads(sample_manifest(default_table="main").to_bytes())
    doc["metadata"]["default_table"] = "nope"
    doc["version_hash"] = version_hash_of(doc)
    with pytest.raises(ManifestCorruptedError, match="default_table"):
        Manifest.from_dict(doc)
