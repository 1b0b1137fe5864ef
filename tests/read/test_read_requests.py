"""What reading a published dataset costs on S3 (moto on 127.0.0.1, every request counted by the server).

Opening a dataset is the ``latest`` pointer and the manifest: two GETs, no HEAD. ``warp info`` and
``warp schema`` need nothing more (the manifest records each table's Arrow schema, format 4).
``warp head`` and ``warp stream --limit`` read the first shard's footer and the one row group that
holds their rows, never the rest of the table.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from support.datasets import make_rows, publish, range_bytes
from warpdata.publishing.publish import PublishRequest
from warpdata.publishing.publish import publish as warp_publish
from warpdata.read import dataset as dataset_module

pytestmark = pytest.mark.s3

ROWS_PER_GROUP = 2000
SHARD_ROWS = 8000


@pytest.fixture
def big(s3, tmp_path, monkeypatch):
    """``ws/big``, published by warp's own publisher: 2 shards of 4 row groups (~0.2 MB each,
    incompressible payload), so a whole-table read and a one-row-group read differ 8-fold."""
    data = tmp_path / "data"
    data.mkdir()
    files = []
    for k in range(2):
        p = data / f"part-{k}.parquet"
        pq.write_table(make_rows(SHARD_ROWS, k * SHARD_ROWS), p, row_group_size=ROWS_PER_GROUP)
        files.append(p)
    monkeypatch.setenv("WARP_STORE", s3.url("warp"))
    monkeypatch.setenv("WARP_CACHE_DIR", str(tmp_path / "cache"))
    # byte for byte: the spans below are the files' own (paged files: tests/read/test_read_pages.py)
    r = warp_publish(PublishRequest("ws/big", tables={"main": [str(data / "*.parquet")]}, layout="as-is"))
    dataset_module._MANIFESTS.clear()  # this process's memo of verified manifests: count from cold
    s3.reset_counts()
    return {"version": r.version_hash, "files": files, "bytes": sum(p.stat().st_size for p in files)}


def _blob_requests(s3):
    return s3.requests(key_prefix="warp/blobs/")


def _ranges(reqs) -> list[tuple[int, int]]:
    out = []
    for r in reqs:
        if r["method"] == "GET" and r["range"]:
            a, _, b = r["range"][6:].partition("-")
            out.append((int(a), int(b) + 1))
    return out


def _row_group_span(path, g: int) -> tuple[int, int]:
    """[first byte, end) of row group ``g``'s column chunks in the file."""
    rg = pq.read_metadata(path).row_group(g)
    cols = [rg.column(c) for c in range(rg.num_columns)]
    start = min(c.dictionary_page_offset or c.data_page_offset for c in cols)
    return start, max((c.dictionary_page_offset or c.data_page_offset) + c.total_compressed_size for c in cols)


def _footer_span(path) -> tuple[int, int]:
    from warpdata.registry.parquet_stats import footer_size_of

    size = path.stat().st_size
    return size - footer_size_of(str(path)), size


def _only_inside(reqs, spans) -> bool:
    return all(any(a >= s and b <= e for s, e in spans) for a, b in _ranges(reqs))


def _one_row_group_bytes(path) -> int:
    md = pq.read_metadata(path)
    rg = md.row_group(0)
    return sum(rg.column(c).total_compressed_size for c in range(rg.num_columns)) + 1024  # + page headers


@pytest.mark.parametrize("mode", ["remote", "auto"])
def test_opening_a_dataset_costs_two_gets(s3, big, mode):
    import warpdata

    ds = warpdata.dataset("ws/big", mode=mode)
    assert ds.version == big["version"]
    reqs = s3.requests()
    assert [(r["method"], r["key"]) for r in reqs] == [
        ("GET", "warp/datasets/ws/big/latest.json"),
        ("GET", f"warp/datasets/ws/big/versions/{big['version']}.json")]
    assert ds.manifest.content()["format_version"] == 4
    s3.reset_counts()
    assert ds.table("main").schema() == pq.ParquetFile(big["files"][0]).schema_arrow  # from the manifest
    assert s3.requests() == []


def test_info_and_schema_cost_the_manifest_alone(cli, s3, big):
    r = cli("info", "ws/big", "--json")
    assert r.code == 0 and r.err == "", r.err
    doc = r.json()
    assert doc["version"] == big["version"] and doc["rows"] == 2 * SHARD_ROWS
    assert doc["tables"] == [{"name": "main", "rows": 2 * SHARD_ROWS, "shards": 2, "bytes": big["bytes"],
                              "columns": 4, "default": True}]
    assert s3.count() == 2 and _blob_requests(s3) == []
    dataset_module._MANIFESTS.clear()
    s3.reset_counts()
    r = cli("schema", "ws/big", "--json")
    assert r.code == 0 and r.err == "", r.err
    want = pq.ParquetFile(big["files"][0]).schema_arrow
    assert r.json()["source"] == "manifest"
    assert r.json()["fields"] == [{"name": f.name, "type": str(f.type), "nullable": f.nullable} for f in want]
    assert s3.count("GET") <= 2 and _blob_requests(s3) == []  # the manifest may come from the blob cache


