"""Scale-out of ``warp etl`` (warp/etl/): the same bytes on any executor, receipts, resume, typed failures.

Real components only: a Dask ``LocalCluster`` and a ``dask scheduler`` + 2
``dask worker`` processes started here on 127.0.0.1, Ray where it installs.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support.processes import kill_when, spawn_etl
from support.warehouses import coco_config
from warpdata.sampledata.detection import generate

SMALL = dict(min_side=64, max_side=150)


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    d = tmp_path_factory.mktemp("scale") / "coco"
    generate(d, count=24, seed=5, **SMALL)
    return d


def config(d: Path, out: Path, *, build: str = "", name: str = "t.toml") -> Path:
    return coco_config(d, out, name=name, build=build, fail=0.3)


def etl(cli, cfg, *args):
    r = cli("etl", "--config", cfg, "--json", *args)
    assert r.code == 0, r.err
    return r.json()


def artifact(path: str) -> dict[str, bytes]:
    """Every file of a version except metrics.json, the only one with timings (the manifest is sealed, timeless)."""
    return {p.name: p.read_bytes() for p in sorted(Path(path).iterdir()) if p.name != "metrics.json"}


@pytest.fixture(scope="module")
def reference(dataset, tmp_path_factory):
    """The version built by the local executor with one worker: what every other run must equal."""
    from warpdata.cli.app import main  # noqa: F401  (imported so the CLI runner below works in-process)

    out = tmp_path_factory.mktemp("ref") / "wh"
    cfg = config(dataset, out, name="ref.toml")
    r = subprocess.run([sys.executable, "-m", "warpdata", "etl", "--config", str(cfg), "--json", "-j", "1"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    res = json.loads(r.stdout)
    assert res["shards"] >= 5 and res["shards_built"] == res["shards"] and res["shards_reused"] == 0
    return artifact(res["path"])


def nshards(ref: dict[str, bytes]) -> int:
    return sum(name.endswith(".twh1") for name in ref)


def _dask():
    pytest.importorskip("distributed", reason="the dask extra (dask, distributed) is not installed")


@pytest.mark.parametrize("args", [["-j", "2"], ["-j", "2", "--executor", "process"]], ids=["threads-2", "process-2"])
def test_local_executors_give_the_reference_bytes(cli, dataset, reference, tmp_path, args):
    res = etl(cli, config(dataset, tmp_path / "wh"), *args)
    assert res["shards_built"] == nshards(reference)
    assert artifact(res["path"]) == reference


def test_dask_local_cluster_gives_the_reference_bytes(cli, dataset, reference, tmp_path):
    _dask()
    res = etl(cli, config(dataset, tmp_path / "wh"), "--executor", "dask", "-j", "2")
    assert res["executor"] == "dask" and res["shards_built"] == nshards(reference)
    metrics = json.loads((Path(res["path"]) / "metrics.json").read_text())
    assert metrics["cluster"]["cluster"] == "LocalCluster" and metrics["cluster"]["workers"] == 2
    assert metrics["header_pass"] == "driver"  # a LocalCluster shares the driver's machine: its threads probe
    # a worker process per worker, on TCP to the driver's scheduler (warp/etl/daskrunner.py, OWN_CLUSTER_LAYOUT)
    assert metrics["cluster"]["scheduler"].startswith("tcp://127.0.0.1:") and metrics["cluster"]["layout"] == "processes"
    assert artifact(res["path"]) == reference


@pytest.mark.parametrize("layout", ["processes", "threads", "one-process"])
def test_every_own_cluster_layout_gives_the_reference_bytes(cli, dataset, reference, tmp_path, monkeypatch, layout):
    """The layouts measured for an own LocalCluster (warp/etl/daskrunner.py, OWN_CLUSTER_LAYOUTS):
    workers as processes, as threads of the driver, one process of threads; same bytes."""
    _dask()
    from warpdata.etl import daskrunner

    monkeypatch.setattr(daskrunner, "OWN_CLUSTER_LAYOUT", layout)
    res = etl(cli, config(dataset, tmp_path / "wh"), "--executor", "dask", "-j", "2")
    metrics = json.loads((Path(res["path"]) / "metrics.json").read_text())
    assert metrics["cluster"]["cluster"] == "LocalCluster" and metrics["cluster"]["threads"] == 2
    assert metrics["cluster"]["workers"] == (1 if layout == "one-process" else 2)
    assert metrics["cluster"]["scheduler"].startswith("inproc://" if layout == "threads" else "tcp://127.0.0.1:")
    assert artifact(res["path"]) == reference


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def dask_cluster(tmp_path):
    """``dask scheduler`` + 2 ``dask worker`` processes on 127.0.0.1, stopped (by pid) afterwards."""
    _dask()
    sched_file = tmp_path / "scheduler.json"
    port = _free_port()
    bindir = Path(sys.executable).parent
    env = {**os.environ, "DASK_DISTRIBUTED__WORKER__DAEMON": "False"}
    procs = [subprocess.Popen([str(bindir / "dask"), "scheduler", "--host", "127.0.0.1", "--port", str(port),
                               "--no-dashboard", "--scheduler-file", str(sched_file)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, start_new_session=True)]
    try:
        deadline = time.monotonic() + 60
        while not sched_file.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert sched_file.exists(), "dask scheduler did not start"
        for i in range(2):
            procs.append(subprocess.Popen(
                [str(bindir / "dask"), "worker", f"tcp://127.0.0.1:{port}", "--nthreads", "1", "--nworkers", "1",
                 "--host", "127.0.0.1", "--no-dashboard", "--name", f"w{i}", "--local-directory", str(tmp_path / f"w{i}")],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, start_new_session=True))
        from distributed import Client

        with Client(f"tcp://127.0.0.1:{port}", timeout="30s") as c:
            c.wait_for_workers(2, timeout=60)
        yield {"address": f"127.0.0.1:{port}", "file": sched_file, "procs": procs}
    finally:
        for p in reversed(procs):
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
        for p in procs:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()


def test_external_dask_cluster_gives_the_reference_bytes(cli, dataset, reference, tmp_path, dask_cluster):
    res = etl(cli, config(dataset, tmp_path / "a"), "--executor", f"dask://{dask_cluster['address']}")
    m = json.loads((Path(res["path"]) / "metrics.json").read_text())
    assert m["cluster"]["cluster"] == "external" and m["cluster"]["workers"] == 2
    assert m["header_pass"] == "workers"  # the driver did not read every image itself
    assert artifact(res["path"]) == reference
    # the same cluster through its scheduler file, chosen in the config this time
    res = etl(cli, config(dataset, tmp_path / "b", build=f'executor = "dask:{dask_cluster["file"]}"', name="b.toml"))
    assert res["executor"] == f"dask:{dask_cluster['file']}"
    assert artifact(res["path"]) == reference
    # issue 40: the address as 'dask scheduler' prints it (and warp's hints write it), tcp://HOST:PORT
    r = cli("etl", "--config", config(dataset, tmp_path / "c", name="c.toml"), "--executor",
            f"tcp://{dask_cluster['address']}")
    assert r.code == 0, r.err
    assert r.out.strip() == str(next((tmp_path / "c").glob("v*"))) and "is not a known executor" not in r.err
    assert artifact(r.out.strip()) == reference


def test_ray_gives_the_reference_bytes(cli, dataset, reference, tmp_path):
    pytest.importorskip("ray", reason="ray is not installed here (the ray extra)")
    res = etl(cli, config(dataset, tmp_path / "wh"), "--executor", "ray", "-j", "2")
    assert artifact(res["path"]) == reference


# -- configuration errors ---------------------------------------------------

@pytest.mark.parametrize("bad", ["abc", "0", "-3", "2.5"])
def test_bad_warp_workers_is_a_config_error_everywhere(cli, dataset, tmp_path, monkeypatch, bad):
    """One parser: every ETL pipeline and tar-to-tbl exit 78 naming WARP_WORKERS."""
    from warpdata.sampledata import captions, volume

    volume.generate(tmp_path / "vol", count=2, seed=0)
    cap = captions.generate(tmp_path / "cap", count=4, seed=0)
    monkeypatch.setenv("WARP_WORKERS", bad)
    for cfg in (config(dataset, tmp_path / "wh"), tmp_path / "vol" / "volume.toml", cap["config"]):
        r = cli("etl", "--config", cfg, "--json")
        assert r.code == 78 and "WARP_WORKERS" in r.err, (cfg, r.code, r.err)
    r = cli("tar-to-tbl", tmp_path / "in.tar", tmp_path / "out.tbl")
    assert r.code == 78 and "WARP_WORKERS" in r.err
    assert not (tmp_path / "wh").exists() and not (tmp_path / "vol" / "volume.zarr").exists()


@pytest.mark.parametrize("spec", ["bogus", "dask://nohost", "dask:", "ray:", "tcp://nohost"])
def test_bad_executor_names_the_setting(cli, dataset, tmp_path, spec):
    # the command line's --executor is a usage error (exit 2), as a bad SIZE is; a config key's is 78
    r = cli("etl", "--config", config(dataset, tmp_path / "wh"), "--executor", spec)
    assert r.code == 2 and f"--executor: {spec!r}" in r.err and "hint: " in r.err and r.out == ""


def test_an_executor_port_out_of_range_is_a_usage_error_not_connection_refused(cli, dataset, tmp_path):
    # issue 40: dask://127.0.0.1:99999 was tried and reported "connection refused" (exit 75)
    r = cli("etl", "--config", config(dataset, tmp_path / "wh"), "--executor", "dask://127.0.0.1:99999")
    assert (r.code, r.out) == (2, "")
    assert r.err.splitlines() == [
        "error: --executor: 'dask://127.0.0.1:99999': port 99999 is out of range (a TCP port is 1 to 65535)",
        "hint: give the port 'dask scheduler' printed (8786 by default), e.g. dask://127.0.0.1:8786"]
    r = cli("etl", "--config", config(dataset, tmp_path / "wh", build='executor = "tcp://127.0.0.1:0"', name="p.toml"))
    assert r.code == 78 and r.out == "" and "names port 0; a TCP port is 1 to 65535" in r.err and "build.executor" in r.err
    assert not (tmp_path / "wh").exists()


def test_warp_executor_env_picks_the_executor_and_the_flag_wins(cli, dataset, reference, tmp_path, monkeypatch):
    monkeypatch.setenv("WARP_EXECUTOR", "process")
    res = etl(cli, config(dataset, tmp_path / "a"), "-j", "2")
    assert res["executor"] == "process" and artifact(res["path"]) == reference
    res = etl(cli, config(dataset, tmp_path / "b", name="b.toml"), "-j", "2", "--executor", "local")
    assert res["executor"] == "local"


def test_a_missing_extra_names_the_pip_line(dataset, tmp_path):
    """Without the dask extra installed (its import blocked in a fresh interpreter): exit 78 + pip line."""
    code = ("import sys; sys.modules['distributed'] = None; from warpdata.cli.app import main; "
            f"sys.exit(main(['etl', '--config', {str(config(dataset, tmp_path / 'wh'))!r}, '--executor', 'dask']))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 78, r.stderr
    assert "pip install 'dask" in r.stderr and "[dask] extra" in r.stderr and not (tmp_path / "wh").exists()


def test_bad_warp_executor_env_is_a_config_error(cli, dataset, tmp_path, monkeypatch):
    monkeypatch.setenv("WARP_EXECUTOR", "spark")
    r = cli("etl", "--config", config(dataset, tmp_path / "wh"))
    assert r.code == 78 and "WARP_EXECUTOR" in r.err


def test_bad_config_executor_names_the_key(cli, dataset, tmp_path):
    r = cli("etl", "--config", config(dataset, tmp_path / "wh", build='executor = "mpi"', name="x.toml"))
    assert r.code == 78 and "build.executor" in r.err


def test_unreachable_dask_scheduler_is_a_temporary_failure(cli, dataset, tmp_path):
    _dask()
    r = cli("etl", "--config", config(dataset, tmp_path / "wh"), "--executor", f"dask://127.0.0.1:{_free_port()}")
    assert r.code == 75 and "rerun" in r.err


# -- receipts and resume ----------------------------------------------------

def _kill_driver_after(cfg: Path, out: Path, receipts: int, *args: str) -> None:
    kill_when(spawn_etl(cfg, *args), lambda: len(list(out.glob(".warp-tmp-build-*/receipts/shard-*.json"))) >= receipts)


def _driver_kill_trial(cli, dataset, reference, out: Path, receipts: int, *args: str) -> dict:
    cfg = config(dataset, out, name=f"k{receipts}.toml")
    for _attempt in range(5):  # on an idle machine the small build can finish between two polls
        _kill_driver_after(cfg, out, receipts, *args)
        assert not list(out.glob("v*")) or len(list(out.glob("v*"))) == 1
        if not list(out.glob("v*")):
            break
        shutil.rmtree(out)
    else:
        pytest.skip("the build finished before it could be killed, 5 times")
    # killed after `receipts` of the shards' receipts and before the last: no version is visible
    done = len(list(out.glob(".warp-tmp-build-*/receipts/shard-*.json")))
    assert receipts <= done <= nshards(reference)  # all receipted: killed in finalize, before the manifest
    res = etl(cli, cfg, *args)
    assert res["shards_reused"] == done and res["shards_built"] == nshards(reference) - done
    assert artifact(res["path"]) == reference
    return res


@pytest.mark.parametrize("receipts", [1, 3])
def test_kill_driver_then_rerun_builds_only_unreceipted_shards(cli, dataset, reference, tmp_path, receipts):
    _driver_kill_trial(cli, dataset, reference, tmp_path / "wh", receipts, "-j", "1")


def test_a_receipt_is_trusted_only_when_its_shard_still_verifies(cli, dataset, reference, tmp_path):
    """Receipted shards are reused; one whose bytes changed, or whose receipt names another task, is rebuilt."""
    out = tmp_path / "wh"
    cfg = config(dataset, out)
    for _attempt in range(5):  # killed too late (finished, or in finalize with its journal gone): again
        _kill_driver_after(cfg, out, 5, "-j", "1")
        builds = [p for p in out.glob(".warp-tmp-build-*") if p.is_dir()]  # not its .lock
        receipts = sorted(builds[0].glob("receipts/shard-*.json")) if builds else []
        if not list(out.glob("v*")) and len(receipts) >= 2:
            break
        shutil.rmtree(out)
    else:
        pytest.skip("the build could not be killed with receipts in place, 5 times")
    build = builds[0]
    victim = build / (receipts[0].stem + ".twh1")
    data = bytearray(victim.read_bytes())
    data[-1] ^= 0xFF
    victim.write_bytes(bytes(data))
    doc = json.loads(receipts[1].read_text())
    doc["task_sha256"] = "0" * 64
    receipts[1].write_text(json.dumps(doc))
    res = etl(cli, cfg, "-j", "1")
    assert res["shards_reused"] == len(receipts) - 2 and res["shards_built"] == nshards(reference) - len(receipts) + 2
    assert artifact(res["path"]) == reference
    assert not (Path(res["path"]) / "receipts").exists()  # the journal never reaches the version


@pytest.mark.slow
@pytest.mark.parametrize("trial", range(10))
def test_kill_driver_trials(cli, dataset, reference, tmp_path, trial):
    _driver_kill_trial(cli, dataset, reference, tmp_path / "wh", 1 + trial % 5, "-j", str(1 + trial % 2))


def test_kill_a_dask_worker_mid_run_leaves_the_output_unchanged(cli, dataset, reference, tmp_path, dask_cluster):
    """kill -9 one of the two workers while it builds: the scheduler reruns its task elsewhere."""
    import psutil

    cfg = config(dataset, tmp_path / "wh")
    proc = spawn_etl(cfg, "--executor", f"dask://{dask_cluster['address']}")
    try:
        worker = dask_cluster["procs"][1]
        # the worker process proper is a child of the nanny started by `dask worker`
        deadline = time.monotonic() + 60
        victims = []
        while time.monotonic() < deadline and proc.poll() is None:
            victims = psutil.Process(worker.pid).children(recursive=True)
            if victims and list((tmp_path / "wh").glob(".warp-tmp-build-*/*.twh1")):
                break
            time.sleep(0.01)
        for v in victims:
            os.kill(v.pid, signal.SIGKILL)
        stdout, stderr = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    assert proc.returncode == 0, stderr
    res = json.loads(stdout)
    assert artifact(res["path"]) == reference


# -- output on object storage -------------------------------------------------

def test_output_on_s3_is_uploaded_create_only_with_the_manifest_last(cli, dataset, reference, tmp_path, s3, monkeypatch):
    monkeypatch.setenv("WARP_CACHE_DIR", str(tmp_path / "cache"))
    url = s3.url("wh")
    s3.reset_counts()
    res = etl(cli, config(dataset, tmp_path / "unused"), "--output", url, "-j", "2")
    vdir = res["path"].rsplit("/", 1)[-1]
    assert res["path"] == f"{url}/{vdir}" and res["upload"]["uploaded"] == len(reference) + 1
    assert not (tmp_path / "unused").exists()
    puts = s3.requests("PUT", f"wh/{vdir}/")
    # one create-only PUT per file, the manifest last
    assert len(puts) == len(reference) + 1 and puts[-1]["key"].endswith("/manifest.json")
    assert s3.count("PUT", "wh/latest") == 1
    got = {}
    for name in reference:
        got[name] = s3.client.get_object(Bucket=s3.bucket, Key=f"wh/{vdir}/{name}")["Body"].read()
    assert artifact_from(got) == reference
    assert s3.client.get_object(Bucket=s3.bucket, Key="wh/latest")["Body"].read() == (vdir + "\n").encode()
    # a rerun builds nothing and re-sends nothing
    s3.reset_counts()
    again = etl(cli, config(dataset, tmp_path / "unused"), "--output", url)
    assert again["status"] == "up-to-date" and again["path"] == res["path"]
    assert again["upload"] == {**again["upload"], "uploaded": 0, "reused": len(reference) + 1}
    assert s3.count("PUT", f"wh/{vdir}/") == 0


def artifact_from(files: dict[str, bytes]) -> dict[str, bytes]:
    return {name: data for name, data in files.items() if name != "metrics.json"}


def test_unreachable_store_is_a_temporary_failure(cli, dataset, tmp_path, s3, monkeypatch):
    monkeypatch.setenv("WARP_CACHE_DIR", str(tmp_path / "cache"))
    dead = f"http://127.0.0.1:{_free_port()}"
    for var in ("WARP_S3_ENDPOINT", "AWS_ENDPOINT_URL"):
        monkeypatch.setenv(var, dead)
    r = cli("etl", "--config", config(dataset, tmp_path / "unused"), "--output", s3.url("wh"))
    assert r.code == 75, r.err
    assert "rerun" in r.err and "127.0.0.1" in r.err


# -- source on object storage ---------------------------------------------------

def _upload_source(s3, dataset: Path, prefix: str) -> int:
    """The dataset's labels and images under s3://bucket/<prefix>/; returns the image count."""
    n = 0
    for p in sorted(dataset.rglob("*")):
        rel = p.relative_to(dataset).as_posix()
        if p.is_file() and (rel == "annotations.json" or rel.startswith("images/")):
            s3.client.put_object(Bucket=s3.bucket, Key=f"{prefix}/{rel}", Body=p.read_bytes())
            n += rel.startswith("images/")
    return n


