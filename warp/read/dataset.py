"""Remote-first read API: ``warpdata.dataset("ws/name")`` and its tables.

Contract
--------
* :func:`dataset` resolves ``latest`` (one small GET of ``latest.json``) or a
  pinned version hash, and loads the manifest, which is cached by
  ``(dataset, version hash)`` and verified against its hash: the manifest lists
  every shard, so nothing is ever listed on the read path. When the store
  cannot be reached, the last ``latest`` seen is used with a warning.
* Modes (``mode=`` or ``WARP_MODE``):

  ======== ==========================================================
  auto     read remotely by ranges; shards already in the blob cache
           are read locally; the next shards are prefetched into the
           cache in the background (never before the first batch)
  remote   read remotely only; nothing is written locally
  hybrid   like auto with a deeper prefetch window
  local    offline: manifest and blobs from the cache only; anything
           missing fails fast with the command that would fetch it
  ======== ==========================================================

* :class:`Table` reads Parquet shards by ranged reads only: ``schema()`` and
  ``head(n)`` fetch footers and the row groups they need, never whole shards;
  ``filter(sql)`` runs in DuckDB with projection and predicate pushdown;
  ``batches()`` yields Arrow RecordBatches planned by
  :mod:`warpdata.partition.plan` (rank × DataLoader worker, equal batch counts,
  resumable). Columns bound to an artifact come back as typed refs
  (:mod:`warpdata.read.refs`) from ``batch_dicts()``.
* S3 reads go through pyarrow's native S3 filesystem built from the one
  :class:`~warpdata.storage.locations.StorageConfig` (timeouts, AWS SDK retries with
  jittered backoff); DuckDB gets the same settings through s3fs.
"""

from __future__ import annotations

import json
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from warpdata.cli import output as out
from warpdata.core import envvars
from warpdata.core.errors import MissingInputError, UsageError
from warpdata.partition.plan import ResumeState, ShardingError, ShardPlan, auto_shard
from warpdata.storage.blobcache import BlobCache, CacheTooSmallError, normalize_hash

if TYPE_CHECKING:
    import pyarrow as pa
    from warpdata.registry.manifest import Manifest, ShardRef

MODES = ("auto", "remote", "hybrid", "local")
# Manifests parsed and verified against their version hash in this process, by (dataset, version):
# a version is immutable, so a second open of it skips the schema check and the hash (~30-60 ms)
_MANIFESTS: dict[tuple[str, str], Manifest] = {}
_MANIFESTS_MU = threading.Lock()
PREFETCH_DEPTH = {"auto": 2, "hybrid": 8, "remote": 0, "local": 0}
DEFAULT_BATCH = 65536
# stream read-ahead: row-group reads (up to 4 row groups of one shard each) in flight, and threads
# running them (each read's ranged GETs and decoding release the GIL)
ROWGROUP_AHEAD = 3
ROWGROUP_THREADS = 2


def dataset(name: str, mode: str | None = None, version: str | None = None, *,
            store: str | None = None, cache: BlobCache | None = None) -> Dataset:
    """Open published dataset ``name`` (``workspace/name``) for reading."""
    return Dataset(name, mode=mode, version=version, store=store, cache=cache)


class Remote:
    """Key reads against a store root, through pyarrow filesystems (ranged, no listing)."""

    def __init__(self, store_url: str | None = None) -> None:
        from pyarrow import fs as pafs
        from warpdata.storage.locations import StorageConfig, filesystem, parse_location

        self.loc = parse_location(store_url if store_url is not None else envvars.default_store())
        self.config = StorageConfig.from_env()
        if self.loc.protocol == "s3":
            self.fs = _pyarrow_s3(self.config)
        elif self.loc.protocol == "file":
            self.fs = pafs.LocalFileSystem()
        else:
            self.fs = pafs.PyFileSystem(pafs.FSSpecHandler(filesystem(self.loc, self.config)))
        self.root = self.loc.path.rstrip("/")

    @property
    def url(self) -> str:
        return self.loc.url

    def path(self, key: str) -> str:
        return f"{self.root}/{key}"

    def url_of(self, key: str) -> str:
        return self.path(key) if self.loc.protocol == "file" else f"{self.loc.protocol}://{self.path(key).lstrip('/')}"

    def _wrap(self, e: Exception, key: str, action: str = "read") -> Exception:
        from warpdata.registry.errors import StoreUnavailableError, translate_storage_error

        t = translate_storage_error(e, self.url_of(key), action)
        if t is e and isinstance(e, OSError) and not isinstance(e, FileNotFoundError):
            return StoreUnavailableError(f"cannot {action} {self.url_of(key)}: {e}",
                                         hint="check the network and WARP_S3_ENDPOINT; 'warp doctor --only store'")
        return t

    def get(self, key: str) -> bytes | None:
        """The object's bytes, or None when it does not exist."""
        try:
            with self.fs.open_input_stream(self.path(key)) as f:
                return f.read()
        except FileNotFoundError:
            return None
        except Exception as e:
            if _is_not_found(e):
                return None
            raise self._wrap(e, key) from e

    def open(self, key: str, size: int | None = None):
        """A random-access file over the object (on S3: one HEAD, then ranged GETs)."""
        try:
            return self.fs.open_input_file(self.path(key))
        except Exception as e:
            if isinstance(e, FileNotFoundError) or _is_not_found(e):
                from warpdata.registry.errors import BlobNotFoundError

                raise BlobNotFoundError(f"{self.url_of(key)} is missing from the store",
                                        hint="the version was published incompletely; republish it") from None
            raise self._wrap(e, key) from e

    def read_range(self, key: str, start: int, length: int, size: int | None = None) -> bytes:
        f = self.open(key, size)
        try:
            return f.read_at(length, start)
        except Exception as e:
            raise self._wrap(e, key) from e
        finally:
            f.close()

    def copy_to(self, key: str, dst, size: int | None = None, chunk: int = 8 << 20) -> None:
        """Stream the whole object into ``dst`` (a writable file object)."""
        f = self.open(key, size)
        try:
            buf = bytearray(chunk)
            view = memoryview(buf)
            while True:
                n = f.readinto(buf)
                if not n:
                    break
                dst.write(view[:n])
        except Exception as e:
            from warpdata.core.errors import WarpError

            if isinstance(e, WarpError):
                raise
            raise self._wrap(e, key) from e
        finally:
            f.close()


_S3_FS: dict[tuple, tuple[float, Any]] = {}
_S3_FS_TTL = 300.0  # seconds a filesystem (and the credentials resolved into it) is reused
_CRED_ENV = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE",
             "AWS_SHARED_CREDENTIALS_FILE", "AWS_CONFIG_FILE", "AWS_EC2_METADATA_DISABLED")


