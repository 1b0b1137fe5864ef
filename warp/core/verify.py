"""One ``verify=`` vocabulary for every loader and the read API (docs/partitioning.md).

``"off"``
    No checksum is computed at read time. Structure is still checked (headers
    and record counts against the manifest), so a truncated or foreign file is
    still refused, but flipped bytes inside a sample are served as they are.
``"fast"`` (the default everywhere)
    Every sample's bytes are checked against a stored checksum no later than
    when the sample is served, at a cost proportional to what is read: the
    feature cache checks each record's CRC-32C, ``.tbl`` files each payload's
    CRC-32; TWH1 warehouse shards have no per-sample checksum, so the warehouse
    hashes each shard (SHA-256) on its first touch; the read API hashes every
    blob as it enters the blob cache and again whenever its file changed
    (``WARP_CACHE_VERIFY=stamp``). A mismatch is a ``DataError`` naming the
    file and the sample.
``"full"``
    Everything ``"fast"`` checks, and every shard is checked in full (against
    the manifest's SHA-256 where there is one) before any of its samples is
    served, so a shard replaced by another well-formed one is caught too: the warehouse hashes
    all its shards when it is opened, the feature cache each shard when it
    enters its LRU, ``.tbl`` loaders every checksum of the file once when they
    are created (``TblReader.verify_all``), and the read API hashes each cached
    blob on its first use by every process (``WARP_CACHE_VERIFY=full``).

The names of the first release (warehouse ``"lazy"``/``"all"``/``"none"``,
feature cache ``"record"``/``"shard"``/``"none"``, ``.tbl`` loaders
``True``/``False``) map onto these with a ``DeprecationWarning`` for one release.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import Any

from warpdata.core.errors import UsageError

LEVELS = ("off", "fast", "full")


def verify_level(value: Any, where: str, old: Mapping[Any, str] | None = None, *, stacklevel: int = 3) -> str:
    """``value`` as one of :data:`LEVELS`; a deprecated name in ``old`` maps with a DeprecationWarning."""
    if isinstance(value, str) and value in LEVELS:
        return value
    for k, v in (old or {}).items():
        if type(k) is type(value) and k == value:
            warnings.warn(f"{where}: verify={value!r} is deprecated and will be removed in the next release; "
                          f"use verify={v!r} (docs/partitioning.md)", DeprecationWarning, stacklevel=stacklevel)
            return v
    raise UsageError(f"{where}: verify={value!r} is not one of {', '.join(map(repr, LEVELS))}",
                     hint="'off' checks no checksum, 'fast' (default) each sample as it is read, "
                          "'full' every shard's SHA-256 too (docs/partitioning.md)")
