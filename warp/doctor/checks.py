"""Core ``warp doctor`` checks: Python, packages, optional backends, GPU, cache, store.

Each check returns PASS / WARN / FAIL / SKIP with the command or setting that
fixes it. The store checks exercise the configured ``WARP_STORE`` through
:mod:`warpdata.storage.locations` exactly as ``publish`` and the readers do: read,
write, create-only write (S3), and DuckDB reading a Parquet file *from the
store* (through s3fs registered in DuckDB for S3).

The store checks name the real cause first: credentials are checked before
anything is sent, a failed connection says whether the endpoint refused it,
its host did not resolve or the connect timed out, and once the store cannot
be reached the checks after it are SKIPped ("fix 'store' first") instead of
repeating the same failure, each after its own timeouts.
"""

from __future__ import annotations

import contextlib
import importlib.metadata as md
import os
import shutil
import sys
import tempfile
import uuid

from warpdata.core import envvars
from warpdata.doctor.registry import FAIL, PASS, SKIP, WARN, CheckResult, check

REQUIRED = ("typer", "rich", "numpy", "lz4", "zstandard", "duckdb", "pyarrow", "fsspec", "pillow",
            "anycrc", "google-crc32c", "simplejpeg", "jsonschema")
GPU_REMEDY = "pip install 'warp-toolchain[gpu]' (CUDA 12) or 'warp-toolchain[gpu-cu13]' (CUDA 13)"
# check name -> (distributions, any one of which provides it; what it enables; remedy)
OPTIONAL = {
    "s3fs": (("s3fs",), "S3 stores", "pip install 'warp-toolchain[s3]'"),
    "torch": (("torch",), "PyTorch datasets and loaders", "pip install 'warp-toolchain[torch]'"),
    "zarr": (("zarr",), "reading Zarr output with zarr-python", "pip install 'warp-toolchain[zarr]'"),
    "tensorstore": (("tensorstore",), "reading Zarr output with tensorstore", "pip install 'warp-toolchain[zarr]'"),
    "cupy": (("cupy-cuda12x", "cupy-cuda13x", "cupy"), "the gpu tile-compression backend", GPU_REMEDY),
    "nvcomp": (("nvidia-nvcomp-cu12", "nvidia-nvcomp-cu13"), "GPU zstd in the gpu backend", GPU_REMEDY),
}


@check("python", "install")
def python_version() -> CheckResult:
    v = sys.version_info
    detail = f"Python {v.major}.{v.minor}.{v.micro} at {sys.executable}"
    if v < (3, 11):
        return CheckResult(FAIL, detail, "install Python 3.11 or newer")
    return CheckResult(PASS, detail)


@check("distribution", "install")
def distribution() -> CheckResult:
    """The other project named ``warpdata`` on the package index also installs ``warpdata`` and ``warp``."""
    from warpdata.core.errors import DISTRIBUTION

    providers = sorted(set(md.packages_distributions().get("warpdata", [])))
    facts = {"providers": providers}
    others = [p for p in providers if p.lower().replace("_", "-") != DISTRIBUTION]
    if others:
        return CheckResult(FAIL, f"the module 'warpdata' is also installed by {', '.join(others)}: "
                           "the two overwrite each other's files and the `warp` script",
                           f"pip uninstall -y {' '.join(others)} && pip install --force-reinstall {DISTRIBUTION} "
                           "(from a clone: pip install --force-reinstall .)", facts=facts)
    if not providers:
        return CheckResult(WARN, "warpdata runs from a source tree, not an installed distribution",
                           "pip install -e .  (man pages, completions and entry points come with the install)",
                           facts=facts)
    return CheckResult(PASS, f"{DISTRIBUTION} {md.version(DISTRIBUTION)}", facts=facts)


@check("packages", "install")
def packages() -> CheckResult:
    missing, versions = [], {}
    for name in REQUIRED:
        try:
            versions[name] = md.version(name)
        except md.PackageNotFoundError:
            missing.append(name)
    if missing:
        return CheckResult(FAIL, "missing: " + ", ".join(missing), "pip install --force-reinstall warp-toolchain  (the core dependencies)",
                           facts=versions)
    typer_v = versions.get("typer", "0")
    if tuple(int(x) for x in typer_v.split(".")[:2] if x.isdigit()) >= (0, 29):
        return CheckResult(WARN, f"typer {typer_v} imports pydantic and slows every warp call",
                           "pip install 'typer<0.29'", facts=versions)
    return CheckResult(PASS, ", ".join(f"{k} {v}" for k, v in versions.items()), facts=versions)


def _installed(dists: tuple[str, ...]) -> tuple[str, str] | None:
    for d in dists:
        try:
            return d, md.version(d)
        except md.PackageNotFoundError:
            continue
    return None


