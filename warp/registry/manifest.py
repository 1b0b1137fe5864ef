"""Dataset manifests: the immutable, content-addressed description of a version.

A manifest (docs/formats/registry.md, JSON Schema in ``manifest.schema.json`` beside this
module) is a JSON object::

    {"kind": "dataset", "format_version": 1 | 2 | 3 | 4 | 5,
     "dataset_id": "ws/name",
     "version_hash": "<64 hex>",
     "tables":    {"main": {"format": "parquet",
                            "shards": [{"uri", "hash", "byte_size", "row_count",
                                        "stats"?: {"footer_size", "columns", "row_groups", "page_index"}}],
                            "schema": {"fields": [{"name", "type", "nullable"}],
                                       "arrow"?: "<base64 Arrow IPC schema>"}}},
     "artifacts": {"raw": {"kind": "tar_shards",
                           "shards": [{"uri", "hash", "byte_size", "member_count",
                                       "chunks"?: [["<64 hex>", byte_size], ...]}],
                           "index": {"uri", "hash", "byte_size", "format": "warp-tar-index-1"},
                           "member_count": N}},
     "bindings":  [{"table", "column", "artifact", "ref_type": "file|image|audio|video",
                   "ref_form": "member_path"}],
     "stats":     {"total_rows", "total_bytes", ...},
     "metadata":  {...}}

Contract:

* **Versions.** ``format_version`` is 5 when any artifact shard is stored as
  ``chunks`` (content-addressed runs of its bytes, docs/formats/registry.md,
  "Chunked shards"); else 4 when any table's ``schema`` holds
  ``arrow`` (its exact Arrow schema, so ``schema()`` and ``warp info`` cost the
  manifest alone); else 3 with read-affecting metadata (below); else 2 when any
  table shard carries ``stats`` (footer length and column min/max, see
  :mod:`warpdata.registry.parquet_stats`); else 1. A manifest without these
  is byte-for-byte what format 1 always was, so its hash is unchanged and
  older readers still read it. Readers accept all five.

* **Identity (I0/M1).** ``version_hash`` = SHA-256 of the canonical JSON
  (:mod:`warpdata.core.canonical`: sorted keys, no whitespace, UTF-8) of the
  *hashed part*: every field except ``version_hash`` and ``metadata``, plus,
  in formats 3 to 5, the read-affecting metadata keys (:data:`READ_METADATA`:
  ``default_table`` picks the table readers use, ``sources`` the artifact a
  reader opens by kind) as ``{"metadata": {those keys}}``. Format 3 is
  written exactly when metadata holds one of them; a format 1 or 2 manifest
  holding one (written by an older warp, where they were not hashed) is
  refused with a hint to republish, which uploads no blob again.
  Before hashing, strings are NFC-normalised and integral floats become
  integers, so equal content hashes equally on any machine. ``metadata`` is
  the non-hashed envelope (``created_at``, ``warp_version``, source facts);
  timestamps live only there (the schema forbids ``stats.created_at``).
* **Seal.** The envelope is outside ``version_hash``, so it is sealed by a
  second hash: ``metadata.seal_sha256`` = SHA-256 of the canonical JSON of the
  whole normalised document with that one key left out (:func:`seal_of`). It
  covers whatever the envelope holds (``created_at``, ``description``, a
  dataset card, keys added later) without naming them. :meth:`Manifest.to_dict`
  writes it; :meth:`Manifest.from_dict` checks it
  (:class:`~warpdata.core.errors.ManifestCorruptedError` on any edit), requires
  it from format 4 (:data:`SEALED_FROM`) and in a signed manifest, and reads a
  format 1-3 manifest without it (written before the seal existed). It lives inside
  ``metadata`` so readers that predate it, whose schema allows no new top-level
  field, still read sealed manifests; it changes no version hash.
* **Signatures.** ``metadata.signatures`` (:mod:`warpdata.registry.signing`):
  Ed25519 signatures over the dataset id and ``version_hash``, checked against
  ``WARP_TRUSTED_KEYS`` by the store's and the read API's manifest loads. The seal
  gives integrity; a signature gives origin, given a trusted key.
* **Blobs.** Every shard and index is a blob named by the SHA-256 of its bytes;
  ``uri`` is the store-relative key :func:`blob_key` (``blobs/sha256/ab/<hash>``)
  or a remote URL (``s3://``, ``gs://``, ``http(s)://``). Readers resolve
  relative URIs against the store root; the hash is authoritative.
* **Portability (I1).** No string anywhere in a manifest may be a local path:
  ``file:`` URLs, absolute POSIX paths, ``~`` paths, Windows drive paths,
  ``..`` segments and backslashes in URIs are rejected with
  :class:`~warpdata.core.errors.LocalPathError` naming the JSON path.
* **Validation.** :meth:`Manifest.to_bytes` and :meth:`Manifest.from_bytes`
  both validate against the schema, the I1 rule and referential integrity
  (bindings name existing tables and artifacts); ``from_bytes`` also
  recomputes the hash and raises
  :class:`~warpdata.core.errors.ManifestCorruptedError` on mismatch.

Tar-shard artifacts and their member index are specified in
``docs/formats/registry.md`` and built by :mod:`warpdata.registry.tarpack`.
"""

