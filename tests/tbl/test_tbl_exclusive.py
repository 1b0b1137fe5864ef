"""Two `warp tar-to-tbl` runs into one OUT: exactly one exits 0, the other 2, and OUT is the winner's file.

Each run reads its tar from a FIFO. Opening a FIFO for writing (non-blocking) succeeds only
once the reader has it open, and tar-to-tbl opens its input after its "OUT already exists"
check: so when both FIFOs are open, both runs are past that check and only the final
no-replace move (docs: warp/core/atomic.py ``rename_noreplace``) can stop the second one.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

from warpdata import TblReader
from warpdata.sampledata.__main__ import main as sample


def _open_writer(fifo: str, proc: subprocess.Popen, deadline: float) -> int:
    while True:
        try:
            return os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
        except OSError:
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "tar-to-tbl never opened its input"
            time.sleep(0.02)


def test_two_runs_into_one_output_have_one_winner(tmp_path):
    assert sample(["wds", str(tmp_path / "shard.tar"), "--count", "6"]) == 0
    tar = (tmp_path / "shard.tar").read_bytes()
    out = tmp_path / "train.tbl"
    procs, writers = [], []
    deadline = time.monotonic() + 120
    for k in range(2):
        fifo = str(tmp_path / f"in{k}.tar")
        os.mkfifo(fifo)
        procs.append(subprocess.Popen([sys.executable, "-m", "warpdata", "tar-to-tbl", fifo, str(out), "-j", "1"],
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    try:
        for k, p in enumerate(procs):
            writers.append(_open_writer(str(tmp_path / f"in{k}.tar"), p, deadline))
        for w in writers:  # both runs are past the early check now
            os.set_blocking(w, True)
            os.write(w, tar)
            os.close(w)
        writers.clear()
        results = [p.communicate(timeout=120) for p in procs]
    finally:
        for w in writers:
            os.close(w)
        for p in procs:
            if p.poll() is None:
                p.kill()
    codes = sorted(p.returncode for p in procs)
    assert codes == [0, 2], results
    loser = results[[p.returncode for p in procs].index(2)][1]
    assert f"{out} already exists" in loser and "--force" in loser and "Traceback" not in loser
    with TblReader(str(out), verify=True) as r:
        assert len(r) == 6 and r.verify_all() == []
    assert sorted(os.listdir(tmp_path)) == ["in0.tar", "in1.tar", "shard.tar", "train.tbl"]  # no temp left


def test_force_still_replaces(tmp_path, cli):
    assert sample(["wds", str(tmp_path / "shard.tar"), "--count", "3"]) == 0
    out = tmp_path / "o.tbl"
    out.write_bytes(b"old")
    r = cli("tar-to-tbl", tmp_path / "shard.tar", out)
    assert r.code == 2 and f"{out} already exists" in r.err and out.read_bytes() == b"old"
    r = cli("tar-to-tbl", tmp_path / "shard.tar", out, "--force", "-q")
    assert r.code == 0, r.err
    with TblReader(str(out)) as t:
        assert len(t) == 3
