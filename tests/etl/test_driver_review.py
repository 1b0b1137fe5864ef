"""The last review items of the ETL driver (issue 23): an executor error names the setting it came
from, an unknown scheduler host fails at its lookup, the worker count has an upper bound, and a
receipt delete that the store refuses is warp's typed error, never the client library's.

Real components only: the CLI in-process, real name lookups, a real S3 client against a port where
nothing listens.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest
from support.warehouses import coco_config
from warpdata.core.errors import ConfigError, InfrastructureError, WarpError
from warpdata.etl.daskrunner import _resolve_host
from warpdata.etl.executors import parse_executor, resolve_executor
from warpdata.etl.receipts import Journal
from warpdata.etl.workers import MAX_WORKERS, resolve_workers
from warpdata.sampledata.detection import generate

# a name the resolver must say does not exist (RFC 6761 reserves .invalid)
NO_SUCH_HOST = "no-such-host.invalid"


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    d = tmp_path_factory.mktemp("review") / "coco"
    generate(d, count=8, seed=3, min_side=48, max_side=96)
    return d


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# -- the setting an executor came from -----------------------------------------------------------

def test_a_spec_names_where_it_came_from(monkeypatch):
    monkeypatch.delenv("WARP_EXECUTOR", raising=False)
    assert parse_executor("dask://h:1").named == "--executor dask://h:1"
    spec = resolve_executor(None, "dask://h:1", config_file="etl.toml")
    assert spec.named == "etl.toml: [build] executor = 'dask://h:1'"
    assert spec == parse_executor("dask://h:1")  # where it came from is not what it is
    monkeypatch.setenv("WARP_EXECUTOR", "dask://h:2")
    assert resolve_executor(None, None).named == "WARP_EXECUTOR=dask://h:2"
    assert resolve_executor("dask://h:3", "dask://h:1").named == "--executor dask://h:3"


def test_an_unreachable_scheduler_from_the_config_file_names_the_config_key(cli, dataset, tmp_path):
    pytest.importorskip("distributed", reason="the dask extra (dask, distributed) is not installed")
    port = _free_port()
    cfg = coco_config(dataset, tmp_path / "wh", name="cfgexec.toml", build=f'executor = "dask://127.0.0.1:{port}"')
    r = cli("etl", "--config", cfg)
    assert r.code == 75, r.err
    assert f"cfgexec.toml: [build] executor = 'dask://127.0.0.1:{port}'" in r.err, r.err
    assert "--executor" not in r.err, r.err
    # a refused port is said at once, not after distributed's 10 s of connect retries
    assert f"nothing listens at tcp://127.0.0.1:{port} (connection refused)" in r.err, r.err


# -- an unknown host -----------------------------------------------------------------------------

def test_an_unknown_scheduler_host_fails_at_its_lookup(cli, dataset, tmp_path):
    pytest.importorskip("distributed", reason="the dask extra (dask, distributed) is not installed")
    r = cli("etl", "--config", coco_config(dataset, tmp_path / "wh"), "--executor", f"dask://{NO_SUCH_HOST}:8786")
    assert r.code == 78, r.err
    assert f"the host '{NO_SUCH_HOST}' of tcp://{NO_SUCH_HOST}:8786 does not resolve" in r.err, r.err
    assert "Traceback" not in r.err and not (tmp_path / "wh").exists()


def test_host_lookup_passes_a_listening_host_and_refuses_an_unknown_or_closed_one():
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        _resolve_host(f"tcp://127.0.0.1:{port}", "--executor x")
        _resolve_host(f"tcp://localhost:{port}", "--executor x")
    with pytest.raises(ConfigError, match="does not resolve"):
        _resolve_host(f"tcp://{NO_SUCH_HOST}:8786", "--executor x")
    with pytest.raises(InfrastructureError, match="connection refused"):
        _resolve_host(f"tcp://127.0.0.1:{_free_port()}", "--executor x")


# -- the worker count's upper bound --------------------------------------------------------------

def test_workers_have_an_upper_bound_named_by_setting(cli, dataset, tmp_path, monkeypatch):
    monkeypatch.delenv("WARP_WORKERS", raising=False)
    too_many = str(MAX_WORKERS + 1)
    r = cli("etl", "--config", coco_config(dataset, tmp_path / "a"), "-j", too_many)
    assert r.code == 78 and f"--workers/-j: {too_many} workers is more than the {MAX_WORKERS}" in r.err, r.err
    cfg = coco_config(dataset, tmp_path / "b", name="many.toml", build=f"workers = {too_many}")
    r = cli("etl", "--config", cfg)
    assert r.code == 78 and "build.workers" in r.err and f"at most {MAX_WORKERS}" in r.err, r.err
    monkeypatch.setenv("WARP_WORKERS", too_many)
    r = cli("etl", "--config", coco_config(dataset, tmp_path / "c"))
    assert r.code == 78 and f"WARP_WORKERS='{too_many}' is out of range" in r.err, r.err
    assert f"from 1 to {MAX_WORKERS:,}" in r.err, r.err
    assert not any((tmp_path / d).exists() for d in "abc")
    monkeypatch.setenv("WARP_WORKERS", str(MAX_WORKERS))
    assert resolve_workers() == MAX_WORKERS  # the bound itself is allowed


# -- receipt deletes on a store that does not answer ---------------------------------------------

def test_receipt_deletes_on_an_unreachable_store_are_typed_errors(monkeypatch):
    """Before: botocore's EndpointConnectionError reached the CLI (exit 70, "please report this")."""
    pytest.importorskip("s3fs")
    env = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1",
           "WARP_S3_ENDPOINT": f"http://127.0.0.1:{_free_port()}", "WARP_S3_PATH_STYLE": "1",
           "AWS_EC2_METADATA_DISABLED": "true", "AWS_CONFIG_FILE": os.devnull,
           "AWS_SHARED_CREDENTIALS_FILE": os.devnull}
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    for k in ("AWS_PROFILE", "WARP_S3_PROFILE", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3"):
        monkeypatch.delenv(k, raising=False)
    journal = Journal("s3://warp-bucket/wh/.warp-tmp-build-0123456789ab")
    for act, what in ((lambda: journal.forget("shard-00001"), "delete the receipt s3://warp-bucket/"),
                      (journal.remove, "delete the receipts under s3://warp-bucket/")):
        with pytest.raises(WarpError) as e:
            act()
        assert what in e.value.message and e.value.exit_code in (75, 78), e.value.message


def test_a_bug_under_a_receipt_call_stays_a_bug_not_a_store_failure(monkeypatch):
    """Only the client's errors (OSError, botocore's) become warp's store errors: a TypeError in
    the call is warp's bug and must reach the CLI as one (exit 70), not as "try again" (75)."""
    pytest.importorskip("s3fs")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    journal = Journal("s3://warp-bucket/wh/.warp-tmp-build-0123456789ab")

    def broken(*a, **k):
        raise TypeError("a bug")

    for name in ("rm_file", "rm", "cat_file", "ls", "pipe_file"):
        monkeypatch.setattr(journal.fs, name, broken)
    for act in (lambda: journal.forget("shard-00001"), journal.remove, lambda: journal.load("shard-00001"),
                journal.load_all):
        with pytest.raises(TypeError, match="a bug"):
            act()


def test_a_local_receipt_that_cannot_be_deleted_is_a_typed_error(tmp_path):
    if os.geteuid() == 0:
        pytest.skip("root deletes from a read-only directory")
    journal = Journal(str(tmp_path / "b"))
    journal.record("shard-00001", "t" * 64, "s" * 64, 1, {})
    receipts = Path(journal.loc.path)
    receipts.chmod(0o500)
    try:
        with pytest.raises(WarpError) as e:
            journal.forget("shard-00001")
        assert "shard-00001.json" in str(e.value)
    finally:
        receipts.chmod(0o700)


def test_a_header_pass_gets_a_few_threads_per_worker_within_a_cap():
    from warpdata.etl.workers import HEADER_THREADS_CAP, header_threads

    assert header_threads(1) == 4 and header_threads(2) == 8
    assert header_threads(16) == HEADER_THREADS_CAP and header_threads(100) == 100  # never fewer than the workers
