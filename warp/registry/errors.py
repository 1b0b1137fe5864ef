"""Typed errors of the dataset registry (docs/design.md §10, table X0).

Each class carries the cause in one line and the remedy in ``hint``, maps to
an exit code of :class:`warpdata.core.errors.ExitCode` through its warp base
class, and also inherits the builtin a library caller would naturally catch:

========================== ===================== ======== =========================
class                      warp base             exit     builtin
========================== ===================== ======== =========================
``AuthenticationError``    ``ConfigError``       78       ``ValueError``
``PermissionError``        ``ConfigError``       78       ``builtins.PermissionError``
``StoreUnavailableError``  ``ConfigError``       78       ``ConnectionError``
``DatasetNotFoundError``   ``MissingInputError`` 66       ``FileNotFoundError``
``BlobNotFoundError``      ``MissingInputError`` 66       ``FileNotFoundError``
``ManifestCorruptedError`` ``DataError``         65       ``ValueError``
``BlobCorruptedError``     ``DataError``         65       ``ValueError``
``LockTimeoutError``       ``ConfigError``       78       ``ConnectionError``
``LocalPathError``         ``DataError``         65       ``ValueError``
``InvalidDatasetIdError``  ``UsageError``        2        ``ValueError``
``InvalidHashError``       ``UsageError``        2        ``ValueError``
========================== ===================== ======== =========================

``PermissionError`` deliberately has the seed's name; inside this module the
builtin is reached as ``builtins.PermissionError``.
:func:`translate_storage_error` turns exceptions raised by fsspec/s3fs/botocore
into these classes so no raw ``ClientError`` reaches the user.
"""

from __future__ import annotations

import builtins
import re

from warpdata.core.errors import ConfigError, DataError, MissingInputError, UsageError

__all__ = [
    "AuthenticationError",
    "BlobCorruptedError",
    "BlobNotFoundError",
    "DatasetNotFoundError",
    "InvalidDatasetIdError",
    "InvalidHashError",
    "LocalPathError",
    "LockTimeoutError",
    "ManifestCorruptedError",
    "PermissionError",
    "StoreUnavailableError",
    "translate_storage_error",
]


class AuthenticationError(ConfigError):
    """No usable credentials for the store."""

    code = "auth"


class PermissionError(ConfigError, builtins.PermissionError):  # the seed's name (docs/design.md §10)
    """Credentials were accepted but the store refused the operation."""

    code = "permission-denied"


class StoreUnavailableError(ConfigError, ConnectionError):
    """The store could not be reached (endpoint down, DNS, timeout, no bucket)."""

    code = "store-unavailable"


class DatasetNotFoundError(MissingInputError):
    """No such dataset (or version) in the store."""

    code = "dataset-not-found"


class BlobNotFoundError(MissingInputError):
    """A manifest references a blob the store does not hold."""

    code = "blob-not-found"


class ManifestCorruptedError(DataError):
    """A manifest or blob failed its schema or hash check."""

    code = "manifest-corrupted"


class LocalPathError(DataError):
    """A manifest would hold a machine-local path (invariant I1)."""

    code = "local-path-in-manifest"


class InvalidDatasetIdError(UsageError):
    code = "bad-dataset-id"


class InvalidHashError(UsageError):
    """A blob or version hash that is not 64 lowercase hex digits: it names no object, and as a
    store key it could reach outside the store (``..``, an absolute path, a NUL)."""

    code = "bad-hash"


def _error_code(exc: BaseException) -> str | None:
    resp = getattr(exc, "response", None)
    if isinstance(resp, dict):
        code = resp.get("Error", {}).get("Code")
        if code:
            return str(code)
    return None


_AUTH_CODES = {"InvalidAccessKeyId", "SignatureDoesNotMatch", "ExpiredToken", "InvalidToken",
               "TokenRefreshRequired", "UnrecognizedClientException", "InvalidClientTokenId"}


_CURL = re.compile(r"curlCode: (\d+)")
_CURL_HOST = re.compile(r"(?:Could not resolve host: |Failed to connect to )([^\s:;]+)(?::(\d+))?")


