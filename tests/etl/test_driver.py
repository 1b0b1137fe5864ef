"""``warp/etl/driver.py``'s ``drive()`` on a small pipeline of its own (one file per task, its
receipt naming the file's bytes), on real local threads and a real journal (a directory, or the moto
S3 server): counts that add up, an empty plan, a failing task, Ctrl-C while receipts are still
being written in the background, and a receipt whose result names another task."""

from __future__ import annotations

import hashlib
import json
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from warpdata.core.errors import DataError
from warpdata.etl.driver import Plug, drive
from warpdata.etl.executors import ExecutorSpec
from warpdata.etl.receipts import Journal

LOCAL = ExecutorSpec("thread", None, "local")


@dataclass
class Task:
    index: int
    path: str
    fail: bool = False


def _build(task: Task) -> dict[str, Any]:
    if task.fail:
        raise DataError(f"{task.path}: task {task.index} meets bad data", hint="fix it", path=task.path)
    data = f"bytes of task {task.index}\n".encode()
    Path(task.path).write_bytes(data)
    return {"index": task.index, "sha256": hashlib.sha256(data).hexdigest(), "size": len(data)}


def _task_sha(task: Task) -> str:
    return hashlib.sha256(f"task {task.index}".encode()).hexdigest()


def _reuse(task: Task, rec: dict[str, Any]) -> dict[str, Any] | None:
    if rec["task_sha256"] != _task_sha(task):
        return None
    if hashlib.sha256(Path(task.path).read_bytes()).hexdigest() != rec["sha256"]:
        return None
    return dict(rec["result"])


def _plug(dropped: list[int]) -> Plug:
    def drop(task: Task) -> None:
        dropped.append(task.index)
        Path(task.path).unlink(missing_ok=True)

    def record(out: Any, task: Task, r: dict[str, Any]) -> None:
        out.add(f"t-{task.index:05d}", _task_sha(task), r["sha256"], r["size"], r)

    return Plug(receipt_id=lambda t: f"t-{t.index:05d}", reuse=_reuse, drop=drop, index=lambda r: r["index"],
                record=record)


def _tasks(d: Path, n: int, fail: int | None = None) -> list[Task]:
    d.mkdir(exist_ok=True)
    return [Task(i, str(d / f"t-{i}.bin"), i == fail) for i in range(n)]


def _drive(tasks: list[Task], journal: Journal, dropped: list[int] | None = None, **kw: Any):
    return drive(tasks, _build, journal, _plug([] if dropped is None else dropped), executor=LOCAL, workers=1,
                 label="t", unit="task", total=len(tasks), **kw)


def test_the_counts_add_up_on_a_build_and_on_its_rerun(tmp_path):
    tasks = _tasks(tmp_path / "out", 7)
    results, rep = _drive(tasks, Journal(str(tmp_path / "b")))
    assert [r["index"] for r in results] == list(range(7))
    assert rep.as_dict() == {"tasks": 7, "reused": 0, "built": 7, "dropped": 0, "listed": 1, "read": 0,
                             "written": 7}
    again, rep = _drive(tasks, Journal(str(tmp_path / "b")))
    assert again == results
    assert rep.as_dict() == {"tasks": 7, "reused": 7, "built": 0, "dropped": 0, "listed": 1, "read": 7,
                             "written": 0}


def test_an_empty_plan_lists_the_journal_and_starts_no_runner(tmp_path):
    # an executor that cannot start: drive must not try to open it for no task
    nowhere = ExecutorSpec("dask", "tcp://127.0.0.1:9", "dask://127.0.0.1:9")
    results, rep = drive([], _build, Journal(str(tmp_path / "b")), _plug([]), executor=nowhere, workers=2,
                         label="t", unit="task", total=0)
    assert results == []
    assert rep.as_dict() == {"tasks": 0, "reused": 0, "built": 0, "dropped": 0, "listed": 1, "read": 0,
                             "written": 0}


