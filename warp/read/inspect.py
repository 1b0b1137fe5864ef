"""``warp inspect ws/name``: a published dataset, read from its manifest; the ``dataset`` kind's
inspector and previewer, named in the artifact-kind table (:mod:`warpdata.artifacts.kinds`).

Recognises targets that are not existing paths and look like
``workspace/name``; shows the resolved version, tables (shards, rows, bytes,
schema), artifacts (shards, members), bindings and stats, and with
``--head N`` the first N rows of each table (ranged reads only). ``--verify``
hashes every blob of the version (downloading it into the cache) and lists its signers (key id,
whether the signature verifies, whether ``WARP_TRUSTED_KEYS`` trusts the key). ``--preview`` draws a contact
sheet of the first images of the first image-bound column.
"""

from __future__ import annotations

import os
import re

from warpdata.artifacts.inspect import Report
from warpdata.artifacts.preview import Preview, contact_sheet
from warpdata.core.errors import BlobCorruptedError, UsageError
from warpdata.read.dataset import dataset
from warpdata.registry import signing
from warpdata.registry.parquet_stats import page_index_disagreements, stats_disagreements

_ID = re.compile(r"^[a-z0-9_-]+/[a-z0-9_-]+$")


def sniff(target: str, head: bytes | None, is_dir: bool) -> bool:
    return head is None and not is_dir and not os.path.exists(target) and bool(_ID.match(target))


def inspect(target: str, *, verify: bool = False, head: int = 0) -> Report:
    ds = dataset(target)
    m = ds.manifest
    tables_rows, schema_rows, head_tables = [], [], []
    for name in ds.tables:
        t = ds.table(name)
        tm = m.tables[name]
        tables_rows.append([name, len(tm.shards), tm.row_count, tm.byte_size])
        for f in (tm.schema or {}).get("fields", []):
            schema_rows.append([name, f["name"], f["type"], f.get("nullable", True)])
        if head:
            h = t.head(head)
            cols = h.schema.names
            rows = [[_short(v) for v in r.values()] for r in h.to_pylist()]
            head_tables.append((f"head of {name}", cols, rows))
    art_rows = [[a, m.artifacts[a].kind, len(m.artifacts[a].shards), m.artifacts[a].member_count,
                 m.artifacts[a].byte_size] for a in ds.artifacts]
    bind_rows = [[b.table, b.column, b.artifact, b.ref_type] for b in m.bindings]
    summary = {"dataset": ds.id, "version": ds.version, "mode": ds.mode, "store": ds.remote.url,
               "stats": m.stats, "tables_count": len(ds.tables), "artifacts_count": len(ds.artifacts)}
    problems: list[str] = []
    if verify and getattr(ds, "registered", False):  # files read in place: hash each one, stamps or not
        problems += ds.verify_files()
    elif verify:
        for s in m.blobs():
            try:
                ds.fetch_blob(s)
            except BlobCorruptedError as e:
                problems.append(e.message)
        if not problems:  # the bytes are the published ones: do the statistics filters prune by bound them?
            problems += _check_statistics(ds)
    sign_rows: list[list] = []
    if verify and not getattr(ds, "registered", False):  # who signed the version (registry.signing)
        conf = signing.configured_keys()
        found = signing.signers(m, conf[1] if conf else None, source=f"{ds.id}@{ds.version}")
        sign_rows = [[s.key_id, s.algorithm, "yes" if s.valid else "NO",
                      ("yes" if s.trusted else "no") if conf else "no WARP_TRUSTED_KEYS"] for s in found]
        problems += [f"{ds.id}@{ds.version}: the signature of key {s.key_id} does not verify" for s in found if not s.valid]
        summary["signers"] = [s.to_dict() for s in found]
    tables = [("tables", ["table", "shards", "rows", "bytes"], tables_rows)]
    if schema_rows:
        tables.append(("schema", ["table", "column", "type", "nullable"], schema_rows))
    if art_rows:
        tables.append(("artifacts", ["artifact", "kind", "shards", "members", "bytes"], art_rows))
    if bind_rows:
        tables.append(("bindings", ["table", "column", "artifact", "ref_type"], bind_rows))
    if verify and not getattr(ds, "registered", False):
        tables.append(("signers" if sign_rows else "signers: none, the version is unsigned",
                       ["key_id", "algorithm", "valid", "trusted"], sign_rows))
    tables += head_tables
    return Report(kind="dataset", target=target, summary=summary, tables=tables, ok=not problems, problems=problems)


def _check_statistics(ds) -> list[str]:
    """Each table shard's manifest statistics against its data (read from the cache, where
    ``--verify`` just put every blob): a filter never prunes rows that are there."""
    import pyarrow.parquet as pq

    out: list[str] = []
    for name in ds.tables:
        for k, s in enumerate(ds.manifest.tables[name].shards):
            path = ds.cached_path(s)
            if path is None or not s.stats:
                continue
            out += stats_disagreements(pq.ParquetFile(path), s.stats, f"table {name} shard {k}")
            out += page_index_disagreements(str(path), s.stats, f"table {name} shard {k}")
    return out


def _short(v: object) -> object:
    if isinstance(v, (bytes, bytearray)):
        return f"<{len(v)} bytes>"
    if isinstance(v, str) and len(v) > 60:
        return v[:57] + "..."
    return v


def preview(name: str, n: int = 16, store: str | None = None, version: str | None = None) -> Preview:
    """A contact sheet of the first ``n`` images of ``name``'s first image-bound column."""
    ds = dataset(name, store=store, version=version)
    for b in ds.manifest.bindings:
        if b.ref_type == "image":
            rows = ds.table(b.table).select([b.column]).head(n).column(b.column).to_pylist()
            art = ds.artifact(b.artifact)
            members = [m for m in rows if m]
            return contact_sheet(list(zip(members, art.read_many(members), strict=True)), "dataset")
    raise UsageError(f"{name} binds no column to an image artifact, so there is nothing to draw",
                     hint="--preview draws datasets with an image binding (e.g. from 'warp ingest imagefolder')")
