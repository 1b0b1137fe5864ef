"""``warp why``: everything one sample came from, read from manifests and side tables only.

Contract (docs/lineage.md, "warp why"):

* Targets: a tensor-warehouse version directory, a feature-cache directory, a ``.tbl`` file,
  a Zarr array written by ``warp etl`` (its directory, with ``manifest.json``), or a published
  dataset ``WS/NAME[@VERSION]``. The sample is an index (an integer) or a key.
* Sample payloads are never read. Warehouses and feature caches answer from the sealed
  manifest and the per-sample side tables (``samples.parquet`` + ``sources.parquet``,
  ``records.parquet``), reading one row group of each (found from the footer's statistics);
  a feature-cache record's byte offset needs its shard's 64-byte header. A published row is
  read from its one Parquet shard; its bound refs are resolved through the member index.
* What an artifact does not record is named in :attr:`Lineage.missing`, never guessed.
* A key that was quarantined answers with its quarantine record (reason and message) instead
  of a location: "why is it *not* in there" is the same question.

Errors: :class:`MissingInputError` for an unknown target or a sample that is in neither the
artifact nor its quarantine; :class:`UsageError` for an index out of range.
"""

from __future__ import annotations

import bisect
import logging
import os
import struct
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from warpdata.artifacts import kinds
from warpdata.core import envvars, sidetables
from warpdata.core.arrowmem import arrow_reader
from warpdata.core.atomic import atomic_write_bytes
from warpdata.core.canonical import CONTENT_HASH_FIELD
from warpdata.core.confined import UnconfinedPathError, confined
from warpdata.core.errors import BlobCorruptedError, DataError, MissingInputError, UsageError
from warpdata.core.jsondoc import load_json
from warpdata.core.names import FEATURE_CACHE, MANIFEST_NAME, TENSOR_WAREHOUSE, ZARR_ARRAY
from warpdata.features import manifest as fmanifest
from warpdata.formats.tbl import SampleNotFound, TblReader
from warpdata.registry import chunks
from warpdata.registry.store import Store
from warpdata.registry.tarpack import ArtifactIndex
from warpdata.storage.blobcache import BlobCache
from warpdata.storage.locations import open_url
from warpdata.warehouse import manifest as wmanifest

# lazy third-party imports: pyarrow (heavy) is imported inside the functions that use it, so
# importing this module does not load it (the Parquet side-table reads)

log = logging.getLogger(__name__)

__all__ = ["Lineage", "WhyRequest", "why"]

# TWH1 writers put the image region at 4096 (docs/formats/twh1.md); bytes per element by dtype
_TWH1_IMAGE_OFFSET = 4096
_DTYPE_BYTES = {"U8": 1, "F16": 2, "F32": 4}


@dataclass
class WhyRequest:
    target: str
    sample: str  # an index (digits) or a key
    store_url: str | None = None
    table: str | None = None  # published datasets: the table (default: the one readers use)


@dataclass
class Lineage:
    """The answer for one sample. Sections are None when the artifact kind has no such thing."""

    target: str
    kind: str
    index: int | None
    key: str | None
    status: str = "kept"  # kept | quarantined
    source: dict[str, Any] | None = None  # path or url, sha256, size
    label: dict[str, Any] | None = None  # file, sha256
    annotation_ids: list[Any] | None = None
    validation: dict[str, Any] | None = None
    transform: dict[str, Any] | None = None  # recipe and its sha256
    encoder: dict[str, Any] | None = None  # feature caches
    location: dict[str, Any] | None = None  # shard, its sha256, index in shard, offset, length
    receipt: dict[str, Any] | None = None
    row: dict[str, Any] | None = None  # published tables: table, row, shard, row group, values, refs
    producer: list[dict[str, Any]] | None = None  # published --from: the source artifact's identity
    missing: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items()}


class _Remote:
    """An artifact directory on an object store (``s3://…``): files read by ranged GETs."""

    def __init__(self, url: str) -> None:
        self.url = url.rstrip("/")
        self.fs, path = open_url(self.url)
        self.path = path.rstrip("/")

    def __truediv__(self, name: str) -> _RemoteFile:
        return _RemoteFile(self, name)

    def __str__(self) -> str:
        return self.url


class _RemoteFile:
    def __init__(self, d: _Remote, name: str) -> None:
        self.fs, self.path, self.url, self.name = d.fs, f"{d.path}/{name}", f"{d.url}/{name}", name

    def is_file(self) -> bool:
        return self.fs.isfile(self.path)

    def open(self, mode: str = "rb"):
        return self.fs.open(self.path, mode, cache_type="none")  # each read one ranged GET (docs/design.md §6)

    def read_bytes(self) -> bytes:
        return self.fs.cat_file(self.path)

    def __str__(self) -> str:
        return self.url


class _Downloaded:
    """A side table of an artifact on object storage, read through the content-addressed blob cache
    by the SHA-256 its manifest records (its bytes hashed as they landed): the Parquet reader reads
    that local copy, named by its URL in messages (docs/formats/twh1.md, "Manifest")."""

    def __init__(self, f: _RemoteFile, path: Path) -> None:
        self.url, self.name, self.path = f.url, f.name, path

    def is_file(self) -> bool:
        return True

    def open(self, mode: str = "rb"):
        return self.path.open("rb")

    def __str__(self) -> str:
        return self.url


