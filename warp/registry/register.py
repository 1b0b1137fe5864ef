"""Datasets in place: the registration a ``warp register`` writes, and what its readers check.

Building one is :mod:`warpdata.publishing.register_files`.

Nothing is copied into a store. A *registration* is one JSON document per dataset in the
local registry, ``$WARP_CACHE_DIR/registered/<ws>/<name>.json`` (docs/formats/registry.md,
"Registered datasets"), holding what a manifest holds — tables of Parquet files, artifacts,
bindings, row counts, shard statistics — plus, for every file, its absolute path, its SHA-256
and the *stamp* it had when hashed: ``(size, mtime_ns, inode, ctime_ns)``. The change time is
the field ``utime`` cannot set back: an in-place edit that restores the mtime (``cp -p``,
``rsync --inplace -t``) still moves it.

* ``version_hash`` is the SHA-256 of the canonical JSON of the content only (hashes, sizes,
  row counts, member names, bindings; no paths, no stamps): registering the same files again,
  or copies of them elsewhere, gives the same version.
* Readers (:mod:`warpdata.read.registered`) compare a file's stamp before reading it; a
  file whose stamp moved is hashed again in full, and a different hash is a
  :class:`RegisteredFileChangedError` (exit 65) naming the file and saying to re-register.
  A file changed within ``RACY_WINDOW_NS`` before it was hashed gets no stamp at all, so its
  first read hashes it (a same-tick second write could otherwise keep every stamp field).
* Flags and checks follow ``warp publish``: ``--table NAME=FILES``, ``--artifact NAME=DIR``,
  ``--bind TABLE.COLUMN=ARTIFACT:TYPE`` (every bound value must name a member unless
  ``--allow-dangling``), symlinks out of an artifact directory refused, symlinked directories
  skipped unless ``--follow-symlinks``. Tables must be Parquet (read in place; ``publish``
  converts CSV/JSONL).
* Re-registering reuses the hashes of files whose stamps did not move; only changed or new
  files are hashed. The document is written atomically; :func:`unregister` deletes it.
* A name the store (``WARP_STORE``) publishes is refused (:class:`ShadowsPublishedError`) unless
  ``shadow=True`` (``--shadow``): reads would silently switch from the store's version to the
  local files. A store that cannot be reached refuses nothing (registering works offline); the
  result says why it was not checked.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any

from warpdata.core import envvars
from warpdata.core.canonical import canonical_json, sha256_hex
from warpdata.core.errors import DataError, MissingInputError
from warpdata.core.jsondoc import load_json
from warpdata.core.moved import moved_name
from warpdata.registry.manifest import validate_dataset_id

__all__ = ["RegisteredFileChangedError", "content_hash", "load", "registered_ids", "registry_path", "stamp_now",
           "unregister"]

# ``warp register`` itself (building a registration) sits on the publishing floor, in
# warpdata.publishing.register_files; its names stay importable from here until
# warpdata.core.moved.REMOVED_IN, resolved on use with a DeprecationWarning (an import would reach
# from the dataset contract up a floor: CONTRIBUTING.md).
_MOVED = frozenset({"RegisterRequest", "RegisterResult", "ShadowsPublishedError", "published_in_store", "register"})


def __getattr__(name: str) -> Any:
    if name in _MOVED:
        return moved_name(__name__, name, "warpdata.publishing.register_files")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

KIND = "warp-registered-dataset"
FORMAT = 1
RACY_WINDOW_NS = 100_000_000  # as publish's stat cache (git's "racily clean")


class RegisteredFileChangedError(DataError):
    """A file of a registered dataset no longer holds the bytes that were registered."""

    code = "registered-file-changed"


def registry_dir() -> Path:
    return Path(envvars.default_cache_dir()) / "registered"


def registry_path(dataset_id: str) -> Path:
    ws, name = validate_dataset_id(dataset_id).split("/")
    return registry_dir() / ws / f"{name}.json"


def registered_ids() -> list[str]:
    d = registry_dir()
    if not d.is_dir():
        return []
    return sorted(f"{p.parent.name}/{p.stem}" for p in d.glob("*/*.json"))


def load(dataset_id: str) -> dict[str, Any] | None:
    """The registration of ``dataset_id``, or None; a damaged document is a DataError naming it."""
    p = registry_path(dataset_id)
    try:
        raw = p.read_bytes()
    except FileNotFoundError:
        return None
    try:
        doc = load_json(raw, str(p))
        if doc.get("kind") != KIND or doc.get("format") != FORMAT or doc.get("dataset_id") != dataset_id:
            raise ValueError("not a registration of this dataset")
        if content_hash(doc) != doc["version_hash"]:
            raise ValueError("its version hash does not match its content")
        _check_paths(doc)
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise DataError(f"{p}: not a valid registration of {dataset_id} ({e})",
                        hint=f"register it again ('warp register {dataset_id} ...') or remove it with "
                             f"'warp unregister {dataset_id}'") from None
    return doc


def _check_paths(doc: dict[str, Any]) -> None:
    """Absolute table paths and artifact roots; member names inside their root (no ``..``, not absolute)."""
    for t in doc["tables"].values():
        for f in t["files"]:
            if not isinstance(f["path"], str) or not os.path.isabs(f["path"]):
                raise ValueError(f"table file {f['path']!r} is not an absolute path")
    for a in doc["artifacts"].values():
        if not isinstance(a["root"], str) or not os.path.isabs(a["root"]):
            raise ValueError(f"artifact root {a['root']!r} is not an absolute path")
        for m in a["members"]:
            if not m or m.startswith("/") or "\\" in m or ".." in m.split("/"):
                raise ValueError(f"member {m!r} is not a path inside {a['root']}")


def content_hash(doc: dict[str, Any]) -> str:
    """The version: SHA-256 of the content without paths, stamps and metadata."""
    content = {
        "kind": KIND, "format": FORMAT, "dataset_id": doc["dataset_id"],
        "tables": {t: {"schema": v["schema"], "files": [{k: f[k] for k in ("hash", "byte_size", "row_count")}
                                                        for f in v["files"]]}
                   for t, v in doc["tables"].items()},
        "artifacts": {a: {m: [e[0], e[1]] for m, e in v["members"].items()} for a, v in doc["artifacts"].items()},
        "bindings": doc["bindings"],
    }
    return sha256_hex(canonical_json(content))


def stamp_now(st: os.stat_result) -> list[int]:
    """``[size, mtime_ns, inode, ctime_ns]``: ctime because ``utime`` can put an mtime back, never a ctime."""
    return [st.st_size, st.st_mtime_ns, st.st_ino, st.st_ctime_ns]


def stamp_of(st: os.stat_result, scanned_at_ns: int) -> list[int] | None:
    """:func:`stamp_now`; None when the file changed too recently to trust a stamp."""
    if max(st.st_mtime_ns, st.st_ctime_ns) >= scanned_at_ns - RACY_WINDOW_NS:
        return None
    return stamp_now(st)


def unregister(dataset_id: str) -> str:
    """Delete the registration of ``dataset_id`` (its files stay); returns the document's path."""
    p = registry_path(dataset_id)
    try:
        p.unlink()
    except FileNotFoundError:
        import difflib

        known = registered_ids()
        close = difflib.get_close_matches(dataset_id, known, n=3)
        raise MissingInputError(f"{dataset_id} is not registered (no {p})",
                                hint=(f"did you mean {', '.join(close)}?" if close else
                                      f"registered: {', '.join(known[:8]) or 'none'}")) from None
    with contextlib.suppress(OSError):
        p.parent.rmdir()  # the workspace folder, once empty
    return str(p)
