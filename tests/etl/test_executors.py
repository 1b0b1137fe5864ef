"""The kit's executors as a library: workers forked from a fork server still see the driver's
environment of the moment the runner opens (credentials and WARP_* settings set after an earlier
run), and results keep coming back keyed by task."""

from __future__ import annotations

import os

import pytest
from warpdata.etl.executors import open_runner, parse_executor


def _env_of(name: str) -> tuple[str, str | None, int]:
    return name, os.environ.get(name), os.getpid()


@pytest.mark.parametrize("spec", ["process", pytest.param("dask", marks=pytest.mark.slow)])
def test_workers_see_the_environment_of_now(spec, monkeypatch):
    from warpdata.etl import daskrunner

    # an own LocalCluster's workers are threads of this process (they see its environment as it is);
    # its process layout forks them from a fork server, which this test is about
    monkeypatch.setattr(daskrunner, "OWN_CLUSTER_LAYOUT", "processes")
    ex = parse_executor(spec)
    monkeypatch.setenv("WARP_TEST_RUN", "first")
    monkeypatch.setenv("WARP_TEST_GONE", "stale")  # in the fork server's environment from its start
    with open_runner(ex, 2) as r:  # starts the fork server (process) with this environment
        got = sorted(r.imap_unordered(_env_of, ["WARP_TEST_RUN"] * 4))
    assert {v for _, v, _ in got} == {"first"}
    monkeypatch.setenv("WARP_TEST_RUN", "second")
    monkeypatch.setenv("WARP_TEST_ADDED", "yes")
    monkeypatch.delenv("WARP_TEST_GONE", raising=False)
    with open_runner(ex, 2) as r:
        got = list(r.imap_unordered(_env_of, ["WARP_TEST_RUN", "WARP_TEST_ADDED", "WARP_TEST_GONE"] * 3))
    assert {(k, v) for k, v, _ in got} == {("WARP_TEST_RUN", "second"), ("WARP_TEST_ADDED", "yes"),
                                           ("WARP_TEST_GONE", None)}  # unset since: unset in workers too
    assert all(pid != os.getpid() for _, _, pid in got)  # it did run in other processes


def _worker_settings() -> dict:
    import dask

    return {k: dask.config.get(k) for k in ("distributed.worker.profile.enabled", "distributed.admin.tick.interval",
                                            "distributed.admin.system-monitor.interval")}


def _tick_s(dask_scheduler) -> float:
    return dask_scheduler._tick_interval


def _worker_tick_s(dask_worker) -> float:
    return dask_worker._tick_interval


def _memory_limit(dask_worker):
    return dask_worker.memory_manager.memory_limit


def _profiling(dask_worker) -> bool:
    return "profile" in dask_worker.periodic_callbacks


@pytest.mark.slow
@pytest.mark.parametrize("layout", ["threads", "processes"])
def test_own_dask_cluster_runs_without_the_dashboards_housekeeping(layout, monkeypatch):
    """An own LocalCluster's workers do not profile their threads every 10 ms nor check their event
    loop every 20 ms (BENCHMARKS.md, "ETL scaling: where Dask's time goes"); a setting the user
    chose is kept. Read from the running servers: threads of this process read the settings when
    they started, as worker processes do."""
    import dask
    from warpdata.etl import daskrunner

    monkeypatch.setattr(daskrunner, "OWN_CLUSTER_LAYOUT", layout)
    with open_runner(parse_executor("dask"), 2) as r:
        profiling = r.client.run(_profiling)
        ticks = r.client.run(_worker_tick_s)
        sched_tick = r.client.run_on_scheduler(_tick_s)
        if layout == "processes":  # a worker process keeps the settings it started with
            got = r.client.run(_worker_settings)
            assert all(v == {"distributed.worker.profile.enabled": False, "distributed.admin.tick.interval": "1s",
                             "distributed.admin.system-monitor.interval": "5s"} for v in got.values())
        limits = r.client.run(_memory_limit)
    assert len(profiling) == 2 and not any(profiling.values())
    if layout == "threads":  # a thread would hold the whole driver's memory against its share, and pause
        assert set(limits.values()) == {None}
    assert set(ticks.values()) == {1.0}
    assert sched_tick == 1.0  # the scheduler, in this process: read when it started
    with dask.config.set({"distributed.admin.tick.interval": "50ms"}), open_runner(parse_executor("dask"), 1) as r:
        (kept,) = r.client.run(_worker_tick_s).values()
        (profiled,) = r.client.run(_profiling).values()
    assert kept == 0.05
    assert profiled is False


