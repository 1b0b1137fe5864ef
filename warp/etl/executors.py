"""Executors by name: where an ETL's shard tasks run.

=============================== ===================================================
spec (``--executor``,           runs the tasks on
``[build] executor``,
``WARP_EXECUTOR``)
=============================== ===================================================
``local`` (default), ``thread`` a thread pool in this process (decoders release the GIL)
``process``                     a process pool on this machine
``dask``                        a Dask ``LocalCluster`` started for the run: one
                                worker per worker, as threads of this process
                                (in-process transport, no dashboard); a process
                                per worker when the tasks ask for resources
``dask://HOST:PORT``,           an existing Dask scheduler (``tcp://``: the address
``tcp://HOST:PORT``             ``dask scheduler`` prints); a port outside 1-65535 is
                                refused as the spec's mistake, never tried
``dask:SCHEDULER_FILE``         an existing Dask scheduler, by its scheduler file
``ray``                         Ray Core tasks on a local Ray started for the run
``ray://HOST:PORT``, ``ray:auto`` an existing Ray cluster
=============================== ===================================================

A spec that is none of these is a UsageError (exit 2) given as ``--executor``, and a ConfigError
(exit 78) from ``[build] executor`` or ``WARP_EXECUTOR``.

A task is a picklable value and the function a module-level function, so the
same task gives the same bytes wherever it runs. Results come back in
completion order (:meth:`Runner.imap_unordered`); callers key them by task
index, so scheduling never reaches the output. A worker that dies mid-task
(``kill -9``) has its task rerun by the engine (Dask: the scheduler
reschedules it; Ray: ``max_retries``). Dask and Ray are optional extras
(``warp-toolchain[dask]``, ``warp-toolchain[ray]``): a missing one is a
:class:`~warpdata.core.errors.DependencyError` with the ``pip install`` line.

``resources`` (e.g. ``{"GPU": 1}``: the feature cache's tasks when its encoder
runs on CUDA) is what every task asks of a cluster: Dask worker resources
(``client.submit(..., resources=...)``; a LocalCluster started here gives each
worker those resources), Ray ``num_gpus`` / custom resources. A cluster on which
no worker offers them is a :class:`~warpdata.core.errors.ConfigError` before any
task is sent (the tasks would wait forever); local pools ignore them.
"""


from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor

from warpdata.core.errors import missing_dependency
from warpdata.etl.daskrunner import (
    CLUSTER_WAIT_S,
    CONNECT_TIMEOUT_S,
    OWN_CLUSTER_LAYOUTS,
    RESOLVE_TIMEOUT_S,
    RESOURCES_LAYOUT,
    DaskRunner,
    cluster_wait,
    own_cluster_config,
)
from warpdata.etl.executorspec import (
    HELP,
    KINDS,
    ExecutorSpec,
    check_spec,
    parse_executor,
    resolve_executor,
)
from warpdata.etl.rayrunner import PROBE_TIMEOUT_S, RayRunner, ray_client_missing
from warpdata.etl.runners import (
    GUIDED_SHARES,
    MAX_BATCH,
    TASK_RETRIES,
    LocalRunner,
    Runner,
    batch_size,
    run_batch,
)

# The executors' face: the spec (warp/etl/executorspec.py), the runners (warp/etl/runners.py,
# warp/etl/daskrunner.py, warp/etl/rayrunner.py) and the factory below. An own LocalCluster's
# settings that a test or bench/ script rebinds (OWN_CLUSTER_LAYOUT, OWN_CLUSTER_CONFIG) are
# read where they live, in warp/etl/daskrunner.py: rebind them there, not here.
__all__ = [
    "CLUSTER_WAIT_S", "CONNECT_TIMEOUT_S", "GUIDED_SHARES", "HELP", "KINDS", "MAX_BATCH", "OWN_CLUSTER_LAYOUTS",
    "PROBE_TIMEOUT_S", "RESOLVE_TIMEOUT_S", "RESOURCES_LAYOUT", "TASK_RETRIES", "DaskRunner", "ExecutorSpec",
    "LocalRunner", "RayRunner", "Runner", "batch_size", "check_spec", "close_started", "cluster_wait",
    "make_runner", "open_runner", "own_cluster_config", "parse_executor", "require", "resolve_executor",
    "run_batch", "start_runner",
]


