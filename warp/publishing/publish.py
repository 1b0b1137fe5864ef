"""Publishing a dataset version: the transaction behind ``warp publish``.

:func:`publish` takes a :class:`PublishRequest` (tables of Parquet/CSV/JSONL
files, artifact directories, ``--from`` warp artifacts, bindings) and runs,
in this order (docs/design.md §10):

1. **Stage.** Parquet files are hashed in place; CSV/JSONL are converted to
   Parquet; directories are packed into deterministic tar shards plus a
   member index (:mod:`warpdata.registry.tarpack`). A *stat cache* under
   ``$WARP_CACHE_DIR/publish/`` remembers, per input file or directory
   listing (path, size, mtime_ns, ctime_ns, inode of every file), the hashes
   it produced, so re-publishing unchanged inputs neither re-hashes nor
   re-packs (``rehash=True`` ignores it). Any write moves a file's ctime, so
   same-size edits are caught; an input whose ctime is within
   ``RACY_WINDOW_NS`` of the scan is not cached at all, because a second
   write in the same filesystem clock tick could leave identical timestamps
   (git's "racily clean" problem).
2. **Upload missing blobs**, create-only and in parallel. An existing blob is
   skipped (412 / FileExistsError means another run already did the work).
   If the version's manifest already exists, every blob it names was
   uploaded before it (step order below), so nothing is checked or sent.
   ``latest`` is read first: when it already names this version, its
   manifest (and so every blob) is in the store, so an unchanged re-publish
   costs that one small GET and nothing else.
3. **Upload the manifest**, create-only, at its version hash.
   Then, if a ``warp gc`` sweep overlapped the existence check of step 2 (its marker
   ``gc/sweep.json`` says so: one GET), wait for it to finish, check every blob again and
   upload what it deleted (:func:`warpdata.registry.gc.after_manifest`, docs/formats/registry.md,
   "Garbage collection").
4. **Move ``latest``** with compare-and-swap against the pointer read in
   step 2 (optional: ``set_latest``); if another writer moved it meanwhile,
   :meth:`Store.set_latest` retries.

Consequences: publishing the same content twice uploads nothing and reports
the same version (idempotent); a killed run leaves only whole blobs behind and
no manifest pointing at missing blobs, and a rerun uploads only what is
missing (resumable); concurrent publishers each land a whole version and
``latest`` ends at one of them. ``dry_run`` stops after computing the plan.
"""

from __future__ import annotations

import contextlib
import functools
import glob
import hashlib
import json
import logging
import os
import shutil
import socket
import time
import uuid
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from warpdata import __version__
from warpdata.core import envvars
from warpdata.core.atomic import atomic_write_bytes
from warpdata.core.canonical import sha256_file
from warpdata.core.errors import DataError, MissingInputError, UsageError
from warpdata.core.jsondoc import load_json
from warpdata.features.remote import is_url, stage_version
from warpdata.formats import parquet_index
from warpdata.lineage.card import CARD_MAX_BYTES, merge
from warpdata.publishing import from_artifacts
from warpdata.publishing.from_artifacts import check_symlinks
from warpdata.publishing.multipart import MAX_PARTS as MAX_PARTS  # kept importable from here
from warpdata.publishing.multipart import (
    MULTIPART_MIN,
    _put_multipart,
    _s3_backend,
    upload_concurrency,
)
from warpdata.publishing.multipart import PART_SIZE as PART_SIZE
from warpdata.publishing.multipart import part_size as part_size
from warpdata.registry import gc, signing
from warpdata.registry.bindings import check_binding, check_binding_names, check_bindings
from warpdata.registry.chunks import CHUNK_TARGET, member_chunks
from warpdata.registry.manifest import (
    INDEX_FORMAT,
    NAME_RE,
    REF_TYPES,
    Artifact,
    Binding,
    Manifest,
    ShardRef,
    Table,
    blob_key,
    encode_arrow_schema,
    validate_dataset_id,
)
from warpdata.registry.parquet_stats import footer_size_of, shard_stats
from warpdata.registry.store import Store
from warpdata.registry.tarpack import (
    DEFAULT_ALONE_SIZE,
    DEFAULT_TARGET_SIZE,
    member_name,
    nfc_members,
    pack_files,
    scan_members,
)
from warpdata.storage.blobcache import BlobCache

# lazy third-party imports: pyarrow (heavy) is imported inside the functions that use it, so
# importing this module does not load it (the reads of a table file being published)

__all__ = ["DatasetBuilder", "PlannedBlob", "PublishRequest", "PublishResult", "parse_binding",
           "parse_named", "publish"]

log = logging.getLogger(__name__)

STAT_CACHE_VERSION = 3  # 3: table entries carry the shard stats
# table entries only (artifact entries stay valid): "arrow" = they carry the exact Arrow schema (format 4)
FACTS_VERSION = "arrow"
# Linux file timestamps come from a coarse clock (one tick: 1-10 ms); an input changed
# within this window before it was stat'ed could be written again with the same stamps.
RACY_WINDOW_NS = 100_000_000
TABLE_SUFFIXES = {".parquet": "parquet", ".pq": "parquet", ".csv": "csv", ".jsonl": "jsonl",
                  ".ndjson": "jsonl", ".json": "jsonl"}