def _pyarrow_s3(config):
    """One pyarrow S3 filesystem per configuration and credential environment, reused for a few
    minutes: building one resolves credentials through botocore (~50 ms), which every
    ``Dataset`` open would otherwise pay again."""
    import os
    import time

    key = (config, tuple(os.environ.get(k) for k in _CRED_ENV))
    now = time.monotonic()
    hit = _S3_FS.get(key)
    if hit is not None and now - hit[0] < _S3_FS_TTL:
        return hit[1]
    fs = config.pyarrow_s3()
    if len(_S3_FS) >= 16:
        _S3_FS.clear()
    _S3_FS[key] = (now, fs)
    return fs


def _is_not_found(e: Exception) -> bool:
    text = str(e)
    return "NoSuchKey" in text or "404" in text and "Not Found" in text or "Path does not exist" in text


@dataclass
class WarmResult:
    dataset: str
    version: str
    blobs: int = 0
    fetched: int = 0
    fetched_bytes: int = 0
    cached: int = 0
    cached_bytes: int = 0
    skipped_over_budget: int = 0

    def to_dict(self) -> dict:
        return dict(self.__dict__)


class Dataset:
    """One resolved version of a published dataset."""

    def __init__(self, name: str, *, mode: str | None = None, version: str | None = None,
                 store: str | None = None, cache: BlobCache | None = None) -> None:
        from warpdata.registry.manifest import validate_dataset_id

        self.id = validate_dataset_id(name)
        self.mode = (mode or envvars.get("WARP_MODE") or "auto").lower()
        if self.mode not in MODES:
            raise UsageError(f"unknown mode {self.mode!r}", hint="use auto, remote, hybrid or local")
        self.remote = Remote(store)
        self.cache = cache if cache is not None else (None if self.mode == "remote" else BlobCache())
        self.offline_fallback = False
        self.version, self.manifest = self._resolve(version)

    def __repr__(self) -> str:
        return f"Dataset({self.id!r}, version={self.version[:12]!r}, mode={self.mode!r})"

    # -- resolution -----------------------------------------------------------
    def _resolve(self, version: str | None) -> tuple[str, Manifest]:
        from warpdata.registry.errors import DatasetNotFoundError, StoreUnavailableError
        from warpdata.registry.store import Store

        if version not in (None, "latest"):
            vh = version.lower()
            if len(vh) != 64:
                if self.mode == "local":
                    raise UsageError(f"local mode needs a full version hash, not {version!r}",
                                     hint="omit version to use the last seen latest")
                vh = Store(self.remote.url).resolve_version(self.id, version)
            return vh, self._manifest(vh)
        if self.mode == "local":
            ptr = self.cache.get_pointer(self.id) if self.cache else None
            if ptr is None:
                raise MissingInputError(f"{self.id} has never been read on this machine: no cached version in "
                                        f"{self.cache.root if self.cache else 'the cache'}",
                                        hint=f"run 'warp warm {self.id}' while online, or use mode='auto'")
            return ptr["version"], self._manifest(ptr["version"])
        try:
            raw = self.remote.get(Store.latest_key(self.id))
        except StoreUnavailableError as e:
            ptr = self.cache.get_pointer(self.id) if self.cache else None
            if ptr is None:
                raise
            self.offline_fallback = True
            out.warn(f"store unreachable ({e.message}); using the last known version "
                     f"{ptr['version'][:12]} of {self.id}")
            return ptr["version"], self._manifest(ptr["version"])
        if raw is None:
            raise Store(self.remote.url)._not_found(self.id) if self.remote.loc.protocol != "s3" else \
                DatasetNotFoundError(f"dataset {self.id} is not published in store {self.remote.url} "
                                     "(no latest pointer)",
                                     hint="check the spelling of workspace/name; 'warp ls ws/' lists datasets")
        vh = _parse_latest(raw, self.id, self.remote.url_of(Store.latest_key(self.id)))
        if self.cache is not None:
            import hashlib

            etag = hashlib.sha256(raw).hexdigest()
            old = self.cache.get_pointer(self.id)
            if old is None or old.get("etag") != etag:
                self.cache.put_pointer(self.id, vh, etag)
        return vh, self._manifest(vh)

    def _manifest(self, vh: str) -> Manifest:
        memo = _MANIFESTS.get((self.id, vh))
        # only where this dataset's cache (if any) holds it too: local mode must find it there later
        if memo is not None and (self.cache is None or self.cache.has_manifest(self.id, vh)):
            return memo
        m = self._load_manifest(vh)
        with _MANIFESTS_MU:
            if len(_MANIFESTS) >= 64:
                _MANIFESTS.pop(next(iter(_MANIFESTS)))
            _MANIFESTS[(self.id, vh)] = m
        return m

    def _load_manifest(self, vh: str) -> Manifest:
        from warpdata.registry.manifest import Manifest
        from warpdata.registry.store import Store

        key = Store.manifest_key(self.id, vh)
        src = self.remote.url_of(key)
        if self.cache is not None:
            data = self.cache.get_manifest(self.id, vh)
            if data is not None:
                try:
                    return Manifest.from_bytes(data, source=f"cached {src}", expected_hash=vh)
                except Exception:
                    if self.mode == "local":
                        raise
                    out.warn(f"cached manifest of {self.id}@{vh[:12]} is corrupt; fetching it again")
        if self.mode == "local":
            raise MissingInputError(f"manifest {vh[:12]} of {self.id} is not in the cache (local mode)",
                                    hint=f"run 'warp warm {self.id}' while online")
        data = self.remote.get(key)
        if data is None:
            from warpdata.registry.errors import DatasetNotFoundError

            raise DatasetNotFoundError(f"version {vh} of {self.id} is not in store {self.remote.url}",
                                       hint="check the version hash; omit it to read latest")
        m = Manifest.from_bytes(data, source=src, expected_hash=vh)
        if self.cache is not None:
            self.cache.put_manifest(self.id, vh, data)
        return m

    # -- parts -----------------------------------------------------------------
    @property
    def tables(self) -> list[str]:
        return sorted(self.manifest.tables)

    @property
    def artifacts(self) -> list[str]:
        return sorted(self.manifest.artifacts)

    @property
    def default_table(self) -> str:
        """The table a command reads when none is named.

        The only table; else ``main``; else the table the publisher declared
        (``metadata.default_table``: ``warp publish --from`` names a tensor
        warehouse's ``samples`` or a feature cache's ``records``). Otherwise
        there is no safe guess: :class:`MissingInputError` lists the tables.
        """
        names = self.tables
        if len(names) == 1:
            return names[0]
        if "main" in names:
            return "main"
        declared = self.manifest.metadata.get("default_table")
        if isinstance(declared, str) and declared in names:
            return declared
        if not names:
            raise MissingInputError(f"{self.id} has no tables (artifacts: {', '.join(self.artifacts) or 'none'})",
                                    hint=f"read its artifacts with dataset({self.id!r}).artifact(NAME)")
        raise MissingInputError(f"{self.id} has {len(names)} tables and none is called 'main': "
                                f"name one ({', '.join(names)})",
                                hint=f"pass --table NAME (CLI) or .table(NAME), e.g. {names[0]!r}")

    def table(self, name: str | None = None) -> Table:
        """Table ``name``; without a name, :attr:`default_table`."""
        if name is None:
            name = self.default_table
        if name not in self.manifest.tables:
            import difflib

            close = difflib.get_close_matches(name, self.tables, n=1)
            raise MissingInputError(f"{self.id} has no table {name!r} (tables: {', '.join(self.tables) or 'none'})",
                                    hint=f"did you mean {close[0]!r}?" if close else "see 'warp inspect " + self.id + "'")
        return Table(self, name)

    def artifact(self, name: str):
        from warpdata.read.refs import ArtifactReader

        if name not in self.manifest.artifacts:
            raise MissingInputError(f"{self.id} has no artifact {name!r} (artifacts: {', '.join(self.artifacts) or 'none'})",
                                    hint=f"see 'warp inspect {self.id}'")
        return ArtifactReader(self, name)

    def embeddings(self, name: str):
        """Exact nearest-neighbour search over embedding ``name`` (see :mod:`warpdata.registry.embeddings`)."""
        from warpdata.registry.embeddings import open_index

        return open_index(self, name)

    # -- blobs -------------------------------------------------------------------
    def blob_key(self, s: ShardRef) -> str:
        from warpdata.registry.manifest import blob_key

        if "://" in s.uri:
            raise UsageError(f"{s.uri}: shards outside the store are not supported by this reader",
                             hint="republish the dataset so its blobs live in the store")
        return s.uri or blob_key(s.hash)

    def cached_path(self, s: ShardRef) -> str | None:
        """The verified local copy of a blob, if this mode may use the cache and has it."""
        if self.cache is None:
            return None
        had = self.cache.has(s.hash)
        p = self.cache.get(s.hash)
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
        return str(self.cache.fetch(s.hash, lambda f: self.remote.copy_to(key, f, s.byte_size),
                                    size=s.byte_size, source=self.remote.url_of(key)))

    def open_blob(self, s: ShardRef):
        """A random-access file over a blob: the cached copy if any, else ranged remote reads."""
        import pyarrow as pa

        p = self.cached_path(s)
        if p is not None:
            return pa.memory_map(p, "r")
        if self.mode == "local":
            raise MissingInputError(f"blob {s.hash[:12]} of {self.id} is not in the cache (local mode)",
                                    hint=f"run 'warp warm {self.id}' while online")
        return self.remote.open(self.blob_key(s), s.byte_size)

    def warm(self, tables: Sequence[str] | None = None, shards: slice | None = None,
             max_bytes: int | str | None = None, artifacts: Sequence[str] | bool = True,
             on_blob: Callable[[int], None] | None = None) -> WarmResult:
        """Download table shards (and artifact shards + indexes) into the blob cache.

        ``shards`` selects shard positions within each table (and artifact);
        ``max_bytes`` caps what is newly downloaded. Already-cached blobs cost
        one local hash check and no network.
        """
        from warpdata.storage.blobcache import parse_size

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


