"""Typed errors and the exit codes they map to.

Every expected failure in warp raises a :class:`WarpError` subclass. Each
carries a one-line ``message`` (the cause, naming the file/sample/key it is
about) and a ``hint`` (the command or setting to try next), and maps to an
:class:`ExitCode`. Classes also inherit the matching builtin so library users
can catch them naturally (``except FileNotFoundError`` catches
:class:`MissingInputError`).

The table of exit codes is documented in ``warp(1)`` (EXIT STATUS). This is the
one module of shared error classes; a format's own invariants (``TblError``,
``TWH1FormatError``, ...) subclass :class:`DataError` beside their codec in
``formats/``. The store and dataset errors:

========================== ===================== ==== ==========================
class                      warp base             exit builtin
========================== ===================== ==== ==========================
``AuthenticationError``    ``ConfigError``       78   ``ValueError``
``StorePermissionError``   ``ConfigError``       78   ``PermissionError``
``StoreUnavailableError``  ``ConfigError``       78   ``ConnectionError``
``LockTimeoutError``       ``InfrastructureError`` 75 ``TimeoutError``
``DatasetNotFoundError``   ``MissingInputError`` 66   ``FileNotFoundError``
``BlobNotFoundError``      ``MissingInputError`` 66   ``FileNotFoundError``
``ManifestCorruptedError`` ``DataError``         65   ``ValueError``
``BlobCorruptedError``     ``DataError``         65   ``ValueError``
``LocalPathError``         ``DataError``         65   ``ValueError``
``InvalidDatasetIdError``  ``UsageError``        2    ``ValueError``
``InvalidHashError``       ``UsageError``        2    ``ValueError``
``CacheTooSmallError``     ``ConfigError``       78   ``ValueError``
``ReadOnlyStoreError``     ``ConfigError``       78   ``PermissionError``
``RangeNotSupportedError`` ``ConfigError``       78   ``ValueError``
``NotListableError``       ``UsageError``        2    ``ValueError``
``StoreBusyError``         ``InfrastructureError`` 75 ``ConnectionError``
``UntrustedVersionError``  ``WarpError``         77   ``PermissionError``
========================== ===================== ==== ==========================

Operating-system failures (:func:`os_failure` maps an ``OSError`` by its errno;
the CLI applies it to any ``OSError`` a command lets through, naming the path
or stream):

=========================== ==================== ==== =========================
class                       errno                exit builtin
=========================== ==================== ==== =========================
``NoSpaceError``            ENOSPC, EDQUOT       74   ``OSError``
``FileTooLargeError``       EFBIG                74   ``OSError``
``OSIOError``               EIO and the rest     74   ``OSError``
``ReadOnlyFileSystemError`` EROFS                73   ``OSError``
``CannotCreateError``       ENOTDIR, EISDIR, ... 73   ``OSError``
``OSPermissionError``       EACCES, EPERM        77   ``PermissionError``
``TooManyOpenFilesError``   EMFILE, ENFILE       78   ``OSError``
``ResourceExhaustedError``  fork/spawn EAGAIN    71   ``OSError``
=========================== ==================== ==== =========================

A thread that will not start (``RuntimeError: can't start new thread``) is
:class:`ResourceExhaustedError` too (:func:`thread_start_failure`); an optional
package's ``ImportError`` is :class:`DependencyError`, exit 78, naming its extra
(:func:`dependency_error`, :data:`OPTIONAL_MODULES`).

A closed stdout (EPIPE) is no error: the CLI ends quietly with 141.

Store clients' own exceptions are translated into these by
:func:`warpdata.storage.errors.translate_storage_error`.
"""

from __future__ import annotations

from enum import IntEnum

from warpdata.core.names import TMP_PREFIX


