"""``warp doctor``: every check reported with status and remedy; FAIL exits 1.

Store checks run against real stores: a local directory, ``memory://`` and
moto's S3 server on 127.0.0.1 (the ``s3`` fixture), including DuckDB reading
Parquet from the store through s3fs.
"""

from __future__ import annotations

import json
import os

import pytest
from warpdata.checks.registry import FAIL, PASS, SKIP, WARN, Check, all_checks, run_check

STATUSES = {PASS, WARN, FAIL, SKIP}


def _by_name(doc: dict) -> dict[str, dict]:
    return {c["name"]: c for c in doc["checks"]}


def test_json_lists_every_check_with_status_and_remedy(cli):
    r = cli("doctor", "--json")
    doc = r.json()
    names = [c["name"] for c in doc["checks"]]
    assert names == [c.name for c in all_checks()]
    required = {"python", "packages", "optional:s3fs", "optional:torch", "optional:zarr", "optional:cupy",
                "optional:nvcomp", "cuda-gpu", "cache-dir", "store", "duckdb-parquet"}
    assert required <= set(names)
    for c in doc["checks"]:
        assert set(c) >= {"name", "group", "status", "detail", "remedy"}
        assert c["status"] in STATUSES and c["detail"]
        if c["status"] in (WARN, FAIL):  # what fails says how to fix it
            assert c["remedy"], c
    assert doc["failed"] == sum(c["status"] == FAIL for c in doc["checks"])
    assert r.code == (1 if doc["failed"] else 0)
    assert doc["ok"] is (doc["failed"] == 0)


def test_default_local_store_passes(cli):
    doc = cli("doctor", "--json", "--only", "store", "--only", "cache").json()
    checks = _by_name(doc)
    assert set(checks) >= {"store", "duckdb-parquet", "cache-dir"}
    for name in ("store", "duckdb-parquet", "cache-dir"):
        assert checks[name]["status"] == PASS, checks[name]
    assert "free" in checks["cache-dir"]["detail"]


def test_unwritable_cache_dir_fails_with_exit_1(cli, monkeypatch, tmp_path):
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("a file where the cache directory should go")
    monkeypatch.setenv("WARP_CACHE_DIR", str(blocker / "cache"))
    r = cli("doctor", "--json", "--only", "cache")
    doc = r.json()
    assert r.code == 1 and doc["ok"] is False and doc["failed"] == 1
    c = _by_name(doc)["cache-dir"]
    assert c["status"] == FAIL and "not writable" in c["detail"] and "WARP_CACHE_DIR" in c["remedy"]
    human = cli("doctor", "--only", "cache")
    assert human.code == 1 and "FAIL" in human.out and "1 failed" in human.err


def test_memory_store(cli, monkeypatch):
    monkeypatch.setenv("WARP_STORE", "memory://doctor-test")
    checks = _by_name(cli("doctor", "--json", "--only", "store").json())
    assert checks["store"]["status"] == PASS, checks["store"]
    assert checks["duckdb-parquet"]["status"] == PASS, checks["duckdb-parquet"]
    from fsspec.implementations.memory import MemoryFileSystem

    assert MemoryFileSystem().find("/doctor-test") == []  # probes removed


@pytest.mark.s3
def test_s3_store_read_write_create_only_and_duckdb(cli, monkeypatch, s3):
    monkeypatch.setenv("WARP_STORE", s3.url("warp"))
    r = cli("doctor", "--json", "--only", "store")
    checks = _by_name(r.json())
    assert r.code == 0, checks
    assert checks["store"]["status"] == PASS and checks["store-create-only"]["status"] == PASS
    assert "create-only" in checks["store-create-only"]["detail"]
    # the create-only probe runs once per doctor run (one fresh create, one refused overwrite)
    conditional = [r for r in s3.requests("PUT") if r.get("if_none_match") == "*" and "latest" not in r["key"]]
    assert len(conditional) == 2, conditional
    assert checks["duckdb-parquet"]["status"] == PASS and "via s3fs" in checks["duckdb-parquet"]["detail"]
    # DuckDB really read from the store: the Parquet probe was fetched from S3
    assert s3.count("GET", "warp/.warp-doctor-") >= 1
    # and the probes are cleaned up
    listed = s3.client.list_objects_v2(Bucket=s3.bucket).get("Contents", [])
    assert listed == []


