"""Atomic writes: a killed process leaves the old state or the new one.

Files are written to a temporary sibling (same directory, so the rename does
not cross filesystems), flushed and fsync'd, then renamed over the target;
the directory is fsync'd so the rename itself is durable. Directories are
built under a temporary sibling and renamed into place the same way.
Temporary names start with ``.warp-tmp-`` so ``warp doctor`` and cleanup
can recognise leftovers of killed runs (:func:`remove_stale_temps`).

Replacing an existing directory has no gap: on Linux the new tree and the
old one trade places in one ``renameat2(RENAME_EXCHANGE)`` call
(:func:`exchange`), so at every instant the target is the old tree or the new
one, and a kill leaves at most one ``.warp-tmp-`` sibling behind, which the
next run (or ``warp cache gc``) removes. Where the call is missing (not
Linux, old kernels, filesystems without it: ``EINVAL``/``ENOSYS``), the
documented fallback is the two-rename swap: the old tree is renamed aside,
then the new one in; a kill between the two leaves the target missing and
the old tree under a ``.warp-tmp-old-`` name (docs/formats/feature-shard.md).
Directories are created with the mode the umask gives (``0777 & ~umask``),
not ``mkdtemp``'s 0700.

Outputs that must not be overwritten (``warp tar-to-tbl`` without ``--force``,
``warp init``) are moved into place with no-replace semantics
(:func:`rename_noreplace`): ``renameat2(RENAME_NOREPLACE)``, else ``link`` +
``unlink`` (a hard link fails if the name exists), so of two runs racing for
one output exactly one succeeds and the other gets ``FileExistsError``; a
check for the name before the work starts only makes the common case fail
early.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import BinaryIO

from warpdata.core.names import TMP_PREFIX

_AT_FDCWD = -100
_RENAME_NOREPLACE = 1
_RENAME_EXCHANGE = 2
_renameat2 = None  # resolved on first use: the libc function, or False where there is none


def _libc_renameat2():
    global _renameat2
    if _renameat2 is None:
        _renameat2 = False
        if sys.platform.startswith("linux"):
            import ctypes

            try:
                libc = ctypes.CDLL(None, use_errno=True)
                fn = libc.renameat2
            except (OSError, AttributeError):  # glibc < 2.28, other libcs
                fn = None
            if fn is not None:
                fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
                fn.restype = ctypes.c_int
                _renameat2 = fn
    return _renameat2


def exchange(a: str | os.PathLike, b: str | os.PathLike) -> bool:
    """Atomically swap the names ``a`` and ``b`` (both must exist); False where the OS cannot.

    ``renameat2(RENAME_EXCHANGE)`` through ctypes (Linux >= 3.15, glibc >= 2.28).
    Returns False (nothing changed) when the call or the filesystem lacks it;
    other failures raise OSError.
    """
    fn = _libc_renameat2()
    if not fn:
        return False
    import ctypes

    if fn(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.ENOTSUP):
        return False
    raise OSError(err, os.strerror(err), str(a), None, str(b))


def rename_noreplace(src: str | os.PathLike, dst: str | os.PathLike) -> None:
    """Rename ``src`` to ``dst`` only if ``dst`` does not exist; FileExistsError if it does.

    Atomic: of several processes moving files to one ``dst`` exactly one wins.
    ``renameat2(RENAME_NOREPLACE)`` (Linux >= 3.15; files and directories); where the
    call or the filesystem lacks it, a file is hard-linked to ``dst`` (``link`` fails
    on an existing name) and ``src`` unlinked; a filesystem without hard links gets
    ``dst`` claimed with ``O_CREAT | O_EXCL`` and then replaced by ``src`` (a reader
    may see an empty ``dst`` for that instant, never a partial one).
    """
    fn = _libc_renameat2()
    if fn:
        import ctypes

        if fn(_AT_FDCWD, os.fsencode(src), _AT_FDCWD, os.fsencode(dst), _RENAME_NOREPLACE) == 0:
            return
        err = ctypes.get_errno()
        if err == errno.EEXIST:
            raise FileExistsError(err, os.strerror(err), str(dst))
        if err not in (errno.EINVAL, errno.ENOSYS, errno.ENOTSUP):
            raise OSError(err, os.strerror(err), str(src), None, str(dst))
    if os.path.isdir(src) and not os.path.islink(src):
        os.mkdir(dst)  # claims the name (FileExistsError if taken); rename(2) replaces an empty directory
        os.rename(src, dst)
        return
    try:
        os.link(src, dst, follow_symlinks=False)  # FileExistsError when dst is taken
    except OSError as e:
        if e.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EMLINK, errno.ENOSYS):
            raise
        os.close(os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
        os.replace(src, dst)
        return
    os.unlink(src)


def current_umask() -> int:
    """The process umask, read without changing it (Linux: /proc/self/status), else by setting and restoring it."""
    try:
        with open("/proc/self/status", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    old = os.umask(0o022)  # not thread-safe for an instant; only where /proc is missing
    os.umask(old)
    return old


def _umask_mode(base: int = 0o777) -> int:
    return base & ~current_umask()


def dir_mode() -> int:
    """Permissions for a new output directory: 0777 less the umask (``mkdtemp`` alone gives 0700)."""
    return _umask_mode(0o777)


def file_mode() -> int:
    """Permissions for a new output file: 0666 less the umask."""
    return _umask_mode(0o666)


def pid_alive(pid: int) -> bool:
    """True when process ``pid`` runs on this host (or exists under another user)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    except OSError:
        return False
    return True