def _same_build(got: dict[str, bytes], ref: dict[str, bytes]) -> None:
    """Same shards, samples and summaries; manifests equal but for the source they name (and the seal
    over it): the version is the content's, wherever the source lived."""
    assert sorted(got) == sorted(ref)
    for name in ref:
        if name != "manifest.json":
            assert got[name] == ref[name], name
    a, b = json.loads(got["manifest.json"]), json.loads(ref["manifest.json"])
    for k in ("dataset_root", "content_sha256"):
        a.pop(k, None)
        b.pop(k, None)
    assert a == b


@pytest.mark.parametrize("args", [["-j", "2"], ["-j", "2", "--executor", "process"]], ids=["threads-2", "process-2"])
def test_source_on_s3_reads_each_image_once_and_gives_the_local_bytes(cli, dataset, reference, tmp_path, s3,
                                                                     monkeypatch, args):
    monkeypatch.setenv("WARP_CACHE_DIR", str(tmp_path / "cache"))
    n_images = _upload_source(s3, dataset, "src")
    cfg = config(dataset, tmp_path / "wh", name="s3src.toml")
    s3.reset_counts()

    def run() -> dict:
        # a process of its own: a process pool's forkserver keeps the environment it was started with
        r = subprocess.run([sys.executable, "-m", "warpdata", "etl", "--config", str(cfg), "--json",
                            "--input", s3.url("src"), *args], capture_output=True, text=True, timeout=300,
                           env={**os.environ, **s3.env, "WARP_CACHE_DIR": str(tmp_path / "cache")})
        assert r.returncode == 0, r.stderr
        return json.loads(r.stdout)

    res = run()
    gets = s3.count("GET", "src/images/")
    assert 0 < gets <= 1.05 * n_images, (gets, n_images)
    assert s3.count("HEAD", "src/images/") == 0
    _same_build(artifact(res["path"]), reference)
    m = json.loads(artifact(res["path"])["manifest.json"])
    assert m["dataset_root"] == s3.url("src") and "dataset_root" not in json.loads(m["version_recipe"])
    # the spool of read bytes is gone once the version is built
    assert not list((tmp_path / "cache").rglob("run-*"))
    # a rerun reads every image once more (content hashes), builds nothing
    s3.reset_counts()
    again = run()
    assert again["status"] == "up-to-date" and s3.count("GET", "src/images/") <= 1.05 * n_images


