"""Tensor-warehouse manifests: JSON Schema validation, canonical writing, lookup.

The schema ships as ``manifest.schema.json`` beside this module (package
data). :func:`validate_manifest` raises :class:`~warpdata.core.errors.DataError`
naming the file and the JSON path of the first violation. Manifests are
written as canonical JSON (sorted keys, no whitespace; ``warpdata.core.canonical``)
so the same content gives the same bytes, and sealed: ``content_sha256`` is the
SHA-256 of the canonical JSON of every other field (:func:`warpdata.core.canonical.content_hash`;
no timestamps or timings inside, so identical builds give identical manifests).
:func:`read` refuses a manifest whose hash does not match, one written before
the seal existed (``manifest_version`` 1: rebuild it, a rerun of ``warp etl``
does), and any shard path that would resolve outside the warehouse root
(docs/formats/twh1.md, "Manifest"). Versions live at
``<root>/vYYYYMMDD-<version[:12]>/``; :func:`find_versions` finds them by
the 12-hex suffix whatever the date.
"""

from __future__ import annotations

import functools
import json
import os
from importlib import resources
from pathlib import Path
from typing import Any

from warpdata.core.canonical import CONTENT_HASH_FIELD, content_hash
from warpdata.core.confined import confined
from warpdata.core.errors import DataError, MissingInputError
from warpdata.core.jsondoc import load_json
from warpdata.core.names import MANIFEST_NAME, TENSOR_WAREHOUSE

KIND = TENSOR_WAREHOUSE
MANIFEST_VERSION = 2  # 2: sealed with content_sha256, no created_at_ms (docs/formats/twh1.md)
REBUILD_HINT = "rebuild it with 'warp etl' (a rerun rewrites a damaged or outdated version)"


@functools.lru_cache(maxsize=1)
def schema() -> dict[str, Any]:
    text = resources.files("warpdata.warehouse").joinpath("manifest.schema.json").read_text("utf-8")
    return json.loads(text)


def validate_manifest(doc: Any, where: str = "manifest") -> None:
    import jsonschema  # heavy (with its dependencies): only validation needs it

    validator = jsonschema.Draft202012Validator(schema())
    err = next(iter(sorted(validator.iter_errors(doc), key=lambda e: list(e.absolute_path))), None)
    if err is not None:
        path = "/".join(str(p) for p in err.absolute_path) or "(top level)"
        raise DataError(f"{where}: manifest does not match the tensor-warehouse schema at {path}: {err.message}",
                        hint="the manifest is damaged or from another tool; " + REBUILD_HINT,
                        path=where, json_path=path)


def check_seal(doc: dict[str, Any], where: str, hint: str = REBUILD_HINT) -> None:
    """Refuse a manifest without the content hash, or whose content does not hash to it."""
    if doc.get("manifest_version") == 1 or CONTENT_HASH_FIELD not in doc:
        raise DataError(f"{where}: tensor-warehouse manifest without a content hash (manifest_version "
                        f"{doc.get('manifest_version')!r}, written by an older warp): its fields cannot be checked",
                        hint=hint, path=where)
    got = content_hash(doc)
    if got != doc[CONTENT_HASH_FIELD]:
        raise DataError(f"{where}: manifest content does not match its content_sha256 "
                        f"(stored {str(doc[CONTENT_HASH_FIELD])[:16]}…, computed {got[:16]}…): "
                        "the manifest was edited or damaged", hint=hint, path=where)


def check_confined(doc: dict[str, Any], root: Path, where: str) -> None:
    """Every shard path and side file the manifest names must be a regular file (or missing) inside
    ``root``, symlinks followed (:func:`warpdata.core.confined.confined`)."""
    hint = "the manifest is damaged or hostile; " + REBUILD_HINT
    for sh in doc["shards"]:
        confined(root, sh["relative_path"], where, entry=f"shard {sh.get('id')!s} relative_path", hint=hint)
    for key, name in (doc.get("files") or {}).items():
        confined(root, name, where, entry=f"files.{key}", hint=hint)
    for name in doc.get("side_tables") or {}:
        confined(root, name, where, entry="side_tables entry", hint=hint)


def parse(raw: bytes, where: str, hint: str = REBUILD_HINT) -> dict[str, Any]:
    """Decode, kind-check, schema-validate and seal-check manifest bytes."""
    try:
        doc = load_json(raw, where, hint=hint, error=DataError)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise DataError(f"{where}: not valid JSON: {e}", hint=hint, path=where) from None
    if not isinstance(doc, dict) or doc.get("kind") != KIND:
        raise DataError(f"{where}: not a tensor-warehouse manifest (kind={doc.get('kind') if isinstance(doc, dict) else None!r})",
                        hint="point at a directory written by 'warp etl' with a coco/yolo/jsonl config", path=where)
    if doc.get("manifest_version") == 1 or "content_sha256" not in doc:
        check_seal(doc, where, hint)  # the clearer message for an old manifest than a schema path
    validate_manifest(doc, where)
    check_seal(doc, where, hint)
    return doc


def read(path: str | os.PathLike) -> dict[str, Any]:
    p = Path(path)
    m = p / MANIFEST_NAME if p.is_dir() else p
    try:
        raw = m.read_bytes()
    except FileNotFoundError:
        raise MissingInputError(f"{m} does not exist", hint="point at a warehouse version directory "
                                "(<root>/vYYYYMMDD-<hash>/) written by 'warp etl'") from None
    doc = parse(raw, str(m))
    check_confined(doc, m.parent, str(m))
    return doc


def version_dir_name(version: str, date: str) -> str:
    return f"v{date}-{version[:12]}"


def find_versions(root: Path, version: str) -> list[Path]:
    if not root.is_dir():
        return []
    return sorted(p for p in root.glob(f"v*-{version[:12]}") if p.is_dir())
