"""``warp embeddings add``: compute embeddings of a published column and publish them as a new version.

The publishing half of :mod:`warpdata.registry.embeddings` (which holds the format, the
built-in encoders and the search side that the read API uses). This module sits on the
publishing floor, above the systems (CONTRIBUTING.md "Floors"): it takes the feature cache's
encoder plug-ins (:mod:`warpdata.features.encoders`) and publishes through
:mod:`warpdata.publishing.publish`. The artifacts it writes, reuse and the ANN build are described
in :mod:`warpdata.registry.embeddings` and ``docs/formats/registry.md``.
"""

from __future__ import annotations

import importlib
import json
import os
import re
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import numpy as np
from warpdata.core.errors import ConfigError, DataError, UsageError, WarpError
from warpdata.core.progress import progress
from warpdata.features.encoders import checked_output, find_factory
from warpdata.publishing.publish import (
    PublishRequest,
    PublishResult,
    _Stager,
    _staging_dir,
    _upload,
)
from warpdata.read.dataset import dataset
from warpdata.registry.embeddings import (
    ANN_MIN_ROWS,
    BATCH,
    BUILTIN,
    CONTENT_COL,
    FAISS_HINT,
    INDEX_FORMAT,
    INDEX_KINDS,
    NAME_RE,
    _faiss,
    _normalize,
    build_ivf,
    content_hash,
    list_embeddings,
    log,
    zero_rows,
)
from warpdata.registry.gc import after_manifest
from warpdata.registry.manifest import Manifest, normalize
from warpdata.registry.store import Store

# lazy third-party imports: pyarrow (heavy) is imported inside the functions that use it, so
# importing this module does not load it

__all__ = ["AddResult", "add", "load_embedder"]


def load_embedder(name: str, *, device: str = "cpu", options: dict[str, Any] | None = None):
    """An embedding encoder by built-in name, ``module:function`` or entry point."""
    if name in BUILTIN:
        mod, _, attr = BUILTIN[name].partition(":")
        factory = getattr(importlib.import_module(mod), attr)
    else:
        factory = find_factory(name)
    try:
        enc = factory(device=device, **(options or {}))
    except TypeError as e:
        raise ConfigError(f"encoder {name!r} rejected its options {sorted(options or {})}: {e}",
                          hint="check the encoder's documentation") from e
    if not isinstance(getattr(enc, "dim", None), int) or not callable(getattr(enc, "embed", None)) \
            or not callable(getattr(enc, "identity", None)) or enc.dim <= 0:
        raise ConfigError(f"encoder {name!r} returned {type(enc).__name__}, which is not an embedding encoder",
                          hint="an embedding encoder has dim, embed(items) and identity(); "
                               f"built-ins: {', '.join(BUILTIN)}")
    return enc


@dataclass
class AddResult:
    name: str
    rows: int
    dim: int
    version_hash: str
    blobs_uploaded: int
    blobs_total: int
    encoded: int = 0  # rows the encoder embedded
    reused: int = 0  # rows whose vector came from an earlier version (same id and content)
    reused_from: str | None = None  # that version's hash
    index: str = "exact"  # the search index built: "exact" or "ivf-flat"
    ann: dict[str, Any] = field(default_factory=dict)  # ann.json of the ivf-flat index

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


# -- reuse of an earlier version's vectors ----------------------------------------

def _same(a: Any, b: Any) -> bool:
    return json.dumps(normalize(a), sort_keys=True) == json.dumps(normalize(b), sort_keys=True)


def _fits(d, name: str, identity: dict, tname: str, column: str) -> bool:
    m = list_embeddings(d).get(name)
    if m is None or not _same(m.get("encoder"), identity) or m.get("table") != tname or m.get("column") != column:
        return False
    fields = d.manifest.tables[f"emb_{name}"].schema.get("fields", [])
    return any(f.get("name") == CONTENT_COL for f in fields)


