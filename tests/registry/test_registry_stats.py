"""Format 2 manifests: per-shard Parquet statistics, their validation, and filter pruning by them.

The pruning rule is checked for soundness against DuckDB itself (hypothesis):
whenever :meth:`Predicate.may_match` says a row group cannot match, DuckDB
finds no matching row in it.
"""

from __future__ import annotations

import json
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.manifests import unsealed
from warpdata.core.errors import ManifestCorruptedError
from warpdata.registry.manifest import Manifest, ShardRef, Table, version_hash_of
from warpdata.registry.parquet_stats import (
    MAX_STRING_STAT,
    footer_size_of,
    parse_footer,
    shard_stats,
)
from warpdata.registry.predicate import Predicate

GOLDEN = Path(__file__).parents[1] / "golden" / "registry"
H = [f"{i:064x}" for i in range(1, 10)]
STATS0 = {"footer_size": 812, "columns": {"id": {"min": 0, "max": 9, "null_count": 0},
                                          "label": {"min": "a", "max": "k", "null_count": 1}},
          "row_groups": [{"row_count": 5, "columns": {"id": {"min": 0, "max": 4, "null_count": 0},
                                                      "label": {"min": "a", "max": "c", "null_count": 1}}},
                         {"row_count": 5, "columns": {"id": {"min": 5, "max": 9, "null_count": 0},
                                                      "label": {"min": "d", "max": "k", "null_count": 0}}}]}


def sample_manifest_v2(**metadata) -> Manifest:
    return Manifest(
        dataset_id="vision/coco-mini",
        tables={"main": Table(
            shards=(ShardRef(H[0], 1000, row_count=10, stats=STATS0),
                    ShardRef(H[1], 2000, row_count=20, stats={"footer_size": 640, "columns": {}})),
            schema={"fields": [{"name": "id", "type": "int64", "nullable": False},
                               {"name": "label", "type": "string", "nullable": True}]})},
        metadata=metadata)


def _parquet(tmp_path, table: pa.Table, name="t.parquet", **kw) -> Path:
    p = tmp_path / name
    pq.write_table(table, p, **kw)
    return p


# -- the manifest format ------------------------------------------------------

def test_golden_v2_manifest_hash_is_stable():
    data = (GOLDEN / "manifest-v2.json").read_bytes()
    expected = (GOLDEN / "manifest-v2.version").read_text().strip()
    m = Manifest.from_bytes(data, expected_hash=expected)
    assert m.version_hash == expected and json.loads(data)["format_version"] == 2
    assert m.tables["main"].shards[0].stats == STATS0
    assert unsealed(sample_manifest_v2(created_at="2025-01-01T00:00:00Z").to_bytes()) == data  # the golden predates the seal


def test_v1_manifests_still_read_and_stay_v1():
    """Old manifests without stats read as before; a manifest without stats is still written as v1."""
    data = (GOLDEN / "manifest-v1.json").read_bytes()
    m = Manifest.from_bytes(data, expected_hash=(GOLDEN / "manifest-v1.version").read_text().strip())
    assert all(s.stats is None for s in m.tables["main"].shards)
    assert json.loads(m.to_bytes())["format_version"] == 1 and unsealed(m.to_bytes()) == data


def test_stats_change_the_version():
    a = sample_manifest_v2()
    other = json.loads(json.dumps(STATS0))
    other["columns"]["id"]["max"] = 10
    b = Manifest("vision/coco-mini", tables={"main": Table(
        shards=(ShardRef(H[0], 1000, row_count=10, stats=other), a.tables["main"].shards[1]),
        schema=a.tables["main"].schema)})
    assert a.version_hash != b.version_hash
    back = Manifest.from_bytes(a.to_bytes(), expected_hash=a.version_hash)
    assert back.to_bytes() == a.to_bytes()


def _shard0(d):
    return d["tables"]["main"]["shards"][0]


