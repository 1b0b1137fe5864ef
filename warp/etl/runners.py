"""The runner protocol (:class:`Runner`), the local thread and process pools
(:class:`LocalRunner`), and the pieces the cluster runners share with them: a pool worker's
start-up and the batching of tasks into one Dask task (:mod:`warpdata.etl.executors` picks a
runner by its spec).
"""

from __future__ import annotations

import abc
import functools
import os
import pickle
import traceback
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from typing import Any

from warpdata.etl.lifeline import follow

# a killed worker's task is rerun up to this many times before the run fails
TASK_RETRIES = 3


class Runner(abc.ABC):
    """Runs ``fn(task)`` for each task and yields the results as they finish."""

    kind = "thread"

    def __init__(self, workers: int, resources: dict[str, float] | None = None) -> None:
        self.workers = workers
        # abstract resources every task asks of the cluster (Dask worker resources, Ray resources),
        # e.g. {"GPU": 1}; local pools run on this machine and ignore them
        self.resources = dict(resources or {})

    def describe(self) -> dict[str, Any]:
        return {"executor": self.kind, "workers": self.workers}

    @abc.abstractmethod
    def imap_unordered(self, fn: Callable[[Any], Any], tasks: Iterable[Any], *, window: int | None = None) -> Iterator[Any]:
        """Results of ``fn(task)`` as they finish, at most ``window`` tasks in flight."""

    def close(self) -> None:  # noqa: B027 (most runners own nothing to release)
        """Release the workers this runner started (nothing by default)."""


class LocalRunner(Runner):
    """Today's executor: a thread (or process) pool with at most ``window`` tasks in flight."""

    def __init__(self, workers: int, kind: str = "thread", initializer: Callable[[], None] | None = None,
                 resources: dict[str, float] | None = None) -> None:
        super().__init__(workers, resources)
        self.kind = kind
        if kind == "process":
            import multiprocessing
            from concurrent.futures import ProcessPoolExecutor

            # a fork server outlives this runner and keeps the environment it started with: each
            # worker takes this process's environment of now (credentials, WARP_* settings)
            self.pool = ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("forkserver"),
                                            initializer=functools.partial(_init_pool_worker, os.getpid(),
                                                                          dict(os.environ), initializer))
        else:
            self.pool = ThreadPoolExecutor(workers, thread_name_prefix="warp-etl")

    def imap_unordered(self, fn, tasks, *, window=None):
        window = window or 2 * self.workers
        it = iter(tasks)
        pending: set[Future] = set()
        try:
            for task in it:
                pending.add(self.pool.submit(fn, task))
                if len(pending) >= window:
                    break
            while pending:
                done, pending = wait(pending, return_when=FIRST_COMPLETED)
                # the finished ones first: a failure found in the same wait must not cost the
                # receipts of the tasks that finished beside it (docs/formats/receipts.md)
                for fut in sorted(done, key=lambda f: f.exception() is not None):
                    res = fut.result()
                    nxt = next(it, None)
                    if nxt is not None:
                        pending.add(self.pool.submit(fn, nxt))
                    yield res
        except BaseException:
            self.pool.shutdown(wait=True, cancel_futures=True)
            raise

    def close(self) -> None:
        self.pool.shutdown(wait=True)


def _init_pool_worker(driver_pid: int, env: dict[str, str], initializer: Callable[[], None] | None) -> None:
    """A process-pool worker: it ends with the driver, even after a ``kill -9`` of the driver
    (warp/etl/lifeline.py), then takes the driver's environment of now."""
    follow(driver_pid)
    _init_worker(env, initializer)


def _init_worker(env: dict[str, str], initializer: Callable[[], None] | None) -> None:
    """A pool worker forked from a fork server: the driver's environment of now, then ``initializer``."""
    os.environ.clear()
    os.environ.update(env)
    if initializer is not None:
        initializer()


# at most this many tasks go in one Dask task, and a run keeps about GUIDED_SHARES Dask tasks per
# worker slot for what is left: batches shrink towards the end of a run, down to one task, so no
# worker waits on a large last batch (guided self-scheduling). 16 shard tasks of 64 photos are
# 1-2 s of a worker's time: half the Dask tasks of 8 (the scheduler's loop and the driver's
# submits, 0.5-0.6 s of the build on 30,000 photos) with progress still every second or two
# (BENCHMARKS.md, "Session 9: Dask's last overheads")
MAX_BATCH = 16
GUIDED_SHARES = 4


def batch_size(left: int, slots: int) -> int:
    """How many of ``left`` remaining tasks the next Dask task runs (1 when ``left`` is unknown)."""
    return max(1, min(MAX_BATCH, left // (GUIDED_SHARES * max(1, slots))))


def pack_batch(tasks: list[Any]) -> bytes | list[Any]:
    """``tasks`` as one pickle for a Dask task, or the list itself when it does not pickle.

    A Dask scheduler unpickles every graph it is sent to learn its dependencies, on its event
    loop, which then holds the GIL (an own LocalCluster's loop shares it with the workers) or
    delays every other message; bytes go through untouched, and the worker unpickles them
    (:func:`run_packed_batch`), beside the other workers (BENCHMARKS.md, "ETL scaling: where Dask's time goes")."""
    import cloudpickle  # what Dask pickles with (a dependency of distributed): the same objects pickle

    try:
        return cloudpickle.dumps(tasks, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception:  # Dask's own pickling then names the object that does not pickle
        return tasks


def run_packed_batch(fn: Callable[[Any], Any], tasks: bytes | list[Any]) -> list[tuple[bool, Any]]:
    """:func:`run_batch` over the tasks :func:`pack_batch` packed."""
    return run_batch(fn, pickle.loads(tasks) if isinstance(tasks, bytes) else tasks)


def run_batch(fn: Callable[[Any], Any], tasks: list[Any]) -> list[tuple[bool, Any]]:
    """Run ``fn`` over ``tasks`` on a worker: ``(True, result)`` for each, in order, up to the first
    that raises, which ends the list as ``(False, exception)``; the driver yields the results (each
    is receipted) before it raises the exception, as if the tasks had been sent one by one."""
    out: list[tuple[bool, Any]] = []
    for task in tasks:
        try:
            out.append((True, fn(task)))
        except Exception as e:
            # its traceback does not travel with it: the worker's side goes along as a note
            e.add_note("on the Dask worker:\n" + "".join(traceback.format_exception(e)).rstrip())
            out.append((False, e))
            break
    return out
