"""Per-shard Parquet statistics in the manifest, and pruning filters with them.

Spec: ``docs/formats/registry.md`` (format_version 2, "Table shard stats").

* :func:`shard_stats` turns a Parquet footer into the ``stats`` object a
  table shard carries in the manifest: the footer's length (so a reader
  fetches it with one exact ranged GET) and, per column, ``min``/``max``/
  ``null_count`` for the whole shard and per row group. Only values whose
  comparison in DuckDB is the comparison of the JSON value are recorded:
  integers, and strings that are ASCII (so NFC normalisation of the hashed
  manifest cannot change them and byte order = code point order) of at most
  ``MAX_STRING_STAT`` characters. Floats (NaN sorts above every number in
  DuckDB, and Parquet statistics leave NaN out), dates, timestamps and
  decimals get ``null_count`` only.
* :class:`Predicate` parses a filter (DuckDB SQL, through DuckDB's own parser
  ``json_serialize_sql``) into a tree and answers ``may_match(stats)``: False
  only when no row of a shard or row group with those statistics can satisfy
  the filter. Anything it does not understand (functions, casts, column
  comparisons, float or date columns, unknown literal kinds) counts as "may
  match", so pruning never drops a row; it only saves reads.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from typing import Any

from warpdata.core.sqlgate import QueryLimitError, serialize_sql

# lazy third-party imports: pyarrow and duckdb (heavy) are imported inside the functions that use
# them, so importing this module loads none of them

__all__ = ["MAX_ROW_GROUP_STATS", "MAX_STAT_COLUMNS", "MAX_STRING_STAT", "Predicate", "footer_size_of",
           "parse_footer", "shard_stats"]

MAX_STRING_STAT = 64  # characters; longer strings get no min/max
MAX_STAT_COLUMNS = 64  # columns with statistics per shard (schema order)
MAX_ROW_GROUP_STATS = 64  # shards with more row groups record shard-level stats only


def footer_size_of(path: str) -> int:
    """Bytes of a local Parquet file's footer: Thrift metadata + 4-byte length + ``PAR1``."""
    with open(path, "rb") as f:
        f.seek(-8, 2)
        tail = f.read(8)
    if tail[4:] != b"PAR1":
        raise ValueError(f"{path}: no Parquet footer (does not end in PAR1)")
    return struct.unpack("<I", tail[:4])[0] + 8


