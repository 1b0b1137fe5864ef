"""Local array outputs: built under a temporary name, put in place with no gap, leftovers cleaned.

docs/formats/zarr-tiles.md ("Writing and replacing") is the contract:

* a writer builds its output in a temporary sibling directory
  ``.warp-tmp-<pid>-<random>-<name>`` (same parent, so renames do not cross
  filesystems), created with the process umask's permissions (``mkdtemp``
  makes 0700 directories, which other users of shared storage could not
  read);
* on success the temporary directory takes the final name. When the final
  name already holds an output, the two are swapped in one step with
  ``renameat2(RENAME_EXCHANGE)`` (Linux ≥ 3.15, glibc ≥ 2.28; called through
  ctypes): at every instant the final name holds either the old output or
  the new one. The old one, now under the temporary name, is then removed.
  Where the exchange is unavailable (another OS, an old libc, a filesystem
  that refuses it: EINVAL) the fallback renames the old output aside and
  the new one in — two renames, so a kill between them leaves nothing under
  the final name (the old output survives under ``.warp-tmp-old-…``);
* on failure the temporary directory is removed;
* a later run for the same name removes temporary leftovers of killed runs:
  entries matching the pattern above that are older than the run and whose
  process is not running on this host (leftovers of other hosts sharing the
  storage are removed once older than the run too; a run on another host
  that started earlier and is still writing would lose its temporary
  directory, so do not point concurrent writers on different hosts at one
  output name).

Only directories that look like array outputs (empty, or holding a
``zarr.json`` or ``manifest.json``) are replaced: a path naming anything else
is a ConfigError before any work starts.

The exchange, the umask modes and the liveness test are warp/core/atomic.py's.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import shutil
import tempfile
import time
from pathlib import Path

from warpdata.core import atomic
from warpdata.core.atomic import TMP_PREFIX
from warpdata.core.errors import ConfigError
from warpdata.core.names import MANIFEST_NAME


def _leftover_re(name: str) -> re.Pattern:
    # .warp-tmp-<pid>-<8 random>-<name>, and the forms without a pid / with "old-" (warp/core/atomic.py's atomic_dir)
    return re.compile(rf"^{re.escape(TMP_PREFIX)}(?:old-)?(?:(\d+)-)?[a-z0-9_]{{8}}-{re.escape(name)}$")


def clean_leftovers(target: str | os.PathLike, started: float) -> list[str]:
    """Remove temporary leftovers of ``target`` from killed runs (see the module docstring); returns their paths."""
    target = Path(target)
    pattern = _leftover_re(target.name)
    removed = []
    try:
        entries = list(os.scandir(target.parent))
    except OSError:
        return removed
    for e in entries:
        m = pattern.match(e.name)
        if m is None:
            continue
        try:
            if e.stat(follow_symlinks=False).st_mtime >= started:
                continue
        except OSError:
            continue
        if m.group(1) is not None and (int(m.group(1)) == os.getpid() or atomic.pid_alive(int(m.group(1)))):
            continue
        if e.is_dir(follow_symlinks=False):
            shutil.rmtree(e.path, ignore_errors=True)
        else:
            with contextlib.suppress(OSError):
                os.unlink(e.path)
        removed.append(e.path)
    return removed


def check_replaceable(target: str | os.PathLike) -> None:
    """ConfigError unless ``target`` is absent, an empty directory or an array output (zarr.json / manifest.json)."""
    t = Path(target)
    if not os.path.lexists(t):
        return
    if t.is_symlink() or not t.is_dir():
        raise ConfigError(f"{t} exists and is not a directory", hint="choose another output path, or remove it")
    if (t / "zarr.json").exists() or (t / MANIFEST_NAME).exists() or not any(t.iterdir()):
        return
    raise ConfigError(f"{t} exists and is not a Zarr array written by warp (no zarr.json or manifest.json)",
                      hint="choose another output path, or remove that directory first")


def make_temp_dir(target: str | os.PathLike) -> Path:
    """A fresh temporary sibling of ``target`` with the umask's directory permissions."""
    t = Path(target)
    t.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f"{TMP_PREFIX}{os.getpid()}-", suffix="-" + t.name, dir=t.parent))
    os.chmod(tmp, atomic.dir_mode())
    return tmp


def publish_dir(tmp: str | os.PathLike, target: str | os.PathLike, *, fsync: bool = True) -> str:
    """Give the finished ``tmp`` the name ``target``, replacing what is there with no gap where the OS allows.

    Returns how: ``"renamed"`` (nothing was there), ``"exchanged"`` (swapped with the old output, which is
    then removed) or ``"renamed-aside"`` (the documented fallback: old output renamed aside first).
    """
    tmp, target = Path(tmp), Path(target)
    how = "renamed"
    if os.path.lexists(target):
        check_replaceable(target)
        if atomic.exchange(tmp, target):
            how = "exchanged"
        else:
            old = Path(tempfile.mkdtemp(prefix=f"{TMP_PREFIX}old-{os.getpid()}-", suffix="-" + target.name,
                                        dir=target.parent))
            os.replace(target, old)  # rename(2) onto the empty placeholder directory
            os.replace(tmp, target)
            tmp = old
            how = "renamed-aside"
        if fsync:
            atomic.fsync_dir(target.parent)
        shutil.rmtree(tmp, ignore_errors=True)  # the old output, now under a temporary name
        return how
    try:
        os.rename(tmp, target)
    except OSError as e:
        if e.errno in (errno.EEXIST, errno.ENOTEMPTY):  # created meanwhile: replace it the same way
            return publish_dir(tmp, target, fsync=fsync)
        raise
    if fsync:
        atomic.fsync_dir(target.parent)
    return how


def run_started() -> float:
    """The reference time for :func:`clean_leftovers` (entries modified before it belong to earlier runs)."""
    return time.time()
