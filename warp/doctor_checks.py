"""Core ``warp doctor`` checks: Python, packages, optional backends, cache, store."""

from __future__ import annotations

import importlib.metadata as md
import os
import shutil
import sys
import tempfile
import uuid

from . import envvars
from .checks import FAIL, PASS, SKIP, WARN, CheckResult, check

REQUIRED = ("typer", "rich", "numpy", "lz4", "zstandard", "duckdb", "pyarrow", "fsspec", "pillow",
            "anycrc", "google-crc32c", "simplejpeg", "jsonschema")
OPTIONAL = {
    "s3fs": ("S3 stores", "pip install 'warpdata[s3]'"),
    "torch": ("PyTorch datasets and loaders", "pip install 'warpdata[torch]'"),
    "zarr": ("reading Zarr output with zarr-python", "pip install 'warpdata[zarr]'"),
    "tensorstore": ("reading Zarr output with tensorstore", "pip install 'warpdata[zarr]'"),
}


@check("python", "install")
def python_version() -> CheckResult:
    v = sys.version_info
    detail = f"Python {v.major}.{v.minor}.{v.micro} at {sys.executable}"
    if v < (3, 11):
        return CheckResult(FAIL, detail, "install Python 3.11 or newer")
    return CheckResult(PASS, detail)


@check("packages", "install")
def packages() -> CheckResult:
    missing, versions = [], {}
    for name in REQUIRED:
        try:
            versions[name] = md.version(name)
        except md.PackageNotFoundError:
            missing.append(name)
    if missing:
        return CheckResult(FAIL, "missing: " + ", ".join(missing), "pip install warpdata  (reinstall the core dependencies)",
                           facts=versions)
    typer_v = versions.get("typer", "0")
    if tuple(int(x) for x in typer_v.split(".")[:2] if x.isdigit()) >= (0, 29):
        return CheckResult(WARN, f"typer {typer_v} imports pydantic and slows every warp call",
                           "pip install 'typer<0.29'", facts=versions)
    return CheckResult(PASS, ", ".join(f"{k} {v}" for k, v in versions.items()), facts=versions)


def _optional(name: str) -> CheckResult:
    feature, remedy = OPTIONAL[name]
    try:
        v = md.version(name)
    except md.PackageNotFoundError:
        return CheckResult(WARN, f"not installed: {feature} unavailable", remedy)
    return CheckResult(PASS, f"{name} {v}")


for _name in OPTIONAL:
    check(f"optional:{_name}", "backends")(lambda _n=_name: _optional(_n))


@check("cuda-gpu", "backends")
def cuda_gpu() -> CheckResult:
    try:
        md.version("cupy-cuda12x")
        pkg = "cupy-cuda12x"
    except md.PackageNotFoundError:
        try:
            md.version("cupy-cuda13x")
            pkg = "cupy-cuda13x"
        except md.PackageNotFoundError:
            pkg = None
    if shutil.which("nvidia-smi") is None and not os.path.exists("/dev/nvidia0"):
        return CheckResult(SKIP, "no NVIDIA GPU visible (no /dev/nvidia0, no nvidia-smi): the gpu backend is unavailable, cpu is used",
                           "run on a machine with a CUDA GPU for the gpu backend")
    if pkg is None:
        return CheckResult(WARN, "a GPU is visible but CuPy is not installed",
                           "pip install 'warpdata[gpu]' (CUDA 12) or 'warpdata[gpu-cu13]' (CUDA 13)")
    return CheckResult(PASS, f"GPU visible, {pkg} installed")


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


@check("store", "store")
def store() -> CheckResult:
    from .storage import StorageConfig, filesystem, parse_location

    url = envvars.default_store()
    try:
        loc = parse_location(url)
    except Exception as e:
        return CheckResult(FAIL, str(e), "set WARP_STORE to a path, s3://bucket/prefix or memory://name")
    if loc.protocol == "file":
        return _dir_check(loc.path, "store", "WARP_STORE")
    cfg = StorageConfig.from_env()
    try:
        fs = filesystem(loc, cfg)
        probe = loc.join(f".warp-doctor-{uuid.uuid4().hex}").path
        fs.pipe_file(probe, b"ok")
        got = fs.cat_file(probe)
        fs.rm_file(probe)
    except Exception as e:
        return CheckResult(FAIL, f"store {url} not reachable for read/write: {type(e).__name__}: {e}",
                           "check WARP_S3_ENDPOINT, credentials (AWS_PROFILE / AWS_ACCESS_KEY_ID) and the bucket name")
    if got != b"ok":
        return CheckResult(FAIL, f"store {url} returned different bytes than written", "check the S3 endpoint")
    facts = {"url": url}
    if loc.protocol == "s3":
        facts["credentials"] = cfg.credentials_source()
    return CheckResult(PASS, f"{url} readable and writable", facts=facts)


@check("duckdb-parquet", "store")
def duckdb_parquet() -> CheckResult:
    import duckdb
    import pyarrow as pa
    import pyarrow.parquet as pq

    with tempfile.TemporaryDirectory(prefix="warp-doctor-") as d:
        p = os.path.join(d, "t.parquet")
        pq.write_table(pa.table({"x": [1, 2, 3]}), p)
        n = duckdb.connect().execute(f"select sum(x) from read_parquet('{p}')").fetchone()[0]
    if n != 6:
        return CheckResult(FAIL, f"DuckDB read a wrong sum ({n}) from Parquet", "reinstall duckdb and pyarrow")
    return CheckResult(PASS, f"DuckDB {duckdb.__version__} reads Parquet written by pyarrow {pa.__version__}")
