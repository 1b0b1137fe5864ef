"""The S3 client of the storage layer: one boto3 client configured from a
:class:`~warpdata.storage.locations.StorageConfig` exactly like the s3fs, pyarrow and DuckDB
clients of the same configuration (endpoint, region, profile, addressing, timeouts), with the
connection-retry limit of :func:`~warpdata.storage.locations.limit_connect_retries`.
The client is made only when an S3 store needs one (local, memory and HTTP stores never import
boto3), from a plain botocore session.
"""

from __future__ import annotations

import os
import threading
from typing import Any

from warpdata.core.errors import DependencyError, install_hint
from warpdata.storage.locations import StorageConfig, limit_connect_retries

# lazy third-party imports: botocore and boto3 (the [s3] extra) are imported when an S3 store
# first needs a client

__all__ = ["boto3_client", "shared_client"]

# what decides which credentials a client resolves: a client is shared only while these are unchanged
CRED_ENV = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE",
            "AWS_SHARED_CREDENTIALS_FILE", "AWS_CONFIG_FILE", "AWS_EC2_METADATA_DISABLED")
_SHARED: dict[tuple, Any] = {}
_SHARED_MU = threading.Lock()


def shared_client(config: StorageConfig):
    """The process's one writing client (botocore's own retries) of ``config`` and the credential
    environment, made on first use; a forked child makes its own (connection pools are not shared)."""
    key = (config, tuple(os.environ.get(k) for k in CRED_ENV), os.getpid())
    with _SHARED_MU:
        client = _SHARED.get(key)
    if client is None:
        client = boto3_client(config)
        with _SHARED_MU:
            if len(_SHARED) >= 16:
                _SHARED.clear()
            client = _SHARED.setdefault(key, client)
    return client


def boto3_client(config: StorageConfig, attempts: int | None = None, signature: str | None = None):
    """A boto3 S3 client configured exactly like the s3fs/pyarrow/DuckDB clients of ``config``;
    ``attempts`` (1: no retry) replaces botocore's retries, for a caller with its own retry loop;
    ``signature`` (e.g. ``"s3v4"``) fixes the signature version (ignored for anonymous clients)."""
    import importlib.util

    try:
        if importlib.util.find_spec("boto3") is None:  # the [s3] extra (not imported: ~0.8 s with s3transfer)
            raise ImportError("boto3")
        import botocore.session
        from botocore import UNSIGNED
        from botocore.config import Config
    except ImportError:
        raise DependencyError("S3 stores need the 'boto3' package, which is not installed",
                              hint=install_hint("s3")) from None
    kw: dict[str, Any] = {
        "connect_timeout": config.connect_timeout,
        "read_timeout": config.read_timeout,
        "retries": {"max_attempts": config.retries, "mode": "adaptive"} if attempts is None else
                   {"total_max_attempts": attempts, "mode": "standard"},
    }
    if config.path_style:
        kw["s3"] = {"addressing_style": "path"}
    if config.anon:
        kw["signature_version"] = UNSIGNED
    elif signature is not None:
        kw["signature_version"] = signature
    # a botocore session, not boto3's: the same client without importing boto3's resources and s3transfer
    # (~0.35 s of a command's start; warp uses no upload_file/download_file helper)
    session = botocore.session.Session(profile=config.profile) if config.profile else botocore.session.Session()
    return limit_connect_retries(  # refused/DNS: fail in seconds, not 15-20 s
        session.create_client("s3", endpoint_url=config.endpoint_url, region_name=config.region,
                              config=Config(**kw)))
