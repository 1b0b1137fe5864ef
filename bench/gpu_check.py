"""The GPU check: everything warp's GPU tile backend must show on a CUDA machine, in one run.

    make gpu-wheels                      # here: the wheels the GPU machine lacks, into .whl/
    make gpu-check                       # there: python3 bench/gpu_check.py (< 4 minutes on one H100)
    python3 bench/gpu_check.py --dry-run # anywhere: what it would run, nothing imported or run

Steps, each recorded in the figures file (``--out``, default ``$OUT/gpu_check.json`` when
``$OUT`` is set, else ``bench/out/gpu_check.json``), so a lent machine's minutes are not
spent reading logs:

1. **environment**: the device, CuPy and nvCOMP versions, and the backend's own probe
   (``GpuBackend.probe()``: why it cannot run, or nothing).
2. **tests**: ``pytest -m gpu`` over the files that hold GPU tests, among them the tile
   backend conformance suite (``tests/tiles/test_kernels.py``: the same cases the CPU
   backend passes).
3. **identity**: the same volume written by the ``cpu`` and the ``gpu`` backends reads back
   identical, chunk for chunk (nvCOMP's zstd frames differ in bytes from libzstd's, the data
   they decode to may not: docs/formats/zarr-tiles.md), and equal to the input.
4. **throughput**: host -> store GB/s of ``TileWriter(backend="gpu")`` into ``/dev/shm``
   (best of ``--runs``), beside the CPU backend on the same machine, against the ceiling:
   nvCOMP's batched zstd alone over the already-tiled volume on the device (CUDA events).

A GPU machine of this workplace has CuPy but not warp's own dependencies nor nvCOMP, and
cannot reach the package index: ``make gpu-wheels`` downloads them (CPython 3.12,
manylinux x86-64, the versions of ``requirements/dev.lock``) into ``.whl/``, which travels
with the tree; this script installs them into a private folder when an import is missing,
and makes ``warpdata`` importable from the checkout without installing it.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SITE = Path(tempfile.gettempdir()) / "warp-gpu-site"
#: what the GPU machine lacks, by distribution name; versions come from requirements/dev.lock
#: except nvCOMP, which the lock does not hold (the `gpu-cu13` extra: the machine has CuPy for CUDA 13)
WHEELS = ("zstandard", "lz4", "cffi", "anycrc", "google-crc32c", "fastcrc", "isal", "simplejpeg",
          "xxhash", "jsonschema", "jsonschema-specifications", "referencing", "rpds-py")
NVCOMP = "nvidia-nvcomp-cu13"
GPU_TESTS = ("tests/tiles/test_kernels.py", "tests/features/test_features.py",
             "tests/features/test_features_config.py")
STEPS = ("environment", "tests", "identity", "throughput")


def lock_pins(lock: Path = ROOT / "requirements" / "dev.lock") -> dict[str, str]:
    """``name==version`` of every distribution in a hash-pinned lock, by lower-case name."""
    pins: dict[str, str] = {}
    for line in lock.read_text().splitlines():
        m = re.match(r"^([A-Za-z0-9_.-]+)==([^\s;\\]+)", line)
        if m:
            pins[m.group(1).lower().replace("_", "-")] = m.group(2)
    return pins


def wheel_requirements() -> list[str]:
    pins = lock_pins()
    missing = [w for w in WHEELS if w not in pins]
    if missing:
        raise SystemExit(f"requirements/dev.lock has no pin for {', '.join(missing)}: update WHEELS")
    return [f"{w}=={pins[w]}" for w in WHEELS] + [NVCOMP]


def download_command(dest: str = ".whl") -> list[str]:
    platforms = [f"manylinux_2_{n}_x86_64" for n in (17, 24, 27, 28, 31, 34, 35)]
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
           "--python-version", "3.12", "--implementation", "cp", "-d", dest]
    for p in ("manylinux2014_x86_64", "manylinux1_x86_64", *platforms):
        cmd += ["--platform", p]
    return cmd + wheel_requirements()


def pytest_command() -> list[str]:
    return [sys.executable, "-m", "pytest", "-q", "-m", "gpu", "-p", "no:cacheprovider", *GPU_TESTS]


def parse_pytest_summary(text: str) -> dict[str, int]:
    """Counts from pytest's last summary line (``3 passed, 1 skipped, 40 deselected in 2.1s``)."""
    lines = [ln for ln in text.strip().splitlines() if re.search(r"\b(passed|failed|error|skipped|deselected)\b", ln)]
    if not lines:
        return {}
    return {k: int(n) for n, k in re.findall(r"(\d+) (passed|failed|errors?|skipped|deselected|xfailed|xpassed)",
                                               lines[-1])}


def default_out() -> Path:
    out = os.environ.get("OUT")
    return Path(out) / "gpu_check.json" if out else ROOT / "bench" / "out" / "gpu_check.json"