def _parse_latest(raw: bytes, dataset_id: str, src: str) -> str:
    from warpdata.registry.errors import ManifestCorruptedError

    try:
        doc = json.loads(raw)
        vh = doc["version_hash"]
        if doc.get("dataset_id") != dataset_id:
            raise ValueError("dataset_id")
        return normalize_hash(vh)
    except (ValueError, KeyError, TypeError) as e:
        raise ManifestCorruptedError(f"{src} is not a valid latest pointer ({e})",
                                     hint=f"republish {dataset_id} with --set-latest to rewrite it") from None


# -- tables ----------------------------------------------------------------------

class _ShardFiles:
    """Open ParquetFile per shard (footer read once), preferring cached copies."""

    def __init__(self, ds: Dataset, shards: Sequence[ShardRef]) -> None:
        self.ds = ds
        self.shards = shards
        self._open: dict[int, Any] = {}
        self._local: dict[int, bool] = {}
        self._opening: dict[int, threading.Lock] = {}
        self._mu = threading.Lock()

    def get(self, i: int):
        with self._mu:
            pf = self._open.get(i)
            # a shard first opened remotely switches to its cached copy once prefetch finished it
            if pf is not None and (self._local[i] or self.ds.cache is None or not self.ds.cache.has(self.shards[i].hash)):
                return pf
            lock = self._opening.setdefault(i, threading.Lock())
        with lock:  # the opener and the row-group reader threads open a shard once (one HEAD, one footer GET)
            with self._mu:
                pf = self._open.get(i)
                if pf is not None and (self._local[i] or self.ds.cache is None
                                       or not self.ds.cache.has(self.shards[i].hash)):
                    return pf
            return self._open_shard(i)

    def _open_shard(self, i: int):
        import pyarrow.parquet as pq

        s = self.shards[i]
        local = self.ds.cached_path(s)
        src = __import__("pyarrow").memory_map(local, "r") if local else self.ds.open_blob(s)
        md = None if local else _read_footer(self.ds, s, src)
        try:
            pf = pq.ParquetFile(src, pre_buffer=not local, metadata=md)
        except Exception as e:
            from warpdata.core.errors import DataError

            raise DataError(f"{self.ds.remote.url_of(self.ds.blob_key(s))}: not a readable Parquet shard: {e}",
                            hint="the store copy is damaged; republish the dataset") from None
        with self._mu:
            self._open[i] = pf
            self._local[i] = bool(local)
        return pf

    def row_groups(self, i: int) -> list[int]:
        """Rows per row group: from the manifest's shard statistics when it has them (format 2;
        docs/formats/registry.md), so planning reads opens no shard; else from the footer."""
        s = self.shards[i]
        rgs = (s.stats or {}).get("row_groups")
        if rgs and all(isinstance(r.get("row_count"), int) for r in rgs):
            counts = [r["row_count"] for r in rgs]
            if sum(counts) == s.row_count:
                return counts
        md = self.get(i).metadata
        return [md.row_group(g).num_rows for g in range(md.num_row_groups)]


