"""Feature-cache manifests: JSON Schema validation, the content seal, path confinement.

The schema ships as ``manifest.schema.json`` beside this module. A manifest
is sealed: ``content_sha256`` is the SHA-256 of the canonical JSON of every
other field (:func:`warpdata.core.canonical.content_hash`), so deleting a
``shards[]`` entry, changing a field table or a record count is caught on
open. Manifests without the seal (``manifest_version`` absent, written by an
older warp) are refused with a hint to rebuild; ``warp etl`` rebuilds such a
cache by itself. Rules: docs/formats/feature-shard.md ("Cache manifest").
"""

from __future__ import annotations

import functools
import json
import os
from importlib import resources
from typing import Any

from warpdata.artifacts.manifests import find_manifest
from warpdata.core.canonical import CONTENT_HASH_FIELD, content_hash
from warpdata.core.confined import confined
from warpdata.core.errors import DataError
from warpdata.core.jsondoc import load_json
from warpdata.core.names import FEATURE_CACHE, MANIFEST_NAME

KIND = FEATURE_CACHE
MANIFEST_VERSION = 3  # 2: sealed by content_sha256; 3: each shard's task identity (docs/formats/feature-shard.md)
READABLE_VERSIONS = (2, 3)  # a version 2 cache reads as before; a new version reuses none of its shards
REBUILD_HINT = "rebuild the cache with 'warp etl --clear'"


@functools.lru_cache(maxsize=1)
def schema() -> dict[str, Any]:
    text = resources.files("warpdata.features").joinpath("manifest.schema.json").read_text("utf-8")
    return json.loads(text)


@functools.lru_cache(maxsize=1)
def _validator():
    import jsonschema  # lazy: heavy, loaded on the first manifest check

    return jsonschema.Draft202012Validator(schema())


def check(doc: Any, where: str, hint: str = REBUILD_HINT) -> dict[str, Any]:
    """Schema + seal; returns ``doc`` or raises :class:`DataError` naming ``where``."""
    if not isinstance(doc, dict) or doc.get("kind") != KIND:
        kind = doc.get("kind") if isinstance(doc, dict) else None
        raise DataError(f"{where}: manifest kind is {kind!r}, not {KIND!r}",
                        hint="point at a directory written by `warp etl` with [source] format = \"captions\"",
                        path=where)
    if CONTENT_HASH_FIELD not in doc or doc.get("manifest_version") not in READABLE_VERSIONS:
        raise DataError(f"{where}: feature-cache manifest without a content hash (manifest_version "
                        f"{doc.get('manifest_version')!r}, written by an older warp): its fields cannot be checked",
                        hint=hint, path=where)
    err = next(iter(sorted(_validator().iter_errors(doc), key=lambda e: list(e.absolute_path))), None)
    if err is not None:
        jp = "/".join(str(p) for p in err.absolute_path) or "(top level)"
        raise DataError(f"{where}: manifest does not match the feature-cache schema at {jp}: {err.message}",
                        hint=hint, path=where, json_path=jp)
    got = content_hash(doc)
    if got != doc[CONTENT_HASH_FIELD]:
        raise DataError(f"{where}: manifest content does not match its content_sha256 "
                        f"(stored {doc[CONTENT_HASH_FIELD][:16]}…, computed {got[:16]}…): "
                        "the manifest was edited or damaged", hint=hint, path=where)
    total = sum(s["records"] for s in doc["shards"])
    if total != doc["records"]:
        raise DataError(f"{where}: shards hold {total} records, the manifest says {doc['records']}",
                        hint=hint, path=where)
    first = 0
    for i, src in enumerate(doc.get("sources", ())):  # contiguous ranges covering every record once
        if src["name"] != f"d{i}" or src["first_record"] != first:
            raise DataError(f"{where}: sources[{i}] is {src['name']!r} starting at record {src['first_record']}, "
                            f"expected 'd{i}' starting at {first}", hint=hint, path=where, json_path=f"sources/{i}")
        first += src["records"]
    if "sources" in doc and first != doc["records"]:
        raise DataError(f"{where}: sources cover {first} records, the manifest says {doc['records']}",
                        hint=hint, path=where, json_path="sources")
    return doc


def parse(raw: bytes, where: str, hint: str = REBUILD_HINT) -> dict[str, Any]:
    try:
        doc = load_json(raw, where, hint=hint, error=DataError)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise DataError(f"{where}: not valid JSON: {e}", hint=hint, path=where) from None
    return check(doc, where, hint)


def read(path: str | os.PathLike) -> dict[str, Any]:
    """The checked manifest of cache directory ``path`` (or of that manifest file)."""
    m = find_manifest(path)
    doc = parse(m.read_bytes(), str(m))
    for sh in doc["shards"]:  # the schema pins names to shard-NNNNN.wfs; a symlink must not lead out
        confined(m.parent, sh["path"], str(m), entry="shard path", hint=REBUILD_HINT)
    for name in doc.get("side_tables") or {}:
        confined(m.parent, name, str(m), entry="side_tables entry", hint=REBUILD_HINT)
    return doc


def _manifest_kind(path: str) -> str | None:
    # `warp inspect` sniffs every target here first: parse only files that mention the kind
    try:
        with open(path, "rb") as f:
            head = f.read(1 << 20)
            if b'"feature-cache"' not in head:
                return None
            data = load_json(head + f.read(), path)
    except (OSError, ValueError):
        return None
    return data.get("kind") if isinstance(data, dict) else None


def sniff(target: str, head: bytes | None, is_dir: bool) -> bool:
    """Whether ``warp inspect`` should take ``target`` as a feature cache, a WFS1 shard or its manifest.

    Lives here, not in the inspector, so that sniffing a target of another kind loads no reader."""
    if is_dir:
        m = os.path.join(target, MANIFEST_NAME)
        return os.path.isfile(m) and _manifest_kind(m) == FEATURE_CACHE
    if head is None:
        return False
    if head.startswith(b"WFS1"):
        return True
    return head.lstrip().startswith(b"{") and b'"feature-cache"' in head and _manifest_kind(target) == FEATURE_CACHE