def temp_prefix() -> str:
    """``.warp-tmp-<pid>-``: cleanup can tell a live writer's temporary from a killed one's."""
    return f"{TMP_PREFIX}{os.getpid()}-"


def _owner_alive(name: str) -> bool:
    """True when temp ``name`` (``.warp-tmp-<pid>-...``) belongs to a process still running here."""
    head = name[len(TMP_PREFIX):].split("-", 1)[0]
    if not head.isdigit():
        return False
    pid = int(head)
    return pid != os.getpid() and pid_alive(pid)


def remove_stale_temps(dirs: Iterable[str | os.PathLike], *, older_than: float | None = None,
                       recursive: bool = False, exclude: tuple[str, ...] = ()) -> list[str]:
    """Remove ``.warp-tmp-*`` files and directories under ``dirs`` last changed before ``older_than``.

    ``older_than`` is a ``time.time()`` value (default: now); a caller that
    started at T passes T so a concurrent run's fresh temporaries survive.
    With ``recursive`` every subdirectory is searched too (a store's
    ``blobs/`` tree); names starting with one of ``exclude`` are left alone
    (their owner cleans them). Returns the removed paths. Used by ``warp etl`` reruns and
    by :func:`warpdata.core.atomic.gc_temps` (the ``warp cache gc`` hook).
    """
    cutoff = time.time() if older_than is None else older_than
    removed: list[str] = []
    for d in dirs:
        d = os.fspath(d)
        if not os.path.isdir(d):
            continue
        walker = os.walk(d) if recursive else [(d, [], [])]
        for root, subdirs, _files in walker:
            try:
                entries = list(os.scandir(root))
            except OSError:
                continue
            for e in entries:
                if not e.name.startswith(TMP_PREFIX) or (exclude and e.name.startswith(exclude)):
                    continue
                try:
                    st = e.stat(follow_symlinks=False)
                except FileNotFoundError:
                    continue
                if st.st_mtime >= cutoff or _owner_alive(e.name):
                    continue
                if e.is_dir(follow_symlinks=False):
                    shutil.rmtree(e.path, ignore_errors=True)
                    if e.name in subdirs:
                        subdirs.remove(e.name)
                else:
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(e.path)
                removed.append(e.path)
    return removed


class CommitOnSuccess:
    """Context-manager protocol for writers: ``close()`` commits on success, ``abort()``
    removes what was written when the block raises (including KeyboardInterrupt)."""

    def close(self) -> None:  # pragma: no cover - every writer defines it
        raise TypeError(f"{type(self).__name__} must define close()")

    def abort(self) -> None:  # pragma: no cover - every writer defines it
        raise TypeError(f"{type(self).__name__} must define abort()")

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()


def remove_unless_locked(path: str | os.PathLike, lock: str | os.PathLike) -> bool:
    """Remove the directory ``path`` unless a running process holds ``lock`` (an ``flock`` beside it,
    taken by the build that owns the directory); then remove the lock file too. True when removed.

    The build directories of `warp etl` (docs/formats/receipts.md) are swept this way: a killed
    run's directory goes, a running one's stays."""
    import fcntl  # POSIX only; warp's builds run on POSIX

    fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False  # the build that owns it is running
        shutil.rmtree(path, ignore_errors=True)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(lock)
        return True
    finally:
        os.close(fd)


def fsync_dir(path: str | os.PathLike) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


@contextlib.contextmanager
def atomic_file(path: str | os.PathLike, *, fsync: bool = True, mode: int = 0o644,
                exclusive: bool = False) -> Iterator[BinaryIO]:
    """Open a temporary file for binary writing; on success rename it to ``path``.

    On any exception the temporary file is removed and ``path`` is untouched.
    With ``exclusive`` an existing ``path`` is never replaced: FileExistsError,
    also when another process created it while this one wrote (:func:`rename_noreplace`).
    """
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=temp_prefix(), suffix="-" + target.name, dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            yield f
            f.flush()
            if fsync:
                os.fsync(f.fileno())
        os.chmod(tmp, mode)
        if exclusive:
            rename_noreplace(tmp, target)
        else:
            os.replace(tmp, target)
    except BaseException as e:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        if isinstance(e, OSError) and e.filename == tmp:  # the rename's error names the temporary file,
            e.filename, e.filename2 = os.fspath(target), None  # which no longer exists: name the target
        name_write_error(e, target)
        raise
    if fsync:
        fsync_dir(target.parent)


# errors of a write(2) that names no file: the CLI names the file from ``filename`` (warp/cli/app.py)
_WRITE_ERRNOS = frozenset({errno.ENOSPC, errno.EFBIG, errno.EDQUOT, errno.EIO})


