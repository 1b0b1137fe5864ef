"""`make gpu-check` (bench/gpu_check.py): the plan it prints, the wheels it asks for, and what it
records on a machine without a GPU. The GPU steps themselves run only on a CUDA machine."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "bench" / "gpu_check.py"
sys.path.insert(0, str(ROOT / "bench"))

import gpu_check  # noqa: E402


def test_dry_run_prints_every_step_and_imports_nothing(tmp_path):
    probe = ("import runpy, sys; sys.argv = ['gpu_check.py', '--dry-run', '--out', {!r}]; "
             "rc = 0\n"
             "try:\n    runpy.run_path({!r}, run_name='__main__')\n"
             "except SystemExit as e:\n    rc = e.code\n"
             "print('RC', rc, 'IMPORTED', sorted(m for m in ('cupy', 'warpdata', 'numpy', 'nvidia') if m in sys.modules))"
             ).format(str(tmp_path / "f.json"), str(SCRIPT))
    p = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip().endswith("RC 0 IMPORTED []")
    for step in ("1. environment", "2. tests: -m pytest -q -m gpu", "3. identity", "4. throughput"):
        assert step in p.stdout
    assert "tests/tiles/test_kernels.py" in p.stdout
    assert not (tmp_path / "f.json").exists()


def test_wheels_follow_the_lock():
    pins = gpu_check.lock_pins()
    reqs = gpu_check.wheel_requirements()
    assert reqs[-1] == gpu_check.NVCOMP
    for req in reqs[:-1]:
        name, version = req.split("==")
        assert pins[name] == version
    # the modules the GPU tests import beyond what the GPU machine has
    assert {"zstandard", "anycrc", "google-crc32c"} <= {r.split("==")[0] for r in reqs}


def test_pytest_summary_is_parsed():
    text = "....s\n=== 5 passed, 1 skipped, 1210 deselected in 12.31s ===\n"
    assert gpu_check.parse_pytest_summary(text) == {"passed": 5, "skipped": 1, "deselected": 1210}
    assert gpu_check.parse_pytest_summary("1 failed, 2 passed, 3 errors in 1s") == {
        "failed": 1, "passed": 2, "errors": 3}
    assert gpu_check.parse_pytest_summary("no tests ran") == {}


def test_without_a_gpu_the_environment_step_says_why(tmp_path):
    out = tmp_path / "figures.json"
    p = subprocess.run([sys.executable, str(SCRIPT), "--only", "environment", "--out", str(out)],
                       capture_output=True, text=True, cwd=ROOT, timeout=120)
    doc = json.loads(out.read_text())
    if doc["environment"]["probe"] is None:  # a CUDA machine: the step passes
        assert p.returncode == 0 and doc["ok"] is True
        return
    assert p.returncode == 1
    assert doc["ok"] is False and doc["format"] == "warp-gpu-check/1"
    assert "cupy" in doc["environment"]["probe"] or "CUDA" in doc["environment"]["probe"]
    assert "cannot run here" in p.stderr and "a step FAILED" in p.stdout
