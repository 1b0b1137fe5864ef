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
that holds nothing but the registered table. A ``WITH`` name is visible only in
its own scope (the statement that defines it, later ``WITH`` items, and itself
when recursive), exactly as DuckDB resolves it, and may not be named like a
catalog object (the table, warp's internal names, DuckDB's system views such
as ``pg_settings``): a CTE defined in a subquery cannot make an outer reference
to ``duckdb_views`` look like a CTE.

Every connection is bounded (:class:`QueryLimits`, docs/sql.md): a thread count,
a memory limit with spilling to disk turned off, DuckDB's expression depth,
and, for the queries :mod:`warpdata.read.table` runs, a time limit enforced by
``con.interrupt()`` from a timer (DuckDB has no statement timeout). Text longer
than :data:`MAX_SQL_CHARS` and expressions nested deeper than :data:`MAX_DEPTH`
are refused before DuckDB parses them into a tree. Running past a limit is a
:class:`QueryLimitError` (exit 2) naming the limit and how to raise it.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from warpdata.core import envvars
from warpdata.core.errors import ConfigError, UsageError
from warpdata.core.sizes import format_size

# lazy third-party imports: duckdb (heavy) is imported inside the functions that use it, so
# importing this module does not load it: it loads on the first connection

__all__ = ["ALLOWED_FUNCTIONS", "MAX_DEPTH", "MAX_SQL_CHARS", "QUERY_FUNCTIONS", "SAFE_CONFIG", "QueryLimitError",
           "QueryLimits", "check_filter", "check_query", "confine", "connect", "guarded", "lock", "serialize_sql",
           "where_sql"]

#: settings every warp DuckDB connection starts with: no extension fetched behind the user's back,
#: no Python variable read as a table (DuckDB's replacement scan of the caller's locals)
SAFE_CONFIG: dict[str, Any] = {"autoinstall_known_extensions": False, "autoload_known_extensions": False,
                               "python_enable_replacements": False}

#: longest filter or query text parsed (DuckDB's parse tree of 1.3 MB of SQL took 0.85 GB here)
MAX_SQL_CHARS = 262_144
#: deepest expression nesting a filter or query may have (DuckDB's own parse tree nests deeper
#: than Python's default recursion limit at ~330 levels)
MAX_DEPTH = 200


class QueryLimitError(UsageError):
    """A filter or query went past a limit: its length, depth, time or memory (exit 2)."""

    code = "query-limit"


