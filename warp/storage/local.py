"""Local folder stores: create-only writes by ``link()`` of a finished temp file, compare-and-swap
under a lock file (:class:`~warpdata.storage.locks.FileLock`), atomic renames; the on-disk layout is
docs/formats/registry.md's."""

from __future__ import annotations

import contextlib
import hashlib
import os

from warpdata.core.atomic import atomic_write_bytes, create_exclusive
from warpdata.storage.base import ObjectStore
from warpdata.storage.locations import Location, StorageConfig
from warpdata.storage.locks import FileLock

__all__ = ["LocalObjectStore"]


class LocalObjectStore(ObjectStore):
    def __init__(self, location: Location, config: StorageConfig, stale_after: float) -> None:
        super().__init__(location, config)
        self.stale_after = stale_after

    @classmethod
    def for_location(cls, location: Location, config: StorageConfig, *, stale_lock_after: float) -> LocalObjectStore:
        return cls(location, config, stale_lock_after)

    def exists(self, key: str) -> bool:
        return os.path.exists(self.path(key))

    def get(self, key: str) -> bytes:
        with open(self.path(key), "rb") as f:
            return f.read()

    def put_if_absent(self, key: str, data: bytes) -> bool:
        return create_exclusive(self.path(key), data)

    def delete(self, key: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path(key))

    def list_objects(self, prefix: str) -> list[tuple[str, int, float]]:
        """``(key, size, mtime)`` of every file under ``prefix`` (one ``stat`` each), temporaries of
        writers (``.warp-tmp-*``) and lock files left out."""
        base = self.path(prefix).rstrip("/")
        self.stats.request("LIST")
        out = []
        for dirpath, _dirs, files in os.walk(base):
            for name in files:
                if name.startswith(".warp-tmp-") or name.endswith(".lock"):
                    continue
                full = os.path.join(dirpath, name)
                with contextlib.suppress(FileNotFoundError):  # removed since the walk listed it
                    st = os.stat(full)
                    out.append((os.path.relpath(full, self.root).replace(os.sep, "/"), st.st_size, st.st_mtime))
        return sorted(out)

    def put_file_if_absent(self, key: str, local: str) -> bool:
        if os.path.exists(self.path(key)):
            return False
        return create_exclusive(self.path(key), source=local)

    def write_if(self, key: str, data: bytes, token: str | None) -> str | None:
        path = self.path(key)
        with FileLock(path + ".lock", stale_after=self.stale_after):
            current = self.read_versioned(key)
            if (current[1] if current else None) != token:
                return None
            atomic_write_bytes(path, data)
        return hashlib.sha256(data).hexdigest()
