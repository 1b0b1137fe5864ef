"""bench/etl_failures.py runs its cases as a user would and reports warp's own lines (a smoke run of
the two cases that need neither a cluster nor an S3 server)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_the_failure_table_reports_exit_code_and_warps_line_per_case():
    pytest.importorskip("distributed", reason="the dask extra (dask, distributed) is not installed")
    r = subprocess.run([sys.executable, str(ROOT / "bench" / "etl_failures.py"), "--cases", "4,10", "--images", "16",
                        "--json"], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    assert report["cpus"] == os.cpu_count() and len(report["load_1m"]) == 2
    by_case = {row["case"].split()[0]: row for row in report["rows"]}
    assert set(by_case) == {"4", "10"}
    host = by_case["4"]
    assert host["exit"] == 78 and "no-such-host.invalid" in host["first_line"], host
    assert host["first_line"].startswith("error:") and not host["traceback"], host
    killed = by_case["10"]
    assert killed["exit"] in (-9, "skipped"), killed
    if killed["exit"] == -9:
        assert killed["note"].endswith(f"0 left after {killed['seconds']:.1f} s"), killed


def test_an_unknown_case_is_a_usage_error():
    r = subprocess.run([sys.executable, str(ROOT / "bench" / "etl_failures.py"), "--cases", "11"],
                       capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert r.returncode == 2 and "no case [11]" in r.stderr, r.stderr