def _why_remote(url: str, sample: str) -> Lineage:
    d = _Remote(url)
    m = d / MANIFEST_NAME
    try:
        doc = load_json(m.read_bytes(), str(m))
    except FileNotFoundError:
        raise MissingInputError(f"{m} does not exist", hint="give the version prefix 'warp etl' wrote "
                                "(<root>/vYYYYMMDD-<hash>) or a feature cache's URL") from None
    except (UnicodeDecodeError, ValueError) as e:
        raise DataError(f"{m}: not valid JSON: {e}", hint="rebuild the artifact with 'warp etl'", path=str(m)) from None
    kind = doc.get("kind") if isinstance(doc, dict) else None
    if kind == TENSOR_WAREHOUSE:
        return _why_warehouse(d, _sealed(doc, d, None), sample)
    if kind == FEATURE_CACHE:
        return _why_feature_cache(d, _sealed(doc, d, None), sample)
    raise UsageError(f"{url}: warp why traces a tensor warehouse or a feature cache on object storage, not {kind!r}",
                     hint="publish it and trace WS/NAME, or give a local copy")


def why(req: WhyRequest) -> Lineage:
    target = req.target
    if "://" in target and not target.startswith("file://"):
        return _why_remote(target, req.sample)
    p = Path(target)
    if p.is_file() and p.suffix == ".tbl":
        return _why_tbl(p, req.sample)
    if p.is_dir() or p.name == MANIFEST_NAME and p.is_file():
        d = p if p.is_dir() else p.parent
        found = _local_manifest(d)
        doc, before = found if found is not None else ({}, None)
        kind = doc.get("kind")
        if kind == TENSOR_WAREHOUSE:
            return _why_warehouse(d, _sealed(doc, d, before), req.sample)
        if kind == FEATURE_CACHE:
            return _why_feature_cache(d, _sealed(doc, d, before), req.sample)
        if kind == ZARR_ARRAY:
            return _why_zarr(d, doc, req.sample)
        raise UsageError(f"{d}: warp why does not trace a {kind or 'directory without a warp manifest'}",
                         hint="give a tensor-warehouse version, a feature cache, a .tbl file, a Zarr array "
                              "written by 'warp etl', or WS/NAME of a published dataset")
    if os.path.exists(target) or "/" not in target or target.startswith((".", "/", "~")):
        raise MissingInputError(f"{target}: not a warp artifact or a published dataset (WS/NAME)",
                                hint="give a tensor-warehouse version directory, a feature cache, a .tbl file, "
                                     "a Zarr array or WS/NAME[@VERSION]")
    return _why_published(target, req.sample, req.store_url, req.table)


def _local_manifest(d: Path) -> tuple[dict[str, Any], list[int]] | None:
    m = d / MANIFEST_NAME
    if not m.is_file():
        versions = sorted(d.glob(f"v*/{MANIFEST_NAME}"))
        if versions:
            raise UsageError(f"{d} is a warehouse root with {len(versions)} version(s), not one version",
                             hint=f"name the version directory, e.g. {versions[-1].parent}")
        return None
    return _read_json(m)


def _as_index(sample: str) -> int | None:
    s = sample.strip()
    return int(s) if s.isdigit() else None


def _check_index(i: int, n: int, where: str) -> None:
    if not 0 <= i < n:
        raise UsageError(f"{where}: sample {i} is out of range (it holds {n} samples, 0..{n - 1})",
                         hint="give an index below the sample count, or a key")


def _parquet_row(path: Path, column: str, value: Any, columns: list[str] | None = None) -> dict[str, Any] | None:
    """The first row of ``path`` whose ``column`` equals ``value``: the footer's statistics pick
    the row groups, so a sorted column costs one row group, not the file."""
    import pyarrow as pa

    try:
        return _parquet_row_in(path, column, value, columns)
    except pa.ArrowException as e:  # a truncated or overwritten side table: bad data, not a bug
        raise DataError(f"{path}: not a readable Parquet file ({str(e).splitlines()[0]})",
                        hint="rebuild the artifact with 'warp etl'", path=str(path)) from None


def _parquet_row_in(path: Path, column: str, value: Any, columns: list[str] | None) -> dict[str, Any] | None:
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    if not path.is_file():
        return None
    f = pq.ParquetFile(path if isinstance(path, Path) else path.open())
    md = f.metadata
    try:
        ci = f.schema_arrow.get_field_index(column)
    except KeyError:
        ci = -1
    if ci < 0:
        raise DataError(f"{path}: no column {column!r}", hint="rebuild the artifact with 'warp etl'", path=str(path))
    for g in range(md.num_row_groups):
        st = md.row_group(g).column(ci).statistics
        if st is not None and st.has_min_max:
            try:
                if not st.min <= value <= st.max:
                    continue
            except TypeError:
                pass
        rg = f.read_row_group(g, columns=columns)
        hit = pc.index(rg.column(column), value).as_py()
        if hit >= 0:
            return rg.slice(hit, 1).to_pylist()[0]
    return None


def _quarantined(d: Path, doc: dict[str, Any], key: str) -> dict[str, Any] | None:
    name = (doc.get("files") or {}).get("quarantine")
    return _parquet_row(_side_table(d, doc, name, "files.quarantine", wmanifest.REBUILD_HINT), "sample_id", key) \
        if name else None