def name_write_error(e: BaseException, path: str | os.PathLike) -> None:
    """Give a nameless write error (disk full, file too large, quota) the file it was writing."""
    if isinstance(e, OSError) and e.filename is None and e.errno in _WRITE_ERRNOS:
        e.filename = os.fspath(path)


def atomic_write_bytes(path: str | os.PathLike, data: bytes | bytearray | memoryview, *, fsync: bool = True,
                       exclusive: bool = False) -> None:
    with atomic_file(path, fsync=fsync, exclusive=exclusive) as f:
        f.write(data)


def atomic_write_text(path: str | os.PathLike, text: str, *, fsync: bool = True, exclusive: bool = False) -> None:
    atomic_write_bytes(path, text.encode("utf-8"), fsync=fsync, exclusive=exclusive)


def create_exclusive(path: str | os.PathLike, data: bytes | bytearray | memoryview | None = None, *,
                     source: str | os.PathLike | None = None) -> bool:
    """Create ``path`` only if it does not exist (create-only write).

    The content is ``data``, or the file at ``source`` copied in 1 MiB blocks.
    Returns False when the file already exists. The bytes are written to a
    temporary file first and linked into place, so a reader never sees a
    partial file and two racing writers produce exactly one winner.
    """
    if (data is None) == (source is None):
        raise TypeError("create_exclusive needs exactly one of data= or source=")
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=temp_prefix(), suffix="-" + target.name, dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            if source is None:
                f.write(data)
            else:
                with open(source, "rb") as src:
                    shutil.copyfileobj(src, f, 1 << 20)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
        try:
            os.link(tmp, target)
        except FileExistsError:
            return False
        fsync_dir(target.parent)
        return True
    except OSError as e:
        name_write_error(e, target)
        raise
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


@contextlib.contextmanager
def atomic_dir(path: str | os.PathLike, *, replace: bool = False) -> Iterator[Path]:
    """Build a directory under a temporary sibling; rename it to ``path`` on success.

    If ``path`` exists: with ``replace`` it is exchanged with the new one in
    one step once the new one is complete (:func:`exchange`; the two-rename
    fallback elsewhere), then the old tree is removed; otherwise
    FileExistsError is raised before any work starts, and also at the end if
    a concurrent writer created ``path`` meanwhile (its result is kept).
    Leftovers of killed runs (``.warp-tmp-*-<name>`` siblings older than this
    call) are removed first. The directory gets ``0777 & ~umask``.
    """
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    if target.exists() and not replace:
        raise FileExistsError(str(target))
    started = time.time()
    for leftover in target.parent.glob(f"{TMP_PREFIX}*-{target.name}"):
        with contextlib.suppress(OSError):
            # a live writer's temp (its pid is in the name) survives; so does anything newer than this call
            if not _owner_alive(leftover.name) and leftover.lstat().st_mtime < started:
                shutil.rmtree(leftover) if leftover.is_dir() and not leftover.is_symlink() else leftover.unlink()
    tmp = Path(tempfile.mkdtemp(prefix=f"{TMP_PREFIX}{os.getpid()}-", suffix="-" + target.name, dir=target.parent))
    os.chmod(tmp, _umask_mode())
    try:
        yield tmp
        for root, _dirs, files in os.walk(tmp):
            for name in files:
                with open(os.path.join(root, name), "rb") as f:
                    os.fsync(f.fileno())
            fsync_dir(root)
        if replace and target.exists():
            if exchange(tmp, target):  # no instant without a target; tmp now names the old tree
                fsync_dir(target.parent)
                shutil.rmtree(tmp, ignore_errors=True)
            else:
                old = Path(tempfile.mkdtemp(prefix=f"{TMP_PREFIX}{os.getpid()}-old-", suffix="-" + target.name,
                                            dir=target.parent))
                os.replace(target, old)  # rename(2) onto the empty placeholder dir
                os.replace(tmp, target)
                shutil.rmtree(old, ignore_errors=True)
        else:
            try:
                rename_noreplace(tmp, target)  # a racing writer's result, even an empty dir, is kept
            except OSError as e:
                if e.errno in (errno.EEXIST, errno.ENOTEMPTY):
                    raise FileExistsError(errno.EEXIST, "created concurrently", str(target)) from None
                raise
        fsync_dir(target.parent)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


@contextlib.contextmanager
def build_lock(lock_path: Path, what: str) -> Iterator[None]:
    """One build of ``what`` at a time across processes: a second waits on ``lock_path`` (flock),
    then re-checks for the first one's result. The lock file is removed after the build, built or
    failed; everyone re-checks after locking, so that is safe."""
    import fcntl
    import logging

    for attempt in range(5):
        lock_path.parent.mkdir(parents=True, exist_ok=True)
        try:
            fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
            break
        except FileNotFoundError:  # another build removed the folder it left empty: make it again
            if attempt == 4:
                raise
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            logging.getLogger(__name__).info("waiting for another 'warp etl' building %s", what)
            fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            yield
        finally:
            # held: removed after a failed build too (a lock file must not outlive its build)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(lock_path)
    finally:
        os.close(fd)
