"""Storage URLs and the one S3 configuration shared by s3fs, pyarrow and DuckDB.

Round trips run against real backends: the local filesystem, fsspec's
memory filesystem and moto's S3 server on 127.0.0.1 (``s3`` fixture).
"""

from __future__ import annotations

import os

import pytest
from hypothesis import given
from hypothesis import strategies as st
from warpdata.core.errors import ConfigError, DependencyError, ExitCode
from warpdata.storage.locations import Location, StorageConfig, filesystem, open_url, parse_location


@pytest.mark.parametrize(("url", "protocol", "path"), [
    ("/data/store", "file", "/data/store"),
    ("/data/store/", "file", "/data/store"),
    ("file:///data/store", "file", "/data/store"),
    ("file://localhost/data/store", "file", "/data/store"),
    ("s3://bucket/prefix/", "s3", "bucket/prefix"),
    ("S3://bucket", "s3", "bucket"),
    ("s3a://bucket/a/b", "s3", "bucket/a/b"),
    ("memory://name", "memory", "/name"),
    ("memory:///name/x/", "memory", "/name/x"),
])
def test_parse_location(url, protocol, path):
    assert parse_location(url) == Location(protocol, path)


def test_relative_and_home_paths_become_absolute(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert parse_location("store") == Location("file", str(tmp_path / "store"))
    monkeypatch.setenv("HOME", str(tmp_path))
    assert parse_location("~/s") == Location("file", str(tmp_path / "s"))
    assert parse_location(tmp_path / "p") == Location("file", str(tmp_path / "p"))


@pytest.mark.parametrize("bad", ["ftp://host/x", "s3://", "s3:///", "file://otherhost/x", "gs://b/x"])
def test_bad_urls_are_config_errors(bad):
    with pytest.raises(ConfigError) as e:
        parse_location(bad)
    assert e.value.exit_code == ExitCode.CONFIG and e.value.hint


segment = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789-_.", min_size=1, max_size=12).filter(
    lambda s: s not in (".", ".."))


@given(st.sampled_from(["s3", "memory", "file"]), st.lists(segment, min_size=1, max_size=4))
def test_url_round_trips(protocol, parts):
    if protocol == "file":
        loc = Location("file", "/" + "/".join(parts))
    elif protocol == "s3":
        loc = Location("s3", "/".join(parts))
    else:
        loc = Location("memory", "/" + "/".join(parts))
    assert parse_location(loc.url) == loc
    joined = loc.join("x/", "/y")
    assert joined.path == loc.path + "/x/y"
    assert parse_location(joined.url) == joined


def test_local_round_trip(tmp_path):
    fs, path = open_url(str(tmp_path / "store"))
    fs.pipe_file(f"{path}/a/b.bin", b"hello")  # parents are created
    assert fs.cat_file(f"{path}/a/b.bin") == b"hello"
    assert fs.cat_file(f"{path}/a/b.bin", start=1, end=3) == b"el"
    assert (tmp_path / "store" / "a" / "b.bin").read_bytes() == b"hello"


def test_memory_round_trip():
    loc = parse_location("memory://test-storage")
    fs = filesystem(loc)
    fs.pipe_file(loc.join("k").path, b"v")
    assert filesystem(loc).cat_file(loc.join("k").path) == b"v"  # one shared memory store
    fs.rm(loc.path, recursive=True)


def test_from_env_precedence(monkeypatch):
    for k in ("WARP_S3_ENDPOINT", "AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL", "WARP_S3_REGION", "AWS_REGION",
              "AWS_DEFAULT_REGION", "WARP_S3_PROFILE", "AWS_PROFILE", "WARP_S3_PATH_STYLE"):
        monkeypatch.delenv(k, raising=False)
    c = StorageConfig.from_env()
    assert (c.endpoint_url, c.region, c.profile, c.path_style) == (None, "us-east-1", None, False)
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://generic:1")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "eu-west-1")
    c = StorageConfig.from_env()
    assert (c.endpoint_url, c.region, c.path_style) == ("http://generic:1", "eu-west-1", True)
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", "http://s3only:2")
    monkeypatch.setenv("AWS_REGION", "eu-central-1")
    assert StorageConfig.from_env().endpoint_url == "http://s3only:2"
    assert StorageConfig.from_env().region == "eu-central-1"
    monkeypatch.setenv("WARP_S3_ENDPOINT", "https://s3.us-west-2.amazonaws.com")
    monkeypatch.setenv("WARP_S3_REGION", "us-west-2")
    monkeypatch.setenv("AWS_PROFILE", "p")
    c = StorageConfig.from_env()
    assert (c.endpoint_url, c.region, c.profile, c.path_style) == ("https://s3.us-west-2.amazonaws.com", "us-west-2", "p", False)
    monkeypatch.setenv("WARP_S3_PATH_STYLE", "1")
    assert StorageConfig.from_env().path_style is True