def _read_footer(ds: Dataset, s: ShardRef, src: Any):
    """The shard's footer metadata by one ranged GET of exactly its recorded length, or None.

    Without the length (format-1 manifests) pyarrow reads the file's last 64 KiB
    on the chance that the footer fits; with it, no byte beyond the footer moves.
    """
    size = (s.stats or {}).get("footer_size")
    if not size or size > s.byte_size:
        return None
    from warpdata.registry.errors import ManifestCorruptedError
    from warpdata.registry.parquet_stats import parse_footer

    try:
        data = src.read_at(size, s.byte_size - size)
    except Exception as e:
        raise ds.remote._wrap(e, ds.blob_key(s)) from e
    try:
        return parse_footer(data)
    except (ValueError, OSError) as e:
        raise ManifestCorruptedError(
            f"{ds.remote.url_of(ds.blob_key(s))}: the manifest's footer_size {size} does not match the shard ({e})",
            hint="the manifest's shard statistics are wrong; republish the dataset") from None


class _Prefetcher:
    """Downloads upcoming shards into the blob cache on one background thread.

    At most ``depth`` shards ahead of the reader's position; nothing starts
    before the reader asks for its first shard, so the first batch never waits.
    Blobs of the window are pinned so a gc or another reader cannot evict them.
    """

    def __init__(self, ds: Dataset, shards: Sequence[ShardRef], order: list[int], depth: int) -> None:
        self.ds, self.shards, self.order, self.depth = ds, shards, order, depth
        self.pos = 0
        self.cv = threading.Condition()
        self.stop = False
        self.error: BaseException | None = None
        self.done: set[int] = set()
        self.pinned: list[str] = []
        self.thread = threading.Thread(target=self._run, name="warp-prefetch", daemon=True)
        self.thread.start()

    def advance(self, pos: int) -> None:
        with self.cv:
            self.pos = pos
            self.cv.notify_all()

    def _run(self) -> None:
        cache = self.ds.cache
        for k, i in enumerate(self.order):
            with self.cv:
                while not self.stop and k > self.pos + self.depth:
                    self.cv.wait(0.5)
                if self.stop:
                    return
                if k <= self.pos:
                    continue  # the reader is already on it, by ranged reads
            s = self.shards[i]
            try:
                cache.pin([s.hash])
                self.pinned.append(s.hash)
                if not cache.has(s.hash):
                    self.ds.fetch_blob(s)
                self.done.add(i)
            except CacheTooSmallError as e:
                self.error = e
                out.warn(f"prefetch stopped: {e.message}; reading remotely")
                return
            except Exception as e:  # prefetch is an optimisation: the reader falls back to ranged reads
                self.error = e
                return

    def close(self) -> None:
        with self.cv:
            self.stop = True
            self.cv.notify_all()
        self.thread.join(timeout=60)
        if self.pinned:
            self.ds.cache.unpin(self.pinned)
            self.pinned = []


def _worker_info() -> tuple[int, int]:
    """(id, count) of the PyTorch DataLoader worker running us; (0, 1) in the main process."""
    torch_data = sys.modules.get("torch.utils.data")
    if torch_data is not None:
        info = torch_data.get_worker_info()
        if info is not None:
            return info.id, info.num_workers
    return 0, 1


def _parse_shard(shard: Any) -> tuple[int, int]:
    if shard is None:
        return 0, 1
    if shard == "auto":
        return auto_shard()
    if isinstance(shard, str) and "/" in shard:
        a, _, b = shard.partition("/")
        try:
            return int(a), int(b)
        except ValueError:
            pass
    if isinstance(shard, (tuple, list)) and len(shard) == 2:
        return int(shard[0]), int(shard[1])
    raise ShardingError(f"shard={shard!r} is not (rank, world_size), 'RANK/WORLD' or 'auto'",
                        hint="e.g. shard=(0, 8), shard='0/8' or shard='auto' (reads RANK and WORLD_SIZE)")


def _prefetch_depth(prefetch: Any, mode: str) -> int:
    if prefetch in (None, "auto"):
        prefetch = envvars.get("WARP_PREFETCH") or "auto"
    if prefetch == "auto":
        return PREFETCH_DEPTH[mode]
    if prefetch in (False, "off", "0", 0):
        return 0
    try:
        return max(0, int(prefetch))
    except (TypeError, ValueError):
        raise UsageError(f"prefetch={prefetch!r} is not auto, off or a number of shards",
                         hint="e.g. prefetch='auto', prefetch=4 or prefetch='off'") from None


@dataclass
class BatchStream:
    """An iterable of RecordBatches for one (rank, worker), with resume state."""

    table: Table
    plan: ShardPlan
    batch_ids: list[int]
    columns: list[str] | None
    limit: int | None
    depth: int
    num_workers: int = 1
    yielded: int = 0
    rows: int = 0
    _files: _ShardFiles | None = field(default=None, repr=False)

    def __len__(self) -> int:
        return len(self.batch_ids)

    def state_dict(self, batches_consumed: int | None = None, num_workers: int | None = None) -> ResumeState:
        """Resume state after ``batches_consumed`` (default: what this stream yielded)."""
        n = self.yielded if batches_consumed is None else batches_consumed
        return self.plan.state_after(n, num_workers or self.num_workers, manifest=self.table.ds.version,
                                     table=self.table.name)

    def __iter__(self) -> Iterator[pa.RecordBatch]:
        import pyarrow as pa

        ds, shards = self.table.ds, self.table.shards
        files = self._files = _ShardFiles(ds, shards)
        order: list[int] = []
        for j in self.batch_ids:
            for s in self.plan.batch_slices(j):
                if not order or order[-1] != s.unit:
                    order.append(s.unit)
        pre = _Prefetcher(ds, shards, order, self.depth) if self.depth and ds.cache is not None and ds.mode != "local" else None
        # Opening a remote shard costs round trips (size, footer): open the next few on
        # threads while this one is read, as pyarrow.dataset's fragment readahead does.
        # Not for limited reads (head): they must not fetch footers they never use.
        opener = _ShardOpener(files, order) if self.limit is None and ds.mode != "local" and len(order) > 1 else None
        cols = self.columns
        cur: tuple[int, int] | None = None  # (shard, row group) of the table held in `cur_tab`
        cur_tab = None
        bounds: dict[int, list[int]] = {}

        def bounds_of(unit: int) -> list[int]:
            b = bounds.get(unit)
            if b is None:
                b = bounds[unit] = [0]
                for n in files.row_groups(unit):
                    b.append(b[-1] + n)
            return b

        # Unlimited reads decode the next few row groups of a shard in one call, so
        # pyarrow decodes them in parallel (one row group at a time keeps one core busy).
        groups = _RowGroupBatcher(files, self._row_group_keys(bounds_of), cols, bounds_of) \
            if self.limit is None else None
        pos = 0
        try:
            for j in self.batch_ids:
                parts = []
                for s in self.plan.batch_slices(j):
                    if order[pos] != s.unit:
                        pos = order.index(s.unit, pos)
                        if pre:
                            pre.advance(pos)
                    if opener:
                        opener.advance(pos)
                    b = bounds_of(s.unit)
                    start = s.start
                    while start < s.stop:
                        g = _bisect_right(b, start) - 1
                        if cur != (s.unit, g):
                            if groups:
                                cur_tab = groups.take((s.unit, g))
                            else:
                                cur_tab = files.get(s.unit).read_row_group(g, columns=cols, use_threads=True)
                                _check_rows(files, s.unit, [g], cur_tab.num_rows, b[g + 1] - b[g])
                            cur = (s.unit, g)
                        take = min(s.stop, b[g + 1]) - start
                        parts.append(cur_tab.slice(start - b[g], take))
                        start += take
                tab = parts[0] if len(parts) == 1 else pa.concat_tables(parts)
                for batch in _one_batch(tab):
                    if self.limit is not None and self.rows + batch.num_rows > self.limit:
                        batch = batch.slice(0, self.limit - self.rows)
                    self.rows += batch.num_rows
                    self.yielded += 1
                    if batch.num_rows:
                        yield batch
                    if self.limit is not None and self.rows >= self.limit:
                        return
        finally:
            if groups:
                groups.close()
            if opener:
                opener.close()
            if pre:
                pre.close()


    def _row_group_keys(self, bounds_of) -> Iterator[tuple[int, int]]:
        """The (shard, row group) pairs this stream reads, in order, without repeats in a row."""
        last = None
        for j in self.batch_ids:
            for s in self.plan.batch_slices(j):
                b = bounds_of(s.unit)
                start = s.start
                while start < s.stop:
                    g = _bisect_right(b, start) - 1
                    if (s.unit, g) != last:
                        last = (s.unit, g)
                        yield last
                    start = min(s.stop, b[g + 1])