class ExitCode(IntEnum):
    OK = 0
    NEGATIVE = 1  # a check ran and found a problem: verify/doctor failure
    USAGE = 2  # bad command line
    DATA = 65  # input data is malformed (EX_DATAERR)
    NO_INPUT = 66  # input missing or unreadable (EX_NOINPUT)
    INTERNAL = 70  # a bug in warp (EX_SOFTWARE)
    OSERR = 71  # the system could not start a thread or process (EX_OSERR)
    CANTCREAT = 73  # an output cannot be created: read-only file system, not a directory (EX_CANTCREAT)
    IOERR = 74  # reading or writing failed: no space, file too large, quota, I/O error (EX_IOERR)
    TEMPFAIL = 75  # infrastructure failed (object store unreachable); a rerun resumes (EX_TEMPFAIL)
    NOPERM = 77  # the OS refused access to a file or directory; or no trusted key signed a version (EX_NOPERM)
    CONFIG = 78  # bad configuration (EX_CONFIG)
    INTERRUPTED = 130  # SIGINT
    BROKEN_PIPE = 141  # stdout closed early (SIGPIPE)


EXIT_CODE_DOCS: dict[ExitCode, str] = {
    ExitCode.OK: "success",
    ExitCode.NEGATIVE: "a check ran and found a problem (verify found corruption, doctor found a failure)",
    ExitCode.USAGE: "bad command-line usage",
    ExitCode.DATA: "input data is malformed or failed validation",
    ExitCode.NO_INPUT: "an input file, dataset or version does not exist or cannot be read",
    ExitCode.INTERNAL: "internal error (a bug in warp: please report it with --debug output)",
    ExitCode.OSERR: "the system could not start a thread or process (out of threads, processes or memory for "
                     "them: ulimit -u, a container's pids.max); use fewer workers or raise the limit, then rerun",
    ExitCode.CANTCREAT: "an output cannot be created (read-only file system, a path component that is "
                        "not a directory, a directory where a file should be)",
    ExitCode.IOERR: "reading or writing failed (no space left, file too large or over the file-size limit, "
                    "disk quota exceeded, I/O error; also a full stdout)",
    ExitCode.TEMPFAIL: "temporary failure of the infrastructure (object store or cluster unreachable); "
                       "rerun the same command: it resumes from the finished shards",
    ExitCode.NOPERM: "permission denied by the operating system on a file or directory, or a version no "
                     "key in WARP_TRUSTED_KEYS signed",
    ExitCode.CONFIG: "bad configuration (config file, environment variable or storage settings)",
    ExitCode.INTERRUPTED: "interrupted (Ctrl-C); nothing half-written is left behind",
    ExitCode.BROKEN_PIPE: "the reader of stdout went away (e.g. `| head`)",
}


class WarpError(Exception):
    """Base of every expected warp failure.

    ``message`` says what is wrong (naming the file, sample or key);
    ``hint`` says what to do next. ``details`` holds machine-readable facts
    that ``--json`` error output includes.
    """

    exit_code: ExitCode = ExitCode.INTERNAL
    code: str = "warp-error"  # stable reference, shown in --json errors

    def __init__(self, message: str, *, hint: str | None = None, **details: object) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint
        self.details = details

    def __str__(self) -> str:
        return self.message

    def __reduce__(self):
        # keep hint and details when the error crosses a process boundary (a pool or cluster worker)
        return (_rebuild, (type(self), self.message, self.hint, self.details))

    def to_dict(self) -> dict:
        out = {"error": self.code, "message": self.message, "exit_code": int(self.exit_code)}
        if self.hint:
            out["hint"] = self.hint
        if self.details:
            out["details"] = {k: _jsonable(v) for k, v in self.details.items()}
        return out


def _rebuild(cls: type, message: str, hint: str | None, details: dict) -> WarpError:
    return cls(message, hint=hint, **details)


def _jsonable(v: object) -> object:
    if isinstance(v, (str, int, float, bool)) or v is None:
        return v
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    if isinstance(v, dict):
        return {str(k): _jsonable(x) for k, x in v.items()}
    return str(v)


