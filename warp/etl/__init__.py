"""The ETL kit shared by the ``warp etl`` pipelines: plan, run, commit.

* **plan** (:func:`cut`): a deterministic list of pure shard tasks cut from
  sorted inputs by *count*, never by runtime byte roll-over, so a shard's
  bytes depend only on its task.
* **run** (:mod:`.executors`): the tasks run on an executor chosen by name:
  ``local`` threads or processes, ``dask`` (a ``LocalCluster`` or an existing
  scheduler) or ``ray``. Completion order never reaches the output.
* **commit** (:mod:`.receipts`): one create-only receipt per finished shard
  holding its content hash (docs/formats/receipts.md), then the manifest,
  then the rename that makes the version visible.

The steps around the tasks (reuse what is receipted, delete what is not, run the rest, receipt
in the background, report) are written once, in :mod:`.driver`, for every pipeline; the
``[build]`` section and the thresholds have one schema (:mod:`.buildconfig`). Worker counts are
parsed in one place (:mod:`.workers`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

T = TypeVar("T")


def cut(items: Sequence[T], per_shard: int) -> list[Sequence[T]]:
    """``items`` (already in their canonical order) in consecutive runs of ``per_shard``."""
    if per_shard < 1:
        raise ValueError("per_shard must be >= 1")
    return [items[i:i + per_shard] for i in range(0, len(items), per_shard)]