@pytest.mark.parametrize("mutate, match", [
    (lambda d: d.__setitem__("format_version", 1), "format_version is 1, but shard stats are present"),
    (lambda d: d.__setitem__("format_version", 6), "is not one of"),
    (lambda d: d.__setitem__("format_version", 4), "format_version is 4, .* Arrow table schemas are absent"),
    (lambda d: d.__setitem__("format_version", 3), "format_version is 3, but shard stats are present, read-affecting metadata is absent"),
    (lambda d: [s.pop("stats") for s in d["tables"]["main"]["shards"]], "format_version is 2, but shard stats are absent"),
    (lambda d: _shard0(d)["stats"]["columns"]["id"].__setitem__("min", 99), "not an ordered pair"),
    (lambda d: _shard0(d)["stats"]["columns"]["id"].__setitem__("min", "0"), "not an ordered pair"),
    (lambda d: _shard0(d)["stats"]["columns"]["id"].pop("max"), "min and max come together"),
    (lambda d: _shard0(d)["stats"]["columns"]["id"].__setitem__("min", 1.5), "not an integer or a string"),
    (lambda d: _shard0(d)["stats"]["row_groups"][0].__setitem__("row_count", 4), "count 9 rows, the shard 10"),
    (lambda d: _shard0(d)["stats"]["row_groups"][1]["columns"]["label"].__setitem__("max", "A"), "row_groups\\[1\\]"),
    (lambda d: _shard0(d)["stats"].__setitem__("footer_size", 3), "not a footer length"),
    (lambda d: _shard0(d)["stats"].__setitem__("extra", 1), "must be an object with columns"),
    (lambda d: _shard0(d)["stats"].pop("columns"), "must be an object with columns"),
])
def test_stats_violations(mutate, match):
    doc = json.loads(sample_manifest_v2().to_bytes())
    mutate(doc)
    doc["version_hash"] = version_hash_of(doc)
    with pytest.raises(ManifestCorruptedError, match=match):
        Manifest.from_dict(doc)


@pytest.mark.parametrize("mutate", [
    lambda d: _shard0(d)["stats"]["columns"]["id"].pop("max"),
    lambda d: _shard0(d)["stats"]["columns"]["id"].__setitem__("min", 1.5),
    lambda d: _shard0(d)["stats"]["columns"]["id"].__setitem__("null_count", -1),
    lambda d: _shard0(d)["stats"].__setitem__("footer_size", 3),
    lambda d: _shard0(d)["stats"].__setitem__("extra", 1),
    lambda d: _shard0(d)["stats"].pop("columns"),
    lambda d: _shard0(d)["stats"]["row_groups"][0].pop("row_count"),
    lambda d: _shard0(d)["stats"]["columns"].update({f"c{i}": {} for i in range(64)}),
])
def test_shipped_schema_and_fast_checks_agree(mutate):
    """warp checks shard stats in Python for speed; the shipped JSON Schema rejects the same documents."""
    import jsonschema
    from warpdata.registry.manifest import schema

    doc = json.loads(sample_manifest_v2().to_bytes())
    jsonschema.validate(doc, schema())
    mutate(doc)
    doc["version_hash"] = version_hash_of(doc)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(doc, schema())
    with pytest.raises(ManifestCorruptedError):
        Manifest.from_dict(doc)


# -- statistics from Parquet footers -------------------------------------------

def test_shard_stats_from_footer(tmp_path):
    n = 10
    t = pa.table({
        "id": pa.array(range(100, 100 + n), pa.int64()),
        "small": pa.array([None if i % 3 == 0 else i for i in range(n)], pa.int8()),
        "name": pa.array([f"n{i:02d}" for i in range(n)]),
        "long": pa.array(["x" * (MAX_STRING_STAT + 1)] * n),
        "accent": pa.array(["é"] * n),
        "f": pa.array([0.5] * n),
        "allnull": pa.array([None] * n, pa.int32()),
        "nested": pa.array([{"a": i} for i in range(n)]),
    })
    p = _parquet(tmp_path, t, row_group_size=4)
    md = pq.read_metadata(p)
    st = shard_stats(md, footer_size_of(str(p)))
    assert st["footer_size"] == md.serialized_size + 8
    cols = st["columns"]
    assert cols["id"] == {"min": 100, "max": 109, "null_count": 0}
    assert cols["small"] == {"min": 1, "max": 8, "null_count": 4}
    assert cols["name"] == {"min": "n00", "max": "n09", "null_count": 0}
    assert cols["long"] == cols["accent"] == cols["f"] == {"null_count": 0}  # no min/max for these
    assert cols["allnull"] == {"null_count": n}
    assert "nested" not in cols and "a" not in cols  # nested leaves are not top-level columns
    assert [r["row_count"] for r in st["row_groups"]] == [4, 4, 2]
    assert st["row_groups"][2]["columns"]["id"] == {"min": 108, "max": 109, "null_count": 0}
    # the footer alone is enough to get the same metadata back
    data = p.read_bytes()
    assert parse_footer(data[-st["footer_size"]:]).num_rows == n
    with pytest.raises(ValueError):
        parse_footer(data[-st["footer_size"] + 1:])
    assert "row_groups" not in shard_stats(md, max_row_groups=2)
    # a manifest can carry them
    m = Manifest("ws/x", tables={"t": Table(shards=(ShardRef(H[0], len(data), row_count=n, stats=st),))})
    assert Manifest.from_bytes(m.to_bytes()).tables["t"].shards[0].stats == st


