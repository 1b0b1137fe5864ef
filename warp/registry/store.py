"""Dataset stores: content-addressed blobs, immutable manifests, a mutable ``latest``.

A :class:`Store` is a root URL (local directory, ``s3://bucket/prefix``,
``memory://name``, or ``http(s)://host/prefix`` read-only; default :func:`warpdata.core.envvars.default_store`, i.e.
``WARP_STORE`` or ``$XDG_DATA_HOME/warp/store``) with this layout::

    blobs/sha256/<h[:2]>/<h>                          immutable, create-only
    datasets/<ws>/<name>/versions/<version_hash>.json  immutable, create-only
    datasets/<ws>/<name>/latest.json                   mutable, compare-and-swap

The objects themselves are kept by the storage layer's :class:`~warpdata.storage.base.ObjectStore`
of the URL (one class per protocol: ``warp/storage/local.py``, ``memory.py``, ``s3.py``,
``http.py``); this module holds the dataset contract on top of it. Guarantees, per protocol:

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
  (:class:`~warpdata.registry.manifest.Manifest.from_bytes`) and, with
  ``WARP_TRUSTED_KEYS`` set, that a trusted key signed the version
  (:func:`warpdata.registry.signing.require_trusted`, exit 77).
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
import hashlib
import os
import time
import uuid
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from warpdata.core import envvars
from warpdata.core.atomic import remove_stale_temps
from warpdata.core.canonical import canonical_json
from warpdata.core.errors import (
    BlobCorruptedError,
    BlobNotFoundError,
    DatasetNotFoundError,
    LockTimeoutError,
    ManifestCorruptedError,
    UsageError,
)
from warpdata.core.jsondoc import MAX_POINTER_BYTES, load_json
from warpdata.registry.manifest import (
    HASH_RE,
    Manifest,
    blob_key,
    validate_dataset_id,
    validate_hash,
    validate_workspace,
)
from warpdata.registry.signing import require_trusted
from warpdata.storage.base import ObjectStore, open_object_store
from warpdata.storage.errors import translate_storage_error
from warpdata.storage.http import read_only_error
from warpdata.storage.locations import Location, StorageConfig, missing_store_folder
from warpdata.storage.locks import FileLock

__all__ = ["FileLock", "LatestPointer", "Store", "open_store"]  # FileLock: warpdata.storage.locks

LATEST_KIND = "dataset-latest"


@dataclass(frozen=True)
class LatestPointer:
    """What ``latest.json`` says, plus the token a compare-and-swap must present."""

    dataset_id: str
    version_hash: str
    updated_at: str
    token: str  # S3 ETag / sha256 of the local file's bytes



# -- the store ---------------------------------------------------------------

class Store:
    """A dataset store at ``url`` (default: ``WARP_STORE`` / the XDG data dir).

    All methods are safe to call from several threads and processes at once;
    see the module docstring for what each write guarantees.
    """

    def __init__(self, url: str | os.PathLike | None = None, *, config: StorageConfig | None = None,
                 stale_lock_after: float = 30.0, objects: ObjectStore | None = None) -> None:
        """The store at ``url``, or the dataset contract over ``objects`` (an object store a reader
        already holds: one object, one request policy and one set of counters per URL)."""
        if objects is None:
            objects = open_object_store(url if url is not None else envvars.default_store(),
                                        config or StorageConfig.from_env(), stale_lock_after=stale_lock_after)
        # the storage layer's object store of this URL (warp/storage/base.py); the dataset contract below
        self._b: ObjectStore = objects
        self.location: Location = objects.location
        self.config = objects.config

    def __repr__(self) -> str:
        return f"Store({self.url!r})"

    @property
    def objects(self) -> ObjectStore:
        """The storage layer's object store under this dataset store (warp/storage/base.py)."""
        return self._b

    @property
    def fs(self):
        """The fsspec filesystem under the store (made on first use)."""
        return self._b.fs

    @property
    def stats(self):
        """The store's request counters (:class:`~warpdata.storage.policy.RequestStats`)."""
        return self._b.stats

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
        return self._b.url_of(key)

    def blob_url(self, hash_hex: str) -> str:
        return self.url_of(blob_key(hash_hex))

    def blob_path(self, hash_hex: str) -> str:
        """The blob's path inside ``self.fs`` (for ``fs.open`` / ``fs.cat_ranges``)."""
        return self._b.path(blob_key(hash_hex))

    def call(self, fn, what: str, action: str, *args: Any):
        """``fn(*args)``, its storage failures typed (auth, permission, unreachable) naming ``what``,
        the URL ``action`` (read, write, list) was for; FileNotFoundError passes through."""
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
    # never a backend's members. Untyped client errors come back typed as in :meth:`call`.
    def get_object(self, key: str) -> bytes:
        """The object's bytes (FileNotFoundError when there is none)."""
        return self.call(self._b.get, self.url_of(key), "read", key)

    def put_object(self, key: str, data: bytes) -> bool:
        """Create-only write: True when written, False when an object was already there (kept)."""
        return bool(self.call(self._b.put_if_absent, self.url_of(key), "write", key, bytes(data)))

    def swap_object(self, key: str, data: bytes, token: str | None) -> str | None:
        """Compare-and-swap: write ``data`` if the object's version token is still ``token`` (None: no
        object yet); the new token, or None when another writer changed it first."""
        return self.call(self._b.write_if, self.url_of(key), "write", key, bytes(data), token)

    def list_objects(self, prefix: str) -> list[tuple[str, int, float]]:
        """``(key, size, last-modified epoch seconds)`` of every object under ``prefix`` (S3: one LIST a
        1,000 keys); the garbage collector's listing (warp/registry/gc.py)."""
        return self.call(self._b.list_objects, self.url_of(prefix), "list", prefix)

    def delete_object(self, key: str) -> None:
        """Remove one object (nothing when it is not there); read-only stores refuse."""
        self.call(self._b.delete, self.url_of(key), "write", key)

    def remove_prefix(self, prefix: str) -> None:
        """Remove every object under ``prefix`` (a probe's scratch folder); read-only stores refuse."""
        self.require_writable("remove objects")
        self.call(lambda: self.fs.rm(self.location.join(prefix).path, recursive=True), self.url_of(prefix),
                   "write")

    # -- blobs -------------------------------------------------------------
    def has_blob(self, hash_hex: str) -> bool:
        return bool(self.call(self._b.exists, self.blob_url(hash_hex), "read", blob_key(hash_hex)))

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
            listed = self._b.list_keys("blobs/", max(1, len(hs) // 8))
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
        return bool(self.call(self._b.put_if_absent, self.url_of(key), "write", key, bytes(data)))

    def remove_stale_temps(self, older_than: float | None = None) -> list[str]:
        """Remove ``.warp-tmp-*`` leftovers of killed writers under a local store's ``blobs/`` and ``datasets/``.

        Temporaries of live processes (pid in the name) and anything changed
        after ``older_than`` (default: now) stay. Remote stores write objects
        whole and keep nothing to clean: an empty list. The ``warp cache gc``
        hook (docs/formats/registry.md).
        """
        if self.location.protocol != "file":
            return []

        root = self.location.path
        return remove_stale_temps([os.path.join(root, "blobs"), os.path.join(root, "datasets")],
                                  older_than=older_than, recursive=True)

    def put_blob_file(self, hash_hex: str, local_path: str | os.PathLike) -> bool:
        """Create-only upload of a local file already known to hash to ``hash_hex``."""
        key = blob_key(hash_hex)
        return bool(self.call(self._b.put_file_if_absent, self.url_of(key), "write", key, os.fspath(local_path)))

    def get_blob(self, hash_hex: str, *, verify: bool = True) -> bytes:
        key = blob_key(hash_hex)
        try:
            data = self.call(self._b.get, self.url_of(key), "read", key)
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
            raise UsageError(f"read_range of blob {hash_hex}: start {start} and length {length} must be >= 0",
                             hint="this is a bug in the caller")
        if length == 0:  # fsspec reads a whole S3 object for an empty range: answer without a read
            self.blob_size(hash_hex)  # a missing blob is still an error
            return b""
        try:
            return self.call(self._b.get_range, self.url_of(key), "read", key, start, start + length)
        except FileNotFoundError:
            raise BlobNotFoundError(f"blob {hash_hex} is missing from store {self.url}",
                                    hint="republish the dataset") from None

    def blob_size(self, hash_hex: str) -> int:
        key = blob_key(hash_hex)
        try:
            return self.call(self._b.size, self.url_of(key), "read", key)
        except FileNotFoundError:
            raise BlobNotFoundError(f"blob {hash_hex} is missing from store {self.url}",
                                    hint="republish the dataset") from None

    def open_blob(self, hash_hex: str):
        """A seekable binary file object over the blob (ranged reads on S3 and HTTP)."""
        if self.read_only:
            return self._b.open(blob_key(hash_hex))
        try:
            return self.call(self.fs.open, self.blob_url(hash_hex), "read", self.blob_path(hash_hex), "rb")
        except FileNotFoundError:
            raise BlobNotFoundError(f"blob {hash_hex} is missing from store {self.url}",
                                    hint="republish the dataset") from None

    # -- manifests ---------------------------------------------------------
    def has_manifest(self, dataset_id: str, version_hash: str) -> bool:
        key = self.manifest_key(dataset_id, version_hash)
        return bool(self.call(self._b.exists, self.url_of(key), "read", key))

    def put_manifest(self, manifest: Manifest) -> bool:
        """Create-only write of a validated manifest at its hash; False if it already existed."""
        data = manifest.to_bytes()
        key = self.manifest_key(manifest.dataset_id, manifest.version_hash)
        return bool(self.call(self._b.put_if_absent, self.url_of(key), "write", key, data))

    def get_manifest_bytes(self, dataset_id: str, version_hash: str) -> bytes:
        key = self.manifest_key(dataset_id, version_hash)
        try:
            return self.call(self._b.get, self.url_of(key), "read", key)
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
        require_trusted(m, self.url_of(self.manifest_key(dataset_id, version_hash)))  # WARP_TRUSTED_KEYS
        return m

    def list_versions(self, dataset_id: str) -> list[str]:
        names = self.call(self._b.list_names, self.url, "list", f"datasets/{validate_dataset_id(dataset_id)}/versions")
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
        got = self.call(self._b.read_versioned, self.url_of(key), "read", key)
        if got is None:
            return None
        data, token = got
        try:
            doc = load_json(data, self.url_of(key), max_bytes=MAX_POINTER_BYTES)
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
        token = self.call(self._b.write_if, self.url_of(key), "write", key, data,
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
            self.call(self._b.list_names, self.url, "list", "datasets")
        out = []
        for ws in workspaces:
            for name in self.call(self._b.list_names, self.url, "list", f"datasets/{ws}"):
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
