"""The servers test fixtures start die with the test process that started them (issue 36).

A test process (a stand-in for a pytest-xdist worker) starts the servers, then is killed with
SIGKILL: no ``finally`` runs, as in a crash. Before: its moto server, and the ``dask scheduler``
and ``dask worker`` processes of :func:`support.clusters.dask_processes` (each in a session of
its own), kept running; now the kernel ends them (``support.tether``).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

TESTS = str(Path(__file__).resolve().parent)
pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")


def _alive(pid: int) -> bool:
    """Running (a zombie left for a parent that does not reap it counts as ended)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


def _wait_gone(pids: list[int], limit_s: float = 60) -> list[int]:
    """The pids still running after up to ``limit_s`` (a bound on the wait, not a timing assertion)."""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline and any(_alive(p) for p in pids):
        time.sleep(0.1)
    return [p for p in pids if _alive(p)]


def _crash_after(setup: str) -> list[int]:
    """Run ``setup`` (which prints the pids to watch on one line) in a process that then kills itself."""
    code = (f"import os, signal, sys\nsys.path.insert(0, {TESTS!r})\n{setup}\n"
            "sys.stdout.flush()\nos.kill(os.getpid(), signal.SIGKILL)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == -signal.SIGKILL, r.stderr[-2000:]
    return [int(p) for p in r.stdout.split()]


def _cleanup(pids: list[int]) -> None:
    for p in pids:
        if _alive(p):
            os.kill(p, signal.SIGKILL)


def test_a_crashed_test_process_takes_its_moto_server_with_it():
    pid, port = _crash_after("from support.s3fixtures import start_moto_server\n"
                             "s = start_moto_server()\nprint(s.proc.pid, s.port)")
    try:
        assert _wait_gone([pid]) == [], "the moto server outlived the test process that started it"
        with pytest.raises(ConnectionRefusedError), socket.create_connection(("127.0.0.1", port), timeout=10):
            pass
    finally:
        _cleanup([pid])


def test_a_crashed_test_process_takes_its_dask_processes_with_it(tmp_path):
    pytest.importorskip("distributed")
    pids = _crash_after("from pathlib import Path\nfrom support.clusters import dask_processes\n"
                        f"cm = dask_processes(Path({str(tmp_path / 'cl')!r}), workers=1)\ncl = cm.__enter__()\n"
                        "print(cl.scheduler.pid, *(w.pid for w in cl.workers))")
    try:
        assert len(pids) == 2
        assert _wait_gone(pids) == [], "dask processes outlived the test process that started them"
    finally:
        _cleanup(pids)


def test_a_server_started_normally_still_serves_and_stops():
    sys.path.insert(0, TESTS)
    from support.s3fixtures import start_moto_server

    s = start_moto_server()
    try:
        assert s.requests() == []  # it answers
    finally:
        s.stop()
    assert s.proc.returncode is not None
