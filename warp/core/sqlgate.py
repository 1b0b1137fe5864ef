"""The one gate between user-written SQL and DuckDB: filter checking and locked-down connections.

A filter (``warp stream --filter``, :meth:`Table.filter`) is *one scalar
boolean expression over the table's columns*, nothing else. It reaches
DuckDB spliced into ``SELECT ... FROM warp_table WHERE (<expr>)``, so an
unchecked string could end the statement (``1=1; COPY ... TO 'f'``), add a
``UNION SELECT`` of a local file, or call a table function. :func:`check_filter`
parses exactly the text that will run with DuckDB's own parser
(``json_serialize_sql``) and walks the tree: one ``SELECT`` whose only
clause beyond the fixed ``SELECT * FROM warp_table`` is the ``WHERE``, and
in it only column references to the table's columns, literals, comparisons,
``AND``/``OR``/``NOT``, ``IN``, ``BETWEEN``, ``LIKE``/``ILIKE``/``GLOB``,
``IS [NOT] NULL``, ``CASE``, casts, arithmetic and the pure functions in
:data:`ALLOWED_FUNCTIONS`. Anything else is a :class:`~warpdata.core.errors.UsageError`
(exit 2) naming the construct; nothing runs.

:func:`connect` is how warp opens every DuckDB connection: extensions are
never installed or loaded behind its back (a typo must not download code),
and :func:`lock` then turns external access off (no file or network reads
beyond what was registered before it) and locks the configuration so a
query cannot turn it back on. The filter syntax is documented in ``warp
stream --help`` and ``docs/`` (``warp-stream(1)``).

A query (:meth:`Table.query`) is a whole read-only ``SELECT`` over one table,
checked by :func:`check_query` the same way: one statement, which DuckDB's
serializer accepts only for ``SELECT`` (so no ``COPY``, ``ATTACH``,
``INSTALL``, ``LOAD``, ``PRAGMA``, ``SET``); every table it reads is the table
itself or one of its own ``WITH`` names (no table functions such as
``read_csv``, no other catalog or schema); every function is a pure one of
:data:`ALLOWED_FUNCTIONS`, an aggregate or a window function of
:data:`QUERY_FUNCTIONS`. It runs on a :func:`connect` + :func:`lock` connection
that holds nothing but the registered table.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from warpdata.core.errors import UsageError

__all__ = ["ALLOWED_FUNCTIONS", "QUERY_FUNCTIONS", "SAFE_CONFIG", "check_filter", "check_query", "confine", "connect",
           "lock", "where_sql"]

#: settings every warp DuckDB connection starts with
SAFE_CONFIG: dict[str, Any] = {"autoinstall_known_extensions": False, "autoload_known_extensions": False}

#: pure scalar functions (and the operator spellings DuckDB's parser gives LIKE, arithmetic, ...).
#: Left out on purpose: anything reading files or settings, and functions whose output size a
#: literal can blow up (repeat, lpad/rpad, range, list_* builders).
ALLOWED_FUNCTIONS = frozenset({
    # operators as the parser names them
    "~~", "!~~", "~~*", "!~~*", "~~~", "!~~~", "+", "-", "*", "/", "//", "%", "||", "^", "**",
    "like_escape", "not_like_escape", "ilike_escape", "not_ilike_escape",
    # strings
    "lower", "upper", "lcase", "ucase", "length", "strlen", "char_length", "character_length",
    "trim", "ltrim", "rtrim", "substr", "substring", "left", "right", "starts_with", "ends_with",
    "prefix", "suffix", "contains", "instr", "strpos", "position", "replace", "reverse", "concat",
    "regexp_matches", "regexp_full_match", "like", "ilike", "nfc_normalize", "strip_accents",
    # numbers
    "abs", "round", "floor", "ceil", "ceiling", "trunc", "sign", "sqrt", "cbrt", "ln", "log", "log2",
    "log10", "exp", "pow", "power", "mod", "isnan", "isinf", "isfinite", "greatest", "least",
    "nullif", "coalesce", "ifnull",
    # dates and times
    "year", "month", "day", "hour", "minute", "second", "date_part", "datepart", "date_trunc",
    "datetrunc", "epoch", "epoch_ms", "dayofweek", "dayofyear", "week",
    # lists (read-only)
    "len", "array_length", "list_contains", "list_has", "array_contains", "list_extract",
    "array_extract", "list_element", "list_value",
})

#: aggregates and window functions a query (not a filter) may call as well
QUERY_FUNCTIONS = frozenset({
    "count", "count_star", "sum", "avg", "mean", "min", "max", "median", "mode", "quantile", "quantile_cont",
    "quantile_disc", "stddev", "stddev_pop", "stddev_samp", "var_pop", "var_samp", "variance", "first", "last",
    "any_value", "arg_min", "arg_max", "argmin", "argmax", "min_by", "max_by", "bool_and", "bool_or",
    "approx_count_distinct", "approx_quantile", "string_agg", "group_concat", "list", "array_agg", "histogram",
    "corr", "covar_pop", "covar_samp", "entropy", "kurtosis", "skewness", "product", "bit_and", "bit_or",
    "row_number", "rank", "dense_rank", "percent_rank", "cume_dist", "ntile", "lag", "lead", "first_value",
    "last_value", "nth_value",
})

_TABLE = "warp_table"
_COMPARISONS_PREFIX = "COMPARE_"
_OPERATORS = {"OPERATOR_NOT", "OPERATOR_IS_NULL", "OPERATOR_IS_NOT_NULL", "COMPARE_IN", "COMPARE_NOT_IN",
              "OPERATOR_COALESCE", "OPERATOR_NULLIF"}


def connect():
    """A DuckDB connection that never installs or auto-loads an extension."""
    import duckdb

    return duckdb.connect(config=dict(SAFE_CONFIG))


def lock(con) -> None:
    """Turn external access off and lock the configuration (call after registering the inputs)."""
    con.execute("SET enable_external_access = false")
    con.execute("SET lock_configuration = true")


def confine(con, paths: Iterable[str]) -> None:
    """Allow reads of exactly ``paths`` (``allowed_paths``), then :func:`lock` everything else."""
    con.execute("SET allowed_paths = ?", [list(paths)])
    lock(con)


def where_sql(expr: str) -> str:
    """The WHERE body exactly as it runs: parenthesised on its own lines, so a trailing ``--``
    comment cannot swallow what follows it."""
    return f"(\n{expr}\n)"


def _fail(expr: str, what: str, columns: Iterable[str], hint: str | None = None) -> UsageError:
    return UsageError(f"filter {expr!r}: {what}",
                      hint=hint or "write one boolean expression over the columns " + ", ".join(columns)
                      + " (comparisons, AND/OR/NOT, IN, BETWEEN, LIKE, IS NULL, simple functions)",
                      filter=expr)


def check_filter(expr: str, columns: Iterable[str]) -> set[str]:
    """Check ``expr`` (see the module docstring); returns the column names it reads.

    Raises :class:`UsageError` naming the first construct that is not allowed.
    """
    columns = list(columns)
    if not isinstance(expr, str) or not expr.strip():
        raise _fail(str(expr), "is empty", columns)
    if "\x00" in expr:
        raise _fail(expr, "contains a NUL character", columns)
    con = connect()
    try:
        lock(con)
        raw = con.execute("SELECT json_serialize_sql(?)", [f"SELECT * FROM {_TABLE} WHERE {where_sql(expr)}"]).fetchone()[0]
    except Exception as e:  # duckdb.Error; the parser itself failing is the filter's fault
        raise _fail(expr, f"cannot be parsed: {e}", columns) from None
    finally:
        con.close()
    doc = json.loads(raw)
    if doc.get("error"):
        raise _fail(expr, f"is not one SQL expression ({doc.get('error_message', 'parse error')})", columns)
    stmts = doc.get("statements") or []
    if len(stmts) != 1:
        raise _fail(expr, f"holds {len(stmts)} statements; one expression is allowed", columns)
    node = stmts[0].get("node") or {}
    if node.get("type") != "SELECT_NODE":
        raise _fail(expr, f"turns the query into a {str(node.get('type', '?')).replace('_NODE', '')} "
                          "(UNION and friends are not allowed)", columns)
    _check_frame(expr, node, columns)
    if stmts[0].get("named_param_map"):
        raise _fail(expr, "uses a named parameter", columns)
    lower: dict[str, list[str]] = {}
    for n in columns:
        lower.setdefault(n.lower(), []).append(n)  # DuckDB identifiers are case-insensitive
    refs: set[str] = set()
    _walk(expr, node["where_clause"], lower, refs, columns)
    return refs


def _check_frame(expr: str, node: dict, columns: list[str]) -> None:
    """Everything but the WHERE clause must be what ``SELECT * FROM warp_table`` parses to."""
    sel = node.get("select_list") or []
    frm = node.get("from_table") or {}
    problems = []
    if node.get("modifiers"):
        problems.append("ORDER BY/LIMIT")
    if (node.get("cte_map") or {}).get("map"):
        problems.append("WITH")
    if node.get("group_expressions") or node.get("group_sets"):
        problems.append("GROUP BY")
    for k in ("having", "qualify", "sample"):
        if node.get(k) is not None:
            problems.append(k.upper())
    if len(sel) != 1 or sel[0].get("class") != "STAR" or sel[0].get("exclude_list") or sel[0].get("replace_list"):
        problems.append("a select list")
    if frm.get("type") != "BASE_TABLE" or frm.get("table_name") != _TABLE or frm.get("sample") is not None \
            or frm.get("schema_name") or frm.get("catalog_name") or frm.get("at_clause") is not None:
        problems.append("a FROM clause")
    if node.get("where_clause") is None:
        problems.append("no WHERE expression")
    if problems:
        raise _fail(expr, "is not a single expression (it adds " + ", ".join(problems) + ")", columns)


def _walk(expr: str, root: Any, lower: dict[str, list[str]], refs: set[str], columns: list[str]) -> None:
    stack = [root]
    while stack:
        n = stack.pop()
        if n is None:
            continue
        if not isinstance(n, dict):
            raise _fail(expr, f"has an unexpected parse node {n!r}", columns)
        cls, typ = n.get("class"), n.get("type")
        if cls == "COLUMN_REF":
            names = n.get("column_names") or []
            if len(names) == 2 and str(names[0]).lower() == _TABLE:
                names = names[1:]
            if len(names) != 1 or not isinstance(names[0], str):
                raise _fail(expr, f"refers to {'.'.join(map(str, names))!r}, which is not a column", columns)
            hit = lower.get(names[0].lower())
            if not hit:
                raise _fail(expr, f"no column {names[0]!r} in the table", columns)
            if len(hit) > 1:
                raise _fail(expr, f"column {names[0]!r} is ambiguous ({', '.join(hit)})", columns)
            refs.add(hit[0])
        elif cls == "CONSTANT":
            pass
        elif cls == "CONJUNCTION" and typ in ("CONJUNCTION_AND", "CONJUNCTION_OR"):
            stack.extend(n.get("children") or [])
        elif cls == "COMPARISON" and isinstance(typ, str) and typ.startswith(_COMPARISONS_PREFIX):
            stack.extend([n.get("left"), n.get("right")])
        elif cls == "BETWEEN":
            stack.extend([n.get("input"), n.get("lower"), n.get("upper")])
        elif cls == "OPERATOR" and typ in _OPERATORS:
            stack.extend(n.get("children") or [])
        elif cls == "CASE":
            for c in n.get("case_checks") or []:
                stack.extend([c.get("when_expr"), c.get("then_expr")])
            stack.append(n.get("else_expr"))
        elif cls == "CAST":
            stack.append(n.get("child"))
        elif cls == "FUNCTION":
            name = n.get("function_name")
            if n.get("schema") or n.get("catalog"):
                raise _fail(expr, f"calls {n.get('catalog') or n.get('schema')}.{name}(): qualified functions are not allowed",
                            columns)
            if not isinstance(name, str) or name.lower() not in ALLOWED_FUNCTIONS:
                raise _fail(expr, f"calls {name}(), which is not an allowed function", columns,
                            hint="filters may call: " + ", ".join(sorted(f for f in ALLOWED_FUNCTIONS if f[0].isalpha())))
            if n.get("filter") is not None or (n.get("order_bys") or {}).get("orders") or n.get("distinct") \
                    or n.get("export_state"):
                raise _fail(expr, f"uses {name}() as an aggregate (FILTER/ORDER BY/DISTINCT)", columns)
            for a in n.get("arguments") or n.get("children") or []:
                stack.append(a.get("expression") if isinstance(a, dict) and "expression" in a else a)
        else:
            what = {"SUBQUERY": "a subquery", "STAR": "*", "LAMBDA": "a lambda", "PARAMETER": "a parameter",
                    "WINDOW": "a window function", "COLLATE": "COLLATE"}.get(cls, f"{cls} {typ}".lower())
            raise _fail(expr, f"uses {what}, which is not allowed in a filter", columns)


def _query_fail(sql: str, what: str, table: str, hint: str | None = None) -> UsageError:
    short = sql if len(sql) <= 200 else sql[:197] + "..."
    return UsageError(f"query {short!r}: {what}",
                      hint=hint or f"write one read-only SELECT over the table {table!r} (WHERE, GROUP BY, ORDER BY, "
                                   "LIMIT, joins of the table with itself, aggregates, simple functions)",
                      query=sql)


def check_query(sql: str, table: str) -> None:
    """Check a whole ``SELECT`` over ``table`` (see the module docstring), or raise UsageError.

    DuckDB's own parser reads ``sql``; the tree is walked whole, so a construct hidden in a
    subquery, a CTE, a join or a set operation is found too.
    """
    if not isinstance(sql, str) or not sql.strip():
        raise _query_fail(str(sql), "is empty", table)
    if "\x00" in sql:
        raise _query_fail(sql, "contains a NUL character", table)
    con = connect()
    try:
        lock(con)
        raw = con.execute("SELECT json_serialize_sql(?)", [sql]).fetchone()[0]
    except Exception as e:  # duckdb.Error: the parser failing is the query's fault
        raise _query_fail(sql, f"cannot be parsed: {e}", table) from None
    finally:
        con.close()
    doc = json.loads(raw)
    if doc.get("error"):
        msg = str(doc.get("error_message", "parse error"))
        if "Only SELECT" in msg:
            msg = "is not a SELECT query (COPY, ATTACH, INSTALL, LOAD, PRAGMA, SET and other statements are refused)"
        else:
            msg = f"cannot be parsed: {msg}"
        raise _query_fail(sql, msg, table)
    stmts = doc.get("statements") or []
    if len(stmts) != 1:
        raise _query_fail(sql, f"holds {len(stmts)} statements; one SELECT is allowed", table)
    if stmts[0].get("named_param_map"):
        raise _query_fail(sql, "uses a named parameter", table)
    ctes: set[str] = set()
    stack: list[Any] = [stmts[0].get("node")]
    while stack:  # first pass: the query's own WITH names, which it may read like tables
        n = stack.pop()
        if isinstance(n, dict):
            cte_map = n.get("cte_map")
            for item in (cte_map.get("map") or []) if isinstance(cte_map, dict) else []:
                if isinstance(item, dict) and isinstance(item.get("key"), str):
                    ctes.add(item["key"].lower())
            stack.extend(n.values())
        elif isinstance(n, list):
            stack.extend(n)
    allowed = ALLOWED_FUNCTIONS | QUERY_FUNCTIONS
    stack = [stmts[0].get("node")]
    while stack:
        n = stack.pop()
        if isinstance(n, list):
            stack.extend(n)
            continue
        if not isinstance(n, dict):
            continue
        typ, cls = n.get("type"), n.get("class")
        if typ == "TABLE_FUNCTION":
            fn = (n.get("function") or {}).get("function_name", "?")
            raise _query_fail(sql, f"calls the table function {fn}(); a query reads only the table {table!r}", table)
        if typ == "BASE_TABLE":
            name = n.get("table_name")
            if n.get("schema_name") or n.get("catalog_name") or n.get("at_clause") is not None:
                raise _query_fail(sql, f"reads {n.get('catalog_name') or n.get('schema_name')}.{name}: qualified "
                                       "tables are not allowed", table)
            # DuckDB identifiers are case-insensitive: MAIN reads main
            if not isinstance(name, str) or (name.lower() != table.lower() and name.lower() not in ctes):
                raise _query_fail(sql, f"reads the table {name!r}; a query may read only {table!r}", table)
        if cls in ("FUNCTION", "WINDOW") or (typ == "FUNCTION" and cls is None):
            name = n.get("function_name")
            if n.get("schema") or n.get("catalog"):
                raise _query_fail(sql, f"calls {n.get('catalog') or n.get('schema')}.{name}(): qualified functions "
                                       "are not allowed", table)
            if not isinstance(name, str) or name.lower() not in allowed:
                raise _query_fail(sql, f"calls {name}(), which is not an allowed function", table,
                                  hint="queries may call: " + ", ".join(sorted(f for f in allowed if f[0].isalpha())))
        if cls == "PARAMETER":
            raise _query_fail(sql, "uses a parameter", table)
        stack.extend(n.values())