class Rejected(Exception):
    """One input a pipeline refuses, with the quarantine code that says why.

    The one "rejected with a reason" class of every pipeline (the image probe, confined file
    reads, decoding, ingest). ``reason`` is a quarantine code (``docs/formats/receipts.md``,
    :mod:`warpdata.etl.quarantine`), ``message`` names the input, ``size`` is the bytes read when
    known. It is a verdict, not a failure: the pipeline that raises it catches it and writes a
    quarantine row, so it never reaches the CLI and is deliberately not a :class:`WarpError`
    (an ``except WarpError`` around a build step must not swallow it). It pickles whole, so a
    worker process can hand it back to the driver.
    """

    def __init__(self, reason: str, message: str, size: int = 0) -> None:
        super().__init__(message)
        self.reason, self.message, self.size = reason, message, size

    def __reduce__(self):
        return type(self), (self.reason, self.message, self.size)


class NegativeResult(WarpError):
    """A check completed and its answer is "no" (corruption found, doctor FAIL)."""

    exit_code = ExitCode.NEGATIVE
    code = "check-failed"


class UsageError(WarpError, ValueError):
    exit_code = ExitCode.USAGE
    code = "usage"


class DataError(WarpError, ValueError):
    """Input data is malformed: bad bytes, bad labels, failed validation."""

    exit_code = ExitCode.DATA
    code = "bad-data"


class MissingInputError(WarpError, FileNotFoundError):
    exit_code = ExitCode.NO_INPUT
    code = "missing-input"


class ConfigError(WarpError, ValueError):
    """Bad configuration: names the file, line and dotted key when known."""

    exit_code = ExitCode.CONFIG
    code = "bad-config"


class InternalError(WarpError, RuntimeError):
    exit_code = ExitCode.INTERNAL
    code = "internal"


class InfrastructureError(WarpError, OSError):
    """The infrastructure failed (object store unreachable, cluster gone), not the data.

    Transient by nature: the finished shards are receipted, so the same
    command rerun later resumes (docs/formats/receipts.md).
    """

    exit_code = ExitCode.TEMPFAIL
    code = "temporary-failure"


class DependencyError(ConfigError, ImportError):
    """An optional package a feature needs is not installed."""

    code = "missing-dependency"


# The distribution's name on the package index: ``warpdata`` there is another project
# (README "Install"); the import name stays ``warpdata``.
DISTRIBUTION = "warp-toolchain"


def install_hint(extra: str) -> str:
    """The pip line for an optional extra, spelled as its packages so it works from a clone too.

    The requirements come from the installed distribution's metadata (pyproject.toml is the one
    source); without metadata (a bare source tree) the extra's name is given instead.
    """
    import importlib.metadata as md
    import re

    try:
        reqs = md.requires(DISTRIBUTION) or []
    except md.PackageNotFoundError:
        reqs = []
    wanted = []
    for r in reqs:
        if not re.search(rf"""extra\s*==\s*["']{re.escape(extra)}["']""", r):
            continue
        try:  # evaluate the rest of the marker (python_version) where `packaging` is importable
            from packaging.requirements import Requirement

            req = Requirement(r)
            if req.marker is not None and not req.marker.evaluate({"extra": extra}):
                continue
            wanted.append(f"{req.name}{req.specifier}")
        except ImportError:
            wanted.append(r.split(";")[0].strip())
    if not wanted:
        return f"pip install '{DISTRIBUTION}[{extra}]'"
    return "pip install " + " ".join(f"'{w}'" for w in wanted) + f"  (the [{extra}] extra)"


def missing_dependency(feature: str, package: str, extra: str | None = None) -> DependencyError:
    pip = install_hint(extra) if extra else f"pip install {package}"
    return DependencyError(f"{feature} needs the '{package}' package, which is not installed", hint=pip,
                           package=package, extra=extra)


