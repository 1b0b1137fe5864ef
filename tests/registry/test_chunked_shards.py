"""Chunked tar shards (format 5; docs/formats/registry.md, "Chunked shards"): golden manifest, cut
points from the TWH1 header, and refusal of chunk lists that do not describe their shard."""

from __future__ import annotations

import hashlib
import json
import os
import struct
import zlib
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from warpdata.core.errors import ManifestCorruptedError
from warpdata.registry.chunks import (
    chunk_ranges,
    hash_chunks,
    member_chunks,
    run_lengths,
    twh1_items,
)
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


def _as_tar_member(tmp_path: Path, data: bytes) -> tuple[Path, int]:
    """``data`` between a 512-byte header block and 1,024 bytes of end blocks, as tarpack stores a
    member alone in its shard."""
    p = tmp_path / "shard.tar"
    p.write_bytes(b"h" * 512 + data + b"\0" * 1024)
    return p, 512 + len(data) + 1024


def _expect(path: Path, lengths: list[int]) -> list[tuple[str, int]]:
    raw, out, pos = path.read_bytes(), [], 0
    for n in lengths:
        out.append((hashlib.sha256(raw[pos:pos + n]).hexdigest(), n))
        pos += n
    assert pos == len(raw)
    return out


@pytest.mark.parametrize("name, item", [("small_u8.twh1", 1), ("small_f16.twh1", 2), ("small_f32.twh1", 4)])
def test_chunks_fall_on_sample_images_of_the_golden_twh1_shards(tmp_path, name, item):
    data = (GOLDEN / "twh1" / name).read_bytes()
    (n,) = struct.unpack_from("<Q", data, 32)
    w, h, c = struct.unpack_from("<III", data, 16)
    (image_off,) = struct.unpack_from("<Q", data, 40)
    one = w * h * c * item
    path, total = _as_tar_member(tmp_path, data)
    tail = total - 512 - image_off - n * one
    # an image at least the target: head, one chunk per image, tail
    got = member_chunks(path, data[:80], 512, len(data), total, target=one)
    assert got == _expect(path, [512 + image_off, *[one] * n, tail])
    # two images a chunk on average: runs end where each image's CRC-32 says
    imgs = [data[image_off + j * one:image_off + (j + 1) * one] for j in range(n)]
    runs = run_lengths([zlib.crc32(b) for b in imgs], 2)
    assert sum(runs) == n and max(runs) <= 4
    assert member_chunks(path, data[:80], 512, len(data), total, target=2 * one) == \
        _expect(path, [512 + image_off, *[r * one for r in runs], tail])
    # not a TWH1 header, or a member too short for its images: not chunked
    assert member_chunks(path, b"TBL\x02" + data[4:80], 512, len(data), total) is None
    assert twh1_items(data[:80], image_off + one) is None
    assert member_chunks(path, data[:80], 512, len(data), total, target=0) is None


def test_a_run_ends_at_every_item_when_an_item_fills_the_target():
    assert run_lengths([5, 7, 9], 1) == [1, 1, 1]
    assert run_lengths([1, 1, 1, 1, 1], 2) == [1, 1, 1, 1, 1]  # 1 % 2 == 1: every item ends a run
    assert run_lengths([0] * 9, 2) == [4, 4, 1]  # no item ends a run: cut at 2k


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 2**32 - 1), min_size=2, max_size=200), st.integers(2, 8), st.data())
def test_removing_an_item_moves_no_run_after_the_next_content_boundary(crcs, k, data):
    """The property deletions rely on: a run that begins after the first item past the removed one
    whose CRC ends a run holds the same items before and after the removal."""
    i = data.draw(st.integers(0, len(crcs) - 1))
    ids = list(range(len(crcs)))

    def runs(seq):
        out, pos = [], 0
        for n in run_lengths([crcs[j] for j in seq], k):
            out.append(tuple(seq[pos:pos + n]))
            pos += n
        return out

    before, after = runs(ids), runs(ids[:i] + ids[i + 1:])
    b = next((j for j in ids[i + 1:] if crcs[j] % k == k - 1), None)
    if b is None:
        return
    tail = [r for r in before if r[0] > b]
    if tail:
        assert after[len(after) - len(tail):] == tail


def test_hash_chunks_reads_each_range_once(tmp_path):
    p = tmp_path / "blob"
    data = os.urandom(10_000)
    p.write_bytes(data)
    ranges = chunk_ranges([1000, 4000, 9999], len(data))
    assert hash_chunks(p, ranges) == [(hashlib.sha256(data[a:a + n]).hexdigest(), n) for a, n in ranges]


@pytest.mark.parametrize("name", ["v1-small.wfs", "v1-empty.wfs"])
def test_chunks_fall_on_records_of_the_golden_wfs1_shards(tmp_path, name):
    from warpdata.registry.chunks import wfs1_items

    data = (GOLDEN / "featshard" / name).read_bytes()
    flags, r, data_off = struct.unpack_from("<H", data, 6)[0], *struct.unpack_from("<IQ", data, 12)
    (n,) = struct.unpack_from("<Q", data, len(data) - 24)
    path, total = _as_tar_member(tmp_path, data)
    got = member_chunks(path, data[:64], 512, len(data), total, target=r)
    if n == 0:
        assert got is None  # nothing to cut: stored whole
        return
    assert got == _expect(path, [512 + data_off, *[r] * n, total - 512 - data_off - n * r])
    recs = [data[data_off + j * r:data_off + (j + 1) * r] for j in range(n)]
    runs = run_lengths([zlib.crc32(b) for b in recs], 10)
    assert member_chunks(path, data[:64], 512, len(data), total, target=10 * r) == \
        _expect(path, [512 + data_off, *[x * r for x in runs], total - 512 - data_off - n * r])
    assert wfs1_items(data[:64], len(data) - 1) is None  # a length the records do not fill
    assert flags in (0, 1)


@pytest.mark.parametrize("items_per_read", [1, 2, 3, 7])
def test_chunks_are_the_same_whatever_a_read_brings_in(tmp_path, monkeypatch, items_per_read):
    """Runs and hashes do not depend on where the reads of 8 MiB (here: a few items) fall."""
    from warpdata.registry import chunks

    data = (GOLDEN / "twh1" / "small_u8.twh1").read_bytes()
    w, h, c = struct.unpack_from("<III", data, 16)
    path, total = _as_tar_member(tmp_path, data)
    want = {t: member_chunks(path, data[:80], 512, len(data), total, target=t) for t in (w * h * c, 3 * w * h * c)}
    monkeypatch.setattr(chunks, "_READ", items_per_read * w * h * c)
    for t, expected in want.items():
        assert member_chunks(path, data[:80], 512, len(data), total, target=t) == expected


def test_content_runs_over_many_reads_of_a_synthetic_shard(tmp_path, monkeypatch):
    from warpdata.registry import chunks

    n, one = 50, 100
    end = 80 + n * one
    head = chunks._HEADER.pack(b"TWH1", 1, 2, 0, 10, 10, 1, 0, n, 80, end, end, end, end)
    imgs = [os.urandom(one) for _ in range(n)]
    data = head + b"".join(imgs) + b"t" * 100
    path, total = _as_tar_member(tmp_path, data)
    runs = run_lengths([zlib.crc32(b) for b in imgs], 3)
    assert len(runs) > 5
    want = _expect(path, [512 + 80, *[r * one for r in runs], total - 512 - end])
    for per_read in (1, 2, 3, 7, 64):
        monkeypatch.setattr(chunks, "_READ", per_read * one)
        assert member_chunks(path, data[:80], 512, len(data), total, target=3 * one) == want