def _site() -> str:
    """Make ``warpdata`` (from this checkout) and the carried wheels importable, here and in
    children; returns what it did, for the figures file."""
    SITE.mkdir(parents=True, exist_ok=True)
    wheels = sorted((ROOT / ".whl").glob("*.whl"))
    note = "nothing to install"
    try:
        import nvidia.nvcomp  # noqa: F401
        import zstandard  # noqa: F401
    except ImportError:
        if wheels and sys.version_info[:2] != (3, 12):
            note = f"the wheels in .whl/ are for CPython 3.12, this is {sys.version.split()[0]}: not installed"
        elif wheels:
            p = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
                                "--upgrade", "--target", str(SITE), *map(str, wheels)], capture_output=True, text=True)
            note = (f"installed {len(wheels)} wheels into {SITE}" if p.returncode == 0
                    else f"pip could not install .whl/: {p.stderr.strip()[-500:]}")
    try:
        import warpdata  # noqa: F401
    except ImportError:
        # the package-dir mapping of pyproject.toml (warp/ -> warpdata, formats/ -> warpdata.formats, ...)
        pkg = SITE / "warpdata"
        pkg.mkdir(exist_ok=True)
        for src in (ROOT / "warp").iterdir():
            _link(src, pkg / src.name)
        for sub in ("commands", "formats", "kernels"):
            _link(ROOT / sub, pkg / sub)
    sys.path.insert(0, str(SITE))
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(SITE), os.environ.get("PYTHONPATH")) if p)
    return note


def _link(src: Path, dst: Path) -> None:
    if not dst.exists():
        dst.symlink_to(src)


def step_environment() -> dict:
    from warpdata.kernels.gpu import GpuBackend

    env = {"python": sys.version.split()[0], "probe": GpuBackend.probe()}
    try:
        import cupy

        env["cupy"] = cupy.__version__
        props = cupy.cuda.runtime.getDeviceProperties(0)
        env["device"] = props["name"].decode() if isinstance(props["name"], bytes) else props["name"]
        env["cuda_runtime"] = cupy.cuda.runtime.runtimeGetVersion()
    except Exception as e:  # a missing or broken CUDA stack is exactly what this step reports
        env["cupy_error"] = f"{type(e).__name__}: {e}"
    try:
        from importlib.metadata import version

        env["nvcomp"] = version(NVCOMP)
    except Exception as e:
        env["nvcomp_error"] = f"{type(e).__name__}: {e}"
    return env


