"""``warp register``: make a registration of local files where they are (the publishing wing).

The registration document, its stamps and the readers' checks are the dataset contract's
(:mod:`warpdata.registry.register`, docs/formats/registry.md "Registered datasets"); this
module builds one the way ``warp publish`` builds a version (same flags, same binding checks,
:mod:`warpdata.publishing.publish`), so it sits on the publishing floor (CONTRIBUTING.md "Floors").
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

from warpdata import __version__
from warpdata.core.atomic import atomic_write_bytes
from warpdata.core.canonical import sha256_file
from warpdata.core.errors import DataError, ExitCode, MissingInputError, UsageError, WarpError
from warpdata.publishing.from_artifacts import check_symlinks
from warpdata.publishing.publish import _parquet_facts, expand_globs
from warpdata.registry.bindings import check_binding, check_binding_names, check_bindings
from warpdata.registry.manifest import Binding, validate_dataset_id
from warpdata.registry.register import (
    FORMAT,
    KIND,
    content_hash,
    load,
    registry_path,
    stamp_now,
    stamp_of,
)
from warpdata.registry.store import Store
from warpdata.registry.tarpack import scan_members
from warpdata.storage.locations import missing_store_folder

__all__ = ["RegisterRequest", "RegisterResult", "ShadowsPublishedError", "published_in_store", "register"]


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


def published_in_store(dataset_id: str) -> str | None:
    """The URL of the store (``WARP_STORE``) when it publishes ``dataset_id`` (a latest pointer or a
    version), else None; a default store that was never created publishes nothing."""
    st = Store(None)
    if missing_store_folder(st.location):
        return None
    if st.read_latest(dataset_id) is not None:
        return st.url
    if not st.read_only and st.list_versions(dataset_id):
        return st.url
    return None


def _expand(name: str, specs: Iterable[str]) -> list[str]:

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
    t0 = time.perf_counter()
    dataset_id = validate_dataset_id(req.dataset_id)
    if not req.tables and not req.artifacts:
        raise UsageError("nothing to register", hint="give --table NAME=FILES and/or --artifact NAME=DIR")
    shadows, unchecked = _store_check(dataset_id, req.shadow)
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
    check_binding_names(req.bindings, {n: [f["name"] for f in t["schema"]["fields"]] for n, t in tables.items()},
                        artifacts, "registered")
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


def _store_check(dataset_id: str, shadow: bool) -> tuple[str | None, str | None]:
    """(the store publishing ``dataset_id`` or None, why the store could not be asked or None);
    :class:`ShadowsPublishedError` when it publishes the name and ``shadow`` is not set."""
    shadows, unchecked = None, None
    try:
        shadows = published_in_store(dataset_id)
    except WarpError as e:
        if e.exit_code not in (ExitCode.CONFIG, ExitCode.TEMPFAIL, ExitCode.NO_INPUT):
            raise
        unchecked = e.message
    if shadows and not shadow:
        raise ShadowsPublishedError(
            f"{dataset_id} is published in the store {shadows}; registering it would make every read of "
            f"{dataset_id} use the local files instead",
            hint="register it under another name, or pass --shadow to hide the store's version on purpose "
                 "('warp ls' marks registrations)", store=shadows)
    return shadows, unchecked


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
