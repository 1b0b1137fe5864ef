"""``os_failure``: each errno the operating system answers with becomes its typed error and exit."""

from __future__ import annotations

import errno
import os
import pickle

import pytest
from warpdata.core.errors import (
    CannotCreateError,
    ExitCode,
    FileTooLargeError,
    MissingInputError,
    NoSpaceError,
    OSIOError,
    OSPermissionError,
    ReadOnlyFileSystemError,
    TooManyOpenFilesError,
    os_failure,
)

CASES = [
    (errno.ENOSPC, NoSpaceError, ExitCode.IOERR, "no space left"),
    (errno.EDQUOT, NoSpaceError, ExitCode.IOERR, "quota"),
    (errno.EFBIG, FileTooLargeError, ExitCode.IOERR, "file too large"),
    (errno.EIO, OSIOError, ExitCode.IOERR, "I/O error"),
    (errno.EROFS, ReadOnlyFileSystemError, ExitCode.CANTCREAT, "read-only"),
    (errno.ENOTDIR, CannotCreateError, ExitCode.CANTCREAT, "not a directory"),
    (errno.EISDIR, CannotCreateError, ExitCode.CANTCREAT, "is a directory"),
    (errno.EACCES, OSPermissionError, ExitCode.NOPERM, "permission denied"),
    (errno.EPERM, OSPermissionError, ExitCode.NOPERM, "not permitted"),
    (errno.EMFILE, TooManyOpenFilesError, ExitCode.CONFIG, "too many open files"),
    (errno.ENOENT, MissingInputError, ExitCode.NO_INPUT, "does not exist"),
    (errno.ENXIO, OSIOError, ExitCode.IOERR, "ENXIO"),
]


@pytest.mark.parametrize(("code", "cls", "exit_code", "words"), CASES)
def test_errno_to_typed_error(code, cls, exit_code, words):
    e = os_failure(OSError(code, os.strerror(code), "/data/out/shard-0.bin"))
    assert type(e) is cls and e.exit_code == exit_code
    assert words in e.message and "/data/out/shard-0.bin" in e.message and e.hint
    assert e.to_dict()["details"]["errno"] == errno.errorcode[code]
    assert isinstance(e, OSError)  # `except OSError` still catches it
    again = pickle.loads(pickle.dumps(e))  # crosses a process pool intact
    assert type(again) is cls and again.hint == e.hint


def test_stream_and_unnamed_file():
    assert os_failure(OSError(errno.ENOSPC, "No space left on device"), "stdout").message == \
        "no space left on the device writing stdout"
    assert "did not say which" in os_failure(OSError(errno.EFBIG, "File too large")).message
    assert isinstance(os_failure(PermissionError(errno.EACCES, "Permission denied", "/x")), PermissionError)


def test_a_rename_from_a_writers_temporary_names_only_the_target(tmp_path):
    # review finding: `warp tar-to-tbl IN DIR --force` said "cannot write /x/.warp-tmp-…-out-DIR -> DIR"
    from warpdata.core.atomic import temp_prefix

    tmp = tmp_path / f"{temp_prefix()}abc-out.tbl"
    tmp.write_bytes(b"x")
    (tmp_path / "out").mkdir()
    with pytest.raises(OSError) as e:
        os.rename(tmp, tmp_path / "out")
    err = os_failure(e.value)
    assert isinstance(err, CannotCreateError) and err.message == f"cannot write {tmp_path / 'out'}: it is a directory"
    plain = os_failure(OSError(errno.EXDEV, "Invalid cross-device link", "a", None, "b"))
    assert "a -> b" in plain.message  # two names the user gave stay both named
