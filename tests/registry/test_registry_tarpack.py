"""Deterministic tar shards and the member index (docs/formats/registry.md)."""

from __future__ import annotations

import hashlib
import os
import tarfile
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from warpdata.core.errors import ManifestCorruptedError
from warpdata.registry.tarpack import ArtifactIndex, list_members, pack_files, read_member_from_tar


def _tree(root, files: dict[str, bytes]) -> None:
    for name, data in files.items():
        p = root / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)


def test_shards_deterministic_and_indexed(tmp_path):
    files = {f"d{i % 3}/f{i:03d}.bin": os.urandom(100 + 37 * i) for i in range(40)}
    files["ünïcode name with spaces.txt"] = b"hello"
    files["x" * 150 + ".jpg"] = b"long name"  # longer than ustar's 100 chars: pax header
    _tree(tmp_path / "a", files)
    _tree(tmp_path / "b", files)
    os.utime(tmp_path / "b" / "d0" / "f000.bin", (1, 1))  # mtimes must not matter
    ra = pack_files(list_members(tmp_path / "a"), tmp_path / "oa", target_size=4096)
    rb = pack_files(list_members(tmp_path / "b"), tmp_path / "ob", target_size=4096)
    assert [s.hash for s in ra.shards] == [s.hash for s in rb.shards]
    assert ra.index == rb.index and ra.index_hash == rb.index_hash
    assert len(ra.shards) > 3
    assert ra.member_count == len(files) == sum(s.member_count for s in ra.shards)
    idx = ArtifactIndex.from_bytes(ra.index)
    shard_bytes = {s.hash: Path(s.path).read_bytes() for s in ra.shards}
    for s in ra.shards:
        assert hashlib.sha256(shard_bytes[s.hash]).hexdigest() == s.hash
        assert s.byte_size == len(shard_bytes[s.hash])
    for name, data in files.items():
        h, off, ln = idx.lookup(name)
        assert shard_bytes[h][off:off + ln] == data  # exact ranged read
        assert read_member_from_tar(shard_bytes[h], name) == data  # and plain tarfile agrees
    with tarfile.open(ra.shards[0].path) as t:
        m = t.getmembers()[0]
        assert (m.mtime, m.uid, m.gid, m.uname, m.mode) == (0, 0, 0, "", 0o644)


def test_big_member_gets_own_shard(tmp_path):
    _tree(tmp_path / "s", {"a": b"1" * 10, "b": b"2" * 50_000, "c": b"3" * 10})
    r = pack_files(list_members(tmp_path / "s"), tmp_path / "o", target_size=8192)
    assert [s.member_count for s in r.shards] == [1, 1, 1]


def test_listed_files_only(tmp_path):
    _tree(tmp_path / "s", {"keep/a": b"a", "skip": b"s", "manifest.json": b"{}"})
    ms = list_members(tmp_path / "s", ["manifest.json", "keep/a"])
    assert [m[0] for m in ms] == ["keep/a", "manifest.json"]
    with pytest.raises(Exception, match="not a path inside"):
        list_members(tmp_path / "s", ["../etc/passwd"])
    with pytest.raises(FileNotFoundError):
        list_members(tmp_path / "s", ["nope"])


def test_temp_leftovers_are_not_content(tmp_path):
    _tree(tmp_path / "s", {"a": b"a", ".warp-tmp-123-x": b"partial"})
    assert [m[0] for m in list_members(tmp_path / "s")] == ["a"]


@pytest.mark.parametrize("data", [b"", b"{}", b'{"format": "warp-tar-index-1", "shards": ["zz"], "members": {}}',
                                  b'{"format": "warp-tar-index-1", "shards": [], "members": {"a": [0, 0, 1]}}',
                                  b'{"format": "other", "shards": [], "members": {}}'])
def test_bad_index(data):
    with pytest.raises(ManifestCorruptedError):
        ArtifactIndex.from_bytes(data)


@given(files=st.dictionaries(st.from_regex(r"[a-z]{1,6}(/[a-z0-9]{1,6}){0,2}\.[a-z]{1,3}", fullmatch=True),
                             st.binary(max_size=3000), min_size=1, max_size=12),
       target=st.integers(1024, 20_000))
def test_pack_roundtrip(tmp_path_factory, files, target):
    names = sorted(files)
    # a name that is also a directory prefix of another cannot exist on disk
    files = {n: files[n] for n in names if not any(o.startswith(n + "/") for o in names)}
    root = tmp_path_factory.mktemp("src")
    _tree(root, files)
    r = pack_files(list_members(root), tmp_path_factory.mktemp("out"), target_size=target)
    idx = ArtifactIndex.from_bytes(r.index)
    blobs = {s.hash: Path(s.path).read_bytes() for s in r.shards}
    assert len(idx) == len(files)
    for name, data in files.items():
        h, off, ln = idx.lookup(name)
        assert blobs[h][off:off + ln] == data
