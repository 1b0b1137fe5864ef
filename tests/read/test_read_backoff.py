"""Back-off on the S3 read path: moto fronted by a proxy on 127.0.0.1 that answers 503 SlowDown to
every Nth request (tests/support/httpserve.py). Reads succeed through the faults, every fault is
retried once and counted; a store that always answers 503 fails within the retry budget with
StoreBusyError (exit 75) naming the store."""

from __future__ import annotations

import json

import pytest
import warpdata
from support.datasets import make_rows, publish, write_media
from support.httpserve import FaultProxy

pytestmark = pytest.mark.s3


@pytest.fixture
def published(s3, tmp_path, monkeypatch):
    write_media(tmp_path / "media", 8)
    parts = [make_rows(400, 0, image_every=8), make_rows(300, 400, image_every=8)]
    m = publish(s3.url(), "ws/demo", {"main": parts}, tmp_path, row_group_size=100, media=tmp_path / "media")
    monkeypatch.setenv("WARP_STORE", s3.url())
    return m


def _through(proxy, monkeypatch):
    for var in ("WARP_S3_ENDPOINT", "AWS_ENDPOINT_URL"):
        monkeypatch.setenv(var, proxy.url)


def test_reads_survive_throttling_and_count_every_retry(s3, published, monkeypatch):
    with FaultProxy(s3.endpoint, fail_every=4) as proxy:
        _through(proxy, monkeypatch)
        ds = warpdata.dataset("ws/demo", mode="remote")
        t = ds.table("main")
        ids = [i for b in t.batches(64, columns=["id", "label"]) for i in b.column(0).to_pylist()]
        assert ids == list(range(700))
        refs = next(iter(t.batch_dicts(16, read_refs=True)))["image"]
        assert [r.read_bytes()[:4] for r in refs] == [b"\x89PNG"] * 16
        st = ds.stats.to_dict()
        assert proxy.faults >= 3  # the faults really happened...
        assert st["retries"] == proxy.faults  # ...and each was retried once, counted
        # pyarrow names the 503 SlowDown (throttled) unless the error body overflowed a tiny read
        assert 0 < st["throttled"] <= st["retries"]
        assert st["requests"] == proxy.requests  # every request warp sent is in its count
        assert st["backoff_seconds"] > 0


def test_cli_reports_requests_and_retries(cli, s3, published, monkeypatch):
    with FaultProxy(s3.endpoint, fail_every=5) as proxy:
        _through(proxy, monkeypatch)
        r = cli("stream", "ws/demo", "--columns", "id", "--mode", "remote", "-v")
        assert r.code == 0, r.err
        assert len(r.out.splitlines()) == 700
        line = next(x for x in r.err.splitlines() if x.startswith("requests:"))
        assert f"{proxy.requests} request(s)" in line and f"{proxy.faults} retried" in line


def test_always_503_fails_within_the_budget_naming_the_store(cli, s3, published, monkeypatch):
    monkeypatch.setenv("WARP_RETRY_BUDGET", "1.5")
    with FaultProxy(s3.endpoint, fail_every=1) as proxy:
        _through(proxy, monkeypatch)
        r = cli("stream", "ws/demo", "--mode", "remote", "--json")
        assert r.code == 75, r.err
        assert r.out.count("\n") >= 1 and json.loads(r.out)["error"] == "store-busy"
        assert s3.url() in r.err and "SlowDown" in r.err or "503" in r.err
        assert "retry budget of 1.5s" in r.err and "hint:" in r.err
        assert 1 < proxy.requests < 60  # retried, and stopped: bounded by the budget


def test_zero_budget_retries_nothing(s3, published, monkeypatch):
    from warpdata.core.errors import StoreBusyError

    monkeypatch.setenv("WARP_RETRY_BUDGET", "0")
    with FaultProxy(s3.endpoint, fail_every=1) as proxy:
        _through(proxy, monkeypatch)
        with pytest.raises(StoreBusyError, match="1 attempt"):
            warpdata.dataset("ws/demo", mode="remote")
        assert proxy.requests == 1


def test_bad_budget_is_a_config_error(cli, s3, published, monkeypatch):
    monkeypatch.setenv("WARP_RETRY_BUDGET", "soon")
    r = cli("stream", "ws/demo", "--limit", "1")
    assert r.code == 78 and "WARP_RETRY_BUDGET" in r.err


def test_warm_cat_and_stream_report_traffic(cli, s3, published, monkeypatch):
    with FaultProxy(s3.endpoint, fail_every=0) as proxy:
        _through(proxy, monkeypatch)
        r = cli("warm", "ws/demo", "--json")
        assert r.code == 0, r.err
        doc = r.json()
        assert doc["requests"]["requests"] == proxy.requests and doc["requests"]["bytes"] >= doc["fetched_bytes"] > 0
        proxy.reset()
        r = cli("cat", "ws/demo", "--artifact", "media", "--ref", "snd/2.wav", "--mode", "remote", "--json")
        assert r.code == 0, r.err
        traffic = json.loads(r.err.strip().splitlines()[-1])["requests"]
        assert traffic["requests"] == proxy.requests and traffic["by_kind"]["GET"] >= 1
        proxy.reset()
        r = cli("stream", "ws/demo", "--columns", "id", "--limit", "5", "--mode", "remote", "--json")
        assert r.code == 0 and len(r.out.splitlines()) == 5
        assert json.loads(r.err.strip().splitlines()[-1])["requests"]["requests"] == proxy.requests
        r = cli("warm", "ws/demo", "-v")
        assert r.code == 0 and "requests: " in r.err and "received" in r.err


def test_a_stream_closed_early_sends_nothing_after_close(s3, published, monkeypatch):
    """Closing a stream after its first batch waits for the reads it had in flight (and cancels the
    rest): the counts taken right after close are final, and the store sees nothing more."""
    with FaultProxy(s3.endpoint, fail_every=2) as proxy:
        _through(proxy, monkeypatch)
        ds = warpdata.dataset("ws/demo", mode="remote")
        t = ds.table("main")
        for _ in range(3):
            it = iter(t.batches(8, columns=["id", "label"]))
            assert next(it).num_rows == 8
            it.close()
            st = ds.stats.to_dict()
            sent = proxy.requests
            assert st["requests"] == sent and st["retries"] == proxy.faults
        import time

        time.sleep(1.0)  # anything still running would reach the proxy now
        assert proxy.requests == sent
