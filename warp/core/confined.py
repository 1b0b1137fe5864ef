"""File names an artifact's manifest gives, confined to the artifact before anything opens them.

A manifest (a warehouse's, a feature cache's, a tiles array's) names its shard and side files
relative to its own directory. An edited or hostile manifest could name an absolute path, climb
out with ``..``, point at a symlink that leads out, or at a special file (``/dev/zero``, a FIFO
that blocks the reader, a directory). :func:`confined` refuses each of these with an
:class:`UnconfinedPathError` (a :class:`~warpdata.core.errors.DataError`, exit 65) naming the
manifest and the entry, before the file is opened.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path, PurePosixPath, PureWindowsPath

from warpdata.core.errors import DataError

HINT = "the manifest is damaged or hostile: rebuild the artifact with the command that wrote it"


class UnconfinedPathError(DataError):
    """A manifest entry that names a file outside its artifact, or a file that is not a regular file."""

    code = "unconfined-path"


def confined(root: str | os.PathLike, name: object, where: str, *, entry: str = "file",
             must_exist: bool = False, hint: str = HINT, directory: bool = False) -> Path:
    """The path of file ``name`` of the artifact in directory ``root``, as manifest ``where`` names it
    (``entry`` says which field, for the message).

    Refused: a name that is not a non-empty string, is absolute, has a ``..`` part or a NUL; a path
    that resolves (symlinks followed) outside ``root``; a path that exists and is not a regular file
    (a device, a FIFO, a socket, a directory). A missing file is returned (its reader reports it),
    unless ``must_exist``. With ``directory`` the path must be a directory instead of a regular
    file (a Zarr pyramid's level directory, docs/formats/zarr-tiles.md)."""
    def refuse(why: str) -> UnconfinedPathError:
        return UnconfinedPathError(f"{where}: {entry} {str(name)[:200]!r} {why}", hint=hint, path=where,
                                   entry=str(name)[:200])

    if not isinstance(name, str) or not name:
        raise refuse("is not a file name")
    if "\x00" in name or os.path.isabs(name) or PureWindowsPath(name).drive or name.startswith(("/", "\\")):
        raise refuse("is an absolute path: a manifest names its files relative to the artifact")
    if ".." in PurePosixPath(name).parts or ".." in PureWindowsPath(name).parts:
        raise refuse("climbs out of the artifact with '..'")
    base = Path(root).resolve()
    p = base / name
    real = p.resolve()
    if not real.is_relative_to(base):
        raise refuse(f"resolves outside the artifact {root} (a symlink leads to {real})")
    try:
        st = os.stat(real)
    except FileNotFoundError:
        if must_exist:
            raise refuse("does not exist") from None
        return p
    except OSError as e:
        raise refuse(f"cannot be examined: {e.strerror or e}") from None
    if directory:
        if not stat.S_ISDIR(st.st_mode):
            raise refuse("is not a directory")
        return p
    if not stat.S_ISREG(st.st_mode):
        raise refuse("is not a regular file (a device, FIFO, socket or directory)")
    return p
