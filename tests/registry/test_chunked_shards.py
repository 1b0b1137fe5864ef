"""Chunked tar shards (format 5; docs/formats/registry.md, "Chunked shards"): golden manifest, cut
points from the TWH1 header, and refusal of chunk lists that do not describe their shard."""

from __future__ import annotations

import hashlib
import json
import os
import struct
from pathlib import Path

import pytest
from warpdata.core.errors import ManifestCorruptedError
from warpdata.registry.chunks import chunk_ranges, hash_chunks, twh1_cuts
from warpdata.registry.manifest import Artifact, Manifest, ShardRef, Table

GOLDEN = Path(__file__).parents[1] / "golden"
H = [f"{i:064x}" for i in range(1, 12)]


def chunked_manifest() -> Manifest:
    return Manifest(
        dataset_id="vision/wh",
        tables={"samples": Table(shards=(ShardRef(H[0], 1000, row_count=10),),
                                 schema={"fields": [{"name": "key", "type": "string", "nullable": False}]})},
        artifacts={"tensor-warehouse": Artifact(
            shards=(ShardRef(H[1], 900, member_count=3),
                    ShardRef(H[2], 5120 + 3 * 1000 + 1536, member_count=1,
                             chunks=((H[3], 5120), (H[4], 1000), (H[5], 1000), (H[6], 1000), (H[7], 1536)))),
            index=ShardRef(H[8], 300, format="warp-tar-index-1"), member_count=4)},
        metadata={"created_at": "2026-12-07T00:00:00.000000Z",
                  "sources": [{"artifact": "tensor-warehouse", "kind": "tensor-warehouse", "tables": ["samples"]}]},
    )


def test_golden_format_5_manifest_reads_and_hashes_as_committed():
    data = (GOLDEN / "registry" / "manifest-v5.json").read_bytes()
    expected = (GOLDEN / "registry" / "manifest-v5.version").read_text().strip()
    m = Manifest.from_bytes(data, expected_hash=expected)
    assert m.to_bytes() == data == chunked_manifest().to_bytes()
    doc = json.loads(data)
    assert doc["format_version"] == 5
    shard = m.artifacts["tensor-warehouse"].shards[1]
    assert shard.chunks == chunked_manifest().artifacts["tensor-warehouse"].shards[1].chunks
    # the store holds the chunks, never the chunked shard itself; its hash stays its identity
    assert [b.hash for b in m.stored_blobs()] == [H[0], H[1], *H[3:8], H[8]]
    assert [b.hash for b in m.blobs()] == [H[0], H[1], H[2], H[8]]


@pytest.mark.parametrize("edit, match", [
    (lambda s: s["chunks"][0].__setitem__(1, 5121), "chunks hold"),
    (lambda s: s["chunks"][0].__setitem__(0, "x" * 64), "sha256 hex"),
    (lambda s: s.__setitem__("chunks", []), "sha256 hex"),
])
def test_a_chunk_list_that_does_not_describe_its_shard_is_refused(edit, match):
    from warpdata.registry.manifest import seal_of, version_hash_of

    doc = json.loads((GOLDEN / "registry" / "manifest-v5.json").read_bytes())
    edit(doc["artifacts"]["tensor-warehouse"]["shards"][1])
    doc["version_hash"] = version_hash_of(doc)
    doc["metadata"].pop("seal_sha256")
    doc["metadata"]["seal_sha256"] = seal_of(doc)
    with pytest.raises(ManifestCorruptedError, match=match):
        Manifest.from_dict(doc, source="edited")


def test_a_format_4_reader_rule_still_holds_without_chunks():
    m = chunked_manifest()
    plain = Manifest(m.dataset_id, tables=m.tables, metadata=m.metadata, artifacts={"tensor-warehouse": Artifact(
        shards=tuple(ShardRef(s.hash, s.byte_size, member_count=s.member_count)
                     for s in m.artifacts["tensor-warehouse"].shards),
        index=m.artifacts["tensor-warehouse"].index, member_count=4)})
    assert json.loads(plain.to_bytes())["format_version"] == 3
    assert plain.version_hash != m.version_hash


@pytest.mark.parametrize("name, item", [("small_u8.twh1", 1), ("small_f16.twh1", 2), ("small_f32.twh1", 4)])
def test_cuts_fall_on_sample_images_of_the_golden_twh1_shards(name, item):
    path = GOLDEN / "twh1" / name
    data = path.read_bytes()
    (n,) = struct.unpack_from("<Q", data, 32)
    w, h, c = struct.unpack_from("<III", data, 16)
    (image_off,) = struct.unpack_from("<Q", data, 40)
    one = w * h * c * item
    # as a tar member at offset 512 (one pax header block): head, one chunk per image, tail
    cuts = twh1_cuts(data[:80], 512, len(data), target=one)
    assert cuts == [512 + image_off + i * one for i in range(n)] + [512 + image_off + n * one]
    # two images a chunk
    two = twh1_cuts(data[:80], 512, len(data), target=2 * one)
    assert two == [512 + image_off + i * 2 * one for i in range(-(-n // 2))] + [512 + image_off + n * one]
    ranges = chunk_ranges(cuts, 512 + len(data) + 1024)
    assert sum(r[1] for r in ranges) == 512 + len(data) + 1024 and ranges[0] == (0, 512 + image_off)
    # not a TWH1 header, or a member too short for its images: not chunked
    assert twh1_cuts(b"TBL\x02" + data[4:80], 512, len(data)) is None
    assert twh1_cuts(data[:80], 512, image_off + one) is None


def test_hash_chunks_reads_each_range_once(tmp_path):
    p = tmp_path / "blob"
    data = os.urandom(10_000)
    p.write_bytes(data)
    ranges = chunk_ranges([1000, 4000, 9999], len(data))
    assert hash_chunks(p, ranges) == [(hashlib.sha256(data[a:a + n]).hexdigest(), n) for a, n in ranges]


@pytest.mark.parametrize("name", ["v1-small.wfs", "v1-empty.wfs"])
def test_cuts_fall_on_records_of_the_golden_wfs1_shards(name):
    from warpdata.registry.chunks import member_cuts, wfs1_cuts

    data = (GOLDEN / "featshard" / name).read_bytes()
    flags, r, data_off = struct.unpack_from("<H", data, 6)[0], *struct.unpack_from("<IQ", data, 12)
    (n,) = struct.unpack_from("<Q", data, len(data) - 24)
    cuts = member_cuts(data[:64], 512, len(data), target=r)
    if n == 0:
        assert cuts is None  # nothing to cut: stored whole
        return
    assert cuts == [512 + data_off + i * r for i in range(n)] + [512 + data_off + n * r]
    assert wfs1_cuts(data[:64], 512, len(data), target=10 * r) == [512 + data_off, 512 + data_off + n * r]
    assert wfs1_cuts(data[:64], 512, len(data) - 1) is None  # a length the records do not fill
    assert flags in (0, 1)