def _not_found(d: Path, key: str, what: str) -> MissingInputError:
    return MissingInputError(f"{d}: no {what} with key {key!r}, and none was quarantined under it",
                             hint=f"give an index or a key listed by 'warp head' / the {what}s table")


def _quarantine_answer(base: Lineage, q: dict[str, Any]) -> Lineage:
    base.status = "quarantined"
    base.validation = {"verdict": q["reason"], "message": q["message"], "run": q.get("run")}
    base.label = {"file": q.get("source")}
    return base


# -- tensor warehouse -----------------------------------------------------------------------

def _stat_key(m: Path) -> list[int]:
    st = m.stat()  # ctime: os.utime cannot set it back, so an edit always changes the key
    return [st.st_size, st.st_mtime_ns, st.st_ino, st.st_ctime_ns]


def _read_json(m: Path) -> tuple[dict[str, Any], list[int]]:
    """The parsed JSON object in ``m`` and the file's stat key taken before it was read."""
    import json

    where = str(m)
    try:
        before = _stat_key(m)
        doc = load_json(m.read_bytes(), where)
    except FileNotFoundError:
        raise MissingInputError(f"{m} does not exist", hint="point at a directory written by 'warp etl'") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise DataError(f"{where}: not valid JSON: {e}", hint="rebuild the artifact with 'warp etl'",
                        path=where) from None
    if not isinstance(doc, dict):
        raise DataError(f"{where}: not a warp manifest (not a JSON object)", hint="rebuild the artifact with 'warp etl'",
                        path=where)
    return doc, before


def _seal_stamp(m: Path) -> Path:
    import hashlib

    name = hashlib.sha256(str(m.resolve()).encode()).hexdigest()[:32]
    return Path(envvars.default_cache_dir()) / "lineage-seals" / f"{name}.json"