def _reuse_source(ds, store: str | None, name: str, identity: dict, tname: str, column: str):
    """The version to take vectors from: the current one if it has this embedding, else the newest that has."""
    if _fits(ds, name, identity, tname, column):
        return ds
    if ds.mode == "local":
        return None
    best, best_key = None, None
    for v in Store(store).list_versions(ds.id):
        if v == ds.version:
            continue
        try:
            d = dataset(ds.id, version=v, store=store, mode=ds.mode)
        except WarpError as e:  # an unreadable old version only costs the reuse
            log.warning(f"{ds.id}@{v[:12]}: not considered for embedding reuse: {e.message}")
            continue
        if _fits(d, name, identity, tname, column):
            key = (str(d.manifest.metadata.get("created_at", "")), v)
            if best_key is None or key > best_key:
                best, best_key = d, key
    return best


def _previous_vectors(prev, name: str, dim: int) -> tuple[dict[tuple[str, str], int], np.ndarray]:
    """(id, content hash) -> row, and the raw vectors, of embedding ``name`` in version ``prev``."""

    lookup: dict[tuple[str, str], int] = {}
    parts: list[np.ndarray] = []
    row = 0
    for b in prev.table(f"emb_{name}").batches(batch_size=65536, columns=["id", CONTENT_COL, "vector"],
                                                  rank=0, world_size=1):
        v = b.column("vector").flatten().to_numpy(zero_copy_only=False).astype(np.float32, copy=False)
        parts.append(v.reshape(-1, dim))
        for rid, h in zip(b.column("id").to_pylist(), b.column(CONTENT_COL).to_pylist(), strict=True):
            if h is not None:
                lookup[(rid, h)] = row
            row += 1
    return lookup, (np.concatenate(parts) if parts else np.zeros((0, dim), np.float32))


# -- add -------------------------------------------------------------------------------

def add(dataset_id: str, *, column: str, encoder: str, name: str | None = None, table: str | None = None,
        store: str | None = None, options: dict[str, Any] | None = None, device: str = "cpu",
        index: str = "auto", reuse: bool = True) -> AddResult:
    """Compute embeddings of ``table.column`` and publish them as a new version (see the module docstring).

    ``index``: ``auto`` (ivf-flat when FAISS is installed and there are at
    least :data:`ANN_MIN_ROWS` rows, else exact), ``exact`` or ``ivf-flat``.
    ``reuse``: take the vectors of unchanged rows from an earlier version.
    """

    name = name or re.sub(r"[^a-z0-9_]", "_", encoder.rsplit(":", 1)[-1].lower())[:64]
    if not NAME_RE.match(name):
        raise UsageError(f"embedding name {name!r} must be lowercase letters, digits and '_'", hint="e.g. --name clip")
    if index not in INDEX_KINDS:
        raise UsageError(f"unknown index kind {index!r}", hint=f"use one of: {', '.join(INDEX_KINDS)}")
    if index == "ivf-flat" and _faiss() is None:
        raise ConfigError("--index ivf-flat needs FAISS, which is not installed", hint=FAISS_HINT)
    ds = dataset(dataset_id, store=store)
    tname = table or ds.default_table
    if column not in ds.table(tname).schema_names():
        raise UsageError(f"{dataset_id}: table {tname} has no column {column!r}",
                         hint=f"columns: {', '.join(ds.table(tname).schema_names())}")
    enc = load_embedder(encoder, device=device, options=options)
    identity = enc.identity()
    binding = next((b for b in ds.manifest.bindings if b.table == tname and b.column == column), None)
    art = ds.artifact(binding.artifact) if binding else None
    id_col = "id" if "id" in ds.table(tname).schema_names() else None
    cols = [column] + ([id_col] if id_col and id_col != column else [])

    prev = _reuse_source(ds, store, name, identity, tname, column) if reuse else None
    lookup, prev_vectors = _previous_vectors(prev, name, enc.dim) if prev is not None else ({}, None)

    n = ds.table(tname).num_rows
    vectors = np.zeros((n, enc.dim), np.float32)
    ids: list[str] = []
    hashes: list[str | None] = []
    pending_rows: list[int] = []
    pending_items: list[Any] = []
    counts = {"encoded": 0, "reused": 0}

    def flush() -> None:
        if not pending_items:
            return
        samples = [f"row {r} (id {ids[r]})" for r in pending_rows]
        v = checked_output(enc.embed(pending_items), encoder=encoder, field="embed()", shape=(enc.dim,),
                           samples=samples).astype(np.float32)
        if not np.isfinite(v).all():  # finite float64 values past float32's range
            i = int(np.flatnonzero(~np.isfinite(v).all(axis=1))[0])
            raise DataError(f"encoder {encoder!r} embed(): values overflow float32 ({samples[i]})",
                            hint="fix the encoder plugin (scale its output)")
        vectors[pending_rows] = v
        counts["encoded"] += len(pending_rows)
        pending_rows.clear()
        pending_items.clear()

    row = 0
    with progress(f"embedding {tname}.{column}", total=n, unit="rows") as bar:
        for batch in ds.table(tname).batches(batch_size=BATCH, columns=cols, rank=0, world_size=1):
            vals = batch.column(column).to_pylist()
            if row + len(vals) > n:
                raise DataError(f"{dataset_id}: table {tname} yielded more rows than its manifest's {n}",
                                hint="republish the dataset")
            items = art.read_many(vals) if art is not None else vals
            bids = [str(x) for x in batch.column(id_col).to_pylist()] if id_col else \
                [str(row + i) for i in range(len(vals))]
            for item, rid in zip(items, bids, strict=True):
                h = content_hash(item)
                ids.append(rid)  # before a flush, which names the rows by id
                hashes.append(h)
                hit = lookup.get((rid, h)) if h is not None else None
                if hit is not None:
                    vectors[row] = prev_vectors[hit]
                    counts["reused"] += 1
                else:
                    pending_rows.append(row)
                    pending_items.append(item)
                    if len(pending_items) >= BATCH:
                        flush()
                row += 1
            bar.advance(len(vals))
        flush()
    if row != n:
        raise DataError(f"{dataset_id}: table {tname} yielded {row} rows, its manifest says {n}",
                        hint="republish the dataset")
    _refuse_zero_rows(vectors, ids, encoder)
    kind = _index_kind(index, n)
    work = tempfile.mkdtemp(prefix="warp-emb-")
    try:
        meta, ann_meta = _write_index(work, name, enc.dim, identity, tname, column, vectors, ids, hashes, kind)
        manifest, result, blobs_total = _publish_version(ds, dataset_id, store, name, work, meta, ann_meta)
        return AddResult(name, n, enc.dim, manifest.version_hash, result.blobs_uploaded, blobs_total,
                         encoded=counts["encoded"], reused=counts["reused"],
                         reused_from=prev.version if prev is not None and counts["reused"] else None,
                         index=kind, ann=ann_meta)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _refuse_zero_rows(vectors: np.ndarray, ids: list[str], encoder: str) -> None:
    """DataError naming the rows whose vector is all zeros (no direction for a cosine search)."""
    zero = zero_rows(vectors)
    if len(zero):
        named = ", ".join(f"{int(r)} (id {ids[r]})" for r in zero[:5]) + (f" and {len(zero) - 5} more"
                                                                          if len(zero) > 5 else "")
        raise DataError(f"encoder {encoder!r} gave {len(zero)} all-zero vector(s), which have no direction (every "
                        f"cosine distance to them would be 1.0): rows {named}",
                        hint="fix the encoder, or leave those rows out of the table before embedding it",
                        rows=[int(r) for r in zero[:100]])


def _index_kind(index: str, n: int) -> str:
    """The index to build: ``ivf-flat`` when asked, or on ``auto`` with FAISS and enough rows; else ``exact``."""
    kind = "ivf-flat" if index == "ivf-flat" or (index == "auto" and n >= ANN_MIN_ROWS and _faiss() is not None) \
        else "exact"
    if kind == "ivf-flat" and n == 0:
        kind = "exact"
    return kind


def _write_index(work: str, name: str, dim: int, identity: dict, tname: str, column: str, vectors: np.ndarray,
                 ids: list[str], hashes: list[str | None], kind: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """Write ``emb_<name>.parquet``, ``index/`` and (ivf-flat) ``ann/`` into ``work``; (index.json, ann.json)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    n = len(ids)
    tpath = os.path.join(work, f"emb_{name}.parquet")
    flat = pa.array(vectors.reshape(-1), pa.float32())
    pq.write_table(pa.table({"row": pa.array(np.arange(n), pa.int64()), "id": pa.array(ids, pa.string()),
                             CONTENT_COL: pa.array(hashes, pa.string()),
                             "vector": pa.FixedSizeListArray.from_arrays(flat, dim)}),
                   tpath, compression="zstd")
    normed = _normalize(vectors)
    idx_dir = os.path.join(work, "index")
    os.mkdir(idx_dir)
    np.save(os.path.join(idx_dir, "vectors.npy"), normed, allow_pickle=False)
    meta: dict[str, Any] = {"format": INDEX_FORMAT, "metric": "cosine", "dim": dim, "count": n,
                            "encoder": identity, "table": tname, "column": column}
    with open(os.path.join(idx_dir, "index.json"), "w") as f:
        json.dump(meta, f, sort_keys=True)
    ann_meta: dict[str, Any] = {}
    if kind == "ivf-flat":
        ann_dir = os.path.join(work, "ann")
        os.mkdir(ann_dir)
        data, ann_meta = build_ivf(normed)
        with open(os.path.join(ann_dir, "index.faiss"), "wb") as f:
            f.write(data)
        with open(os.path.join(ann_dir, "ann.json"), "w") as f:
            json.dump(ann_meta, f, sort_keys=True)
    return meta, ann_meta


def _publish_version(ds, dataset_id: str, store: str | None, name: str, work: str, meta: dict[str, Any],
                     ann_meta: dict[str, Any]) -> tuple[Manifest, PublishResult, int]:
    """Publish ``ds``'s version plus the embedding written in ``work``: (manifest, result, blobs in it)."""
    st = Store(store) if store else Store(None)
    req = PublishRequest(dataset_id, store_url=store)
    stage = _staging_dir()
    try:
        stager = _Stager(req, stage)
        new_table = stager.table(f"emb_{name}", [os.path.join(work, f"emb_{name}.parquet")])
        arts = {k: v for k, v in ds.manifest.artifacts.items() if k != f"emb_{name}_ann"}
        arts[f"emb_{name}_index"] = stager.artifact(f"emb_{name}_index", os.path.join(work, "index"))
        if ann_meta:
            arts[f"emb_{name}_ann"] = stager.artifact(f"emb_{name}_ann", os.path.join(work, "ann"))
        old = ds.manifest
        facts = {**meta, "ann": ann_meta} if ann_meta else meta
        manifest = Manifest(dataset_id, tables={**old.tables, f"emb_{name}": new_table}, artifacts=arts,
                            bindings=old.bindings,
                            metadata={**old.metadata,
                                      "created_at": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
                                      "embeddings": {**old.metadata.get("embeddings", {}), name: facts}})
        blobs = list(stager.blobs.values())
        checked_at = time.time()
        missing = set(st.missing_blobs([b.hash for b in blobs]))
        result = PublishResult(dataset_id, manifest.version_hash, st.url, False, [])
        _upload(st, [b for b in blobs if b.hash in missing], 4, result, None)
        if not st.has_manifest(dataset_id, manifest.version_hash):
            st.put_manifest(manifest)
        # a 'warp gc' sweep since the check may have deleted blobs found present: as publish does
        # (docs/formats/registry.md, "Garbage collection")
        by_hash = {b.hash: b for b in blobs}
        after_manifest(st, checked_at, list(by_hash),
                       lambda gone: _upload(st, [by_hash[h] for h in gone], 4, result, None))
        before = st.read_latest(dataset_id)
        if before is None or before.version_hash != manifest.version_hash:
            st.cas_latest(dataset_id, manifest.version_hash, before) or \
                st.set_latest(dataset_id, manifest.version_hash, check_manifest=False)
    finally:
        shutil.rmtree(stage, ignore_errors=True)
    return manifest, result, len(blobs)