def test_a_failing_task_keeps_the_receipts_of_the_tasks_finished_before_it(tmp_path):
    tasks = _tasks(tmp_path / "out", 6, fail=4)
    journal = Journal(str(tmp_path / "b"))
    with pytest.raises(DataError, match="task 4 meets bad data"):
        _drive(tasks, journal)
    receipted = sorted(journal.load_all())
    assert receipted == [f"t-{i:05d}" for i in range(4)]  # one worker: tasks 0-3 finished first
    tasks[4].fail = False
    results, rep = _drive(tasks, Journal(str(tmp_path / "b")))
    assert (rep.reused, rep.built, rep.dropped) == (4, 2, 0)
    assert [r["index"] for r in results] == list(range(6))


@pytest.mark.s3
def test_ctrl_c_while_receipts_are_written_in_the_background_leaves_a_consistent_journal(s3, tmp_path):
    tasks = _tasks(tmp_path / "out", 40)
    base = s3.url("drv/.warp-tmp-build-0123456789ab")
    seen: list[int] = []

    def interrupt(task: Task, r: dict[str, Any]) -> None:
        seen.append(task.index)
        if len(seen) == 25:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        _drive(tasks, Journal(base), on_result=interrupt)
    # the background writer is gone, and every receipt that landed is whole and names a finished task
    assert not [t for t in threading.enumerate() if t.name.startswith("warp-receipts")]
    landed = Journal(base).load_all()
    assert landed and set(landed) <= {f"t-{i:05d}" for i in seen}
    for sid, rec in landed.items():
        assert rec["result"]["index"] == int(sid[2:])
    dropped: list[int] = []
    results, rep = _drive(tasks, Journal(base), dropped)
    assert (rep.reused, rep.built, rep.dropped, dropped) == (len(landed), 40 - len(landed), 0, [])
    assert [r["index"] for r in results] == list(range(40))


def test_a_receipted_result_naming_another_task_is_dropped_and_rebuilt(tmp_path):
    """A receipt is data read back from the build directory: its result must finish its own task,
    or the pipeline would take another task's objects (or an index out of the plan) for this one."""
    tasks = _tasks(tmp_path / "out", 3)
    _drive(tasks, Journal(str(tmp_path / "b")))
    rpath = tmp_path / "b" / "receipts" / "t-00001.json"
    rec = json.loads(rpath.read_bytes())
    rec["result"]["index"] = 2  # the task's hash and its file still verify; the result says task 2
    rpath.write_text(json.dumps(rec))
    dropped: list[int] = []
    results, rep = _drive(tasks, Journal(str(tmp_path / "b")), dropped)
    assert [r["index"] for r in results] == [0, 1, 2]
    assert (rep.reused, rep.built, rep.dropped, dropped) == (2, 1, 1, [1])


def test_a_store_that_does_not_answer_while_receipts_are_checked_ends_the_run_keeping_them(tmp_path):
    """An unreachable or refusing store (InfrastructureError is an OSError, ConfigError a ValueError)
    says nothing about a receipt: the run ends with the store's error, and neither the receipt nor the
    task's objects are deleted, so the rerun resumes instead of rebuilding."""
    from warpdata.core.errors import InfrastructureError, StorePermissionError

    tasks = _tasks(tmp_path / "out", 3)
    _drive(tasks, Journal(str(tmp_path / "b")))
    for error in (InfrastructureError("s3://b/x: the store did not answer", hint="rerun"),
                  StorePermissionError("s3://b/x: access denied", hint="check the credentials")):
        def unreachable(task: Task, rec: dict[str, Any], error=error) -> dict[str, Any] | None:
            if task.index == 1:
                raise error
            return _reuse(task, rec)

        dropped: list[int] = []
        plug = _plug(dropped)
        plug.reuse = unreachable
        with pytest.raises(type(error)):
            drive(tasks, _build, Journal(str(tmp_path / "b")), plug, executor=LOCAL, workers=1, label="t",
                  unit="task", total=3)
        assert dropped == [] and Path(tasks[1].path).exists()
        assert sorted(Journal(str(tmp_path / "b")).load_all()) == ["t-00000", "t-00001", "t-00002"]
