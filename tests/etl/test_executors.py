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


def _profiling(dask_worker) -> bool:
    return "profile" in dask_worker.periodic_callbacks


@pytest.mark.slow
def test_own_dask_cluster_runs_without_the_dashboards_housekeeping():
    """An own LocalCluster's workers do not profile their threads every 10 ms nor check their event
    loop every 20 ms (BENCHMARKS.md, "ETL scaling: where Dask's time goes"); a setting the user
    chose is kept."""
    import dask

    with open_runner(parse_executor("dask"), 2) as r:
        got = r.client.run(_worker_settings)
        profiling = r.client.run(_profiling)
        sched_tick = r.client.run_on_scheduler(_tick_s)
    assert len(got) == 2
    assert all(v == {"distributed.worker.profile.enabled": False, "distributed.admin.tick.interval": "1s",
                     "distributed.admin.system-monitor.interval": "5s"} for v in got.values())
    assert not any(profiling.values())
    assert sched_tick == 1.0  # the scheduler, in this process: read when it started
    with dask.config.set({"distributed.admin.tick.interval": "50ms"}), open_runner(parse_executor("dask"), 1) as r:
        (kept,) = r.client.run(_worker_settings).values()
    assert kept["distributed.admin.tick.interval"] == "50ms"
    assert kept["distributed.worker.profile.enabled"] is False
