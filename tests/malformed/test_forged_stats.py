"""Statistics that do not bound their data (issue 36): a manifest whose row-group min/max leave out
rows that are there makes a filter prune them. `warp inspect WS/NAME --verify` compares every
shard's statistics with its data and names the disagreement (exit 1)."""

from __future__ import annotations

import hashlib

import pyarrow as pa
import pyarrow.parquet as pq
from warpdata.registry.manifest import Manifest, ShardRef, Table
from warpdata.registry.parquet_stats import footer_size_of, shard_stats
from warpdata.registry.store import Store


def _publish(tmp_path, forge) -> str:
    store = Store(tmp_path / "store")
    p = tmp_path / "t.parquet"
    pq.write_table(pa.table({"id": list(range(2000)), "label": [f"l{i % 3}" for i in range(2000)]}), p,
                   row_group_size=500)
    st = forge(shard_stats(pq.read_metadata(p), footer_size_of(str(p))))
    h = hashlib.sha256(p.read_bytes()).hexdigest()
    store.put_blob_file(h, p)
    fields = [{"name": "id", "type": "int64", "nullable": True}, {"name": "label", "type": "string", "nullable": True}]
    m = Manifest(dataset_id="ws/forged", tables={"main": Table(
        shards=(ShardRef(hash=h, byte_size=p.stat().st_size, row_count=2000, stats=st),), schema={"fields": fields})})
    store.put_manifest(m)
    store.set_latest("ws/forged", m.version_hash)
    return str(tmp_path / "store")


def test_honest_statistics_verify(cli, tmp_path, monkeypatch):
    monkeypatch.setenv("WARP_STORE", _publish(tmp_path, lambda st: st))
    r = cli("inspect", "ws/forged", "--verify")
    assert r.code == 0, r.err


def test_forged_row_group_bounds_are_named(cli, tmp_path, monkeypatch):
    def forge(st):
        st["row_groups"][1]["columns"]["id"]["max"] = 600  # the group holds 500..999
        return st

    monkeypatch.setenv("WARP_STORE", _publish(tmp_path, forge))
    matching = cli("stream", "ws/forged", "--filter", "id BETWEEN 700 AND 900")
    assert matching.code == 0 and matching.out == ""  # what the forged bounds do to a filter
    r = cli("inspect", "ws/forged", "--verify")
    assert r.code == 1, (r.code, r.err)
    assert "table main shard 0 row group 1 column id: the manifest says max 600, the data holds 999" in r.err
