"""The steps every ``warp etl`` pipeline's driver takes around its tasks, written once.

A pipeline plugs in its plan (a list of tasks, each with an ``index``), its task function, how a
task's receipt is checked and how a finished task is receipted; this module does the rest the
same way for all of them (docs/formats/receipts.md):

1. :func:`split_receipted`: list the journal once (damaged or foreign receipts are dropped there),
   keep each task whose receipt verifies, schedule the others;
2. :func:`run_receipted`: run the scheduled tasks on a runner, receipting each as it finishes in
   the background (every receipt is written before the function returns, hence before any
   manifest).

Pipelines still on their own loop: the feature cache (``features/writer.py``) and the local,
streaming executor of tiles, which writes ranges in one pass instead of as tasks.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar

from warpdata.etl.receipts import Journal

T = TypeVar("T")
R = TypeVar("R")


def split_receipted(tasks: Sequence[T], journal: Journal, receipt_id: Callable[[T], str],
                    reuse: Callable[[T, dict[str, Any] | None], R | None]) -> tuple[dict[int, R], list[T]]:
    """``({task index: reused result}, tasks to run)``: one listing of the journal, then
    ``reuse(task, receipt)`` for each task (None when the receipt is missing or does not verify:
    ``reuse`` deletes what it rejects)."""
    receipts = journal.load_all()
    done: dict[int, R] = {}
    todo: list[T] = []
    for task in tasks:
        r = reuse(task, receipts.get(receipt_id(task)))
        if r is not None:
            done[task.index] = r  # type: ignore[attr-defined]
        else:
            todo.append(task)
    return done, todo


def run_receipted(runner: Any, fn: Callable[[T], R], todo: Sequence[T], journal: Journal,
                  record: Callable[[Any, T, R], None], index: Callable[[R], int]) -> Iterator[tuple[T, R]]:
    """Run ``fn`` over ``todo`` on ``runner``; yield ``(task, result)`` as each finishes, after
    handing its receipt (``record(writer, task, result)``) to the journal's background writer.
    Once the iteration ends, every receipt is in place."""
    by_index = {t.index: t for t in todo}  # type: ignore[attr-defined]
    with journal.writer() as receipts_out:
        for res in runner.imap_unordered(fn, todo):
            task = by_index[index(res)]
            record(receipts_out, task, res)
            yield task, res
