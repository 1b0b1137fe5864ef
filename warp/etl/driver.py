"""The steps every ``warp etl`` pipeline's driver takes around its tasks, written once.

A pipeline plugs in its plan (a list of tasks, each with an ``index``), its task function and a
:class:`Plug`: how a task's receipt is named and checked, how a task's objects are deleted, how a
finished task is receipted. This module does the rest the same way for all of them
(docs/formats/receipts.md):

1. :func:`split_receipted`: list the journal once (damaged or foreign receipts are dropped there),
   keep each task whose receipt verifies, and for every other one delete the receipt *and the
   task's objects* (rule 2: an upload is create-only, so an object left in the store would be
   kept in place of the rebuilt bytes), then schedule it;
2. :func:`run_receipted`: run the scheduled tasks on a runner, receipting each as it finishes in
   the background (every receipt is written before the function returns, hence before any
   manifest);
3. :func:`drive`: both, with the progress bar and the runner (local threads, processes, Dask,
   Ray) around them; what it did is counted in :class:`DriveReport` (the ``receipts`` entry of
   every pipeline's ``metrics.json``; docs/design.md §11 counts the same requests).

The warehouse and the feature cache run on :func:`drive`; tiles, whose local executor streams
ranges in one pass instead of running tasks, uses :func:`split_receipted` and the journal's
background writer directly.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from warpdata.core import progress as _progress
from warpdata.core.errors import ConfigError, InfrastructureError
from warpdata.etl.executors import open_runner
from warpdata.etl.receipts import Journal, ReceiptWriter

log = logging.getLogger(__name__)

T = TypeVar("T")
R = TypeVar("R")


@dataclass
class Plug(Generic[T, R]):
    """What a pipeline plugs into the driver."""

    receipt_id: Callable[[T], str]  # the task's receipt name in the journal
    # the receipted result when ``receipt`` names this task and its objects still verify, else None
    # (raising OSError, ValueError, TypeError or KeyError counts as None, except a store's
    # InfrastructureError or ConfigError, which ends the run)
    reuse: Callable[[T, dict[str, Any]], R | None]
    drop: Callable[[T], None]  # delete the task's objects (locally and in the store); idempotent
    # the index of the task a result finished; a reused result must name its own task's (a receipt's
    # result is data read back from the store, not trusted to say which task it finished)
    index: Callable[[R], int]
    # hand a finished task's receipt to the writer (needed by run_receipted and drive only)
    record: Callable[[ReceiptWriter, T, R], None] | None = None
    units: Callable[[R], int] = lambda r: 1  # progress units of a finished (or reused) task


@dataclass
class DriveReport:
    """What the driver did around the tasks, for ``metrics.json`` (the same keys in every pipeline)."""

    tasks: int = 0
    reused: int = 0
    built: int = 0
    dropped: int = 0  # receipts (damaged, foreign or not verifying) deleted with their task's objects
    receipts_listed: int = 0  # listings of the journal: one per run
    receipts_read: int = 0
    receipts_written: int = 0
    cluster: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {"tasks": self.tasks, "reused": self.reused, "built": self.built, "dropped": self.dropped,
                "listed": self.receipts_listed, "read": self.receipts_read, "written": self.receipts_written}


_REJECTED = (OSError, ValueError, TypeError, KeyError)
# ...but an unreachable, throttling or refusing store (InfrastructureError is an OSError, ConfigError a
# ValueError) says nothing about the receipt: deleting it and the task's objects would turn a resume
# during an outage into a rebuild; the error ends the run and the rerun resumes (docs/formats/receipts.md)
_UNAVAILABLE = (InfrastructureError, ConfigError)


def split_receipted(tasks: Sequence[T], journal: Journal, plug: Plug[T, R],
                    report: DriveReport | None = None) -> tuple[dict[int, R], list[T]]:
    """``({task index: reused result}, tasks to run)``: one listing of the journal, then
    ``plug.reuse`` for each task with a receipt. A receipt that does not verify is deleted with
    the task's objects, as are the objects of a task whose receipt was damaged or foreign."""
    receipts = journal.load_all()
    done: dict[int, R] = {}
    todo: list[T] = []
    dropped = 0
    for task in tasks:
        rid = plug.receipt_id(task)
        rec = receipts.get(rid)
        r = None
        if rec is not None:
            try:
                r = plug.reuse(task, rec)
                if r is not None and plug.index(r) != task.index:  # type: ignore[attr-defined]
                    r = None  # the receipt's result names another task: its index would pick others' objects
            except _UNAVAILABLE:
                raise  # the store did not answer or refused: nothing was learnt about the receipt
            except _REJECTED:
                r = None
            if r is None:
                journal.forget(rid)
        if r is not None:
            done[task.index] = r  # type: ignore[attr-defined]
            continue
        if rec is not None or rid in journal.damaged:
            plug.drop(task)
            dropped += 1
        todo.append(task)
    if report is not None:
        report.tasks, report.reused, report.dropped = len(tasks), len(done), dropped
    return done, todo


def run_receipted(runner: Any, fn: Callable[[T], R], todo: Sequence[T], journal: Journal,
                  plug: Plug[T, R]) -> Iterator[tuple[T, R]]:
    """Run ``fn`` over ``todo`` on ``runner``; yield ``(task, result)`` as each finishes, after
    handing its receipt to the journal's background writer. Once the iteration ends, every
    receipt is in place."""
    by_index = {t.index: t for t in todo}  # type: ignore[attr-defined]
    with journal.writer() as receipts_out:
        for res in runner.imap_unordered(fn, todo):
            task = by_index[plug.index(res)]
            plug.record(receipts_out, task, res)  # type: ignore[misc]
            yield task, res


def drive(tasks: Sequence[T], fn: Callable[[T], R], journal: Journal, plug: Plug[T, R], *, executor: Any,
          workers: int, label: str, unit: str, total: int,
          on_result: Callable[[T, R], None] | None = None,
          **runner_options: Any) -> tuple[list[R], DriveReport]:
    """Reuse every receipted task, run the rest of ``tasks`` on ``executor`` (an
    :class:`~warpdata.etl.executors.ExecutorSpec`) with ``workers`` workers, receipt each as it
    finishes; the results in task order, and what was done. ``runner_options`` go to
    :func:`~warpdata.etl.executors.open_runner` (initializer, started, resources, preload, access);
    ``on_result(task, result)`` runs on the driver as each built task finishes."""
    report = DriveReport(cluster={"executor": executor.text, "workers": workers})
    listed0, read0, written0 = journal.listings, journal.reads, journal.writes
    results, todo = split_receipted(tasks, journal, plug, report)
    with _progress.progress(label, total=total, unit=unit) as bar:
        bar.advance(sum(plug.units(r) for r in results.values()))
        if todo:
            n = workers if executor.distributed else min(workers, len(todo))
            with open_runner(executor, n, **runner_options) as runner:
                report.cluster = runner.describe()
                if executor.distributed:
                    log.info("etl cluster: " + ", ".join(f"{k} {v}" for k, v in report.cluster.items()))
                for task, r in run_receipted(runner, fn, todo, journal, plug):
                    if on_result is not None:
                        on_result(task, r)
                    results[plug.index(r)] = r
                    bar.advance(plug.units(r))
    report.built = len(todo)
    report.receipts_listed = journal.listings - listed0
    report.receipts_read = journal.reads - read0
    report.receipts_written = journal.writes - written0
    return [results[i] for i in sorted(results)], report