def step_tests(timeout: float) -> dict:
    t0 = time.perf_counter()
    try:
        p = subprocess.run(pytest_command(), cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        return {"timed_out": True, "seconds": timeout, "tail": (e.stdout or "")[-4000:] if isinstance(e.stdout, str) else ""}
    return {"returncode": p.returncode, "counts": parse_pytest_summary(p.stdout), "seconds": round(time.perf_counter() - t0, 1),
            "tail": (p.stdout + p.stderr)[-4000:]}


def _volume(gib: float):
    from warpdata.sampledata.volume import photo_like_volume

    z = max(64, int(round(gib * 512 / 64)) * 64)
    return photo_like_volume((z, 1024, 1024), "uint16", seed=0)


def _write(a, path: str, backend: str) -> float:
    from warpdata.tiles.writer import TileWriter

    t0 = time.perf_counter()
    with TileWriter(path, a.shape, a.dtype, (64, 64, 64), shards=(64, 512, 512), level=1, backend=backend) as w:
        w.write_array(a)
    return time.perf_counter() - t0


def step_identity(base: str) -> dict:
    import numpy as np
    from warpdata.storage.zarr_store import read_array

    a = _volume(0.125)
    got = {}
    for backend in ("cpu", "gpu"):
        path = os.path.join(base, f"identity-{backend}.zarr")
        _write(a, path, backend)
        got[backend] = read_array(path)
    out = {"shape": list(a.shape), "cpu_equals_input": bool(np.array_equal(got["cpu"], a)),
           "gpu_equals_input": bool(np.array_equal(got["gpu"], a)),
           "gpu_equals_cpu": bool(np.array_equal(got["gpu"], got["cpu"]))}
    try:
        import tensorstore as ts

        t = ts.open({"driver": "zarr3", "kvstore": {"driver": "file", "path": os.path.join(base, "identity-gpu.zarr")}}).result()
        out["tensorstore_reads_gpu_output"] = bool(np.array_equal(t.read().result(), a))
    except ImportError:
        out["tensorstore_reads_gpu_output"] = None
    return out


def _nvcomp_ceiling(a, runs: int) -> float:
    """GB/s of nvCOMP's batched zstd alone over the volume already tiled on the device."""
    import cupy as cp
    from nvidia import nvcomp

    d = cp.asarray(a)
    z, y, x = a.shape
    tiles = d.reshape(z // 64, 64, y // 64, 64, x // 64, 64).transpose(0, 2, 4, 1, 3, 5)
    tiles = cp.ascontiguousarray(tiles).reshape(-1, 64 * 64 * 64).view(cp.uint8)  # (tiles, bytes per tile)
    stream = cp.cuda.Stream(non_blocking=True)
    codec = nvcomp.Codec(algorithm="Zstd", bitstream_kind=nvcomp.BitstreamKind.RAW, cuda_stream=stream.ptr)
    per_batch = max(1, (1 << 30) // tiles.shape[1])
    best = float("inf")
    for _ in range(runs + 1):  # the first is a warm-up
        start, end = cp.cuda.Event(), cp.cuda.Event()
        start.record(stream)
        frames = []
        for i in range(0, tiles.shape[0], per_batch):
            frames += codec.encode(nvcomp.as_arrays(list(tiles[i:i + per_batch]), cuda_stream=stream.ptr))
        end.record(stream)
        end.synchronize()
        sum(int(f.buffer_size) for f in frames)  # touch the outputs: nvCOMP syncs its own work here
        best = min(best, cp.cuda.get_elapsed_time(start, end) / 1e3)
    return a.nbytes / best / 1e9


def step_throughput(base: str, gib: float, runs: int) -> dict:
    import shutil

    a = _volume(gib)
    out = {"gib": round(a.nbytes / 2**30, 3), "runs": runs}
    for backend in ("gpu", "cpu"):
        path = os.path.join(base, f"bench-{backend}.zarr")
        walls = []
        for _ in range(runs):
            shutil.rmtree(path, ignore_errors=True)
            walls.append(_write(a, path, backend))
        shutil.rmtree(path, ignore_errors=True)
        out[f"{backend}_gb_s"] = round(a.nbytes / min(walls) / 1e9, 3)
    out["nvcomp_zstd_gb_s"] = round(_nvcomp_ceiling(a, runs), 3)
    out["gpu_pct_of_nvcomp"] = round(100 * out["gpu_gb_s"] / out["nvcomp_zstd_gb_s"], 1)
    out["gpu_over_cpu"] = round(out["gpu_gb_s"] / out["cpu_gb_s"], 2)
    return out


def plan(args) -> list[str]:
    lines = [f"figures -> {args.out}"]
    if (ROOT / ".whl").is_dir():
        lines.append(f"install the carried wheels in {ROOT / '.whl'} into {SITE} where an import is missing")
    else:
        lines.append("no .whl/ here: warp's dependencies and nvCOMP must already be importable "
                     "(make gpu-wheels downloads them: " + " ".join(download_command()[4:]) + ")")
    lines += [
        "1. environment: python, cupy, device, nvcomp versions; GpuBackend.probe()",
        "2. tests: " + " ".join(pytest_command()[1:]) + f" (timeout {args.test_timeout:.0f} s)",
        "3. identity: a 0.125 GiB u16 volume written by the cpu and the gpu backends reads back equal",
        f"4. throughput: {args.gib} GiB u16, TileWriter gpu and cpu into {args.dir}, best of {args.runs}; "
        "ceiling: nvCOMP batched zstd alone on the device",
    ]
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dry-run", action="store_true", help="print what would run; import and run nothing")
    p.add_argument("--download-wheels", metavar="DIR", help="download the wheels a GPU machine lacks into DIR, then exit")
    p.add_argument("--out", type=Path, default=default_out(), help="the figures file (JSON)")
    p.add_argument("--gib", type=float, default=1.0, help="throughput volume size in GiB (default 1)")
    p.add_argument("--runs", type=int, default=3, help="timed runs per writer (default 3)")
    p.add_argument("--dir", default="/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir())
    p.add_argument("--test-timeout", type=float, default=150.0, help="seconds for the pytest step (default 150)")
    p.add_argument("--only", choices=STEPS, action="append", help="run only these steps (repeatable)")
    args = p.parse_args(argv)
    if args.download_wheels:
        return subprocess.run(download_command(args.download_wheels)).returncode
    if args.dry_run:
        print("\n".join(plan(args)))
        return 0
    steps = args.only or list(STEPS)
    result: dict = {"format": "warp-gpu-check/1", "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                    "setup": _site()}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    base = tempfile.mkdtemp(prefix="warp-gpu-check-", dir=args.dir)
    ok = True
    try:
        for name in steps:
            t0 = time.perf_counter()
            print(f"== {name}", file=sys.stderr, flush=True)
            try:
                if name == "environment":
                    result[name] = step_environment()
                    if result[name]["probe"] is not None:
                        ok = False
                        print(f"the GPU backend cannot run here: {result[name]['probe']}", file=sys.stderr)
                        break
                elif name == "tests":
                    result[name] = step_tests(args.test_timeout)
                    ok = ok and result[name].get("returncode") == 0
                elif name == "identity":
                    result[name] = step_identity(base)
                    ok = ok and all(v for v in result[name].values() if isinstance(v, bool))
                else:
                    result[name] = step_throughput(base, args.gib, args.runs)
            except Exception as e:  # one broken step must not hide the others' figures
                ok = False
                result[name] = {"error": f"{type(e).__name__}: {e}"}
            result[name]["step_seconds"] = round(time.perf_counter() - t0, 1)
            print(json.dumps(result[name], indent=1), file=sys.stderr, flush=True)
            args.out.write_text(json.dumps(result, indent=1) + "\n")
    finally:
        import shutil

        shutil.rmtree(base, ignore_errors=True)
    result["ok"] = ok
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"figures in {args.out}; {'all steps passed' if ok else 'a step FAILED'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