from __future__ import annotations

import functools
import json
import re
import unicodedata
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from warpdata.core.canonical import CanonicalJSONError, canonical_json, sha256_hex
from warpdata.core.errors import (
    InvalidDatasetIdError,
    InvalidHashError,
    LocalPathError,
    ManifestCorruptedError,
)
from warpdata.core.jsondoc import load_json
from warpdata.registry.schemacheck import SchemaChecker

# lazy third-party imports: pyarrow (heavy) is imported by decode_arrow_schema alone: reading a
# manifest (`warp info`) does not load it

__all__ = [
    "FORMAT_VERSION",
    "FORMAT_VERSIONS",
    "INDEX_FORMAT",
    "REF_TYPES",
    "Artifact",
    "Binding",
    "Manifest",
    "ShardRef",
    "Table",
    "blob_key",
    "check_portable",
    "decode_arrow_schema",
    "encode_arrow_schema",
    "hashed_part",
    "normalize",
    "seal_of",
    "validate_dataset_id",
    "version_hash_of",
]

# the newest this code writes: 4 with Arrow schemas, else 3 with read-affecting metadata, else 2 with stats, else 1
FORMAT_VERSION = 5
FORMAT_VERSIONS = (1, 2, 3, 4, 5)
# metadata keys that change what a reader returns: hashed (format 3); the rest of metadata is the envelope
READ_METADATA = ("default_table", "sources")
INDEX_FORMAT = "warp-tar-index-1"
REF_TYPES = ("file", "image", "audio", "video")
ARTIFACT_KINDS = ("tar_shards", "webdataset_shards")

# \Z, not $: "$" also matches before a trailing newline, and these strings become store keys
DATASET_ID_RE = re.compile(r"^[a-z0-9_-]+/[a-z0-9_-]+\Z")
WORKSPACE_RE = re.compile(r"^[a-z0-9_-]+\Z")
NAME_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")
HASH_RE = re.compile(r"^[a-f0-9]{64}\Z")
_REMOTE_SCHEMES = ("s3://", "s3a://", "gs://", "gcs://", "az://", "abfs://", "http://", "https://", "hf://")
_WINDOWS_DRIVE = re.compile(r"^[A-Za-z]:[\\/]")
_NON_HASHED = ("version_hash", "metadata")
# the envelope's own hash, inside the envelope (docs/formats/registry.md "Seal")
SEAL_KEY = "seal_sha256"
#: a shard's page index text at most (warpdata.formats.parquet_index.MAX_TEXT)
PAGE_INDEX_MAX = 24 << 20
# the first format whose manifests were always written sealed: from it on, a missing seal was removed
SEALED_FROM = 4
# Ed25519 signatures of the version, in the envelope (warpdata.registry.signing; docs/formats/registry.md)
SIGNATURES_KEY = "signatures"


def validate_dataset_id(dataset_id: str) -> str:
    """Return ``dataset_id`` if it is ``workspace/name`` (lowercase, digits, ``_``, ``-``)."""
    if not isinstance(dataset_id, str) or not DATASET_ID_RE.match(dataset_id) or len(dataset_id) > 200:
        raise InvalidDatasetIdError(
            f"{dataset_id!r} is not a dataset id of the form workspace/name",
            hint="use lowercase letters, digits, '_' and '-', e.g. vision/coco-mini")
    return dataset_id


def validate_workspace(workspace: str) -> str:
    """Return ``workspace`` if it is the first half of a dataset id."""
    if not isinstance(workspace, str) or not WORKSPACE_RE.match(workspace):
        raise InvalidDatasetIdError(f"{workspace!r} is not a workspace name",
                                    hint="use lowercase letters, digits, '_' and '-', e.g. vision")
    return workspace


def validate_hash(hash_hex: str, what: str = "blob hash") -> str:
    """Return ``hash_hex`` if it is a SHA-256 hex digest (64 lowercase hex digits), the only
    form a hash takes inside a store key."""
    if not isinstance(hash_hex, str) or not HASH_RE.match(hash_hex):
        raise InvalidHashError(f"{what} {hash_hex!r} is not a lowercase SHA-256 hex digest (64 of 0-9a-f)",
                               hint="give the full hash as the manifest records it ('warp ls WORKSPACE/' lists versions)")
    return hash_hex


