"""Dataset stores: content-addressed blobs, immutable manifests, a mutable ``latest``.

A :class:`Store` is a root URL (local directory, ``s3://bucket/prefix``,
``memory://name``, or ``http(s)://host/prefix`` read-only; default :func:`warpdata.core.envvars.default_store`, i.e.
``WARP_STORE`` or ``$XDG_DATA_HOME/warp/store``) with this layout::

    blobs/sha256/<h[:2]>/<h>                          immutable, create-only
    datasets/<ws>/<name>/versions/<version_hash>.json  immutable, create-only
    datasets/<ws>/<name>/latest.json                   mutable, compare-and-swap

Guarantees, per backend:

* **Create-only writes** (blobs, manifests): a write never replaces existing
  bytes. S3: ``PUT If-None-Match: *`` (412 = already there); local:
  write a temp file then ``link()`` it into place; memory: check-and-set
  under a process lock. :meth:`Store.put_blob` / :meth:`Store.put_manifest`
  return ``True`` when they wrote, ``False`` when the object already existed
  (which, the key being the content hash, means the work is done).
* **Compare-and-swap ``latest``**: :meth:`Store.read_latest` returns a
  :class:`LatestPointer` with an opaque ``token``; :meth:`Store.cas_latest`
  writes only if the pointer still has that token (S3 ``If-Match: <etag>``,
  or ``If-None-Match: *`` when there was none; local: atomic rename under a
  lock file holding pid + host + time, broken when its holder is dead or
  older than ``stale_after`` seconds). A reader never sees a torn pointer.
* **Verified reads**: :meth:`Store.get_blob` checks the SHA-256 of what it
  read; :meth:`Store.get_manifest` validates schema and hash
  (:class:`~warpdata.registry.manifest.Manifest.from_bytes`).
* Storage failures surface as the typed errors of
  :mod:`warpdata.core.errors` (auth, permission, unreachable, not found).
* **HTTP(S) stores** (a store folder served by a static web host or CDN) are
  read by key through :class:`~warpdata.storage.remote.Remote` (GET, ranged
  GET, HEAD): every write raises :class:`~warpdata.core.errors.ReadOnlyStoreError`
  naming the URL (exit 78), and listing raises
  :class:`~warpdata.core.errors.NotListableError` (exit 2), so versions are
  named by their full hash there.

Readers that stream Parquet or ranges use :meth:`Store.blob_url` (a URL
DuckDB/pyarrow/fsspec understand) or :meth:`Store.read_range`; the fsspec
filesystem is ``store.fs`` and the S3 settings ``store.config``.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import socket
import threading
import time
import uuid
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from warpdata.core import envvars
from warpdata.core.atomic import create_exclusive
from warpdata.core.canonical import canonical_json
from warpdata.core.errors import (
    BlobCorruptedError,
    BlobNotFoundError,
    DatasetNotFoundError,
    LockTimeoutError,
    ManifestCorruptedError,
)
from warpdata.registry.manifest import (
    HASH_RE,
    Manifest,
    blob_key,
    validate_dataset_id,
    validate_hash,
    validate_workspace,
)
from warpdata.storage.errors import translate_storage_error
from warpdata.storage.locations import Location, StorageConfig, filesystem, parse_location
from warpdata.storage.s3client import boto3_client

__all__ = ["FileLock", "LatestPointer", "Store", "open_store"]

LATEST_KIND = "dataset-latest"


@dataclass(frozen=True)
class LatestPointer:
    """What ``latest.json`` says, plus the token a compare-and-swap must present."""

    dataset_id: str
    version_hash: str
    updated_at: str
    token: str  # S3 ETag / sha256 of the local file's bytes


# -- backends ----------------------------------------------------------------

class _Backend:
    """Key/value operations over one fsspec filesystem rooted at ``root``."""

    def __init__(self, fs: Any, root: str) -> None:
        self.fs = fs
        self.root = root.rstrip("/")

    def path(self, key: str) -> str:
        return f"{self.root}/{key}"

    def exists(self, key: str) -> bool:
        return bool(self.fs.exists(self.path(key)))

    def get(self, key: str) -> bytes:
        return self.fs.cat_file(self.path(key))

    def get_range(self, key: str, start: int, end: int) -> bytes:
        return self.fs.cat_file(self.path(key), start=start, end=end)

    def size(self, key: str) -> int:
        return int(self.fs.size(self.path(key)))

    def list_names(self, prefix: str) -> list[str]:
        p = self.path(prefix).rstrip("/")
        with contextlib.suppress(AttributeError):
            self.fs.invalidate_cache(p)
        try:
            entries = self.fs.ls(p, detail=False)
        except FileNotFoundError:
            return []
        return sorted({e.rstrip("/").rsplit("/", 1)[-1] for e in entries})

    def read_versioned(self, key: str) -> tuple[bytes, str] | None:
        """The bytes and a version token (their SHA-256; S3 uses the ETag); None if absent."""
        try:
            data = self.get(key)
        except FileNotFoundError:
            return None
        return data, hashlib.sha256(data).hexdigest()

    # subclasses: put_if_absent, put_file_if_absent, write_if


class _LocalBackend(_Backend):
    def __init__(self, fs: Any, root: str, stale_after: float) -> None:
        super().__init__(fs, root)
        self.stale_after = stale_after

    def exists(self, key: str) -> bool:
        return os.path.exists(self.path(key))

    def get(self, key: str) -> bytes:
        with open(self.path(key), "rb") as f:
            return f.read()

    def put_if_absent(self, key: str, data: bytes) -> bool:
        return create_exclusive(self.path(key), data)

    def put_file_if_absent(self, key: str, local: str) -> bool:
        if os.path.exists(self.path(key)):
            return False
        return create_exclusive(self.path(key), source=local)

    def write_if(self, key: str, data: bytes, token: str | None) -> str | None:
        from warpdata.core.atomic import atomic_write_bytes

        path = self.path(key)
        with FileLock(path + ".lock", stale_after=self.stale_after):
            current = self.read_versioned(key)
            if (current[1] if current else None) != token:
                return None
            atomic_write_bytes(path, data)
        return hashlib.sha256(data).hexdigest()


_MEMORY_LOCK = threading.Lock()


class _HttpBackend(_Backend):
    """A store served over HTTP(S): reads by key through :class:`~warpdata.storage.remote.Remote`;
    no listing, no writes."""

    def __init__(self, location: Location) -> None:
        from warpdata.storage.remote import Remote

        super().__init__(None, location.path)
        self.url = location.url
        self.remote = Remote(location.url)

    def exists(self, key: str) -> bool:
        try:
            self.remote.size(key)
        except BlobNotFoundError:
            return False
        return True

    def get(self, key: str) -> bytes:
        data = self.remote.get(key)
        if data is None:
            raise FileNotFoundError(self.remote.url_of(key))
        return data

    def get_range(self, key: str, start: int, end: int) -> bytes:
        try:
            return self.remote.read_range(key, start, end - start)
        except BlobNotFoundError:
            raise FileNotFoundError(self.remote.url_of(key)) from None

    def size(self, key: str) -> int:
        try:
            return self.remote.size(key)
        except BlobNotFoundError:
            raise FileNotFoundError(self.remote.url_of(key)) from None

    def list_names(self, prefix: str) -> list[str]:
        from warpdata.core.errors import NotListableError

        raise NotListableError(
            f"store {self.url} is served over HTTP and cannot be listed ({prefix}/)",
            hint="name the dataset (e.g. 'warp ls ws/name', 'warp stream ws/name') and give versions as "
                 "full 64-hex hashes; list from the s3:// bucket or folder behind the host")

    def _read_only(self, key: str, *args: Any) -> Any:
        raise read_only_error(self.url, f"write {self.remote.url_of(key)}")

    put_if_absent = put_file_if_absent = write_if = _read_only


def read_only_error(url: str, action: str):
    from warpdata.core.errors import ReadOnlyStoreError

    return ReadOnlyStoreError(
        f"cannot {action}: store {url} is served over HTTP(S), which is read-only",
        hint="publish to the s3:// bucket or folder the web host serves (--store or WARP_STORE), "
             "then read it back over HTTP", store=url)


class _MemoryBackend(_Backend):
    def put_if_absent(self, key: str, data: bytes) -> bool:
        with _MEMORY_LOCK:
            if self.fs.exists(self.path(key)):
                return False
            self.fs.pipe_file(self.path(key), bytes(data))
            return True

    def put_file_if_absent(self, key: str, local: str) -> bool:
        with open(local, "rb") as f:
            return self.put_if_absent(key, f.read())

    def write_if(self, key: str, data: bytes, token: str | None) -> str | None:
        with _MEMORY_LOCK:
            current = self.read_versioned(key)
            if (current[1] if current else None) != token:
                return None
            self.fs.pipe_file(self.path(key), bytes(data))
        return hashlib.sha256(data).hexdigest()


_CONFLICT_CODES = {"PreconditionFailed", "412", "ConditionalRequestConflict", "409"}


class _S3Backend(_Backend):
    """s3fs for blob traffic; a boto3 client for the ETag-conditional ``latest`` pointer."""

    def __init__(self, fs: Any, root: str, config: StorageConfig) -> None:
        super().__init__(fs, root)
        self.config = config
        self.bucket, _, self.prefix = self.root.partition("/")
        self._client = None

    @property
    def client(self):
        if self._client is None:
            self._client = boto3_client(self.config)
        return self._client

    def _key(self, key: str) -> str:
        return f"{self.prefix}/{key}" if self.prefix else key

    # s3fs answers exists/size (and whole-object cat_file, which sizes first)
    # from its listings cache; another process may have written since that
    # listing, so point lookups drop the cached entry first.
    def exists(self, key: str) -> bool:
        """One HEAD of the object (s3fs's exists() LISTs the key as a "directory" after a 404)."""
        from botocore.exceptions import ClientError

        try:
            self.client.head_object(Bucket=self.bucket, Key=self._key(key))
        except ClientError as e:
            status = str(e.response.get("ResponseMetadata", {}).get("HTTPStatusCode", ""))
            if status == "404" or e.response.get("Error", {}).get("Code") in ("NoSuchKey", "404", "NotFound"):
                return False
            raise
        return True

    def list_keys(self, prefix: str, max_pages: int) -> set[str] | None:
        """Every key under ``prefix`` (relative to the store root), or None past ``max_pages`` LIST pages."""
        out: set[str] = set()
        token = None
        base = self._key(prefix)
        strip = len(self._key(""))
        for _ in range(max_pages):
            kw = {"Bucket": self.bucket, "Prefix": base, "MaxKeys": 1000}
            if token:
                kw["ContinuationToken"] = token
            r = self.client.list_objects_v2(**kw)
            out.update(o["Key"][strip:] for o in r.get("Contents", ()))
            if not r.get("IsTruncated"):
                return out
            token = r.get("NextContinuationToken")
        return None

    def get(self, key: str) -> bytes:
        self.fs.invalidate_cache(self.path(key))
        return super().get(key)

    def size(self, key: str) -> int:
        self.fs.invalidate_cache(self.path(key))
        return super().size(key)

    def get_range(self, key: str, start: int, end: int) -> bytes:
        # S3 answers a range that starts at or past the end with 416 (s3fs: OSError EINVAL);
        # the other backends, like a file's read(), return what is there: nothing
        try:
            return super().get_range(key, start, end)
        except OSError as e:
            if e.errno == errno.EINVAL and start >= self.size(key):
                return b""
            raise

    def put_if_absent(self, key: str, data: bytes) -> bool:
        try:
            self.fs.pipe_file(self.path(key), bytes(data), mode="create")
        except FileExistsError:
            return False
        return True

    def put_file_if_absent(self, key: str, local: str) -> bool:
        try:
            self.fs.put_file(local, self.path(key), mode="create")
        except FileExistsError:
            return False
        return True

    def read_versioned(self, key: str) -> tuple[bytes, str] | None:
        from botocore.exceptions import ClientError

        try:
            r = self.client.get_object(Bucket=self.bucket, Key=self._key(key))
        except ClientError as e:
            if e.response.get("Error", {}).get("Code") in ("NoSuchKey", "404"):
                return None
            raise
        return r["Body"].read(), r["ETag"]

    def write_if(self, key: str, data: bytes, token: str | None) -> str | None:
        from botocore.exceptions import ClientError

        cond = {"IfMatch": token} if token is not None else {"IfNoneMatch": "*"}
        try:
            r = self.client.put_object(Bucket=self.bucket, Key=self._key(key), Body=data,
                                       ContentType="application/json", **cond)
        except ClientError as e:
            err = e.response.get("Error", {})
            status = str(e.response.get("ResponseMetadata", {}).get("HTTPStatusCode", ""))
            if err.get("Code") in _CONFLICT_CODES or status in ("412", "409"):
                return None
            if token is not None and err.get("Code") in ("NoSuchKey", "404"):
                return None
            raise
        self.fs.invalidate_cache(self.path(key))
        return r["ETag"]


# -- local lock with stale-holder detection ---------------------------------

class FileLock:
    """An exclusive lock file holding ``{"pid", "host", "time", "id"}``.

    Acquired with ``O_CREAT | O_EXCL``. A lock is *stale* when its holder is
    a dead process on this host, or when it is older than ``stale_after``
    seconds (a holder on another host, or a reused pid); a stale lock is
    moved aside with an atomic rename (so two breakers cannot both win) and
    removed. Waiting longer than ``timeout`` raises LockTimeoutError naming
    the holder.
    """

    def __init__(self, path: str | os.PathLike, *, stale_after: float = 30.0, timeout: float = 60.0) -> None:
        self.path = os.fspath(path)
        self.stale_after = stale_after
        self.timeout = timeout
        self.id = uuid.uuid4().hex

    def _record(self) -> bytes:
        return json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "time": time.time(),
                           "id": self.id}).encode()

    @staticmethod
    def holder_is_stale(raw: bytes, stale_after: float) -> bool:
        try:
            info = json.loads(raw)
            pid, host, t = int(info["pid"]), str(info["host"]), float(info["time"])
        except (ValueError, KeyError, TypeError):
            return True  # a half-written or garbage lock file: its writer died mid-write
        if time.time() - t > stale_after:
            return True
        if host == socket.gethostname():
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return True
            except PermissionError:
                return False
        return False

    def acquire(self) -> None:
        os.makedirs(os.path.dirname(self.path) or ".", exist_ok=True)
        deadline = time.monotonic() + self.timeout
        delay = 0.001
        while True:
            try:
                fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                self._maybe_break()
            else:
                with os.fdopen(fd, "wb") as f:
                    f.write(self._record())
                return
            if time.monotonic() > deadline:
                raise LockTimeoutError(
                    f"lock {self.path} is held by a live process: {self._holder_text()}",
                    hint=f"wait for it to finish; if that process is gone, delete {self.path}")
            time.sleep(delay)
            delay = min(delay * 2, 0.05)

    def _holder_text(self) -> str:
        try:
            with open(self.path, "rb") as f:
                return f.read().decode("utf-8", "replace")
        except OSError:
            return "(released)"

    def _maybe_break(self) -> None:
        try:
            with open(self.path, "rb") as f:
                raw = f.read()
        except FileNotFoundError:
            return
        if not raw:
            # the holder may be between open() and write(): judge emptiness by age only
            try:
                if time.time() - os.stat(self.path).st_mtime < min(self.stale_after, 5.0):
                    return
            except FileNotFoundError:
                return
        elif not self.holder_is_stale(raw, self.stale_after):
            return
        aside = f"{self.path}.stale-{self.id}"
        try:
            os.rename(self.path, aside)
        except FileNotFoundError:
            return
        with open(aside, "rb") as f:
            moved = f.read()
        if moved != raw:
            # between our read and rename a new holder took the lock: give it back
            with contextlib.suppress(FileExistsError):
                os.link(aside, self.path)
        os.unlink(aside)

    def release(self) -> None:
        try:
            with open(self.path, "rb") as f:
                info = json.loads(f.read() or b"{}")
        except (FileNotFoundError, ValueError):
            return
        if info.get("id") == self.id:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.path)

    def __enter__(self) -> FileLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


