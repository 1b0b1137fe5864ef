"""Every numeric ``WARP_*`` setting has a documented bound, and a value outside it is exit 78 naming it.

Before (issue 36): ``WARP_SQL_THREADS=100000`` opened a DuckDB connection with 32,000 threads and
hung the machine; a bad ``WARP_SQL_THREADS``/``MEMORY``/``TIMEOUT`` was reported as "filter cannot
be parsed" with a filter-syntax hint (exit 2); ``WARP_SQL_TIMEOUT=1e300`` killed the timer thread
(a traceback on stderr, then no time limit at all); ``WARP_CACHE_SIZE_GB=nan`` was exit 70,
``WARP_PREFETCH=lots`` exit 2 naming ``prefetch=``, ``WARP_CLUSTER_WAIT=inf`` waited forever.
"""

from __future__ import annotations

import threading

import pytest
from support.datasets import make_rows, publish
from warpdata.core import envvars, sqlgate
from warpdata.core.errors import ConfigError, ExitCode

# the numeric variables warp reads (a new one needs its Bound in warp/core/envvars.py, and a line here)
NUMERIC = {"WARP_CACHE_SIZE_GB", "WARP_RETRY_BUDGET", "WARP_REQUEST_DEADLINE", "WARP_WORKERS",
           "WARP_UPLOAD_CONCURRENCY", "WARP_CLUSTER_WAIT", "WARP_PREFETCH", "WARP_SQL_TIMEOUT",
           "WARP_SQL_MEMORY", "WARP_SQL_THREADS"}


def _bad_values(var: envvars.EnvVar) -> list[str]:
    b = var.bound
    assert b is not None
    if b.kind == "size":
        return ["lots", "100", "1MB", "2PB", "nan"]
    over = str(int(b.high) + 1) if b.kind == "int" else repr(b.high * 2)
    bad = ["lots", "nan", "inf", "-inf", "1e400", over, "1" + "0" * 40, "-1"]
    if b.kind == "int":
        bad.append("2.5")
    return bad


def test_every_numeric_variable_has_a_bound():
    assert {v.name for v in envvars.ENV_VARS if v.bound is not None} == NUMERIC
    for v in envvars.ENV_VARS:
        if v.bound is not None:
            assert v.bound.low <= v.bound.high and v.bound.kind in ("int", "float", "size")


def test_the_bounds_are_in_the_man_page():
    from warpdata.cli import docgen

    page = docgen.render()["man/warp.1"]
    assert "accepted: a whole number of threads from 1 to 256" in page
    assert "accepted: a size with a unit from 10MB to 1PB" in page
    for v in envvars.ENV_VARS:
        if v.bound is not None:
            assert docgen._roff(f"accepted: {v.bound.describe()}") in page, v.name


@pytest.mark.parametrize("name", sorted(NUMERIC))
def test_a_bad_value_is_exit_78_naming_the_variable_and_the_range(name, cli, monkeypatch):
    var = next(v for v in envvars.ENV_VARS if v.name == name)
    for bad in _bad_values(var):
        monkeypatch.setenv(name, bad)
        with pytest.raises(ConfigError) as e:
            envvars.number(name)
        assert e.value.exit_code == ExitCode.CONFIG
        r = cli("ls")  # any command: the CLI checks every numeric setting before it starts
        assert r.code == 78, (name, bad, r.err)
        first = r.err.splitlines()[0]
        assert first.startswith(f"error: {name}=") and var.bound.describe() in first, (bad, r.err)
        assert "hint: " in r.err and "Traceback" not in r.err and "internal error" not in r.err
    monkeypatch.delenv(name)
    assert cli("ls").code == 0