def test_batches_shrink_to_single_tasks_at_the_end():
    """Many tasks go to Dask several at a time (each Dask task costs the driver ~9 ms of CPU), and
    the last ones one by one, so no worker waits on a large last batch."""
    from warpdata.etl.executors import MAX_BATCH, batch_size

    counts = {}
    for n, slots in ((94, 2), (282, 2), (7, 2), (1000, 16), (1, 1)):
        sizes, left = [], n
        while left:
            sizes.append(min(left, batch_size(left, slots)))
            left -= sizes[-1]
        counts[n, slots] = len(sizes)
        assert sum(sizes) == n
        assert max(sizes) <= MAX_BATCH
        assert sizes == sorted(sizes, reverse=True)
        assert sizes[-min(n, slots):] == [1] * min(n, slots)
    assert counts[94, 2] <= 32 and counts[282, 2] <= 64  # were 94 and 282 Dask tasks
    assert batch_size(0, 2) == 1  # an iterable of unknown length: one by one


def _task_and_key(i: int) -> tuple[int, str]:
    from distributed import get_worker

    return i, get_worker().get_current_task()


def _fail_at_five(i: int) -> int:
    if i == 5:
        raise ValueError("task 5 is bad")
    return i


@pytest.mark.slow
def test_dask_runs_several_tasks_per_dask_task_and_keeps_results_before_a_failure():
    with open_runner(parse_executor("dask"), 2) as r:
        got = list(r.imap_unordered(_task_and_key, list(range(94))))
        assert sorted(i for i, _ in got) == list(range(94))  # each task once, whatever the batching
        keys = {k for _, k in got}
        assert len(keys) <= 32  # 31 Dask tasks for 94 (guided batches), not 94

        seen = []
        with pytest.raises(ValueError, match="task 5 is bad") as info:
            for v in r.imap_unordered(_fail_at_five, list(range(94))):
                seen.append(v)
        # 0-4 ran in the failing task's batch, before it: their results reached the driver
        assert {0, 1, 2, 3, 4} <= set(seen)
        assert any("on the Dask worker" in n for n in info.value.__notes__)


def test_checking_for_dask_does_not_import_it():
    """The driver checks the extra is installed without importing it (1.1-1.3 s of CPU on the main
    thread before the header pass); the runner started in the background imports it."""
    import subprocess
    import sys

    code = ("import sys; from warpdata.etl.executors import parse_executor, require; "
            "require(parse_executor('dask')); print(sorted(m for m in ('dask', 'distributed') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def _square(i: int) -> int:
    return i * i


@pytest.mark.slow
def test_every_dask_run_submits_keys_no_earlier_run_used():
    """An external scheduler keeps the keys of earlier runs; a key made of the pid, id(runner) and
    a counter repeated across runs in one driver, and the scheduler answered a new batch with an
    old run's result (a KeyError on a tuple's .index in the external-cluster test)."""
    with open_runner(parse_executor("dask"), 2) as r:
        first = {k for _, k in r.imap_unordered(_task_and_key, list(range(20)))}
        second = {k for _, k in r.imap_unordered(_task_and_key, list(range(20)))}
        assert first and second and not first & second
        assert sorted(r.imap_unordered(_square, list(range(20)))) == [i * i for i in range(20)]