@pytest.mark.s3
def test_s3_store_missing_bucket_fails(cli, monkeypatch, s3):
    monkeypatch.setenv("WARP_STORE", f"s3://{s3.bucket}-does-not-exist/warp")
    r = cli("doctor", "--json", "--only", "store")
    checks = _by_name(r.json())
    assert r.code == 1
    assert checks["store"]["status"] == FAIL and "bucket" in checks["store"]["detail"]
    assert checks["duckdb-parquet"]["status"] == "SKIP"  # not the same failure again
    assert "fix the 'store' check first" in checks["duckdb-parquet"]["remedy"]


def test_bad_store_url_fails(cli, monkeypatch):
    monkeypatch.setenv("WARP_STORE", "ftp://example.invalid/x")
    r = cli("doctor", "--json", "--only", "store")
    c = _by_name(r.json())["store"]
    assert r.code == 1 and c["status"] == FAIL and "WARP_STORE" in c["remedy"]


def test_only_filters_groups(cli):
    doc = cli("doctor", "--json", "--only", "install").json()
    assert {c["group"] for c in doc["checks"]} == {"install"}


def test_a_crashing_check_is_a_failure_not_a_crash():
    def broken():
        raise RuntimeError("boom")

    r = run_check(Check("broken", "test", broken))
    assert r.status == FAIL and "RuntimeError: boom" in r.detail and r.remedy


def test_direct_io_check_reports_the_working_directory(cli, monkeypatch, tmp_path):
    from warpdata.core.directio import filesystem_type, wants_direct

    monkeypatch.chdir(tmp_path)
    r = cli("doctor", "--json", "--only", "cache")
    doc = r.json()
    (c,) = [c for c in doc["checks"] if c["name"] == "direct-io"]
    assert c["facts"]["path"] == str(tmp_path) and c["facts"]["filesystem"] == filesystem_type(tmp_path)
    assert c["status"] == "PASS"
    assert ("use O_DIRECT" in c["detail"]) is wants_direct(tmp_path)
    monkeypatch.setenv("WARP_DIRECT_IO", "0")
    (c,) = [c for c in cli("doctor", "--json", "--only", "cache").json()["checks"] if c["name"] == "direct-io"]
    assert c["status"] == "PASS" and "WARP_DIRECT_IO=0" in c["detail"]


def _store_rows(doc) -> list[tuple[str, str]]:
    return [(c["name"], c["status"]) for c in doc["checks"] if c["group"] == "store"]


def test_s3_without_credentials_names_them_first(cli, monkeypatch, tmp_path, moto_server):
    """It used to lead with the store probe's NoCredentialsError and fail every check after it."""
    for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE", "WARP_S3_PROFILE"):
        monkeypatch.delenv(k, raising=False)
    (tmp_path / "empty").write_text("")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "empty"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "empty"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("WARP_S3_ENDPOINT", moto_server.endpoint)
    monkeypatch.setenv("WARP_STORE", "s3://warp-doctor-nocreds/warp")
    r = cli("doctor", "--json", "--only", "store")
    doc = r.json()
    assert r.code == 1
    rows = _store_rows(doc)
    assert rows[0] == ("store-credentials", FAIL)
    assert all(status == "SKIP" for _, status in rows[1:]), rows
    first = doc["checks"][[c["name"] for c in doc["checks"]].index("store-credentials")]
    assert "no AWS credentials" in first["detail"] and "AWS_ACCESS_KEY_ID" in first["remedy"]


