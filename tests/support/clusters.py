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
