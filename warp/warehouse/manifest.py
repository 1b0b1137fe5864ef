"""Tensor-warehouse manifests: JSON Schema validation, canonical writing, lookup.

The schema ships as ``manifest.schema.json`` beside this module (package
data). :func:`validate_manifest` raises :class:`~warpdata.errors.DataError`
naming the file and the JSON path of the first violation. Manifests are
written as canonical JSON (sorted keys, no whitespace; ``warpdata.canonical``)
so the same content gives the same bytes. Versions live at
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

from warpdata.errors import DataError

MANIFEST_NAME = "manifest.json"
KIND = "tensor-warehouse"


@functools.lru_cache(maxsize=1)
def schema() -> dict[str, Any]:
    text = resources.files("warpdata.warehouse").joinpath("manifest.schema.json").read_text("utf-8")
    return json.loads(text)


def validate_manifest(doc: Any, where: str = "manifest") -> None:
    import jsonschema

    validator = jsonschema.Draft202012Validator(schema())
    err = next(iter(sorted(validator.iter_errors(doc), key=lambda e: list(e.absolute_path))), None)
    if err is not None:
        path = "/".join(str(p) for p in err.absolute_path) or "(top level)"
        raise DataError(f"{where}: manifest does not match the tensor-warehouse schema at {path}: {err.message}",
                        hint="the manifest is damaged or from another tool; rebuild with 'warp etl --clear'",
                        path=where, json_path=path)


def read(path: str | os.PathLike) -> dict[str, Any]:
    p = Path(path)
    m = p / MANIFEST_NAME if p.is_dir() else p
    try:
        doc = json.loads(m.read_bytes())
    except FileNotFoundError:
        from warpdata.errors import MissingInputError

        raise MissingInputError(f"{m} does not exist", hint="point at a warehouse version directory "
                                "(<root>/vYYYYMMDD-<hash>/) written by 'warp etl'") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise DataError(f"{m}: not valid JSON: {e}", hint="rebuild with 'warp etl --clear'", path=str(m)) from None
    if not isinstance(doc, dict) or doc.get("kind") != KIND:
        raise DataError(f"{m}: not a tensor-warehouse manifest (kind={doc.get('kind') if isinstance(doc, dict) else None!r})",
                        hint="point at a directory written by 'warp etl' with a coco/yolo/jsonl config", path=str(m))
    validate_manifest(doc, str(m))
    return doc


def version_dir_name(version: str, date: str) -> str:
    return f"v{date}-{version[:12]}"


def find_versions(root: Path, version: str) -> list[Path]:
    if not root.is_dir():
        return []
    return sorted(p for p in root.glob(f"v*-{version[:12]}") if p.is_dir())