def parse_footer(footer: bytes):
    """``pyarrow.parquet.FileMetaData`` from the last ``footer_size`` bytes of a Parquet file."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    if len(footer) < 12 or footer[-4:] != b"PAR1" or struct.unpack("<I", footer[-8:-4])[0] != len(footer) - 8:
        raise ValueError("not a Parquet footer of the recorded length")
    # the reader wants a file: the leading magic plus the footer is the smallest one
    return pq.read_metadata(pa.BufferReader(b"PAR1" + footer))


def _kind(arrow_type) -> str | None:
    import pyarrow as pa

    t = arrow_type.value_type if pa.types.is_dictionary(arrow_type) else arrow_type
    if pa.types.is_integer(t):
        return "int"
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return "str"
    return None


def _usable(kind: str | None, v: Any) -> bool:
    if kind == "int":
        return isinstance(v, int) and not isinstance(v, bool)
    if kind == "str":
        return isinstance(v, str) and len(v) <= MAX_STRING_STAT and v.isascii()
    return False


def shard_stats(md, footer_size: int | None = None, *,
                max_row_groups: int | None = MAX_ROW_GROUP_STATS) -> dict[str, Any]:
    """The manifest ``stats`` of one Parquet shard, from its footer metadata (deterministic).

    ``row_groups`` is left out when the shard has more than ``max_row_groups``
    (None: never left out; readers use that on a footer they already hold).
    """
    import unicodedata

    arrow = md.schema.to_arrow_schema()
    cols: list[tuple[str, int, str | None]] = []
    for j in range(md.num_columns):
        c = md.schema.column(j)
        # top-level, non-repeated leaves only; names that NFC would change are skipped, since
        # the hashed manifest is normalised and a changed key would no longer name the column
        if c.path != c.name or c.max_repetition_level != 0 or unicodedata.normalize("NFC", c.name) != c.name:
            continue
        try:
            kind = _kind(arrow.field(c.name).type)
        except KeyError:
            continue
        cols.append((c.name, j, kind))
        if len(cols) == MAX_STAT_COLUMNS:
            break

    def one(rg, j: int, kind: str | None) -> dict[str, Any]:
        s = rg.column(j).statistics
        out: dict[str, Any] = {}
        if s is None:
            return out
        if s.has_null_count:
            out["null_count"] = int(s.null_count)
        if s.has_min_max and _usable(kind, s.min) and _usable(kind, s.max):
            out["min"], out["max"] = s.min, s.max
        return out

    rgs = [md.row_group(i) for i in range(md.num_row_groups)]
    per_rg = [{name: one(rg, j, kind) for name, j, kind in cols} for rg in rgs]
    shard_cols: dict[str, Any] = {}
    for name, *_ in cols:
        entries = [r[name] for r in per_rg]
        agg: dict[str, Any] = {}
        if all("null_count" in e for e in entries):
            agg["null_count"] = sum(e["null_count"] for e in entries)
        # a row group without min/max is fine only when it holds nulls alone
        bounded = [e for e, rg in zip(entries, rgs, strict=True) if e.get("null_count") != rg.num_rows]
        if bounded and all("min" in e for e in bounded):
            agg["min"] = min(e["min"] for e in bounded)
            agg["max"] = max(e["max"] for e in bounded)
        if agg:
            shard_cols[name] = agg
    out: dict[str, Any] = {}
    if footer_size is not None:
        out["footer_size"] = int(footer_size)
    out["columns"] = shard_cols
    if max_row_groups is None or len(rgs) <= max_row_groups:
        out["row_groups"] = [{"row_count": int(rg.num_rows), "columns": {k: v for k, v in r.items() if v}}
                             for rg, r in zip(rgs, per_rg, strict=True)]
    return out


# -- filters ---------------------------------------------------------------------

_FLIP = {"<": ">", "<=": ">=", ">": "<", ">=": "<=", "=": "=", "<>": "<>"}
_OPS = {"COMPARE_EQUAL": "=", "COMPARE_NOTEQUAL": "<>", "COMPARE_LESSTHAN": "<", "COMPARE_GREATERTHAN": ">",
        "COMPARE_LESSTHANOREQUALTO": "<=", "COMPARE_GREATERTHANOREQUALTO": ">="}
_NOT = {"=": "<>", "<>": "=", "<": ">=", ">=": "<", ">": "<=", "<=": ">"}
_MAYBE = (True, True)


@dataclass(frozen=True)
class _Const:
    kind: str  # "int" | "str" | "null"
    value: Any


def _some_value(lo: Any, hi: Any, op: str, c: Any) -> bool:
    """Can some v in [lo, hi] satisfy ``v op c``?"""
    if op == "=":
        return lo <= c <= hi
    if op == "<>":
        return not (lo == hi == c)
    if op == "<":
        return lo < c
    if op == "<=":
        return lo <= c
    if op == ">":
        return hi > c
    return hi >= c  # ">="


class Predicate:
    """A parsed filter that can rule out shards and row groups by their statistics."""

    def __init__(self, tree: dict[str, Any], columns: dict[str, str], referenced: set[str] | None) -> None:
        self._tree = tree
        self._columns = columns  # lower-cased name -> column name (unique names only)
        self.referenced = referenced  # columns the filter reads; None if unknown

    @classmethod
    def parse(cls, expr: str, column_names: list[str]) -> Predicate | None:
        """The predicate of ``WHERE expr``, or None when DuckDB cannot parse it here."""
        import duckdb

        try:
            raw = serialize_sql(f"SELECT * FROM warp_table WHERE {expr}")  # the process's parsing connection
            doc = json.loads(raw)
            if doc.get("error"):
                return None
            stmts = doc["statements"]
            if len(stmts) != 1:
                return None
            tree = stmts[0]["node"]["where_clause"]
        except (duckdb.Error, QueryLimitError, KeyError, TypeError, ValueError, IndexError):
            return None
        lower: dict[str, list[str]] = {}
        for n in column_names:
            lower.setdefault(n.lower(), []).append(n)  # DuckDB identifiers are case-insensitive
        columns = {k: v[0] for k, v in lower.items() if len(v) == 1}
        refs: set[str] | None = set()
        stack = [tree]
        while stack:
            node = stack.pop()
            if isinstance(node, dict):
                if node.get("class") == "COLUMN_REF":
                    name = cls._column_of(node, columns)
                    if name is None:
                        refs = None
                        break
                    refs.add(name)
                elif node.get("class") in ("SUBQUERY", "STAR", "LAMBDA", "PARAMETER"):
                    refs = None
                    break
                stack.extend(node.values())
            elif isinstance(node, list):
                stack.extend(node)
        return cls(tree, columns, refs)

    @staticmethod
    def _column_of(node: dict[str, Any], columns: dict[str, str]) -> str | None:
        names = node.get("column_names") or []
        if len(names) == 2 and names[0].lower() == "warp_table":
            names = names[1:]
        return columns.get(names[0].lower()) if len(names) == 1 and isinstance(names[0], str) else None

    def may_match(self, stats: dict[str, Any] | None, row_count: int | None) -> bool:
        """False only if no row described by ``stats`` (``{column: {min, max, null_count}}``) can match."""
        if not stats:
            return True
        return self._eval(self._tree, stats, row_count)[0]

    # (may be true, may be false) for the rows described by stats; NULL results are neither
    def _eval(self, node: Any, stats: dict[str, Any], rows: int | None) -> tuple[bool, bool]:
        if not isinstance(node, dict):
            return _MAYBE
        cls, typ = node.get("class"), node.get("type")
        if cls == "CONJUNCTION" and typ in ("CONJUNCTION_AND", "CONJUNCTION_OR"):
            parts = [self._eval(c, stats, rows) for c in node.get("children", [])]
            if not parts:
                return _MAYBE
            if typ == "CONJUNCTION_AND":
                return all(p[0] for p in parts), any(p[1] for p in parts)
            return any(p[0] for p in parts), all(p[1] for p in parts)
        if cls == "OPERATOR" and typ == "OPERATOR_NOT" and len(node.get("children", [])) == 1:
            t, f = self._eval(node["children"][0], stats, rows)
            return f, t
        if cls == "OPERATOR" and typ in ("OPERATOR_IS_NULL", "OPERATOR_IS_NOT_NULL") and len(node.get("children", [])) == 1:
            col = self._col(node["children"][0], stats)
            if col is None or "null_count" not in col or rows is None:
                return _MAYBE
            has_null, has_value = col["null_count"] > 0, col["null_count"] < rows
            return (has_null, has_value) if typ == "OPERATOR_IS_NULL" else (has_value, has_null)
        if cls == "COMPARISON" and typ in _OPS:
            op = _OPS[typ]
            left, right = node.get("left"), node.get("right")
            if self._is_col(right) and not self._is_col(left):
                left, right, op = right, left, _FLIP[op]
            return self._compare(left, [(op, right)], stats, rows)
        if cls == "BETWEEN" and typ == "COMPARE_BETWEEN":
            return self._compare(node.get("input"), [(">=", node.get("lower")), ("<=", node.get("upper"))], stats, rows)
        if cls == "OPERATOR" and typ == "COMPARE_IN" and len(node.get("children", [])) >= 2:
            col_node, *values = node["children"]
            parts = [self._compare(col_node, [("=", v)], stats, rows) for v in values]
            return any(p[0] for p in parts), all(p[1] for p in parts)
        return _MAYBE

    def _is_col(self, node: Any) -> bool:
        return isinstance(node, dict) and node.get("class") == "COLUMN_REF"

    def _col(self, node: Any, stats: dict[str, Any]) -> dict[str, Any] | None:
        if not self._is_col(node):
            return None
        name = self._column_of(node, self._columns)
        return None if name is None else stats.get(name)

    def _compare(self, col_node: Any, tests: list[tuple[str, Any]], stats: dict[str, Any],
                 rows: int | None) -> tuple[bool, bool]:
        """``col op1 c1 AND col op2 c2 ...`` against the column's [min, max]."""
        col = self._col(col_node, stats)
        if col is None:
            return _MAYBE
        consts = [(op, _const(v)) for op, v in tests]
        if any(c is None for _, c in consts):
            return _MAYBE
        if any(c.kind == "null" for _, c in consts):
            return False, False  # a comparison with NULL is NULL for every row
        if "min" not in col:
            if rows is not None and col.get("null_count") == rows:
                return False, False  # only NULLs: every comparison is NULL
            return _MAYBE
        lo, hi = col["min"], col["max"]
        kind = "int" if isinstance(lo, int) and not isinstance(lo, bool) else "str" if isinstance(lo, str) else None
        if kind is None or any(c.kind != kind for _, c in consts):
            return _MAYBE  # DuckDB would cast across types: do not guess its rules
        # the AND of the tests may be true if the intersected range is non-empty and each test
        # can hold; for the 1-test case this is exact interval reasoning
        may_true = all(_some_value(lo, hi, op, c.value) for op, c in consts)
        if may_true and len(consts) == 2:  # BETWEEN: lower <= v <= upper needs max(lo, lower) <= min(hi, upper)
            may_true = max(lo, consts[0][1].value) <= min(hi, consts[1][1].value)
        may_false = any(_some_value(lo, hi, _NOT[op], c.value) for op, c in consts)
        return may_true, may_false


def _const(node: Any) -> _Const | None:
    if not isinstance(node, dict) or node.get("class") != "CONSTANT":
        return None
    lit = node.get("literal")
    if not isinstance(lit, dict):
        return None  # another serialisation (older DuckDB): no pruning rather than a guess
    kind, text = lit.get("kind"), lit.get("text")
    if kind == "NULL_LITERAL":
        return _Const("null", None)
    if not isinstance(text, str):
        return None
    if kind == "INTEGER":
        try:
            v = int(text.replace("_", ""))
        except ValueError:
            return None
        return _Const("int", v) if -(2**63) <= v < 2**64 else None
    if kind == "STRING":
        return _Const("str", text)
    return None
