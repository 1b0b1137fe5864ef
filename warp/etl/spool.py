"""Local copies of object-store sources: one per run, gone when the run ends, swept after a kill.

A pipeline whose source is on object storage may copy part of it to this
machine (the warehouse's label files and spooled image bytes, the feature
cache's media folders). Each run gets a mirror of its own,
``$WARP_CACHE_DIR/etl-source/<sha256(url)[:16]>/run-<id>/`` (:func:`mirror_root`), and

* holds an ``flock`` on ``<mirror>/.owner.lock`` for as long as it lives (:func:`claim`);
* removes it when it ends: success, failure and Ctrl-C (:func:`remove_mirror`, from a ``finally``),
  with the folders above it that it leaves empty (nothing of a finished run stays in the cache);
* first removes every mirror whose lock is free: a run killed with ``kill -9`` (:func:`sweep`).

docs/formats/receipts.md ("Sources on object storage") states the contract.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import shutil
import time
import uuid
from pathlib import Path

from warpdata.core import envvars


def spool_base() -> Path:
    return Path(envvars.default_cache_dir()) / "etl-source"


def mirror_root(url: str) -> Path:
    """A mirror of its own for this run (two runs over the same URL never share a spool)."""
    h = hashlib.sha256(url.rstrip("/").encode()).hexdigest()[:16]
    return spool_base() / h / f"run-{time.time_ns()}-{uuid.uuid4().hex[:8]}"


OWNER = ".owner.lock"
# this process's claimed mirrors: path -> the descriptor holding their lock (released by remove_mirror)
_claimed: dict[str, int] = {}


def claim(mirror: Path) -> None:
    """Create this run's mirror and hold its lock for as long as the run lives: the kernel drops
    an ``flock`` with its process, so a mirror whose lock is free belongs to a dead run."""
    if mirror.exists():
        shutil.rmtree(mirror)
    make_dirs(mirror)
    fd = os.open(mirror / OWNER, os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)
    _claimed[os.fspath(mirror)] = fd


def make_dirs(path: Path, tries: int = 5) -> None:
    """``mkdir -p path``, retried when another run's :func:`prune_empty` removes a parent that was
    empty between our creating it and our creating the next level."""
    for i in range(tries):
        try:
            path.mkdir(parents=True, exist_ok=True)
            return
        except FileNotFoundError:
            if i == tries - 1:
                raise


def prune_empty(path: Path, stop: Path) -> None:
    """Remove ``path`` and each parent up to ``stop``'s parent while they are empty (a folder
    another run is using is not empty, and ``rmdir`` never removes a non-empty one)."""
    stop = stop.parent
    while path != stop and stop in path.parents:
        try:
            path.rmdir()
        except OSError:  # not empty (or gone): whoever uses it removes it
            return
        path = path.parent


def sweep(base: Path, *, grace_s: float = 60.0) -> list[str]:
    """Remove the mirrors under ``base`` (``$WARP_CACHE_DIR/etl-source``) of runs that are gone
    (killed: nothing removed theirs); returns them. A mirror without its lock file yet is another
    run being set up, unless it is older than ``grace_s``."""
    removed: list[str] = []
    for run in sorted(base.glob("*/run-*")):
        if os.fspath(run) in _claimed or not run.is_dir() or run.is_symlink():
            continue
        try:
            fd = os.open(run / OWNER, os.O_RDWR)
        except FileNotFoundError:
            try:
                young = time.time() - run.stat().st_mtime < grace_s
            except FileNotFoundError:
                continue
            if young:
                continue
            fd = None
        if fd is not None:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:  # its run is alive
                os.close(fd)
                continue
        try:
            shutil.rmtree(run, ignore_errors=True)
            removed.append(os.fspath(run))
        finally:
            if fd is not None:
                os.close(fd)
        prune_empty(run.parent, base)
    return removed


def remove_mirror(mirror: Path) -> None:
    """Drop a run's mirror (labels, placeholders, spooled image bytes): on success, failure and
    Ctrl-C alike; a killed run's is swept by the next (:func:`sweep`). The folders above it
    (``etl-source/<url hash>/``, ``etl-source/``) go too when no other run is in them."""
    with contextlib.suppress(FileNotFoundError):
        shutil.rmtree(mirror)
    fd = _claimed.pop(os.fspath(mirror), None)
    if fd is not None:
        os.close(fd)
    prune_empty(mirror.parent, spool_base())
