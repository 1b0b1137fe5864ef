"""ETL outputs on object storage (``[output] root = "s3://…"``): staged build, create-only upload.

The pipeline builds the version as it does locally, into a staging root on
this machine (``$WARP_CACHE_DIR/etl-staging/<hash of the URL>``: a rerun
after a crash resumes there from the receipts journal), then
:func:`upload_version` copies it to ``<url>/<version dir>/``:

1. every file but the manifest, sorted, each ``PUT If-None-Match: *``
   (create-only): an object already there of the same size was uploaded by
   an earlier, interrupted run and is kept (shards carry their SHA-256 in
   the manifest, which ``warp inspect --verify`` checks);
2. ``manifest.json`` last, create-only: the version exists for readers
   only once it is there, so a killed upload never shows a half version;
3. ``<url>/latest``: the name of the newest version directory.

An unreachable store is an :class:`~warpdata.core.errors.InfrastructureError`
(exit 75); the rerun resumes.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from warpdata.core import envvars
from warpdata.core.errors import (
    AuthenticationError,
    ConfigError,
    InfrastructureError,
    InternalError,
    WarpError,
)
from warpdata.core.names import MANIFEST_NAME
from warpdata.etl.access import CREDENTIALS_HINT
from warpdata.storage.locations import StorageConfig, filesystem, parse_location

MANIFEST = MANIFEST_NAME
LATEST = "latest"
METRICS = "metrics.json"


def is_url(text: str | None) -> bool:
    return bool(text) and "://" in str(text) and not str(text).startswith("file://")


def staging_root(url: str) -> Path:
    h = hashlib.sha256(url.rstrip("/").encode()).hexdigest()[:16]
    return Path(envvars.default_cache_dir()) / "etl-staging" / h


def _infra(e: BaseException, url: str) -> WarpError:
    cred = credentials_error(e, url)
    if cred is not None:
        return cred
    return InfrastructureError(f"could not write {url}: {type(e).__name__}: {e}",
                               hint="the object store is unreachable or refused the request (check WARP_S3_ENDPOINT "
                                    "and credentials); rerun the same command: what was built and uploaded is reused")


def credentials_error(e: BaseException, url: str) -> AuthenticationError | None:
    """A store client's "no credentials here" as exit 78 naming the machine: a worker started without
    them fails the same way on every rerun (warp/etl/access.py says what a worker needs)."""
    try:
        from botocore.exceptions import NoCredentialsError, PartialCredentialsError
    except ImportError:  # pragma: no cover - s3fs depends on botocore
        return None
    if not isinstance(e, NoCredentialsError | PartialCredentialsError):
        return None
    import socket

    return AuthenticationError(f"no S3 credentials on {socket.gethostname()} (pid {os.getpid()}) for {url}: "
                               f"{type(e).__name__}: {e}", hint=CREDENTIALS_HINT)


def _is_infra(e: BaseException) -> bool:
    try:
        from botocore.exceptions import BotoCoreError, ClientError
    except ImportError:  # pragma: no cover - s3fs depends on botocore
        return isinstance(e, OSError)
    if isinstance(e, ClientError):
        code = str(e.response.get("Error", {}).get("Code", ""))
        return code not in ("AccessDenied", "NoSuchBucket", "InvalidAccessKeyId", "SignatureDoesNotMatch")
    return isinstance(e, BotoCoreError | OSError | TimeoutError) and not isinstance(e, FileNotFoundError | PermissionError)


def upload_version(local: Path, url: str) -> tuple[str, dict[str, int]]:
    """Upload the finished version directory ``local`` under ``url``; returns its URL and counts."""
    loc = parse_location(url)
    fs = filesystem(loc)
    dest = loc.join(local.name)
    files = sorted(p for p in local.iterdir() if p.is_file() and p.name != MANIFEST)
    if not (local / MANIFEST).is_file():
        raise InternalError(f"{local} has no {MANIFEST}: not a finished version")
    counts = {"uploaded": 0, "reused": 0}
    try:
        try:
            fs.invalidate_cache(dest.path)
            present = {i["name"].rsplit("/", 1)[-1]: int(i.get("size") or 0)
                       for i in fs.ls(dest.path, detail=True, refresh=True) if i.get("type") != "directory"}
        except FileNotFoundError:
            present = {}
        for p in [*files, local / MANIFEST]:
            size = p.stat().st_size
            if p.name == METRICS and p.name in present:
                # timings of this run, not content: a killed run's copy is replaced, never compared
                fs.put_file(os.fspath(p), f"{dest.path}/{p.name}")
                counts["uploaded"] += 1
                continue
            if p.name in present:
                if present[p.name] != size:
                    raise ConfigError(f"{dest.url}/{p.name} exists with {present[p.name]} bytes, this build made {size}",
                                      hint=f"another build wrote this version; remove {dest.url}/ and rerun")
                counts["reused"] += 1
                continue
            try:
                fs.put_file(os.fspath(p), f"{dest.path}/{p.name}", mode="create")
                counts["uploaded"] += 1
            except FileExistsError:  # a concurrent driver got there first: same task, same bytes
                counts["reused"] += 1
        fs.pipe_file(loc.join(LATEST).path, (local.name + "\n").encode())
    except (ConfigError, InternalError):
        raise
    except Exception as e:
        if _is_infra(e):
            raise _infra(e, dest.url) from None
        raise
    return dest.url, counts


def check_reachable(url: str) -> None:
    """Fail fast (exit 75) when the store at ``url`` cannot be reached, before any work."""
    import dataclasses

    loc = parse_location(url)
    # one quick attempt: the store is either there or the run stops before any work
    cfg = dataclasses.replace(StorageConfig.from_env(), retries=1, connect_timeout=5.0) if loc.protocol == "s3" else None
    fs = filesystem(loc, cfg)
    try:
        fs.ls(loc.path.split("/", 1)[0], refresh=True)
    except FileNotFoundError:
        raise ConfigError(f"{url}: the bucket does not exist", hint="create it, or fix [output] root") from None
    except Exception as e:
        if _is_infra(e):
            raise _infra(e, url) from None
        raise


def _call(url: str, fn, *args, **kwargs):
    try:
        return fn(*args, **kwargs)
    except (ConfigError, InternalError, FileNotFoundError, FileExistsError):
        raise
    except Exception as e:
        if _is_infra(e):
            raise _infra(e, url) from None
        raise


def find_version_dir(url: str, version: str) -> tuple[str | None, bool]:
    """The version directory of ``version`` under ``url`` (one listing): ``(name, complete)``.

    ``complete`` when its ``manifest.json`` is there; an incomplete one is
    the version a killed run was writing (its shards are reused); ``None``
    when there is none.
    """
    loc = parse_location(url)
    fs = filesystem(loc)
    tail = "-" + version[:12]
    try:
        fs.invalidate_cache(loc.path)
        names = sorted(p.rsplit("/", 1)[-1] for p in _call(url, fs.ls, loc.path, detail=False, refresh=True))
    except FileNotFoundError:
        return None, False
    cands = [n for n in names if n.startswith("v") and n.endswith(tail)]
    for n in cands:
        if _call(url, fs.exists, f"{loc.path}/{n}/{MANIFEST}"):
            return n, True
    return (cands[-1], False) if cands else (None, False)


def list_sizes(url: str) -> dict[str, int]:
    """``{name: size}`` of the objects directly under ``url`` (one listing; empty when absent)."""
    loc = parse_location(url)
    fs = filesystem(loc)
    try:
        fs.invalidate_cache(loc.path)
        items = _call(url, fs.ls, loc.path, detail=True, refresh=True)
    except FileNotFoundError:
        return {}
    return {i["name"].rsplit("/", 1)[-1]: int(i.get("size") or 0) for i in items if i.get("type") != "directory"}


def put_create_only(local: str, url: str) -> bool:
    """Upload one file create-only (``PUT If-None-Match: *``); False when the object was there already.

    Called by the worker that built the file, so shard bytes go to the store
    from where they were made; a killed driver's rerun finds them there.
    """
    loc = parse_location(url)
    fs = filesystem(loc)
    try:
        _call(url, fs.put_file, local, loc.path, mode="create")
        return True
    except FileExistsError:  # the same task uploaded by an earlier or concurrent run: same bytes
        return False
    except OSError as e:
        if "PreconditionFailed" in str(e) or "412" in str(e):
            return False
        raise


def read_manifest(url: str) -> bytes:

    loc = parse_location(url)
    return _call(url, filesystem(loc).cat_file, f"{loc.path}/{MANIFEST}")
