"""Publish-time check that every bound column value names an artifact member.

A binding ``TABLE.COLUMN=ARTIFACT:TYPE`` promises that each non-null value of
the column is the name of a member of the artifact (a path relative to the
artifact directory, matched exactly, as readers look it up; see
docs/registry.md). A publish whose values do not resolve used to succeed and
leave every read to fail later; :func:`check_bindings` refuses it
(:class:`DanglingBindingError`, exit 65) unless the caller allows dangling
references, in which case the count is returned for the manifest's metadata.

The membership test runs in Arrow (``pyarrow.compute.is_in``), not per value
in Python.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from warpdata.core.errors import DataError, UsageError

# lazy third-party imports: pyarrow (heavy) is imported inside the functions that use it, so
# importing this module does not load it

SHOW_MISSING = 5


class DanglingBindingError(DataError):
    code = "dangling-binding"


@dataclass(frozen=True)
class BindingCheck:
    binding: str  # "table.column=artifact"
    values: int  # non-null values checked
    missing: int
    first_missing: tuple[str, ...]


def _read_column(path: str, column: str):
    """One column of a table input file (Parquet, CSV or JSONL) as an Arrow array."""
    from pathlib import Path

    import pyarrow as pa

    suffix = Path(path).suffix.lower()
    try:
        if suffix in (".csv",):
            import pyarrow.csv as pacsv

            t = pacsv.read_csv(path, convert_options=pacsv.ConvertOptions(include_columns=[column]))
        elif suffix in (".jsonl", ".ndjson", ".json"):
            import pyarrow.json as pajson

            t = pajson.read_json(path).select([column])
        else:
            import pyarrow.parquet as pq

            t = pq.read_table(path, columns=[column])
    except (pa.ArrowInvalid, OSError, KeyError) as e:
        raise DataError(f"{path}: cannot read column {column!r} to check its binding: {e}",
                        hint="fix the file") from None
    return t.column(column)


def _suggestion(value: str, members: set[str], member_list: Sequence[str]) -> str | None:
    """Why ``value`` might not match: a directory prefix too many or too few."""
    parts = value.replace("\\", "/").split("/")
    for i in range(1, len(parts)):
        tail = "/".join(parts[i:])
        if tail in members:
            prefix = "/".join(parts[:i]) + "/"
            return (f"values look like {value!r} but members are named like {tail!r}: "
                    f"strip the prefix {prefix!r} (member names are relative to the artifact directory)")
    for m in member_list:
        if m.endswith("/" + value):
            return (f"values look like {value!r} but members are named like {m!r}: "
                    f"member names include the sub-directory inside the artifact directory")
    return None


def check_binding(binding: str, files: Iterable[str], column: str, member_list: Sequence[str], *,
                  nfc: bool = False) -> BindingCheck:
    """Count the non-null values of ``column`` in ``files`` that are not in ``member_list``.

    ``nfc``: the values are compared in Unicode NFC, as published members are named and
    looked up (``member_list`` already in NFC; docs/formats/registry.md).
    """
    import pyarrow as pa
    import pyarrow.compute as pc

    value_set = pa.array(member_list, type=pa.string())
    values = missing = 0
    first: list[str] = []
    for f in files:
        col = _read_column(f, column)
        if not (pa.types.is_string(col.type) or pa.types.is_large_string(col.type)):
            raise DataError(f"--bind {binding}: column {column!r} holds {col.type}, not member paths (strings)",
                            hint="bind a column of paths relative to the artifact directory")
        col = col.cast(pa.string())
        if nfc:
            col = pc.utf8_normalize(col, form="NFC")
        valid = pc.is_valid(col)
        bad = pc.and_(valid, pc.invert(pc.is_in(col, value_set=value_set)))
        values += pc.sum(valid.cast(pa.int64())).as_py() or 0
        n_bad = pc.sum(bad.cast(pa.int64())).as_py() or 0
        missing += n_bad
        if n_bad and len(first) < SHOW_MISSING:
            for v in pc.unique(pc.filter(col, bad)).to_pylist():
                if v not in first:
                    first.append(v)
                if len(first) >= SHOW_MISSING:
                    break
    return BindingCheck(binding, values, missing, tuple(first))


def check_bindings(checks: Sequence[BindingCheck], members: Mapping[str, Sequence[str]],
                   artifact_of: Mapping[str, str], *, allow_dangling: bool,
                   skipped_links: Mapping[str, Sequence[str]] | None = None) -> dict[str, int]:
    """Raise on the first binding with dangling values, unless allowed; return ``{binding: missing}``."""
    dangling = {c.binding: c.missing for c in checks if c.missing}
    if not dangling or allow_dangling:
        return dangling
    c = next(c for c in checks if c.missing)
    shown = ", ".join(repr(v) for v in c.first_missing)
    more = "" if c.missing <= len(c.first_missing) else ", ..."
    member_list = members[artifact_of[c.binding]]
    hint = _suggestion(c.first_missing[0], set(member_list), member_list) if c.first_missing else None
    links = list((skipped_links or {}).get(artifact_of[c.binding], ()))
    under_link = [v for v in c.first_missing if any(v == ln or v.startswith(ln + "/") for ln in links)]
    if under_link:
        hint = (f"{under_link[0]!r} is under {len(links)} symlinked director{'y' if len(links) == 1 else 'ies'} "
                f"that publish does not follow ({', '.join(map(repr, links[:3]))}): pass --follow-symlinks")
    example = f" (e.g. {member_list[0]!r})" if member_list else ""
    raise DanglingBindingError(
        f"--bind {c.binding}: {c.missing} of {c.values} values name no member of the artifact "
        f"(first missing: {shown}{more})",
        hint=(hint + "; " if hint else f"values must be member paths relative to the artifact directory{example}; ")
        + "fix the column, or pass --allow-dangling to publish anyway (the count is recorded in the manifest)",
        binding=c.binding, missing=c.missing, values=c.values, first_missing=list(c.first_missing),
        dangling=dangling)


def check_binding_names(bindings: Iterable, columns: Mapping[str, Sequence[str]], artifacts: Iterable[str],
                        verb: str) -> None:
    """UsageError when a ``--bind`` names a table, artifact or column that is not being ``verb``
    ("published", "registered"); ``columns`` maps each table to its column names."""
    artifacts = set(artifacts)
    for b in bindings:
        if b.table not in columns:
            raise UsageError(f"--bind names table {b.table!r}, which is not being {verb}",
                             hint=f"tables: {', '.join(sorted(columns)) or 'none'}")
        if b.artifact not in artifacts:
            raise UsageError(f"--bind names artifact {b.artifact!r}, which is not being {verb}",
                             hint=f"artifacts: {', '.join(sorted(artifacts)) or 'none'}")
        if b.column not in columns[b.table]:
            raise UsageError(f"--bind {b.table}.{b.column}: table {b.table} has no column {b.column!r}",
                             hint=f"columns: {', '.join(columns[b.table])}")