# -- pruning -------------------------------------------------------------------

COLS = ["id", "label", "x"]
STATS = {"id": {"min": 100, "max": 199, "null_count": 0}, "label": {"min": "c10", "max": "c19", "null_count": 0},
         "x": {"null_count": 0}}


@pytest.mark.parametrize("expr, may", [
    ("id BETWEEN 123456 AND 123999", False),
    ("id BETWEEN 150 AND 160", True),
    ("id BETWEEN 50 AND 99", False),
    ("id BETWEEN 190 AND 120", False),  # empty range
    ("id = 200", False), ("id = 199", True), ("id <> 150", True),
    ("id > 199", False), ("id >= 199", True), ("id < 100", False), ("id <= 100", True),
    ("300 < id", False), ("150 > id", True),
    ("id IN (1, 2, 250)", False), ("id IN (1, 150)", True),
    ("NOT id IN (1, 2)", True), ("id NOT BETWEEN 0 AND 1000", False), ("NOT (id < 500)", False),
    ("id > 500 OR label = 'c15'", True), ("id > 500 OR label = 'zz'", False),
    ("id > 150 AND label = 'c25'", False), ("ID > 500", False), ("warp_table.id > 500", False),
    ("label >= 'c2'", False), ("label LIKE 'c5%'", True),
    ("id IS NULL", False), ("id IS NOT NULL", True), ("id = NULL", False),
    ("x > 1e9", True),  # float column: no statistics, never pruned
    ("id + 0 > 500", True), ("id > 1.5e3", True), ("id = '500'", True), ("id > CAST(500 AS BIGINT)", True),
    ("abs(id) > 500 AND id < 0", False),  # an AND prunes when one side does
])
def test_predicate_on_shard_stats(expr, may):
    pred = Predicate.parse(expr, COLS)
    assert pred is not None
    assert pred.may_match(STATS, 100) is may


def test_predicate_referenced_columns_and_parse_failures():
    assert Predicate.parse("id > 1 AND Label = 'a'", COLS).referenced == {"id", "label"}
    assert Predicate.parse("nope > 1", COLS).referenced is None  # unknown column: read everything
    assert Predicate.parse("id > (SELECT 1)", COLS).referenced is None
    assert Predicate.parse("id >", COLS) is None
    assert Predicate.parse("1 = 1", COLS).referenced == set()
    assert Predicate.parse("id > 1", COLS).may_match(None, 10)  # no stats: may match


def test_all_null_and_null_free_columns():
    pred = Predicate.parse("id > 5", COLS)
    assert not pred.may_match({"id": {"null_count": 10}}, 10)  # only NULLs: a comparison never holds
    assert pred.may_match({"id": {"null_count": 3}}, 10)  # values without min/max: may match
    assert not Predicate.parse("id IS NULL", COLS).may_match({"id": {"min": 1, "max": 2, "null_count": 0}}, 10)
    assert not Predicate.parse("id IS NOT NULL", COLS).may_match({"id": {"null_count": 10}}, 10)


values = st.one_of(st.none(), st.integers(-20, 20))
strings = st.one_of(st.none(), st.text(alphabet="abcé", max_size=3))