@dataclass
class PublishRequest:
    dataset_id: str
    tables: dict[str, list[str]] = field(default_factory=dict)  # name -> files or globs
    artifacts: dict[str, str] = field(default_factory=dict)  # name -> directory
    # name -> the member paths (relative to its directory) to pack; absent: every regular file
    artifact_files: dict[str, list[str]] = field(default_factory=dict)
    bindings: list[Binding] = field(default_factory=list)
    from_paths: list[str] = field(default_factory=list)
    set_latest: bool = True
    dry_run: bool = False
    store_url: str | None = None
    shard_size: int = DEFAULT_TARGET_SIZE
    # bytes of sample images per stored chunk of a TWH1 tar shard; 0 stores every shard whole
    # (docs/formats/registry.md, "Chunked shards")
    chunk_target: int = CHUNK_TARGET
    workers: int = 8
    rehash: bool = False
    # hard-link the published files into the local blob cache (remote stores): the publisher then
    # reads its dataset from its originals instead of downloading it
    link_cache: bool = False
    description: str | None = None
    # a Markdown dataset card kept in the non-hashed envelope as metadata.card (docs/lineage.md)
    card: str | None = None
    allow_dangling: bool = False  # publish bindings whose values name no member (count kept in metadata)
    follow_symlinks: bool = False  # walk symlinked directories inside --artifact directories
    # "paged": Parquet inputs without a page index are rewritten with one, pages of PAGE_ROWS rows
    # (docs/partitioning.md, "Reads aligned with storage"); "as-is": published byte for byte
    layout: str = "paged"
    # Ed25519 private key files (PEM or OpenSSH): each signs the version into metadata.signatures (registry.signing)
    sign_keys: list[str] = field(default_factory=list)


@dataclass
class PlannedBlob:
    hash: str
    byte_size: int
    role: str  # "table main shard 0", "artifact raw index", ...
    upload: bool = False


@dataclass
class PublishResult:
    dataset_id: str
    version_hash: str
    store: str
    dry_run: bool
    blobs: list[PlannedBlob]
    blobs_uploaded: int = 0
    bytes_uploaded: int = 0
    manifest_written: bool = False
    already_published: bool = False
    latest: str | None = None
    latest_moved: bool = False
    seconds: float = 0.0
    cache_linked: int = 0  # published blobs hard-linked into the local blob cache (remote stores)
    stat_cache_hits: int = 0
    dangling_refs: dict[str, int] = field(default_factory=dict)  # with allow_dangling
    # with a card: True when this publish wrote the manifest holding it; False when the version was
    # already stored (manifests are create-only, so the stored envelope and its card stay)
    card_stored: bool | None = None
    # with sign_keys: the key ids, and whether this publish wrote the manifest holding their signatures
    signed_by: list[str] = field(default_factory=list)
    signatures_stored: bool | None = None
    # blobs a 'warp gc' sweep deleted while this publish ran, uploaded again before latest moved
    blobs_reuploaded: int = 0

    @property
    def bytes_total(self) -> int:
        return sum(b.byte_size for b in self.blobs)

    def to_dict(self) -> dict[str, Any]:
        return {
            "dataset_id": self.dataset_id, "version_hash": self.version_hash, "store": self.store,
            "dry_run": self.dry_run, "blobs_total": len(self.blobs),
            "blobs_to_upload" if self.dry_run else "blobs_uploaded":
                sum(b.upload for b in self.blobs) if self.dry_run else self.blobs_uploaded,
            "bytes_total": self.bytes_total,
            "bytes_to_upload" if self.dry_run else "bytes_uploaded":
                sum(b.byte_size for b in self.blobs if b.upload) if self.dry_run else self.bytes_uploaded,
            "manifest_written": self.manifest_written, "already_published": self.already_published,
            "latest": self.latest, "latest_moved": self.latest_moved, "cache_linked": self.cache_linked,
            "seconds": round(self.seconds, 3),
            "plan": [{"hash": b.hash, "byte_size": b.byte_size, "role": b.role, "upload": b.upload}
                     for b in self.blobs] if self.dry_run else None,
            "dangling_refs": self.dangling_refs or None,
            "card_stored": self.card_stored,
            "signed_by": self.signed_by or None, "signatures_stored": self.signatures_stored,
            **({"blobs_reuploaded": self.blobs_reuploaded} if self.blobs_reuploaded else {}),
        }


# -- command-line value parsing ------------------------------------------------

def parse_named(spec: str, option: str) -> tuple[str, str]:
    """``NAME=VALUE`` from ``--table``/``--artifact``."""
    name, sep, value = spec.partition("=")
    if not sep or not name or not value:
        raise UsageError(f"{option} {spec!r} is not NAME=VALUE", hint=f"e.g. {option} main=data/*.parquet")
    if not NAME_RE.match(name):
        raise UsageError(f"{option} name {name!r} must be letters, digits, '_', '.', '-'",
                         hint=f"e.g. {option} main=...")
    return name, value


def parse_binding(spec: str) -> Binding:
    """``TABLE.COLUMN=ARTIFACT:TYPE`` from ``--bind`` (TYPE defaults to file)."""
    left, sep, right = spec.partition("=")
    table, dot, column = left.partition(".")
    artifact, _, ref_type = right.partition(":")
    ref_type = ref_type or "file"
    if not sep or not dot or not table or not column or not artifact:
        raise UsageError(f"--bind {spec!r} is not TABLE.COLUMN=ARTIFACT:TYPE",
                         hint="e.g. --bind main.image=raw_images:image")
    if ref_type not in REF_TYPES:
        raise UsageError(f"--bind {spec!r}: ref type {ref_type!r} is not one of {', '.join(REF_TYPES)}",
                         hint="e.g. --bind main.image=raw_images:image")
    return Binding(table, column, artifact, ref_type)


def expand_globs(name: str, patterns: Iterable[str]) -> list[str]:
    files: list[str] = []
    for pat in patterns:
        hits = sorted(glob.glob(os.path.expanduser(pat), recursive=True))
        if not hits and os.path.isfile(pat):
            hits = [pat]
        if not hits:
            raise MissingInputError(f"--table {name}={pat}: no file matches", hint="check the path or quote the glob")
        files.extend(h for h in hits if os.path.isfile(h))
    return files


# -- the stat cache ------------------------------------------------------------