#: the optional packages warp imports where a feature needs them, by top-level module name:
#: (the package to install, its extra in pyproject.toml, the feature it serves)
OPTIONAL_MODULES: dict[str, tuple[str, str | None, str]] = {
    "botocore": ("botocore", "s3", "S3 storage"),
    "boto3": ("boto3", "s3", "S3 storage"),
    "s3fs": ("s3fs", "s3", "S3 storage"),
    "aiobotocore": ("aiobotocore", "s3", "S3 storage"),
    "s3transfer": ("s3transfer", "s3", "S3 storage"),
    "distributed": ("distributed", "dask", "the Dask executor"),
    "dask": ("dask", "dask", "the Dask executor"),
    "ray": ("ray", "ray", "the Ray executor"),
    "torch": ("torch", "torch", "the PyTorch loaders"),
    "soundfile": ("soundfile", "audio", "decoding audio"),
    "faiss": ("faiss-cpu", "faiss", "the embeddings' ANN index"),
    "pandas": ("pandas", "pandas", "Table.to_pandas()"),
    "polars": ("polars", "polars", "Table.to_polars()"),
    "zarr": ("zarr", "zarr", "Zarr arrays"),
    "tensorstore": ("tensorstore", "zarr", "Zarr arrays"),
    "cupy": ("cupy", "gpu", "the GPU tile backend"),
}


def dependency_error(err: ImportError) -> DependencyError | None:
    """The typed error (exit 78, naming the extra's pip line) for an optional package's
    ``ImportError``; None when ``err`` is about anything else (a missing core module is a broken
    install or a bug, not a feature the user left out).

    Python names the module it could not import in ``err.name`` (``botocore.exceptions`` when
    ``botocore`` is absent, or marked unimportable by a ``None`` in ``sys.modules``).
    """
    if isinstance(err, DependencyError):
        return err
    top = (err.name or "").split(".")[0]
    if top not in OPTIONAL_MODULES:
        return None
    package, extra, feature = OPTIONAL_MODULES[top]
    return missing_dependency(feature, package, extra)


class ResourceExhaustedError(WarpError, OSError):
    """The system would not start another thread or process: a limit on threads or processes
    (``ulimit -u``, a container's ``pids.max``) or memory for their stacks. Not a bug: fewer
    workers, or a higher limit, and the same command runs (exit 71, EX_OSERR)."""

    exit_code = ExitCode.OSERR
    code = "out-of-threads"


_EXHAUSTED_HINT = ("use fewer workers (-j, WARP_WORKERS, WARP_SQL_THREADS) or stop other programs' threads, or "
                   "raise the limit (ulimit -u; a container's pids.max), then rerun")


def thread_start_failure(err: BaseException) -> ResourceExhaustedError | None:
    """The typed error for "can't start new thread" (``RuntimeError`` from :mod:`threading`);
    None for any other exception."""
    if isinstance(err, RuntimeError) and "can't start new thread" in str(err):
        return ResourceExhaustedError("the system would not start another thread (out of threads, or of "
                                      "memory for their stacks)", hint=_EXHAUSTED_HINT)
    return None


def process_start_failure(err: OSError, what: str = "a worker process") -> ResourceExhaustedError:
    """The typed error for a process that could not be started (``fork``/``spawn`` failed with
    EAGAIN or ENOMEM)."""
    import errno as _errno

    name = _errno.errorcode.get(err.errno or 0, str(err.errno))
    return ResourceExhaustedError(f"the system would not start {what} ({name}: {err.strerror or err})",
                                  hint=_EXHAUSTED_HINT, errno=name)


# -- stores and datasets (docs/design.md §10) ------------------------------------------------


class AuthenticationError(ConfigError):
    """No usable credentials for the store."""

    code = "auth"


class StorePermissionError(ConfigError, PermissionError):
    """Credentials were accepted but the store refused the operation."""

    code = "permission-denied"