@dataclass(frozen=True)
class QueryLimits:
    """What one DuckDB connection may use (docs/sql.md).

    Defaults keep a laptop responsive: half the cores, a quarter of the memory, five minutes.
    ``WARP_SQL_THREADS``, ``WARP_SQL_MEMORY`` (a size with a unit) and ``WARP_SQL_TIMEOUT``
    (seconds, 0 for none) change them.
    """

    threads: int
    memory_bytes: int
    timeout_s: float
    max_depth: int = MAX_DEPTH

    @classmethod
    def defaults(cls) -> QueryLimits:
        cpus = os.cpu_count() or 1
        try:
            ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        except (ValueError, OSError, AttributeError):
            ram = 4 << 30
        return cls(threads=min(envvars.MAX_SQL_THREADS, max(1, cpus // 2)), memory_bytes=max(256 << 20, ram // 4),
                   timeout_s=300.0)

    @classmethod
    def from_env(cls) -> QueryLimits:
        """The defaults, changed by ``WARP_SQL_THREADS``, ``WARP_SQL_MEMORY`` and ``WARP_SQL_TIMEOUT``
        within their documented bounds (:data:`warpdata.core.envvars.ENV_VARS`); a value outside them
        is a ConfigError (exit 78) naming the variable and the range, before any connection opens."""
        d = cls.defaults()
        threads = envvars.number("WARP_SQL_THREADS")
        memory = envvars.number("WARP_SQL_MEMORY")
        timeout = envvars.number("WARP_SQL_TIMEOUT")
        return cls(threads=d.threads if threads is None else int(threads),
                   memory_bytes=d.memory_bytes if memory is None else int(memory),
                   timeout_s=d.timeout_s if timeout is None else float(timeout))


#: the longest wait a timer is given (seconds): threading.Timer raises OverflowError in its own thread
#: past what the platform's clock can hold (1e300 killed the timer, and with it the time limit), so a
#: longer limit waits this long instead, ~31 years
TIMER_MAX_S = min(threading.TIMEOUT_MAX, 1e9)


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


def connect(limits: QueryLimits | None = None, *, filesystem: Any = None):
    """A DuckDB connection that never installs or auto-loads an extension, bounded by ``limits``
    (:meth:`QueryLimits.from_env` when None): threads, memory (no spilling to disk) and depth.

    ``filesystem``: an fsspec filesystem DuckDB reads its URLs through, such as the s3fs of a
    store's :class:`~warpdata.storage.locations.StorageConfig` (``config.s3fs()``), so that its
    ``s3://`` reads use the same endpoint, region and credentials as every other client.
    """
    import duckdb

    lim = limits or QueryLimits.from_env()
    con = duckdb.connect(config={**SAFE_CONFIG, "threads": lim.threads, "memory_limit": f"{lim.memory_bytes}B",
                                 "temp_directory": "", "max_expression_depth": max(lim.max_depth * 2, 100)})
    if filesystem is not None:
        con.register_filesystem(filesystem)
    return con


@contextmanager
def guarded(con, what: str, limits: QueryLimits | None = None) -> Iterator[None]:
    """Run DuckDB work on ``con`` under the time limit (``con.interrupt()`` from a timer), turning
    an interrupt by the timer or DuckDB running out of its memory limit into a :class:`QueryLimitError`
    that names ``what`` (e.g. "query 'SELECT ...' on ws/name/main")."""
    import duckdb

    lim = limits or QueryLimits.from_env()
    fired = threading.Event()
    timer = None
    if lim.timeout_s > 0:  # NaN, inf and huge values: refused by from_env, clamped here for Table.query(timeout=)
        def stop() -> None:
            fired.set()
            con.interrupt()

        timer = threading.Timer(min(lim.timeout_s, TIMER_MAX_S), stop)
        timer.daemon = True
        timer.start()
    try:
        yield
    except duckdb.InterruptException:
        if not fired.is_set():
            raise
        raise QueryLimitError(f"{what} ran past its time limit of {lim.timeout_s:g} s and was stopped",
                              hint="narrow it (a WHERE clause, a LIMIT), or raise WARP_SQL_TIMEOUT "
                                   "(seconds, 0 for no limit)", timeout_s=lim.timeout_s) from None
    except duckdb.OutOfMemoryException:
        raise QueryLimitError(f"{what} needs more than its memory limit of {format_size(lim.memory_bytes)}",
                              hint="narrow it (fewer columns, a WHERE clause, fewer groups), or raise "
                                   "WARP_SQL_MEMORY (e.g. 8GB)", memory_bytes=lim.memory_bytes) from None
    finally:
        if timer is not None:
            timer.cancel()


_PARSER: list[Any] = []  # [pid, connection]: this process's parsing connection (serialize_sql)
_PARSER_MU = threading.Lock()
_INHERITED: list[Any] = []  # a parent's parsing connections, kept (never closed) in a forked child


def _after_fork_in_child() -> None:
    # the parent's connection is not this process's to use or close; a new lock, in case a
    # parent thread held it at the fork
    global _PARSER_MU
    _PARSER_MU = threading.Lock()
    if _PARSER:
        _INHERITED.append(_PARSER[1])
        _PARSER.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def serialize_sql(sql: str) -> str:
    """DuckDB's parse tree of ``sql`` as JSON text (``json_serialize_sql``), under the time limit.

    Parsing runs on one connection per process, made on first use and reused: opening a DuckDB
    connection costs more than most filters take to run, and a filter is parsed twice (checked
    here, then planned for row-group pruning). It is locked like every other (:func:`lock`: no file,
    network or extension access) and single-threaded (no DuckDB threads for a fork to lose); one
    parse at a time. A forked child makes its own.
    """
    from dataclasses import replace

    with _PARSER_MU:
        if not _PARSER:
            con = connect(replace(QueryLimits.from_env(), threads=1))
            lock(con)
            _PARSER[:] = [os.getpid(), con]
        con = _PARSER[1]
        with guarded(con, "parsing"):
            return con.execute("SELECT json_serialize_sql(?)", [sql]).fetchone()[0]


def _parse(sql: str, fail) -> dict:
    """DuckDB's parse tree of ``sql`` as JSON, under the length, depth and time limits."""
    if len(sql) > MAX_SQL_CHARS:
        raise fail(f"is {len(sql):,} characters long, over the limit of {MAX_SQL_CHARS:,}",
                   "write it shorter: a range (BETWEEN) instead of a long IN list, or a join instead of literals",
                   QueryLimitError)
    try:
        raw = serialize_sql(sql)
    except ConfigError:  # a bad WARP_SQL_* setting is the setting's fault, not the text's
        raise
    except QueryLimitError as e:
        raise fail(f"takes too long to parse ({e.message})", None, QueryLimitError) from None
    except Exception as e:  # duckdb.Error; the parser itself failing is the text's fault
        raise fail(f"cannot be parsed: {e}", None, UsageError) from None
    deep = (f"nests expressions more than {MAX_DEPTH} levels deep",
            "flatten it: an IN (...) list instead of chained ORs, NOT once instead of NOT NOT ...", QueryLimitError)
    try:
        doc = json.loads(raw)
    except RecursionError:
        raise fail(*deep) from None
    if doc.get("error") and "expression depth" in str(doc.get("error_message")):  # DuckDB's own depth limit
        raise fail(*deep)
    return doc


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


def _short(text: str) -> str:
    return text if len(text) <= 200 else text[:197] + "..."


def _fail(expr: str, what: str, columns: Iterable[str], hint: str | None = None,
          cls: type[UsageError] = UsageError) -> UsageError:
    return cls(f"filter {_short(expr)!r}: {what}",
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
    doc = _parse(f"SELECT * FROM {_TABLE} WHERE {where_sql(expr)}",
                 lambda what, hint, cls: _fail(expr, what, columns, hint, cls))
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


def _deep(expr: str, columns: list[str]) -> UsageError:
    return _fail(expr, f"nests expressions more than {MAX_DEPTH} levels deep", columns,
                 "flatten it: an IN (...) list instead of chained ORs, NOT once instead of NOT NOT ...", QueryLimitError)


def _walk(expr: str, root: Any, lower: dict[str, list[str]], refs: set[str], columns: list[str]) -> None:
    stack: list[tuple[Any, int]] = [(root, 1)]
    while stack:
        n, depth = stack.pop()
        if n is None:
            continue
        if depth > MAX_DEPTH:
            raise _deep(expr, columns)
        if not isinstance(n, dict):
            raise _fail(expr, f"has an unexpected parse node {n!r}", columns)
        kids: list[Any] = []
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
            kids.extend(n.get("children") or [])
        elif cls == "COMPARISON" and isinstance(typ, str) and typ.startswith(_COMPARISONS_PREFIX):
            kids.extend([n.get("left"), n.get("right")])
        elif cls == "BETWEEN":
            kids.extend([n.get("input"), n.get("lower"), n.get("upper")])
        elif cls == "OPERATOR" and typ in _OPERATORS:
            kids.extend(n.get("children") or [])
        elif cls == "CASE":
            for c in n.get("case_checks") or []:
                kids.extend([c.get("when_expr"), c.get("then_expr")])
            kids.append(n.get("else_expr"))
        elif cls == "CAST":
            kids.append(n.get("child"))
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
                kids.append(a.get("expression") if isinstance(a, dict) and "expression" in a else a)
        else:
            what = {"SUBQUERY": "a subquery", "STAR": "*", "LAMBDA": "a lambda", "PARAMETER": "a parameter",
                    "WINDOW": "a window function", "COLLATE": "COLLATE"}.get(cls, f"{cls} {typ}".lower())
            raise _fail(expr, f"uses {what}, which is not allowed in a filter", columns)
        stack.extend((k, depth + 1) for k in kids)


def _query_fail(sql: str, what: str, table: str, hint: str | None = None,
                cls: type[UsageError] = UsageError) -> UsageError:
    return cls(f"query {_short(sql)!r}: {what}",
               hint=hint or f"write one read-only SELECT over the table {table!r} (WHERE, GROUP BY, ORDER BY, "
                            "LIMIT, joins of the table with itself, aggregates, simple functions)",
               query=sql)


#: names warp itself gives relations on a query connection (a select() view's underlying scan)
INTERNAL_NAMES = frozenset({_TABLE, "warp_all_columns"})
_CATALOG: frozenset[str] | None = None


def catalog_names() -> frozenset[str]:
    """Lower-cased names of every relation a fresh DuckDB connection can read unqualified
    (``duckdb_views``, ``pg_settings``, ``information_schema``'s ``tables``, ...), plus
    :data:`INTERNAL_NAMES`: what a ``WITH`` name may not shadow."""
    global _CATALOG
    if _CATALOG is None:
        con = connect()
        try:
            rows = con.execute("SELECT lower(view_name) FROM duckdb_views() UNION "
                               "SELECT lower(table_name) FROM duckdb_tables()").fetchall()
        finally:
            con.close()
        _CATALOG = frozenset(r[0] for r in rows) | INTERNAL_NAMES
    return _CATALOG


def _cte_items(n: dict) -> list[tuple[str, Any]]:
    cte_map = n.get("cte_map")
    items = (cte_map.get("map") or []) if isinstance(cte_map, dict) else []
    return [(str(i.get("key")), i.get("value")) for i in items if isinstance(i, dict)]


def check_query(sql: str, table: str) -> None:
    """Check a whole ``SELECT`` over ``table`` (see the module docstring), or raise UsageError.

    DuckDB's own parser reads ``sql``; the tree is walked whole, so a construct hidden in a
    subquery, a CTE, a join or a set operation is found too. Each table reference is resolved
    in its own scope: a ``WITH`` name counts only where DuckDB would see it.
    """
    if not isinstance(sql, str) or not sql.strip():
        raise _query_fail(str(sql), "is empty", table)
    if "\x00" in sql:
        raise _query_fail(sql, "contains a NUL character", table)
    doc = _parse(sql, lambda what, hint, cls: _query_fail(sql, what, table, hint, cls))
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
    shadowed = catalog_names() | {table.lower()}
    allowed = ALLOWED_FUNCTIONS | QUERY_FUNCTIONS
    # (node, WITH names visible here, expression depth)
    stack: list[tuple[Any, frozenset[str], int]] = [(stmts[0].get("node"), frozenset(), 1)]
    while stack:
        n, scope, depth = stack.pop()
        if isinstance(n, list):
            stack.extend((k, scope, depth) for k in n)
            continue
        if not isinstance(n, dict):
            continue
        typ, cls = n.get("type"), n.get("class")
        if cls is not None:
            depth += 1
            if depth > MAX_DEPTH:
                raise _query_fail(sql, f"nests expressions more than {MAX_DEPTH} levels deep", table,
                                  "flatten it: an IN (...) list instead of chained ORs, NOT once instead of NOT NOT ...",
                                  QueryLimitError)
        ctes = _cte_items(n)
        if ctes:
            names = [k.lower() for k, _ in ctes]
            for k, _ in ctes:
                if k.lower() in shadowed:
                    raise _query_fail(sql, f"names a WITH query {k!r}, the name of "
                                           f"{'the table' if k.lower() == table.lower() else 'a catalog object'}",
                                      table, "give the WITH query another name")
            for i, (k, value) in enumerate(ctes):
                node = value.get("query_node") if isinstance(value, dict) else None
                recursive = isinstance(node, dict) and node.get("type") == "RECURSIVE_CTE_NODE" \
                    and str(node.get("cte_name", "")).lower() == k.lower()
                stack.append((value, scope | frozenset(names[:i]) | ({k.lower()} if recursive else frozenset()),
                              depth))
            scope = scope | frozenset(names)
        if typ == "TABLE_FUNCTION":
            fn = (n.get("function") or {}).get("function_name", "?")
            raise _query_fail(sql, f"calls the table function {fn}(); a query reads only the table {table!r}", table)
        if typ == "BASE_TABLE":
            name = n.get("table_name")
            if n.get("schema_name") or n.get("catalog_name") or n.get("at_clause") is not None:
                raise _query_fail(sql, f"reads {n.get('catalog_name') or n.get('schema_name')}.{name}: qualified "
                                       "tables are not allowed", table)
            # DuckDB identifiers are case-insensitive: MAIN reads main
            if not isinstance(name, str) or (name.lower() != table.lower() and name.lower() not in scope):
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
        stack.extend((v, scope, depth) for k, v in n.items() if k != "cte_map")
