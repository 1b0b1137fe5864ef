"""Reading a registered dataset: local files where they are (``warp register``).

:class:`RegisteredDataset` is a dataset version (:class:`~warpdata.read.base.DatasetBase`, as a
published :class:`~warpdata.read.dataset.Dataset` is) whose blobs are the
registered files themselves (a registration is described in :mod:`warpdata.registry.register`
and docs/formats/registry.md, "Registered datasets"). Tables, filters, batches, DataLoaders
and refs work unchanged: a table shard's "cached copy" is the registered Parquet file, and an
artifact is read member by member from its directory by :class:`DirArtifactReader`.

Before a file is read its stamp ``(size, mtime_ns, inode, ctime_ns)`` is compared with the
registered one (ctime: an edit that puts the mtime back still moves it); when it moved, the file is hashed again in full, and bytes that no longer hash to the
registered SHA-256 raise :class:`~warpdata.registry.register.RegisteredFileChangedError`
(exit 65) naming the file and the command that re-registers it. A file that is gone is a
MissingInputError. Each file is checked once per process while its stamp holds.
:meth:`RegisteredDataset.verify_files` (``warp inspect --verify``) hashes every file in full,
stamps or not.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from warpdata.core.canonical import sha256_file
from warpdata.core.errors import DataError, DatasetNotFoundError, MissingInputError, UsageError
from warpdata.read.base import MODES, DatasetBase
from warpdata.read.source import WarmResult
from warpdata.registry.manifest import Artifact, Binding, Manifest, ShardRef, Table
from warpdata.registry.register import RegisteredFileChangedError, load, registry_path, stamp_now
from warpdata.storage.remote import RequestStats

_CHECKED: dict[str, list[int]] = {}  # path -> stamp that was verified in this process
_CHECKED_MU = threading.Lock()


def _verify(path: str, want_hash: str, stamp: Sequence[int] | None, dataset_id: str, full: bool = False) -> str:
    """``path`` if it still holds the registered bytes (stamp, else a full hash; ``full``: always a
    full hash); typed errors otherwise."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise MissingInputError(f"{path}, registered in {dataset_id}, is gone",
                                hint=f"restore it, or register the dataset again ('warp register {dataset_id} ...') "
                                     f"or drop it ('warp unregister {dataset_id}')") from None
    now = stamp_now(st)
    if not full and stamp is not None and now == list(stamp):
        return path
    if not full and _CHECKED.get(path) == now:
        return path
    got = sha256_file(path)
    if got != want_hash:
        raise RegisteredFileChangedError(
            f"{path} changed since it was registered in {dataset_id} (SHA-256 now {got[:12]}, "
            f"registered {want_hash[:12]})",
            hint=f"register it again: 'warp register {dataset_id} ...' with the same flags "
                 "(unchanged files are not hashed again)", path=path, expected=want_hash, computed=got)
    with _CHECKED_MU:
        _CHECKED[path] = now  # touched, same bytes: no hash again while this stamp holds
    return path


class _LocalFiles:
    """The ``remote`` of a registered dataset: nothing is remote; error messages name local paths."""

    def __init__(self, doc_path: str) -> None:
        self.url = f"registered:{doc_path}"
        self.stats = RequestStats()
        self.read_only = True
        self.root = ""

    def url_of(self, key: str) -> str:
        return key

    def path(self, key: str) -> str:
        return key

    def typed_error(self, e: Exception, key: str = "", action: str = "read") -> Exception:
        return e