def _optional(name: str) -> CheckResult:
    dists, feature, remedy = OPTIONAL[name]
    found = _installed(dists)
    if found is None and remedy == GPU_REMEDY and not _gpu_visible():
        return CheckResult(SKIP, f"not installed, and not needed without a GPU ({feature})", remedy)
    if found is None:
        return CheckResult(WARN, f"not installed: {feature} unavailable", remedy)
    return CheckResult(PASS, f"{found[0]} {found[1]}", facts={"distribution": found[0], "version": found[1]})


for _name in OPTIONAL:
    check(f"optional:{_name}", "backends")(lambda _n=_name: _optional(_n))


def _gpu_visible() -> bool:
    return shutil.which("nvidia-smi") is not None or os.path.exists("/dev/nvidia0")


@check("cuda-gpu", "backends")
def cuda_gpu() -> CheckResult:
    cupy = _installed(OPTIONAL["cupy"][0])
    if not _gpu_visible():
        return CheckResult(SKIP, "no NVIDIA GPU visible (no /dev/nvidia0, no nvidia-smi): the gpu backend is unavailable, cpu is used",
                           "run on a machine with a CUDA GPU for the gpu backend")
    if cupy is None:
        return CheckResult(WARN, "a GPU is visible but CuPy is not installed", GPU_REMEDY)
    try:  # the device node can exist while the driver/runtime pair is unusable
        import cupy as cp

        n = cp.cuda.runtime.getDeviceCount()
        name = cp.cuda.runtime.getDeviceProperties(0)["name"]
        name = name.decode() if isinstance(name, bytes) else str(name)
    except Exception as e:
        return CheckResult(FAIL, f"a GPU is visible but CUDA through {cupy[0]} fails: {type(e).__name__}: {e}",
                           "match the CuPy/nvCOMP wheels to the driver's CUDA major version (nvidia-smi shows it)")
    return CheckResult(PASS, f"{n} CUDA GPU(s), first: {name}; {cupy[0]} {cupy[1]}", facts={"devices": n})


def _dir_check(path: str, what: str, var: str) -> CheckResult:
    try:
        os.makedirs(path, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".warp-doctor-", dir=path)
        os.close(fd)
        os.unlink(tmp)
    except OSError as e:
        return CheckResult(FAIL, f"{what} {path} is not writable: {e.strerror}",
                           f"set {var} to a writable directory")
    free = shutil.disk_usage(path).free
    detail = f"{path} writable, {free / 1e9:.1f} GB free"
    if free < 1e9:
        return CheckResult(WARN, detail, f"free disk space or point {var} elsewhere", facts={"free_bytes": free})
    return CheckResult(PASS, detail, facts={"free_bytes": free, "path": path})


@check("cache-dir", "cache")
def cache_dir() -> CheckResult:
    return _dir_check(envvars.default_cache_dir(), "cache directory", "WARP_CACHE_DIR")