def _lit(v):
    return str(v) if isinstance(v, int) else "'" + v.replace("'", "''") + "'"


def _exprs(ints, words):
    """Filters over int column ``a`` and string column ``s`` with constants from ``ints``/``words``."""
    atoms = st.one_of(
        st.builds(lambda op, c: f"a {op} {_lit(c)}", st.sampled_from(["=", "<>", "<", "<=", ">", ">="]), ints),
        st.builds(lambda op, c: f"{_lit(c)} {op} a", st.sampled_from(["=", "<>", "<", "<=", ">", ">="]), ints),
        st.builds(lambda lo, hi: f"a BETWEEN {lo} AND {hi}", ints, ints),
        st.builds(lambda cs: f"a IN ({', '.join(map(_lit, cs))})", st.lists(ints, min_size=1, max_size=3)),
        st.builds(lambda op, c: f"s {op} {_lit(c)}", st.sampled_from(["=", "<>", "<", "<=", ">", ">="]), words),
        st.builds(lambda lo, hi: f"s BETWEEN {_lit(lo)} AND {_lit(hi)}", words, words),
        st.sampled_from(["a IS NULL", "a IS NOT NULL", "s IS NULL", "s IS NOT NULL", "a = NULL", "a + 1 > 3"]),
    )
    return st.recursive(atoms, lambda c: st.one_of(
        st.builds(lambda x, y: f"({x}) AND ({y})", c, c),
        st.builds(lambda x, y: f"({x}) OR ({y})", c, c),
        st.builds(lambda x: f"NOT ({x})", c)), max_leaves=4)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(a=st.lists(values, min_size=1, max_size=12), s=st.lists(strings, min_size=1, max_size=12), data=st.data())
def test_pruning_is_sound_against_duckdb(a, s, data):
    """If the stats say a row group cannot match, DuckDB finds no matching row in it."""
    n = min(len(a), len(s))
    # constants near the data, so that the boundaries of [min, max] are exercised
    near = [v + d for v in a[:n] if v is not None for d in (-1, 0, 1)] or [0]
    ints = st.one_of(st.sampled_from(near), st.integers(-25, 25))
    words = st.one_of(st.sampled_from([w for w in s[:n] if w is not None] or [""]), st.text(alphabet="abcé", max_size=3))
    expr = data.draw(_exprs(ints, words), label="expr")
    t = pa.table({"a": pa.array(a[:n], pa.int64()), "s": pa.array(s[:n], pa.string())})
    sink = pa.BufferOutputStream()
    pq.write_table(t, sink, row_group_size=4)
    buf = sink.getvalue()
    st_ = shard_stats(pq.read_metadata(pa.BufferReader(buf)))
    pred = Predicate.parse(expr, ["a", "s"])
    assert pred is not None, expr
    con = duckdb.connect()
    try:
        pf = pq.ParquetFile(pa.BufferReader(buf))
        for g, rg in enumerate(st_["row_groups"]):
            con.register("part", pf.read_row_group(g))
            hits = con.execute(f"SELECT count(*) FROM part WHERE {expr}").fetchall()[0][0]
            if not pred.may_match(rg["columns"], rg["row_count"]):
                assert hits == 0, (expr, pf.read_row_group(g).to_pydict(), rg)
        con.register("whole", t)
        hits = con.execute(f"SELECT count(*) FROM whole WHERE {expr}").fetchall()[0][0]
        if not pred.may_match(st_["columns"], n):
            assert hits == 0, (expr, t.to_pydict(), st_["columns"])
    finally:
        con.close()


def test_pruning_is_not_vacuous():
    t = pa.table({"a": pa.array(range(100), pa.int64())})
    sink = pa.BufferOutputStream()
    pq.write_table(t, sink, row_group_size=10)
    st_ = shard_stats(pq.read_metadata(pa.BufferReader(sink.getvalue())))
    pred = Predicate.parse("a BETWEEN 42 AND 47", ["a"])
    assert [pred.may_match(rg["columns"], rg["row_count"]) for rg in st_["row_groups"]] == [
        g == 4 for g in range(10)]