def test_source_on_s3_changed_image_changes_the_version(cli, dataset, tmp_path, s3, monkeypatch):
    monkeypatch.setenv("WARP_CACHE_DIR", str(tmp_path / "cache"))
    _upload_source(s3, dataset, "src")
    cfg = config(dataset, tmp_path / "wh", name="s3src2.toml")
    first = etl(cli, cfg, "--input", s3.url("src"), "-j", "2")
    key = sorted(o["Key"] for o in s3.client.list_objects_v2(Bucket=s3.bucket, Prefix="src/images/")["Contents"])[0]
    body = s3.client.get_object(Bucket=s3.bucket, Key=key)["Body"].read()
    s3.client.put_object(Bucket=s3.bucket, Key=key, Body=body + b"\0")  # same pixels, other bytes
    second = etl(cli, cfg, "--input", s3.url("src"), "-j", "2")
    assert second["version"] != first["version"] and second["status"] == "built"


def test_source_on_s3_missing_images_are_quarantined_without_a_get(cli, dataset, reference, tmp_path, s3,
                                                                   monkeypatch):
    monkeypatch.setenv("WARP_CACHE_DIR", str(tmp_path / "cache"))
    n = _upload_source(s3, dataset, "src")
    keys = sorted(o["Key"] for o in s3.client.list_objects_v2(Bucket=s3.bucket, Prefix="src/images/")["Contents"])
    s3.client.delete_object(Bucket=s3.bucket, Key=keys[0])
    s3.reset_counts()
    res = etl(cli, config(dataset, tmp_path / "wh", name="s3src3.toml"), "--input", s3.url("src"), "-j", "2")
    assert res["counts"]["missing"] == json.loads(reference["manifest.json"])["summary"]["aggregate"]["missing"] + 1
    assert not any(r["key"] == keys[0] for r in s3.requests("GET"))
    assert s3.count("GET", "src/images/") <= 1.05 * (n - 1)