class _RowGroupBatcher:
    """Reads the row groups the stream will use, up to ``width`` of one shard per call, ``ahead``
    calls in advance on a background thread, across shard boundaries.

    So the next shard's ranged GETs (or page-cache reads) and its decoding (pyarrow, GIL
    released, columns in parallel) overlap the consumer's work on the current batch; each row
    group is handed out as a slice of the table read for it (zero-copy). Memory: at most
    ``ahead + 1`` calls' tables.
    """

    def __init__(self, files: _ShardFiles, keys: Iterator[tuple[int, int]], columns, bounds_of,
                 width: int = 4, ahead: int | None = None, threads: int | None = None) -> None:
        ahead = ROWGROUP_AHEAD if ahead is None else ahead
        threads = ROWGROUP_THREADS if threads is None else threads
        self._files, self._cols, self._bounds_of, self._width, self._ahead = files, columns, bounds_of, width, ahead
        self._chunks = self._chunked(keys)
        self._inflight: list[tuple[list[tuple[int, int]], Any]] = []  # (keys, future), in stream order
        self._ready: dict[tuple[int, int], Any] = {}
        self._pool = None
        if ahead:
            from concurrent.futures import ThreadPoolExecutor

            self._pool = ThreadPoolExecutor(max(1, min(threads, ahead)), thread_name_prefix="warp-rowgroups")

    def _chunked(self, keys: Iterator[tuple[int, int]]) -> Iterator[list[tuple[int, int]]]:
        chunk: list[tuple[int, int]] = []
        for k in keys:
            if chunk and (k[0] != chunk[0][0] or len(chunk) >= self._width):
                yield chunk
                chunk = []
            chunk.append(k)
        if chunk:
            yield chunk

    def _load(self, chunk: list[tuple[int, int]]):
        return self._files.get(chunk[0][0]).read_row_groups([g for _, g in chunk], columns=self._cols,
                                                             use_threads=True)

    def _fill(self) -> None:
        from concurrent.futures import Future

        while len(self._inflight) < max(1, self._ahead):
            c = next(self._chunks, None)
            if c is None:
                return
            if self._pool is not None:
                fut = self._pool.submit(self._load, c)
            else:
                fut = Future()
                fut.set_result(None)  # loaded when taken
            self._inflight.append((c, fut))

    def take(self, key: tuple[int, int]):
        tab = self._ready.pop(key, None)
        if tab is not None:
            return tab
        self._ready.clear()
        while True:
            self._fill()
            if not self._inflight:  # past the planned keys: read it alone
                return self._files.get(key[0]).read_row_group(key[1], columns=self._cols, use_threads=True)
            chunk, fut = self._inflight.pop(0)
            if key not in chunk:  # the consumer skipped ahead: follow it
                fut.cancel()
                continue
            tab = fut.result()
            if tab is None:
                tab = self._load(chunk)
            self._fill()  # the next reads start before this table is handed out
            b = self._bounds_of(key[0])
            _check_rows(self._files, key[0], [g for _, g in chunk], tab.num_rows,
                        sum(b[g + 1] - b[g] for _, g in chunk))
            at = 0
            for _, g in chunk:
                n = b[g + 1] - b[g]
                self._ready[(key[0], g)] = tab.slice(at, n)
                at += n
            return self._ready.pop(key)

    def close(self) -> None:
        if self._pool is not None:
            for _, fut in self._inflight:
                fut.cancel()
            self._pool.shutdown(wait=False, cancel_futures=True)
        self._inflight.clear()
        self._ready.clear()


def _check_rows(files: _ShardFiles, unit: int, groups: list[int], got: int, want: int) -> None:
    """Row groups read must hold the rows planned from the manifest's statistics."""
    if got != want:
        from warpdata.core.errors import DataError

        ds, s = files.ds, files.shards[unit]
        raise DataError(f"{ds.remote.url_of(ds.blob_key(s))}: row groups {groups} hold {got} rows, "
                        f"the manifest says {want}",
                        hint="the manifest's shard statistics are wrong; republish the dataset")


class _ShardOpener:
    """Opens the shards after the reader's position on background threads (footers only)."""

    def __init__(self, files: _ShardFiles, order: list[int], ahead: int = 3) -> None:
        from concurrent.futures import ThreadPoolExecutor

        self._files, self._order, self._ahead = files, order, ahead
        self._next = 1  # index in order of the next shard to open
        self._pool = ThreadPoolExecutor(ahead, thread_name_prefix="warp-open")

    def _open(self, unit: int) -> None:
        import contextlib

        with contextlib.suppress(Exception):  # the reader opens it again and reports the error itself
            self._files.get(unit)

    def advance(self, pos: int) -> None:
        while self._next < len(self._order) and self._next <= pos + self._ahead:
            self._pool.submit(self._open, self._order[self._next])
            self._next += 1

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