# -- the store ---------------------------------------------------------------

class Store:
    """A dataset store at ``url`` (default: ``WARP_STORE`` / the XDG data dir).

    All methods are safe to call from several threads and processes at once;
    see the module docstring for what each write guarantees.
    """

    def __init__(self, url: str | os.PathLike | None = None, *, config: StorageConfig | None = None,
                 stale_lock_after: float = 30.0) -> None:
        self.location: Location = parse_location(url if url is not None else envvars.default_store())
        self.config = config or StorageConfig.from_env()
        if self.location.read_only:
            self.fs = None
            self._b: _Backend = _HttpBackend(self.location)
            return
        self.fs = filesystem(self.location, self.config)
        if self.location.protocol == "file":
            self._b = _LocalBackend(self.fs, self.location.path, stale_lock_after)
        elif self.location.protocol == "memory":
            self._b = _MemoryBackend(self.fs, self.location.path)
        else:
            self._b = _S3Backend(self.fs, self.location.path, self.config)

    def __repr__(self) -> str:
        return f"Store({self.url!r})"

    @property
    def url(self) -> str:
        return self.location.url

    @property
    def protocol(self) -> str:
        return self.location.protocol

    @property
    def read_only(self) -> bool:
        return self.location.read_only

    def require_writable(self, action: str = "publish") -> None:
        """Raise ReadOnlyStoreError (exit 78) before any work when this store takes no writes."""
        if self.read_only:
            raise read_only_error(self.url, f"{action} to {self.url}")

    # -- keys ------------------------------------------------------------
    @staticmethod
    def manifest_key(dataset_id: str, version_hash: str) -> str:
        return f"datasets/{validate_dataset_id(dataset_id)}/versions/{validate_hash(version_hash, 'version hash')}.json"

    @staticmethod
    def latest_key(dataset_id: str) -> str:
        return f"datasets/{validate_dataset_id(dataset_id)}/latest.json"

    def url_of(self, key: str) -> str:
        """Full URL of a store key, for DuckDB/pyarrow/fsspec (local: an absolute path)."""
        if self.location.protocol == "file":
            return self._b.path(key)
        return f"{self.location.protocol}://{self._b.path(key).lstrip('/')}"

    def blob_url(self, hash_hex: str) -> str:
        return self.url_of(blob_key(hash_hex))

    def blob_path(self, hash_hex: str) -> str:
        """The blob's path inside ``self.fs`` (for ``fs.open`` / ``fs.cat_ranges``)."""
        return self._b.path(blob_key(hash_hex))

    def _call(self, fn, what: str, action: str, *args: Any):
        try:
            return fn(*args)
        except FileNotFoundError:
            raise
        except Exception as e:
            err = translate_storage_error(e, what, action)
            if err is e:
                raise
            raise err from e

    # -- objects by key ------------------------------------------------------
    # The storage interface under the dataset contract: get, put create-only, compare-and-swap and
    # remove of one object by its key under the store root; callers (the doctor's probes) use these,
    # never a backend's members. Untyped client errors come back typed as in :meth:`_call`.
    def get_object(self, key: str) -> bytes:
        """The object's bytes (FileNotFoundError when there is none)."""
        return self._call(self._b.get, self.url_of(key), "read", key)

    def put_object(self, key: str, data: bytes) -> bool:
        """Create-only write: True when written, False when an object was already there (kept)."""
        return bool(self._call(self._b.put_if_absent, self.url_of(key), "write", key, bytes(data)))

    def swap_object(self, key: str, data: bytes, token: str | None) -> str | None:
        """Compare-and-swap: write ``data`` if the object's version token is still ``token`` (None: no
        object yet); the new token, or None when another writer changed it first."""
        return self._call(self._b.write_if, self.url_of(key), "write", key, bytes(data), token)

    def remove_prefix(self, prefix: str) -> None:
        """Remove every object under ``prefix`` (a probe's scratch folder); read-only stores refuse."""
        self.require_writable("remove objects")
        self._call(lambda: self.fs.rm(self.location.join(prefix).path, recursive=True), self.url_of(prefix),
                   "write")

    # -- blobs -------------------------------------------------------------
    def has_blob(self, hash_hex: str) -> bool:
        return bool(self._call(self._b.exists, self.blob_url(hash_hex), "read", blob_key(hash_hex)))

    def missing_blobs(self, hashes: Iterable[str], *, workers: int = 16) -> list[str]:
        """The subset of ``hashes`` the store lacks, in input order (parallel existence checks)."""
        hs = list(dict.fromkeys(hashes))
        if self.location.protocol not in ("s3", "http", "https") or len(hs) < 2:
            return [h for h in hs if not self.has_blob(h)]
        if self.read_only:  # no listing: one HEAD per blob, in parallel
            with ThreadPoolExecutor(max_workers=min(workers, len(hs))) as ex:
                present = list(ex.map(self.has_blob, hs))
            return [h for h, p in zip(hs, present, strict=True) if not p]
        # A LIST page names up to 1,000 blobs: when the store's blobs fit in a few pages, listing
        # them costs far fewer requests than one HEAD per blob (a first publish: one request).
        # Past len(hs) // 8 pages it gives up and checks each blob by HEAD.
        try:
            listed = self._b.list_keys("blobs/", max(1, len(hs) // 8))  # type: ignore[attr-defined]
        except Exception:  # e.g. credentials without s3:ListBucket: the HEADs below say what is wrong
            listed = None
        if listed is not None:
            return [h for h in hs if blob_key(h) not in listed]
        with ThreadPoolExecutor(max_workers=min(workers, len(hs))) as ex:
            present = list(ex.map(self.has_blob, hs))
        return [h for h, p in zip(hs, present, strict=True) if not p]

    def put_blob(self, hash_hex: str, data: bytes | bytearray | memoryview, *, verify: bool = True) -> bool:
        """Create-only upload of bytes; True if written, False if the blob was already there."""
        if verify and hashlib.sha256(data).hexdigest() != hash_hex:
            raise BlobCorruptedError(f"bytes given for blob {hash_hex} hash to {hashlib.sha256(data).hexdigest()}",
                                     hint="this is a bug in the caller: blobs are named by their SHA-256")
        key = blob_key(hash_hex)
        return bool(self._call(self._b.put_if_absent, self.url_of(key), "write", key, bytes(data)))

    def remove_stale_temps(self, older_than: float | None = None) -> list[str]:
        """Remove ``.warp-tmp-*`` leftovers of killed writers under a local store's ``blobs/`` and ``datasets/``.

        Temporaries of live processes (pid in the name) and anything changed
        after ``older_than`` (default: now) stay. Remote stores write objects
        whole and keep nothing to clean: an empty list. The ``warp cache gc``
        hook (docs/formats/registry.md).
        """
        if self.location.protocol != "file":
            return []
        from warpdata.core.atomic import remove_stale_temps

        root = self.location.path
        return remove_stale_temps([os.path.join(root, "blobs"), os.path.join(root, "datasets")],
                                  older_than=older_than, recursive=True)

    def put_blob_file(self, hash_hex: str, local_path: str | os.PathLike) -> bool:
        """Create-only upload of a local file already known to hash to ``hash_hex``."""
        key = blob_key(hash_hex)
        return bool(self._call(self._b.put_file_if_absent, self.url_of(key), "write", key, os.fspath(local_path)))

    def get_blob(self, hash_hex: str, *, verify: bool = True) -> bytes:
        key = blob_key(hash_hex)
        try:
            data = self._call(self._b.get, self.url_of(key), "read", key)
        except FileNotFoundError:
            raise BlobNotFoundError(f"blob {hash_hex} is missing from store {self.url}",
                                    hint="the version was published incompletely or the blob was deleted; republish it") from None
        if verify:
            got = hashlib.sha256(data).hexdigest()
            if got != hash_hex:
                raise BlobCorruptedError(f"blob {self.url_of(key)} hashes to {got}, not {hash_hex}",
                                         hint="the stored copy is corrupt; republish the dataset to replace it",
                                         expected=hash_hex, computed=got)
        return data

    def read_range(self, hash_hex: str, start: int, length: int) -> bytes:
        """``length`` bytes of a blob from ``start`` (one ranged GET on S3); fewer where the blob
        ends first, as ``data[start:start + length]`` would give."""
        key = blob_key(hash_hex)
        if start < 0 or length < 0:
            from warpdata.core.errors import UsageError

            raise UsageError(f"read_range of blob {hash_hex}: start {start} and length {length} must be >= 0",
                             hint="this is a bug in the caller")
        if length == 0:  # fsspec reads a whole S3 object for an empty range: answer without a read
            self.blob_size(hash_hex)  # a missing blob is still an error
            return b""
        try:
            return self._call(self._b.get_range, self.url_of(key), "read", key, start, start + length)
        except FileNotFoundError:
            raise BlobNotFoundError(f"blob {hash_hex} is missing from store {self.url}",
                                    hint="republish the dataset") from None

    def blob_size(self, hash_hex: str) -> int:
        key = blob_key(hash_hex)
        try:
            return self._call(self._b.size, self.url_of(key), "read", key)
        except FileNotFoundError:
            raise BlobNotFoundError(f"blob {hash_hex} is missing from store {self.url}",
                                    hint="republish the dataset") from None

    def open_blob(self, hash_hex: str):
        """A seekable binary file object over the blob (ranged reads on S3 and HTTP)."""
        if self.read_only:
            return self._b.remote.open(blob_key(hash_hex))  # type: ignore[attr-defined]
        try:
            return self._call(self.fs.open, self.blob_url(hash_hex), "read", self.blob_path(hash_hex), "rb")
        except FileNotFoundError:
            raise BlobNotFoundError(f"blob {hash_hex} is missing from store {self.url}",
                                    hint="republish the dataset") from None

    # -- manifests ---------------------------------------------------------
    def has_manifest(self, dataset_id: str, version_hash: str) -> bool:
        key = self.manifest_key(dataset_id, version_hash)
        return bool(self._call(self._b.exists, self.url_of(key), "read", key))

    def put_manifest(self, manifest: Manifest) -> bool:
        """Create-only write of a validated manifest at its hash; False if it already existed."""
        data = manifest.to_bytes()
        key = self.manifest_key(manifest.dataset_id, manifest.version_hash)
        return bool(self._call(self._b.put_if_absent, self.url_of(key), "write", key, data))

    def get_manifest_bytes(self, dataset_id: str, version_hash: str) -> bytes:
        key = self.manifest_key(dataset_id, version_hash)
        try:
            return self._call(self._b.get, self.url_of(key), "read", key)
        except FileNotFoundError:
            raise DatasetNotFoundError(
                f"version {version_hash} of {dataset_id} is not in store {self.url}",
                hint=f"list versions with 'warp ls {dataset_id.split('/')[0]}/' or omit the version for latest") from None

    def get_manifest(self, dataset_id: str, version_hash: str) -> Manifest:
        """Fetch, validate and hash-check one version."""
        data = self.get_manifest_bytes(dataset_id, version_hash)
        m = Manifest.from_bytes(data, source=self.url_of(self.manifest_key(dataset_id, version_hash)),
                                expected_hash=version_hash)
        if m.dataset_id != dataset_id:
            raise ManifestCorruptedError(f"manifest stored under {dataset_id} names dataset {m.dataset_id}",
                                         hint="the store was edited by hand; republish the dataset")
        return m

    def list_versions(self, dataset_id: str) -> list[str]:
        names = self._call(self._b.list_names, self.url, "list", f"datasets/{validate_dataset_id(dataset_id)}/versions")
        return [n[:-5] for n in names if n.endswith(".json") and HASH_RE.match(n[:-5])]

    def resolve_version(self, dataset_id: str, version: str | None = None) -> str:
        """A full version hash: ``version`` (full or a unique prefix of ≥ 6 hex) or the latest one."""
        if version is None or version == "latest":
            ptr = self.read_latest(dataset_id)
            if ptr is None:
                raise self.not_found(dataset_id)
            return ptr.version_hash
        if HASH_RE.match(version):
            return version
        matches = [v for v in self.list_versions(dataset_id) if v.startswith(version)] if len(version) >= 6 else []
        if len(matches) == 1:
            return matches[0]
        if not matches:
            raise DatasetNotFoundError(f"{dataset_id} has no version starting with {version!r} in {self.url}",
                                       hint="give at least 6 hex digits of a published version hash")
        raise DatasetNotFoundError(f"{version!r} matches {len(matches)} versions of {dataset_id}",
                                   hint="give more hex digits of the version hash")

    def resolve(self, dataset_id: str, version: str | None = None) -> Manifest:
        """The manifest of ``version`` (default: latest) of ``dataset_id``."""
        return self.get_manifest(dataset_id, self.resolve_version(dataset_id, version))

    def not_found(self, dataset_id: str) -> DatasetNotFoundError:
        """The error for ``dataset_id`` having no ``latest`` here, with close names where the store lists."""
        import difflib

        from warpdata.storage.locations import missing_store_folder

        missing = missing_store_folder(self.location)
        if missing:
            return DatasetNotFoundError(f"dataset {dataset_id}: {missing[0]}", hint=missing[1])
        if self.read_only:
            return DatasetNotFoundError(f"dataset {dataset_id} is not published in store {self.url} "
                                        "(no latest pointer)",
                                        hint="check the spelling of workspace/name and the store URL; an "
                                             "HTTP store cannot be listed for close names")
        versions: list[str] = []
        with contextlib.suppress(Exception):
            versions = self.list_versions(dataset_id)
        if versions:  # published with --no-set-latest: it exists, it just has no `latest`
            shown = ", ".join(v[:12] for v in versions[:3]) + (", ..." if len(versions) > 3 else "")
            return DatasetNotFoundError(
                f"dataset {dataset_id} has {len(versions)} version(s) in store {self.url} but no latest "
                f"pointer (published with --no-set-latest?): {shown}",
                hint=f"pick one with --version (CLI) or version= (library), e.g. --version {versions[0][:12]}; "
                     f"'warp ls {dataset_id.split('/')[0]}/' lists them", versions=versions)
        known = []
        with contextlib.suppress(Exception):
            known = self.list_datasets()
        close = [d for d in difflib.get_close_matches(dataset_id, known, n=4) if d != dataset_id][:3]
        hint = (f"did you mean {', '.join(close)}?" if close
                else "check the spelling of workspace/name, or publish it with 'warp publish'")
        return DatasetNotFoundError(f"dataset {dataset_id} is not published in store {self.url} "
                                    "(no latest pointer)", hint=hint)

    # -- latest pointer ----------------------------------------------------------
    def read_latest(self, dataset_id: str) -> LatestPointer | None:
        key = self.latest_key(dataset_id)
        got = self._call(self._b.read_versioned, self.url_of(key), "read", key)
        if got is None:
            return None
        data, token = got
        try:
            doc = json.loads(data)
            vh = doc["version_hash"]
            if doc.get("kind") != LATEST_KIND or doc.get("dataset_id") != dataset_id or not HASH_RE.match(vh):
                raise ValueError("fields")
        except (ValueError, KeyError, TypeError):
            raise ManifestCorruptedError(f"{self.url_of(key)} is not a valid latest pointer",
                                         hint=f"republish {dataset_id} with --set-latest to rewrite it") from None
        return LatestPointer(dataset_id, vh, str(doc.get("updated_at", "")), token)

    def cas_latest(self, dataset_id: str, version_hash: str, expected: LatestPointer | None) -> LatestPointer | None:
        """Point ``latest`` at ``version_hash`` if it is still ``expected`` (None: no pointer yet).

        Returns the new pointer, or None when another writer moved it first.
        """
        key = self.latest_key(dataset_id)
        validate_hash(version_hash, "version hash")
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        data = canonical_json({"kind": LATEST_KIND, "dataset_id": dataset_id, "version_hash": version_hash,
                               "updated_at": now})
        token = self._call(self._b.write_if, self.url_of(key), "write", key, data,
                           expected.token if expected else None)
        return None if token is None else LatestPointer(dataset_id, version_hash, now, token)

    def set_latest(self, dataset_id: str, version_hash: str, *, attempts: int = 50,
                   check_manifest: bool = True) -> LatestPointer:
        """Move ``latest`` to ``version_hash`` with compare-and-swap, retrying on contention.

        Refuses (DatasetNotFoundError) when that version's manifest is not in
        the store, so ``latest`` never points at a missing version.
        """
        if check_manifest and not self.has_manifest(dataset_id, version_hash):
            raise DatasetNotFoundError(f"version {version_hash} of {dataset_id} is not in store {self.url}",
                                       hint="publish the version before pointing latest at it")
        delay = 0.005
        for _ in range(attempts):
            current = self.read_latest(dataset_id)
            if current is not None and current.version_hash == version_hash:
                return current
            new = self.cas_latest(dataset_id, version_hash, current)
            if new is not None:
                return new
            time.sleep(delay * (0.5 + uuid.uuid4().int % 1000 / 1000))  # jitter: racing writers spread out
            delay = min(delay * 2, 0.5)
        raise LockTimeoutError(f"could not move latest of {dataset_id}: {attempts} concurrent updates won first",
                               hint="retry the publish; another publisher is updating the same dataset")

    # -- listing -------------------------------------------------------------------
    def list_datasets(self, workspace: str | None = None) -> list[str]:
        """Dataset ids with at least one stored version or a latest pointer, sorted."""
        workspaces = [validate_workspace(workspace)] if workspace is not None else \
            self._call(self._b.list_names, self.url, "list", "datasets")
        out = []
        for ws in workspaces:
            for name in self._call(self._b.list_names, self.url, "list", f"datasets/{ws}"):
                did = f"{ws}/{name}"
                with contextlib.suppress(Exception):
                    validate_dataset_id(did)
                    out.append(did)
        return sorted(out)

    def iter_latest(self, workspace: str | None = None) -> Iterator[tuple[str, LatestPointer | None]]:
        for did in self.list_datasets(workspace):
            yield did, self.read_latest(did)


def open_store(url: str | os.PathLike | None = None, config: StorageConfig | None = None) -> Store:
    """The store at ``url``, or the default one (``WARP_STORE`` / XDG data dir)."""
    return Store(url, config=config)
