"""Peer side of bench/refs_bench.py: run ONLY with the peer's interpreter (PyPI warpdata 3.0.27 in
its own venv, e.g. /work/peer-venv/bin/python), never with warp's: the peer installs a module also
called ``warpdata``.

  publish MEDIA_DIR PARQUET S3_BASE SHARD_BYTES   publish dataset bench/refs with column image bound
  read N_EPOCHS BATCH PARQUET                      ref.read_bytes() over every row, once per epoch;
                                                   prints one JSON line {"epochs": [refs/s, ...]}

S3 endpoint and credentials come from the environment (WARPDATASETS_S3_ENDPOINT_URL, AWS_*).
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path


def publish(media: str, parquet: str, base: str, shard_bytes: int) -> None:
    from warpdata.publish.builder import ManifestBuilder
    from warpdata.publish.packer import pack_directory_to_tar_shards
    from warpdata.publish.storage import S3Storage
    from warpdata.publish.uploader import Uploader

    tmp = Path(tempfile.mkdtemp(prefix="peer-pack-"))
    shards = pack_directory_to_tar_shards(Path(media), tmp, shard_size_bytes=shard_bytes)
    b = ManifestBuilder("bench/refs", base, temp_dir=tmp)
    b.add_table("main", [Path(parquet)])
    b.add_artifact("media", shards)
    b.add_binding("main", "image", "media", media_type="image")
    plan = b.build_plan()
    # 3.0.27's builder stores the manifest under the hash of its placeholder draft while latest.json
    # names the final manifest's hash; store it under the name the reader looks up
    import dataclasses

    plan = dataclasses.replace(plan, manifest_uri=b._manifest_uri(plan.manifest.version_hash))
    storage = S3Storage(region="us-east-1", endpoint_url=os.environ["WARPDATASETS_S3_ENDPOINT_URL"])
    res = Uploader(storage).execute_plan(plan)
    if not res.success:
        raise SystemExit(f"peer publish failed: {res.errors}")
    print(json.dumps({"version": res.version_hash, "shards": len(shards)}))


def read(epochs: int, batch: int, parquet: str) -> None:
    """The peer's refs, made as its ``batch_dicts(wrap_refs=True)`` makes them (ArtifactResolver +
    create_ref per batch). The member paths come from the table file read locally: the peer's table
    reader needs DuckDB's httpfs extension, which it downloads at run time (no network here)."""
    import pyarrow.parquet as pq
    import warpdata as wd
    from warpdata.artifacts.resolver import ArtifactResolver
    from warpdata.read.refs.factory import create_ref

    members = pq.read_table(parquet, columns=["image"]).column(0).to_pylist()
    rates = []
    for _ in range(epochs):
        t0 = time.perf_counter()
        n = 0
        t = wd.dataset("bench/refs").table("main")
        resolver = ArtifactResolver(t.manifest, cache_context=t._cache_context, settings=t._settings)
        for k in range(0, len(members), batch):
            refs = [create_ref(artifact_name="media", ref_value=v, media_type="image", resolver=resolver)
                    for v in members[k:k + batch]]
            for ref in refs:
                ref.read_bytes()
                n += 1
        rates.append(n / (time.perf_counter() - t0))
    print(json.dumps({"epochs": rates, "refs": n}))


if __name__ == "__main__":
    if sys.argv[1] == "publish":
        publish(sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5]))
    else:
        read(int(sys.argv[2]), int(sys.argv[3]), sys.argv[4])