def test_s3fs_settings_for_ranged_reads():
    kw = StorageConfig(endpoint_url="http://127.0.0.1:9", path_style=True).s3fs_kwargs()
    assert kw["default_cache_type"] == "none" and kw["use_listings_cache"] is True
    assert kw["client_kwargs"]["endpoint_url"] == "http://127.0.0.1:9"
    assert kw["config_kwargs"]["s3"] == {"addressing_style": "path"}


def test_missing_s3fs_is_a_dependency_error(monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_s3fs(name, *a, **k):
        if name == "s3fs":
            raise ImportError("no s3fs")
        return real_import(name, *a, **k)

    monkeypatch.setattr(builtins, "__import__", no_s3fs)
    with pytest.raises(DependencyError) as e:
        StorageConfig().s3fs()
    assert "s3fs" in e.value.hint and isinstance(e.value, ImportError)


@pytest.mark.s3
def test_s3_round_trip_through_s3fs_pyarrow_and_duckdb(s3):
    import pyarrow as pa
    import pyarrow.parquet as pq

    cfg = StorageConfig.from_env()
    loc = parse_location(s3.url("rt"))
    fs = filesystem(loc, cfg)
    fs.pipe_file(loc.join("blob").path, b"0123456789")
    assert fs.cat_file(loc.join("blob").path, start=2, end=5) == b"234"
    # create-only writes: the second one is refused (If-None-Match: *)
    fs.pipe_file(loc.join("once").path, b"a", mode="create")
    with pytest.raises(FileExistsError):
        fs.pipe_file(loc.join("once").path, b"b", mode="create")
    assert fs.cat_file(loc.join("once").path) == b"a"
    # pyarrow's native S3 client, configured from the same settings, sees the same bucket
    pq.write_table(pa.table({"x": [1, 2, 3], "y": ["a", "b", "c"]}), loc.join("t.parquet").path,
                   filesystem=cfg.pyarrow_s3())
    assert pq.read_table(loc.join("t.parquet").path, filesystem=cfg.pyarrow_s3(), columns=["x"]).column("x").to_pylist() == [1, 2, 3]
    # DuckDB reads it through s3fs
    from warpdata.core.sqlgate import connect

    con = connect(filesystem=fs)
    assert con.execute("select sum(x), max(y) from read_parquet(?)", [loc.join("t.parquet").url]).fetchone() == (6, "c")
    assert s3.count("GET", "rt/t.parquet") >= 1


@pytest.mark.s3
def test_s3_missing_bucket_raises(s3):
    cfg = StorageConfig.from_env()
    loc = parse_location(f"s3://{s3.bucket}-nope/x")
    with pytest.raises((FileNotFoundError, PermissionError, OSError)):
        filesystem(loc, cfg).cat_file(loc.join("k").path)
    assert os.environ["WARP_S3_ENDPOINT"] == s3.endpoint


# -- failing fast, naming the cause (no network needed) ----------------------------


@pytest.fixture
def closed_port():
    """A TCP port on 127.0.0.1 with nothing listening (connections are refused)."""
    import socket

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


@pytest.fixture
def fake_creds_env(monkeypatch, tmp_path):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "fake")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "fake")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "empty-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "empty-credentials"))
    for k in ("AWS_PROFILE", "WARP_S3_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3"):
        monkeypatch.delenv(k, raising=False)


def _count_sends(client) -> list[int]:
    sent: list[int] = []
    client.meta.events.register("before-send.s3", lambda **_: sent.append(1))
    return sent


def test_refused_connection_is_tried_twice_not_five_times(closed_port, fake_creds_env, monkeypatch):
    """botocore retried a refused connection 5 times with back-off (15-20 s before any message)."""
    from warpdata.core.errors import StoreUnavailableError
    from warpdata.storage.errors import translate_storage_error
    from warpdata.storage.s3client import boto3_client

    endpoint = f"http://127.0.0.1:{closed_port}"
    cfg = StorageConfig(endpoint_url=endpoint, path_style=True)
    assert cfg.retries == 5  # throttling and 5xx keep the full budget
    fs = cfg.s3fs()
    client = fs.connect()
    sent = _count_sends(client)
    with pytest.raises(Exception) as e:
        fs.ls(f"bucket-{closed_port}/x")
    assert len(sent) == 2
    err = translate_storage_error(e.value, "s3://b/x", "list")
    assert isinstance(err, StoreUnavailableError) and err.details["cause"] == "refused"
    assert f"127.0.0.1:{closed_port} refuses connections" in err.message and "WARP_S3_ENDPOINT" in err.hint

    b3 = boto3_client(cfg)  # the client of the `latest` pointer
    sent = _count_sends(b3)
    with pytest.raises(Exception) as e:
        b3.get_object(Bucket="b", Key="k")
    assert len(sent) == 2
    assert translate_storage_error(e.value, "s3://b/k", "read").details["cause"] == "refused"


