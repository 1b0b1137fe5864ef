"""bench/fleet.py at 4 nodes: the counts of an epoch read by separate processes, each with its own
cache and counted port in front of moto's S3 server (docs/partitioning.md). Counts only: bytes,
requests, 503s, failed nodes, exact-once; never times."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
pytestmark = pytest.mark.s3

ROWS = 60_000


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    sys.path.insert(0, str(BENCH))
    sys.modules.pop("fleet", None)
    import fleet as mod

    work = tmp_path_factory.mktemp("fleet")
    ctx = mod.setup(work, ["s3"], "paged", rows=ROWS, files=2)
    upstream, url, env = ctx["stores"]["s3"]
    want = mod.column_bytes(url, env, None)
    try:
        yield mod, work, upstream, url, env, want
    finally:
        for s in ctx["servers"]:
            s.stop()
        sys.path.remove(str(BENCH))


def test_four_nodes_read_each_row_once_for_the_bytes_of_the_table(fleet):
    mod, work, upstream, url, env, want = fleet
    r = mod.run_fleet(4, upstream, url, env, work, epochs=2, rows=ROWS)
    assert r["failed"] == 0 and r["exact_once"], r
    first, second = r["epoch_bytes"]
    assert first <= 1.05 * want, (first, want)  # each rank its 15,000 rows, not the row groups they touch
    assert second <= 0.05 * want, (second, want)  # its own cache carries the next epoch
    # the pointer and the manifest, then the shard's footer and offset index, before data
    assert r["metadata_requests_before_first_batch"] == 2
    assert r["throttled"] == 0 and r["retries"] == 0


def test_a_throttled_store_slows_the_fleet_and_fails_no_node(fleet):
    mod, work, upstream, url, env, want = fleet
    r = mod.run_fleet(4, upstream, url, env, work, rate=2, rows=ROWS)
    assert r["throttled"] > 0, r  # the store did refuse
    assert r["failed"] == 0 and r["exact_once"], r