class _StatCache:
    """Fingerprint (path + size + mtime_ns + ctime_ns + inode) -> what hashing produced.

    One small JSON file per input, written atomically; an unreadable or
    missing entry is a miss (the input is hashed again), never an error.
    """

    def __init__(self, enabled: bool) -> None:
        self.root = Path(envvars.default_cache_dir()) / "publish" / "stat-cache"
        self.enabled = enabled
        self.hits = 0

    @staticmethod
    def key(*parts: Any) -> str:
        return hashlib.sha256(json.dumps([STAT_CACHE_VERSION, *parts], default=str).encode()).hexdigest()

    def get(self, key: str) -> dict | None:
        if not self.enabled:
            return None
        try:
            doc = load_json((self.root / key[:2] / key).read_bytes(), key)
        except (OSError, ValueError):
            return None
        self.hits += 1
        return doc

    def put(self, key: str, doc: dict, *, newest_ctime_ns: int, scanned_at_ns: int) -> None:
        if newest_ctime_ns >= scanned_at_ns - RACY_WINDOW_NS:
            return  # racily clean: a later same-tick write would look unchanged
        with contextlib.suppress(OSError):
            atomic_write_bytes(self.root / key[:2] / key, json.dumps(doc).encode(), fsync=False)


def _file_fingerprint(path: str) -> tuple[list[Any], int]:
    """The stat facts that identify a file's content, and its ctime."""
    st = os.stat(path)
    return [os.path.abspath(path), st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev], st.st_ctime_ns


# -- staging -------------------------------------------------------------------

@dataclass
class _Blob:
    hash: str
    byte_size: int
    role: str
    path: str | None  # local file holding the bytes; None until (re)materialised
    materialize: Callable[[], None] | None = None
    offset: int | None = None  # a chunk: its bytes are [offset, offset + byte_size) of ``path``
    owner: str | None = None  # a chunk: the hash of the tar shard whose staged file ``path`` is


