"""The hand-over contract between commands: manifests on disk.

Every artifact a warp command writes is a directory holding ``manifest.json``
(or a single self-describing file such as ``.tbl``). Each manifest is a JSON
object with a top-level ``"kind"`` naming what it describes:

==================== =========================== ==========================
kind                 written by                  read by
==================== =========================== ==========================
``tensor-warehouse`` ``warp etl`` (detection)    reader, publish, inspect
``zarr-array``       ``warp etl`` (volume)       publish, inspect
``feature-cache``    ``warp etl`` (captions)     reader, publish, inspect
``dataset``          ``warp publish``            read API, warm, inspect
==================== =========================== ==========================

Commands never import each other; they find and read these files with the
helpers below.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from warpdata.artifacts.kinds import KINDS as _KINDS
from warpdata.core.errors import DataError, MissingInputError
from warpdata.core.jsondoc import load_json
from warpdata.core.names import MANIFEST_NAME

KINDS = tuple(_KINDS)  # the kinds in their table (warpdata.artifacts.kinds)


def find_manifest(path: str | os.PathLike) -> Path:
    """The manifest file for ``path`` (the file itself, or ``path/manifest.json``)."""
    p = Path(path)
    if p.is_dir():
        m = p / MANIFEST_NAME
        if not m.is_file():
            raise MissingInputError(f"{p} has no {MANIFEST_NAME}",
                                    hint="point at a directory written by a warp command")
        return m
    if p.is_file():
        return p
    raise MissingInputError(f"{p} does not exist", hint="check the path")


def read_manifest(path: str | os.PathLike) -> dict[str, Any]:
    m = find_manifest(path)
    try:
        data = load_json(m.read_bytes(), str(m), hint="the manifest is corrupt; rebuild the artifact", error=DataError)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise DataError(f"{m}: not valid JSON: {e}", hint="the manifest is corrupt; rebuild the artifact",
                        path=str(m)) from None
    if not isinstance(data, dict) or "kind" not in data:
        raise DataError(f"{m}: not a warp manifest (no 'kind' field)",
                        hint="point at a manifest written by a warp command", path=str(m))
    return data
