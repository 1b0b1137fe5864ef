"""Remote-first read API: ``warpdata.dataset("ws/name")`` and its tables.

Contract
--------
* :func:`dataset` resolves ``latest`` (one small GET of ``latest.json``) or a
  pinned version hash, and loads the manifest, which is cached by
  ``(dataset, version hash)`` and verified against its hash: the manifest lists
  every shard, so nothing is ever listed on the read path. When the store
  cannot be reached, the last ``latest`` seen in that same store is used with a
  warning; never one seen in another store.
* Modes (``mode=`` or ``WARP_MODE``):

  ======== ==========================================================
  auto     read remotely by ranges; shards already in the blob cache
           are read locally; the next shards are prefetched into the
           cache in the background (never before the first batch)
  remote   read remotely only; no data shard is written locally (the
           small metadata, manifest and member index, is kept in the
           blob cache so DataLoader workers share one fetch per node)
  hybrid   like auto with a deeper prefetch window
  local    offline: manifest and blobs from the cache only; anything
           missing fails fast with the command that would fetch it
  ======== ==========================================================

* :class:`Table` reads Parquet shards by ranged reads only: ``schema()`` comes
  from the manifest (format 4; older versions: the first footer), ``head(n)``
  fetches a footer and the row groups its rows are in, never whole shards;
  ``filter(sql)`` runs in DuckDB with projection and predicate pushdown;
  ``batches()`` yields Arrow RecordBatches planned by
  :mod:`warpdata.partition.plan` (rank × DataLoader worker, equal batch counts,
  resumable). Columns bound to an artifact come back as typed refs
  (:mod:`warpdata.read.refs`) from ``batch_dicts()``.
* ``verify`` (the one vocabulary of :mod:`warpdata.core.verify`): every blob is
  hashed as it enters the blob cache, whatever the level. ``"fast"`` (default,
  or ``WARP_CACHE_VERIFY=stamp``) hashes a cached blob again whenever its file
  changed; ``"full"`` (``WARP_CACHE_VERIFY=full``) hashes each cached blob on its
  first use by every process; ``"off"`` uses cached blobs without a check.
  A shard read whole from the store (one GET) is hashed like a cached blob; other
  ranged reads are not (Parquet's own page checksums apply).
* S3 ranged reads are single GETs to presigned URLs over pooled keep-alive
  connections (no HEAD: the manifest gives every size), falling back to pyarrow's
  native S3 filesystem (behind a proxy, or without boto3), both built from the one
  :class:`~warpdata.storage.locations.StorageConfig` (timeouts, AWS SDK retries with
  jittered backoff); DuckDB gets the same settings through s3fs.
"""

from __future__ import annotations

import hashlib
import logging
import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from warpdata.core import envvars
from warpdata.core.errors import (
    BlobCorruptedError,
    ConfigError,
    DatasetNotFoundError,
    ManifestCorruptedError,
    MissingInputError,
    StoreBusyError,
    StoreUnavailableError,
    UsageError,
)
from warpdata.core.jsondoc import MAX_POINTER_BYTES, load_json
from warpdata.core.sizes import parse_size
from warpdata.core.verify import verify_level
from warpdata.read.base import MODES, DatasetBase
from warpdata.read.chunked import ChunkedFile, bad_chunk, write_chunks
from warpdata.read.registered import open_registered
from warpdata.read.source import WarmResult
from warpdata.registry.manifest import Manifest, blob_key, validate_dataset_id
from warpdata.registry.signing import require_trusted
from warpdata.registry.store import Store
from warpdata.storage.base import open_object_store
from warpdata.storage.blobcache import BlobCache, normalize_hash

if TYPE_CHECKING:
    from warpdata.read.refs import ArtifactReader
    from warpdata.registry.manifest import ShardRef

log = logging.getLogger(__name__)

__all__ = ["MODES", "Dataset", "dataset"]
# Manifests parsed and verified against their version hash in this process, by (store, dataset, version):
# a version is immutable, so a second open of it skips the schema check and the hash (~30-60 ms); the
# store is part of the key so what was seen through one store is never used for another
_MANIFESTS: dict[tuple[str, str, str], tuple[Manifest, bytes]] = {}
_MANIFESTS_MU = threading.Lock()


