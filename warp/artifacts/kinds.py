"""The one table of artifact kinds: each kind's manifest, schema, inspector, previewer, checks and order.

=================== ================ ======================================= =============================
kind                written by       schema                                  inspector
=================== ================ ======================================= =============================
``tensor-warehouse`` ``warp etl``     ``warpdata.warehouse/manifest.schema.json`` ``warpdata.warehouse.inspect``
``zarr-array``       ``warp etl``     ``warpdata.tiles/manifest.schema.json``     ``warpdata.tiles.inspect``
``feature-cache``    ``warp etl``     ``warpdata.features/manifest.schema.json``  ``warpdata.features.inspect``
``dataset``          ``warp publish`` ``warpdata.registry/manifest.schema.json``  ``warpdata.read.inspect``
=================== ================ ======================================= =============================

The table is how a system registers itself with the floors above it (CONTRIBUTING.md "Floors"):
every entry is a dotted path (``package.module`` or ``package.module:name``) that
:func:`warpdata.core.registry.load` imports only when it is used, so this module, ``warp inspect``,
``--preview``, ``warp doctor`` and ``warp order`` import no system, and ``warp --help`` pays for
none of them.

A kind a loader reads names its order hook (``order``): the function
:func:`warpdata.read.order.epoch_order` calls to replay that loader's epoch order (its contract
is :data:`warpdata.read.order.OrderHook`). An artifact that is one file rather than a directory
with a manifest, the ``.tbl`` packed-sample file (docs/formats/tbl-v2.md), has no manifest kind; its
loader registers in :data:`FILE_KINDS`.

Every kind's manifest is validated against its schema before a reader trusts a field
(:func:`validate`). ``publish --from`` takes any kind written by ``warp etl``: the artifact's
directory becomes one published artifact (``publisher = "directory"``).
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from importlib import resources
from typing import Any

from warpdata.core.errors import DataError
from warpdata.core.names import DATASET, FEATURE_CACHE, MANIFEST_NAME, TENSOR_WAREHOUSE, ZARR_ARRAY


@dataclass(frozen=True)
class ArtifactKind:
    name: str
    manifest: str  # the manifest's file name inside the artifact
    schema_package: str  # the package holding manifest.schema.json
    inspector: str  # module with sniff() and inspect() (warpdata.artifacts.inspect)
    publisher: str  # how `warp publish --from` takes it: "directory" (the whole folder) or "none"
    written_by: str
    previewer: str = ""  # "module:function" drawing `warp inspect --preview` (warpdata.artifacts.preview)
    checks: str = ""  # module registering this kind's `warp doctor` checks (warpdata.checks.registry)
    order: str = ""  # "module:function": its loader's epoch order for `warp order` (warpdata.read.order)


KINDS: dict[str, ArtifactKind] = {k.name: k for k in (
    ArtifactKind(TENSOR_WAREHOUSE, MANIFEST_NAME, "warpdata.warehouse", "warpdata.warehouse.inspect", "directory",
                 "warp etl", previewer="warpdata.warehouse.preview:preview",
                 order="warpdata.warehouse.order:epoch_source"),
    ArtifactKind(ZARR_ARRAY, MANIFEST_NAME, "warpdata.tiles", "warpdata.tiles.inspect", "directory", "warp etl",
                 previewer="warpdata.tiles.preview:preview", checks="warpdata.tiles.checks"),
    ArtifactKind(FEATURE_CACHE, MANIFEST_NAME, "warpdata.features", "warpdata.features.inspect", "directory",
                 "warp etl", previewer="warpdata.features.preview:preview",
                 order="warpdata.features.order:epoch_source"),
    ArtifactKind(DATASET, MANIFEST_NAME, "warpdata.registry", "warpdata.read.inspect", "none",
                 "warp publish", previewer="warpdata.read.inspect:preview"),
)}



@dataclass(frozen=True)
class FileKind:
    """An artifact that is one file (no manifest beside it) and the loader that reads it."""

    name: str
    suffix: str  # the file name's usual ending
    order: str  # "module:function": its loader's epoch order (as ArtifactKind.order)


#: the single-file artifacts a warp loader reads; ``warp order`` reads a file as the kind its suffix
#: names, else as the first (a ``.tbl`` file by another name)
FILE_KINDS: dict[str, FileKind] = {k.name: k for k in (
    FileKind("tbl", ".tbl", order="warpdata.tbl.order:epoch_source"),
)}


@functools.cache
def schema(kind: str) -> dict[str, Any]:
    """The JSON Schema of ``kind``'s manifest."""
    k = KINDS[kind]
    return json.loads(resources.files(k.schema_package).joinpath("manifest.schema.json").read_text("utf-8"))


@functools.cache
def _validator(kind: str):
    import jsonschema

    return jsonschema.Draft202012Validator(schema(kind))


def validate(doc: Any, where: str) -> dict[str, Any]:
    """``doc`` when it is a valid manifest of a known kind; :class:`DataError` naming the field otherwise."""
    if not isinstance(doc, dict) or doc.get("kind") not in KINDS:
        kind = doc.get("kind") if isinstance(doc, dict) else type(doc).__name__
        raise DataError(f"{where}: unknown manifest kind {kind!r}", path=where,
                        hint=f"warp writes the kinds {', '.join(KINDS)}")
    errors = sorted(_validator(doc["kind"]).iter_errors(doc), key=lambda e: list(e.absolute_path))
    if errors:
        e = errors[0]
        field = "/".join(str(p) for p in e.absolute_path) or "(top level)"
        raise DataError(f"{where}: {field}: {e.message}", path=where,
                        hint=f"the {doc['kind']} manifest is damaged or not warp's; rebuild the artifact")
    return doc
