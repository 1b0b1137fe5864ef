"""Pool workers end with the driver that started them, even after its ``kill -9``.

A process pool's workers are children of a fork server, itself a child of the driver. When the
driver is killed, nothing tells them: the fork server, every worker and the resource tracker stay
(tens of MB each, for good). :func:`follow` runs in each pool worker (its initializer) and

* asks the kernel to SIGKILL the worker when its parent (the fork server) dies
  (``prctl(PR_SET_PDEATHSIG)``, Linux);
* watches the driver from a daemon thread (a pidfd where the kernel has them, else a poll once a
  second); when the driver is gone it kills the fork server that forked this worker, then itself.
  With the workers and the fork server gone, the resource tracker reads end-of-file and exits.

docs/formats/receipts.md ("Clusters") states the guarantee: children are gone within seconds.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time

from warpdata.core.atomic import pid_alive

PR_SET_PDEATHSIG = 1
POLL_S = 1.0

_started: list[int] = []


def follow(driver_pid: int) -> None:
    """End this process (and the fork server above it) once ``driver_pid`` has exited; once per process."""
    if _started and _started[0] == os.getpid():
        return
    _started[:] = [os.getpid()]
    _parent_death_signal()
    threading.Thread(target=_watch, args=(driver_pid,), name="warp-lifeline", daemon=True).start()


def _parent_death_signal() -> None:
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)


def _watch(driver_pid: int) -> None:
    import select

    try:
        fd = os.pidfd_open(driver_pid)
    except (AttributeError, OSError):
        fd = None
    if fd is not None:
        select.select([fd], [], [])  # readable once the driver has exited
    else:
        while pid_alive(driver_pid):
            time.sleep(POLL_S)
    parent = os.getppid()
    if parent != driver_pid and _is_fork_server(parent):
        with contextlib.suppress(OSError):
            os.kill(parent, signal.SIGKILL)
    os.kill(os.getpid(), signal.SIGKILL)


def _is_fork_server(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return b"multiprocessing.forkserver" in f.read()
    except OSError:
        return False
