"""Pruning filters with the per-shard Parquet statistics of a manifest.

Spec: ``docs/formats/registry.md`` (format_version 2, "Table shard stats"); the statistics
are :func:`warpdata.registry.parquet_stats.shard_stats`'s.

:class:`Predicate` parses a filter (DuckDB SQL, through DuckDB's own parser
``json_serialize_sql``) into a tree and answers ``may_match(stats)``: False
only when no row of a shard or row group with those statistics can satisfy
the filter. Anything it does not understand (functions, casts, column
comparisons, float or date columns, unknown literal kinds) counts as "may
match", so pruning never drops a row; it only saves reads.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from warpdata.core.sqlgate import QueryLimitError, serialize_sql

# lazy third-party imports: duckdb (heavy) is imported by Predicate.parse alone

__all__ = ["Predicate"]

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
