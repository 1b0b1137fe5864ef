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


def _publish(tmp_path, forge, paged: bool = False) -> str:
    """A one-shard table published with its stats ``forge``d (``paged``: 100-row pages, a page
    index in the stats)."""
    from warpdata.formats import parquet_index

    store = Store(tmp_path / "store")
    p = tmp_path / "t.parquet"
    write = {"row_group_size": 1000, "write_page_index": True, "max_rows_per_page": 100} if paged \
        else {"row_group_size": 500}
    pq.write_table(pa.table({"id": list(range(2000)), "label": [f"l{i % 3}" for i in range(2000)]}), p, **write)
    st = shard_stats(pq.read_metadata(p), footer_size_of(str(p)))
    if paged:
        st["page_index"] = parquet_index.of_file(str(p))
    st = forge(st)
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


def _paged(tmp_path, forge) -> str:
    return _publish(tmp_path, forge, paged=True)


def test_an_honest_page_index_verifies(cli, tmp_path, monkeypatch):
    monkeypatch.setenv("WARP_STORE", _paged(tmp_path, lambda st: st))
    r = cli("inspect", "ws/forged", "--verify")
    assert r.code == 0, r.err


def test_a_forged_page_index_is_named_by_verify(cli, tmp_path, monkeypatch):
    """Page locations moved by one page (the reader would decode another page's rows): the
    manifest's hash covers them, so only a comparison with the shard's bytes can tell."""
    from warpdata.formats import parquet_index
    from warpdata.formats.parquet_pages import Page

    def forge(st):
        index = parquet_index.decode(st["page_index"])
        pages = [list(c) for c in index.pages[0]]
        p0 = pages[0]
        pages[0] = [Page(p0[0].offset, p0[0].size, 0)] + [Page(p.offset, p.size, p.first_row + 1) for p in p0[1:]]
        st["page_index"] = parquet_index.to_text(parquet_index.encode(
            index.footer, [pages] + [list(c) for c in index.pages[1:]]))
        return st

    monkeypatch.setenv("WARP_STORE", _paged(tmp_path, forge))
    r = cli("inspect", "ws/forged", "--verify")
    assert r.code == 1, (r.code, r.err)
    assert "table main shard 0: the page index of row group 0 column 0 is not the shard's offset index" in r.err


def test_a_page_index_that_does_not_decode_is_a_corrupted_manifest(cli, tmp_path, monkeypatch):
    import base64

    import zstandard

    def forge(st):
        st["page_index"] = base64.b64encode(zstandard.ZstdCompressor().compress(b"WPI1" + bytes(40))).decode()
        return st

    monkeypatch.setenv("WARP_STORE", _paged(tmp_path, forge))
    r = cli("stream", "ws/forged", "--shard", "1/4")
    assert r.code == 65, (r.code, r.err)
    assert "page index" in r.err and "republish" in r.err, r.err