class _Stager:
    def __init__(self, req: PublishRequest, stage_dir: Path) -> None:
        self.req = req
        self.stage = stage_dir
        self.cache = _StatCache(not req.rehash)
        self.blobs: dict[str, _Blob] = {}
        self.table_files: dict[str, list[str]] = {}  # name -> input files (for the binding check)
        self.members: dict[str, list[str]] = {}  # artifact -> member names
        self.skipped_links: dict[str, tuple[str, ...]] = {}  # artifact -> symlinked dirs left out
        self.page_rows: dict[str, int] = {}  # table -> rows per page of its rewritten files
        self.chunked: dict[str, _Blob] = {}  # chunked tar shards: stored as chunks, never uploaded whole

    def _add(self, b: _Blob) -> None:
        prev = self.blobs.get(b.hash)
        if prev is None or (prev.path is None and b.path is not None):
            self.blobs[b.hash] = b

    # tables ---------------------------------------------------------------
    def table(self, name: str, files: list[str], as_is: bool = False) -> Table:
        """``as_is``: Parquet files published byte for byte whatever the request's layout (a warp
        artifact's own side tables, ``--from``: the same bytes wherever the artifact was read from)."""
        if not files:
            raise MissingInputError(f"table {name} has no files", hint="--table NAME=GLOB must match Parquet/CSV/JSONL files")
        self.table_files[name] = list(files)
        # stat-cache hits first, in this thread: an unchanged re-publish then starts no threads
        rows = _parquet_rows(files) if self.req.layout == "paged" and not as_is else 0
        self.page_rows[name] = 0 if as_is else page_rows_for(rows)
        infos = [self._table_file(f, cached_only=True, page_rows=self.page_rows[name]) for f in files]
        todo = [i for i, info in enumerate(infos) if info is None]
        if todo:
            with ThreadPoolExecutor(max_workers=max(1, min(self.req.workers, len(todo)))) as ex:
                read = functools.partial(self._table_file, page_rows=self.page_rows[name])
                for i, info in zip(todo, ex.map(read, [files[i] for i in todo]), strict=True):
                    infos[i] = info
        schema = infos[0]["schema"]
        for f, info in zip(files, infos, strict=True):
            if info["schema"] != schema:
                raise DataError(
                    f"table {name}: {f} has columns {_cols(info['schema'])}, but {files[0]} has {_cols(schema)}",
                    hint="all files of one table must share one schema")
        shards = []
        for i, info in enumerate(infos):
            shards.append(ShardRef(info["hash"], info["byte_size"], row_count=info["row_count"], stats=info["stats"]))
            self._add(_Blob(info["hash"], info["byte_size"], f"table {name} shard {i}", info.get("path"),
                            info.get("materialize")))
        # the first file's exact Arrow schema (format 4, docs/formats/registry.md): readers answer
        # schema() and `warp info/schema` from the manifest alone; its schema-level metadata is the
        # first file's, which is what reading the first shard's footer gave
        return Table(shards=tuple(shards), schema={"fields": schema, "arrow": infos[0]["arrow"]})

    def _table_file(self, path: str, cached_only: bool = False, page_rows: int = 0) -> dict[str, Any] | None:
        """Hash (or convert, or rewrite with a page index, and hash) one table file; with ``cached_only``,
        None unless the stat cache knows it. ``page_rows``: rows per page of a rewrite; 0, a Parquet
        file as it is (:meth:`table`'s ``as_is``)."""
        suffix = Path(path).suffix.lower()
        fmt = TABLE_SUFFIXES.get(suffix)
        if fmt is None:
            raise DataError(f"{path}: unsupported table file type {suffix or '(none)'}",
                            hint="tables take .parquet, .csv or .jsonl files")
        scanned_at = time.time_ns()
        fingerprint, ctime = _file_fingerprint(path)
        # the written layout is part of the key: a cached hash of another layout is not this file's
        as_is = fmt == "parquet" and (self.req.layout != "paged" or not page_rows)
        page_rows = page_rows or PAGE_ROWS
        layout = () if as_is else (f"pages={page_rows}",)
        key = self.cache.key("table", fmt, FACTS_VERSION, *layout, fingerprint)
        fresh = {"newest_ctime_ns": ctime, "scanned_at_ns": scanned_at}
        staged = os.path.abspath(path).startswith(str(self.stage.resolve()))
        hit = None if staged else self.cache.get(key)
        if hit is None and cached_only:
            return None
        paged = fmt == "parquet" and not as_is and not staged
        if paged:  # rewritten unless it has a page index already
            paged = hit is not None and hit.get("paged") or hit is None and not _has_page_index(path)
        if fmt == "parquet" and not paged:
            if hit is None:
                hit = {"hash": sha256_file(path), "byte_size": os.path.getsize(path), **_parquet_facts(path)}
                if not staged:
                    self.cache.put(key, hit, **fresh)
            return {**hit, "path": path}
        out = self.stage / f"{uuid.uuid4().hex}.parquet"

        def convert() -> dict[str, Any]:
            if fmt == "parquet":
                _page_parquet(path, out, page_rows)
            else:
                _convert_to_parquet(path, fmt, out)
            got = {"hash": sha256_file(out), "byte_size": out.stat().st_size, **_parquet_facts(str(out))}
            return {**got, "paged": True} if fmt == "parquet" else got

        if hit is None:
            hit = convert()
            self.cache.put(key, hit, **fresh)
            return {**hit, "path": str(out)}
        expected = hit["hash"]

        def rematerialize() -> None:
            again = convert()
            if again["hash"] != expected:
                raise DataError(f"{path} changed while publishing (its Parquet conversion no longer hashes the same)",
                                hint="rerun the publish")
            self.blobs[expected].path = str(out)

        return {**hit, "path": None, "materialize": rematerialize}

    # artifacts --------------------------------------------------------------
    def artifact(self, name: str, root: str, files: list[str] | None = None) -> Artifact:
        scanned_at = time.time_ns()
        if files is None and os.path.isdir(root):  # no file link may pull in a file from outside the folder

            check_symlinks(root, follow_symlinks=self.req.follow_symlinks, dir_links_skipped=True)
        scan = scan_members(root, files, follow_symlinks=self.req.follow_symlinks)
        members = scan.members
        self.skipped_links[name] = scan.skipped_dir_links
        if not members:
            raise MissingInputError(f"artifact {name}: {root} holds no files" + (
                f" (symlinked directories not followed: {', '.join(scan.skipped_dir_links[:3])})"
                if scan.skipped_dir_links else ""), hint="pass --follow-symlinks to publish what they link to"
                if scan.skipped_dir_links else "--artifact NAME=DIR needs files to publish")
        # members are published under their NFC names (docs/formats/registry.md), so bindings are checked so
        named = nfc_members(members)
        self.members[name] = [m[0] for m in named]
        # the packing rule is part of the key: a cached result of an older rule would not re-pack the same
        # (names that NFC changes were packed as they were before the rule; other keys stay as they were)
        renamed = ("names=nfc",) if any(member_name(m[0]) != m[0] for m in members) else ()
        chunking = (f"chunks={self.req.chunk_target}:twh1,wfs1",) if self.req.chunk_target else ()
        key = self.cache.key("artifact", self.req.shard_size, f"alone={DEFAULT_ALONE_SIZE}", *renamed, *chunking,
                             scan.fingerprint)
        out = self.stage / f"artifact-{name}"

        def pack() -> dict[str, Any]:
            res = pack_files(members, out, self.req.shard_size)
            idx_path = out / f"{res.index_hash}.index.json"
            idx_path.write_bytes(res.index)
            shards = [{"hash": s.hash, "byte_size": s.byte_size, "member_count": s.member_count,
                       "path": s.path} for s in res.shards]
            if self.req.chunk_target:
                _chunk_shards(shards, res.index, self.req.chunk_target)
            return {"shards": shards,
                    "index": {"hash": res.index_hash, "byte_size": len(res.index), "path": str(idx_path)},
                    "member_count": res.member_count}

        hit = self.cache.get(key)
        if hit is None:
            hit = pack()
            self.cache.put(key, {**hit, "shards": [{k: v for k, v in s.items() if k != "path"} for s in hit["shards"]],
                                 "index": {k: v for k, v in hit["index"].items() if k != "path"}},
                           newest_ctime_ns=scan.newest_change_ns, scanned_at_ns=scanned_at)
        expected = [s["hash"] for s in hit["shards"]] + [hit["index"]["hash"]]

        def rematerialize() -> None:
            again = pack()
            got = [s["hash"] for s in again["shards"]] + [again["index"]["hash"]]
            if got != expected:
                raise DataError(f"artifact {name}: {root} changed while publishing", hint="rerun the publish")
            paths = {s["hash"]: s["path"] for s in again["shards"]}
            for s in [*again["shards"], again["index"]]:
                if s["hash"] in self.chunked:
                    self.chunked[s["hash"]].path = s["path"]
                else:
                    self.blobs[s["hash"]].path = s["path"]
            for b in self.blobs.values():  # a chunk's offset is into its own shard's file
                if b.owner in paths:
                    b.path = paths[b.owner]

        shards = []
        for i, s in enumerate(hit["shards"]):
            chunks = tuple((h, n) for h, n in s["chunks"]) if s.get("chunks") else None
            shards.append(ShardRef(s["hash"], s["byte_size"], member_count=s["member_count"], chunks=chunks))
            if chunks is None:
                self._add(_Blob(s["hash"], s["byte_size"], f"artifact {name} shard {i}", s.get("path"),
                                rematerialize))
                continue
            self.chunked[s["hash"]] = _Blob(s["hash"], s["byte_size"], f"artifact {name} shard {i}", s.get("path"),
                                            rematerialize)
            off = 0
            for j, (h, n) in enumerate(chunks):
                self._add(_Blob(h, n, f"artifact {name} shard {i} chunk {j}", s.get("path"), rematerialize, off,
                                s["hash"]))
                off += n
        idx = hit["index"]
        self._add(_Blob(idx["hash"], idx["byte_size"], f"artifact {name} index", idx.get("path"), rematerialize))
        return Artifact(shards=tuple(shards), index=ShardRef(idx["hash"], idx["byte_size"], format=INDEX_FORMAT),
                        member_count=hit["member_count"])