def dataset(name: str, mode: str | None = None, version: str | None = None, *,
            store: str | None = None, cache: BlobCache | None = None, verify: str | None = None) -> Dataset:
    """Open dataset ``name`` (``workspace/name``) for reading.

    A dataset registered in place (``warp register``) is found first, unless ``store`` names
    a store explicitly; otherwise the published dataset in ``store`` (default ``WARP_STORE``).
    ``verify``: ``"fast"`` (default), ``"full"`` or ``"off"`` (module docstring);
    a ``cache`` passed in keeps its own mode for ``fast`` and ``full``.
    """
    if store is None:
        reg = open_registered(name, mode, version)
        if reg is not None:
            return reg
    return Dataset(name, mode=mode, version=version, store=store, cache=cache, verify=verify)


_CACHE_MODE = {"fast": "stamp", "full": "full", "off": "stamp"}  # read-API level -> blob-cache mode


def pinned_versions() -> dict[str, str]:
    """``WARP_PIN`` as ``{dataset: version}``: ``WS/NAME@VERSION`` entries separated by commas
    (docs/partitioning.md, "Requests before the first batch"); a malformed entry is a ConfigError."""
    raw = envvars.get("WARP_PIN")
    out: dict[str, str] = {}
    for entry in (raw or "").split(","):
        entry = entry.strip()
        if not entry:
            continue
        name, sep, version = entry.rpartition("@")
        if not sep or "/" not in name or not version or len(version) > 64 or \
                not all(c in "0123456789abcdef" for c in version.lower()):
            raise ConfigError(f"WARP_PIN={raw!r}: {entry!r} is not WS/NAME@VERSION",
                              hint="e.g. WARP_PIN=vision/coco@7727cdf53cff (a version hash or its prefix; "
                                   "'warp info WS/NAME --json' prints it)")
        out[name] = version.lower()
    return out


