"""``memory://`` stores (fsspec's process-wide memory filesystem): create-only writes and
compare-and-swap under one process lock."""

from __future__ import annotations

import hashlib
import threading

from warpdata.storage.base import ObjectStore

__all__ = ["MemoryObjectStore"]

_MEMORY_LOCK = threading.Lock()


class MemoryObjectStore(ObjectStore):
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