def test_source_on_s3_missing_labels_is_a_missing_input(cli, dataset, tmp_path, s3, monkeypatch):
    monkeypatch.setenv("WARP_CACHE_DIR", str(tmp_path / "cache"))
    r = cli("etl", "--config", config(dataset, tmp_path / "wh", name="s3src4.toml"), "--input", s3.url("nothing"))
    assert r.code == 66, r.err
    assert "annotations.json" in r.err and "Traceback" not in r.err


@pytest.mark.slow
def test_source_on_s3_on_a_dask_cluster_gives_the_local_bytes(cli, dataset, reference, tmp_path, s3, monkeypatch):
    _dask()
    monkeypatch.setenv("WARP_CACHE_DIR", str(tmp_path / "cache"))
    n_images = _upload_source(s3, dataset, "src")
    s3.reset_counts()
    # a process of its own, whose cluster starts with the store's environment
    r = subprocess.run([sys.executable, "-m", "warpdata", "etl", "--config",
                        str(config(dataset, tmp_path / "wh", name="s3src5.toml")), "--json", "--input", s3.url("src"),
                        "-j", "2", "--executor", "dask"], capture_output=True, text=True, timeout=300,
                       env={**os.environ, **s3.env, "WARP_CACHE_DIR": str(tmp_path / "cache")})
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads(r.stdout)
    assert s3.count("GET", "src/images/") <= 1.05 * n_images
    _same_build(artifact(res["path"]), reference)


