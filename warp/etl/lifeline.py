"""Pool workers end with the driver that started them, even after its ``kill -9``.

A process pool's workers are children of a fork server, itself a child of the driver. When the
driver is killed, nothing tells them: the fork server, every worker and the resource tracker stay
(tens of MB each, for good). :func:`follow` runs in each pool worker (its initializer) and

* asks the kernel to SIGKILL the worker when its parent (the fork server) dies
  (``prctl(PR_SET_PDEATHSIG)``, Linux);
* watches the driver from a daemon thread (a pidfd where the kernel has them, else a poll once a
  second); when the driver is gone it kills the fork server that forked this worker, then itself.
  With the workers and the fork server gone, the resource tracker reads end-of-file and exits.

A Ray started for the run (``--executor ray``) is a tree the driver does not fork itself: the GCS
server and the raylet (which Ray ties to the driver), then the agents and task workers the raylet
starts, which outlive a killed driver. :func:`guard_tree` starts a watchdog process for it: it
notes the driver's descendants once a second and, when the driver dies without saying goodbye
(the pipe from it reads end-of-file), kills every one it noted that is still the same process,
and every process whose environment carries the guard's mark (:data:`MARK`, set while the tree
starts: a worker the raylet forked after the last note inherits it).

docs/formats/receipts.md ("Clusters") states the guarantee: children are gone within seconds.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

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


# the environment variable a guarded tree's processes carry: the watchdog's token
MARK = "WARP_LIFELINE"


class TreeGuard:
    """The watchdog of :func:`guard_tree`; :meth:`release` ends it without killing anything."""

    def __init__(self, proc: subprocess.Popen, token: str) -> None:
        self.proc = proc
        self.token = token

    @contextlib.contextmanager
    def marking(self) -> Iterator[None]:
        """Processes started inside this block (and all they start) carry the mark."""
        old = os.environ.get(MARK)
        os.environ[MARK] = self.token
        try:
            yield
        finally:
            if old is None:
                os.environ.pop(MARK, None)
            else:
                os.environ[MARK] = old

    def release(self) -> None:
        if self.proc.stdin is None or self.proc.stdin.closed:
            return
        with contextlib.suppress(OSError, ValueError):
            self.proc.stdin.write(b"release\n")
            self.proc.stdin.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=5)


def guard_tree() -> TreeGuard | None:
    """Start a watchdog that kills this process's descendants (noted once a second) if this process
    dies before :meth:`TreeGuard.release`; None where there is no /proc (not Linux)."""
    if not os.path.isdir("/proc"):
        return None
    # its own session: a Ctrl-C to the driver's group leaves it to see the driver go; the pipe's
    # write end is close-on-exec, so no other child of the driver holds it open
    token = f"{os.getpid()}-{os.urandom(8).hex()}"
    proc = subprocess.Popen([sys.executable, "-m", "warpdata.etl.lifeline", str(os.getpid()), token],
                            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True, close_fds=True)
    return TreeGuard(proc, token)


def _start_time(pid: int) -> str | None:
    """The start time of ``pid`` (field 22 of /proc/PID/stat): tells a process from a recycled pid."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def descendants(root: int) -> dict[int, str]:
    """``{pid: start time}`` of every live descendant of ``root``."""
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(name))
    out: dict[int, str] = {}
    todo = list(children.get(root, []))
    while todo:
        pid = todo.pop()
        if pid in out or pid == os.getpid():
            continue
        started = _start_time(pid)
        if started is not None:
            out[pid] = started
        todo.extend(children.get(pid, []))
    return out


def marked(token: str) -> list[int]:
    """Live processes whose environment carries ``MARK=token`` (this user's: others' are unreadable)."""
    needle = f"{MARK}={token}".encode()
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as f:
                env = f.read()
        except OSError:
            continue
        if needle in env.split(b"\0"):
            out.append(int(name))
    return out


def _guard(driver_pid: int, token: str) -> None:
    """The watchdog's loop: note the driver's descendants until stdin ends; kill them unless released."""
    import select

    noted: dict[int, str] = {}
    stdin = sys.stdin.buffer
    said = b""
    while True:
        noted.update(descendants(driver_pid))
        ready, _, _ = select.select([stdin], [], [], POLL_S)
        if ready:
            chunk = os.read(stdin.fileno(), 64)
            said += chunk
            if not chunk:
                break
    if b"release" in said:
        return
    for pid, started in noted.items():
        if _start_time(pid) == started:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
    for pid in marked(token):
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)


if __name__ == "__main__":
    _guard(int(sys.argv[1]), sys.argv[2])
