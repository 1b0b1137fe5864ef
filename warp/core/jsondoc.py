"""JSON documents warp reads but did not just write: their size and nesting bounded.

A manifest, a ``latest`` pointer, a receipt, a registration or a member index may have been
edited, truncated or written by hand. :func:`load_json` refuses one larger than ``max_bytes``
before it is parsed, and one nested deeper than ``max_depth`` (the parser's own recursion
limit included: a document nested 200,000 deep is a typed error, never a ``RecursionError``).
Every failure is a :class:`JSONDocumentError` (a :class:`~warpdata.core.errors.DataError`,
exit 65, and so a ``ValueError``) naming the document and the bound (``field``: ``size``,
``nesting`` or ``json``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from warpdata.core.errors import DataError

MAX_BYTES = 256 << 20  # a manifest of a very large version is tens of MiB
MAX_POINTER_BYTES = 1 << 20  # a pointer, a receipt or a stamp is under 1 KiB
MAX_DEPTH = 64  # every document warp writes nests under 10 deep

HINT = "the document is damaged, truncated or not written by warp: rewrite it with the command that made it"


class JSONDocumentError(DataError):
    """A JSON document too large, nested too deep, or not JSON."""

    code = "bad-json-document"


def nesting(doc: Any, limit: int = MAX_DEPTH) -> int:
    """The nesting depth of a parsed JSON document (lists and objects), walked without recursion and
    stopped past ``limit``."""
    deepest, level = 0, [doc]
    while deepest <= limit:
        containers = [x for x in level if isinstance(x, (Mapping, list, tuple))]
        if not containers:
            break
        deepest += 1
        level = [y for x in containers for y in (x.values() if isinstance(x, Mapping) else x)]
    return deepest


def load_json(data: str | bytes, where: str, *, max_bytes: int = MAX_BYTES, max_depth: int = MAX_DEPTH,
              hint: str = HINT, error: type[DataError] | None = None) -> Any:
    """The JSON value of ``data`` (document ``where``): its size checked before it is parsed, its nesting
    while (the parser's recursion limit) and after. ``error``: the :class:`DataError` class to raise
    (a format's own, e.g. ``ManifestCorruptedError``) instead of :class:`JSONDocumentError`."""
    cls = error or JSONDocumentError
    size = len(data.encode() if isinstance(data, str) else data)
    if size > max_bytes:
        raise cls(f"{where}: {size:,} bytes, more than such a document may be ({max_bytes:,})",
                                hint=hint, path=where, field="size")
    try:
        doc = json.loads(data)
    except RecursionError:
        doc, depth = None, max_depth + 1
    except ValueError as e:  # JSONDecodeError, UnicodeDecodeError
        raise cls(f"{where}: not valid JSON ({str(e)[:80]})", hint=hint, path=where,
                                field="json") from None
    else:
        depth = nesting(doc, max_depth)
    if depth > max_depth:
        raise cls(f"{where}: JSON nested more than {max_depth} deep, deeper than such a document "
                                "may be", hint=hint, path=where, field="nesting")
    return doc