class Dataset(DatasetBase):
    """One resolved version of a published dataset (the shared parts: :class:`~warpdata.read.base.DatasetBase`)."""

    def __init__(self, name: str, *, mode: str | None = None, version: str | None = None,
                 store: str | None = None, cache: BlobCache | None = None, verify: str | None = None) -> None:
        explicit = verify is not None
        # not given: WARP_CACHE_VERIFY's level (the blob cache itself refuses a bad value)
        self.verify = verify_level(verify, "dataset") if explicit else \
            ("full" if (envvars.get("WARP_CACHE_VERIFY") or "").lower() == "full" else "fast")
        self.id = validate_dataset_id(name)
        self.mode = (mode or envvars.get("WARP_MODE") or "auto").lower()
        if self.mode not in MODES:
            raise UsageError(f"unknown mode {self.mode!r}", hint="use auto, remote, hybrid or local")
        # one object per store URL: every read of this dataset (pointer, manifest, shards, a version
        # prefix's listing) goes through it, under one request policy and one set of counters
        self.store = open_object_store(store if store is not None else envvars.default_store())
        self.remote = self.store.remote
        self.cache = cache if cache is not None else (
            None if self.mode == "remote" else BlobCache(verify=_CACHE_MODE[self.verify] if explicit else None))
        # manifests and member indexes go through the blob cache in every mode, so DataLoader
        # workers (forked or spawned) and later opens on this node fetch them once
        self.meta_cache = self.cache if self.cache is not None else _meta_cache()
        if self.meta_cache is not None:  # objects of a host that ignores Range are kept there
            self.remote.blob_cache = self.meta_cache
        self.offline_fallback = False
        self.version, self.manifest = self._resolve(version)

    def __repr__(self) -> str:
        return f"Dataset({self.id!r}, version={self.version[:12]!r}, mode={self.mode!r})"

    # -- resolution -----------------------------------------------------------
    def _resolve(self, version: str | None) -> tuple[str, Manifest]:
        if version is None:
            version = pinned_versions().get(self.id)  # a launcher's pin: no rank reads `latest`
        if version not in (None, "latest"):
            vh = version.lower()
            if len(vh) != 64:
                if self.mode == "local":
                    raise UsageError(f"local mode needs a full version hash, not {version!r}",
                                     hint="omit version to use the last seen latest")
                vh = Store(objects=self.store).resolve_version(self.id, version)
            return vh, self._manifest(vh)
        if self.mode == "local":
            ptr = self.cache.get_pointer(self.id, store=self.remote.url) if self.cache else None
            if ptr is None:
                raise MissingInputError(f"{self.id} has never been read from {self.remote.url} on this machine: "
                                        "no cached version in "
                                        f"{self.cache.root if self.cache else 'the cache'}",
                                        hint=f"run 'warp warm {self.id}' while online, or use mode='auto'")
            return ptr["version"], self._manifest(ptr["version"])
        try:
            raw = self.remote.get(Store.latest_key(self.id))
        except (StoreUnavailableError, StoreBusyError) as e:  # unreachable, or throttling past the budget
            # only a version seen in this same store stands in: another store's may be another dataset
            ptr = self.cache.get_pointer(self.id, store=self.remote.url) if self.cache else None
            if ptr is None:
                raise
            self.offline_fallback = True
            log.warning(f"store unreachable ({e.message}); using the last known version "
                        f"{ptr['version'][:12]} of {self.id} seen in this store ({self.remote.url})")
            return ptr["version"], self._manifest(ptr["version"])
        if raw is None:
            # a local store is listed for close names; S3 and HTTP stores are not listed on the read path
            raise Store(objects=self.store).not_found(self.id) if self.remote.loc.protocol in ("file", "memory") else \
                DatasetNotFoundError(f"dataset {self.id} is not published in store {self.remote.url} "
                                     "(no latest pointer)",
                                     hint="check the spelling of workspace/name; 'warp ls ws/' lists datasets"
                                     if not self.remote.read_only else
                                     "check the spelling of workspace/name and the store URL (WARP_STORE)")
        vh = _parse_latest(raw, self.id, self.remote.url_of(Store.latest_key(self.id)))
        if self.cache is not None:
            etag = hashlib.sha256(raw).hexdigest()
            old = self.cache.get_pointer(self.id, store=self.remote.url)
            if old is None or old.get("etag") != etag:
                self.cache.put_pointer(self.id, vh, etag, store=self.remote.url)
        return vh, self._manifest(vh)

    def _manifest(self, vh: str) -> Manifest:
        m = self._manifest_loaded(vh)
        # WARP_TRUSTED_KEYS: refuse a version no trusted key signed (memoised per version by signing)
        require_trusted(m, self.remote.url_of(Store.manifest_key(self.id, vh)))
        return m

    def _manifest_loaded(self, vh: str) -> Manifest:
        memo = _MANIFESTS.get((self.remote.url, self.id, vh))
        if memo is not None:
            m, raw = memo
            if self.meta_cache is None or self.meta_cache.has_manifest(self.id, vh):
                return m
            if self.mode != "local":  # the memo is no cache: local mode reads its own cache only
                # this dataset's cache must hold it too: other processes (DataLoader workers) and
                # local mode look for it there later
                self._keep_manifest(vh, raw)
                return m
        m, raw = self._load_manifest(vh)
        with _MANIFESTS_MU:
            if len(_MANIFESTS) >= 64:
                _MANIFESTS.pop(next(iter(_MANIFESTS)))
            _MANIFESTS[(self.remote.url, self.id, vh)] = (m, raw)
        return m

    def _keep_manifest(self, vh: str, data: bytes) -> None:
        try:
            self.meta_cache.put_manifest(self.id, vh, data)  # type: ignore[union-attr]
        except OSError as e:  # a read-only cache directory costs a fetch per process, not the read
            if self.cache is not None:
                raise
            log.debug(f"manifest not cached ({e})")

    def _load_manifest(self, vh: str) -> tuple[Manifest, bytes]:
        key = Store.manifest_key(self.id, vh)
        src = self.remote.url_of(key)
        if self.meta_cache is not None:
            data = self.meta_cache.get_manifest(self.id, vh)

            if data is not None:
                try:
                    return Manifest.from_bytes(data, source=f"cached {src}", expected_hash=vh), data
                except Exception:
                    if self.mode == "local":
                        raise
                    log.warning(f"cached manifest of {self.id}@{vh[:12]} is corrupt; fetching it again")
        if self.mode == "local":
            raise MissingInputError(f"manifest {vh[:12]} of {self.id} is not in the cache (local mode)",
                                    hint=f"run 'warp warm {self.id}' while online")
        data = self.remote.get(key)
        if data is None:
            raise DatasetNotFoundError(f"version {vh} of {self.id} is not in store {self.remote.url}",
                                       hint="check the version hash; omit it to read latest")
        m = Manifest.from_bytes(data, source=src, expected_hash=vh)
        if self.meta_cache is not None:
            self._keep_manifest(vh, data)
        return m, data

    def fetch_meta(self, s: ShardRef) -> bytes:
        """A small metadata blob (a member index): through the blob cache in every mode, so the
        processes of one node fetch it once (``remote`` mode included; it caches no data shard)."""
        if self.cache is not None:
            with open(self.fetch_blob(s), "rb") as f:
                return f.read()
        key = self.blob_key(s)
        if self.meta_cache is not None:
            try:
                p = self.meta_cache.fetch(s.hash, lambda f: self.remote.copy_to(key, f, s.byte_size),
                                          size=s.byte_size, source=self.remote.url_of(key))
                with open(p, "rb") as f:
                    return f.read()
            except OSError as e:  # an unwritable cache: read it from the store, verified below
                log.debug(f"{key} not cached ({e})")
        data = self.remote.read_range(key, 0, s.byte_size, s.byte_size) if s.byte_size else b""
        if hashlib.sha256(data).hexdigest() != s.hash:
            raise BlobCorruptedError(f"{self.remote.url_of(key)}: does not hash to {s.hash}",
                                     hint="the store copy is damaged; republish the dataset")
        return data

    def reopen(self) -> tuple[Callable[..., Dataset], tuple]:
        """This version again in its store (a DataLoader worker opens it by id: nothing opened is pickled)."""
        return _reopen, (self.id, self.mode, self.version, self.remote.url, self.verify)

    def artifact(self, name: str) -> ArtifactReader:
        # a part's reader, on first use (read.base's docstring)
        from warpdata.read.refs import ArtifactReader

        return ArtifactReader(self, self.artifact_name(name))

    # -- blobs -------------------------------------------------------------------
    def blob_key(self, s: ShardRef) -> str:
        if "://" in s.uri:
            raise UsageError(f"{s.uri}: shards outside the store are not supported by this reader",
                             hint="republish the dataset so its blobs live in the store")
        return s.uri or blob_key(s.hash)

    def cached_path(self, s: ShardRef) -> str | None:
        """The verified local copy of a blob, if this mode may use the cache and has it."""
        if self.cache is None:
            return None
        had = self.cache.has(s.hash)
        p = self.cache.get(s.hash, verify=self.verify != "off")
        if p is None and had and self.mode != "local":
            # the cached copy failed its hash and was evicted: fetch it again once, as 'warp warm' does
            # (a bad store copy raises BlobCorruptError naming the object; docs/formats/registry.md)
            return self.fetch_blob(s)
        return None if p is None else str(p)

    def fetch_blob(self, s: ShardRef) -> str:
        """Download a blob into the cache (once, verified) and return its local path."""
        if self.cache is None:
            raise UsageError("remote mode keeps nothing locally", hint="use mode='auto' to cache blobs")
        if self.mode == "local":
            p = self.cached_path(s)
            if p is None:
                raise MissingInputError(f"blob {s.hash[:12]} of {self.id} is not in the cache (local mode)",
                                        hint=f"run 'warp warm {self.id}' while online")
            return p
        key = self.blob_key(s)
        if s.chunks:  # stored as chunks: assembled in order, the whole shard's SHA-256 checked as it lands
            try:
                return str(self.cache.fetch(s.hash, lambda f: write_chunks(self.remote, s, f), size=s.byte_size,
                                            source=f"the {len(s.chunks)} chunks of shard {s.hash}"))
            except BlobCorruptedError as e:  # name the damaged store object (read again: failures only)
                raise bad_chunk(self.remote, s) or e from None
        return str(self.cache.fetch(s.hash, lambda f: self.remote.copy_to(key, f, s.byte_size),
                                    size=s.byte_size, source=self.remote.url_of(key)))

    def open_remote(self, s: ShardRef):
        """Ranged reads of a blob in the store: the object itself, or a chunked shard's chunks."""
        if s.chunks:
            return ChunkedFile(self.remote, s)
        return self.remote.open(self.blob_key(s), s.byte_size)

    def open_blob(self, s: ShardRef):
        """A random-access file over a blob: the cached copy if any, else ranged remote reads."""
        import pyarrow as pa  # heavy: on use only (opening a dataset loads no pyarrow, tests/read/test_open_imports.py)

        p = self.cached_path(s)
        if p is not None:
            return pa.memory_map(p, "r")
        if self.mode == "local":
            raise MissingInputError(f"blob {s.hash[:12]} of {self.id} is not in the cache (local mode)",
                                    hint=f"run 'warp warm {self.id}' while online")
        return self.open_remote(s)

    def warm(self, tables: Sequence[str] | None = None, shards: slice | None = None,
             max_bytes: int | str | None = None, artifacts: Sequence[str] | bool = True,
             on_blob: Callable[[int], None] | None = None) -> WarmResult:
        """Download table shards (and artifact shards + indexes) into the blob cache.

        ``shards`` selects shard positions within each table (and artifact);
        ``max_bytes`` caps what is newly downloaded. Already-cached blobs cost
        one local hash check and no network.
        """
        if self.cache is None or self.mode == "local":
            raise UsageError(f"warm needs a cache and a store; mode {self.mode!r} has {'no cache' if self.cache is None else 'no store'}",
                             hint="use mode='auto'")
        budget = parse_size(max_bytes) if max_bytes is not None else None
        names = list(tables) if tables is not None else self.tables
        for t in names:
            self.table(t)
        blobs: list[ShardRef] = []
        for t in names:
            blobs += list(self.manifest.tables[t].shards)[shards or slice(None)]
        arts = self.artifacts if artifacts is True else ([] if artifacts is False else list(artifacts))
        for a in arts:
            art = self.manifest.artifacts[a]
            if art.index is not None:
                blobs.append(art.index)
            blobs += list(art.shards)[shards or slice(None)]
        res = WarmResult(self.id, self.version)
        seen = set()
        for s in blobs:
            if s.hash in seen:
                continue
            seen.add(s.hash)
            res.blobs += 1
            if self.cache.get(s.hash) is not None:
                res.cached += 1
                res.cached_bytes += s.byte_size
            elif budget is not None and res.fetched_bytes + s.byte_size > budget:
                res.skipped_over_budget += 1
            else:
                self.fetch_blob(s)
                res.fetched += 1
                res.fetched_bytes += s.byte_size
            if on_blob:
                on_blob(s.byte_size)
        return res


def _meta_cache() -> BlobCache | None:
    try:
        return BlobCache()
    except Exception as e:  # e.g. a bad WARP_CACHE_VERIFY: remote reads go on without it
        log.debug(f"no metadata cache ({e})")
        return None


def _reopen(name: str, mode: str, version: str, store: str, verify: str) -> Dataset:
    """:meth:`Dataset.reopen`'s function: the same version of ``name`` in ``store``."""
    return Dataset(name, mode=mode, version=version, store=store, verify=verify)


def _parse_latest(raw: bytes, dataset_id: str, src: str) -> str:
    try:
        doc = load_json(raw, src, max_bytes=MAX_POINTER_BYTES)
        vh = doc["version_hash"]
        if doc.get("dataset_id") != dataset_id:
            raise ValueError("dataset_id")
        return normalize_hash(vh)
    except (ValueError, KeyError, TypeError) as e:
        raise ManifestCorruptedError(f"{src} is not a valid latest pointer ({e})",
                                     hint=f"republish {dataset_id} with --set-latest to rewrite it") from None

