"""``warp doctor`` store checks: credentials, reachability, create-only writes, compare-and-swap.

Each probe writes under ``<store>/.warp-doctor/<uuid>/`` and removes what it
wrote. The checks run against the configured store (``WARP_STORE`` or the
default local directory) and say how to fix what fails. The credentials
check lives in :mod:`warpdata.doctor.checks` so it runs first; these SKIP
when an earlier store check already failed.
"""

from __future__ import annotations

import contextlib
import hashlib
import uuid

from warpdata.core import envvars
from warpdata.doctor.checks import store_blocker
from warpdata.doctor.registry import FAIL, PASS, WARN, CheckResult, check


def _store():
    from warpdata.registry.store import Store

    return Store(envvars.default_store())


def _probe_prefix() -> str:
    return f".warp-doctor/{uuid.uuid4().hex}"


def _cleanup(store, prefix: str) -> None:
    with contextlib.suppress(Exception):
        store.fs.rm(store.location.join(prefix).path, recursive=True)


@check("store-create-only", "store")
def create_only() -> CheckResult:
    """A create-only write succeeds once and is refused the second time, bytes intact."""
    blocked = store_blocker()
    if blocked is not None:
        return blocked
    store = _store()
    prefix = _probe_prefix()
    data = uuid.uuid4().bytes
    key = f"{prefix}/probe"
    try:
        first = store._b.put_if_absent(key, data)
        second = store._b.put_if_absent(key, b"other bytes")
        got = store._b.get(key)
    except Exception as e:
        from warpdata.storage.errors import translate_storage_error

        err = translate_storage_error(e, store.url, "write")
        return CheckResult(FAIL, f"store {store.url}: create-only write failed: {err}",
                           getattr(err, "hint", None) or "check WARP_STORE, the endpoint and credentials")
    finally:
        _cleanup(store, prefix)
    if not first:
        return CheckResult(FAIL, f"store {store.url}: a fresh create-only write was refused", "check the store URL")
    if second or got != data:
        return CheckResult(FAIL, f"store {store.url} overwrote an existing object on a create-only write "
                           "(no If-None-Match support): concurrent publishers could clobber each other",
                           "use an S3 service that honours If-None-Match (AWS S3, recent MinIO) or a local store")
    return CheckResult(PASS, f"{store.url}: read/write OK, create-only writes refused on existing objects")


@check("store-cas", "store")
def compare_and_swap() -> CheckResult:
    """A conditional update of a pointer with a stale token is refused."""
    blocked = store_blocker()
    if blocked is not None:
        return blocked
    store = _store()
    prefix = _probe_prefix()
    key = f"{prefix}/latest.json"
    try:
        t1 = store._b.write_if(key, b'{"v": 1}', None)
        t2 = store._b.write_if(key, b'{"v": 2}', t1) if t1 else None
        stale = store._b.write_if(key, b'{"v": 3}', t1) if t2 else "skipped"
        final = store._b.get(key)
    except Exception as e:
        return CheckResult(FAIL, f"store {store.url}: conditional write failed: {type(e).__name__}: {e}",
                           "use an S3 service that honours If-Match (AWS S3, recent MinIO) or a local store")
    finally:
        _cleanup(store, prefix)
    if t1 is None or t2 is None:
        return CheckResult(FAIL, f"store {store.url}: a conditional write with the current token was refused",
                           "check the store's If-Match / If-None-Match support")
    if stale is not None:
        return CheckResult(WARN, f"store {store.url} accepted a write with a stale token: 'latest' updates can race",
                           "publish from one process at a time, or use a store with If-Match support")
    if final != b'{"v": 2}':
        return CheckResult(FAIL, f"store {store.url} returned {final!r} after compare-and-swap", "check the store")
    return CheckResult(PASS, f"{store.url}: compare-and-swap of 'latest' works ({hashlib.sha256(final).hexdigest()[:8]})")
