"""Content-addressed blob cache: shards and members by hash, never by URL.

Contract
--------
* A blob is stored once under ``<root>/blobs/<hh>/<hex>`` where ``hex`` is the
  SHA-256 of its bytes. The URL that served it plays no part in the key, so a
  blob shared by two datasets or versions is downloaded once (seed §5.3).
* Writes are atomic: bytes stream to a temporary sibling while being hashed;
  only a blob whose hash matches is renamed into place. A killed download
  leaves a ``.warp-tmp-*`` file and never a half blob.
* Integrity (``verify=``, or ``WARP_CACHE_VERIFY``; docs/formats/registry.md,
  "Cache verification"): a blob's SHA-256 is checked in full as it enters the
  cache, and a stamp of the file that passed — ``(inode, size, mtime_ns,
  ctime_ns)`` — is kept in a sidecar ``<root>/stamps/<hh>/<hex>``. ``stamp`` (the
  default) hashes a blob again in full whenever its file no longer matches
  the stamp (any write, truncation, replacement or ``touch`` changes ctime),
  so a corrupted blob is detected, deleted and fetched again once. ``full``
  hashes every blob on first use by each :class:`BlobCache` instance, as
  before. The LRU use stamp is the sidecar's mtime, so using a blob never
  changes the blob file itself.
* One fetcher per blob: a lock file ``<root>/locks/<hex>.lock`` created with
  ``O_EXCL`` holds ``{"pid", "host", "since"}``. Waiters poll; a holder whose
  pid no longer exists on this host (or, on another host, whose lock is older
  than ``stale_after`` seconds) is stale and its lock is broken under a small
  ``flock`` guard, so two waiters never break a fresh lock. No named shared
  memory, so nothing survives a crash except a file that is detected as stale.
* Size cap (``WARP_CACHE_SIZE_GB``, bytes = GB × 10⁹): before a blob is added
  the least recently used blobs (mtime is the use stamp, refreshed on each
  use) are evicted. Pinned blobs (the working set of a running reader, pinned
  in-process and advertised in ``<root>/pins/<host>-<pid>-<id>.json`` for other
  processes) and blobs being fetched are never evicted. If the working set
  alone exceeds the cap, :class:`CacheTooSmallError` names both sizes.
* Manifests are cached by ``(dataset, version hash)`` under ``manifests/`` (a
  version hash names the manifest's bytes, checked on every load) and the last
  seen ``latest`` pointer (with its ETag and the URL of the store it was seen
  in) under ``pointers/``, so a dataset can be opened offline from the last
  known version of the same store.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import re
import shutil
import socket
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from warpdata.core import envvars
from warpdata.core.atomic import TMP_PREFIX, atomic_file, atomic_write_bytes
from warpdata.core.errors import (
    BlobCorruptedError,
    CacheTooSmallError,
    ConfigError,
    DataError,
    LockTimeoutError,
    UsageError,
)
from warpdata.core.sizes import format_size

GB = 1_000_000_000
_HEX = re.compile(r"^[0-9a-f]{64}$")
VERIFY_MODES = ("stamp", "full")







def normalize_hash(h: str) -> str:
    """Accept ``sha256:<hex>`` or ``<hex>``; return the lowercase hex digest."""
    if not isinstance(h, str):
        raise DataError(f"{h!r} ({type(h).__name__}) is not a SHA-256 content hash",
                        hint="manifests and pointers address blobs as a string of 64 hex digits")
    hexpart = h.split(":", 1)[1] if h.startswith("sha256:") else h
    hexpart = hexpart.lower()
    if not _HEX.match(hexpart):
        raise DataError(f"{h!r} is not a SHA-256 content hash",
                        hint="manifests address blobs as sha256:<64 hex digits>")
    return hexpart


def default_cap_bytes() -> int:
    """``WARP_CACHE_SIZE_GB`` in bytes (bounded; a bad value is a ConfigError naming it)."""
    gb = envvars.number("WARP_CACHE_SIZE_GB")
    return int((50.0 if gb is None else float(gb)) * GB)


_HOST = socket.gethostname()


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True


@dataclass
class CacheStats:
    root: str
    blobs: int
    bytes: int
    cap_bytes: int
    pinned: int
    pinned_bytes: int
    manifests: int
    datasets: int
    temp_files: int

    def to_dict(self) -> dict:
        return dict(self.__dict__)


@dataclass
class GcResult:
    evicted: int = 0
    freed_bytes: int = 0
    kept: int = 0
    kept_bytes: int = 0
    temp_removed: int = 0
    stale_locks_removed: int = 0
    pinned_skipped: int = 0
    evicted_hashes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        d = dict(self.__dict__)
        d.pop("evicted_hashes")
        return d


class BlobCache:
    """A content-addressed cache directory (see module docstring)."""

    def __init__(self, root: str | os.PathLike | None = None, cap_bytes: int | None = None, *,
                 stale_after: float = 600.0, lock_timeout: float = 600.0, verify: str | None = None) -> None:
        self.root = Path(root if root is not None else envvars.default_cache_dir())
        self.cap_bytes = int(cap_bytes) if cap_bytes is not None else default_cap_bytes()
        self.verify_mode = (verify or envvars.get("WARP_CACHE_VERIFY") or "stamp").lower()
        if self.verify_mode not in VERIFY_MODES:
            raise ConfigError(f"cache verification {self.verify_mode!r} is not one of {', '.join(VERIFY_MODES)}",
                              hint="set WARP_CACHE_VERIFY to stamp (the default) or full")
        self.stale_after = stale_after
        self.lock_timeout = lock_timeout
        self.blobs_dir = self.root / "blobs"
        self.locks_dir = self.root / "locks"
        self.pins_dir = self.root / "pins"
        self.manifests_dir = self.root / "manifests"
        self.pointers_dir = self.root / "pointers"
        self.stamps_dir = self.root / "stamps"
        self._verified: dict[str, tuple[int, int, int, int]] = {}  # hex -> stamp of the file hashed OK
        self._pins: dict[str, int] = {}
        self._mu = threading.RLock()
        # one pin file per instance: two caches in one process must not overwrite each other's pins
        self._pin_file = self.pins_dir / f"{_HOST}-{os.getpid()}-{id(self):x}.json"

    # -- paths ------------------------------------------------------------
    def path_for(self, h: str) -> Path:
        hx = normalize_hash(h)
        return self.blobs_dir / hx[:2] / hx

    def _ensure_dirs(self) -> None:
        for d in (self.blobs_dir, self.locks_dir, self.pins_dir):
            d.mkdir(parents=True, exist_ok=True)

    # -- reading ----------------------------------------------------------
    def has(self, h: str) -> bool:
        return self.path_for(h).is_file()

    def stamp_path(self, h: str) -> Path:
        """The sidecar holding the stamp of blob ``h``'s verified file (its mtime: the LRU use stamp)."""
        hx = normalize_hash(h)
        return self.stamps_dir / hx[:2] / hx

    def get(self, h: str, *, verify: bool = True) -> Path | None:
        """The cached blob's path (use stamp refreshed), or None if absent or corrupt.

        A blob that fails verification is deleted so the next fetch replaces it.
        In ``stamp`` mode a blob whose file still matches the stamp recorded when
        it was last hashed is not hashed again (module docstring).
        """
        hx = normalize_hash(h)
        p = self.path_for(hx)
        try:
            st = p.stat()
        except FileNotFoundError:
            return None
        stamp = _stamp(st)
        side = self.stamps_dir / hx[:2] / hx
        if verify and self._verified.get(hx) != stamp:
            if not (self.verify_mode == "stamp" and _read_stamp(side) == stamp):
                if _sha256_path(p) != hx:
                    self._drop(p)
                    self._verified.pop(hx, None)
                    return None
                _write_stamp(side, stamp)
            self._verified[hx] = stamp
        try:
            os.utime(side)  # LRU use stamp (the blob file itself is left alone: its stamp must not move)
        except FileNotFoundError:
            with contextlib.suppress(OSError):
                os.utime(p)  # a blob without a sidecar (verify=False, older caches): its own mtime
        except OSError:
            pass
        return p

    def read_bytes(self, h: str) -> bytes | None:
        p = self.get(h)
        return None if p is None else p.read_bytes()

    # -- writing ----------------------------------------------------------
    def fetch(self, h: str, writer: Callable[[BinaryIO], None], *, size: int | None = None,
              source: str = "") -> Path:
        """Return the verified blob ``h``, calling ``writer(f)`` to download it if needed.

        ``writer`` writes the blob's bytes to ``f`` (a hashing file object).
        ``size`` (when known) lets room be made before the download starts.
        Concurrent callers in any process download it once.
        """
        hx = normalize_hash(h)
        p = self.get(hx)
        if p is not None:
            return p
        self._ensure_dirs()
        with self._blob_lock(hx):
            p = self.get(hx)
            if p is not None:
                return p
            with self.pinned([hx]):
                if size is not None:
                    self._make_room(hx, size)
                target = self.path_for(hx)
                with atomic_file(target, fsync=False) as raw:
                    hf = _HashingWriter(raw)
                    writer(hf)
                    got = hf.hexdigest()
                    if got != hx:
                        raise BlobCorruptedError(
                            f"{source or 'blob'}: downloaded bytes hash to {got}, expected {hx}",
                            hint="the remote object changed or was corrupted in transit; retry, "
                                 "or republish the dataset", expected=hx, got=got, source=source)
                stamp = _stamp(target.stat())
                _write_stamp(self.stamps_dir / hx[:2] / hx, stamp)  # hashed as it landed
                self._verified[hx] = stamp
                if size is None:
                    self._make_room(hx, 0)
            return target

    def adopt(self, h: str, path: str | os.PathLike) -> Path | None:
        """Put the local file ``path`` in the cache as blob ``h`` by a hard link, without copying.

        Used by the publisher so reading what it just published needs no download. The link is
        hashed once before it is trusted (the file may have changed since it was published), then
        stamped like a downloaded blob: an edit of the original later moves the stamp, so the next
        read hashes again and, on a mismatch, drops it and downloads the published bytes. None
        when the file cannot be linked here (another filesystem) or does not hash to ``h``.
        """
        hx = normalize_hash(h)
        p = self.get(hx)
        if p is not None:
            return p
        self._ensure_dirs()
        with self._blob_lock(hx), self.pinned([hx]):
            p = self.get(hx)
            if p is not None:
                return p
            try:
                size = os.stat(path).st_size
            except OSError:
                return None
            self._make_room(hx, size)
            target = self.path_for(hx)
            target.parent.mkdir(parents=True, exist_ok=True)
            tmp = target.with_name(f"{TMP_PREFIX}adopt-{os.getpid()}-{hx}")
            try:
                os.link(path, tmp)
                os.replace(tmp, target)
            except OSError:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
                return None
            self._verified.pop(hx, None)
            return self.get(hx)  # hashes the linked bytes; a mismatch removes the link

    def put_bytes(self, h: str, data: bytes | memoryview) -> Path:
        return self.fetch(h, lambda f: f.write(data), size=len(data))

    def evict(self, h: str) -> None:
        """Forget blob ``h`` (a reader found its bytes bad): the next :meth:`fetch` downloads it again.

        Readers of published data call this once when a member fails its own
        checksum, then fetch the blob again; a second failure is an error
        naming the store object (docs/formats/registry.md, "Readers").
        """
        hx = normalize_hash(h)
        self._drop(self.path_for(hx))
        self._verified.pop(hx, None)

    def _drop(self, p: Path) -> None:
        with contextlib.suppress(FileNotFoundError):
            p.unlink()
        with contextlib.suppress(FileNotFoundError):
            (self.stamps_dir / p.parent.name / p.name).unlink()

    # -- pins -------------------------------------------------------------
    @contextlib.contextmanager
    def pinned(self, hashes: Iterable[str]) -> Iterator[None]:
        """Keep these blobs from eviction (by any process) inside the block."""
        hs = [normalize_hash(h) for h in hashes]
        self.pin(hs)
        try:
            yield
        finally:
            self.unpin(hs)

    def pin(self, hashes: Iterable[str]) -> None:
        with self._mu:
            for h in hashes:
                hx = normalize_hash(h)
                self._pins[hx] = self._pins.get(hx, 0) + 1
            self._write_pins()

    def unpin(self, hashes: Iterable[str]) -> None:
        with self._mu:
            for h in hashes:
                hx = normalize_hash(h)
                n = self._pins.get(hx, 0) - 1
                if n > 0:
                    self._pins[hx] = n
                else:
                    self._pins.pop(hx, None)
            self._write_pins()

    def _write_pins(self) -> None:
        if not self._pins:
            with contextlib.suppress(FileNotFoundError):
                self._pin_file.unlink()
            return
        self.pins_dir.mkdir(parents=True, exist_ok=True)
        doc = {"pid": os.getpid(), "host": _HOST, "blobs": sorted(self._pins)}
        atomic_write_bytes(self._pin_file, json.dumps(doc, sort_keys=True).encode(), fsync=False)

    def pinned_hashes(self) -> set[str]:
        """Blobs pinned by this process and by every live process using this cache."""
        out = set(self._pins)
        if not self.pins_dir.is_dir():
            return out
        for f in self.pins_dir.glob("*.json"):
            try:
                doc = json.loads(f.read_bytes())
            except (OSError, ValueError):
                continue
            if doc.get("host") == _HOST and not _pid_alive(int(doc.get("pid", 0))):
                with contextlib.suppress(FileNotFoundError):
                    f.unlink()  # its process died: its pins are void
                continue
            out.update(doc.get("blobs", []))
        return out

    # -- locks ------------------------------------------------------------
    @contextlib.contextmanager
    def lock(self, name: str) -> Iterator[None]:
        """Hold the cache's lock called ``name`` (any text; one holder at a time in every process on
        this cache, stale holders broken as for blob fetches): readers on one machine that would
        fetch the same bytes into the cache take turns, so the second finds them there."""
        self._ensure_dirs()
        with self._blob_lock(hashlib.sha256(f"warp-lock\0{name}".encode()).hexdigest()):
            yield

    @contextlib.contextmanager
    def _blob_lock(self, hx: str) -> Iterator[None]:
        lock = self.locks_dir / f"{hx}.lock"
        me = json.dumps({"pid": os.getpid(), "host": _HOST, "since": time.time(),
                         "thread": threading.get_ident()}).encode()
        deadline = time.monotonic() + self.lock_timeout
        delay = 0.01
        while True:
            try:
                fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                fd = -1
            if fd >= 0:
                break
            if self.get(hx) is not None:
                # another fetcher finished it while we waited: nothing to lock
                yield
                return
            self._break_if_stale(lock)
            if time.monotonic() > deadline:
                raise LockTimeoutError(f"{lock}: waited {self.lock_timeout:.0f}s for another fetch of blob {hx}",
                                       hint=f"if no warp process is running, delete {lock}")
            time.sleep(delay)
            delay = min(delay * 2, 0.2)
        try:
            os.write(fd, me)
        finally:
            os.close(fd)
        try:
            yield
        finally:
            with contextlib.suppress(FileNotFoundError):
                lock.unlink()

    def lock_holder(self, lock: Path) -> dict | None:
        try:
            return json.loads(lock.read_bytes() or b"{}")
        except FileNotFoundError:
            return None
        except ValueError:
            return {}

    def _is_stale(self, lock: Path, holder: dict | None) -> bool:
        if holder is None:
            return False
        if not holder:  # empty/garbled: the creator died between open and write, or is writing now
            try:
                return time.time() - lock.stat().st_mtime > 5.0
            except FileNotFoundError:
                return False
        if holder.get("host") == _HOST:
            return not _pid_alive(int(holder.get("pid", 0)))
        return time.time() - float(holder.get("since", 0)) > self.stale_after

    def _break_if_stale(self, lock: Path) -> bool:
        import fcntl

        guard = self.locks_dir / ".guard"
        with open(guard, "a+b") as g:
            fcntl.flock(g, fcntl.LOCK_EX)
            try:
                holder = self.lock_holder(lock)
                if self._is_stale(lock, holder):
                    with contextlib.suppress(FileNotFoundError):
                        lock.unlink()
                    return True
                return False
            finally:
                fcntl.flock(g, fcntl.LOCK_UN)

    # -- eviction -----------------------------------------------------------
    def _scan(self) -> list[tuple[float, int, str, Path]]:
        """(use stamp, size, hex, path) of every blob; the use stamp is its sidecar's mtime if any."""
        out = []
        if not self.blobs_dir.is_dir():
            return out
        for sub in os.scandir(self.blobs_dir):
            if not sub.is_dir():
                continue
            blobs, used = [], {}
            with contextlib.suppress(FileNotFoundError, NotADirectoryError):
                for e in os.scandir(self.stamps_dir / sub.name):
                    with contextlib.suppress(FileNotFoundError):
                        used[e.name] = e.stat().st_mtime
            for e in os.scandir(sub.path):
                name = e.name
                if name.startswith(TMP_PREFIX) or not _HEX.match(name):
                    continue
                try:
                    st = e.stat()
                except FileNotFoundError:
                    continue
                blobs.append((st.st_mtime, st.st_size, name, Path(e.path)))
            out += [(used.get(hx, mt), size, hx, p) for mt, size, hx, p in blobs]
        return out

    def _locked(self) -> set[str]:
        if not self.locks_dir.is_dir():
            return set()
        return {n[:-5] for n in os.listdir(self.locks_dir) if n.endswith(".lock")}

    def _make_room(self, incoming: str, incoming_size: int) -> None:
        with self._mu:
            blobs = self._scan()
            sizes = {hx: s for _, s, hx, _ in blobs}
            total = sum(sizes.values()) + (0 if incoming in sizes else incoming_size)
            if total <= self.cap_bytes:
                return
            keep = self.pinned_hashes() | {incoming}
            working = sum(sizes.get(h, 0) for h in keep if h != incoming) + max(incoming_size, sizes.get(incoming, 0))
            if working > self.cap_bytes:
                raise CacheTooSmallError(
                    f"cache cap {format_size(self.cap_bytes)} is smaller than the working set "
                    f"{format_size(working)} ({len(keep)} blob(s) in use at once) in {self.root}",
                    hint="raise WARP_CACHE_SIZE_GB, or read fewer shards at once (smaller prefetch)",
                    cap_bytes=self.cap_bytes, working_set_bytes=working)
            busy = keep | self._locked()
            for _mt, size, hx, p in sorted(blobs):
                if total <= self.cap_bytes:
                    break
                if hx in busy:
                    continue
                self._drop(p)
                self._verified.pop(hx, None)
                total -= size

    def gc(self, limit_bytes: int | None = None) -> GcResult:
        """Evict LRU blobs down to ``limit_bytes`` (default: the cap) and clean leftovers."""
        limit = self.cap_bytes if limit_bytes is None else int(limit_bytes)
        res = GcResult()
        with self._mu:
            res.temp_removed = self._remove_temp_files()
            res.stale_locks_removed = self._remove_stale_locks()
            blobs = self._scan()
            total = sum(s for _, s, _, _ in blobs)
            busy = self.pinned_hashes() | self._locked()
            for _mt, size, hx, p in sorted(blobs):
                if total <= limit:
                    res.kept += 1
                    res.kept_bytes += size
                    continue
                if hx in busy:
                    res.pinned_skipped += 1
                    res.kept += 1
                    res.kept_bytes += size
                    continue
                self._drop(p)
                self._verified.pop(hx, None)
                total -= size
                res.evicted += 1
                res.freed_bytes += size
                res.evicted_hashes.append(hx)
        return res

    def _remove_temp_files(self) -> int:
        n = 0
        if not self.root.is_dir():
            return 0
        cutoff = time.time() - 3600  # younger temp files may belong to a running download
        for d, _dirs, files in os.walk(self.root):
            for name in files:
                if name.startswith(TMP_PREFIX):
                    p = os.path.join(d, name)
                    with contextlib.suppress(FileNotFoundError):
                        if os.stat(p).st_mtime < cutoff:
                            os.unlink(p)
                            n += 1
        return n

    def _remove_stale_locks(self) -> int:
        if not self.locks_dir.is_dir():
            return 0
        return sum(self._break_if_stale(p) for p in self.locks_dir.glob("*.lock"))

    def verify(self, on_progress: Callable[[int], None] | None = None) -> tuple[int, list[str]]:
        """Hash every blob; delete and return the corrupt ones. Returns (checked, corrupt)."""
        bad, n = [], 0
        for _mt, size, hx, p in self._scan():
            n += 1
            if _sha256_path(p) != hx:
                self._drop(p)
                self._verified.pop(hx, None)
                bad.append(hx)
            if on_progress:
                on_progress(size)
        return n, bad

    def clear(self) -> int:
        """Remove every blob, cached manifest and pointer (and the index of shard pieces read by
        pages, whose bytes are blobs); returns bytes freed."""
        freed = sum(s for _, s, _, _ in self._scan())
        for d in (self.blobs_dir, self.stamps_dir, self.manifests_dir, self.pointers_dir, self.locks_dir,
                  self.root / "pieces"):
            shutil.rmtree(d, ignore_errors=True)
        self._verified.clear()
        return freed

    def stats(self) -> CacheStats:
        blobs = self._scan()
        pinned = self.pinned_hashes()
        sizes = {hx: s for _, s, hx, _ in blobs}
        manifests = list(self.manifests_dir.glob("*/*/*.json")) if self.manifests_dir.is_dir() else []
        temps = 0
        if self.root.is_dir():
            for _d, _dirs, files in os.walk(self.root):
                temps += sum(1 for f in files if f.startswith(TMP_PREFIX))
        return CacheStats(root=str(self.root), blobs=len(blobs), bytes=sum(sizes.values()),
                          cap_bytes=self.cap_bytes, pinned=len(pinned & set(sizes)),
                          pinned_bytes=sum(sizes[h] for h in pinned if h in sizes),
                          manifests=len(manifests), datasets=len({m.parent for m in manifests}),
                          temp_files=temps)

    # -- manifests and pointers --------------------------------------------
    def _dataset_dir(self, base: Path, dataset: str) -> Path:
        ws, _, name = dataset.partition("/")
        if not ws or not name or "/" in name or ws in (".", "..") or name in (".", ".."):
            raise UsageError(f"{dataset!r} is not a dataset name", hint="use WORKSPACE/NAME, e.g. demo/coco")
        return base / ws / name

    def put_manifest(self, dataset: str, version: str, data: bytes) -> None:
        p = self._dataset_dir(self.manifests_dir, dataset) / f"{normalize_hash(version)}.json"
        if not p.exists():
            atomic_write_bytes(p, data, fsync=False)

    def has_manifest(self, dataset: str, version: str) -> bool:
        return (self._dataset_dir(self.manifests_dir, dataset) / f"{normalize_hash(version)}.json").is_file()

    def get_manifest(self, dataset: str, version: str) -> bytes | None:
        p = self._dataset_dir(self.manifests_dir, dataset) / f"{normalize_hash(version)}.json"
        try:
            return p.read_bytes()
        except FileNotFoundError:
            return None

    def put_pointer(self, dataset: str, version: str, etag: str | None, store: str | None = None) -> None:
        """Remember ``version`` as the last ``latest`` of ``dataset`` seen in ``store`` (its URL)."""
        p = self._dataset_dir(self.pointers_dir, dataset).with_suffix(".json")
        doc = {"dataset": dataset, "version": normalize_hash(version), "etag": etag, "seen_at": time.time()}
        if store is not None:
            doc["store"] = store
        atomic_write_bytes(p, json.dumps(doc, sort_keys=True).encode(), fsync=False)

    def get_pointer(self, dataset: str, store: str | None = None) -> dict | None:
        """The last ``latest`` of ``dataset`` seen; with ``store``, only one seen in that store (a
        pointer seen through store A never stands in for store B)."""
        p = self._dataset_dir(self.pointers_dir, dataset).with_suffix(".json")
        try:
            doc = json.loads(p.read_bytes())
        except FileNotFoundError:
            return None
        except ValueError:
            return None
        # a damaged pointer is as good as none: the next online open rewrites it
        if not isinstance(doc, dict) or not isinstance(doc.get("version"), str) or not _HEX.match(doc["version"]):
            return None
        if store is not None and doc.get("store") != store:
            return None
        return doc

    def cached_datasets(self) -> list[str]:
        if not self.pointers_dir.is_dir():
            return []
        return sorted(f"{p.parent.name}/{p.stem}" for p in self.pointers_dir.glob("*/*.json"))