def connection_cause(exc: BaseException) -> tuple[str, str | None] | None:
    """Why a connection to the store failed: ("refused" | "dns" | "timeout", host or None).

    Looks through botocore's ``EndpointConnectionError`` (its ``error``: the
    aiohttp/urllib3 error), the exception chain, and pyarrow's OSError text
    (libcurl codes 6, 7, 28). None when ``exc`` is not a connection failure.
    """
    import socket

    seen: set[int] = set()
    todo: list[BaseException] = [exc]
    host: str | None = None
    while todo:
        e = todo.pop()
        if id(e) in seen:
            continue
        seen.add(id(e))
        key = getattr(e, "_conn_key", None) or getattr(e, "conn_key", None)
        if key is not None and getattr(key, "host", None):
            host = f"{key.host}:{key.port}" if getattr(key, "port", None) else key.host
        kw = getattr(e, "kwargs", None)
        if host is None and isinstance(kw, dict) and kw.get("endpoint_url"):
            from urllib.parse import urlparse

            host = urlparse(str(kw["endpoint_url"])).netloc or None
        if isinstance(e, socket.gaierror):
            return "dns", host
        if isinstance(e, ConnectionRefusedError):
            return "refused", host
        if type(e).__name__ in ("ConnectTimeoutError", "ConnectTimeout"):
            return "timeout", host
        text = str(e)
        m = _CURL.search(text)
        if m:
            h = _CURL_HOST.search(text)
            h_s = (f"{h.group(1)}:{h.group(2)}" if h.group(2) else h.group(1)) if h else None
            kind = {"6": "dns", "7": "refused", "28": "timeout"}.get(m.group(1))
            if kind:
                return kind, h_s
        if type(e).__name__ in ("NewConnectionError", "NameResolutionError", "EndpointConnectionError",
                                "ClientConnectorError", "ConnectionError"):
            # urllib3 keeps the socket error only in its message
            if "Connection refused" in text:
                return "refused", host
            if any(t in text for t in ("Name or service not known", "nodename nor servname",
                                       "Temporary failure in name resolution", "Failed to resolve")):
                return "dns", host
        for nxt in (getattr(e, "kwargs", {}).get("error") if isinstance(getattr(e, "kwargs", None), dict) else None,
                    getattr(e, "os_error", None), e.__cause__, e.__context__):
            if isinstance(nxt, BaseException):
                todo.append(nxt)
    return None


_CAUSE_TEXT = {
    "refused": ("the S3 endpoint {host} refuses connections (nothing is listening there)",
                "check WARP_S3_ENDPOINT / AWS_ENDPOINT_URL (scheme, host and port) and that the S3 "
                "service is running; 'warp doctor --only store' tests it"),
    "dns": ("cannot resolve the S3 host {host} (DNS lookup failed: offline, or a wrong host name)",
            "check the network, WARP_S3_ENDPOINT / AWS_ENDPOINT_URL and the bucket name; "
            "'warp doctor --only store' tests it"),
    "timeout": ("connecting to the S3 endpoint {host} timed out",
                "check the network, a firewall or proxy, and WARP_S3_ENDPOINT; 'warp doctor --only store' tests it"),
}


def translate_storage_error(exc: BaseException, url: str, action: str) -> Exception:
    """Map an exception from fsspec/s3fs/botocore to a typed registry error.

    ``url`` names the object or store, ``action`` what was being done
    ("read", "write", "list"). Exceptions that are already warp errors, and
    ones this function does not recognise, are returned unchanged.
    """
    from warpdata.core.errors import WarpError

    if isinstance(exc, WarpError):
        return exc  # type: ignore[return-value]
    name = type(exc).__name__
    code = _error_code(exc) or ""
    text = str(exc)
    if name in ("NoCredentialsError", "PartialCredentialsError") or code in _AUTH_CODES \
            or "InvalidAccessKeyId" in text or "SignatureDoesNotMatch" in text:
        return AuthenticationError(
            f"S3 credentials not found or rejected while trying to {action} {url}: {text}",
            hint="set AWS_PROFILE (or WARP_S3_PROFILE), or AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY; "
                 "then run 'warp doctor --only store'")
    if isinstance(exc, builtins.PermissionError) or code in ("AccessDenied", "AllAccessDisabled", "403"):
        verb = {"read": "GetObject", "write": "PutObject", "list": "ListBucket"}.get(action, action)
        return PermissionError(
            f"the store refused to {action} {url} (bucket policy forbids {verb})",
            hint="ask the workspace admin for access, or check the profile with 'warp doctor --only store'")
    if code in ("NoSuchBucket",) or "NoSuchBucket" in text:
        return StoreUnavailableError(
            f"bucket for {url} does not exist",
            hint="create the bucket, or set WARP_STORE to an existing s3://BUCKET/PREFIX")
    cause = connection_cause(exc)
    if cause is not None:
        kind, host = cause
        msg, hint = _CAUSE_TEXT[kind]
        return StoreUnavailableError(f"cannot {action} {url}: " + msg.format(host=host or "(unknown host)"),
                                     hint=hint, cause=kind, host=host)
    if name in ("EndpointConnectionError", "ConnectTimeoutError", "ReadTimeoutError",
                "ConnectionClosedError", "ClientConnectorError", "ServerDisconnectedError") \
            or isinstance(exc, (ConnectionError, TimeoutError)):
        return StoreUnavailableError(
            f"cannot reach the store to {action} {url}: {text}",
            hint="check the network and WARP_S3_ENDPOINT / AWS_ENDPOINT_URL; 'warp doctor --only store' tests it")
    return exc  # type: ignore[return-value]


class BlobCorruptedError(ManifestCorruptedError):
    """A blob's bytes do not hash to the name it is stored under."""

    code = "blob-corrupted"


class LockTimeoutError(StoreUnavailableError):
    """A lock on a dataset's ``latest`` pointer stayed held by a live process."""

    code = "lock-timeout"
