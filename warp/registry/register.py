"""Datasets in place: ``warp register`` makes a dataset of local files where they are.

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
import json
import os
import threading
import time
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from warpdata.core import envvars
from warpdata.core.canonical import canonical_json, sha256_file, sha256_hex
from warpdata.core.errors import DataError, ExitCode, MissingInputError, UsageError, WarpError
from warpdata.registry.manifest import Binding, validate_dataset_id

__all__ = ["RegisterRequest", "RegisterResult", "RegisteredFileChangedError", "ShadowsPublishedError", "load",
           "register", "registered_ids", "registry_path", "stamp_now", "unregister"]

KIND = "warp-registered-dataset"
FORMAT = 1
RACY_WINDOW_NS = 100_000_000  # as publish's stat cache (git's "racily clean")


class RegisteredFileChangedError(DataError):
    """A file of a registered dataset no longer holds the bytes that were registered."""

    code = "registered-file-changed"


class ShadowsPublishedError(UsageError):
    """``warp register ws/name`` where the store publishes ``ws/name``: reads would switch to the local files."""

    code = "shadows-published"


@dataclass
class RegisterRequest:
    dataset_id: str
    tables: dict[str, list[str]] = field(default_factory=dict)  # name -> files or globs
    artifacts: dict[str, str] = field(default_factory=dict)  # name -> directory
    bindings: list[Binding] = field(default_factory=list)
    allow_dangling: bool = False
    follow_symlinks: bool = False
    description: str | None = None
    workers: int = 8
    shadow: bool = False  # register even if the store publishes this name (reads then use the local files)


@dataclass
class RegisterResult:
    dataset_id: str
    version_hash: str
    path: str
    tables: dict[str, dict[str, int]]
    artifacts: dict[str, dict[str, Any]]
    bindings: list[str]
    files: int
    hashed_files: int
    hashed_bytes: int
    replaced: str | None  # the version this registration replaced, if any
    seconds: float
    dangling_refs: dict[str, int] = field(default_factory=dict)
    shadows: str | None = None  # the store whose published dataset of this name the registration hides
    store_unchecked: str | None = None  # why the store could not be asked (unreachable): nothing refused

    def to_dict(self) -> dict[str, Any]:
        d = dict(self.__dict__)
        d["seconds"] = round(self.seconds, 3)
        return d


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
        doc = json.loads(raw)
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


def published_in_store(dataset_id: str) -> str | None:
    """The URL of the store (``WARP_STORE``) when it publishes ``dataset_id`` (a latest pointer or a
    version), else None; a default store that was never created publishes nothing."""
    from warpdata.registry.store import Store
    from warpdata.storage.locations import missing_store_folder

    st = Store(None)
    if missing_store_folder(st.location):
        return None
    if st.read_latest(dataset_id) is not None:
        return st.url
    if not st.read_only and st.list_versions(dataset_id):
        return st.url
    return None


def _expand(name: str, specs: Iterable[str]) -> list[str]:
    from warpdata.registry.publish import expand_globs

    patterns = [p.strip() for spec in specs for p in spec.split(",") if p.strip()]
    files = [os.path.abspath(f) for f in expand_globs(name, patterns)]
    bad = [f for f in files if Path(f).suffix.lower() not in (".parquet", ".pq")]
    if bad:
        raise DataError(f"--table {name}: {bad[0]} is not a Parquet file; registered tables are read in place",
                        hint="convert it to Parquet, or 'warp publish' it (publish converts CSV and JSONL)")
    seen: set[str] = set()
    dup = next((f for f in files if f in seen or seen.add(f)), None)  # type: ignore[func-returns-value]
    if dup:
        raise UsageError(f"--table {name}: {dup} is given twice", hint="name each file once")
    return files


def register(req: RegisterRequest) -> RegisterResult:
    """Hash and describe the files of ``req`` and write its registration (see the module docstring)."""
    from warpdata import __version__
    from warpdata.registry.bindings import check_binding, check_bindings
    from warpdata.registry.from_artifacts import check_symlinks
    from warpdata.registry.publish import _parquet_facts
    from warpdata.registry.tarpack import scan_members

    t0 = time.perf_counter()
    dataset_id = validate_dataset_id(req.dataset_id)
    if not req.tables and not req.artifacts:
        raise UsageError("nothing to register", hint="give --table NAME=FILES and/or --artifact NAME=DIR")
    shadows, unchecked = None, None
    try:
        shadows = published_in_store(dataset_id)
    except WarpError as e:
        if e.exit_code not in (ExitCode.CONFIG, ExitCode.TEMPFAIL, ExitCode.NO_INPUT):
            raise
        unchecked = e.message
    if shadows and not req.shadow:
        raise ShadowsPublishedError(
            f"{dataset_id} is published in the store {shadows}; registering it would make every read of "
            f"{dataset_id} use the local files instead",
            hint="register it under another name, or pass --shadow to hide the store's version on purpose "
                 "('warp ls' marks registrations)", store=shadows)
    previous = None
    with contextlib.suppress(DataError):
        previous = load(dataset_id)
    known = _known_hashes(previous)
    scanned_at = time.time_ns()
    hashed = {"files": 0, "bytes": 0}
    hashed_mu = threading.Lock()

    def file_entry(path: str) -> tuple[str, int, list[int] | None]:
        st = os.stat(path)
        stamp = stamp_of(st, scanned_at)
        prior = known.get(path)
        if prior is not None and stamp is not None and prior[1] == stamp:
            return prior[0], st.st_size, stamp
        h = sha256_file(path)
        with hashed_mu:
            hashed["files"] += 1
            hashed["bytes"] += st.st_size
        if stamp_now(os.stat(path)) != stamp_now(st):
            raise DataError(f"{path} changed while it was being hashed", hint="rerun 'warp register' when it is settled")
        return h, st.st_size, stamp

    tables: dict[str, Any] = {}
    table_files: dict[str, list[str]] = {}
    with ThreadPoolExecutor(max_workers=max(1, req.workers)) as pool:
        for name, specs in req.tables.items():
            files = _expand(name, specs)
            table_files[name] = files
            entries = list(pool.map(file_entry, files))
            facts = list(pool.map(_parquet_facts, files))
            schema = facts[0]["schema"]
            for f, fa in zip(files, facts, strict=True):
                if fa["schema"] != schema:
                    raise DataError(f"table {name}: {f} has other columns than {files[0]}",
                                    hint="all files of one table must share one schema")
            tables[name] = {"schema": {"fields": schema}, "files": [
                {"path": f, "hash": e[0], "byte_size": e[1], "row_count": fa["row_count"], "stats": fa["stats"],
                 "stamp": e[2]} for f, e, fa in zip(files, entries, facts, strict=True)]}
        artifacts: dict[str, Any] = {}
        members_of: dict[str, list[str]] = {}
        skipped: dict[str, tuple[str, ...]] = {}
        for name, directory in req.artifacts.items():
            root = os.path.abspath(directory)
            if os.path.isdir(root):
                check_symlinks(root, follow_symlinks=req.follow_symlinks, dir_links_skipped=True)
            scan = scan_members(root, follow_symlinks=req.follow_symlinks)
            skipped[name] = scan.skipped_dir_links
            if not scan.members:
                raise MissingInputError(f"artifact {name}: {root} holds no files",
                                        hint="--artifact NAME=DIR needs a directory of files")
            entries = list(pool.map(file_entry, [p for _, p, _ in scan.members]))
            artifacts[name] = {"root": root, "members": {
                m: [e[0], e[1], e[2]] for (m, _p, _s), e in zip(scan.members, entries, strict=True)}}
            members_of[name] = [m for m, _, _ in scan.members]
    for b in req.bindings:
        if b.table not in tables:
            raise UsageError(f"--bind names table {b.table!r}, which is not being registered",
                             hint=f"tables: {', '.join(sorted(tables)) or 'none'}")
        if b.artifact not in artifacts:
            raise UsageError(f"--bind names artifact {b.artifact!r}, which is not being registered",
                             hint=f"artifacts: {', '.join(sorted(artifacts)) or 'none'}")
        columns = [f["name"] for f in tables[b.table]["schema"]["fields"]]
        if b.column not in columns:
            raise UsageError(f"--bind {b.table}.{b.column}: table {b.table} has no column {b.column!r}",
                             hint=f"columns: {', '.join(columns)}")
    checks, artifact_of = [], {}
    for b in req.bindings:
        key = f"{b.table}.{b.column}={b.artifact}"
        artifact_of[key] = b.artifact
        checks.append(check_binding(key, table_files[b.table], b.column, members_of[b.artifact]))
    dangling = check_bindings(checks, members_of, artifact_of, allow_dangling=req.allow_dangling,
                              skipped_links=skipped)
    metadata: dict[str, Any] = {"registered_at": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
                                "warp_version": __version__}
    if dangling:
        metadata["dangling_refs"] = dangling
    if req.description:
        metadata["description"] = req.description
    doc: dict[str, Any] = {"kind": KIND, "format": FORMAT, "dataset_id": dataset_id, "tables": tables,
                           "artifacts": artifacts,
                           "bindings": [b.to_dict() for b in sorted(req.bindings,
                                                                    key=lambda b: (b.table, b.column, b.artifact))],
                           "metadata": metadata}
    doc["version_hash"] = content_hash(doc)
    from warpdata.core.atomic import atomic_write_bytes

    path = registry_path(dataset_id)
    atomic_write_bytes(path, json.dumps(doc, sort_keys=True, separators=(",", ":")).encode(), fsync=True)
    return RegisterResult(
        dataset_id, doc["version_hash"], str(path),
        tables={t: {"files": len(v["files"]), "rows": sum(f["row_count"] for f in v["files"])} for t, v in tables.items()},
        artifacts={a: {"root": v["root"], "members": len(v["members"])} for a, v in artifacts.items()},
        bindings=[f"{b.table}.{b.column}={b.artifact}:{b.ref_type}" for b in req.bindings],
        files=sum(len(v["files"]) for v in tables.values()) + sum(len(v["members"]) for v in artifacts.values()),
        hashed_files=hashed["files"], hashed_bytes=hashed["bytes"],
        replaced=previous["version_hash"] if previous and previous["version_hash"] != doc["version_hash"] else None,
        seconds=time.perf_counter() - t0, dangling_refs=dangling, shadows=shadows, store_unchecked=unchecked)


def _known_hashes(doc: dict[str, Any] | None) -> dict[str, tuple[str, list[int]]]:
    """path -> (hash, stamp) of a previous registration's files that had a stamp."""
    out: dict[str, tuple[str, list[int]]] = {}
    if not doc:
        return out
    for t in doc["tables"].values():
        for f in t["files"]:
            if f.get("stamp"):
                out[f["path"]] = (f["hash"], f["stamp"])
    for a in doc["artifacts"].values():
        for m, e in a["members"].items():
            if e[2]:
                out[os.path.join(a["root"], m)] = (e[0], e[2])
    return out


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