@check("direct-io", "cache")
def direct_io() -> CheckResult:
    """Where ETL output goes by default (the working directory): will big writes skip the page cache?"""
    from warpdata.core.directio import (
        BLOCK,
        DIRECT_FILESYSTEMS,
        AlignedFile,
        aligned_empty,
        filesystem_type,
        wants_direct,
    )

    path = os.getcwd()
    fs = filesystem_type(path) or "unknown"
    mode = (envvars.get("WARP_DIRECT_IO") or "auto").strip().lower()
    facts = {"path": path, "filesystem": fs, "WARP_DIRECT_IO": mode}
    if not wants_direct(path):
        why = "WARP_DIRECT_IO=0" if mode in ("0", "no", "off", "false") else \
            f"{fs} is not one of {', '.join(sorted(DIRECT_FILESYSTEMS))}" if hasattr(os, "O_DIRECT") else \
            "this system has no O_DIRECT"
        return CheckResult(PASS, f"{path} ({fs}): big writes go through the page cache ({why})", facts=facts)
    try:
        fd, tmp = tempfile.mkstemp(prefix=".warp-doctor-", dir=path)
        os.close(fd)
    except OSError as e:
        return CheckResult(SKIP, f"{path} is not writable ({e.strerror}): O_DIRECT not tried", facts=facts)
    try:
        with AlignedFile(tmp, direct=True) as f:
            f.write(0, aligned_empty(BLOCK))
            used = f.direct_bytes == BLOCK
    except OSError as e:
        used = False
        facts["error"] = f"{type(e).__name__}: {e}"
    finally:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
    facts["direct"] = used
    if not used:
        return CheckResult(WARN, f"{path} ({fs}) refuses O_DIRECT: big writes fall back to the page cache",
                           "set WARP_DIRECT_IO=0 to stop trying, or write to an ext4/xfs volume", facts=facts)
    return CheckResult(PASS, f"{path} ({fs}): big writes (warehouse and Zarr shards) use O_DIRECT", facts=facts)


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
    from warpdata.storage.locations import StorageConfig, parse_location

    url = envvars.default_store()
    try:
        loc = parse_location(url)
    except Exception:
        return CheckResult(SKIP, f"store URL {url!r} is not valid: see the 'store' check")
    if loc.protocol != "s3":
        return CheckResult(SKIP, f"store {url} is not on S3: no credentials needed")
    cfg = StorageConfig.from_env()
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
    from warpdata.storage.errors import translate_storage_error

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
    from warpdata.storage.locations import (
        StorageConfig,
        filesystem,
        missing_store_folder,
        parse_location,
    )

    url = envvars.default_store()
    try:
        loc = parse_location(url)
    except Exception as e:
        return CheckResult(FAIL, str(e), "set WARP_STORE to a path, s3://bucket/prefix or memory://name")
    if loc.protocol == "file":
        missing = missing_store_folder(loc)
        r = _dir_check(loc.path, "store", "WARP_STORE")
        if missing and envvars.get("WARP_STORE") and r.status != FAIL:
            # a typo in WARP_STORE shows up here; the probes below need the folder, so it was made
            return CheckResult(WARN, f"{missing[0]} (created it to test writing; readers said "
                               "'does not exist' until now)", missing[1], facts={**r.facts, "created": True})
        return r
    cfg = StorageConfig.from_env()
    s3_remedy = "check WARP_S3_ENDPOINT, credentials (AWS_PROFILE / AWS_ACCESS_KEY_ID) and the bucket name"
    facts: dict = {"url": url}
    probe = loc.join(f".warp-doctor-{uuid.uuid4().hex}").path
    try:
        fs = filesystem(loc, cfg)
        fs.pipe_file(probe, b"ok")
        got = fs.cat_file(probe)
    except Exception as e:
        return _store_failure(url, e, "write")
    try:
        if got != b"ok":
            return CheckResult(FAIL, f"store {url} returned different bytes than written", "check the S3 endpoint")
        if loc.protocol == "s3":
            facts["credentials"] = cfg.credentials_source()
            # publish relies on create-only writes (If-None-Match: *) so racing publishers cannot clobber
            try:
                fs.pipe_file(probe, b"again", mode="create")
            except FileExistsError:
                facts["create_only"] = True
            else:
                return CheckResult(FAIL, f"store {url} accepted a create-only write over an existing object "
                                   "(the endpoint ignores If-None-Match), so concurrent publishes could overwrite each other",
                                   "use an S3 endpoint with conditional writes (AWS S3, MinIO >= 2024, recent Ceph)",
                                   facts=facts)
    except Exception as e:
        return CheckResult(FAIL, f"store {url}: create-only write failed: {type(e).__name__}: {e}", s3_remedy, facts=facts)
    finally:
        with contextlib.suppress(Exception):
            fs.rm_file(probe)
    what = "readable, writable, create-only writes honoured" if loc.protocol == "s3" else "readable and writable"
    return CheckResult(PASS, f"{url} {what}", facts=facts)


@check("duckdb-parquet", "store")
def duckdb_parquet() -> CheckResult:
    """DuckDB reads a Parquet file from the configured store (s3fs registered in DuckDB for S3)."""
    blocked = store_blocker()
    if blocked is not None:
        return blocked
    import duckdb
    import pyarrow as pa
    import pyarrow.parquet as pq
    from warpdata.storage.locations import StorageConfig, filesystem, parse_location

    url = envvars.default_store()
    try:
        loc = parse_location(url)
    except Exception as e:
        return CheckResult(FAIL, str(e), "set WARP_STORE to a path, s3://bucket/prefix or memory://name")
    buf = pa.BufferOutputStream()
    pq.write_table(pa.table({"x": [1, 2, 3]}), buf)
    probe = loc.join(f".warp-doctor-{uuid.uuid4().hex}.parquet")
    cfg = StorageConfig.from_env()
    try:
        fs = filesystem(loc, cfg)
        fs.pipe_file(probe.path, buf.getvalue().to_pybytes())
    except Exception as e:
        return CheckResult(FAIL, f"cannot write a Parquet probe to {url}: {type(e).__name__}: {e}",
                           "fix the 'store' check first")
    try:
        from warpdata.core.sqlgate import confine, connect

        if loc.protocol == "file":
            con = connect()
        elif loc.protocol == "s3":
            con = cfg.duckdb_connect(fs)
        else:
            con = connect()
            con.register_filesystem(fs)
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
