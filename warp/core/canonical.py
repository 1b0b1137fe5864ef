"""Canonical JSON and SHA-256 identities.

Canonical JSON is the one byte string a JSON value hashes as: keys sorted,
separators ``,`` and ``:`` with no whitespace, UTF-8 (no ASCII escaping),
integers as integers, no NaN or infinities (they are rejected: they have no
JSON spelling and would make identities depend on the parser). Identities
are lowercase hex SHA-256 of those bytes.
"""

from __future__ import annotations

import hashlib
import json
import math
from typing import Any


class CanonicalJSONError(ValueError):
    pass


def _check(value: Any, path: str = "$") -> None:
    if isinstance(value, float):
        if not math.isfinite(value):
            raise CanonicalJSONError(f"{path}: {value!r} is not allowed in canonical JSON")
    elif isinstance(value, dict):
        for k, v in value.items():
            if not isinstance(k, str):
                raise CanonicalJSONError(f"{path}: key {k!r} is not a string")
            _check(v, f"{path}.{k}")
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            _check(v, f"{path}[{i}]")
    elif not (value is None or isinstance(value, (str, int, bool))):
        raise CanonicalJSONError(f"{path}: {type(value).__name__} is not a JSON type")


def canonical_json(value: Any) -> bytes:
    """Return the canonical UTF-8 JSON bytes of ``value``."""
    _check(value)
    return json.dumps(
        value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    ).encode("utf-8")


def sha256_hex(data: bytes | bytearray | memoryview) -> str:
    return hashlib.sha256(data).hexdigest()


def identity(value: Any) -> str:
    """SHA-256 hex of the canonical JSON of ``value``."""
    return sha256_hex(canonical_json(value))


def sha256_file(path, chunk: int = 1 << 20) -> str:
    """Streaming SHA-256 of a file (hashlib releases the GIL on large updates)."""
    h = hashlib.sha256()
    buf = bytearray(chunk)
    view = memoryview(buf)
    with open(path, "rb", buffering=0) as f:
        while n := f.readinto(buf):
            h.update(view[:n])
    return h.hexdigest()


CONTENT_HASH_FIELD = "content_sha256"


def content_hash(doc: dict, field: str = CONTENT_HASH_FIELD) -> str:
    """SHA-256 of the canonical JSON of ``doc`` without its ``field`` (a manifest's self-hash).

    Local manifests (tensor warehouse, feature cache) carry this value in
    ``field`` so a reader can tell an edited or truncated manifest from the one
    the writer sealed (docs/formats/twh1.md, docs/formats/feature-shard.md).
    Timings and timestamps are never inside a sealed manifest.
    """
    return identity({k: v for k, v in doc.items() if k != field})


def seal(doc: dict, field: str = CONTENT_HASH_FIELD) -> dict:
    """``doc`` with ``field`` set to :func:`content_hash` (a new dict)."""
    return {**{k: v for k, v in doc.items() if k != field}, field: content_hash(doc, field)}
