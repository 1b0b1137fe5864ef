"""``warp etl`` in a child process of its own session, and the kill -9 the resume tests give it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path


def spawn_etl(cfg: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen:
    """``warp etl --config CFG --json ARGS`` in a new session (its process group: pool workers too)."""
    return subprocess.Popen([sys.executable, "-m", "warpdata", "etl", "--config", str(cfg), "--json", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True, env=env)


def kill_when(proc: subprocess.Popen, ready: Callable[[], bool], delay: float = 0.0, timeout: float = 120.0,
              poll: float = 0.005) -> None:
    """SIGKILL ``proc``'s process group once ``ready()`` holds (plus ``delay`` seconds), unless it
    finished first; then reap it."""
    try:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and proc.poll() is None and not ready():
            time.sleep(poll)
        if delay:
            time.sleep(delay)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate(timeout=60)
