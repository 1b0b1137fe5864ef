"""Servers a test starts die with the test process that started them.

A crashed (``kill -9``-ed) pytest-xdist worker used to leave its moto S3 server running, and the
``dask scheduler``/``dask worker`` processes a test had started in a session of their own (issue
36). Each is now started through :func:`tethered`, which runs its command line via this module as
a script: it asks the kernel to SIGKILL the process when its parent ends
(``prctl(PR_SET_PDEATHSIG)``, Linux), then ``exec``s the real command, which keeps that setting.
However the test process ends (a crash, ``kill -9``, an OOM kill), the kernel ends the server.
Set between fork and exec this way rather than by a ``preexec_fn``, which is unsafe in a process
with threads.

The kernel watches the *thread* that started the child: start servers from the test's main
thread (every fixture does), not from a short-lived helper thread. Dask's own worker processes,
started by a ``dask worker`` nanny, already end with their nanny. Elsewhere than Linux the
command runs untethered.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

__all__ = ["tethered"]

PR_SET_PDEATHSIG = 1  # linux/prctl.h


def tethered(argv: list[str]) -> list[str]:
    """``argv`` (an executable and its arguments) as a command line that ends with this process."""
    if not sys.platform.startswith("linux"):
        return list(argv)
    return [sys.executable, os.path.abspath(__file__), str(os.getpid()), *argv]


def _tie(parent: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"prctl(PR_SET_PDEATHSIG): {os.strerror(err)}")
    if os.getppid() != parent:  # the test process ended before the tie was made: nothing to serve
        os._exit(0)


if __name__ == "__main__":
    _tie(int(sys.argv[1]))
    os.execv(sys.argv[2], sys.argv[2:])