class StoreUnavailableError(ConfigError, ConnectionError):
    """The store could not be reached (endpoint down, DNS, timeout, no bucket)."""

    code = "store-unavailable"


class LockTimeoutError(InfrastructureError, TimeoutError):
    """A lock stayed held by a live process past its timeout (a dataset's ``latest``, a cache blob)."""

    code = "lock-timeout"


class DatasetNotFoundError(MissingInputError):
    """No such dataset (or version) in the store."""

    code = "dataset-not-found"


class BlobNotFoundError(MissingInputError):
    """A manifest references a blob the store does not hold."""

    code = "blob-not-found"


class ManifestCorruptedError(DataError):
    """A manifest or blob failed its schema or hash check."""

    code = "manifest-corrupted"


class UntrustedVersionError(WarpError, PermissionError):
    """``WARP_TRUSTED_KEYS`` is set and no key in it signed the version (docs/formats/registry.md,
    "Signatures")."""

    exit_code = ExitCode.NOPERM
    code = "untrusted-version"


class BlobCorruptedError(ManifestCorruptedError):
    """A blob's bytes do not hash to the name it is stored under."""

    code = "blob-corrupted"


class LocalPathError(DataError):
    """A manifest would hold a machine-local path (invariant I1)."""

    code = "local-path-in-manifest"


class InvalidDatasetIdError(UsageError):
    code = "bad-dataset-id"


class InvalidHashError(UsageError):
    """A blob or version hash that is not 64 lowercase hex digits: it names no object, and as a
    store key it could reach outside the store (``..``, an absolute path, a NUL)."""

    code = "bad-hash"


class CacheTooSmallError(ConfigError):
    """The blobs a reader needs at once do not fit under the cache cap."""

    code = "cache-too-small"


class ReadOnlyStoreError(ConfigError, PermissionError):
    """A write (publish, a doctor write probe) was aimed at a read-only store: one served over HTTP(S)."""

    code = "read-only-store"


class NotListableError(UsageError):
    """An operation needs a listing the store cannot give: HTTP(S) stores are read by key only."""

    code = "store-not-listable"


class RangeNotSupportedError(ConfigError):
    """An HTTP store answered a ranged read with the whole object: the host ignores ``Range``."""

    code = "no-range-requests"


class StoreBusyError(InfrastructureError, ConnectionError):
    """The store kept throttling (429, 503 SlowDown) or failing a read past the retry budget.

    Transient by nature (exit 75): the same command later, or with fewer readers, succeeds.
    """

    code = "store-busy"


# Old names, kept importable for one release: BlobCorruptError (the blob cache's twin of
# BlobCorruptedError) and CacheLockTimeout (the cache's twin of LockTimeoutError).
BlobCorruptError = BlobCorruptedError
CacheLockTimeout = LockTimeoutError


# -- the operating system (docs/design.md §10) ------------------------------------------------


class OSFailure(WarpError, OSError):
    """The operating system refused a read or write: a full disk, a limit, a permission.

    Not a bug and not bad data: ``path`` (or ``stream``, for stdout) names what failed and the
    hint says what to change. Built from an ``OSError`` by :func:`os_failure`.
    """

    exit_code = ExitCode.IOERR
    code = "os-error"


class NoSpaceError(OSFailure):
    code = "no-space"


class FileTooLargeError(OSFailure):
    code = "file-too-large"


class OSIOError(OSFailure):
    code = "io-error"


class ReadOnlyFileSystemError(OSFailure):
    exit_code = ExitCode.CANTCREAT
    code = "read-only-file-system"


class CannotCreateError(OSFailure):
    exit_code = ExitCode.CANTCREAT
    code = "cannot-create"


class OSPermissionError(OSFailure, PermissionError):
    exit_code = ExitCode.NOPERM
    code = "os-permission-denied"


