"""``warp doctor`` store checks: credentials, reachability, DuckDB over the store, create-only writes, CAS.

Every check exercises the configured ``WARP_STORE`` through :mod:`warpdata.storage.locations`
and :class:`warpdata.registry.store.Store` exactly as ``publish`` and the readers do. Each probe
writes under a fresh name and removes what it wrote. The causes come first: credentials are
checked before anything is sent, a failed connection says whether the endpoint refused it, its
host did not resolve or the connect timed out, and once the store cannot be reached the later
store checks SKIP ("fix 'store' first") instead of repeating the failure after their own
timeouts. Each probe runs once: ``store`` reads and writes, ``store-create-only`` tests
conditional creation (If-None-Match), ``store-cas`` the compare-and-swap of ``latest``.
"""

from __future__ import annotations

import contextlib
import hashlib
import uuid
from collections.abc import Callable
from typing import Any, TypeVar

from warpdata.checks.registry import FAIL, PASS, SKIP, WARN, CheckResult, check, dir_check
from warpdata.core import envvars
from warpdata.core.sqlgate import confine, connect
from warpdata.registry.store import Store
from warpdata.storage.base import open_object_store
from warpdata.storage.errors import translate_storage_error
from warpdata.storage.locations import missing_store_folder
from warpdata.storage.remote import HttpStatusError

# lazy third-party imports: duckdb and pyarrow (heavy) are imported by the duckdb-parquet check
# alone

T = TypeVar("T")

# why the store cannot be used, once a store check found out (later store checks SKIP on it)
_STORE_BLOCKED: dict[str, str] = {}


def store_blocker() -> CheckResult | None:
    """A SKIP naming the earlier failure, when credentials or reachability already failed."""
    if not _STORE_BLOCKED:
        return None
    check_name, _cause = next(iter(_STORE_BLOCKED.items()))
    return CheckResult(SKIP, f"not run: the '{check_name}' check did not pass", f"fix the '{check_name}' check first")


def _block(check_name: str, result: CheckResult) -> CheckResult:
    if result.status == FAIL:
        _STORE_BLOCKED.setdefault(check_name, result.detail)
    return result


@check("store-credentials", "store")
def store_credentials() -> CheckResult:
    _STORE_BLOCKED.clear()  # a new doctor run
    return _block("store-credentials", _credentials())


def _credentials() -> CheckResult:
    url = envvars.default_store()
    try:
        objects = open_object_store(url)
    except Exception:
        return CheckResult(SKIP, f"store URL {url!r} is not valid: see the 'store' check")
    if objects.location.protocol != "s3":
        return CheckResult(SKIP, f"store {url} is not on S3: no credentials needed")
    cfg = objects.config
    if cfg.anon:
        return CheckResult(PASS, "WARP_S3_ANON=1: anonymous reads, no credentials used (publishing needs them)",
                           facts={"source": "anonymous"})
    source = cfg.credentials_source()
    if source == "none found":
        where = f"profile {cfg.profile!r}" if cfg.profile else \
            "the environment (AWS_ACCESS_KEY_ID), ~/.aws/credentials, ~/.aws/config or instance metadata"
        return CheckResult(FAIL, f"no AWS credentials found in {where}",
                           "set AWS_PROFILE (or WARP_S3_PROFILE), or AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY; "
                           "WARP_S3_ANON=1 for a public bucket")
    return CheckResult(PASS, f"credentials from {source}" + (f", endpoint {cfg.endpoint_url}" if cfg.endpoint_url else ""),
                       facts={"source": source, "endpoint": cfg.endpoint_url, "profile": cfg.profile})


def _store_failure(url: str, e: Exception, what: str) -> CheckResult:
    """One line naming the cause (refused, DNS, timeout, credentials, bucket) and its fix."""
    err = translate_storage_error(e, url, what)
    hint = getattr(err, "hint", None)
    if err is e or not hint:
        return CheckResult(FAIL, f"store {url} not reachable for {what}: {type(e).__name__}: {e}",
                           "check WARP_S3_ENDPOINT, credentials (AWS_PROFILE / AWS_ACCESS_KEY_ID) and the bucket name")
    return CheckResult(FAIL, str(err), hint, facts={"error": getattr(err, "code", None),
                                                    **getattr(err, "details", {})})


@check("store", "store")
def store() -> CheckResult:
    blocked = store_blocker()
    if blocked is not None:
        return blocked
    return _block("store", _store())


