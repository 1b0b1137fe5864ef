"""HTTP(S) stores (a store folder served by a static web host or CDN): reads by key through
:class:`~warpdata.storage.remote.Remote` under the request policy; no listing, no writes
(docs/formats/registry.md, "HTTP stores")."""

from __future__ import annotations

from typing import Any

from warpdata.core.errors import BlobNotFoundError, NotListableError, ReadOnlyStoreError
from warpdata.storage.base import ObjectStore

__all__ = ["HttpObjectStore", "read_only_error"]


class HttpObjectStore(ObjectStore):
    """A store served over HTTP(S): reads by key through :class:`~warpdata.storage.remote.Remote`;
    no listing, no writes."""


    def exists(self, key: str) -> bool:
        try:
            self.remote.size(key)
        except BlobNotFoundError:
            return False
        return True

    def get(self, key: str) -> bytes:
        """The whole object: a JSON document by one GET (capped like every document); a blob, which
        may be far larger, by its size (HEAD) and ranged reads, each capped at what it asked for."""
        if key.startswith("blobs/"):
            size = self.size(key)
            return self.remote.read_range(key, 0, size, size) if size else b""
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
        raise NotListableError(
            f"store {self.url} is served over HTTP and cannot be listed ({prefix}/)",
            hint="name the dataset (e.g. 'warp ls ws/name', 'warp stream ws/name') and give versions as "
                 "full 64-hex hashes; list from the s3:// bucket or folder behind the host")

    def list_objects(self, prefix: str) -> list[tuple[str, int, float]]:
        return self.list_names(prefix)  # type: ignore[return-value]  # raises NotListableError

    def _read_only(self, key: str, *args: Any) -> Any:
        raise read_only_error(self.url, f"write {self.remote.url_of(key)}")

    put_if_absent = put_file_if_absent = write_if = delete = _read_only


def read_only_error(url: str, action: str):
    return ReadOnlyStoreError(
        f"cannot {action}: store {url} is served over HTTP(S), which is read-only",
        hint="publish to the s3:// bucket or folder the web host serves (--store or WARP_STORE), "
             "then read it back over HTTP", store=url)