class TooManyOpenFilesError(OSFailure):
    exit_code = ExitCode.CONFIG
    code = "too-many-open-files"


# errno -> (class, what happened, what to do). ``{where}`` is the path or stream.
_OS_FAILURES: dict[str, tuple[type[OSFailure], str, str]] = {
    "ENOSPC": (NoSpaceError, "no space left on the device writing {where}",
               "free space on that file system, or write the output somewhere else"),
    "EDQUOT": (NoSpaceError, "disk quota exceeded writing {where}",
               "free space under your quota, or write the output somewhere else"),
    "EFBIG": (FileTooLargeError, "file too large writing {where}: over the file-size limit "
                                 "(ulimit -f) or the file system's largest file",
              "raise the limit (ulimit -f unlimited) or write to a file system that takes larger files"),
    "EROFS": (ReadOnlyFileSystemError, "cannot create {where}: the file system is read-only",
              "write the output to a writable directory"),
    "ENOTDIR": (CannotCreateError, "cannot use {where}: a part of the path is a file, not a directory",
                "remove or rename that file, or choose another path"),
    "EISDIR": (CannotCreateError, "cannot write {where}: it is a directory",
               "give a file name, or remove the directory"),
    "EEXIST": (CannotCreateError, "cannot create {where}: something else is already there",
               "remove it or choose another path"),
    "ENAMETOOLONG": (CannotCreateError, "cannot use {where}: the name is too long",
                     "choose a shorter path"),
    "ELOOP": (CannotCreateError, "cannot use {where}: too many levels of symbolic links",
              "fix the symbolic link loop in the path"),
    "EACCES": (OSPermissionError, "permission denied on {where}",
               "check the file's and its directory's permissions, or use another path"),
    "EPERM": (OSPermissionError, "operation not permitted on {where}",
              "check the file's owner and permissions, or use another path"),
    "EMFILE": (TooManyOpenFilesError, "too many open files (this process's limit) opening {where}",
               "raise the limit (ulimit -n 4096) or use fewer workers"),
    "ENFILE": (TooManyOpenFilesError, "too many open files on this system opening {where}",
               "close other programs' files or raise the system limit (fs.file-max)"),
    "EIO": (OSIOError, "I/O error on {where}", "check the device (dmesg) and the file system, then rerun"),
    "EPIPE": (OSIOError, "broken pipe writing {where}", "check that the reading side stays open"),
}


def os_failure(err: OSError, where: str | None = None) -> WarpError:
    """The typed error for ``err``: :class:`OSFailure` subclasses by errno, ``ENOENT`` as
    :class:`MissingInputError`, connection and timeout errors as :class:`InfrastructureError`.

    ``where`` names the path or stream (default: the error's own file names).
    """
    import errno as _errno
    import os

    name = _errno.errorcode.get(err.errno or 0, "")
    if where is None:
        names = [str(f) for f in (err.filename, err.filename2) if f is not None]
        if len(names) == 2 and os.path.basename(names[0]).startswith(TMP_PREFIX):
            names = names[1:]  # a rename of a writer's temporary sibling: the user named only the target
        where = " -> ".join(names) if names else "a file (the operating system did not say which)"
    facts = {"errno": name or err.errno, "path": where, "os_message": err.strerror or str(err)}
    if name in _OS_FAILURES:
        cls, what, hint = _OS_FAILURES[name]
        return cls(what.format(where=where), hint=hint, **facts)
    if name == "ENOENT":
        return MissingInputError(f"{where} does not exist", hint="check the path", **facts)
    if isinstance(err, (ConnectionError, TimeoutError)) or name in ("ETIMEDOUT", "ECONNREFUSED", "EHOSTUNREACH"):
        return InfrastructureError(f"{err.strerror or err} ({where})", hint="check the network and rerun", **facts)
    return OSIOError(f"{err.strerror or err} ({name or err.errno}) on {where}",
                     hint="check the device and the path, then rerun", **facts)