def blob_key(hash_hex: str) -> str:
    """The store-relative key of a blob: ``blobs/sha256/<first 2 hex>/<hash>``."""
    validate_hash(hash_hex)
    return f"blobs/sha256/{hash_hex[:2]}/{hash_hex}"


# -- normalisation, hashing, portability ---------------------------------

def normalize(value: Any) -> Any:
    """The normal form used for hashing: NFC strings, integral floats as ints, lists."""
    if isinstance(value, str):
        return unicodedata.normalize("NFC", value)
    if isinstance(value, bool) or value is None or isinstance(value, int):
        return value
    if isinstance(value, float):
        if value.is_integer() and abs(value) < 2**53:
            return int(value)
        return value
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for k, v in value.items():
            nk = normalize(k) if isinstance(k, str) else k
            if nk in out:
                raise ManifestCorruptedError(f"key {k!r} appears twice after Unicode normalisation",
                                             hint="rename one of the two keys")
            out[nk] = normalize(v)
        return out
    if isinstance(value, (list, tuple)):
        return [normalize(v) for v in value]
    raise ManifestCorruptedError(f"{type(value).__name__} value {value!r} cannot be stored in a manifest",
                                 hint="use str, int, float, bool, list or dict")


def read_metadata(metadata: Any) -> dict[str, Any]:
    """The read-affecting part of ``metadata`` (:data:`READ_METADATA` keys present)."""
    return {k: metadata[k] for k in READ_METADATA if k in metadata} if isinstance(metadata, dict) else {}


def hashed_part(doc: dict[str, Any]) -> dict[str, Any]:
    """The fields that define the version: everything but ``version_hash`` and ``metadata``,
    plus (formats 3 to 5) the read-affecting metadata keys."""
    out = {k: v for k, v in doc.items() if k not in _NON_HASHED}
    if doc.get("format_version") in (3, 4, 5):
        out["metadata"] = read_metadata(doc.get("metadata"))
    return out


def version_hash_of(doc: dict[str, Any]) -> str:
    """SHA-256 hex of the canonical JSON of the normalised hashed part of ``doc``."""
    try:
        return sha256_hex(canonical_json(normalize(hashed_part(doc))))
    except CanonicalJSONError as e:
        raise ManifestCorruptedError(f"manifest is not canonical JSON: {e}",
                                     hint="remove NaN/inf and non-JSON values") from None


def seal_of(doc: dict[str, Any]) -> str:
    """SHA-256 hex of the canonical JSON of the normalised ``doc`` without ``metadata.seal_sha256``:
    the hash that seals everything ``version_hash`` leaves out (the envelope)."""
    md = doc.get("metadata")
    body = {**doc, "metadata": {k: v for k, v in md.items() if k != SEAL_KEY}} if isinstance(md, dict) else doc
    try:
        return sha256_hex(canonical_json(normalize(body)))
    except CanonicalJSONError as e:
        raise ManifestCorruptedError(f"manifest is not canonical JSON: {e}", hint="check the metadata values") from None


def _is_local_path(s: str) -> bool:
    low = s.lower()
    return (low.startswith("file:") or s.startswith("/") or s.startswith("~")
            or bool(_WINDOWS_DRIVE.match(s)) or s.startswith("\\\\"))


def _check_uri(uri: str, where: str) -> None:
    if uri.lower().startswith(_REMOTE_SCHEMES):
        return
    if "://" in uri or _is_local_path(uri) or "\\" in uri or ".." in uri.split("/"):
        raise LocalPathError(
            f"{where}: {uri!r} is a machine-local path; manifests may only hold blob hashes, "
            "store-relative keys or remote URLs (invariant I1)",
            hint="publish the file so it is referenced by hash, or use an s3:// / https:// URL")


def check_portable(doc: Any, where: str = "$") -> None:
    """Reject local paths anywhere in a manifest document (invariant I1).

    ``uri`` values must be store-relative keys or remote URLs; any other
    string value must not look like a local path (``file:``, ``/abs``,
    ``~/x``, ``C:\\x``).
    """
    if isinstance(doc, dict):
        for k, v in doc.items():
            sub = f"{where}.{k}"
            if k == "uri" and isinstance(v, str):
                _check_uri(v, sub)
            elif k == "arrow" and where.endswith(".schema") and isinstance(v, str):
                continue  # base64 bytes (the schema's pattern), which may well start with "/"
            else:
                check_portable(v, sub)
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            check_portable(v, f"{where}[{i}]")
    elif isinstance(doc, str) and _is_local_path(doc):
        raise LocalPathError(
            f"{where}: {doc!r} is a machine-local path; manifests must not hold local paths (invariant I1)",
            hint="store a relative path inside an artifact, a blob hash or a remote URL instead")