def _store() -> CheckResult:
    url = envvars.default_store()
    try:
        objects = open_object_store(url)
    except Exception as e:
        return CheckResult(FAIL, str(e), "set WARP_STORE to a path, s3://bucket/prefix or memory://name")
    loc = objects.location
    if loc.protocol == "file":
        missing = missing_store_folder(loc)
        r = dir_check(loc.path, "store", "WARP_STORE")
        if missing and envvars.get("WARP_STORE") and r.status != FAIL:
            # a typo in WARP_STORE shows up here; the probes below need the folder, so it was made
            return CheckResult(WARN, f"{missing[0]} (created it to test writing; readers said "
                               "'does not exist' until now)", missing[1], facts={**r.facts, "created": True})
        return r
    if loc.read_only:
        return _http_store(objects)
    cfg = objects.config
    facts: dict = {"url": url}
    probe = objects.path(f".warp-doctor-{uuid.uuid4().hex}")
    try:
        fs = objects.fs
        fs.pipe_file(probe, b"ok")
        got = fs.cat_file(probe)
    except Exception as e:
        return _store_failure(url, e, "write")
    try:
        if got != b"ok":
            return CheckResult(FAIL, f"store {url} returned different bytes than written", "check the S3 endpoint")
        if loc.protocol == "s3":
            facts["credentials"] = cfg.credentials_source()
    finally:
        with contextlib.suppress(Exception):
            fs.rm_file(probe)
    # create-only writes are the 'store-create-only' check's probe (one probe per property)
    what = "readable and writable"
    return CheckResult(PASS, f"{url} {what}", facts=facts)


def _http_store(objects) -> CheckResult:
    """A store served over HTTP(S): reachable? (read-only: nothing is written, nothing listed)."""
    url, remote = objects.url, objects.remote
    facts: dict = {"url": url, "read_only": True}
    try:
        remote.probe("datasets/")
        answered = "answers"
    except HttpStatusError as e:  # any answer means the host is there; reads of keys decide the rest
        answered = f"answers (HTTP {e.status} for datasets/: static hosts do not list)"
        facts["status"] = e.status
    except Exception as e:
        err = remote.typed_error(e)
        return CheckResult(FAIL, getattr(err, "message", str(err)), getattr(err, "hint", None) or
                           "check the store URL (WARP_STORE) and the network", facts={"url": url})
    return CheckResult(PASS, f"{url} {answered}; read-only HTTP store: publish to the bucket or folder it serves",
                       "'warp doctor WS/NAME' checks reading a dataset from it", facts=facts)


def _read_only(store) -> CheckResult | None:
    if not store.read_only:
        return None
    return CheckResult(SKIP, f"{store.url} is a read-only HTTP store: nothing is written to it",
                       "publish to the bucket or folder it serves; 'warp doctor WS/NAME' checks reads")


@check("duckdb-parquet", "store")
def duckdb_parquet() -> CheckResult:
    """DuckDB reads a Parquet file from the configured store (s3fs registered in DuckDB for S3)."""
    blocked = store_blocker()
    if blocked is not None:
        return blocked
    import duckdb
    import pyarrow as pa
    import pyarrow.parquet as pq

    url = envvars.default_store()
    try:
        objects = open_object_store(url)
        loc = objects.location
    except Exception as e:
        return CheckResult(FAIL, str(e), "set WARP_STORE to a path, s3://bucket/prefix or memory://name")
    if loc.read_only:
        return CheckResult(SKIP, f"{url} is a read-only HTTP store: no probe can be written; table reads go "
                           "through warp's ranged reader", "'warp doctor WS/NAME' streams a table from it")
    buf = pa.BufferOutputStream()
    pq.write_table(pa.table({"x": [1, 2, 3]}), buf)
    probe = loc.join(f".warp-doctor-{uuid.uuid4().hex}.parquet")
    try:
        fs = objects.fs
        fs.pipe_file(probe.path, buf.getvalue().to_pybytes())
    except Exception as e:
        return CheckResult(FAIL, f"cannot write a Parquet probe to {url}: {type(e).__name__}: {e}",
                           "fix the 'store' check first")
    try:
        con = connect(filesystem=None if loc.protocol == "file" else fs)
        # the probe file and nothing else (DuckDB checks fsspec URLs in both spellings)
        confine(con, [probe.url] if loc.protocol == "file" else [probe.url, f"{loc.protocol}:///{probe.path.lstrip('/')}"])
        n = con.execute("select sum(x) from read_parquet(?)", [probe.url]).fetchone()[0]
    except Exception as e:
        return CheckResult(FAIL, f"DuckDB {duckdb.__version__} cannot read Parquet from {url}: {type(e).__name__}: {e}",
                           "pip install -U duckdb s3fs; check WARP_S3_ENDPOINT and credentials")
    finally:
        with contextlib.suppress(Exception):
            fs.rm_file(probe.path)
    if n != 6:
        return CheckResult(FAIL, f"DuckDB read a wrong sum ({n}) from Parquet in {url}", "reinstall duckdb and pyarrow")
    via = " via s3fs" if loc.protocol == "s3" else ""
    return CheckResult(PASS, f"DuckDB {duckdb.__version__} reads Parquet from {url}{via} (written by pyarrow {pa.__version__})",
                       facts={"duckdb": duckdb.__version__})