def test_kill_driver_with_output_on_s3_resumes_from_the_store_alone(cli, dataset, reference, tmp_path, s3,
                                                                     monkeypatch):
    """Shards and receipts go to the store as they finish: a rerun on an empty cache re-sends none of them."""
    cache = tmp_path / "cache"
    monkeypatch.setenv("WARP_CACHE_DIR", str(cache))
    url = s3.url("wh")
    cfg = config(dataset, tmp_path / "unused", name="s3kill.toml")

    def receipts() -> list[str]:
        got = s3.client.list_objects_v2(Bucket=s3.bucket, Prefix="wh/.warp-tmp-build-").get("Contents", [])
        return [o["Key"] for o in got if "/receipts/" in o["Key"]]

    env = {**os.environ, **s3.env, "WARP_CACHE_DIR": str(cache)}
    kill_when(spawn_etl(cfg, "-j", "1", "--output", url, env=env), lambda: len(receipts()) >= 2, poll=0.01)
    if s3.count("PUT", "wh/latest"):
        pytest.skip("the build finished before it could be killed")
    done = len(receipts())
    assert done >= 2
    listed = s3.client.list_objects_v2(Bucket=s3.bucket, Prefix="wh/v").get("Contents", [])
    assert not any(o["Key"].endswith("/manifest.json") for o in listed)
    import shutil

    shutil.rmtree(cache)  # nothing local survives: the store alone is the journal
    s3.reset_counts()
    res = etl(cli, cfg, "--output", url, "-j", "2")
    vdir = res["path"].rsplit("/", 1)[-1]
    assert res["shards_reused"] == done and res["shards_built"] == nshards(reference) - done
    shard_puts = [r for r in s3.requests("PUT", f"wh/{vdir}/") if r["key"].endswith(".twh1")]
    assert len(shard_puts) == nshards(reference) - done
    puts = s3.requests("PUT", f"wh/{vdir}/")
    assert puts[-1]["key"].endswith("/manifest.json")
    got = {name: s3.client.get_object(Bucket=s3.bucket, Key=f"wh/{vdir}/{name}")["Body"].read() for name in reference}
    assert got == reference
    # the store's receipts are gone once the manifest is there
    assert not receipts()