def _chunk_shards(shards: list[dict[str, Any]], index: bytes, target: int) -> None:
    """Give each tar shard that holds one TWH1 or WFS1 file its ``chunks``: runs of whole samples
    (:mod:`warpdata.registry.chunks`), hashed from the staged shard."""
    doc = load_json(index, "member index")
    alone: dict[int, tuple[int, int]] = {}
    for number, off, length in doc["members"].values():
        alone[number] = (off, length) if number not in alone else (-1, -1)
    for number, s in enumerate(shards):
        off, length = alone.get(number, (-1, -1))
        if s["member_count"] != 1 or off < 0:
            continue
        with open(s["path"], "rb", buffering=0) as f:
            head = os.pread(f.fileno(), 80, off)
        chunks = member_chunks(s["path"], head, off, length, s["byte_size"], target)
        if chunks is not None:
            s["chunks"] = [list(c) for c in chunks]


def _cols(schema: list[dict]) -> str:
    return "(" + ", ".join(f"{f['name']}: {f['type']}" for f in schema) + ")"


def _parquet_facts(path: str) -> dict[str, Any]:
    """Row count, schema and the manifest's shard stats (footer length, column min/max), from the footer."""
    import pyarrow.parquet as pq

    try:
        md = pq.read_metadata(path)
        sch = md.schema.to_arrow_schema()
        footer = footer_size_of(path)
    except Exception as e:
        raise DataError(f"{path}: not a readable Parquet file: {e}",
                        hint="check the file; CSV/JSONL inputs need a .csv/.jsonl suffix") from None
    fields = [{"name": f.name, "type": str(f.type), "nullable": bool(f.nullable)} for f in sch]
    stats = shard_stats(md, footer)
    # the footer and the pages' locations ride in the manifest: a reader's first data request
    # follows it (docs/formats/registry.md, "Page index in the manifest")
    # Every node reads the manifest, so an index costs its bytes once per node: only where it is at
    # most PAGE_INDEX_SHARE of the shard (a shard of a few pages is cheaper read by its footer)
    index = parquet_index.of_file(path)
    if index is not None and len(index) <= PAGE_INDEX_SHARE * os.path.getsize(path):
        stats["page_index"] = index
    return {"row_count": int(md.num_rows), "schema": fields, "arrow": encode_arrow_schema(sch), "stats": stats}


#: a shard's page index goes into the manifest when it is at most this share of the shard's bytes
#: (docs/formats/registry.md, "Page index in the manifest")
PAGE_INDEX_SHARE = 0.001
#: rows per data page of the Parquet files publish writes (docs/partitioning.md, "Reads aligned
#: with storage"): a reader of some rows of a row group fetches the pages holding them, so a
#: rank's share costs its rows plus at most a page per column at each end. A table's own count
#: is :func:`page_rows_for` its rows; this one where the rows are not known (CSV, JSONL)
PAGE_ROWS = 512
PAGE_ROWS_MIN, PAGE_ROWS_MAX = 256, 8192
PAGE_SPLITS = 3200  # pages of at most rows / PAGE_SPLITS rows: 64 ranks share ≤ 2 % of the table
#: rows per row group of a rewritten file at most: the offset index a partial read fetches first
#: grows with the pages of a row group
GROUP_ROWS_MAX = 65536
#: a column's dictionary page stops growing here (the column goes on in plain encoding): every
#: partial read of a column chunk fetches its dictionary page whole
DICT_PAGE_BYTES = 16 << 10


