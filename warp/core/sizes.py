"""Sizes given on the command line: a unit is required.

``warp cache gc --limit 20`` used to mean 20 *bytes* and evicted the whole
cache. On the command line a bare number is ambiguous (bytes? GB, like
WARP_CACHE_SIZE_GB?), so options that take a SIZE refuse it and ask for a
unit; the library's :func:`warpdata.storage.blobcache.parse_size` still reads bare
numbers as bytes for callers that pass ints.
"""

from __future__ import annotations

import re

from warpdata.core.errors import UsageError

_BARE = re.compile(r"^\s*[0-9]*\.?[0-9]+\s*$")


def parse_size_option(text: str, option: str, example: str = "20GB") -> int:
    """Bytes for ``text`` given to ``option``; a bare number is a usage error (exit 2)."""
    from warpdata.storage.blobcache import parse_size

    if _BARE.match(text):
        num = text.strip()
        raise UsageError(f"{option} {num} has no unit: say {num}GB (or {num}MB, {num}GiB, {num}B)",
                         hint=f"e.g. {option} {example}; sizes are decimal (GB = 10^9 bytes) "
                              "or binary (GiB = 2^30 bytes)", option=option, value=text)
    try:
        return parse_size(text)
    except UsageError as e:
        raise UsageError(f"{option} {text!r} is not a size", hint=f"e.g. {option} {example}",
                         option=option, value=text) from e
