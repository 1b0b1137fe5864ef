"""The SQL gate parses on one locked, single-threaded DuckDB connection per process (warp/core/sqlgate.py):
a filter is checked and planned without a new connection each time, and a forked child (a DataLoader
worker) makes its own instead of using its parent's."""

from __future__ import annotations

import os

import duckdb
import pytest
from warpdata.core import sqlgate


def test_filters_are_parsed_on_one_connection_per_process():
    first = sqlgate.serialize_sql("SELECT * FROM warp_table WHERE (x > 1)")
    assert '"error":false' in first.replace(" ", "")
    pid, con = sqlgate._PARSER
    assert sqlgate.check_filter("x > 1 AND y < 2", ["x", "y"]) == {"x", "y"}
    assert [pid, con] == sqlgate._PARSER  # the check parsed on the same connection
    with pytest.raises(duckdb.Error):  # locked like every other: no file access from it
        con.execute("SELECT * FROM read_csv('/etc/hostname')")


def test_a_forked_child_parses_on_its_own_connection():
    sqlgate.serialize_sql("SELECT 1")
    parent = sqlgate._PARSER[1]
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: parse, and say whether it used a connection of its own
        ok = b"0"
        try:
            sqlgate.check_filter("x = 1", ["x"])
            ok = b"1" if sqlgate._PARSER[0] == os.getpid() and sqlgate._PARSER[1] is not parent else b"2"
        finally:
            os.write(w, ok)
            os._exit(0)
    os.close(w)
    os.waitpid(pid, 0)
    assert os.read(r, 1) == b"1"
    assert sqlgate._PARSER[1] is parent