def _bisect_right(a: list[int], x: int) -> int:
    import bisect

    return bisect.bisect_right(a, x)


def _one_batch(tab):
    """A table slice as exactly one RecordBatch (zero-copy when it is one chunk)."""
    batches = tab.to_batches()
    if len(batches) == 1:
        return batches
    if not batches:
        import pyarrow as pa

        return [pa.RecordBatch.from_pylist([], schema=tab.schema)]
    return tab.combine_chunks().to_batches()[:1] or batches


class Table:
    """A table of a dataset version: Parquet shards read by ranges."""

    def __init__(self, ds: Dataset, name: str, columns: list[str] | None = None) -> None:
        self.ds = ds
        self.name = name
        self.meta = ds.manifest.tables[name]
        self.shards = list(self.meta.shards)
        self.columns = columns

    def __repr__(self) -> str:
        return f"Table({self.ds.id!r}, {self.name!r}, rows={self.num_rows})"

    @property
    def num_rows(self) -> int:
        return sum(self._row_counts())

    @property
    def bindings(self) -> dict:
        return self.ds.manifest.bindings_for(self.name)

    def _row_counts(self) -> list[int]:
        counts = [s.row_count for s in self.shards]
        if any(c is None for c in counts):
            files = _ShardFiles(self.ds, self.shards)
            counts = [c if c is not None else files.get(i).metadata.num_rows for i, c in enumerate(counts)]
        return counts  # type: ignore[return-value]

    # -- metadata --------------------------------------------------------------
    def schema(self) -> pa.Schema:
        """The Arrow schema, from the first shard's footer (a ranged read, no data)."""
        if not self.shards:
            raise MissingInputError(f"table {self.name} of {self.ds.id} has no shards")
        sch = _ShardFiles(self.ds, self.shards[:1]).get(0).schema_arrow
        if self.columns:
            sch = __import__("pyarrow").schema([sch.field(c) for c in self.columns])
        return sch

    def _check_columns(self, columns: Sequence[str] | None) -> list[str] | None:
        if columns is None:
            return self.columns
        cols = [c.strip() for c in (columns.split(",") if isinstance(columns, str) else columns) if c.strip()]
        names = self.schema_names()
        bad = [c for c in cols if c not in names]
        if bad:
            import difflib

            close = difflib.get_close_matches(bad[0], names, n=1)
            raise UsageError(f"table {self.name} of {self.ds.id} has no column {bad[0]!r} "
                             f"(columns: {', '.join(names)})", hint=f"did you mean {close[0]!r}?" if close else None)
        return cols

    def schema_names(self) -> list[str]:
        if self.meta.schema:
            return [f["name"] for f in self.meta.schema["fields"]]
        return list(_ShardFiles(self.ds, self.shards[:1]).get(0).schema_arrow.names)

    def select(self, columns: Sequence[str] | str) -> Table:
        return Table(self.ds, self.name, self._check_columns(columns))

    # -- reading ---------------------------------------------------------------
    def head(self, n: int = 5) -> pa.Table:
        """The first ``n`` rows, reading only the row groups that hold them."""
        import pyarrow as pa

        got = list(self.batches(batch_size=max(1, min(n, DEFAULT_BATCH)), limit=n, prefetch="off")) if n else []
        if not got:
            return self.schema().empty_table()
        return pa.Table.from_batches(got)

    def batches(self, batch_size: int = DEFAULT_BATCH, columns: Sequence[str] | None = None,
                shard: Any = None, limit: int | None = None, prefetch: Any = "auto", *,
                policy: str = "pad", shuffle: bool = False, seed: int = 0, epoch: int = 0,
                resume: ResumeState | str | None = None, worker: tuple[int, int] | None = None) -> BatchStream:
        """Arrow RecordBatches of ``batch_size`` rows for this rank and DataLoader worker.

        ``shard``: None (everything), ``(rank, world)``, ``"rank/world"`` or
        ``"auto"`` (RANK / WORLD_SIZE). ``policy`` says what happens when the
        rows do not split evenly; the library default is ``"pad"``, for DDP:
        every rank gets the same number of batches and the last ranks repeat
        rows from the start (``plan.pad_rows`` of them, fewer than ``world``),
        so over all ranks more rows come out than the table has. ``"drop"``
        skips the remainder instead; ``"exact"`` reads every row exactly once
        (ranks may differ by one row), which is what ``warp stream --shard``
        does unless given ``--pad``. See docs in :mod:`warpdata.partition.plan`.
        ``resume``: a :class:`ResumeState` (or its JSON) from ``state_dict()``.
        """
        cols = self._check_columns(columns)
        if limit is not None and limit < 0:
            raise UsageError(f"limit must be >= 0, not {limit}")
        wid, nw = worker if worker is not None else _worker_info()
        counts = self._row_counts()
        if resume is not None:
            state = ResumeState.from_json(resume) if isinstance(resume, (str, bytes)) else resume
            rank, world = _parse_shard(shard) if shard is not None else (state.rank, state.world)
            plan = ShardPlan.resume(counts, state, manifest=self.ds.version, table=self.name, rank=rank, world=world)
        else:
            rank, world = _parse_shard(shard)
            plan = ShardPlan(counts, rank=rank, world=world, batch_size=batch_size, policy=policy,
                             seed=seed, epoch=epoch, shuffle=shuffle)
        ids = plan.worker_batches(wid, nw) if plan.remaining() else []
        return BatchStream(self, plan, ids, cols, limit, _prefetch_depth(prefetch, self.ds.mode), num_workers=nw)

    def batch_dicts(self, batch_size: int = DEFAULT_BATCH, columns: Sequence[str] | None = None,
                    read_refs: bool = False, **kw: Any) -> Iterator[dict[str, list]]:
        """dict-of-lists batches; columns bound to an artifact hold typed refs.

        ``read_refs``: read every ref's bytes with its batch, in parallel (cached
        shards by pread, the rest by coalesced ranged GETs), so ``read_bytes()``
        and the decoders cost no request.
        """
        from warpdata.read.refs import make_refs

        bound = {c: make_refs(self.ds, b, read_refs) for c, b in self.bindings.items()}
        for batch in self.batches(batch_size, columns, **kw):
            d = batch.to_pydict()
            for c, make in bound.items():
                if c in d:
                    d[c] = make(d[c])
            yield d

    def to_arrow(self, limit: int | None = None) -> pa.Table:
        import pyarrow as pa

        return pa.Table.from_batches(list(self.batches(limit=limit)), schema=self.schema())

    def filter(self, expr: str) -> Query:
        """Rows matching SQL boolean ``expr`` (DuckDB dialect), with pushdown.

        ``expr`` is one expression over the table's columns: comparisons, AND/OR/NOT,
        IN, BETWEEN, LIKE, IS NULL, CASE, casts and pure functions
        (:data:`warpdata.core.sqlgate.ALLOWED_FUNCTIONS`); anything else (a second
        statement, a subquery, UNION, file-reading functions) is a UsageError.
        """
        return Query(self, expr, self.columns)

    def to_torch(self, batch_size: int = 1024, columns: Sequence[str] | None = None, *,
                 num_workers: int = 0, shard: Any = "auto", read_refs: bool = False, **kw: Any) -> TorchLoader:
        """A PyTorch DataLoader over this table (IterableDataset, one worker per run of batches).

        ``read_refs``: columns bound to an artifact come as lists of the members' bytes, read
        with their batch in parallel (cached shards by pread, the rest by coalesced ranged
        GETs), instead of lists of member paths.
        """
        loader = TorchLoader(self, batch_size, self._check_columns(columns), num_workers, shard, kw)
        loader.read_refs = read_refs
        return loader

    def warm(self, shards: slice | None = None, max_bytes: int | str | None = None) -> WarmResult:
        return self.ds.warm(tables=[self.name], shards=shards, max_bytes=max_bytes, artifacts=False)