def page_rows_for(rows: int) -> int:
    """Rows per page for a table of ``rows`` rows: the power of two nearest below ``rows`` /
    :data:`PAGE_SPLITS`, within :data:`PAGE_ROWS_MIN` .. :data:`PAGE_ROWS_MAX` (:data:`PAGE_ROWS`
    when the count is not known). A rank's boundary with its neighbour costs at most a page of
    each column, so with 64 ranks the pages they share stay near 2 % of the table."""
    if rows <= 0:
        return PAGE_ROWS
    r = PAGE_ROWS_MIN
    while r * 2 <= min(PAGE_ROWS_MAX, rows // PAGE_SPLITS):
        r *= 2
    return r


def _parquet_rows(files: list[str]) -> int:
    """Rows of the Parquet files among ``files``, from their footers (0 where one will not read:
    the file's own check names it)."""
    import pyarrow.parquet as pq

    total = 0
    for f in files:
        if TABLE_SUFFIXES.get(Path(f).suffix.lower()) == "parquet":
            try:
                total += pq.read_metadata(f).num_rows
            except (OSError, ValueError):  # unreadable or not Parquet: its own check names it
                return 0
    return total


def _parquet_write_options(sample, page_rows: int = PAGE_ROWS) -> dict[str, Any]:
    """The writer options of a paged file; ``sample``: its first row group, which picks the columns
    written with a dictionary (:func:`_dictionary_columns`)."""
    return {"write_page_index": True, "max_rows_per_page": page_rows, "dictionary_pagesize_limit": DICT_PAGE_BYTES,
            "use_dictionary": _dictionary_columns(sample)}


def _dictionary_columns(sample) -> list[str]:
    """Top-level columns of ``sample`` (an Arrow table) whose values a small dictionary holds: flat
    strings, binaries and integers with few distinct values, and dictionary-typed columns. Every
    partial read of a column chunk fetches its dictionary page, so a column of mostly distinct
    values (ids, floats, free text) is written plain instead."""
    import pyarrow as pa
    import pyarrow.compute as pc

    out = []
    for f, col in zip(sample.schema, sample.columns, strict=True):
        t = f.type
        if pa.types.is_dictionary(t):
            out.append(f.name)
            continue
        if not (pa.types.is_integer(t) or pa.types.is_string(t) or pa.types.is_large_string(t)
                or pa.types.is_binary(t) or pa.types.is_large_binary(t)) or not len(col):
            continue
        distinct = pc.count_distinct(col).as_py()
        per_value = col.nbytes / len(col)
        if distinct * per_value <= DICT_PAGE_BYTES // 2 and distinct * 4 <= len(col):
            out.append(f.name)
    return out


def _has_page_index(path: str) -> bool:
    """Whether every column chunk of a Parquet file has an offset index (its pages can be read alone)."""
    import pyarrow.parquet as pq

    try:
        md = pq.read_metadata(path)
    except (OSError, ValueError) as e:  # pyarrow: ArrowInvalid is a ValueError, a bad footer an OSError
        if isinstance(e, OSError) and e.errno:  # the operating system's error: the CLI names it
            raise
        raise DataError(f"{path}: not a readable Parquet file: {e}",
                        hint="check the file; CSV/JSONL inputs need a .csv/.jsonl suffix") from None
    return all(md.row_group(g).column(c).has_offset_index
               for g in range(md.num_row_groups) for c in range(md.num_columns))


def _page_parquet(src: str, out: Path, page_rows: int = PAGE_ROWS) -> None:
    """``src`` rewritten with a page index and pages of ``page_rows`` rows, row group by row group
    (at most :data:`GROUP_ROWS_MAX` rows each), the same schema, metadata and compression codec:
    the same rows in the same order, deterministic bytes. A file that does not read is a
    DataError naming it; an error writing the copy is the operating system's."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    def unreadable(e: Exception) -> DataError:
        return DataError(f"{src}: not a readable Parquet file: {e}",
                         hint="check the file, or publish it as it is with --keep-layout")

    def read(fn):
        try:
            return fn()
        except (OSError, ValueError, TypeError, pa.ArrowException) as e:  # pyarrow's errors
            if isinstance(e, OSError) and e.errno:  # the operating system's: the CLI names the path
                raise
            raise unreadable(e) from None

    pf = read(lambda: pq.ParquetFile(src))
    md = pf.metadata
    codec = md.row_group(0).column(0).compression.lower() if md.num_row_groups and md.num_columns else "zstd"
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    first = read(lambda: pf.read_row_group(0)) if md.num_row_groups else pf.schema_arrow.empty_table()
    with pq.ParquetWriter(tmp, pf.schema_arrow, compression="none" if codec == "uncompressed" else codec,
                          **_parquet_write_options(first, page_rows)) as w:
        for g in range(md.num_row_groups):
            t = first if g == 0 else read(lambda g=g: pf.read_row_group(g))
            for at in range(0, t.num_rows, GROUP_ROWS_MAX):
                w.write_table(t.slice(at, GROUP_ROWS_MAX), row_group_size=GROUP_ROWS_MAX)
    os.replace(tmp, out)


def _convert_to_parquet(src: str, fmt: str, out: Path) -> None:
    import pyarrow.parquet as pq

    try:
        if fmt == "csv":
            import pyarrow.csv as pacsv

            table = pacsv.read_csv(src)
        else:
            import pyarrow.json as pajson

            table = pajson.read_json(src)
    except Exception as e:
        raise DataError(f"{src}: cannot be read as {fmt.upper()}: {e}",
                        hint="fix the file, or convert it to Parquet yourself") from None
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    pq.write_table(table, tmp, compression="zstd", row_group_size=GROUP_ROWS_MAX,
                   **_parquet_write_options(table.slice(0, GROUP_ROWS_MAX)))
    os.replace(tmp, out)


# -- the transaction -----------------------------------------------------------

def _staging_dir() -> Path:
    base = Path(envvars.default_cache_dir()) / "publish" / "staging"
    base.mkdir(parents=True, exist_ok=True)
    host = socket.gethostname()
    for d in base.iterdir():  # sweep staging dirs of publishes that were killed
        parts = d.name.split("@")
        if len(parts) == 3 and parts[1] == host:
            try:
                os.kill(int(parts[0]), 0)
            except ProcessLookupError:
                shutil.rmtree(d, ignore_errors=True)
            except (PermissionError, ValueError):
                pass
    d = base / f"{os.getpid()}@{host}@{uuid.uuid4().hex[:8]}"
    d.mkdir()
    return d


def build(req: PublishRequest, stager: _Stager) -> Manifest:
    """Stage every input and return the version's manifest."""
    tables: dict[str, Table] = {}
    artifacts: dict[str, Artifact] = {}
    bindings = list(req.bindings)
    sources: list[dict[str, Any]] = []
    for name, patterns in req.tables.items():
        tables[name] = stager.table(name, expand_globs(name, patterns))
    for name, directory in req.artifacts.items():
        if name in artifacts:
            raise UsageError(f"artifact {name} given twice", hint="give each --artifact a distinct name")
        artifacts[name] = stager.artifact(name, directory, req.artifact_files.get(name))
    for n, path in enumerate(req.from_paths):
        if is_url(path):
            # a feature cache built on object storage (docs/features-config.md, "Output on object
            # storage"): its shards come through the blob cache, hard-linked into the staging area

            local = stager.stage / f"from-{n}"
            stage_version(path, local)
            path = str(local)
        src = from_artifacts.describe_source(path)
        aname = from_artifacts.artifact_name(src.kind, set(tables) | set(artifacts))
        artifacts[aname] = stager.artifact(aname, src.artifact_root, src.members)

        def free(name: str, aname: str = aname) -> str:
            # a name already taken (by --table or an earlier --from) gets the artifact as prefix
            return name if name not in tables and name not in artifacts else f"{aname}_{name}"

        listing = stager.stage / f"{aname}-files.parquet"
        from_artifacts.write_listing(
            [(m, os.path.getsize(os.path.join(src.artifact_root, m))) for m in src.members], listing)
        files_table = free("files")
        tables[files_table] = stager.table(files_table, [str(listing)], as_is=True)
        bindings.append(Binding(files_table, "path", aname, "file"))
        made = [files_table]
        for stem, path_ in src.tables.items():
            tname = free(stem)
            if tname in tables:
                raise UsageError(f"--from {path}: table {tname!r} would be published twice",
                                 hint="publish the sources separately, or rename one of the Parquet files")
            tables[tname] = stager.table(tname, [path_], as_is=True)
            made.append(tname)
        sources.append({"artifact": aname, **src.source_facts, "tables": sorted(made)})
    if not tables and not artifacts:
        raise UsageError("nothing to publish", hint="give --table NAME=GLOB, --artifact NAME=DIR or --from PATH")
    check_binding_names(bindings, {n: list(t.columns) for n, t in tables.items()}, artifacts, "published")
    dangling = _check_bindings(req, stager)
    # microseconds: two versions published within a second still order (warp ls --versions, docs/lineage.md)
    metadata: dict[str, Any] = {"created_at": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
                                "warp_version": __version__}
    if dangling:
        metadata["dangling_refs"] = dangling
    if sources:
        metadata["sources"] = sources
        primary = [t for t in from_artifacts.PRIMARY_TABLES if t in tables]
        if "main" not in tables and len(tables) > 1 and primary:
            metadata["default_table"] = primary[0]
    if req.description:
        metadata["description"] = req.description
    if req.card is not None:
        if len(req.card.encode("utf-8")) > CARD_MAX_BYTES:
            raise UsageError(f"--card: the card is {len(req.card.encode('utf-8')):,} bytes, over the "
                             f"{CARD_MAX_BYTES:,} a manifest's envelope holds",
                             hint="shorten the card; large tables belong in the dataset, not its card")
        try:  # a stored card is never rewritten: broken markers would fail every later 'warp card'
            merge(req.card, {}, req.dataset_id)
        except UsageError as e:
            raise UsageError(f"--card: {e.message.removeprefix('card: ')}", hint="fix the card's markers before publishing: "
                             "the card stored with a version cannot be edited later") from None
        metadata["card"] = req.card
    return Manifest(validate_dataset_id(req.dataset_id), tables=tables, artifacts=artifacts,
                    bindings=tuple(bindings), metadata=metadata)


def _check_bindings(req: PublishRequest, stager: _Stager) -> dict[str, int]:
    """Every value of a --bind column must name a member (docs/formats/registry.md, Binding)."""
    checks, artifact_of = [], {}
    for b in req.bindings:  # bindings made by --from list the members themselves
        key = f"{b.table}.{b.column}={b.artifact}"
        artifact_of[key] = b.artifact
        checks.append(check_binding(key, stager.table_files[b.table], b.column, stager.members[b.artifact],
                                    nfc=True))
    return check_bindings(checks, stager.members, artifact_of, allow_dangling=req.allow_dangling,
                          skipped_links=stager.skipped_links)


def publish(req: PublishRequest, *, store: Store | None = None,
            on_upload: Callable[[int], None] | None = None, gc_wait: float | None = None) -> PublishResult:
    """Run the publish transaction (see the module docstring); returns what happened. ``gc_wait``:
    seconds to wait for a ``warp gc`` sweep that overlapped this publish, then exit 75 (default
    :data:`warpdata.registry.gc.WAIT_S`)."""

    t0 = time.perf_counter()
    validate_dataset_id(req.dataset_id)
    upload_concurrency()  # a bad WARP_UPLOAD_CONCURRENCY fails before any staging
    store = store or Store(req.store_url)
    if not req.dry_run:
        store.require_writable("publish")  # before staging: an HTTP store takes no writes
    keys = [signing.load_signing_key(k) for k in req.sign_keys]  # a bad key fails before staging
    stage = _staging_dir()
    try:
        stager = _Stager(req, stage)
        manifest = build(req, stager)
        if keys:
            manifest = signing.sign(manifest, keys)
        version = manifest.version_hash
        planned = [PlannedBlob(b.hash, b.byte_size, b.role) for b in stager.blobs.values()]
        result = PublishResult(req.dataset_id, version, store.url, req.dry_run, planned,
                               stat_cache_hits=stager.cache.hits,
                               dangling_refs=dict(manifest.metadata.get("dangling_refs", {})))
        before = store.read_latest(req.dataset_id)
        checked_at: float | None = None
        result.latest = before.version_hash if before else None
        if result.latest == version:
            # latest only ever names a version whose manifest was written, and a manifest is
            # written only after all its blobs: nothing to validate, check or send
            result.already_published = True
            missing: set[str] = set()
        else:
            manifest.to_bytes()  # validate before touching the store
            # a gc sweep running since may delete blobs found here (or named by a stored manifest whose
            # publish gave up waiting for one): gc.after_manifest below
            checked_at = time.time()
            result.already_published = store.has_manifest(req.dataset_id, version)
            missing = set() if result.already_published else set(store.missing_blobs([b.hash for b in planned]))
        for b in planned:
            b.upload = b.hash in missing
        if req.dry_run:
            result.seconds = time.perf_counter() - t0
            return result
        _upload(store, [stager.blobs[b.hash] for b in planned if b.upload], req.workers, result, on_upload)
        if not result.already_published:
            result.manifest_written = store.put_manifest(manifest)
        if checked_at is not None:
            # a gc sweep overlapping the existence check may have deleted blobs found present (or just
            # uploaded): wait for it, check them all again, upload what is gone, all before latest moves
            # (docs/formats/registry.md, "Garbage collection")
            def reupload(gone: list[str]) -> None:
                _upload(store, [stager.blobs[h] for h in gone], req.workers, result, on_upload)

            result.blobs_reuploaded = gc.after_manifest(store, checked_at, [b.hash for b in planned], reupload,
                                                        timeout=gc.WAIT_S if gc_wait is None else gc_wait)
        if req.card is not None:
            result.card_stored = result.manifest_written
        if keys:
            result.signed_by = [k.key_id for k in keys]
            result.signatures_stored = result.manifest_written
        if req.set_latest and result.latest != version:
            # one conditional write against the pointer read above; if another publisher moved
            # it meanwhile, set_latest re-reads and retries (the manifest is known to be there)
            ptr = (store.cas_latest(req.dataset_id, version, before)
                   or store.set_latest(req.dataset_id, version, check_manifest=False))
            result.latest = ptr.version_hash
            result.latest_moved = True
        if req.link_cache and store.location.protocol != "file":
            result.cache_linked = _link_into_cache([*stager.blobs.values(), *stager.chunked.values()])
        result.seconds = time.perf_counter() - t0
        return result
    finally:
        shutil.rmtree(stage, ignore_errors=True)


def _link_into_cache(blobs) -> int:
    """Hard-link the published blobs that exist as local files into the blob cache.

    The publisher then reads its own dataset from its originals (and the packed shards) instead
    of downloading them again; each link is hashed before the cache trusts it. Blobs on another
    filesystem than the cache are left to be downloaded as usual. Returns how many were linked.
    """
    try:
        cache = BlobCache()
    except Exception:  # no usable cache (a read-only home, a bad WARP_CACHE_SIZE_GB): reads download
        return 0
    n = 0
    for b in blobs:
        if b.offset is None and b.path and os.path.isfile(b.path):
            try:
                n += cache.adopt(b.hash, b.path) is not None
            except Exception as e:  # an optimisation: the publish itself has succeeded
                log.debug("not linking %s into the cache: %s", b.path, e)
    return n


def _upload(store: Store, blobs: list[_Blob], workers: int, result: PublishResult,
            on_upload: Callable[[int], None] | None) -> None:
    for b in blobs:  # re-create staged files the stat cache let us skip
        if b.path is None and b.materialize is not None:
            b.materialize()
    for b in blobs:
        if b.path is None:
            raise DataError(f"{b.role}: staged bytes for blob {b.hash} are gone", hint="rerun the publish with --rehash")

    concurrency = upload_concurrency()

    def one(b: _Blob) -> tuple[bool, int]:
        if b.offset is not None:  # a chunk of a staged tar shard: checked against its hash as it goes
            with open(b.path, "rb", buffering=0) as f:  # type: ignore[arg-type]
                data = os.pread(f.fileno(), b.byte_size, b.offset)
            wrote = store.put_blob(b.hash, data)
            if on_upload:
                on_upload(b.byte_size)
            return wrote, b.byte_size
        if b.byte_size >= MULTIPART_MIN and _s3_backend(store) is not None:
            # the progress bar advances part by part
            wrote = store.call(_put_multipart, store.url_of(blob_key(b.hash)), "write", store, b.hash,
                                b.path, b.byte_size, concurrency, on_upload)
            return wrote, b.byte_size
        wrote = store.put_blob_file(b.hash, b.path)  # type: ignore[arg-type]
        if on_upload:
            on_upload(b.byte_size)
        return wrote, b.byte_size

    # large blobs first so the tail of the upload is not one big file alone
    ordered = sorted(blobs, key=lambda b: -b.byte_size)
    with ThreadPoolExecutor(max_workers=max(1, min(workers, len(ordered) or 1))) as ex:
        for wrote, size in ex.map(one, ordered):
            if wrote:
                result.blobs_uploaded += 1
                result.bytes_uploaded += size


# -- library API ---------------------------------------------------------------

class DatasetBuilder:
    """The builder API over :func:`publish`::

        b = DatasetBuilder("ws/name")
        b.add_table("main", ["data/part-0.parquet"])
        b.add_artifact("raw_images", "images/")
        b.bind("main", "image", "raw_images", "image")
        result = b.publish(set_latest=True)
    """

    def __init__(self, dataset_id: str, *, store: Store | str | None = None) -> None:
        self.request = PublishRequest(validate_dataset_id(dataset_id))
        self.store = store if isinstance(store, Store) else Store(store) if store is not None else None

    def add_table(self, name: str, files: str | Iterable[str]) -> DatasetBuilder:
        self.request.tables.setdefault(name, []).extend([files] if isinstance(files, str) else list(map(str, files)))
        return self

    def add_artifact(self, name: str, directory: str | os.PathLike, kind: str = "tar_shards",
                     files: Iterable[str] | None = None) -> DatasetBuilder:
        """Pack ``directory`` as artifact ``name``: every regular file, or only ``files``
        (paths relative to it)."""
        if kind != "tar_shards":
            raise UsageError(f"artifact kind {kind!r} is not supported", hint="use kind='tar_shards'")
        self.request.artifacts[name] = os.fspath(directory)
        if files is not None:
            self.request.artifact_files[name] = list(files)
        return self

    def add_from(self, path: str | os.PathLike) -> DatasetBuilder:
        self.request.from_paths.append(os.fspath(path))
        return self

    def bind(self, table: str, column: str, artifact: str, ref_type: str = "file") -> DatasetBuilder:
        self.request.bindings.append(Binding(table, column, artifact, ref_type))
        return self

    def publish(self, *, set_latest: bool = True, dry_run: bool = False) -> PublishResult:
        self.request.set_latest = set_latest
        self.request.dry_run = dry_run
        return publish(self.request, store=self.store)
