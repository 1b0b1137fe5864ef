"""Embeddings as a derived artifact of a published dataset.

:func:`warpdata.publishing.embeddings_add.add` reads one column of a published table (an image-bound column is
read through its artifact; any other column as text), computes one vector per
row with an *embedding encoder*, and publishes a new version of the dataset
that adds, beside everything the current version holds (reused as is, no blob
re-sent):

* table ``emb_<name>``: ``row`` (int64, the row's position in the source
  table), ``id`` (the source's ``id`` column as text, else the row number),
  ``content_sha256`` (SHA-256 of the value the encoder was given: the image
  bytes of an image-bound column, the UTF-8 text otherwise) and ``vector``
  (fixed-size list of float32);
* artifact ``emb_<name>_index``: ``vectors.npy`` (the L2-normalised N×D
  float32 matrix, in ``row`` order) and ``index.json`` (``format``
  ``warp-exact-index-1``, metric ``cosine``, dim, count, the encoder's
  identity, source table and column). Exact search over it is one
  matrix-vector product in BLAS;
* artifact ``emb_<name>_ann`` (when FAISS is installed and the table has at
  least :data:`ANN_MIN_ROWS` rows, or ``index="ivf-flat"``): ``index.faiss``
  (a serialised FAISS ``IndexIVFFlat`` over the normalised vectors, inner
  product) and ``ann.json`` (``format`` ``warp-faiss-ivf-flat-1``, ``nlist``,
  the tuned ``nprobe``, the recall it reached at build, the SHA-256 of
  ``index.faiss``). Both artifacts are tar shards named by their SHA-256 and
  listed in the manifest, so the version hash covers the index bytes
  (``docs/formats/registry.md``).

The ANN build is deterministic: ``nlist = round(sqrt(N))`` (at most N/39, so
k-means has 39 points a centroid), k-means on a training sample drawn with a
fixed seed, with FAISS's fixed k-means seed; the same vectors give the same
bytes, so re-adding uploads nothing. ``nprobe`` is the smallest power of two
(up to ``nlist``) whose recall@10 against exact search, on a fixed sample of
rows used as queries (themselves left out), reaches :data:`ANN_RECALL_TARGET`.
IVF-Flat keeps the full vectors, so the distances it returns are exact.

Search (:class:`EmbeddingIndex`, ``ds.embeddings(name)``) uses the ANN index
when the version has one and FAISS imports, else the exact index. Index
blobs come whole into the content-addressed blob cache, verified, once; a
later search (any process) reads them from there (``remote`` mode keeps
nothing: it GETs the shards whole and checks their hashes each time).

Reuse: before encoding, :func:`add` looks for this embedding (same name,
encoder identity, table and column) in the current version, else in the
newest other version of the dataset that has it, and takes the vector of
every row whose ``id`` and ``content_sha256`` match; only the other rows are
encoded (``reuse=False`` encodes all).

Embedding encoders use the feature cache's plugin mechanism
(:func:`warpdata.features.encoders.find_factory`: a built-in name, a
``package.module:function`` or a ``warpdata.encoders`` entry point). The
factory is called as ``factory(device=..., **options)`` and returns an object
with ``dim`` (int), ``embed(items) -> ndarray (B, dim)`` (items are image
bytes for image columns, strings otherwise) and ``identity() -> dict`` (what
makes its vectors differ: model, weights, options; reuse compares it). The
built-in ``color-hist`` (images: a normalised 4×4×4 RGB histogram plus an
8×8 grey thumbnail) and ``hash-text`` (strings: signed feature hashing of
tokens) need no weights; ``examples/openclip_encoder.py`` wraps OpenCLIP.
Output that is ragged, text, zero-width, wrongly shaped or non-finite is an
:class:`~warpdata.features.encoders.EncoderOutputError` naming the encoder and
the row (:func:`~warpdata.features.encoders.checked_output`); all-zero vectors
(no direction: every cosine distance to them is 1.0) are refused naming their
rows; vectors are normalised in float64, so large finite values do not
overflow to zero.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import math
import re
from typing import TYPE_CHECKING, Any

from warpdata.core.errors import (
    BlobCorruptedError,
    ConfigError,
    DataError,
    MissingInputError,
    UsageError,
)
from warpdata.core.jsondoc import load_json
from warpdata.core.moved import moved_name

# lazy third-party imports: numpy, PIL and faiss (heavy; faiss optional) are imported inside the
# functions that use them, so importing this module loads none of them

if TYPE_CHECKING:
    import numpy as np

__all__ = ["ColorHistEncoder", "EmbeddingIndex", "HashTextEncoder", "build_ivf", "info", "list_embeddings",
           "open_index"]

# The publishing half moved up a floor to warpdata.publishing.embeddings_add; its names stay
# importable from here until warpdata.core.moved.REMOVED_IN, resolved on use with a
# DeprecationWarning (an import here would be a reach from the dataset contract up to the
# publishing wing: CONTRIBUTING.md "Floors").
_MOVED = {"add": "warpdata.publishing.embeddings_add", "AddResult": "warpdata.publishing.embeddings_add",
          "load_embedder": "warpdata.publishing.embeddings_add"}


def __getattr__(name: str) -> Any:
    if name in _MOVED:
        return moved_name(__name__, name, _MOVED[name])
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

log = logging.getLogger(__name__)

INDEX_FORMAT = "warp-exact-index-1"
ANN_FORMAT = "warp-faiss-ivf-flat-1"
INDEX_KINDS = ("auto", "exact", "ivf-flat")
ANN_MIN_ROWS = 10_000  # below this an exact matrix-vector product is as fast as any index (auto builds none)
ANN_RECALL_TARGET = 0.97  # nprobe grows until the build-time sample reaches this recall@10
ANN_TUNE_QUERIES = 512
ANN_SEED = 1234
ANN_TRAIN_PER_LIST = 50  # k-means training rows per inverted list (FAISS wants at least 39)
CONTENT_COL = "content_sha256"
FAISS_HINT = "install FAISS: pip install 'warp-toolchain[faiss]' (or faiss-cpu)"
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


def _faiss():
    """The ``faiss`` module, or None when it is not installed (the optional ``faiss`` extra)."""
    try:
        import faiss
    except ImportError:
        return None
    return faiss


def zero_rows(v: np.ndarray) -> np.ndarray:
    """Row numbers of all-zero vectors: no direction, so no cosine distance."""
    import numpy as np

    return np.flatnonzero(~v.any(axis=1))


def _normalize(v: np.ndarray) -> np.ndarray:
    import numpy as np

    v64 = v.astype(np.float64)  # a float32 norm overflows for large finite values
    n = np.linalg.norm(v64, axis=1, keepdims=True)
    return np.divide(v64, n, out=np.zeros_like(v64), where=n > 0).astype(np.float32)


def content_hash(value: Any) -> str | None:
    """SHA-256 hex of what the encoder is given for one row (bytes as is, text as UTF-8); None for null."""
    if value is None:
        return None
    if isinstance(value, (bytes, bytearray, memoryview)):
        data = bytes(value)
    elif isinstance(value, str):
        data = value.encode("utf-8")
    else:  # numbers, lists, structs: tagged canonical JSON (never equal to a text value's bytes)
        data = b"\x00json:" + json.dumps(value, sort_keys=True, default=str, ensure_ascii=False).encode()
    return hashlib.sha256(data).hexdigest()


# -- the ANN index -------------------------------------------------------------------

def _recall(found: np.ndarray, truth: np.ndarray, rows: np.ndarray, k: int) -> float:
    """Mean recall@k of ``found`` against ``truth`` (k+1 columns each), each query's own row left out."""
    hits = total = 0
    for f, t, r in zip(found, truth, rows, strict=True):
        want = [x for x in t if x != r and x >= 0][:k]
        got = {x for x in f if x != r and x >= 0}
        hits += sum(1 for x in want if x in got)
        total += len(want)
    return hits / total if total else 1.0


def build_ivf(vectors: np.ndarray, *, k: int = 10) -> tuple[bytes, dict[str, Any]]:
    """A deterministic FAISS IVF-Flat index over L2-normalised ``vectors`` (N×D float32), tuned.

    Returns the serialised index and its ``ann.json`` facts (module docstring:
    nlist, training sample, nprobe tuning). Raises :class:`ConfigError` when
    FAISS is not installed.
    """
    import numpy as np

    faiss = _faiss()
    if faiss is None:
        raise ConfigError("an ivf-flat index needs FAISS, which is not installed", hint=FAISS_HINT)
    x = np.ascontiguousarray(vectors, np.float32)
    n, d = x.shape
    if n == 0:
        raise UsageError("an ivf-flat index needs at least one vector", hint="use index='exact'")
    nlist = max(1, min(round(math.sqrt(n)), n // 39))
    rng = np.random.default_rng(ANN_SEED)
    train_n = min(n, ANN_TRAIN_PER_LIST * nlist)
    train = x if train_n == n else x[np.sort(rng.choice(n, train_n, replace=False))]
    index = faiss.IndexIVFFlat(faiss.IndexFlatIP(d), d, nlist, faiss.METRIC_INNER_PRODUCT)
    index.cp.seed = ANN_SEED
    index.cp.niter = 20
    index.cp.verbose = False
    index.train(np.ascontiguousarray(train))
    index.add(x)
    # tune nprobe on rows used as queries (their own row left out), against exact search
    qrows = np.sort(rng.choice(n, min(n, ANN_TUNE_QUERIES), replace=False))
    q = np.ascontiguousarray(x[qrows])
    kk = min(k + 1, n)
    _, truth = faiss.knn(q, x, kk, metric=faiss.METRIC_INNER_PRODUCT)
    nprobe, recall = 1, 0.0
    while True:
        _, found = index.search(q, kk, params=faiss.SearchParametersIVF(nprobe=nprobe))
        recall = _recall(found, truth, qrows, k)
        if recall >= ANN_RECALL_TARGET or nprobe >= nlist:
            break
        nprobe = min(nprobe * 2, nlist)
    data = faiss.serialize_index(index).tobytes()
    meta = {"format": ANN_FORMAT, "metric": "cosine", "faiss_index": f"IVF{nlist},Flat", "nlist": nlist,
            "nprobe": nprobe, "train_rows": int(train_n), "seed": ANN_SEED, "tune_queries": len(qrows),
            "tune_recall_at_10": round(float(recall), 4), "count": n, "dim": d,
            "faiss_version": faiss.__version__, "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    return data, meta


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
    doc = {"name": name, **got[name]}
    doc["index"] = "ivf-flat" if doc.get("ann") and f"emb_{name}_ann" in ds.manifest.artifacts else "exact"
    return doc


# -- search ----------------------------------------------------------------------------

def _artifact_members(ds, artifact: str, members: list[str]) -> dict[str, bytes]:
    """Members of an index artifact, read from whole, hash-checked shards.

    With a blob cache the shards are fetched into it once (verified) and read
    locally from then on, by this and every later process; ``remote`` mode GETs
    each shard whole and checks its SHA-256 (a ranged read could not be checked).
    """
    reader = ds.artifact(artifact)
    refs = {s.hash: s for s in ds.manifest.artifacts[artifact].shards}
    whole: dict[str, bytes] = {}
    out: dict[str, bytes] = {}
    for m in members:
        shard, off, length = reader.locate(m)
        if ds.cache is not None:
            with open(ds.fetch_blob(refs[shard]), "rb") as f:
                f.seek(off)
                data = f.read(length)
        else:
            if shard not in whole:
                key = ds.blob_key(refs[shard])
                buf = io.BytesIO()
                ds.remote.copy_to(key, buf, refs[shard].byte_size)  # as the cache fetches: one GET a chunk
                got = buf.getvalue()
                if hashlib.sha256(got).hexdigest() != shard:
                    raise BlobCorruptedError(f"{ds.remote.url_of(key)}: shard of {artifact} does not match its "
                                             "hash", hint="republish the embedding")
                whole[shard] = got
            data = whole[shard][off:off + length]
        if len(data) != length:
            raise DataError(f"member {m!r} of artifact {artifact} ({ds.id}): read {len(data)} bytes, index says "
                            f"{length}", hint="run 'warp cache verify' or republish")
        out[m] = data
    return out


class EmbeddingIndex:
    """Cosine search over one published embedding (``ds.embeddings(name)``).

    ``kind`` is ``"ivf-flat"`` when the version has an ANN index and FAISS
    imports (approximate: recall@10 at build in ``ann["tune_recall_at_10"]``),
    else ``"exact"``. ``search(..., exact=True)`` always searches exactly.
    """

    def __init__(self, ds, name: str) -> None:
        self.ds = ds
        self.name = name
        self.meta = info(ds, name)
        self._vectors: np.ndarray | None = None
        self._ann: Any = None
        self._ann_tried = False
        self.ann: dict[str, Any] = {}
        self._ids: list[str] | None = None
        self._pos: dict[str, int] | None = None
        self.kind = "ivf-flat" if self._ann_index() is not None else "exact"

    @property
    def count(self) -> int:
        return int(self.meta["count"])

    @property
    def vectors(self) -> np.ndarray:
        """The normalised N×D matrix of the exact index (fetched on first use)."""
        import numpy as np

        if self._vectors is None:
            raw = _artifact_members(self.ds, f"emb_{self.name}_index", ["vectors.npy"])["vectors.npy"]
            v = np.load(io.BytesIO(raw), allow_pickle=False)
            if v.shape != (self.count, self.meta["dim"]):
                raise DataError(f"{self.ds.id}: embedding {self.name} holds {v.shape} vectors, its index.json "
                                f"says ({self.count}, {self.meta['dim']})", hint="re-run 'warp embeddings add'")
            self._vectors = v
        return self._vectors

    def _ann_index(self):
        """The FAISS index, loaded once; None when the version has none or FAISS is not installed."""
        if self._ann_tried:
            return self._ann
        self._ann_tried = True
        if self.meta["index"] != "ivf-flat":
            return None
        faiss = _faiss()
        if faiss is None:
            log.info(f"{self.ds.id}: embedding {self.name} has an ivf-flat index but FAISS is not installed; "
                     f"searching exactly ({FAISS_HINT})")
            return None
        import numpy as np

        art = f"emb_{self.name}_ann"
        got = _artifact_members(self.ds, art, ["ann.json", "index.faiss"])
        try:
            doc = load_json(got["ann.json"], f"{self.ds.id}: {art}/ann.json")
        except ValueError as e:
            raise DataError(f"{self.ds.id}: {art}/ann.json is not JSON: {e}", hint="re-run 'warp embeddings add'") \
                from None
        if doc.get("format") != ANN_FORMAT:
            log.warning(f"{self.ds.id}: {art} has format {doc.get('format')!r}, this warp reads {ANN_FORMAT}; "
                        "searching exactly")
            return None
        data = got["index.faiss"]
        if hashlib.sha256(data).hexdigest() != doc.get("sha256"):
            raise BlobCorruptedError(f"{self.ds.id}: {art}/index.faiss does not match the SHA-256 in its ann.json",
                                     hint="re-run 'warp embeddings add'")
        try:
            index = faiss.deserialize_index(np.frombuffer(data, np.uint8))
        except RuntimeError as e:  # FAISS reports a bad stream as RuntimeError
            raise DataError(f"{self.ds.id}: {art}/index.faiss is not a FAISS index: {str(e).splitlines()[0]}",
                            hint="re-run 'warp embeddings add'") from None
        if not isinstance(index, faiss.IndexIVFFlat):
            raise DataError(f"{self.ds.id}: {art}/index.faiss holds a {type(index).__name__}, not IndexIVFFlat",
                            hint="re-run 'warp embeddings add'")
        if index.ntotal != self.count or index.d != self.meta["dim"]:
            raise DataError(f"{self.ds.id}: {art} holds {index.ntotal}×{index.d}, index.json says "
                            f"{self.count}×{self.meta['dim']}", hint="re-run 'warp embeddings add'")
        index.make_direct_map()  # row queries: the row's vector comes from the index, not vectors.npy
        self._ann, self.ann = index, doc
        return index

    @property
    def ids(self) -> list[str]:
        if self._ids is None:
            ids: list[str] = []
            for b in self.ds.table(f"emb_{self.name}").batches(batch_size=65536, columns=["id"], rank=0, world_size=1):
                ids.extend(b.column("id").to_pylist())  # the id column only: no vector bytes are read
            if len(ids) != self.count:
                raise DataError(f"{self.ds.id}: table emb_{self.name} has {len(ids)} rows, its index says "
                                f"{self.count}", hint="re-run 'warp embeddings add'")
            self._ids = ids
        return self._ids

    def _row_vector(self, row: int) -> np.ndarray:
        ann = self._ann_index()
        return ann.reconstruct(int(row)) if ann is not None else self.vectors[int(row)]

    def _query(self, query) -> np.ndarray:
        import numpy as np

        if isinstance(query, (int, np.integer)):
            if not 0 <= int(query) < self.count:
                raise UsageError(f"row {query} is out of range ({self.count} rows)", hint="give a row number")
            return self._row_vector(int(query))
        if isinstance(query, str):
            if self._pos is None:
                self._pos = {}
                for i, x in enumerate(self.ids):
                    self._pos.setdefault(x, i)
            if query not in self._pos:
                raise MissingInputError(f"{self.ds.id}: no row with id {query!r} in embedding {self.name}",
                                        hint="give a row number or a vector")
            return self._row_vector(self._pos[query])
        q = np.asarray(query, np.float32).reshape(-1)
        if q.shape != (self.meta["dim"],):
            raise UsageError(f"query has {q.size} dimensions, embedding {self.name} has {self.meta['dim']}",
                             hint="embed the query with the same encoder")
        if not np.isfinite(q).all():
            raise UsageError("query vector has non-finite values", hint="check the encoder's output")
        n = np.linalg.norm(q)
        return q / n if n > 0 else q

    def search(self, query, k: int = 10, *, exact: bool = False, nprobe: int | None = None) -> list[dict[str, Any]]:
        """The ``k`` nearest rows to ``query`` (a vector, a row number or an id string), by cosine distance.

        Uses the ANN index when there is one (``nprobe``: lists to visit,
        default the tuned one), unless ``exact``. Ties go to the lower row.
        """
        import numpy as np

        q = self._query(query)
        k = max(0, min(int(k), self.count))
        if k == 0:
            return []
        ann = None if exact else self._ann_index()
        if ann is not None:
            faiss = _faiss()
            probe = int(nprobe or self.ann["nprobe"])
            if probe < 1:
                raise UsageError(f"nprobe must be >= 1, not {nprobe}", hint=f"the tuned value is {self.ann['nprobe']}")
            d, i = ann.search(np.ascontiguousarray(q[None, :], np.float32), k,
                              params=faiss.SearchParametersIVF(nprobe=probe))
            rows, sims = i[0], d[0]
            if (rows >= 0).all():  # else the visited lists held fewer than k rows: answer exactly below
                order = np.lexsort((rows, -sims))
                return [{"row": int(rows[j]), "id": self.ids[rows[j]], "distance": float(1.0 - sims[j])}
                        for j in order]
        sims = self.vectors @ q
        if k < len(sims):
            # argpartition picks an arbitrary row among equal similarities at the k-th place (its SIMD
            # kernels differ by CPU), so take every row tying the k-th value, then cut after the sort
            kth = -np.partition(-sims, k - 1)[k - 1]
            top = np.flatnonzero(sims >= kth)
        else:
            top = np.arange(len(sims))
        top = top[np.lexsort((top, -sims[top]))][:k]  # by similarity, then row: deterministic ties
        return [{"row": int(i), "id": self.ids[i], "distance": float(1.0 - sims[i])} for i in top]


def open_index(ds, name: str) -> EmbeddingIndex:
    return EmbeddingIndex(ds, name)
