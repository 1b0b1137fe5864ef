"""``warp card``: a Markdown dataset card generated from the manifest and the data.

Contract (docs/lineage.md, "warp card"):

* Generated sections sit between ``<!-- warp:card:begin NAME -->`` and
  ``<!-- warp:card:end NAME -->`` lines. Regenerating replaces what is between the markers of
  each section and keeps every other byte of the existing card (hand-written text above,
  between and below the sections); a section missing from the existing card is appended at its
  end. Text written *inside* markers is replaced.
* Sections: ``summary`` (id, version, date, rows, size, description), ``tables`` (schema, rows,
  column statistics from the manifest's per-shard Parquet statistics), ``artifacts`` (members,
  size, bindings), ``quarantine`` (counts by reason, from a ``quarantine`` table), ``sources``
  (the artifacts a version was published ``--from`` with their identity hashes, and the first
  rows of a ``sources`` table with their SHA-256), ``history`` (every version, oldest first,
  with the ``warp diff`` summary against the one before) and ``preview`` (a link to the
  picture ``warp inspect --preview`` draws, written beside the card by the command).
* Deterministic for a given store state: no timestamp of its own; dates are the versions'.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from warpdata.core.arrowmem import arrow_reader
from warpdata.core.errors import UsageError
from warpdata.core.sizes import format_size
from warpdata.lineage.diff import DiffRequest, diff_published
from warpdata.lineage.history import versions
from warpdata.registry.manifest import validate_dataset_id
from warpdata.registry.store import Store

# lazy third-party imports: pyarrow (heavy) is imported inside the functions that use it, so
# importing this module does not load it

__all__ = ["CARD_MAX_BYTES", "SECTIONS", "Card", "CardRequest", "card_dataset", "generate", "merge"]

SECTIONS = ("summary", "tables", "artifacts", "quarantine", "sources", "history", "preview")
CARD_MAX_BYTES = 1 << 20  # a card stored in a manifest's envelope (warp publish --card)
SOURCE_ROWS = 10  # rows of a sources table listed in the card
_MARK = re.compile(r"^<!-- warp:card:(begin|end) ([a-z]+) -->[ \t]*$", re.M)


def begin(name: str) -> str:
    return f"<!-- warp:card:begin {name} -->"


def end(name: str) -> str:
    return f"<!-- warp:card:end {name} -->"


@dataclass
class CardRequest:
    dataset: str  # WS/NAME[@VERSION]
    store_url: str | None = None
    existing: str | None = None  # the card to regenerate around (default: the one stored with the version)
    preview: str | None = None  # the preview picture's file name, relative to the card (None: none drawn)
    preview_error: str | None = None  # why no picture could be drawn
    history: bool = True


@dataclass
class Card:
    dataset: str
    version_hash: str
    markdown: str
    sections: dict[str, str] = field(default_factory=dict)
    kept_from: str | None = None  # "file", "stored" or None (a fresh card)


def merge(existing: str | None, sections: dict[str, str], title: str) -> str:
    """``existing`` with each generated section's body replaced between its markers."""
    if not existing:
        parts = [f"# {title}\n"]
        for name, body in sections.items():
            parts.append(f"{begin(name)}\n{body.rstrip()}\n{end(name)}\n")
        return "\n".join(parts)
    out, pos, seen = [], 0, set()
    marks = list(_MARK.finditer(existing))
    i = 0
    while i < len(marks):
        m = marks[i]
        if m.group(1) != "begin":
            raise UsageError(f"card: '{m.group(0)}' without its begin marker",
                             hint="restore or remove the marker line; the card's other text is kept as written")
        name = m.group(2)
        close = marks[i + 1] if i + 1 < len(marks) else None
        if close is None or close.group(1) != "end" or close.group(2) != name:
            raise UsageError(f"card: section {name!r} has no '{end(name)}' line after its begin marker",
                             hint="restore the end marker; everything outside the markers is kept")
        out.append(existing[pos:m.end()])
        body = sections.get(name)
        if body is None:  # a section this warp does not write: leave it as it is
            out.append(existing[m.end():close.start()])
        else:
            out.append(f"\n{body.rstrip()}\n")
            seen.add(name)
        pos = close.start()
        i += 2
    out.append(existing[pos:])
    text = "".join(out)
    for name, body in sections.items():
        if name not in seen:
            text = text.rstrip("\n") + f"\n\n{begin(name)}\n{body.rstrip()}\n{end(name)}\n"
    return text


