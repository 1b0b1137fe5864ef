"""Run ``warp`` with two bench-only instruments, for ``bench/etl_scale.py --breakdown``.

* every Python thread takes its name as its OS thread name (``prctl(PR_SET_NAME)``), so the bench
  can split the driver process's CPU time by thread (main, Dask's ``IO loop`` with the scheduler
  of a LocalCluster, receipt writers, fsync) from ``/proc/PID/task/TID``;
* ``WARP_BENCH_DASK_LAYOUT`` picks the layout of an own Dask LocalCluster
  (``OWN_CLUSTER_LAYOUTS`` in warp/etl/daskrunner.py) for the run;
* ``WARP_BENCH_SERIAL_HEADER=1`` reads every header before the plan (no overlap with the build:
  warp/warehouse/overlap.py), as ``[build] overlap = false`` does;
* ``WARP_BENCH_HEADER_THREADS=1`` runs the warehouse's header pass on
  ``warp.etl.workers.header_threads(-j)`` threads instead of ``-j``;
* every runner's tasks and results are pickled once more to count the bytes a process pool or a
  cluster moves between the driver and the workers, and the tasks are counted and timed.

The counts go to the JSON file named by ``WARP_BENCH_STATS`` when the process exits.

    python bench/_etl_probe.py etl --config ... (the arguments of ``warp``)
"""

from __future__ import annotations

import atexit
import ctypes
import json
import os
import pickle
import sys
import threading
import time

PR_SET_NAME = 15
_libc = ctypes.CDLL(None)
_inner = threading.Thread._bootstrap_inner


# native thread id -> the thread's whole Python name (the OS keeps 15 bytes of it), for the bench
NAMES: dict[int, str] = {}


def _named_bootstrap(self):
    _libc.prctl(PR_SET_NAME, self.name.encode()[:15], 0, 0, 0)
    NAMES[threading.get_native_id()] = self.name
    _inner(self)


threading.Thread._bootstrap_inner = _named_bootstrap
_libc.prctl(PR_SET_NAME, b"main", 0, 0, 0)

STATS: dict[str, dict] = {}


def _size(x) -> int:
    try:
        return len(pickle.dumps(x, protocol=5))
    except Exception:
        import cloudpickle

        return len(cloudpickle.dumps(x, protocol=5))


def _counting(orig):
    def imap_unordered(self, fn, tasks, *, window=None):
        name = getattr(fn, "__name__", str(fn))
        st = STATS.setdefault(name, {"executor": self.kind, "tasks": 0, "task_bytes": 0, "result_bytes": 0,
                                     "seconds": 0.0})
        t0 = time.perf_counter()
        if isinstance(tasks, (list, tuple)):
            # counted up front and handed on as a list: the Dask runner batches only tasks whose count
            # it knows (a generator here made every batch one task: the first breakdowns measured that)
            tasks = list(tasks)
            st["tasks"] += len(tasks)
            st["task_bytes"] += sum(_size(t) for t in tasks)
        else:
            # a stream that knows its expected length (the warehouse's overlapped header pass cuts
            # tasks while it reads: warp/warehouse/overlap.py): counted as the runner takes them,
            # never drained up front (that would run the whole pass before the first task)
            tasks = _Counted(tasks, st)

        try:
            for r in orig(self, fn, tasks, window=window):
                st["result_bytes"] += _size(r)
                yield r
        finally:
            st["seconds"] += time.perf_counter() - t0

    return imap_unordered


class _Counted:
    def __init__(self, tasks, st) -> None:
        self.tasks, self.st = tasks, st

    def __len__(self) -> int:
        return len(self.tasks)

    def __iter__(self):
        for t in self.tasks:
            self.st["tasks"] += 1
            self.st["task_bytes"] += _size(t)
            yield t


def _dump() -> None:
    path = os.environ.get("WARP_BENCH_STATS")
    if path:
        with open(path, "w") as f:
            json.dump({**STATS, "_threads": {str(k): v for k, v in NAMES.items()}}, f)


def main() -> int:
    from warpdata.etl import daskrunner, executors

    layout = os.environ.get("WARP_BENCH_DASK_LAYOUT")
    if layout:  # the own LocalCluster's layout under test (warp/etl/daskrunner.py, OWN_CLUSTER_LAYOUTS)
        if layout not in daskrunner.OWN_CLUSTER_LAYOUTS:
            raise SystemExit(f"WARP_BENCH_DASK_LAYOUT={layout!r}: one of {sorted(daskrunner.OWN_CLUSTER_LAYOUTS)}")
        daskrunner.OWN_CLUSTER_LAYOUT = layout
    if os.environ.get("WARP_BENCH_HEADER_THREADS"):
        # the header pass on header_threads(-j) threads (warp/etl/workers.py) instead of -j: what the
        # one-line change in warp/warehouse/etl.py's scan() would do, measured before it is made
        from warpdata.etl.workers import header_threads
        from warpdata.warehouse import etl as wetl

        orig = wetl.probe_all

        def probe_all(records, *, workers, **kw):
            return orig(records, workers=header_threads(workers), **kw)

        wetl.probe_all = probe_all
    if os.environ.get("WARP_BENCH_SERIAL_HEADER"):
        # the header pass before the plan, as before warp/warehouse/overlap.py ([build] overlap = false)
        from warpdata.warehouse import overlap

        overlap.wanted = lambda *a, **k: False
    for cls in (executors.LocalRunner, executors.DaskRunner, executors.RayRunner):
        cls.imap_unordered = _counting(cls.imap_unordered)
    atexit.register(_dump)
    from warpdata.cli.app import main as warp_main

    sys.argv = ["warp", *sys.argv[1:]]
    return warp_main()


if __name__ == "__main__":
    raise SystemExit(main())