class Query:
    """A filtered view of a table, executed by DuckDB over the shard URLs."""

    def __init__(self, table: Table, expr: str, columns: list[str] | None) -> None:
        self.table, self.expr, self.columns = table, expr, columns

    def select(self, columns: Sequence[str] | str) -> Query:
        return Query(self.table, self.expr, self.table._check_columns(columns))

    def _picked(self, shard: Any) -> list[ShardRef]:
        """This rank's and DataLoader worker's shards (whole files, round-robin)."""
        rank, world = _parse_shard(shard)
        wid, nw = _worker_info()
        picked = [s for i, s in enumerate(self.table.shards) if i % world == rank]
        return [s for i, s in enumerate(picked) if i % nw == wid]

    def _pruned_reader(self, shard: Any, columns: list[str] | None):
        """A RecordBatchReader over the row groups the filter may match, or None if none can.

        Format-2 manifests record each shard's column min/max (and per row group):
        a shard or row group whose statistics rule the filter out is never opened,
        so it costs no request at all. The rest are opened with one exact footer
        read and read by row group with only the columns the query uses; DuckDB
        then applies the filter to those rows. ``columns``: the query's output
        columns (None: all; [] for ``count(*)``).
        """
        import pyarrow as pa
        from warpdata.registry.parquet_stats import Predicate, shard_stats

        ds = self.table.ds
        names = self.table.schema_names()
        pred = Predicate.parse(self.expr, names)
        plan: list[tuple[ShardRef, list[int] | None]] = []
        for s in self._picked(shard):
            st = s.stats or {}
            if pred is not None and not pred.may_match(st.get("columns"), s.row_count):
                continue
            rgs = None
            if pred is not None and "row_groups" in st:
                rgs = [g for g, rg in enumerate(st["row_groups"]) if pred.may_match(rg["columns"], rg["row_count"])]
                if not rgs:
                    continue
            plan.append((s, rgs))
        if not plan:
            return None
        if pred is None or pred.referenced is None or columns is None:
            needed = None
        else:
            wanted = set(columns) | pred.referenced
            needed = [n for n in names if n in wanted] or names[:1]  # count(*) of a constant filter: one column
        files = _ShardFiles(ds, [s for s, _ in plan])
        first = files.get(0).schema_arrow
        schema = first if needed is None else pa.schema([first.field(n) for n in needed])

        def row_groups(k: int, rgs: list[int] | None, pf) -> list[int]:
            if rgs is not None:
                return rgs
            md = pf.metadata  # no row-group stats in the manifest: the footer's, same rules
            st = shard_stats(md, max_row_groups=None) if pred is not None else None
            if st is None:
                return list(range(md.num_row_groups))
            return [g for g, rg in enumerate(st["row_groups"]) if pred.may_match(rg["columns"], rg["row_count"])]

        def gen() -> Iterator[pa.RecordBatch]:
            for k, (_s, rgs) in enumerate(plan):
                pf = files.get(k)
                todo = row_groups(k, rgs, pf)
                # up to 4 row groups per call: pyarrow coalesces their ranges and decodes in parallel
                for j in range(0, len(todo), 4):
                    tab = pf.read_row_groups(todo[j:j + 4], columns=needed, use_threads=True)
                    yield from tab.select(schema.names).to_batches()

        return pa.RecordBatchReader.from_batches(schema, gen())

    def _arrow_dataset(self, shard: Any):
        """A pyarrow dataset over this rank's shards: cached copies locally, the rest by ranged reads.

        DuckDB scans it with projection and filter pushdown into pyarrow's
        scanner, which prunes row groups by their statistics, so only the
        matching row groups' column chunks are fetched.
        """
        import pyarrow.dataset as pads
        from pyarrow import fs as pafs

        ds = self.table.ds
        picked = self._picked(shard)
        local, remote = [], []
        for s in picked:
            p = ds.cached_path(s)
            if p is None and ds.mode == "local":
                raise MissingInputError(f"shard {s.hash[:12]} of {ds.id} is not in the cache (local mode)",
                                        hint=f"run 'warp warm {ds.id}' while online")
            if p is not None:
                local.append(p)
            else:
                remote.append(ds.remote.path(ds.blob_key(s)))
        schema = self.table.schema() if self.table.columns is None else \
            _ShardFiles(ds, self.table.shards[:1]).get(0).schema_arrow
        parts = []
        if local:
            parts.append(pads.dataset(local, schema=schema, format="parquet", filesystem=pafs.LocalFileSystem()))
        if remote:
            fmt = pads.ParquetFileFormat(default_fragment_scan_options=pads.ParquetFragmentScanOptions(pre_buffer=True))
            parts.append(pads.dataset(remote, schema=schema, format=fmt, filesystem=ds.remote.fs))
        if not parts:
            return None
        return parts[0] if len(parts) == 1 else pads.dataset(parts)

    def sql(self, limit: int | None = None, what: str | None = None) -> str:
        from warpdata.core.sqlgate import check_filter, where_sql

        check_filter(self.expr, self.table.schema_names())  # one expression over the columns, or UsageError
        cols = what or (", ".join(_quote_ident(c) for c in self.columns) if self.columns else "*")
        sql = f"SELECT {cols} FROM warp_table WHERE {where_sql(self.expr)}"
        if limit is not None:
            sql += f" LIMIT {int(limit)}"
        return sql

    def _run(self, sql: str, shard: Any, columns: list[str] | None = None):
        import duckdb

        if any(s.stats is not None for s in self.table.shards):
            dset = self._pruned_reader(shard, columns)
        else:  # format-1 manifest: no statistics to prune with; pyarrow's scanner reads every footer
            dset = self._arrow_dataset(shard)
        if dset is None:
            return None, None
        from warpdata.core.sqlgate import connect, lock

        con = connect()
        con.register("warp_table", dset)
        lock(con)  # no file, network or extension access beyond the registered shards
        try:
            return con, con.sql(sql)
        except duckdb.Error as e:
            con.close()
            raise UsageError(f"filter {self.expr!r} on {self.table.ds.id}/{self.table.name}: {e}",
                             hint=f"write a DuckDB SQL boolean expression over the columns "
                                  f"{', '.join(self.table.schema_names())}") from None

    def batches(self, batch_size: int = DEFAULT_BATCH, shard: Any = None, limit: int | None = None) -> Iterator[pa.RecordBatch]:
        """Matching rows as RecordBatches; with ``shard`` each rank scans whole shard files round-robin
        (a filter's per-rank row counts are data dependent, so batch counts may differ)."""
        import duckdb

        con, rel = self._run(self.sql(limit), shard, self.columns)
        if rel is None:
            return
        try:
            try:
                # a relation streams (DuckDB 2.x: to_arrow_reader; 1.x: fetch_arrow_reader)
                reader = (rel.to_arrow_reader(batch_size) if hasattr(rel, "to_arrow_reader")
                          else rel.fetch_arrow_reader(batch_size))
                for b in reader:
                    if b.num_rows:
                        yield b
            except duckdb.Error as e:
                raise UsageError(f"filter {self.expr!r} on {self.table.ds.id}/{self.table.name}: {e}",
                                 hint=f"write a DuckDB SQL boolean expression over the columns "
                                      f"{', '.join(self.table.schema_names())}") from None
        finally:
            con.close()

    def to_arrow(self, limit: int | None = None) -> pa.Table:
        import pyarrow as pa

        got = list(self.batches(limit=limit))
        if not got:
            sch = self.table.schema()
            if self.columns:
                sch = pa.schema([sch.field(c) for c in self.columns])
            return sch.empty_table()
        return pa.Table.from_batches(got)

    def count(self) -> int:
        con, rel = self._run(self.sql(what="count(*)"), None, [])
        if rel is None:
            return 0
        try:
            return int(rel.fetchall()[0][0])
        finally:
            con.close()


