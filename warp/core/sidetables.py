"""The side tables beside an artifact's shards, sealed into its manifest by SHA-256 and size.

A tensor warehouse writes ``samples.parquet``, ``sources.parquet`` and the quarantine's Parquet
summaries beside its shards; a feature cache ``records.parquet``, ``keys.txt``,
``quarantine.jsonl`` and the same summaries. ``warp why`` answers from them, so an edited side
table would change an answer while every shard still verifies. The manifest therefore records
each one under ``side_tables`` (``{file name: {"sha256", "size_bytes"}}``; docs/formats/twh1.md,
"Manifest", and docs/formats/feature-shard.md, "Cache manifest"), inside the seal, and readers
check a side table against it before they use it: :func:`check_file` for a file on disk,
:func:`check_bytes` for bytes downloaded from object storage. A mismatch is a
:class:`SideTableMismatchError` (a :class:`~warpdata.core.errors.DataError`, exit 65) naming the
file and both hashes. A manifest written before the field existed has no entry: its side tables
are read unchecked (:func:`expected` returns None), as they always were.

``metrics.json`` is never recorded: it holds timings and a timestamp, and the manifest is sealed
so that identical builds give identical bytes.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from warpdata.core.confined import confined
from warpdata.core.errors import DataError

FIELD = "side_tables"
_CHUNK = 1 << 20


class SideTableMismatchError(DataError):
    """A side table whose bytes are not those its sealed manifest records."""

    code = "side-table-mismatch"


def digest_file(path: str | os.PathLike) -> tuple[str, int]:
    """(SHA-256 hex, size in bytes) of the file at ``path``, read in 1 MiB pieces."""
    h = hashlib.sha256()
    n = 0
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
            n += len(chunk)
    return h.hexdigest(), n


def record(directory: str | os.PathLike, names: Iterable[str]) -> dict[str, dict[str, Any]]:
    """The manifest's ``side_tables`` entry for files ``names`` of ``directory`` (all must exist)."""
    out = {}
    for name in sorted(set(names)):
        sha, size = digest_file(Path(directory) / name)
        out[name] = {"sha256": sha, "size_bytes": size}
    return out


def expected(doc: dict[str, Any], name: str, where: str, hint: str) -> dict[str, Any] | None:
    """What manifest ``doc`` (file ``where``) records for side table ``name``; None for a manifest
    written before ``side_tables`` existed. A manifest that has the field but not the file is
    refused: its writer recorded every side table it wrote."""
    tables = doc.get(FIELD)
    if tables is None:
        return None
    want = tables.get(name) if isinstance(tables, dict) else None
    if not isinstance(want, dict):
        raise SideTableMismatchError(f"{where}: the manifest names side table {name!r} but records no SHA-256 "
                                     f"for it in {FIELD}", hint=hint, path=where, entry=name)
    return want


def _mismatch(label: str, name: str, where: str, want: dict[str, Any], sha: str, size: int,
              hint: str) -> SideTableMismatchError:
    return SideTableMismatchError(
        f"{label}: side table {name} does not match manifest {where}: it hashes to SHA-256 {sha} "
        f"({size} bytes), the manifest records {want.get('sha256')} ({want.get('size_bytes')} bytes); "
        "it was edited or damaged after the build", hint=hint, path=label, entry=name,
        expected=want.get("sha256"), computed=sha)


def check_file(path: str | os.PathLike, name: str, want: dict[str, Any], where: str, hint: str) -> None:
    """Refuse file ``path`` (side table ``name`` of manifest ``where``) unless its size and SHA-256
    are those ``want`` records."""
    sha, size = digest_file(path)
    if sha != want.get("sha256") or size != want.get("size_bytes"):
        raise _mismatch(str(path), name, where, want, sha, size, hint)


def check_bytes(data: bytes, label: str, name: str, want: dict[str, Any], where: str, hint: str) -> None:
    """As :func:`check_file` for bytes read from ``label`` (an object-store URL)."""
    sha = hashlib.sha256(data).hexdigest()
    if sha != want.get("sha256") or len(data) != want.get("size_bytes"):
        raise _mismatch(label, name, where, want, sha, len(data), hint)


def errors(directory: str | os.PathLike, doc: dict[str, Any], where: str, hint: str) -> list[SideTableMismatchError]:
    """Every recorded side table of ``directory`` checked in full: one error per file that is
    missing or differs; none for a manifest without ``side_tables``. Each name is confined to
    ``directory`` first (:func:`warpdata.core.confined.confined`)."""
    tables = doc.get(FIELD)
    if tables is None:
        return []
    if not isinstance(tables, dict) or not all(isinstance(w, dict) for w in tables.values()):
        raise SideTableMismatchError(f"{where}: {FIELD} is not an object of {{file: {{sha256, size_bytes}}}}",
                                     hint=hint, path=where)
    out = []
    for name, want in sorted(tables.items()):
        p = confined(directory, name, where, entry=f"{FIELD} entry", hint=hint)
        try:
            check_file(p, name, want, where, hint)
        except FileNotFoundError:
            out.append(SideTableMismatchError(f"{p}: side table {name} recorded in manifest {where} is missing",
                                              hint=hint, path=str(p), entry=name))
        except SideTableMismatchError as e:
            out.append(e)
    return out


def problems(directory: str | os.PathLike, doc: dict[str, Any], where: str, hint: str) -> list[str]:
    """The messages of :func:`errors` (``warp inspect --verify`` lists them as corruption)."""
    return [e.message for e in errors(directory, doc, where, hint)]


def check_all(directory: str | os.PathLike, doc: dict[str, Any], where: str, hint: str) -> None:
    """Raise the first of :func:`errors` (``warp publish --from`` copies no edited side table)."""
    found = errors(directory, doc, where, hint)
    if found:
        raise found[0]