_SUMMARY_ID = re.compile(r"^\| dataset \| `([^`]+)` \|[ \t]*$", re.M)


def card_dataset(text: str) -> str | None:
    """The dataset a card names: its first level-1 heading when that is a dataset id (``warp
    card`` heads a card ``# WS/NAME``), else the dataset row of its generated summary; None when
    it names none (a heading in words, no summary)."""
    for line in text.splitlines():
        if line.startswith("# "):
            title = line[2:].strip().strip("`").partition("@")[0]
            try:
                return validate_dataset_id(title)
            except UsageError:
                break  # a title in words names no dataset; the summary may
    m = _SUMMARY_ID.search(text)
    return m.group(1) if m else None


def generate(req: CardRequest) -> Card:
    name, _, version = req.dataset.partition("@")
    st = Store(req.store_url)
    m = st.resolve(name, version or None)
    sections = {
        "summary": _summary(st, m),
        "tables": _tables(m),
        "artifacts": _artifacts(m),
        "quarantine": _quarantine(st, m),
        "sources": _sources(st, m),
        "history": _history(st, name, m.version_hash) if req.history else "History not generated.",
        "preview": (f"![preview of {name}]({req.preview})" if req.preview else
                    f"No preview: {req.preview_error or 'not drawn (give --out to draw one beside the card)'}"),
    }
    stored = m.metadata.get("card") if isinstance(m.metadata.get("card"), str) else None
    existing, kept = (req.existing, "file") if req.existing is not None else (stored, "stored" if stored else None)
    return Card(name, m.version_hash, merge(existing, sections, name), sections, kept)


# -- sections --------------------------------------------------------------------------------------

def _size(n: int | None) -> str:
    return "" if n is None else format_size(n)


def _cell(v: Any) -> str:
    return str(v).replace("|", "\\|").replace("\n", " ")