@pytest.mark.parametrize("name, good, value", [
    ("WARP_SQL_THREADS", "256", 256), ("WARP_SQL_THREADS", " 1 ", 1), ("WARP_SQL_MEMORY", "10MB", 10**7),
    ("WARP_SQL_MEMORY", "1PB", 10**15), ("WARP_SQL_TIMEOUT", "0", 0.0), ("WARP_SQL_TIMEOUT", "604800", 604800.0),
    ("WARP_PREFETCH", "off", "off"), ("WARP_PREFETCH", "Auto", "auto"), ("WARP_PREFETCH", "0", 0),
    ("WARP_WORKERS", "4096", 4096), ("WARP_CACHE_SIZE_GB", "0.5", 0.5), ("WARP_RETRY_BUDGET", "0", 0.0),
    ("WARP_REQUEST_DEADLINE", "1.5", 1.5), ("WARP_CLUSTER_WAIT", "86400", 86400.0),
])
def test_the_bounds_themselves_are_accepted(name, good, value, monkeypatch):
    monkeypatch.setenv(name, good)
    assert envvars.number(name) == value


# -- the SQL settings, where a filter or query reads them ---------------------------------------------

@pytest.fixture
def store(tmp_path, monkeypatch):
    url = str(tmp_path / "store")
    publish(url, "ws/demo", {"main": [make_rows(300, 0)]}, tmp_path, row_group_size=100)
    monkeypatch.setenv("WARP_STORE", url)
    monkeypatch.setenv("WARP_CACHE_DIR", str(tmp_path / "cache"))
    return url


@pytest.mark.parametrize("name, bad, accepted", [
    ("WARP_SQL_THREADS", "100000", "a whole number of threads from 1 to 256"),
    ("WARP_SQL_THREADS", "abc", "a whole number of threads from 1 to 256"),
    ("WARP_SQL_MEMORY", "zz", "a size with a unit from 10MB to 1PB"),
    ("WARP_SQL_TIMEOUT", "1e300", "a number of seconds from 0 to 604,800"),
    ("WARP_SQL_TIMEOUT", "soon", "a number of seconds from 0 to 604,800"),
])
def test_a_bad_sql_setting_is_not_a_filter_error(name, bad, accepted, store, cli, monkeypatch):
    import warpdata

    monkeypatch.setenv(name, bad)
    r = cli("stream", "ws/demo", "--columns", "id", "--filter", "id > 295", "--format", "csv")
    assert r.code == 78, r.err
    assert f"error: {name}={bad!r} is " in r.err and accepted in r.err, r.err
    assert "filter" not in r.err and "boolean expression" not in r.err, r.err
    # the library says the same, before any SQL is parsed or any connection opens
    t = warpdata.dataset("ws/demo").table("main")
    for call in (lambda: list(t.filter("id > 295").batches(100)), lambda: t.query("SELECT count(*) FROM main")):
        with pytest.raises(ConfigError, match=f"^{name}=") as e:
            call()
        assert e.value.exit_code == 78 and "filter" not in str(e.value)


def test_the_largest_sql_settings_run(store, cli, monkeypatch):
    monkeypatch.setenv("WARP_SQL_THREADS", str(envvars.MAX_SQL_THREADS))
    monkeypatch.setenv("WARP_SQL_TIMEOUT", str(envvars.MAX_SQL_TIMEOUT_S))
    monkeypatch.setenv("WARP_SQL_MEMORY", "1PB")
    r = cli("stream", "ws/demo", "--columns", "id", "--filter", "id > 297", "--format", "csv")
    assert r.code == 0 and r.out.split() == ['"id"', "298", "299"], r.err


def test_the_time_limit_survives_a_huge_timeout(monkeypatch):
    """A timer asked to wait 1e300 s died of OverflowError in its thread: no limit, a traceback."""
    died: list[BaseException] = []
    monkeypatch.setattr(threading, "excepthook", lambda args: died.append(args.exc_value))
    lim = sqlgate.QueryLimits(threads=1, memory_bytes=256 << 20, timeout_s=1e300)
    con = sqlgate.connect(lim)
    try:
        before = set(threading.enumerate())
        with sqlgate.guarded(con, "a query", lim):
            timers = [t for t in set(threading.enumerate()) - before if isinstance(t, threading.Timer)]
            assert len(timers) == 1
            timers[0].join(0.5)  # long enough for the old overflow to kill it; nothing is timed
            assert timers[0].is_alive() and timers[0].interval <= threading.TIMEOUT_MAX
            assert con.execute("SELECT 42").fetchone() == (42,)
    finally:
        con.close()
    assert not died, died
