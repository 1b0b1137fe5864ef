"""warp/read/refetch.py: a published shard failing its check is fetched again once; failing again names
the store object (docs/formats/registry.md, "Readers of published data: bad cached copies").

Through the feature cache's reader, the first of the systems' readers on the shared rule.
"""

from __future__ import annotations

import os

import pytest
from warpdata.core.errors import BlobCorruptedError
from warpdata.features.reader import ShardCache
from warpdata.features.writer import CacheSpec, build_cache
from warpdata.publishing.publish import PublishRequest, publish
from warpdata.registry.store import Store
from warpdata.sampledata.captions import generate as captions


def _flip(file: str, at: int) -> None:
    os.chmod(file, 0o644)
    with open(file, "r+b") as f:
        f.seek(at)
        b = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([b[0] ^ 0xFF]))


def test_a_shard_failing_again_after_its_one_refetch_names_the_store_object(tmp_path, monkeypatch):
    monkeypatch.setenv("WARP_STORE", str(tmp_path / "store"))
    monkeypatch.setenv("WARP_CACHE_DIR", str(tmp_path / "cache"))
    captions(tmp_path / "src", count=24, seed=4)
    build_cache(CacheSpec(source=str(tmp_path / "src"), output=str(tmp_path / "fc"), size=(128, 128),
                          shard_size=8), allow_invalid=True)
    publish(PublishRequest("ws/fc", from_paths=[str(tmp_path / "fc")]), store=Store(str(tmp_path / "store")))
    with ShardCache(tmp_path / "fc") as local:
        want = local.get(8)["pixels"]
    with ShardCache("ws/fc", verify="full", max_resident=1) as sc:
        rel = sc.shards[1]["path"]
        file, offset, length = sc._where(rel)
        assert sc._where(sc.shards[0]["path"])[0] != file  # shards of >= 256 KiB: a tar shard of their own
        _flip(file, offset + length // 2)
        assert (sc.get(8)["pixels"] == want).all()  # the bad copy was evicted and fetched again
        fresh, offset, length = sc._where(rel)
        _flip(fresh, offset + length // 3)  # the fresh copy goes bad too: it is not fetched a second time
        sc.get(0)  # shard 0 takes the one resident slot: shard 1 is mapped, and checked, again
        with pytest.raises(BlobCorruptedError) as ei:
            sc.get(8)
    e = ei.value
    assert e.exit_code == 65 and e.details["member"] == rel
    store_object = e.details["store_object"]
    assert os.path.basename(fresh) in store_object and f"{sc.path}/{rel}: fails its check" in e.message
    assert "publish it again" in e.hint