def test_unreachable_source_store_is_a_temporary_failure(cli, dataset, tmp_path, s3, monkeypatch):
    monkeypatch.setenv("WARP_CACHE_DIR", str(tmp_path / "cache"))
    dead = f"http://127.0.0.1:{_free_port()}"
    for var in ("WARP_S3_ENDPOINT", "AWS_ENDPOINT_URL"):
        monkeypatch.setenv(var, dead)
    monkeypatch.setenv("WARP_S3_RETRIES", "1")
    r = cli("etl", "--config", config(dataset, tmp_path / "wh", name="s3dead.toml"), "--input", s3.url("src"))
    assert r.code == 75, r.err
    assert "could not read" in r.err and "rerun" in r.err and "Traceback" not in r.err
    assert not (tmp_path / "wh").exists()


def test_live_loader_reads_an_s3_source_from_its_spool(dataset, tmp_path, s3, monkeypatch):
    """The live loader over an object-storage source: the same tensors as over the local folder."""
    import numpy as np
    from warpdata.warehouse.live import LiveDataset

    monkeypatch.setenv("WARP_CACHE_DIR", str(tmp_path / "cache"))
    _upload_source(s3, dataset, "src")
    cfg = config(dataset, tmp_path / "wh", name="s3live.toml")
    local = LiveDataset(cfg)
    s3.reset_counts()
    remote = LiveDataset(cfg, input_override=s3.url("src"))
    assert len(remote) == len(local) > 0
    from warpdata.core.errors import DataError

    def get(ds, i):
        try:
            return ds[i]
        except DataError as e:  # the dataset has a truncated JPEG on purpose: the same error both ways
            return e.message

    for i in range(len(local)):
        a, b = get(local, i), get(remote, i)
        if isinstance(a, str):
            assert a == b
            continue
        assert a["key"] == b["key"] and np.array_equal(a["image"], b["image"]) and np.array_equal(a["boxes"], b["boxes"])
    assert s3.count("GET", "src/images/") <= 1.05 * len(list((dataset / "images").iterdir()))
