"""A published shard that fails a check: fetch its tar shard again once, then name the store object.

docs/formats/registry.md, "Readers of published data: bad cached copies": a shard of a published
artifact that fails a check is a bad cached copy until shown otherwise. Its tar shard is evicted
from the blob cache and fetched again, once; if the fresh copy fails too, the published bytes are
wrong and the error (:class:`~warpdata.core.errors.BlobCorruptedError`) names the store object.
The systems' readers of published artifacts share this rule (the feature cache's
:class:`~warpdata.features.reader.ShardCache`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from warpdata.core.errors import BlobCorruptedError, DataError

T = TypeVar("T")


def retry_after_refetch(published: Any, rel: str, first: DataError, again: Callable[[], T], *,
                        label: str, hint: str, refetched: Callable[[], None]) -> T:
    """``again()`` once member ``rel`` of ``published`` (a :mod:`warpdata.read.materialize` handle)
    is fetched afresh, after its check failed with ``first``.

    ``refetched()`` runs first, to drop what the caller mapped of the old copy. When the member
    cannot be fetched again, or ``again()`` fails too, raises :class:`BlobCorruptedError` naming
    ``label/rel``, the store object, the last failure and ``hint`` (what to republish).
    """
    if published.refetch(rel):
        refetched()
        try:
            return again()
        except DataError as e:
            first = e
    obj = published.store_object(rel)
    raise BlobCorruptedError(f"{label}/{rel}: fails its check in a freshly fetched copy of store "
                             f"object {obj} ({first.message})", hint=hint, store_object=obj, member=rel) from None