def test_s3_endpoint_refusing_connections_is_named(cli, monkeypatch, tmp_path):
    import socket

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "fake")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "fake")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("WARP_S3_ENDPOINT", f"http://127.0.0.1:{port}")
    monkeypatch.setenv("WARP_STORE", "s3://bucket/warp")
    r = cli("doctor", "--json", "--only", "store")
    doc = r.json()
    checks = _by_name(doc)
    assert r.code == 1
    assert _store_rows(doc)[:2] == [("store-credentials", PASS), ("store", FAIL)]
    assert f"127.0.0.1:{port} refuses connections" in checks["store"]["detail"]
    assert checks["store"]["facts"]["cause"] == "refused"
    assert {checks[n]["status"] for n in ("duckdb-parquet", "store-create-only", "store-cas")} == {"SKIP"}


def test_missing_local_store_folder_is_a_warning(cli, monkeypatch, tmp_path):
    monkeypatch.setenv("WARP_STORE", str(tmp_path / "no-such-store"))
    c = _by_name(cli("doctor", "--json", "--only", "store").json())["store"]
    assert c["status"] == "WARN" and "does not exist" in c["detail"] and "WARP_STORE" in c["remedy"]
    assert c["facts"]["created"] is True
    assert _by_name(cli("doctor", "--json", "--only", "store").json())["store"]["status"] == PASS


def test_only_with_an_unknown_group_is_a_usage_error(cli):
    r = cli("doctor", "--only", "stor")
    assert r.code == 2 and "'stor' is not a check group" in r.err and "store" in r.err


def test_doctor_names_the_other_warpdata_distribution(tmp_path):
    """`warpdata` on the package index is another project that installs the same module and script."""
    import subprocess
    import sys

    info = tmp_path / "warpdata-3.0.27.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: warpdata\nVersion: 3.0.27\n")
    (info / "RECORD").write_text("warpdata/__init__.py,,\nwarpdata-3.0.27.dist-info/METADATA,,\n")
    (info / "top_level.txt").write_text("warpdata\n")
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    r = subprocess.run([sys.executable, "-m", "warpdata", "doctor", "--only", "install", "--json"],
                       capture_output=True, text=True, env=env)
    assert r.returncode == 1, r.stderr
    check = next(c for c in json.loads(r.stdout)["checks"] if c["name"].endswith("distribution"))
    assert check["status"] == "FAIL" and "warpdata" in check["facts"]["providers"]
    assert "pip uninstall -y warpdata" in check["remedy"]
    r = subprocess.run([sys.executable, "-m", "warpdata", "doctor", "--only", "install", "--json"],
                       capture_output=True, text=True)
    check = next(c for c in json.loads(r.stdout)["checks"] if c["name"].endswith("distribution"))
    assert check["status"] == "PASS" and check["facts"]["providers"] == ["warp-toolchain"], check


@pytest.mark.parametrize("check_name", ["store-create-only", "store-cas"])
def test_a_write_probe_that_cannot_connect_names_the_cause(monkeypatch, check_name):
    """Run alone (no 'store' check before it to SKIP on), each write probe names a refused endpoint
    and its fix, the compare-and-swap probe as the create-only one does (it used to print the raw
    exception with advice about If-Match support)."""
    import socket

    from warpdata.doctor import store as store_checks

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    for k, v in {"AWS_ACCESS_KEY_ID": "fake", "AWS_SECRET_ACCESS_KEY": "fake", "AWS_EC2_METADATA_DISABLED": "true",
                 "WARP_S3_ENDPOINT": f"http://127.0.0.1:{port}", "WARP_STORE": "s3://bucket/warp"}.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setattr(store_checks, "_STORE_BLOCKED", {})
    c = next(c for c in all_checks() if c.name == check_name)
    result = run_check(c)
    assert result.status == FAIL, result
    assert f"127.0.0.1:{port} refuses connections" in result.detail
    assert "If-Match" not in (result.remedy or "") and "WARP_S3_ENDPOINT" in (result.remedy or ""), result.remedy
