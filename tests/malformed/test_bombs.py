"""Decompression bombs and absurd shapes, one container each (issue 36, item 1; formats/bounded.py).

Each case of ``bombs/`` (built by ``bombs/make_bombs.py``: a valid zstd frame of 4 GiB of zeros
where the container expects 64 bytes or 1 MiB, every CRC recomputed; a Zarr shape of 2^32-1;
a valid .tbl whose sample honestly decodes to 768 MiB, which --verify must check in bounded
memory) is read through the library and through the CLI. Reads run in a child process whose address
space is capped (RLIMIT_AS, 1 GiB), and its peak RSS (VmHWM) is checked: before formats/bounded.py
each of them reached 4.1 GiB (the shape case: MemoryError, exit 70). ``expected.json`` says the
error type, exit code and message of each run. The CLI runs are then repeated in-process with the
``cli`` fixture for exit code and stderr.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent / "bombs"
EXPECTED = json.loads((HERE / "expected.json").read_text())
AS_LIMIT = 1 << 30  # address space of each capped child: a quarter of what one bomb would take
PEAK_LIMIT_KIB = 300 << 10  # peak RSS allowed (the runs take 30-60 MiB; a bomb took 4,100+ MiB)


def _make_bombs():
    spec = importlib.util.spec_from_file_location("make_bombs", HERE / "make_bombs.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


make_bombs = _make_bombs()

_READ = """
import resource, sys
resource.setrlimit(resource.RLIMIT_AS, (int(sys.argv[1]), int(sys.argv[1])))
from warpdata.core.errors import WarpError
path = sys.argv[2]
try:
    if path.endswith(".tbl"):
        from warpdata.formats.tbl import TblReader
        r = TblReader(path)
        for i in range(len(r)):
            r[i]
    else:
        from warpdata.storage.zarr_store import read_array
        read_array(path)
    print("read without an error")
except WarpError as e:
    print(type(e).__name__, e.exit_code, e.message)
print("PEAK_RSS_KIB=" + [ln for ln in open("/proc/self/status") if ln.startswith("VmHWM:")][0].split()[1])
"""

# the CLI under the cap; its own peak RSS on the last line of stderr (tests/test_hostile.py's launcher)
_CLI = """
import resource, sys
resource.setrlimit(resource.RLIMIT_AS, (int(sys.argv[1]), int(sys.argv[1])))
from warpdata.cli.app import main
try:
    rc = main(sys.argv[2:])
finally:
    hwm = [ln for ln in open("/proc/self/status") if ln.startswith("VmHWM:")][0].split()[1]
    sys.stderr.write("\\nPEAK_RSS_KIB=%s\\n" % hwm)
sys.exit(rc)
"""


def _peak(text: str) -> int:
    tail = text.rpartition("PEAK_RSS_KIB=")[2].split()
    assert tail and tail[0].isdigit(), text[-2000:]
    return int(tail[0])


def _build(name: str, tmp_path: Path) -> tuple[Path, dict[str, str]]:
    path = make_bombs.build(name, tmp_path)
    fill = {"path": str(path), "tmp": str(tmp_path), "off": ""}
    if name.endswith(".tbl"):
        from warpdata.formats.tbl import TblReader

        with TblReader(path, verify=False) as r:  # the index only: no payload is decoded
            fill["off"] = str(r.info(1).offset)
    return path, fill


@pytest.mark.parametrize("name", sorted(n for n in EXPECTED if "read" in EXPECTED[n]))
def test_library_read_is_typed_in_bounded_memory(name, tmp_path):
    path, fill = _build(name, tmp_path)
    want = EXPECTED[name]["read"]
    p = subprocess.run([sys.executable, "-c", _READ, str(AS_LIMIT), str(path)], capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 0 and "MemoryError" not in p.stderr, p.stderr[-2000:]
    first = p.stdout.splitlines()[0]
    assert first.startswith(f"{want['error']} {want['exit']} {path}"), first
    assert want["message"].format(**fill) in first, first
    assert _peak(p.stdout) < PEAK_LIMIT_KIB, f"peak RSS {_peak(p.stdout) >> 10} MiB"


@pytest.mark.parametrize(("name", "run"), [(n, i) for n in sorted(EXPECTED) for i in range(len(EXPECTED[n]["cli"]))])
def test_cli_is_typed_in_bounded_memory(cli, name, run, tmp_path):
    path, fill = _build(name, tmp_path)
    want = EXPECTED[name]["cli"][run]
    args = [a.format(**fill) for a in want["args"]]
    message = want["message"].format(**fill)
    # first under the cap: a bomb that got through would take 4 GiB of the test process
    p = subprocess.run([sys.executable, "-c", _CLI, str(AS_LIMIT), *args], capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == want["exit"], (p.returncode, p.stderr[-2000:])
    assert _peak(p.stderr) < PEAK_LIMIT_KIB, f"peak RSS {_peak(p.stderr) >> 10} MiB"
    r = cli(*args)
    assert r.code == want["exit"], r.err
    assert "internal error" not in r.err and "Traceback" not in r.err, r.err
    if want["exit"] == 0:  # a valid file, however large its samples say they are: checked in bounded memory
        assert message in r.out, r.out
        return
    assert message in r.err, r.err
    if want["exit"] == 1:  # --verify found it: listed as a problem of the report
        assert "verification found 1 problem(s)" in r.err, r.err
    else:
        assert "\nhint: " in r.err, r.err