def test_connect_timeouts_are_not_retried_and_other_errors_are_left_to_botocore():
    from botocore.exceptions import ConnectTimeoutError, EndpointConnectionError, ReadTimeoutError
    from warpdata.storage.locations import _limit_connect_retries

    with pytest.raises(ConnectTimeoutError):
        _limit_connect_retries(caught_exception=ConnectTimeoutError(endpoint_url="http://x"), attempts=1)
    refused = EndpointConnectionError(endpoint_url="http://x")
    assert _limit_connect_retries(caught_exception=refused, attempts=1) is None  # one retry
    with pytest.raises(EndpointConnectionError):
        _limit_connect_retries(caught_exception=refused, attempts=2)
    # a read timeout or a throttled response is botocore's business
    assert _limit_connect_retries(caught_exception=ReadTimeoutError(endpoint_url="http://x"), attempts=4) is None
    assert _limit_connect_retries(caught_exception=None, attempts=4) is None


@pytest.mark.parametrize("cmd", [["ls"], ["stream", "ws/x"], ["publish", "ws/x", "--table", "main=T"]])
def test_commands_name_a_refused_endpoint(cli, closed_port, fake_creds_env, monkeypatch, tmp_path, cmd):
    (tmp_path / "t.csv").write_text("id\n1\n")
    monkeypatch.setenv("WARP_S3_ENDPOINT", f"http://127.0.0.1:{closed_port}")
    monkeypatch.setenv("WARP_STORE", "s3://bucket/warp")
    r = cli(*[c.replace("T", str(tmp_path / "t.csv")) if c == "main=T" else c for c in cmd])
    assert r.code == ExitCode.CONFIG, r.err
    assert f"the S3 endpoint 127.0.0.1:{closed_port} refuses connections" in r.err
    assert "WARP_S3_ENDPOINT" in r.err


def test_unresolvable_host_is_named_as_dns(cli, fake_creds_env, monkeypatch):
    monkeypatch.setenv("WARP_S3_ENDPOINT", "http://warp-no-such-host.invalid:9000")
    monkeypatch.setenv("WARP_STORE", "s3://bucket/warp")
    for cmd in (["ls"], ["stream", "ws/x"]):
        r = cli(*cmd)
        assert r.code == ExitCode.CONFIG
        assert "cannot resolve the S3 host warp-no-such-host.invalid" in r.err, r.err


@pytest.fixture
def no_creds_env(monkeypatch, tmp_path):
    """No credentials anywhere: env cleared, config files pointed at empty ones, no IMDS."""
    for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE",
              "WARP_S3_PROFILE", "AWS_WEB_IDENTITY_TOKEN_FILE", "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
              "AWS_CONTAINER_CREDENTIALS_FULL_URI", "WARP_S3_ANON"):
        monkeypatch.delenv(k, raising=False)
    (tmp_path / "empty").write_text("")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "empty"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "empty"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")


@pytest.mark.s3
@pytest.mark.parametrize("cmd", [["ls"], ["stream", "ws/x"], ["inspect", "ws/x"], ["warm", "ws/x"]])
def test_missing_credentials_are_named_not_dns(s3, no_creds_env, monkeypatch, cmd):
    """pyarrow went anonymous without credentials and reported a DNS/network failure instead."""
    import subprocess
    import sys

    monkeypatch.setenv("WARP_STORE", s3.url("warp"))
    # a fresh process: in this one, fsspec's instance cache may hold a client with earlier credentials
    r = subprocess.run([sys.executable, "-m", "warpdata", *cmd], capture_output=True, text=True, timeout=120)
    assert r.returncode == ExitCode.CONFIG, r.stderr
    assert "credentials" in r.stderr and "AWS_ACCESS_KEY_ID" in r.stderr
    assert "resolve" not in r.stderr and "NETWORK" not in r.stderr


@pytest.mark.s3
def test_anonymous_reads_are_opt_in(s3, no_creds_env, monkeypatch):
    monkeypatch.setenv("WARP_S3_ANON", "1")
    cfg = StorageConfig.from_env()
    assert cfg.anon and cfg.pyarrow_s3() is not None


@pytest.mark.s3
def test_s3_stores_of_one_configuration_share_one_client(s3):
    from warpdata.storage.base import open_object_store

    a, b = open_object_store(s3.url("a")), open_object_store(s3.url("b"))
    assert a.client is b.client  # made once per configuration and process, on first use
    assert a.put_if_absent("k", b"v") is True and a.get("k") == b"v"


