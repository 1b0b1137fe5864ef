"""What the read path shares: protocols for a dataset version and a table, and WarmResult.

:class:`~warpdata.read.base.DatasetBase` and :class:`~warpdata.read.table.Table` satisfy
them; the batch reader (:mod:`warpdata.read.batches`) and the refs (:mod:`warpdata.read.refs`)
depend on these protocols only, so no read module imports one that imports it back.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from warpdata.registry.manifest import Manifest, ShardRef
    from warpdata.storage.blobcache import BlobCache
    from warpdata.storage.remote import Remote


class BlobSource(Protocol):
    """A dataset version: its manifest, and ways to its blobs (cache first, then the store)."""

    id: str
    version: str
    mode: str
    manifest: Manifest
    cache: BlobCache | None
    meta_cache: BlobCache | None
    remote: Remote

    def blob_key(self, s: ShardRef) -> str: ...
    def cached_path(self, s: ShardRef) -> str | None: ...
    def fetch_blob(self, s: ShardRef) -> str: ...
    def fetch_meta(self, s: ShardRef) -> bytes: ...
    def open_blob(self, s: ShardRef) -> Any: ...
    def artifact(self, name: str) -> Any: ...
    def reopen(self) -> tuple[Any, tuple[Any, ...]]: ...


class TableSource(Protocol):
    """One table of a version: its name and shards, and the version they belong to."""

    ds: BlobSource
    name: str
    shards: list[ShardRef]


@dataclass
class WarmResult:
    """What ``warm()`` fetched into the blob cache and what was already there."""

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