def test_head_reads_the_footer_and_one_row_group(cli, s3, big):
    r = cli("head", "ws/big", "-n", "5", "--columns", "id,label", "--json")
    assert r.code == 0 and r.err == "", r.err
    assert r.json()["rows"] == [{"id": i, "label": f"label-{i}"} for i in range(5)]
    blob = _blob_requests(s3)
    shard0 = {r["key"] for r in blob}
    assert len(shard0) == 1  # the second shard is never touched
    f0 = big["files"][0]
    # the footer, by its recorded length, then the two columns' chunks in row group 0: nothing else
    assert _ranges(blob)[0] == _footer_span(f0)
    assert _only_inside(blob, [_footer_span(f0), _row_group_span(f0, 0)])
    assert range_bytes(blob) < _one_row_group_bytes(f0) < big["bytes"] / 6


def test_stream_limit_stops_fetching_at_its_rows(cli, s3, big):
    """`warp stream --limit 5` used to read every row group of every shard (the whole table)."""
    r = cli("stream", "ws/big", "--limit", "5", "--columns", "id")
    assert r.code == 0 and r.err == "", r.err
    assert r.out.splitlines() == [f'{{"id":{i}}}' for i in range(5)]
    blob = _blob_requests(s3)
    f0 = big["files"][0]
    assert len({r["key"] for r in blob}) == 1 and len(blob) <= 3  # HEAD, footer, one row group's `id`
    assert _only_inside(blob, [_footer_span(f0), _row_group_span(f0, 0)])
    assert range_bytes(blob) < _one_row_group_bytes(f0)
    full = cli("stream", "ws/big", "--columns", "id", "--mode", "remote")  # the contrast: every row group
    assert full.code == 0 and len(full.out.splitlines()) == 2 * SHARD_ROWS
    assert len({r["key"] for r in _blob_requests(s3)}) == 2


def test_stream_limit_across_row_groups_reads_only_those(cli, s3, big):
    r = cli("stream", "ws/big", "--limit", str(ROWS_PER_GROUP + 1), "--columns", "id", "--mode", "remote")
    assert r.code == 0, r.err
    assert len(r.out.splitlines()) == ROWS_PER_GROUP + 1
    f0 = big["files"][0]
    assert len({r["key"] for r in _blob_requests(s3)}) == 1
    assert _only_inside(_blob_requests(s3), [_footer_span(f0), _row_group_span(f0, 0), _row_group_span(f0, 1)])


def test_schema_of_a_manifest_without_arrow_reads_one_footer(cli, s3, tmp_path, monkeypatch):
    """Versions published before format 4 keep working: the schema comes from the first footer."""
    monkeypatch.setenv("WARP_STORE", s3.url("warp"))
    monkeypatch.setenv("WARP_CACHE_DIR", str(tmp_path / "cache"))
    parts = [make_rows(300, 0), make_rows(300, 300)]
    m = publish(s3.url("warp"), "ws/old", {"main": parts}, tmp_path, row_group_size=100)
    assert m.content()["format_version"] == 2
    dataset_module._MANIFESTS.clear()
    s3.reset_counts()
    r = cli("schema", "ws/old", "--json")
    assert r.code == 0, r.err
    assert r.json()["source"] == "footer"
    assert [f["name"] for f in r.json()["fields"]] == parts[0].schema.names
    assert [f["type"] for f in r.json()["fields"]] == [str(t) for t in parts[0].schema.types]
    blob = _blob_requests(s3)
    shard = m.tables["main"].shards[0]
    assert {r["key"] for r in blob} == {f"warp/{shard.uri}"}
    assert [r["range"] for r in blob if r["method"] == "GET"] == [
        f"bytes={shard.byte_size - shard.stats['footer_size']}-{shard.byte_size - 1}"]
    assert s3.count() <= 4  # latest, manifest, HEAD and footer of shard 0


def test_exact_arrow_types_survive_publish(s3, tmp_path, monkeypatch):
    """Types whose string form does not parse back (nested, dictionary, tz, decimal) and field and
    schema metadata come back from the manifest exactly as the Parquet file's own schema."""
    import warpdata

    schema = pa.schema([
        pa.field("id", pa.int32(), nullable=False, metadata={"unit": "count"}),
        pa.field("at", pa.timestamp("ms", tz="Europe/Paris")),
        pa.field("price", pa.decimal128(12, 3)),
        pa.field("tags", pa.list_(pa.dictionary(pa.int16(), pa.string()))),
        pa.field("box", pa.struct([("x", pa.float32()), ("y", pa.float32()), ("note", pa.large_string())])),
        pa.field("emb", pa.list_(pa.float16(), 4)),
    ], metadata={"producer": "test"})
    import datetime
    import decimal

    t = pa.table({"id": [1, 2], "at": [datetime.datetime(2024, 1, 1), None],
                  "price": [decimal.Decimal("1.500"), None], "tags": [["a", "b"], []],
                  "box": [{"x": 1.0, "y": 2.0, "note": "n"}, None],
                  "emb": [[0.5, 1.0, 1.5, 2.0], None]}, schema=schema)
    p = tmp_path / "t.parquet"
    pq.write_table(t, p)
    monkeypatch.setenv("WARP_STORE", s3.url("warp"))
    monkeypatch.setenv("WARP_CACHE_DIR", str(tmp_path / "cache"))
    warp_publish(PublishRequest("ws/types", tables={"main": [str(p)]}))
    s3.reset_counts()
    tab = warpdata.dataset("ws/types", mode="remote").table("main")
    want = pq.ParquetFile(p).schema_arrow
    assert tab.schema().equals(want, check_metadata=True)
    assert tab.schema().field("id").metadata == {b"unit": b"count"}
    assert _blob_requests(s3) == []
    assert tab.to_arrow().equals(pq.read_table(p))