def require(spec: ExecutorSpec) -> None:
    """Fail now (DependencyError, exit 78) when ``spec`` needs an extra that is not installed.

    Only looked up, not imported: importing ``distributed`` costs the main thread 1.1-1.3 s of CPU
    before the header pass; the runner started in the background (:func:`start_runner`) imports it
    while the driver scans (an import that fails there is the same DependencyError)."""
    import importlib.util

    for mod, pkg, extra in {"dask": [("dask", "dask", "dask"), ("distributed", "distributed", "dask")],
                            "ray": [("ray", "ray", "ray")]}.get(spec.kind, []):
        try:
            found = importlib.util.find_spec(mod) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            raise missing_dependency(spec.named, pkg, extra)
    client_missing = ray_client_missing(spec) if spec.kind == "ray" else None  # ray://: Ray Client's gRPC
    if client_missing is not None:
        raise client_missing


def make_runner(spec: ExecutorSpec, workers: int, initializer: Callable[[], None] | None = None,
                resources: dict[str, float] | None = None, preload: tuple[str, ...] = (),
                access: Sequence[tuple[str, str]] = ()) -> Runner:
    """A runner; ``resources`` (e.g. ``{"GPU": 1}``) is what every task asks of a Dask/Ray cluster;
    ``preload``: modules an own Dask LocalCluster's workers import once, before they fork;
    ``access``: the run's ``(role, url)`` sources and outputs every worker of an existing Dask
    cluster, and every node of a Ray cluster, must reach (warp/etl/access.py), checked before any
    task."""
    if spec.kind == "dask":
        return DaskRunner(spec, workers, initializer, resources, preload, access)
    if spec.kind == "ray":
        return RayRunner(spec, workers, initializer, resources, access)
    return LocalRunner(workers, spec.kind, initializer if spec.kind == "process" else None, resources)


@contextlib.contextmanager
def open_runner(spec: ExecutorSpec, workers: int, *, initializer: Callable[[], None] | None = None,
                started: Future | None = None, resources: dict[str, float] | None = None,
                preload: tuple[str, ...] = (), access: Sequence[tuple[str, str]] = ()) -> Iterator[Runner]:
    """A :class:`Runner` for ``spec`` with ``workers`` workers (own clusters only), closed on exit.

    ``started`` (from :func:`start_runner`) hands over a runner started
    earlier; its owner closes it (:func:`close_started`).
    """
    if started is not None:
        yield started.result()
        return
    runner = make_runner(spec, workers, initializer, resources, preload, access)
    try:
        yield runner
    finally:
        runner.close()


def start_runner(spec: ExecutorSpec, workers: int, *, initializer: Callable[[], None] | None = None,
                 resources: dict[str, float] | None = None, preload: tuple[str, ...] = (),
                 access: Sequence[tuple[str, str]] = ()) -> Future:
    """Start a runner in the background: a Dask LocalCluster or Ray takes seconds to come up,
    which then overlaps the driver's scan of the inputs instead of adding to it.

    Dask's modules are imported here, on the calling thread, first: imported beside the scan's
    header threads, ``import distributed`` (0.2 s alone) held the GIL they wait for between their
    reads and cost the header pass 0.4-0.5 s (BENCHMARKS.md, "Session 10: worker processes again")."""
    if spec.kind == "dask":
        with contextlib.suppress(ImportError):  # make_runner names what is missing
            import distributed  # noqa: F401
    ex = ThreadPoolExecutor(1, thread_name_prefix="warp-etl-cluster")
    try:
        return ex.submit(make_runner, spec, workers, initializer, resources, preload, access)
    finally:
        ex.shutdown(wait=False)


def close_started(started: Future) -> None:
    """Close a runner from :func:`start_runner` (waiting for its start if need be)."""
    try:
        runner = started.result()
    except BaseException:  # its failure was reported where it was used, or nobody used it
        return
    runner.close()