def _table(header: list[str], rows: list[list[Any]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(_cell(c) for c in r) + " |" for r in rows]
    return "\n".join(lines)


def _summary(st, m) -> str:
    md = m.metadata
    rows = [["dataset", f"`{m.dataset_id}`"], ["version", f"`{m.version_hash}`"],
            ["published", md.get("created_at", "")], ["rows", m.stats.get("total_rows")],
            ["size", _size(m.stats.get("total_bytes"))]]
    text = "## Summary\n\n" + _table(["", ""], rows)  # no store URL: a card may be stored in a manifest
    if isinstance(md.get("description"), str):
        text += f"\n\n{md['description']}"
    return text


def _column_stats(t) -> dict[str, dict[str, Any]]:
    """Per column over every shard: min, max (where recorded), null count."""
    agg: dict[str, dict[str, Any]] = {}
    for s in t.shards:
        for col, st in ((s.stats or {}).get("columns") or {}).items():
            a = agg.setdefault(col, {"min": None, "max": None, "nulls": 0, "complete": True})
            if not isinstance(st, dict):
                a["complete"] = False
                continue
            a["nulls"] += int(st.get("null_count") or 0)
            for k, pick in (("min", min), ("max", max)):
                v = st.get(k)
                if v is None:
                    continue
                a[k] = v if a[k] is None else pick(a[k], v)
    return agg


def _tables(m) -> str:
    if not m.tables:
        return "## Tables\n\nNo tables."
    out = ["## Tables"]
    for name, t in sorted(m.tables.items()):
        stats = _column_stats(t)
        fields = (t.schema or {}).get("fields") or [{"name": c, "type": "", "nullable": True} for c in t.columns]
        rows = []
        for f in fields:
            s = stats.get(f["name"], {})
            rows.append([f"`{f['name']}`", f.get("type", ""), "" if s.get("min") is None else s["min"],
                         "" if s.get("max") is None else s["max"], s.get("nulls", "") if s else ""])
        out.append(f"### `{name}`: {t.row_count:,} rows, {len(t.shards)} shard(s), {_size(t.byte_size)}\n\n"
                   + _table(["column", "type", "min", "max", "nulls"], rows))
    return "\n\n".join(out)


def _artifacts(m) -> str:
    if not m.artifacts:
        return "## Artifacts\n\nNo artifacts."
    rows = [[f"`{n}`", a.kind, a.member_count, len(a.shards), _size(a.byte_size)]
            for n, a in sorted(m.artifacts.items())]
    text = "## Artifacts\n\n" + _table(["artifact", "kind", "members", "shards", "size"], rows)
    if m.bindings:
        text += "\n\nBindings (column values are members of the artifact):\n\n" + _table(
            ["table", "column", "artifact", "read as"],
            [[b.table, f"`{b.column}`", b.artifact, b.ref_type] for b in m.bindings])
    return text


def _read_table(st, t, columns: list[str]):
    import pyarrow as pa
    import pyarrow.parquet as pq

    parts = [pq.read_table(arrow_reader(st.get_blob(s.hash)), columns=columns) for s in t.shards]
    return pa.concat_tables(parts) if parts else None


def _first_rows(st, t, columns: list[str], n: int) -> list[dict[str, Any]]:
    import pyarrow.parquet as pq

    if not t.shards:
        return []
    return pq.read_table(arrow_reader(st.get_blob(t.shards[0].hash)), columns=columns).slice(0, n).to_pylist()


def _quarantine(st, m) -> str:
    name = next((n for n in sorted(m.tables) if n == "quarantine" or n.endswith("_quarantine")), None)
    if name is None or "reason" not in m.tables[name].columns:
        return "## Quarantine\n\nNo quarantine table: nothing was recorded as rejected."
    t = _read_table(st, m.tables[name], ["reason"])
    counts = Counter(t.column("reason").to_pylist()) if t is not None else Counter()
    if not counts:
        return f"## Quarantine\n\nNothing quarantined (table `{name}` is empty)."
    rows = [[f"`{r}`", n] for r, n in sorted(counts.items(), key=lambda x: (-x[1], x[0]))]
    return (f"## Quarantine\n\n{sum(counts.values()):,} sample(s) rejected (table `{name}`):\n\n"
            + _table(["reason", "count"], rows))


def _sources(st, m) -> str:
    out = ["## Sources"]
    producers = m.metadata.get("sources") or []
    if producers:
        rows = []
        for p in producers:
            ident = next((f"{k} `{p[k]}`" for k in ("version", "fingerprint", "recipe_key", "version_key")
                          if isinstance(p.get(k), str)), "")
            rows.append([f"`{p.get('artifact')}`", p.get("kind", ""), ident])
        out.append("Published from:\n\n" + _table(["artifact", "kind", "identity"], rows))
    name = next((n for n in sorted(m.tables) if n == "sources" or n.endswith("_sources")), None)
    if name is not None and {"key", "sha256"} <= set(m.tables[name].columns):
        t = m.tables[name]
        head = _first_rows(st, t, ["key", "sha256"], SOURCE_ROWS)
        more = t.row_count - len(head)
        out.append(f"{t.row_count:,} source file(s) with their SHA-256 (table `{name}`):\n\n"
                   + _table(["source", "sha256"], [[r["key"], f"`{r['sha256']}`"] for r in head])
                   + (f"\n\n… and {more:,} more: `warp stream {m.dataset_id} --table {name}`" if more > 0 else ""))
    if len(out) == 1:
        out.append("No source facts were recorded with this version.")
    return "\n\n".join(out)


def _history(st, name: str, current: str) -> str:
    hist = versions(st, name)
    rows, prev = [], None
    for v in hist:
        change = ""
        if prev is not None:
            change = diff_published(DiffRequest(name, from_version=prev, to_version=v.version_hash,
                                                store_url=st.url)).summary()
        mark = " (this card)" if v.version_hash == current else ""
        rows.append([f"`{v.version_hash[:12]}`{mark}", v.created_at or "", v.rows, _size(v.bytes),
                     change or "first version"])
        prev = v.version_hash
    return "## History\n\n" + _table(["version", "published", "rows", "size", "change from the previous"], rows)
