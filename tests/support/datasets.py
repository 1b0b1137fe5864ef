"""Helpers for the read-API tests: publish small real datasets into a store.

Publishing goes through the registry's own Store / Manifest / tarpack API
(the same calls ``warp publish`` makes), so the reader is tested against
exactly what the publisher writes. No tests live here.
"""

from __future__ import annotations

import hashlib
import io
import os
import wave
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from warpdata.registry.manifest import INDEX_FORMAT, Artifact, Binding, Manifest, ShardRef, Table
from warpdata.registry.parquet_stats import footer_size_of, shard_stats
from warpdata.registry.store import Store
from warpdata.registry.tarpack import list_members, pack_files


def make_rows(n: int, start: int = 0, *, image_every: int | None = None, payload: int = 100) -> pa.Table:
    ids = np.arange(start, start + n, dtype=np.int64)
    cols = {
        "id": ids,
        "x": (ids * 0.5).astype(np.float64),
        "label": pa.array([f"label-{i % 7}" for i in ids]),
        # incompressible, so shards are large enough that footer/range reads are visibly partial
        "payload": pa.array([np.random.default_rng(int(i)).bytes(payload) for i in ids], pa.binary()),
    }
    if image_every:
        cols["image"] = pa.array([f"img/{i % image_every:04d}.png" for i in ids])
        cols["audio"] = pa.array([f"snd/{i % 3}.wav" for i in ids])
    return pa.table(cols)


def write_media(root: Path, n_images: int) -> None:
    from PIL import Image

    (root / "img").mkdir(parents=True, exist_ok=True)
    (root / "snd").mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    for i in range(n_images):
        arr = rng.integers(0, 255, (8 + i % 5, 10, 3), dtype=np.uint8)
        Image.fromarray(arr).save(root / "img" / f"{i:04d}.png")
    for i in range(3):
        b = io.BytesIO()
        with wave.open(b, "wb") as w:
            w.setnchannels(1)
            w.setsampwidth(2)
            w.setframerate(8000 + 1000 * i)
            w.writeframes((np.arange(400, dtype=np.int16) * (i + 1)).tobytes())
        (root / "snd" / f"{i}.wav").write_bytes(b.getvalue())


def publish(store_url: str, name: str, tables: dict[str, list[pa.Table]], tmp: Path, *,
            row_group_size: int = 1000, media: Path | None = None, tar_target: int = 4096,
            compression: str = "zstd", stats: bool = True) -> Manifest:
    """Publish ``tables`` (and ``media`` as artifact ``media``); ``stats=False`` writes a format-1
    manifest without shard statistics, as warp did before they existed."""
    store = Store(store_url)
    stage = tmp / "stage"
    stage.mkdir(parents=True, exist_ok=True)
    mtables = {}
    for tname, parts in tables.items():
        refs = []
        for k, part in enumerate(parts):
            p = stage / f"{tname}-{k}.parquet"
            pq.write_table(part, p, row_group_size=row_group_size, compression=compression)
            h = hashlib.sha256(p.read_bytes()).hexdigest()
            store.put_blob_file(h, p)
            st = shard_stats(pq.read_metadata(p), footer_size_of(str(p))) if stats else None
            refs.append(ShardRef(hash=h, byte_size=p.stat().st_size, row_count=part.num_rows, stats=st))
        fields = [{"name": f.name, "type": str(f.type), "nullable": f.nullable} for f in parts[0].schema]
        mtables[tname] = Table(shards=tuple(refs), schema={"fields": fields})
    artifacts, bindings = {}, []
    if media is not None:
        packed = pack_files(list_members(media), stage / "tar", target_size=tar_target)
        for s in packed.shards:
            store.put_blob_file(s.hash, s.path)
        store.put_blob(packed.index_hash, packed.index)
        artifacts["media"] = Artifact(
            shards=tuple(ShardRef(hash=s.hash, byte_size=s.byte_size, member_count=s.member_count)
                         for s in packed.shards),
            index=ShardRef(hash=packed.index_hash, byte_size=len(packed.index), format=INDEX_FORMAT),
            member_count=packed.member_count)
        bindings = [Binding("main", "image", "media", "image"), Binding("main", "audio", "media", "audio")]
    m = Manifest(dataset_id=name, tables=mtables, artifacts=artifacts, bindings=tuple(bindings))
    store.put_manifest(m)
    store.set_latest(name, m.version_hash)
    return m


def range_bytes(requests: list[dict]) -> int:
    """Bytes requested by ranged GETs (``Range: bytes=a-b``)."""
    total = 0
    for r in requests:
        rng = r.get("range")
        if r["method"] == "GET" and rng and rng.startswith("bytes="):
            a, _, b = rng[6:].partition("-")
            total += int(b) - int(a) + 1
    return total


def file_size(p: str | os.PathLike) -> int:
    return os.stat(p).st_size