def _quote_ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


class TorchLoader:
    """A DataLoader over a table with resume state; iterate it like any DataLoader.

    Numeric columns become tensors (zero-copy from Arrow where possible);
    other columns stay lists. ``len()`` is the number of batches this rank
    yields, equal on every rank.
    """

    def __init__(self, table: Table, batch_size: int, columns: list[str] | None, num_workers: int,
                 shard: Any, kw: dict[str, Any]) -> None:
        try:
            import torch  # noqa: F401
        except ImportError:
            from warpdata.core.errors import missing_dependency

            raise missing_dependency("to_torch()", "torch", "torch") from None
        self.table, self.batch_size, self.columns = table, batch_size, columns
        self.num_workers, self.shard, self.kw = num_workers, shard, kw
        self.read_refs = False
        self.consumed = 0
        self._probe = table.batches(batch_size, columns, shard=shard, worker=(0, 1), **kw)
        # fail now, in the main process, if some worker would get nothing
        if self._probe.plan.remaining():
            for w in range(max(1, num_workers)):
                self._probe.plan.worker_batches(w, max(1, num_workers))

    def __len__(self) -> int:
        return len(self._probe.plan.remaining())

    def state_dict(self) -> ResumeState:
        return self._probe.plan.state_after(self.consumed, max(1, self.num_workers),
                                            manifest=self.table.ds.version, table=self.table.name)

    def __iter__(self):
        from torch.utils.data import DataLoader

        ds = _make_torch_iterable((self.table.ds.id, self.table.ds.version, self.table.ds.mode,
                                   self.table.ds.remote.url, self.table.name, self.batch_size, self.columns,
                                   self.shard, self.kw, self.read_refs))
        self.consumed = 0
        for b in DataLoader(ds, batch_size=None, num_workers=self.num_workers,
                            persistent_workers=False):
            self.consumed += 1
            yield b


def _to_torch_batch(batch) -> dict[str, Any]:
    import pyarrow as pa
    import torch

    outd: dict[str, Any] = {}
    for name, col in zip(batch.schema.names, batch.columns, strict=True):
        t = col.type
        if (pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t)) and col.null_count == 0:
            arr = col.to_numpy(zero_copy_only=False)
            # a zero-copy view of Arrow's immutable buffer: a tensor over it could be written
            # in place (undefined behaviour), so it gets its own writable copy
            outd[name] = torch.from_numpy(arr if arr.flags.writeable else arr.copy())
        else:
            outd[name] = col.to_pylist()
    return outd


_TORCH_ITERABLE: Any = None


def _make_torch_iterable(args: tuple) -> Any:
    """The IterableDataset behind :class:`TorchLoader`; picklable, reopens the dataset per worker."""
    global _TORCH_ITERABLE
    if _TORCH_ITERABLE is None:
        from torch.utils.data import IterableDataset

        class WarpTableIterable(IterableDataset):
            def __init__(self, args: tuple) -> None:
                self.args = args

            def __reduce__(self):
                return (_make_torch_iterable, (self.args,))

            def __iter__(self):
                dataset_id, version, mode, store, table, batch_size, columns, shard, kw, read_refs = self.args
                ds = Dataset(dataset_id, mode=mode, version=version, store=store)
                t = ds.table(table)
                readers = {}
                if read_refs:
                    from warpdata.read.refs import ArtifactReader

                    readers = {c: ArtifactReader(ds, b.artifact) for c, b in t.bindings.items()}
                for b in t.batches(batch_size, columns, shard=shard, **kw):
                    d = _to_torch_batch(b)
                    for c, reader in readers.items():
                        if c in d:
                            vals = d[c]
                            got = iter(reader.read_many([v for v in vals if v is not None]))
                            d[c] = [None if v is None else next(got) for v in vals]
                    yield d

        _TORCH_ITERABLE = WarpTableIterable
    return _TORCH_ITERABLE(args)


class _CallableModule(type(sys)):
    """``warpdata.read.dataset`` is both this module and the :func:`dataset` function.

    Importing the submodule (``from warpdata.read.dataset import Dataset``) makes
    the import system set the package attribute ``warpdata.read.dataset`` to the
    module, hiding the lazy function: ``wd.dataset("ws/name")`` must still
    work, so the module itself is callable.
    """

    def __call__(self, *args: Any, **kwargs: Any) -> Dataset:
        return dataset(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule
