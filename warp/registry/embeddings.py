"""Embeddings as a derived artifact of a published dataset.

:func:`add` reads one column of a published table (an image-bound column is
read through its artifact; any other column as text), computes one vector per
row with an *embedding encoder*, and publishes a new version of the dataset
that adds, beside everything the current version holds (reused as is, no blob
re-sent):

* table ``emb_<name>``: ``row`` (int64, the row's position in the source
  table), ``id`` (the source's ``id`` column as text, else the row number)
  and ``vector`` (fixed-size list of float32);
* artifact ``emb_<name>_index``: ``vectors.npy`` (the L2-normalised N×D
  float32 matrix, in ``row`` order) and ``index.json`` (``format``
  ``warp-exact-index-1``, metric ``cosine``, dim, count, the encoder's
  identity, source table and column). Search over it is exact (brute force,
  one matrix-vector product in BLAS).

Embedding encoders use the feature cache's plugin mechanism
(:func:`warpdata.features.encoders.find_factory`: a built-in name, a
``package.module:function`` or a ``warpdata.encoders`` entry point). The
factory is called as ``factory(device=..., **options)`` and returns an object
with ``dim`` (int), ``embed(items) -> ndarray (B, dim)`` (items are image
bytes for image columns, strings otherwise) and ``identity() -> dict``.
The built-in ``color-hist`` (images: a normalised 4×4×4 RGB histogram plus an
8×8 grey thumbnail) and ``hash-text`` (strings: signed feature hashing of
tokens) need no weights.
"""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import tempfile
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from warpdata.core.errors import ConfigError, DataError, MissingInputError, UsageError

if TYPE_CHECKING:
    import numpy as np

__all__ = ["ColorHistEncoder", "EmbeddingIndex", "HashTextEncoder", "add", "info", "list_embeddings",
           "load_embedder", "open_index"]

INDEX_FORMAT = "warp-exact-index-1"
BUILTIN: dict[str, str] = {
    "color-hist": "warpdata.registry.embeddings:ColorHistEncoder",
    "hash-text": "warpdata.registry.embeddings:HashTextEncoder",
}
NAME_RE = re.compile(r"^[a-z0-9_]{1,64}$")
BATCH = 256


class ColorHistEncoder:
    """Weight-free image embedding: 64-bin RGB histogram + 8×8 grey thumbnail (128-D)."""

    dim = 128

    def __init__(self, *, device: str = "cpu") -> None:
        self.device = device

    def embed(self, items: list[bytes]) -> np.ndarray:
        import numpy as np
        from PIL import Image

        out = np.zeros((len(items), self.dim), np.float32)
        for i, data in enumerate(items):
            if not isinstance(data, (bytes, bytearray, memoryview)):
                raise DataError(f"color-hist: item {i} is {type(data).__name__}, not image bytes",
                                hint="embed an image-bound column, or use --encoder hash-text for text")
            try:
                with Image.open(io.BytesIO(data)) as im:
                    rgb = np.asarray(im.convert("RGB").resize((32, 32), Image.BILINEAR))
            except (OSError, ValueError) as e:
                raise DataError(f"color-hist: item {i} is not a decodable image: {e}",
                                hint="embed an image column, or use --encoder hash-text for text") from None
            q = (rgb // 64).reshape(-1, 3).astype(np.int64)
            out[i, :64] = np.bincount(q[:, 0] * 16 + q[:, 1] * 4 + q[:, 2], minlength=64) / q.shape[0]
            grey = rgb.mean(axis=2).reshape(8, 4, 8, 4).mean(axis=(1, 3)) / 255.0
            out[i, 64:] = grey.reshape(-1) - grey.mean()
        return out

    def identity(self) -> dict[str, Any]:
        return {"name": "color-hist", "version": 1, "dim": self.dim}


class HashTextEncoder:
    """Weight-free text embedding: signed feature hashing of lower-cased word tokens (256-D)."""

    def __init__(self, *, device: str = "cpu", dim: int = 256) -> None:
        self.dim = int(dim)

    def embed(self, items: list[str]) -> np.ndarray:
        import numpy as np
        import xxhash

        out = np.zeros((len(items), self.dim), np.float32)
        for i, text in enumerate(items):
            for tok in re.findall(r"\w+", str(text or "").lower()):
                h = xxhash.xxh64_intdigest(tok.encode())
                out[i, h % self.dim] += 1.0 if (h >> 63) & 1 else -1.0
        return out

    def identity(self) -> dict[str, Any]:
        return {"name": "hash-text", "version": 1, "dim": self.dim}


def load_embedder(name: str, *, device: str = "cpu", options: dict[str, Any] | None = None):
    """An embedding encoder by built-in name, ``module:function`` or entry point."""
    from warpdata.features import encoders

    if name in BUILTIN:
        mod, _, attr = BUILTIN[name].partition(":")
        import importlib

        factory = getattr(importlib.import_module(mod), attr)
    else:
        factory = encoders.find_factory(name)
    try:
        enc = factory(device=device, **(options or {}))
    except TypeError as e:
        raise ConfigError(f"encoder {name!r} rejected its options {sorted(options or {})}: {e}",
                          hint="check the encoder's documentation") from e
    if not isinstance(getattr(enc, "dim", None), int) or not callable(getattr(enc, "embed", None)) \
            or not callable(getattr(enc, "identity", None)):
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

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def _normalize(v: np.ndarray) -> np.ndarray:
    import numpy as np

    n = np.linalg.norm(v, axis=1, keepdims=True)
    return np.divide(v, n, out=np.zeros_like(v), where=n > 0)


def add(dataset_id: str, *, column: str, encoder: str, name: str | None = None, table: str | None = None,
        store: str | None = None, options: dict[str, Any] | None = None) -> AddResult:
    """Compute embeddings of ``table.column`` and publish them as a new version (see the module docstring)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq
    import warpdata
    from warpdata.registry.manifest import Manifest
    from warpdata.registry.publish import (
        PublishRequest,
        PublishResult,
        _Stager,
        _staging_dir,
        _upload,
    )
    from warpdata.registry.store import Store

    name = name or re.sub(r"[^a-z0-9_]", "_", encoder.rsplit(":", 1)[-1].lower())[:64]
    if not NAME_RE.match(name):
        raise UsageError(f"embedding name {name!r} must be lowercase letters, digits and '_'", hint="e.g. --name clip")
    ds = warpdata.dataset(dataset_id, store=store)
    tname = table or ds.default_table
    if column not in ds.table(tname).schema_names():
        raise UsageError(f"{dataset_id}: table {tname} has no column {column!r}",
                         hint=f"columns: {', '.join(ds.table(tname).schema_names())}")
    enc = load_embedder(encoder, options=options)
    binding = next((b for b in ds.manifest.bindings if b.table == tname and b.column == column), None)
    art = ds.artifact(binding.artifact) if binding else None
    id_col = "id" if "id" in ds.table(tname).schema_names() else None
    cols = [column] + ([id_col] if id_col and id_col != column else [])
    rows_v: list[np.ndarray] = []
    ids: list[str] = []
    row0 = 0
    for batch in ds.table(tname).batches(batch_size=BATCH, columns=cols, rank=0, world_size=1):
        vals = batch.column(column).to_pylist()
        items = art.read_many(vals) if art is not None else vals
        v = np.asarray(enc.embed(items), np.float32)
        if v.shape != (len(vals), enc.dim) or not np.isfinite(v).all():
            raise DataError(f"encoder {encoder!r} returned {v.shape} (or non-finite values) for rows "
                            f"{row0}..{row0 + len(vals) - 1}, expected ({len(vals)}, {enc.dim})",
                            hint="fix the encoder plugin")
        rows_v.append(v)
        ids.extend(str(x) for x in batch.column(id_col).to_pylist()) if id_col else \
            ids.extend(str(row0 + i) for i in range(len(vals)))
        row0 += len(vals)
    vectors = np.concatenate(rows_v) if rows_v else np.zeros((0, enc.dim), np.float32)
    work = tempfile.mkdtemp(prefix="warp-emb-")
    try:
        tpath = os.path.join(work, f"emb_{name}.parquet")
        flat = pa.array(vectors.reshape(-1), pa.float32())
        pq.write_table(pa.table({"row": pa.array(np.arange(len(ids)), pa.int64()), "id": ids,
                                 "vector": pa.FixedSizeListArray.from_arrays(flat, enc.dim)}),
                       tpath, compression="zstd")
        idx_dir = os.path.join(work, "index")
        os.mkdir(idx_dir)
        buf = io.BytesIO()
        np.save(buf, _normalize(vectors), allow_pickle=False)
        with open(os.path.join(idx_dir, "vectors.npy"), "wb") as f:
            f.write(buf.getvalue())
        meta = {"format": INDEX_FORMAT, "metric": "cosine", "dim": enc.dim, "count": len(ids),
                "encoder": enc.identity(), "table": tname, "column": column}
        with open(os.path.join(idx_dir, "index.json"), "w") as f:
            json.dump(meta, f, sort_keys=True)
        st = Store(store) if store else Store(None)
        req = PublishRequest(dataset_id, store_url=store)
        stage = _staging_dir()
        try:
            stager = _Stager(req, stage)
            new_table = stager.table(f"emb_{name}", [tpath])
            new_art = stager.artifact(f"emb_{name}_index", idx_dir)
            old = ds.manifest
            manifest = Manifest(dataset_id, tables={**old.tables, f"emb_{name}": new_table},
                                artifacts={**old.artifacts, f"emb_{name}_index": new_art}, bindings=old.bindings,
                                metadata={**old.metadata, "embeddings": {**old.metadata.get("embeddings", {}),
                                                                         name: meta}})
            blobs = list(stager.blobs.values())
            missing = set(st.missing_blobs([b.hash for b in blobs]))
            result = PublishResult(dataset_id, manifest.version_hash, st.url, False, [])
            _upload(st, [b for b in blobs if b.hash in missing], 4, result, None)
            if not st.has_manifest(dataset_id, manifest.version_hash):
                st.put_manifest(manifest)
            before = st.read_latest(dataset_id)
            if before is None or before.version_hash != manifest.version_hash:
                st.cas_latest(dataset_id, manifest.version_hash, before) or \
                    st.set_latest(dataset_id, manifest.version_hash, check_manifest=False)
        finally:
            shutil.rmtree(stage, ignore_errors=True)
        return AddResult(name, len(ids), enc.dim, manifest.version_hash, result.blobs_uploaded, len(blobs))
    finally:
        shutil.rmtree(work, ignore_errors=True)


def list_embeddings(ds) -> dict[str, dict[str, Any]]:
    """Name -> index facts for every embedding in ``ds``'s version."""
    found = dict(ds.manifest.metadata.get("embeddings", {}))
    return {n: m for n, m in sorted(found.items())
            if f"emb_{n}" in ds.manifest.tables and f"emb_{n}_index" in ds.manifest.artifacts}


def info(ds, name: str) -> dict[str, Any]:
    got = list_embeddings(ds)
    if name not in got:
        raise MissingInputError(f"{ds.id} has no embedding {name!r} (embeddings: {', '.join(got) or 'none'})",
                                hint=f"run 'warp embeddings add {ds.id} --column COLUMN --encoder NAME'")
    return {"name": name, **got[name]}


class EmbeddingIndex:
    """Exact cosine search over one published embedding (``ds.embeddings(name)``)."""

    def __init__(self, ds, name: str) -> None:
        import numpy as np

        self.ds = ds
        self.name = name
        self.meta = info(ds, name)
        art = ds.artifact(f"emb_{name}_index")
        self.vectors = np.load(io.BytesIO(art.read("vectors.npy")), allow_pickle=False)
        if self.vectors.shape != (self.meta["count"], self.meta["dim"]):
            raise DataError(f"{ds.id}: embedding {name} holds {self.vectors.shape} vectors, its index.json says "
                            f"({self.meta['count']}, {self.meta['dim']})", hint="re-run 'warp embeddings add'")
        self._ids: list[str] | None = None

    @property
    def ids(self) -> list[str]:
        if self._ids is None:
            self._ids = self.ds.table(f"emb_{self.name}").to_arrow().column("id").to_pylist()
        return self._ids

    def search(self, query, k: int = 10) -> list[dict[str, Any]]:
        """The ``k`` nearest rows to ``query`` (a vector, a row number or an id string), by cosine distance."""
        import numpy as np

        if isinstance(query, (int, np.integer)):
            if not 0 <= int(query) < len(self.vectors):
                raise UsageError(f"row {query} is out of range ({len(self.vectors)} rows)", hint="give a row number")
            q = self.vectors[int(query)]
        elif isinstance(query, str):
            try:
                q = self.vectors[self.ids.index(query)]
            except ValueError:
                raise MissingInputError(f"{self.ds.id}: no row with id {query!r} in embedding {self.name}",
                                        hint="give a row number or a vector") from None
        else:
            q = np.asarray(query, np.float32).reshape(-1)
            if q.shape != (self.meta["dim"],):
                raise UsageError(f"query has {q.size} dimensions, embedding {self.name} has {self.meta['dim']}",
                                 hint="embed the query with the same encoder")
            n = np.linalg.norm(q)
            q = q / n if n > 0 else q
        sims = self.vectors @ q
        k = max(0, min(int(k), len(sims)))
        top = np.argpartition(-sims, k - 1)[:k] if 0 < k < len(sims) else np.arange(len(sims))[:k]
        top = top[np.lexsort((top, -sims[top]))]  # by similarity, then row: deterministic ties
        return [{"row": int(i), "id": self.ids[i], "distance": float(1.0 - sims[i])} for i in top]


def open_index(ds, name: str) -> EmbeddingIndex:
    return EmbeddingIndex(ds, name)
