"""A real Dask cluster for tests: one per module (a cluster takes seconds to start).

:func:`dask_cluster` starts a scheduler and two single-threaded worker
processes (nannies) on 127.0.0.1 without dashboards. One of the two offers the
abstract resource ``GPU = 1`` (Dask worker resources: nothing checks that a
GPU is there), so a test can ask tasks for ``{"GPU": 1}`` and see them placed
on that worker only, on a machine without a GPU.

``warp etl --executor dask://HOST:PORT`` reaches it as an existing cluster;
``cluster.address`` is that ``HOST:PORT`` and ``cluster.gpu_workers`` the
addresses of the workers offering ``GPU``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from support.tether import tethered


@dataclass
class DaskCluster:
    address: str  # HOST:PORT of the scheduler
    workers: list[str]  # tcp:// addresses of every worker
    gpu_workers: list[str]  # those offering GPU = 1
    cluster: Any


@contextlib.contextmanager
def dask_cluster() -> Iterator[DaskCluster]:
    pytest.importorskip("distributed", reason="the dask extra (dask, distributed) is not installed")
    from distributed import Client, Nanny, Scheduler, SpecCluster

    opts = {"nthreads": 1, "host": "127.0.0.1", "dashboard": False, "silence_logs": 40}
    workers = {"plain": {"cls": Nanny, "options": dict(opts)},
               "gpu": {"cls": Nanny, "options": {**opts, "resources": {"GPU": 1}}}}
    scheduler = {"cls": Scheduler, "options": {"host": "127.0.0.1", "dashboard": False, "dashboard_address": None}}
    cluster = SpecCluster(workers=workers, scheduler=scheduler, silence_logs=40, name="warp-test")
    try:
        with Client(cluster, set_as_default=False) as c:
            c.wait_for_workers(2, timeout=120)
            info = c.scheduler_info(n_workers=-1)["workers"]
        addr = cluster.scheduler_address
        yield DaskCluster(addr.split("://", 1)[1], sorted(info),
                          sorted(a for a, w in info.items() if w.get("resources", {}).get("GPU")), cluster)
    finally:
        cluster.close()


# -- a cluster of separate processes, as a user starts one ------------------

@dataclass
class DaskProcesses:
    """``dask scheduler`` and ``dask worker`` processes started here, each worker a simulated node."""

    address: str  # HOST:PORT of the scheduler
    scheduler: Any  # subprocess.Popen
    workers: list[Any]  # subprocess.Popen, one per simulated node
    tmp: Any  # pathlib.Path of their files

    def add_worker(self, env: dict[str, str] | None = None, name: str | None = None) -> Any:
        """Start one more ``dask worker`` (a node of its own: own cache directory, own ``env``)."""
        import os
        import subprocess
        import sys

        i = len(self.workers)
        node = self.tmp / f"node-{i}"
        node.mkdir(parents=True, exist_ok=True)
        base = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "WARP_"))}
        env = {**base, "WARP_CACHE_DIR": str(node / "cache"), **(env or {})}
        with open(node / "worker.log", "wb") as logf:  # the child keeps its own copy of the descriptor
            proc = subprocess.Popen(tethered([sys.executable, "-m", "distributed.cli.dask_worker", f"tcp://{self.address}",
                                              "--nthreads", "1", "--nworkers", "1", "--no-dashboard", "--host",
                                              "127.0.0.1", "--local-directory", str(node / "dask"),
                                              "--name", name or f"node-{i}"]),
                                    stdout=subprocess.DEVNULL, stderr=logf, env=env, start_new_session=True)
        self.workers.append(proc)
        return proc

    def wait_for_workers(self, n: int, timeout: float = 120) -> None:
        from distributed import Client

        with Client(f"tcp://{self.address}", set_as_default=False, timeout="30s") as c:
            c.wait_for_workers(n, timeout=timeout)

    def stop(self, proc: Any) -> None:
        import os
        import signal
        import subprocess

        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=30)


@contextlib.contextmanager
def dask_processes(tmp: Any, workers: int = 0, env: dict[str, str] | None = None) -> Iterator[DaskProcesses]:
    """A ``dask scheduler`` on 127.0.0.1 and ``workers`` ``dask worker`` processes, each with a cache
    directory of its own and the environment of a fresh machine: no ``AWS_*`` / ``WARP_*`` variables
    unless ``env`` gives them. Everything is killed on exit, and dies with this process if it is
    killed first (:mod:`support.tether`)."""
    import json
    import subprocess
    import sys
    import time

    pytest.importorskip("distributed", reason="the dask extra (dask, distributed) is not installed")
    tmp.mkdir(parents=True, exist_ok=True)
    sfile = tmp / "scheduler.json"
    with open(tmp / "scheduler.log", "wb") as logf:
        sched = subprocess.Popen(tethered([sys.executable, "-m", "distributed.cli.dask_scheduler", "--host",
                                           "127.0.0.1", "--port", "0", "--no-dashboard", "--scheduler-file", str(sfile)]),
                                 stdout=subprocess.DEVNULL, stderr=logf, start_new_session=True)
    cl = None
    try:
        deadline = time.monotonic() + 120
        while not sfile.exists() or not sfile.read_text().strip():
            if sched.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("dask scheduler did not start: " + (tmp / "scheduler.log").read_text())
            time.sleep(0.1)
        time.sleep(0.1)  # the file is written whole, but give the writer a moment to close it
        addr = json.loads(sfile.read_text())["address"].split("://", 1)[1]
        cl = DaskProcesses(addr, sched, [], tmp)
        for _ in range(workers):
            cl.add_worker(env)
        if workers:
            cl.wait_for_workers(workers)
        yield cl
    finally:
        for p in [*(cl.workers if cl else []), sched]:
            (cl or DaskProcesses("", sched, [], tmp)).stop(p)