def _sealed(doc: dict[str, Any], d: Path | _Remote, before: list[int] | None) -> dict[str, Any]:
    """``doc`` (the parsed manifest of ``d``, whose stat key was ``before`` it was read) once its
    seal checks.

    The schema is checked by :func:`_checked_shard` on the top level and the one shard entry a
    lookup uses: validating every entry of a million-sample manifest costs seconds, and the seal
    proves every field is the writer's (docs/lineage.md, "Cost"). The seal is recomputed from
    ``json.dumps`` with the canonical settings: for a document parsed from JSON that is the byte
    string ``warpdata.core.canonical`` hashes (keys are strings, values JSON types, and
    ``allow_nan=False`` refuses what it refuses) without its per-value type walk. A manifest
    whose seal checked is stamped in the cache directory with its size, mtime, inode and ctime
    (taken before it was read) and its seal; a later call on the same unchanged file skips the
    recomputation, as the blob cache's stamps do (docs/lineage.md, "Cost").
    """
    import hashlib
    import json

    m = d / MANIFEST_NAME
    where = str(m)
    stored = doc.get(CONTENT_HASH_FIELD)
    stamp = _seal_stamp(m) if before is not None else None
    want = {"stat": before, "content_sha256": stored}
    try:
        if stamp is not None and isinstance(stored, str) and json.loads(stamp.read_bytes()) == want:
            return doc
    except (OSError, ValueError):
        pass
    try:
        raw = json.dumps({k: v for k, v in doc.items() if k != CONTENT_HASH_FIELD}, sort_keys=True,
                         separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode("utf-8")
    except ValueError:
        raw = b""
    if not isinstance(stored, str) or hashlib.sha256(raw).hexdigest() != stored:
        raise DataError(f"{where}: manifest content does not match its {CONTENT_HASH_FIELD} (or has none): "
                        "the manifest was edited, damaged or written by an older warp",
                        hint="rebuild the artifact with 'warp etl'", path=where)
    if stamp is not None:
        _keep_stamp(stamp, want, f"{where}: seal stamp")
    return doc


def _keep_stamp(stamp: Path, facts: Any, what: str) -> None:
    """Write a check's stamp into the cache; a read-only or full cache only costs the check next time."""
    import json

    try:
        stamp.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(stamp, json.dumps(facts).encode(), fsync=False)
    except OSError as e:
        log.debug(f"{what} not kept in the cache: {e}")


def _checked_shard(doc: dict[str, Any], shard: dict[str, Any], d: Path | _Remote, path_field: str) -> None:
    """Schema-check ``doc`` with ``shards`` cut to ``shard``, and confine the shard's path to ``d``."""
    where = str(d / MANIFEST_NAME)
    kinds.validate({**doc, "shards": [shard]}, where)
    _member(d, shard[path_field], where, f"shard path ({path_field})")


def _member(d: Path | _Remote, rel: Any, where: str, entry: str) -> Path | _Remote:
    """File ``rel`` of artifact ``d`` as its manifest ``where`` names it, confined to ``d``
    (:func:`warpdata.core.confined.confined`; an object-store prefix has no symlinks or special
    files: only the name can leave it)."""
    if not isinstance(d, Path):
        if not isinstance(rel, str) or not rel or rel.startswith("/") or ".." in rel.split("/"):
            raise UnconfinedPathError(f"{where}: {entry} {rel!r} leaves {d}", hint="rebuild it with 'warp etl'",
                                      path=where, entry=str(rel))
        return d / rel
    return confined(d, rel, where, entry=entry, hint="the manifest is damaged or hostile; rebuild it with 'warp etl'")


def _side_table(d: Path | _Remote, doc: dict[str, Any], name: Any, entry: str,
                hint: str) -> Path | _RemoteFile | _Downloaded:
    """Side table ``name`` of artifact ``d`` (confined as :func:`_member`), checked against the
    SHA-256 and size its sealed manifest records before anything is read from it
    (:mod:`warpdata.core.sidetables`; docs/formats/twh1.md, "Manifest"). A local file whose check
    passed is stamped in the cache directory as the manifest's seal is (:func:`_sealed`), so a
    later call on the unchanged file does not hash it again. A file on object storage is read
    through the blob cache by the recorded SHA-256: downloaded whole once (one GET), its bytes
    hashed as they land and refused on a mismatch; a later call finds the checked copy there.
    A manifest written before ``side_tables`` existed gives the file unchecked (ranged reads);
    a missing file is left to the reader to report."""
    import json

    where = str(d / MANIFEST_NAME)
    f = _member(d, name, where, entry)
    want = sidetables.expected(doc, name, where, hint)
    if want is None:
        return f
    if isinstance(f, _RemoteFile):
        return _through_cache(f, name, want, where, hint)
    try:
        before = _stat_key(f)
    except FileNotFoundError:
        return f
    stamp = _seal_stamp(f)
    stamped = {"stat": before, "sha256": want["sha256"], "size_bytes": want["size_bytes"]}
    try:
        if json.loads(stamp.read_bytes()) == stamped:
            return f
    except (OSError, ValueError):
        pass
    sidetables.check_file(f, name, want, where, hint)
    _keep_stamp(stamp, stamped, f"{f}: side-table stamp")
    return f


def _through_cache(f: _RemoteFile, name: str, want: dict[str, Any], where: str,
                   hint: str) -> _RemoteFile | _Downloaded:
    """Side table ``f`` on object storage, fetched into the blob cache as blob ``want["sha256"]``."""
    got: list[bytes] = []

    def download(out) -> None:
        got.append(f.read_bytes())
        out.write(got[-1])

    try:
        path = BlobCache().fetch(want["sha256"], download, size=want["size_bytes"], source=f.url)
    except FileNotFoundError:
        return f  # gone from the store: the reader reports it
    except BlobCorruptedError:
        data = got[-1]
        sidetables.check_bytes(data, f.url, name, want, where, hint)  # raises: names both hashes
        raise
    return _Downloaded(f, path)


def _shard_of(doc: dict[str, Any], first: str, i: int, where: str) -> dict[str, Any]:
    try:
        firsts = [s[first] for s in doc["shards"]]
        return doc["shards"][bisect.bisect_right(firsts, i) - 1]
    except (KeyError, TypeError, IndexError):
        raise DataError(f"{where}: the manifest's shard list is malformed",
                        hint="rebuild the artifact with 'warp etl'", path=where) from None


def _side_row(base: Lineage, d: Path | _Remote, table: Any, index_column: str, count: int, sample: str,
              quarantined: Callable[[], dict[str, Any] | None]) -> tuple[dict[str, Any] | None, Lineage | None]:
    """(the side-table row of ``sample``, None), found by its index (``index_column``, checked against
    ``count``) or its key; for a key the table lacks, (None, the answer from its quarantine record).
    ``index_column`` also names the thing in the not-found error ("sample", "record")."""
    if base.index is not None:
        _check_index(base.index, count, str(d))
        return _parquet_row(table, index_column, base.index), None
    row = _parquet_row(table, "key", sample)
    if row is not None:
        return row, None
    base.key = sample
    q = quarantined()
    if q is None:
        raise _not_found(d, sample, index_column)
    return None, _quarantine_answer(base, q)


def _why_warehouse(d: Path | _Remote, doc: dict[str, Any], sample: str) -> Lineage:
    files = doc.get("files", {})
    samples = _side_table(d, doc, files.get("samples", "samples.parquet"), "files.samples", wmanifest.REBUILD_HINT)
    i = _as_index(sample)
    base = Lineage(str(d), TENSOR_WAREHOUSE, i, None)
    row, answer = _side_row(base, d, samples, "sample", doc["num_samples"], sample,
                            lambda: _quarantined(d, doc, sample))
    if answer is not None:
        return answer
    if row is None:
        raise DataError(f"{samples}: no row for sample {i} although the manifest holds {doc['num_samples']}",
                        hint=wmanifest.REBUILD_HINT, path=str(samples))
    _checked_shard(doc, _shard_of(doc, "first_sample", row["sample"], str(d)), d, "relative_path")
    src = _parquet_row(_side_table(d, doc, files.get("sources", "sources.parquet"), "files.sources",
                                   wmanifest.REBUILD_HINT), "key", row["key"]) or {}
    return _warehouse_lineage(base, doc, row, src)


def _warehouse_lineage(base: Lineage, doc: dict[str, Any], row: dict[str, Any], src: dict[str, Any]) -> Lineage:
    """Fill ``base`` from a warehouse manifest, its ``samples.parquet`` row and ``sources.parquet`` row."""
    import json

    base.index, base.key = row["sample"], row["key"]
    recipe = json.loads(doc["version_recipe"])
    root = str(recipe.get("dataset_root", doc.get("dataset_root", ".")))
    rel = row["source_path"]
    where = f"{root.rstrip('/')}/{rel}" if "://" in root else rel
    base.source = {"url" if "://" in root else "path": where, "dataset_root": root,
                   "sha256": src.get("sha256"), "size": src.get("size")}
    labels = {f: h for f, h in recipe.get("labels", [])}
    label_file = row.get("label_source")
    if label_file is None:  # written before samples.parquet named the label file
        base.missing.append("label file per sample (samples.parquet of this version has no label_source column)")
        if len(labels) == 1:
            label_file = next(iter(labels))
    base.label = {"file": label_file, "sha256": labels.get(label_file)} if label_file else None
    if "annotation_ids" in row:
        base.annotation_ids = row["annotation_ids"]
    else:  # written before samples.parquet recorded them
        base.missing.append("annotation ids (samples.parquet of this version has no annotation_ids column)")
    base.validation = {"verdict": "passed", "boxes": row["n_boxes"], "class_ids": row["class_ids"],
                       "dataset_verdict": doc["summary"]["verdict"]["status"],
                       "checks": doc["summary"]["verdict"]["checks"], "thresholds": doc["thresholds"]}
    if row.get("run_id") or row.get("frame_id", -1) >= 0:
        base.validation.update(run_id=row.get("run_id"), frame_id=row.get("frame_id"))
    base.transform = {"recipe": doc["transform"], "version_recipe_sha256": doc["version"],
                      "code_version": doc["code_version"]}
    sh = _shard_of(doc, "first_sample", base.index, base.target)
    k = base.index - sh["first_sample"]
    stride = sh["channels"] * sh["height"] * sh["width"] * _DTYPE_BYTES.get(sh["dtype"], 1)
    base.location = {"shard": sh["id"], "file": sh["relative_path"], "shard_sha256": sh["checksum_sha256"],
                     "index_in_shard": k, "image_offset": _TWH1_IMAGE_OFFSET + k * stride, "image_bytes": stride}
    base.receipt = {"shard_id": sh["id"], "sha256": sh["checksum_sha256"], "size_bytes": sh["size_bytes"]}
    base.missing.append("the receipt's task_sha256 (the journal is removed once a version is built: "
                        "docs/formats/receipts.md); its shard id, sha256 and size are the manifest's")
    return base


# -- feature cache ------------------------------------------------------------------------------

def _why_feature_cache(d: Path | _Remote, doc: dict[str, Any], sample: str) -> Lineage:
    records = _side_table(d, doc, "records.parquet", "records table", fmanifest.REBUILD_HINT)
    i = _as_index(sample)
    base = Lineage(str(d), FEATURE_CACHE, i, None)
    row, answer = _side_row(base, d, records, "record", doc["records"], sample,
                            lambda: _parquet_row(_side_table(d, doc, "quarantine.parquet", "quarantine table",
                                                             fmanifest.REBUILD_HINT), "sample_id", sample))
    if answer is not None:
        return answer
    if row is None:
        raise DataError(f"{records}: no row for record {i}", hint=fmanifest.REBUILD_HINT, path=str(records))
    shard = next((s for s in doc["shards"] if isinstance(s, dict) and s.get("path") == row["shard"]), None)
    if shard is None:
        raise DataError(f"{records}: record {row['record']} names shard {row['shard']!r}, which the manifest lacks",
                        hint=fmanifest.REBUILD_HINT, path=str(records))
    _checked_shard(doc, shard, d, "path")

    def header(name: str) -> bytes:
        with (d / name).open("rb") as f:
            return f.read(24)

    return _feature_lineage(base, doc, row, header)


def _feature_lineage(base: Lineage, doc: dict[str, Any], row: dict[str, Any], header) -> Lineage:
    """Fill ``base`` from a feature-cache manifest and its ``records.parquet`` row; ``header(name)``
    returns the first 24 bytes of a shard (for the record's byte offset)."""
    base.index, base.key = row["record"], row["key"]
    src_name = row.get("source") or "d0"
    src = next((s for s in doc.get("sources", []) if s["name"] == src_name), None)
    base.source = {"path": row["key"], "directory": src_name, "caption": row["caption"],
                   "caption_prefix": src["caption_prefix"] if src else "", "is_video": row["is_video"],
                   "size": [row["width"], row["height"]]}
    base.missing.append("the source file's SHA-256 (a feature cache records one xxh3-128 digest over all "
                        "sources, fingerprint_inputs.dataset.source_digest, not one per file)")
    base.validation = {"verdict": "passed", "dataset_verdict": doc["verdict"]["status"]}
    inputs = doc["fingerprint_inputs"]
    base.transform = {"recipe": inputs["dataset"], "code": inputs["code"], "fingerprint": doc["fingerprint"]}
    enc = inputs.get("encoder")
    base.encoder = {"encoder": enc, "fingerprint": doc["fingerprint"]} if enc else \
        {"encoder": None, "fingerprint": doc["fingerprint"], "note": "pixels stored, no encoder"}
    shard = next(s for s in doc["shards"] if s.get("path") == row["shard"])
    k = row["shard_index"]
    loc = {"shard": shard["path"], "shard_sha256": shard["sha256"], "index_in_shard": k,
           "record_bytes": doc["record_size"]}
    try:  # data_offset: bytes 16..24 of the shard's 64-byte header (docs/formats/feature-shard.md)
        loc["offset"] = struct.unpack_from("<Q", header(shard["path"]), 16)[0] + k * doc["record_size"]
    except (OSError, struct.error):
        base.missing.append(f"the record's byte offset ({shard['path']} could not be read)")
    base.location = loc
    base.receipt = {"shard_id": shard["path"], "sha256": shard["sha256"], "size_bytes": shard["bytes"]}
    base.missing.append("the receipt's task_sha256 (the journal is removed once the cache is built: "
                        "docs/formats/receipts.md)")
    return base


# -- .tbl --------------------------------------------------------------------------------------

def _why_tbl(p: Path, sample: str) -> Lineage:
    r = TblReader(p, verify=False)
    try:
        i = _as_index(sample)
        if i is None:
            try:
                i = r.index_of(sample)
            except (SampleNotFound, KeyError):
                raise MissingInputError(f"{p}: no sample with key {sample!r}",
                                        hint="give an index, or a key 'warp inspect --head' lists") from None
        _check_index(i, r.num_samples, str(p))
        info = r.info(i)
        meta = r.metadata(i) if info.has_metadata else None
        base = Lineage(str(p), "tbl", i, r.key(i))
        base.source = {"path": str(p), "member": meta.get("name") if isinstance(meta, dict) else None,
                       "sidecars": sorted((meta or {}).get("sidecars", {})) if isinstance(meta, dict) else None}
        base.location = {"offset": info.offset, "stored_bytes": info.size, "bytes": info.uncompressed_size,
                         "format": info.format, "compression": info.compression, "crc16": info.crc16,
                         "size": [info.width, info.height]}
        base.missing.append("a SHA-256 of the source tar or of the sample (TBL v2 records CRCs only: "
                            "docs/formats/tbl-v2.md)")
        return base
    finally:
        r.close()


# -- Zarr array ---------------------------------------------------------------------------------

def _why_zarr(d: Path, doc: dict[str, Any], sample: str) -> Lineage:
    kinds.validate(doc, str(d / MANIFEST_NAME))
    i = _as_index(sample)
    if i is None:
        raise UsageError(f"{d}: a Zarr array's samples are rows of its first dimension; {sample!r} is not one",
                         hint=f"give an index from 0 to {doc['shape'][0] - 1}")
    _check_index(i, doc["shape"][0], str(d))
    base = Lineage(str(d), ZARR_ARRAY, i, None)
    src = doc.get("source") or {}
    base.source = {"path": src.get("name"), "format": src.get("format"), "input_crc32c": doc["input_crc32c"]}
    base.missing.append("the input's SHA-256 (a Zarr build records its CRC-32C)")
    base.transform = {"recipe": doc.get("recipe"), "recipe_sha256": doc.get("recipe_key")}
    lv = doc["levels"][0]
    per_object = (lv.get("shards") or lv["chunks"])[0]
    rest = ["0"] * (len(lv["shape"]) - 1)
    key = "/".join(x for x in (lv["path"], "c", str(i // per_object), *rest) if x)
    base.location = {"level": 0, "object": key, "row_in_object": i % per_object,
                     "level_sha256": lv.get("sha256"), "shape": lv["shape"], "chunks": lv["chunks"],
                     "shards": lv.get("shards")}
    base.missing.append("per-object SHA-256 (the manifest keeps one digest per level: docs/formats/zarr-tiles.md)")
    return base


# -- published dataset ----------------------------------------------------------------------------

KEY_COLUMNS = ("key", "path", "id", "sample_id", "name")


def _why_published(target: str, sample: str, store_url: str | None, table: str | None) -> Lineage:
    name, _, version = target.partition("@")
    st = Store(store_url)
    m = st.resolve(name, version or None)
    tname = table or _default_table(m)
    if tname not in m.tables:
        raise MissingInputError(f"{name}@{m.version_hash[:12]} has no table {tname!r}",
                                hint=f"tables: {', '.join(sorted(m.tables)) or 'none'}")
    t = m.tables[tname]
    i = _as_index(sample)
    base = Lineage(f"{name}@{m.version_hash}", "dataset", i, None)
    if i is not None:
        _check_index(i, t.row_count, f"{name} table {tname}")
        found = _row_at(st, t, i)
    else:
        kcol = next((c for c in KEY_COLUMNS if c in t.columns), None) or next(iter(m.bindings_for(tname)), None)
        if kcol is None:
            raise UsageError(f"{name} table {tname} has no key column ({', '.join(KEY_COLUMNS)}) or bound column",
                             hint="give the row's index instead of a key")
        found = _find_row(st, t, kcol, sample)
        q = m.tables.get("quarantine")
        if found is None and q is not None and {"sample_id", "reason", "message"} <= set(q.columns):
            # a published warehouse keeps its quarantine table: a rejected key answers with its
            # reason, as it does on the local warehouse (docs/lineage.md, rule 4)
            hit = _find_row(st, q, "sample_id", sample)
            if hit is not None:
                base.key = sample
                return _quarantine_answer(base, hit[3])
        if found is None:
            raise MissingInputError(f"{name} table {tname}: no row with {kcol} = {sample!r}",
                                    hint=f"list keys with 'warp head {name} --table {tname} -n 20'")
    si, offset, rg, values = found
    shard = t.shards[si]
    base.index = sum(s.row_count or 0 for s in t.shards[:si]) + offset
    base.key = next((str(values[c]) for c in KEY_COLUMNS if values.get(c) is not None), None)
    base.row = {"table": tname, "row": base.index, "shard": si, "shard_sha256": shard.hash,
                "row_in_shard": offset, "row_group": rg, "values": _jsonable(values),
                "refs": _refs(st, m, tname, values)}
    base.producer = m.metadata.get("sources")
    base.transform = {"version_hash": m.version_hash}
    base.source = {"url": shard.uri if "://" in shard.uri else st.url_of(shard.uri), "sha256": shard.hash}
    fc = _published_producer(st, m, tname, FEATURE_CACHE)
    if fc is not None and "record" in values and "shard_index" in values:  # a feature cache's records table
        doc, idx = fc
        _published_side_table(m, tname, doc, f"{name}@{m.version_hash[:12]}", FEATURE_CACHE)
        names = [s.get("path") for s in doc["shards"] if isinstance(s, dict)]
        if values.get("shard") in names:
            def header(name: str) -> bytes:
                blob, off, _ln = idx.lookup(name)
                return _read(st, m, blob, off, 24)

            _feature_lineage(base, doc, dict(values), header)
            base.index = sum(s.row_count or 0 for s in t.shards[:si]) + offset
            base.transform["version_hash"] = m.version_hash
            loc = base.location
            if loc.get("shard") in idx and "offset" in loc:
                blob, off, _ln = idx.lookup(loc["shard"])
                loc.update(blob_sha256=blob, blob_offset=off + loc["offset"])
                _chunk_of(m, loc)
    wh = _published_warehouse(st, m, tname)
    if wh is not None and "source_path" in values:  # a warehouse's samples table: trace on to its sources
        doc, sources_table, idx = wh
        for used in (tname, sources_table):
            if used is not None:
                _published_side_table(m, used, doc, f"{name}@{m.version_hash[:12]}")
        src = _find_row(st, m.tables[sources_table], "key", values["key"]) if sources_table else None
        _warehouse_lineage(base, doc, dict(values), src[3] if src else {})
        loc = base.location or {}
        if loc.get("file") in idx:  # the TWH1 shard is a member of a tar shard: where its image lies there
            blob, off, _ln = idx.lookup(loc["file"])
            loc.update(blob_sha256=blob, blob_offset=off + loc["image_offset"])
            _chunk_of(m, loc)
        base.index = sum(s.row_count or 0 for s in t.shards[:si]) + offset
        base.transform["version_hash"] = m.version_hash
    return base


def _read(st, m, blob: str, offset: int, length: int) -> bytes:
    """``length`` bytes at ``offset`` of tar shard ``blob``: one ranged read, or of the chunks
    holding them when the shard is stored as chunks (docs/formats/registry.md, "Chunked shards")."""
    ref = chunks.chunked_refs([m]).get(blob)
    return st.read_range(blob, offset, length) if ref is None else chunks.read_range(st, ref, offset, length)


def _chunk_of(m, loc: dict[str, Any]) -> None:
    """For a location inside a chunked shard: the chunk holding its first byte, and the offset there."""
    ref = chunks.chunked_refs([m]).get(loc["blob_sha256"])
    if ref is not None:
        c, coff = chunks.locate(ref, loc["blob_offset"])
        loc.update(chunk_sha256=c, chunk_offset=coff)


def _row_at(st, t, i: int) -> tuple[int, int, int, dict[str, Any]]:
    """(shard number, row in shard, row group, values) of row ``i`` of table ``t``."""
    start = 0
    for si, s in enumerate(t.shards):
        if i < start + (s.row_count or 0):
            f = _open_parquet(st, s.hash)
            rg, in_rg = _row_group_of(f.metadata, i - start)
            return si, i - start, rg, f.read_row_group(rg).slice(in_rg, 1).to_pylist()[0]
        start += s.row_count or 0
    raise DataError(f"row {i} is beyond the table's shards", hint="republish the dataset")


def _find_row(st, t, column: str, value: Any) -> tuple[int, int, int, dict[str, Any]] | None:
    """The first row whose ``column`` equals ``value``; shards whose statistics exclude it are not read."""
    for si, s in enumerate(t.shards):
        if not _may_hold(s.stats, column, value):
            continue
        f = _open_parquet(st, s.hash)
        col = f.read(columns=[column]).column(column).to_pylist()
        if value in col:
            offset = col.index(value)
            rg, in_rg = _row_group_of(f.metadata, offset)
            return si, offset, rg, f.read_row_group(rg).slice(in_rg, 1).to_pylist()[0]
    return None


def _open_parquet(st, blob: str):
    import pyarrow.parquet as pq

    return pq.ParquetFile(arrow_reader(st.get_blob(blob)))


def _refs(st, m, tname: str, values: dict[str, Any]) -> list[dict[str, Any]]:
    """Each bound column's member, with the tar shard (blob) holding it and the byte range."""
    refs, indexes = [], {}
    for col, b in sorted(m.bindings_for(tname).items()):
        member = values.get(col)
        art = m.artifacts[b.artifact]
        ref = {"column": col, "artifact": b.artifact, "member": member, "ref_type": b.ref_type}
        if member and art.index is not None:
            if b.artifact not in indexes:
                indexes[b.artifact] = ArtifactIndex.from_bytes(st.get_blob(art.index.hash),
                                                               source=f"index of {b.artifact}")
            idx = indexes[b.artifact]
            if member in idx:
                blob, off, ln = idx.lookup(member)
                ref.update(blob_sha256=blob, offset=off, length=ln)
            else:
                ref["dangling"] = True
        refs.append(ref)
    return refs


def _published_producer(st, m, tname: str, kind: str) -> tuple[dict[str, Any], Any] | None:
    """For a table published ``--from`` an artifact of ``kind``: that artifact's ``manifest.json``
    (one ranged read of the member, its seal checked) and the artifact's member index."""
    for p in m.metadata.get("sources") or []:
        if not isinstance(p, dict) or p.get("kind") != kind or tname not in (p.get("tables") or []):
            continue
        art = m.artifacts.get(p.get("artifact"))
        if art is None or art.index is None:
            return None
        idx = ArtifactIndex.from_bytes(st.get_blob(art.index.hash), source=f"index of {p['artifact']}")
        if MANIFEST_NAME not in idx:
            return None
        blob, off, ln = idx.lookup(MANIFEST_NAME)
        where = f"{p['artifact']}:{MANIFEST_NAME}"
        if kind == TENSOR_WAREHOUSE:
            return wmanifest.parse(_read(st, m, blob, off, ln), where), idx

        try:
            doc = load_json(_read(st, m, blob, off, ln), where)
        except (UnicodeDecodeError, ValueError) as e:
            raise DataError(f"{where}: not valid JSON: {e}", hint="republish the dataset", path=where) from None
        return fmanifest.check(doc, where), idx
    return None


def _published_warehouse(st, m, tname: str) -> tuple[dict[str, Any], str | None, Any] | None:
    """For a table published from a tensor warehouse (``--from``): the warehouse's sealed manifest,
    the name of its sources table and the artifact's member index."""
    found = _published_producer(st, m, tname, TENSOR_WAREHOUSE)
    if found is None:
        return None
    doc, idx = found
    p = next(p for p in m.metadata["sources"] if isinstance(p, dict) and p.get("kind") == TENSOR_WAREHOUSE
             and tname in (p.get("tables") or []))
    sources = next((n for n in p["tables"] if n == "sources" or n.endswith("_sources")), None)
    return doc, sources, idx


def _published_side_table(m, tname: str, doc: dict[str, Any], label: str, kind: str = TENSOR_WAREHOUSE) -> None:
    """Table ``tname``, published byte for byte from a side table of an artifact of ``kind``
    (``warp publish --from``), must be the file the artifact's sealed manifest ``doc`` records in
    ``side_tables``: its one shard's blob hash (checked on download) is that SHA-256
    (docs/formats/twh1.md, "Manifest"). Nothing to compare for an artifact built before
    ``side_tables`` existed."""
    recorded = doc.get(sidetables.FIELD) or {}
    p = next(p for p in m.metadata["sources"] if isinstance(p, dict) and p.get("kind") == kind
             and tname in (p.get("tables") or []))
    stem = tname.removeprefix(f"{p.get('artifact')}_")
    want = recorded.get(f"{stem}.parquet")
    shards = m.tables[tname].shards
    if not isinstance(want, dict) or len(shards) != 1:
        return
    if shards[0].hash != want.get("sha256"):
        raise sidetables.SideTableMismatchError(
            f"{label} table {tname}: blob {shards[0].hash} is not side table {stem}.parquet of the {kind} it "
            f"was published from, whose sealed manifest records SHA-256 {want.get('sha256')}",
            hint=f"republish the dataset from an intact {kind} ('warp inspect --verify DIR' first)",
            path=f"{label}:{tname}", entry=f"{stem}.parquet", expected=want.get("sha256"), computed=shards[0].hash)


def _default_table(m) -> str:
    names = sorted(m.tables)
    if len(names) == 1:
        return names[0]
    if "main" in names:
        return "main"
    declared = m.metadata.get("default_table")
    if isinstance(declared, str) and declared in names:
        return declared
    raise UsageError(f"{m.dataset_id} has several tables ({', '.join(names)}) and no default",
                     hint="name one with --table")


def _may_hold(stats: dict | None, column: str, value: str) -> bool:
    col = ((stats or {}).get("columns") or {}).get(column) or {}
    lo, hi = col.get("min"), col.get("max")
    if isinstance(lo, str) and isinstance(hi, str):
        return lo <= value <= hi
    return True


def _row_group_of(md, offset: int) -> tuple[int, int]:
    for g in range(md.num_row_groups):
        n = md.row_group(g).num_rows
        if offset < n:
            return g, offset
        offset -= n
    raise DataError("row beyond the shard's row groups", hint="republish the dataset")


def _jsonable(values: dict[str, Any]) -> dict[str, Any]:
    out = {}
    for k, v in values.items():
        if isinstance(v, bytes | bytearray):
            out[k] = f"<{len(v)} bytes>"
        elif isinstance(v, int | float | str | bool | list | dict) or v is None:
            out[k] = v
        else:
            out[k] = str(v)
    return out