def _probe(write: Callable[[Store, str], T], what: str, hint: str) -> tuple[Store, T] | CheckResult:
    """``write(store, prefix)`` against the store under a fresh probe prefix, removed afterwards: (the
    store, what ``write`` returned), or the result to report instead: a SKIP when this store cannot be
    probed here (an earlier store check failed, or it is read-only), a FAIL naming the cause when a
    write raised (translated by warp/storage/errors.py: refused, DNS, credentials, bucket)."""
    blocked = store_blocker()
    if blocked is not None:
        return blocked
    store = Store(envvars.default_store())
    if (ro := _read_only(store)) is not None:
        return ro
    prefix = f".warp-doctor/{uuid.uuid4().hex}"
    try:
        return store, write(store, prefix)
    except Exception as e:
        err = translate_storage_error(e, store.url, "write")
        detail = f"{type(e).__name__}: {e}" if err is e else str(err)
        return CheckResult(FAIL, f"store {store.url}: {what} failed: {detail}", getattr(err, "hint", None) or hint)
    finally:
        with contextlib.suppress(Exception):
            store.remove_prefix(prefix)


@check("store-create-only", "store")
def create_only() -> CheckResult:
    """A create-only write succeeds once and is refused the second time, bytes intact."""
    data = uuid.uuid4().bytes

    def write(store: Store, prefix: str) -> tuple[bool, bool, bytes | None]:
        key = f"{prefix}/probe"
        return store.put_object(key, data), store.put_object(key, b"other bytes"), store.get_object(key)

    probed = _probe(write, "create-only write", "check WARP_STORE, the endpoint and credentials")
    if isinstance(probed, CheckResult):
        return probed
    store, (first, second, got) = probed
    if not first:
        return CheckResult(FAIL, f"store {store.url}: a fresh create-only write was refused", "check the store URL")
    if second or got != data:
        return CheckResult(FAIL, f"store {store.url} overwrote an existing object on a create-only write "
                           "(no If-None-Match support): concurrent publishers could clobber each other",
                           "use an S3 service that honours If-None-Match (AWS S3, Ceph RGW, Cloudflare R2) or a local store")
    return CheckResult(PASS, f"{store.url}: read/write OK, create-only writes refused on existing objects")


@check("store-cas", "store")
def compare_and_swap() -> CheckResult:
    """A conditional update of a pointer with a stale token is refused."""

    def write(store: Store, prefix: str) -> tuple[Any, Any, Any, bytes | None]:
        key = f"{prefix}/latest.json"
        t1 = store.swap_object(key, b'{"v": 1}', None)
        t2 = store.swap_object(key, b'{"v": 2}', t1) if t1 else None
        stale = store.swap_object(key, b'{"v": 3}', t1) if t2 else "skipped"
        return t1, t2, stale, store.get_object(key)

    probed = _probe(write, "conditional write",
                    "use an S3 service that honours If-Match (AWS S3, Ceph RGW, Cloudflare R2) or a local store")
    if isinstance(probed, CheckResult):
        return probed
    store, (t1, t2, stale, final) = probed
    if t1 is None or t2 is None:
        return CheckResult(FAIL, f"store {store.url}: a conditional write with the current token was refused",
                           "check the store's If-Match / If-None-Match support")
    if stale is not None:
        return CheckResult(WARN, f"store {store.url} accepted a write with a stale token: 'latest' updates can race",
                           "publish from one process at a time, or use a store with If-Match support")
    if final != b'{"v": 2}':
        return CheckResult(FAIL, f"store {store.url} returned {final!r} after compare-and-swap", "check the store")
    return CheckResult(PASS, f"{store.url}: compare-and-swap of 'latest' works ({hashlib.sha256(final).hexdigest()[:8]})")