class RegisteredDataset(DatasetBase):
    """A dataset of local files registered with ``warp register`` (module docstring)."""

    registered = True

    def __init__(self, doc: dict[str, Any], doc_path: str, mode: str | None = None) -> None:
        mode = (mode or "local").lower()
        if mode not in MODES:
            raise UsageError(f"unknown mode {mode!r}", hint="use auto, remote, hybrid or local")
        self.id = doc["dataset_id"]
        self.mode = "local"  # the files are here: nothing to fetch, prefetch or cache
        self.verify = "fast"  # stamps, and a full hash of a file whose stamp moved
        self.doc = doc
        self.doc_path = doc_path
        self.remote = _LocalFiles(doc_path)  # type: ignore[assignment]
        self.cache = None
        self.meta_cache = None
        self.offline_fallback = False
        self.version = doc["version_hash"]
        self._paths: dict[str, tuple[str, Sequence[int] | None]] = {}
        tables = {}
        for name, t in doc["tables"].items():
            refs = []
            for f in t["files"]:
                refs.append(ShardRef(f["hash"], f["byte_size"], row_count=f["row_count"], stats=f.get("stats")))
                self._paths.setdefault(f["hash"], (f["path"], f.get("stamp")))
            tables[name] = Table(shards=tuple(refs), schema=t["schema"])
        artifacts = {a: Artifact(shards=(), kind="directory", member_count=len(v["members"]))
                     for a, v in doc["artifacts"].items()}
        total_bytes = sum(f["byte_size"] for t in doc["tables"].values() for f in t["files"]) + \
            sum(e[1] for a in doc["artifacts"].values() for e in a["members"].values())
        self.manifest = Manifest(self.id, tables=tables, artifacts=artifacts,
                                 bindings=tuple(Binding.from_dict(b) for b in doc["bindings"]),
                                 stats={"total_rows": sum(t.row_count for t in tables.values()),
                                        "total_bytes": total_bytes},
                                 metadata={**doc.get("metadata", {}), "registered": doc_path})

    def __repr__(self) -> str:
        return f"RegisteredDataset({self.id!r}, version={self.version[:12]!r})"

    def reopen(self) -> tuple[Callable[..., RegisteredDataset], tuple]:
        """This registration again, at this version (a DataLoader worker opens it by name)."""
        return _reopen, (self.id, self.version)

    def blob_key(self, s) -> str:
        return self._paths[s.hash][0]

    def cached_path(self, s) -> str | None:
        path, stamp = self._paths[s.hash]
        return _verify(path, s.hash, stamp, self.id)

    def fetch_blob(self, s) -> str:
        return self.cached_path(s)  # type: ignore[return-value]

    def fetch_meta(self, s) -> bytes:
        with open(self.cached_path(s), "rb") as f:  # type: ignore[arg-type]
            return f.read()

    def open_blob(self, s):
        import pyarrow as pa  # heavy: on use only (opening a dataset loads no pyarrow)

        return pa.memory_map(self.cached_path(s), "r")

    def artifact(self, name: str) -> DirArtifactReader:
        return DirArtifactReader(self, self.artifact_name(name))

    def warm(self, tables=None, shards=None, max_bytes=None, artifacts=True, on_blob=None) -> WarmResult:
        """Nothing to download: checks the registered table files instead (stamps, or a hash)."""
        res = WarmResult(self.id, self.version)
        for t in (list(tables) if tables is not None else self.tables):
            for s in list(self.table(t).shards)[shards or slice(None)]:
                self.cached_path(s)
                res.blobs += 1
                res.cached += 1
                res.cached_bytes += s.byte_size
                if on_blob:
                    on_blob(s.byte_size)
        return res

    def verify_files(self) -> list[str]:
        """Hash every registered file in full (table files and artifact members), whatever their
        stamps say; one message per file that is gone or holds other bytes (empty: all intact)."""
        files = [(f["path"], f["hash"]) for t in self.doc["tables"].values() for f in t["files"]]
        files += [(os.path.join(a["root"], m), e[0]) for a in self.doc["artifacts"].values()
                  for m, e in a["members"].items()]
        problems = []
        for path, want in files:
            try:
                _verify(path, want, None, self.id, full=True)
            except (DataError, MissingInputError) as e:
                problems.append(e.message)
        return problems


class DirArtifactReader:
    """Member reads from a registered artifact directory (the interface of
    :class:`~warpdata.read.refs.ArtifactReader`)."""

    background = False

    def __init__(self, ds: RegisteredDataset, name: str) -> None:
        self.ds = ds
        self.name = name
        self.meta = ds.manifest.artifacts[name]
        a = ds.doc["artifacts"][name]
        self.root = a["root"]
        self._members: dict[str, list] = a["members"]
        self.stats = {"remote_reads": 0, "local_reads": 0, "shards_fetched": 0}

    def members(self) -> list[str]:
        return sorted(self._members)

    def _entry(self, member: str) -> list:
        e = self._members.get(member)
        if e is None:
            import difflib  # stdlib, the error path only

            close = difflib.get_close_matches(member, list(self._members), n=1)
            raise MissingInputError(f"artifact {self.name} of {self.ds.id} has no member {member!r}",
                                    hint=f"did you mean {close[0]!r}?" if close else
                                    f"members are files under {self.root}, named relative to it")
        return e

    def locate(self, member: str) -> tuple[str, int, int]:
        e = self._entry(member)
        return e[0], 0, e[1]

    def _path(self, member: str) -> str:
        e = self._entry(member)
        return _verify(os.path.join(self.root, member), e[0], e[2], self.ds.id)

    def read(self, member: str) -> bytes:
        with open(self._path(member), "rb") as f:
            data = f.read()
        self.stats["local_reads"] += 1
        return data

    def read_many(self, members: Iterable[str], threads: int = 16) -> list[bytes]:
        ms = list(members)
        if len(ms) < 8:
            return [self.read(m) for m in ms]
        with ThreadPoolExecutor(max_workers=min(threads, len(ms))) as ex:
            return list(ex.map(self.read, ms))

    def local_path(self, member: str) -> Path:
        return Path(self._path(member))

    def ref(self, member: str, ref_type: str = "file"):
        # a part's reader, on first use (read.base's docstring)
        from warpdata.read.refs import REF_TYPES, FileRef

        return REF_TYPES.get(ref_type, FileRef)(self, member)  # type: ignore[arg-type]

    def wait_fetches(self, timeout: float = 60.0) -> bool:
        return True

    def close(self) -> None:
        pass


def open_registered(name: str, mode: str | None = None, version: str | None = None) -> RegisteredDataset | None:
    """The registered dataset ``name``, or None when it is not registered."""
    doc = load(name)
    if doc is None:
        return None
    if version not in (None, "latest") and not doc["version_hash"].startswith(version.lower()):
        raise DatasetNotFoundError(
            f"{name} is registered in place as version {doc['version_hash'][:12]}, not {version!r}",
            hint=f"omit the version, or read the store's copy with --store; 'warp unregister {name}' "
                 "drops the registration")
    return RegisteredDataset(doc, str(registry_path(name)), mode)


def _reopen(name: str, version: str) -> RegisteredDataset:
    """:meth:`RegisteredDataset.reopen`'s function: registration ``name`` at ``version``."""
    ds = open_registered(name, None, version)
    if ds is None:
        raise MissingInputError(f"{name} is no longer registered in place (read at version {version[:12]})",
                                hint=f"register it again ('warp register {name} ...') and restart the run")
    return ds
