"""Store failures (fsspec, s3fs, botocore, pyarrow) translated into warp's typed errors.

:func:`translate_storage_error` turns what a storage client raises into the store errors
of :mod:`warpdata.core.errors` (their table of classes, exit codes and builtins is there),
so no raw ``ClientError`` reaches the user; :func:`connection_cause` says why a connection
failed (refused, DNS, timeout) and to which host.
"""

from __future__ import annotations

import re

from warpdata.core.errors import (
    AuthenticationError,
    StorePermissionError,
    StoreUnavailableError,
    WarpError,
    dependency_error,
    os_failure,
)
from warpdata.storage.policy import is_tls_error

__all__ = ["connection_cause", "translate_storage_error"]


















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
    if isinstance(exc, WarpError):
        return exc  # type: ignore[return-value]
    if isinstance(exc, ImportError):  # a client library of an optional extra (botocore) is not installed: 78
        return dependency_error(exc) or exc
    name = type(exc).__name__
    code = _error_code(exc) or ""
    text = str(exc)
    if name in ("NoCredentialsError", "PartialCredentialsError") or code in _AUTH_CODES \
            or "InvalidAccessKeyId" in text or "SignatureDoesNotMatch" in text:
        return AuthenticationError(
            f"S3 credentials not found or rejected while trying to {action} {url}: {text}",
            hint="set AWS_PROFILE (or WARP_S3_PROFILE), or AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY; "
                 "then run 'warp doctor --only store'")
    if isinstance(exc, PermissionError) and exc.errno is not None:
        # the local file system said no (a read-only store directory, say): the operating system's
        # permission failure, exit 77 naming the path, not an S3 bucket policy
        return os_failure(exc, exc.filename or url)  # type: ignore[return-value]
    if isinstance(exc, PermissionError) or code in ("AccessDenied", "AllAccessDisabled", "403"):
        verb = {"read": "GetObject", "write": "PutObject", "list": "ListBucket"}.get(action, action)
        return StorePermissionError(
            f"the store refused to {action} {url} (bucket policy forbids {verb})",
            hint="ask the workspace admin for access, or check the profile with 'warp doctor --only store'")
    if code in ("NoSuchBucket",) or "NoSuchBucket" in text:
        return StoreUnavailableError(
            f"bucket for {url} does not exist",
            hint="create the bucket, or set WARP_STORE to an existing s3://BUCKET/PREFIX")

    if is_tls_error(exc):  # permanent (docs/formats/registry.md, "Request policy")
        return StoreUnavailableError(
            f"cannot {action} {url}: the TLS handshake with the S3 endpoint failed: {text}",
            hint="check the scheme of WARP_S3_ENDPOINT / AWS_ENDPOINT_URL (a plain-HTTP endpoint needs http://) "
                 "and that its certificate is trusted (AWS_CA_BUNDLE names extra CAs)", cause="tls")
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



