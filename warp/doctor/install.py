"""``warp doctor`` install checks: Python, the distribution, required packages, optional backends, the GPU."""

from __future__ import annotations

import importlib.metadata as md
import os
import shutil
import sys

from warpdata.checks.registry import FAIL, PASS, SKIP, WARN, CheckResult, check
from warpdata.core.errors import DISTRIBUTION

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
