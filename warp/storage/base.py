"""The one storage interface: objects by key under a store root, one class per protocol.

:class:`ObjectStore` is what every protocol module implements (``local``, ``memory``, ``s3``,
``http``): whole get, ranged get, size, exists, create-only put (of bytes or a local file),
compare-and-swap (:meth:`ObjectStore.read_versioned` gives the token, ``write_if`` presents
it), list one level, delete. :func:`open_object_store` picks the class for a URL. The registry
builds the dataset contract (manifests, versions, ``latest``) on this interface
(warp/registry/store.py) and nothing here imports it. Writes are create-only where the
dataset contract needs them (blobs, manifests): docs/formats/registry.md.
"""

from __future__ import annotations

import abc
import contextlib
import hashlib
import os
from typing import Any

from warpdata.core.errors import ConfigError
from warpdata.core.registry import load
from warpdata.storage.locations import (
    Location,
    StorageConfig,
    filesystem,
    parse_location,
)
from warpdata.storage.policy import RequestStats
from warpdata.storage.remote import Remote

__all__ = ["PROTOCOLS", "ObjectStore", "open_object_store"]


class ObjectStore(abc.ABC):
    """Objects by key under the store root ``location`` (each protocol overrides what it does better
    than the generic fsspec calls here).

    One object serves one store URL for reads and writes alike: :attr:`remote` is its reader (ranged
    and whole gets under the request policy, :mod:`warpdata.storage.policy`) and :attr:`stats` the one
    set of counters every request of this store is counted in, the reader's and the writer's.
    """

    def __init__(self, location: Location, config: StorageConfig) -> None:
        self.location = location
        self.config = config
        self.root = location.path.rstrip("/")
        self.stats = RequestStats()
        self._fs: Any = None
        self._remote: Any = None

    @classmethod
    def for_location(cls, location: Location, config: StorageConfig, *, stale_lock_after: float) -> ObjectStore:
        """The store at ``location`` as :func:`open_object_store` makes it (``stale_lock_after``: seconds
        after which a lock file left by a dead writer is taken over, for protocols that lock)."""
        return cls(location, config)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.url!r})"

    @property
    def url(self) -> str:
        return self.location.url

    @property
    def fs(self) -> Any:
        """The fsspec filesystem under this store, made on first use (s3fs costs a botocore import,
        which a read that never writes or lists does not pay)."""
        if self._fs is None:
            self._fs = filesystem(self.location, self.config)
        return self._fs

    @property
    def remote(self):
        """This store's reader (:class:`~warpdata.storage.remote.Remote`): whole, ranged and streamed
        gets under the request policy, counted in :attr:`stats`; made on first use."""
        if self._remote is None:
            self._remote = Remote(self.location, config=self.config, stats=self.stats)
        return self._remote

    def url_of(self, key: str) -> str:
        """The full URL of ``key`` (an absolute path on a local store)."""
        return self.path(key) if self.location.protocol == "file" else \
            f"{self.location.protocol}://{self.path(key).lstrip('/')}"

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
        self.stats.request("LIST")
        with contextlib.suppress(AttributeError):
            self.fs.invalidate_cache(p)
        try:
            entries = self.fs.ls(p, detail=False)
        except FileNotFoundError:
            return []
        return sorted({e.rstrip("/").rsplit("/", 1)[-1] for e in entries})

    def open(self, key: str, size: int | None = None):
        """Random access to the object by ranged reads under the request policy
        (:class:`~warpdata.storage.remote.RangeFile`; its size from the caller, else one HEAD)."""
        return self.remote.open(key, size)

    def list_keys(self, prefix: str, max_pages: int) -> set[str] | None:
        """Every key under ``prefix`` when at most ``max_pages`` listing requests name them all, else
        None (the caller asks for each key instead); protocols without paged listings answer None."""
        return None

    def list_objects(self, prefix: str) -> list[tuple[str, int, float]]:
        """``(key, size, modified)`` of every object under ``prefix``, at any depth (``modified``: the
        object's last-modified time, seconds since the epoch; S3: ``LastModified``). The garbage
        collector's listing (warp/registry/gc.py)."""
        base = self.path(prefix).rstrip("/")
        self.stats.request("LIST")
        with contextlib.suppress(AttributeError):
            self.fs.invalidate_cache(base)
        try:
            found = self.fs.find(base, detail=True)
        except FileNotFoundError:
            return []
        b = base.lstrip("/")
        out = []
        for path, info in found.items():
            p = path.lstrip("/")
            if info.get("type") == "directory" or not p.startswith(b):
                continue
            when = info.get("mtime", info.get("LastModified", info.get("created", 0.0)))
            if hasattr(when, "timestamp"):
                when = when.timestamp()
            out.append((prefix.rstrip("/") + p[len(b):], int(info.get("size") or 0), float(when or 0.0)))
        return sorted(out)

    def read_versioned(self, key: str) -> tuple[bytes, str] | None:
        """The bytes and a version token (their SHA-256; S3 uses the ETag); None if absent."""
        try:
            data = self.get(key)
        except FileNotFoundError:
            return None
        return data, hashlib.sha256(data).hexdigest()

    def delete(self, key: str) -> None:
        """Remove the object (nothing when it is not there)."""
        with contextlib.suppress(FileNotFoundError):
            self.fs.rm_file(self.path(key))

    # each protocol: put_if_absent (create-only), put_file_if_absent, write_if (compare-and-swap)
    @abc.abstractmethod
    def put_if_absent(self, key: str, data: bytes) -> bool:
        """Write ``data`` under ``key`` unless an object is there: True when this call created it."""

    @abc.abstractmethod
    def put_file_if_absent(self, key: str, local: str) -> bool:
        """:meth:`put_if_absent` of a local file's bytes, streamed."""

    @abc.abstractmethod
    def write_if(self, key: str, data: bytes, token: str | None) -> str | None:
        """Compare-and-swap: write when the object's version token is still ``token`` (None: absent);
        the new token, or None when another writer got there first."""


# Each protocol's ObjectStore by dotted path, imported when a URL of that protocol is first opened
# (the habit of warp/artifacts/kinds.py): each protocol module imports this one for ObjectStore, so
# naming them here instead of importing them keeps warp/storage free of import cycles, and opening a
# local store does not import the S3 or HTTP code. A new protocol is one line here (CONTRIBUTING.md).
PROTOCOLS: dict[str, str] = {
    "file": "warpdata.storage.local:LocalObjectStore",
    "memory": "warpdata.storage.memory:MemoryObjectStore",
    "s3": "warpdata.storage.s3:S3ObjectStore",
    "http": "warpdata.storage.http:HttpObjectStore",
    "https": "warpdata.storage.http:HttpObjectStore",
}


def open_object_store(url: str | os.PathLike | Location, config: StorageConfig | None = None, *,
                      stale_lock_after: float = 30.0) -> ObjectStore:
    """The :class:`ObjectStore` of a store URL (local path, ``file://``, ``s3://``, ``memory://``,
    ``http(s)://``); S3 configured from ``config`` or the environment."""
    loc = url if isinstance(url, Location) else parse_location(url)
    config = config or StorageConfig.from_env()
    if loc.protocol not in PROTOCOLS:
        raise ConfigError(f"store {loc.url}: no store protocol {loc.protocol!r}",
                          hint=f"warp opens the protocols {', '.join(PROTOCOLS)}")
    cls = load(PROTOCOLS[loc.protocol], "store protocol")
    return cls.for_location(loc, config, stale_lock_after=stale_lock_after)