@functools.lru_cache(maxsize=1)
def schema() -> dict[str, Any]:
    """The JSON Schema every manifest is validated against (shipped with warp)."""
    # beside this module in the wheel and the checkout; importlib.resources' lookup cost an open ~20 ms
    text = (Path(__file__).parent / "manifest.schema.json").read_text("utf-8")
    return json.loads(text)


def fast_schema() -> dict[str, Any]:
    """:func:`schema` with shard stats left to :func:`_check_stats` (the same rules in Python:
    checking them by schema cost ~9 ms on a 10-shard manifest, on every dataset open)."""
    import copy

    fast = copy.deepcopy(schema())
    fast["definitions"]["table_shard"]["properties"]["stats"] = {"type": "object"}
    return fast


@functools.lru_cache(maxsize=1)
def _checker():
    # warp's own draft-07 interpreter: importing jsonschema cost a fresh process more than the
    # open it guarded; tests/registry/test_schemacheck.py checks it against jsonschema
    return SchemaChecker(fast_schema())


def _is_count(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


def _check_column_stats(cols: Any, where: str) -> str | None:
    if not isinstance(cols, dict) or len(cols) > 64:
        return f"{where}: must be an object of at most 64 columns"
    for col, cs in cols.items():
        w = f"{where}.{col}"
        if not isinstance(cs, dict) or set(cs) - {"min", "max", "null_count"}:
            return f"{w}: must be an object with only min, max, null_count"
        if ("min" in cs) != ("max" in cs):
            return f"{w}: min and max come together"
        for k in ("min", "max"):
            if k in cs and (isinstance(cs[k], bool) or not isinstance(cs[k], (int, str))):
                return f"{w}.{k}: {cs[k]!r} is not an integer or a string"
        if "null_count" in cs and not _is_count(cs["null_count"]):
            return f"{w}.null_count: {cs['null_count']!r} is not a count"
    return None


def _check_stats(st: Any, where: str) -> str | None:
    """The schema's ``shard_stats`` rules, in Python (see fast_schema); a message or None."""
    if not isinstance(st, dict) or set(st) - {"footer_size", "columns", "row_groups", "page_index"} \
            or "columns" not in st:
        return f"{where}: must be an object with columns and optionally footer_size, row_groups, page_index"
    pi = st.get("page_index", "")
    if not isinstance(pi, str) or len(pi) > PAGE_INDEX_MAX or "footer_size" not in st and "page_index" in st:
        return f"{where}.page_index: must be a string of at most {PAGE_INDEX_MAX} characters, with footer_size"
    fs = st.get("footer_size", 12)
    if not _is_count(fs) or fs < 12:
        return f"{where}.footer_size: {fs!r} is not a footer length (>= 12)"
    bad = _check_column_stats(st["columns"], f"{where}.columns")
    if bad:
        return bad
    rgs = st.get("row_groups", [])
    if not isinstance(rgs, list) or len(rgs) > 64:
        return f"{where}.row_groups: must be a list of at most 64 row groups"
    for g, rg in enumerate(rgs):
        w = f"{where}.row_groups[{g}]"
        if not isinstance(rg, dict) or set(rg) != {"row_count", "columns"} or not _is_count(rg["row_count"]):
            return f"{w}: must be an object with row_count (a count) and columns"
        bad = _check_column_stats(rg["columns"], f"{w}.columns")
        if bad:
            return bad
    return None


def validate_document(doc: Any, source: str = "manifest") -> None:
    """Schema + I1 + referential checks; raises ManifestCorruptedError / LocalPathError."""
    errors = sorted(_checker().iter_errors(doc), key=lambda e: list(e[0]))
    if errors:
        path, message = errors[0]
        where = "$" + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in path)
        more = f" (and {len(errors) - 1} more problem(s))" if len(errors) > 1 else ""
        raise ManifestCorruptedError(
            f"{source}: {where}: {message}{more}",
            hint="the manifest does not match warp's dataset schema; republish it with 'warp publish'",
            path=where)
    check_portable(doc)
    tables = doc.get("tables", {})
    with_stats = any("stats" in s for t in tables.values() for s in t.get("shards", []))
    reads = read_metadata(doc.get("metadata"))
    with_arrow = any("arrow" in (t.get("schema") or {}) for t in tables.values())
    with_chunks = any("chunks" in s for a in doc.get("artifacts", {}).values() for s in a.get("shards", []))
    if reads and doc.get("format_version") not in (3, 4, 5):
        raise ManifestCorruptedError(
            f"{source}: format_version {doc.get('format_version')} manifest (an older warp) with "
            f"metadata.{'/'.join(sorted(reads))}, which its version hash does not cover",
            hint="republish the dataset with this warp ('warp publish ... --from DIR'): "
                 "its blobs are already in the store, nothing is uploaded again")
    if doc.get("format_version") != (5 if with_chunks else 4 if with_arrow else 3 if reads else 2 if with_stats else 1):
        raise ManifestCorruptedError(
            f"{source}: $.format_version is {doc.get('format_version')}, but shard stats are "
            f"{'present' if with_stats else 'absent'}, read-affecting metadata is "
            f"{'present' if reads else 'absent'}, Arrow table schemas are {'present' if with_arrow else 'absent'} "
            f"and chunked artifact shards are {'present' if with_chunks else 'absent'} "
            "(format_version 5 exactly when an artifact shard has chunks, else 4 exactly when a table schema "
            "has arrow, else 3 exactly with metadata.default_table or sources, else 2 exactly when a table "
            "shard has stats)",
            hint="republish the dataset with this warp version")
    for aname, a in doc.get("artifacts", {}).items():
        for i, s in enumerate(a.get("shards", [])):
            if "chunks" not in s:
                continue
            if not s["chunks"] or not all(len(c) == 2 and isinstance(c[0], str) and HASH_RE.match(c[0])
                                          and isinstance(c[1], int) and c[1] >= 1 for c in s["chunks"]):
                raise ManifestCorruptedError(
                    f"{source}: $.artifacts.{aname}.shards[{i}].chunks: not a non-empty list of "
                    "[sha256 hex, byte_size >= 1] pairs", hint="republish the dataset with this warp version")
            if sum(c[1] for c in s["chunks"]) != s["byte_size"]:
                raise ManifestCorruptedError(
                    f"{source}: $.artifacts.{aname}.shards[{i}]: its chunks hold "
                    f"{sum(c[1] for c in s['chunks'])} bytes, its byte_size says {s['byte_size']}",
                    hint="republish the dataset with this warp version")
    if "sources" in reads and (not isinstance(reads["sources"], list)
                               or not all(isinstance(x, dict) for x in reads["sources"])):
        raise ManifestCorruptedError(f"{source}: $.metadata.sources must be a list of objects",
                                     hint="republish the dataset with this warp version")
    if "default_table" in reads and reads["default_table"] not in tables:
        raise ManifestCorruptedError(f"{source}: $.metadata.default_table names table "
                                     f"{reads['default_table']!r}, which the manifest lacks",
                                     hint=f"tables are: {', '.join(sorted(tables)) or 'none'}")
    for tname, t in tables.items():
        for i, sh in enumerate(t.get("shards", [])):
            st = sh.get("stats")
            where = f"$.tables.{tname}.shards[{i}].stats"
            bad = None if st is None else _check_stats(st, where)
            if bad:
                raise ManifestCorruptedError(f"{source}: {bad}",
                                             hint="the manifest does not match warp's dataset schema; republish it")
            for part, cols in ([("", st["columns"])] if st else []) + [
                    (f".row_groups[{g}]", r["columns"]) for g, r in enumerate((st or {}).get("row_groups", []))]:
                for col, cs in cols.items():
                    if "min" in cs and (type(cs["min"]) is not type(cs["max"]) or cs["min"] > cs["max"]):
                        raise ManifestCorruptedError(
                            f"{source}: {where}{part}.columns.{col}: min {cs['min']!r} and max {cs['max']!r} "
                            "are not an ordered pair of one type",
                            hint="the manifest's statistics are invalid; republish the dataset")
            rgs = st.get("row_groups") if st else None
            if rgs is not None and sum(r["row_count"] for r in rgs) != sh["row_count"]:
                raise ManifestCorruptedError(
                    f"{source}: $.tables.{tname}.shards[{i}].stats.row_groups count "
                    f"{sum(r['row_count'] for r in rgs)} rows, the shard {sh['row_count']}",
                    hint="the manifest's statistics do not describe its shard; republish the dataset")
    artifacts = doc.get("artifacts", {})
    for i, b in enumerate(doc.get("bindings", [])):
        if b["table"] not in tables:
            raise ManifestCorruptedError(f"{source}: $.bindings[{i}] names table {b['table']!r}, which the manifest lacks",
                                         hint=f"tables are: {', '.join(sorted(tables)) or 'none'}")
        if b["artifact"] not in artifacts:
            raise ManifestCorruptedError(f"{source}: $.bindings[{i}] names artifact {b['artifact']!r}, which the manifest lacks",
                                         hint=f"artifacts are: {', '.join(sorted(artifacts)) or 'none'}")
        schema_doc = tables[b["table"]].get("schema")
        if schema_doc is not None and b["column"] not in {f["name"] for f in schema_doc["fields"]}:
            raise ManifestCorruptedError(
                f"{source}: $.bindings[{i}] binds column {b['column']!r}, which table {b['table']!r} lacks",
                hint="bind an existing column (TABLE.COLUMN=ARTIFACT:TYPE)")


# -- Arrow schemas (format 4) -------------------------------------------------

_ARROW_SCHEMAS: dict[str, Any] = {}  # base64 -> decoded pyarrow.Schema (immutable)


def encode_arrow_schema(schema: Any) -> str:
    """``schema`` (a ``pyarrow.Schema``) as the manifest stores it: base64 of its Arrow IPC
    schema message, which round-trips every type, nullability and metadata exactly."""
    import base64

    return base64.b64encode(schema.serialize().to_pybytes()).decode("ascii")


def decode_arrow_schema(b64: str, where: str = "schema.arrow"):
    """The ``pyarrow.Schema`` of an :func:`encode_arrow_schema` string, or ManifestCorruptedError."""
    import base64
    import binascii

    import pyarrow as pa

    try:
        return pa.ipc.read_schema(pa.py_buffer(base64.b64decode(b64, validate=True)))
    except (binascii.Error, ValueError, pa.ArrowException) as e:
        raise ManifestCorruptedError(f"{where}: schema.arrow is not a base64 Arrow IPC schema ({e})",
                                     hint="the manifest is damaged; republish the dataset") from None


# -- the model -------------------------------------------------------------

@dataclass(frozen=True)
class ShardRef:
    """One blob: a Parquet shard, a tar shard or an index.

    ``row_count`` is set for table shards, ``member_count`` for tar shards,
    ``format`` for indexes. ``uri`` defaults to :func:`blob_key`. ``stats``
    (table shards, format 2): footer length and column statistics from
    :func:`warpdata.registry.parquet_stats.shard_stats`.
    """

    hash: str
    byte_size: int
    uri: str = ""
    row_count: int | None = None
    member_count: int | None = None
    format: str | None = None
    stats: dict[str, Any] | None = field(default=None, compare=False)
    # a chunked tar shard (format 5): stored as these blobs, (sha256, byte_size), whose bytes in order
    # are the shard's; ``hash`` stays the shard's identity (docs/formats/registry.md, "Chunked shards")
    chunks: tuple[tuple[str, int], ...] | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        if not self.uri:
            object.__setattr__(self, "uri", blob_key(self.hash))

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"uri": self.uri, "hash": self.hash, "byte_size": self.byte_size}
        for k in ("row_count", "member_count", "format", "stats"):
            v = getattr(self, k)
            if v is not None:
                d[k] = v
        if self.chunks:
            d["chunks"] = [[h, n] for h, n in self.chunks]
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ShardRef:
        chunks = d.get("chunks")
        return cls(hash=d["hash"], byte_size=d["byte_size"], uri=d["uri"], row_count=d.get("row_count"),
                   member_count=d.get("member_count"), format=d.get("format"), stats=d.get("stats"),
                   chunks=tuple((str(h), int(n)) for h, n in chunks) if chunks else None)

    def stored(self) -> list[ShardRef]:
        """The store objects holding this blob's bytes: its chunks, or itself."""
        if not self.chunks:
            return [self]
        return [ShardRef(h, n) for h, n in self.chunks]


@dataclass(frozen=True)
class Table:
    """A table: Parquet shards in order, and optionally its Arrow schema as fields."""

    shards: tuple[ShardRef, ...]
    format: str = "parquet"
    schema: dict[str, Any] | None = None  # {"fields": [{"name", "type", "nullable"}], "arrow"?: base64}

    @property
    def row_count(self) -> int:
        return sum(s.row_count or 0 for s in self.shards)

    @property
    def byte_size(self) -> int:
        return sum(s.byte_size for s in self.shards)

    @property
    def columns(self) -> list[str]:
        return [f["name"] for f in (self.schema or {}).get("fields", [])]

    def arrow_schema(self, where: str = "table"):
        """The table's exact Arrow schema as published (format 4), or None when the manifest
        predates it (readers then take it from the first shard's footer).

        Raises :class:`ManifestCorruptedError` naming ``where`` when the recorded schema does not
        decode or disagrees with ``fields``."""
        b64 = (self.schema or {}).get("arrow")
        if b64 is None:
            return None
        got = _ARROW_SCHEMAS.get(b64)
        if got is None:
            got = decode_arrow_schema(b64, where)
            names = [f["name"] for f in self.schema.get("fields", [])]
            if list(got.names) != names:
                raise ManifestCorruptedError(
                    f"{where}: schema.arrow names the columns {list(got.names)}, schema.fields {names}",
                    hint="the manifest's schema is inconsistent; republish the dataset")
            if len(_ARROW_SCHEMAS) >= 256:
                _ARROW_SCHEMAS.clear()
            _ARROW_SCHEMAS[b64] = got
        return got

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"format": self.format, "shards": [s.to_dict() for s in self.shards]}
        if self.schema is not None:
            d["schema"] = self.schema
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Table:
        return cls(shards=tuple(ShardRef.from_dict(s) for s in d["shards"]), format=d["format"],
                   schema=d.get("schema"))


@dataclass(frozen=True)
class Artifact:
    """Raw files packed into tar shards, with a member index blob (member -> shard, offset, length)."""

    shards: tuple[ShardRef, ...]
    kind: str = "tar_shards"
    index: ShardRef | None = None
    member_count: int | None = None

    @property
    def byte_size(self) -> int:
        return sum(s.byte_size for s in self.shards) + (self.index.byte_size if self.index else 0)

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"kind": self.kind, "shards": [s.to_dict() for s in self.shards]}
        if self.index is not None:
            d["index"] = self.index.to_dict()
        if self.member_count is not None:
            d["member_count"] = self.member_count
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Artifact:
        idx = d.get("index")
        return cls(shards=tuple(ShardRef.from_dict(s) for s in d["shards"]), kind=d["kind"],
                   index=ShardRef.from_dict(idx) if idx else None, member_count=d.get("member_count"))


@dataclass(frozen=True)
class Binding:
    """Column ``table.column`` holds member paths into ``artifact``, read as ``ref_type``."""

    table: str
    column: str
    artifact: str
    ref_type: str = "file"
    ref_form: str = "member_path"

    def to_dict(self) -> dict[str, Any]:
        return {"table": self.table, "column": self.column, "artifact": self.artifact,
                "ref_type": self.ref_type, "ref_form": self.ref_form}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Binding:
        return cls(table=d["table"], column=d["column"], artifact=d["artifact"], ref_type=d["ref_type"],
                   ref_form=d.get("ref_form", "member_path"))


@dataclass(frozen=True, eq=False)
class Manifest:
    """One dataset version. Build it, then :meth:`to_bytes` to store it.

    ``version_hash`` is computed from the content (never passed in);
    ``stats`` defaults to ``total_rows`` / ``total_bytes`` computed from the
    shards. Two manifests are equal when their version hashes are.
    """

    dataset_id: str
    tables: dict[str, Table] = field(default_factory=dict)
    artifacts: dict[str, Artifact] = field(default_factory=dict)
    bindings: tuple[Binding, ...] = ()
    stats: dict[str, Any] | None = None
    metadata: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        validate_dataset_id(self.dataset_id)
        object.__setattr__(self, "bindings", tuple(sorted(
            self.bindings, key=lambda b: (b.table, b.column, b.artifact))))
        if self.stats is None:
            object.__setattr__(self, "stats", {
                "total_rows": sum(t.row_count for t in self.tables.values()),
                "total_bytes": sum(t.byte_size for t in self.tables.values())
                + sum(a.byte_size for a in self.artifacts.values()),
            })

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Manifest) and other.version_hash == self.version_hash

    def __hash__(self) -> int:
        return hash(self.version_hash)

    # -- documents ---------------------------------------------------------
    def content(self) -> dict[str, Any]:
        """The hashed part as a normalised JSON-able dict."""
        with_stats = any(s.stats is not None for t in self.tables.values() for s in t.shards)
        with_arrow = any("arrow" in (t.schema or {}) for t in self.tables.values())
        reads = read_metadata(self.metadata)
        with_chunks = any(s.chunks for a in self.artifacts.values() for s in a.shards)
        fmt = 5 if with_chunks else 4 if with_arrow else 3 if reads else 2 if with_stats else 1
        doc = {
            "kind": "dataset",
            "format_version": fmt,
            "dataset_id": self.dataset_id,
            "tables": {k: t.to_dict() for k, t in self.tables.items()},
            "artifacts": {k: a.to_dict() for k, a in self.artifacts.items()},
            "bindings": [b.to_dict() for b in self.bindings],
            "stats": self.stats,
        }
        if fmt >= 3:
            doc["metadata"] = reads
        return normalize(doc)

    @functools.cached_property
    def version_hash(self) -> str:
        return version_hash_of(self.content())

    def to_dict(self) -> dict[str, Any]:
        """The full document: hashed part + ``version_hash`` + ``metadata`` (the whole envelope),
        sealed (``metadata.seal_sha256``)."""
        md = {k: v for k, v in normalize(self.metadata).items() if k != SEAL_KEY}
        doc = {**self.content(), "version_hash": self.version_hash, "metadata": md}
        md[SEAL_KEY] = seal_of(doc)
        return doc

    def to_bytes(self) -> bytes:
        """Canonical JSON bytes, validated (schema, I1, references) before they are returned."""
        doc = self.to_dict()
        validate_document(doc, f"manifest of {self.dataset_id}")
        return canonical_json(doc)

    @classmethod
    def from_dict(cls, doc: Any, *, source: str = "manifest", expected_hash: str | None = None) -> Manifest:
        """Validate and load a manifest document; verify its hash.

        Raises ManifestCorruptedError when the schema, the stored
        ``version_hash`` or ``expected_hash`` (the key it was stored under)
        disagree with the content.
        """
        if not isinstance(doc, dict):
            raise ManifestCorruptedError(f"{source}: not a JSON object",
                                         hint="the manifest is corrupt; run 'warp cache gc' and retry")
        validate_document(doc, source)
        computed = version_hash_of(doc)
        if computed != doc["version_hash"] or (expected_hash is not None and computed != expected_hash):
            raise ManifestCorruptedError(
                f"{source}: manifest hash mismatch (stored {doc['version_hash']}, "
                f"expected {expected_hash or doc['version_hash']}, computed {computed})",
                hint="the manifest was altered or truncated; try 'warp cache gc', then republish if the store copy is bad",
                stored=doc["version_hash"], computed=computed)
        md = doc.get("metadata", {})
        if SEAL_KEY not in md and (doc["format_version"] >= SEALED_FROM or SIGNATURES_KEY in md):
            # format 4 predates the seal by a day only: every format-4 manifest since was sealed, and a
            # signed one always is; older formats may predate the seal (docs/formats/registry.md "Seal")
            raise ManifestCorruptedError(
                f"{source}: the manifest has no seal (metadata.{SEAL_KEY}): a format-{doc['format_version']}"
                f"{' signed' if SIGNATURES_KEY in md else ''} manifest is written sealed, so it was removed",
                hint="the store copy was altered: restore it, or delete it (and latest.json beside "
                     "versions/ if it names this version) and publish the same data again")
        if SEAL_KEY in md:  # absent: a format 1-3 manifest from before the seal (docs/formats/registry.md)
            sealed = seal_of(doc)
            if md[SEAL_KEY] != sealed:
                raise ManifestCorruptedError(
                    f"{source}: the manifest was edited after publishing: its seal (metadata.{SEAL_KEY}, "
                    f"over the envelope and the rest) does not match (stored {md[SEAL_KEY]}, computed {sealed})",
                    # publishing the same data again does not replace it: the stored manifest is
                    # create-only, and a publish whose version latest names writes nothing
                    # (docs/formats/registry.md "Seal")
                    hint="the store copy was altered: restore it, or delete it (and latest.json beside "
                         "versions/ if it names this version) and publish the same data again; "
                         "run 'warp cache gc' if only the cached copy is bad",
                    stored=md[SEAL_KEY], computed=sealed)
        m = cls(
            dataset_id=doc["dataset_id"],
            tables={k: Table.from_dict(v) for k, v in doc["tables"].items()},
            artifacts={k: Artifact.from_dict(v) for k, v in doc.get("artifacts", {}).items()},
            bindings=tuple(Binding.from_dict(b) for b in doc.get("bindings", [])),
            stats=dict(doc.get("stats", {})),
            metadata={k: v for k, v in doc.get("metadata", {}).items() if k != SEAL_KEY},
        )
        if m.version_hash != computed:  # the model dropped or added something: a bug, not bad data
            raise ManifestCorruptedError(f"{source}: manifest does not round-trip through the model",
                                         hint="report this with the manifest attached")
        return m

    @classmethod
    def from_bytes(cls, data: bytes, *, source: str = "manifest", expected_hash: str | None = None) -> Manifest:
        try:
            doc = load_json(data, source, hint="the manifest is corrupt or truncated; try 'warp cache gc' and retry",
                            error=ManifestCorruptedError)
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise ManifestCorruptedError(f"{source}: not valid JSON: {e}",
                                         hint="the manifest is corrupt or truncated; try 'warp cache gc' and retry") from None
        return cls.from_dict(doc, source=source, expected_hash=expected_hash)

    # -- queries -------------------------------------------------------------
    def blobs(self) -> list[ShardRef]:
        """Every blob the version references, deduplicated by hash, in manifest order."""
        seen: dict[str, ShardRef] = {}
        for t in self.tables.values():
            for s in t.shards:
                seen.setdefault(s.hash, s)
        for a in self.artifacts.values():
            for s in a.shards:
                seen.setdefault(s.hash, s)
            if a.index is not None:
                seen.setdefault(a.index.hash, a.index)
        return list(seen.values())

    def stored_blobs(self) -> list[ShardRef]:
        """Every store object the version needs, deduplicated by hash: :meth:`blobs`, with each
        chunked shard replaced by its chunks (docs/formats/registry.md, "Chunked shards")."""
        seen: dict[str, ShardRef] = {}
        for b in self.blobs():
            for s in b.stored():
                seen.setdefault(s.hash, s)
        return list(seen.values())

    def table(self, name: str) -> Table:
        try:
            return self.tables[name]
        except KeyError:
            raise KeyError(f"{self.dataset_id} has no table {name!r} (tables: {', '.join(sorted(self.tables))})") from None

    def bindings_for(self, table: str) -> dict[str, Binding]:
        """column -> binding for one table."""
        return {b.column: b for b in self.bindings if b.table == table}
