"""Per-shard Parquet statistics in the manifest.

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

The filters that prune with these statistics are :mod:`warpdata.registry.predicate` (apart, so
reading a footer, as a table's schema does, never loads the SQL gate).
"""

from __future__ import annotations

import struct
from typing import Any

from warpdata.formats import parquet_index
from warpdata.formats.parquet_pages import ParquetPagesError

# lazy third-party imports: pyarrow (heavy) is imported inside the functions that use it, so
# importing this module does not load it

__all__ = ["MAX_ROW_GROUP_STATS", "MAX_STAT_COLUMNS", "MAX_STRING_STAT", "footer_size_of", "parse_footer",
           "page_index_disagreements", "shard_stats", "stats_disagreements"]

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


def page_index_disagreements(path: str, stats: dict[str, Any] | None, where: str) -> list[str]:
    """How the manifest's ``stats.page_index`` of one shard disagrees with the shard's own footer
    and offset indexes (the file at ``path``), one line; empty when they agree or there is none
    (docs/formats/registry.md, "Page index in the manifest")."""
    text = (stats or {}).get("page_index")
    if not text:
        return []
    try:
        recorded = parquet_index.decode(text, f"{where} page index")
        actual = parquet_index.of_file(path)
    except ParquetPagesError as e:
        return [e.message]
    if actual is None:
        return [f"{where}: the manifest records a page index, the shard has no offset index"]
    actual_index = parquet_index.decode(actual, f"{where} file")
    if recorded.footer != actual_index.footer:
        return [f"{where}: the page index's footer ({len(recorded.footer)} bytes) is not the shard's "
                f"({len(actual_index.footer)} bytes)"]
    for g, (want, got) in enumerate(zip(recorded.pages, actual_index.pages, strict=True)):
        for leaf, (a, b) in enumerate(zip(want, got, strict=True)):
            if a != b:
                return [f"{where}: the page index of row group {g} column {leaf} is not the shard's "
                        f"offset index ({len(a or ())} pages recorded, {len(b or ())} in the shard)"]
    return []


def stats_disagreements(pf, stats: dict[str, Any] | None, where: str) -> list[str]:
    """How the manifest's ``stats`` of one shard disagree with its data (``pf``: the shard's
    ``pyarrow.parquet.ParquetFile``), one line each; empty when they agree.

    A filter prunes a shard or row group by these numbers, so they must bound the data: the
    recorded ``min`` at most, and ``max`` at least, the smallest and largest value present, and
    ``null_count`` exact (docs/formats/registry.md, "Table shard stats")."""
    import pyarrow.compute as pc

    if not stats:
        return []
    out: list[str] = []
    md = pf.metadata
    groups = stats.get("row_groups")
    if groups is not None and len(groups) != md.num_row_groups:
        return [f"{where}: the manifest records {len(groups)} row group(s), the shard has {md.num_row_groups}"]
    names = set(stats.get("columns", {}))
    for g_stats in groups or []:
        names |= set(g_stats.get("columns", {}))
    have = set(pf.schema_arrow.names)
    missing = sorted(names - have)
    if missing:
        return [f"{where}: statistics name column(s) the shard does not have: {', '.join(missing)}"]
    if not names:
        return []
    whole: dict[str, list] = {n: [] for n in names}
    for g in range(md.num_row_groups):
        tab = pf.read_row_group(g, columns=sorted(names))
        claims = (groups[g].get("columns", {}) if groups else {})
        for n in sorted(names):
            col = tab.column(n)
            nulls = col.null_count
            mm = pc.min_max(col).as_py() if nulls < len(col) else {"min": None, "max": None}
            whole[n].append((nulls, mm["min"], mm["max"]))
            c = claims.get(n)
            if c:
                out += _disagree(f"{where} row group {g} column {n}", c, nulls, mm["min"], mm["max"])
    for n, c in stats.get("columns", {}).items():
        parts = whole[n]
        vals = [(lo, hi) for _, lo, hi in parts if lo is not None]
        out += _disagree(f"{where} column {n}", c, sum(p[0] for p in parts),
                         min((v[0] for v in vals), default=None), max((v[1] for v in vals), default=None))
    return out


def _disagree(what: str, claim: dict[str, Any], nulls: int, lo: Any, hi: Any) -> list[str]:
    out = []
    if "null_count" in claim and claim["null_count"] != nulls:
        out.append(f"{what}: the manifest says {claim['null_count']} null(s), the data has {nulls}")
    if "min" in claim and lo is not None and claim["min"] > lo:
        out.append(f"{what}: the manifest says min {claim['min']!r}, the data holds {lo!r}")
    if "max" in claim and hi is not None and claim["max"] < hi:
        out.append(f"{what}: the manifest says max {claim['max']!r}, the data holds {hi!r}")
    return out
