"""Atomic writes: a killed process leaves the old state or the new one.

Files are written to a temporary sibling (same directory, so the rename does
not cross filesystems), flushed and fsync'd, then renamed over the target;
the directory is fsync'd so the rename itself is durable. Directories are
built under a temporary sibling and renamed into place the same way.
Temporary names start with ``.warp-tmp-`` so ``warp doctor`` and cleanup
can recognise leftovers of killed runs.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

TMP_PREFIX = ".warp-tmp-"


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
def atomic_file(path: str | os.PathLike, *, fsync: bool = True, mode: int = 0o644) -> Iterator[BinaryIO]:
    """Open a temporary file for binary writing; on success rename it to ``path``.

    On any exception the temporary file is removed and ``path`` is untouched.
    """
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=TMP_PREFIX, suffix="-" + target.name, dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            yield f
            f.flush()
            if fsync:
                os.fsync(f.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    if fsync:
        fsync_dir(target.parent)


def atomic_write_bytes(path: str | os.PathLike, data: bytes | bytearray | memoryview, *, fsync: bool = True) -> None:
    with atomic_file(path, fsync=fsync) as f:
        f.write(data)


def atomic_write_text(path: str | os.PathLike, text: str, *, fsync: bool = True) -> None:
    atomic_write_bytes(path, text.encode("utf-8"), fsync=fsync)


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
    fd, tmp = tempfile.mkstemp(prefix=TMP_PREFIX, suffix="-" + target.name, dir=target.parent)
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
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


@contextlib.contextmanager
def atomic_dir(path: str | os.PathLike, *, replace: bool = False) -> Iterator[Path]:
    """Build a directory under a temporary sibling; rename it to ``path`` on success.

    If ``path`` exists: with ``replace`` it is swapped out after the new one
    is complete (old moved aside, new renamed in, old removed), otherwise
    FileExistsError is raised before any work starts, and also at the end if
    a concurrent writer created ``path`` meanwhile (its result is kept).
    """
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    if target.exists() and not replace:
        raise FileExistsError(str(target))
    tmp = Path(tempfile.mkdtemp(prefix=TMP_PREFIX, suffix="-" + target.name, dir=target.parent))
    try:
        yield tmp
        for root, _dirs, files in os.walk(tmp):
            for name in files:
                with open(os.path.join(root, name), "rb") as f:
                    os.fsync(f.fileno())
            fsync_dir(root)
        if replace and target.exists():
            old = Path(tempfile.mkdtemp(prefix=f"{TMP_PREFIX}old-", suffix="-" + target.name, dir=target.parent))
            os.replace(target, old)  # rename(2) onto the empty placeholder dir
            os.replace(tmp, target)
            shutil.rmtree(old, ignore_errors=True)
        else:
            try:
                os.rename(tmp, target)  # fails if a racing writer put a non-empty dir there
            except OSError as e:
                if e.errno in (errno.EEXIST, errno.ENOTEMPTY):
                    raise FileExistsError(errno.EEXIST, "created concurrently", str(target)) from None
                raise
        fsync_dir(target.parent)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