def test_s3_client_tls_to_a_plain_host_is_typed_at_once(monkeypatch, tmp_path):
    """The registry's S3 client (writes, HEADs) names a TLS failure and does not retry it as throttling."""
    import time

    from support.hostile import HostileHost
    from support.s3fixtures import s3_env
    from warpdata.core.errors import StoreUnavailableError
    from warpdata.registry.store import Store

    pytest.importorskip("boto3")
    with HostileHost("no-range") as host:
        for k, v in s3_env(host.url.replace("http://", "https://")).items():
            monkeypatch.setenv(k, v)
        t0 = time.monotonic()
        with pytest.raises(StoreUnavailableError) as e:
            Store("s3://bucket/store").has_blob("ab" * 32)
        assert e.value.details.get("cause") == "tls" and "TLS" in e.value.message and "http://" in e.value.hint
        assert time.monotonic() - t0 < 15


@pytest.mark.s3
def test_a_dataset_reads_through_one_object_store_that_counts_every_request(s3, tmp_path, monkeypatch):
    """One object per store URL: the version prefix's listing, the pointer, the manifest and the shard
    reads of one dataset all go through its one object store and are counted in one place, and what
    it counted is what the S3 server saw."""
    import warpdata
    from support.datasets import make_rows, publish

    monkeypatch.setenv("WARP_CACHE_DIR", str(tmp_path / "cache"))
    m = publish(s3.url(), "ws/one", {"main": [make_rows(50)]}, tmp_path)
    s3.reset_counts()
    ds = warpdata.dataset("ws/one", store=s3.url(), version=m.version_hash[:8], mode="remote")
    assert ds.version == m.version_hash
    assert ds.remote is ds.store.remote and ds.stats is ds.store.stats
    assert ds.table("main").head(3).num_rows == 3
    st = ds.stats.to_dict()
    assert st["by_kind"].get("LIST") == 1  # the version prefix, resolved through the same store
    assert st["requests"] == s3.count() > 1


def test_an_http_store_has_no_filesystem_to_hand_out():
    """Callers that open a store for its filesystem (the feature cache's and the warehouse's uploads)
    get the typed read-only error of an HTTP store, naming it, not a None to fail on later."""
    from warpdata.core.errors import ReadOnlyStoreError
    from warpdata.storage.base import open_object_store

    objects = open_object_store("https://host.example/store/")
    assert objects.url == "https://host.example/store" and objects.location.read_only
    with pytest.raises(ReadOnlyStoreError, match="host.example/store") as e:
        objects.fs  # noqa: B018 (the property is what is tested)
    assert e.value.exit_code == ExitCode.CONFIG and e.value.hint


def test_storage_modules_are_split_along_their_seams():
    """No module of the storage layer passes 800 lines, and the reader's public names are still
    imported from warpdata.storage.remote."""
    from pathlib import Path

    import warpdata.storage
    from warpdata.storage import remote

    folder = Path(warpdata.storage.__file__).parent
    long = {p.name: n for p in folder.glob("*.py") if (n := len(p.read_text().splitlines())) >= 800}
    assert not long, long
    assert {"HttpStatusError", "RangeFile", "Remote", "RequestStats", "plan_ranges", "retry_budget"} <= set(remote.__all__)
    assert all(hasattr(remote, n) for n in remote.__all__)


def test_each_protocol_is_opened_through_the_table_and_only_its_module_is_imported(tmp_path):
    """open_object_store picks the class from storage.base.PROTOCOLS: opening a local store imports
    neither the S3 nor the HTTP module (a fresh interpreter), and every protocol parse_location
    yields has an entry."""
    import subprocess
    import sys

    from warpdata.storage.base import PROTOCOLS, open_object_store

    code = ("import sys\nfrom warpdata.storage.base import open_object_store\n"
            f"s = open_object_store({str(tmp_path)!r}, stale_lock_after=7.0)\n"
            "print(type(s).__name__, s.stale_after, "
            "sorted(m for m in ('warpdata.storage.s3', 'warpdata.storage.http') if m in sys.modules))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["LocalObjectStore", "7.0", "[]"]
    opened = {u: type(open_object_store(u)).__name__ for u in ("memory://t", "https://h.example/s", "http://h/s")}
    assert opened == {"memory://t": "MemoryObjectStore", "https://h.example/s": "HttpObjectStore",
                      "http://h/s": "HttpObjectStore"}
    assert set(PROTOCOLS) == {"file", "memory", "s3", "http", "https"}


def test_a_location_of_no_known_protocol_is_a_config_error():
    from warpdata.storage.base import open_object_store

    with pytest.raises(ConfigError, match="gopher") as e:
        open_object_store(Location("gopher", "h/x"))
    assert e.value.exit_code == ExitCode.CONFIG and "file" in e.value.hint