class _HashingWriter:
    """A write-only file object that hashes what passes through it."""

    def __init__(self, raw: BinaryIO) -> None:
        self._raw = raw
        self._h = hashlib.sha256()
        self.bytes_written = 0

    def write(self, b) -> int:
        self._h.update(b)
        n = self._raw.write(b)
        self.bytes_written += len(b) if n is None else n
        return len(b)

    def writable(self) -> bool:
        return True

    def flush(self) -> None:
        self._raw.flush()

    def hexdigest(self) -> str:
        return self._h.hexdigest()


def _stamp(st: os.stat_result) -> tuple[int, int, int, int]:
    return (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def _read_stamp(side: Path) -> tuple[int, ...] | None:
    try:
        return tuple(int(x) for x in side.read_bytes().split())
    except (OSError, ValueError):
        return None


def _write_stamp(side: Path, stamp: tuple[int, int, int, int]) -> None:
    with contextlib.suppress(OSError):  # without a sidecar the blob is hashed again on next use: safe
        atomic_write_bytes(side, " ".join(map(str, stamp)).encode(), fsync=False)


def _sha256_path(p: Path) -> str:
    h = hashlib.sha256()
    buf = bytearray(1 << 20)
    view = memoryview(buf)
    try:
        with open(p, "rb", buffering=0) as f:
            while n := f.readinto(buf):
                h.update(view[:n])
    except OSError as e:
        if e.errno == errno.ENOENT:
            return ""
        raise
    return h.hexdigest()
