"""The feature cache on the ETL kit (docs/formats/feature-shard.md, "Building on an executor").

* single-process caches are what the writer before the kit built (the golden of
  tests/golden/features/make_golden.py);
* local threads (1 and 2 workers), a process pool and a Dask cluster (2 worker
  processes on 127.0.0.1, one per module) give byte-identical caches;
* the encoder loads once per worker; tasks that ask for ``GPU`` run only where a
  worker offers it; receipts let a killed build resume.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
from support.clusters import dask_cluster
from support.featurecache import write_config
from support.processes import kill_when, spawn_etl

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("features_golden", ROOT / "tests/golden/features/make_golden.py")
golden = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(golden)
EXPECTED = json.loads((ROOT / "tests/golden/features/expected.json").read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def sources(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("fc-kit")
    golden.make_sources(root)
    return root


@pytest.fixture(scope="module")
def cluster():
    with dask_cluster() as c:
        yield c


def files(cache: Path) -> dict[str, bytes]:
    """Every file of a cache but metrics.json (timings and where tasks ran)."""
    return {p.name: p.read_bytes() for p in sorted(cache.iterdir()) if p.name != "metrics.json"}


def metrics(cache: Path) -> dict:
    return json.loads((cache / "metrics.json").read_text())


@pytest.fixture(scope="module")
def reference(sources) -> dict[str, dict[str, bytes]]:
    """Each case built by the local executor with one worker."""
    return {case: files(golden.build(case, sources, workers=1, executor="local")) for case in golden.CASES}


@pytest.mark.parametrize("case", golden.CASES)
def test_single_process_caches_match_the_writer_before_the_kit(sources, reference, case):
    if golden.versions() != EXPECTED["versions"]:
        pytest.skip(f"golden made with {EXPECTED['versions']}, this is {golden.versions()}")
    cache = sources / f"cache-{case}-1"
    assert golden.digest(cache, sources) == EXPECTED["cases"][case]


def test_a_late_decode_failure_repacks_the_shards_after_it(sources, reference):
    """The first folder's truncated JPEG passes the header probe and fails the full decode mid-cache:
    later shards are re-cut so every shard but the last holds shard_size records."""
    m = metrics(sources / "cache-pixels-multi-1")
    assert m["shards_repacked"] > 0 and 0 < m["shards_repacked"] < len(m["tasks"])
    manifest = json.loads(reference["pixels-multi"]["manifest.json"])
    sizes = [s["records"] for s in manifest["shards"]]
    assert all(n == manifest["shard_size"] for n in sizes[:-1]) and 0 < sizes[-1] <= manifest["shard_size"]
    reasons = manifest["quarantine"]["aggregate"]["by_reason"]
    assert reasons["truncated"] == 2 and reasons["decode-error"] == 2  # one of each per folder
    assert m["probe_s"] >= 0 and sum(t["records"] for t in m["tasks"]) == manifest["records"]


@pytest.mark.parametrize("how", [dict(workers=2, executor="local"), dict(workers=2, executor="process")],
                         ids=["threads-2", "process-2"])
@pytest.mark.parametrize("case", ["pixels-multi", "encoder-multi"])
def test_local_executors_give_the_reference_bytes(sources, reference, tmp_path, case, how):
    from warpdata.features.writer import build_cache

    out = tmp_path / "c"
    res = build_cache(golden.spec(case, sources, out), **how)
    assert res.status == "built" and files(out) == reference[case]
    m = metrics(out)
    assert m["executor"] == how["executor"] and m["workers"] == 2


@pytest.mark.parametrize("case", ["pixels-multi", "encoder-multi"])
def test_dask_cluster_gives_the_reference_bytes_and_loads_the_encoder_once_per_worker(
        sources, reference, tmp_path, cluster, case):
    from warpdata.features.writer import build_cache

    out = tmp_path / "c"
    build_cache(golden.spec(case, sources, out), workers=2, executor=f"dask://{cluster.address}")
    assert files(out) == reference[case]
    m = metrics(out)
    assert m["cluster"]["executor"] == "dask" and m["cluster"]["workers"] == 2
    ran = {t["worker"] for t in m["tasks"]}
    assert ran <= set(cluster.workers) and len(m["tasks"]) >= 4
    if case == "encoder-multi":
        # every task a worker ran found the encoder already loaded by that worker: no reload between tasks
        for w in ran:
            loads = {t["encoder_loads"] for t in m["tasks"] if t["worker"] == w}
            assert len(loads) == 1 and loads.pop() >= 1, (w, m["tasks"])


def test_ray_gives_the_reference_bytes_and_loads_the_encoder_once_per_worker(sources, reference, tmp_path):
    pytest.importorskip("ray", reason="ray is not installed here (the ray extra)")
    from warpdata.features.writer import build_cache

    out = tmp_path / "c"
    build_cache(golden.spec("encoder-multi", sources, out), workers=2, executor="ray")
    assert files(out) == reference["encoder-multi"]
    m = metrics(out)
    assert m["cluster"]["executor"] == "ray"
    for w in {t["worker"] for t in m["tasks"]}:  # Ray reuses its worker processes: one load each
        assert {t["encoder_loads"] for t in m["tasks"] if t["worker"] == w} == {1}


def test_tasks_that_ask_for_a_gpu_run_only_where_a_worker_offers_one(sources, reference, tmp_path, cluster):
    from warpdata.features.writer import build_cache

    out = tmp_path / "c"
    build_cache(golden.spec("encoder-multi", sources, out), workers=2, executor=f"dask://{cluster.address}",
                resources={"GPU": 1})
    m = metrics(out)
    assert {t["worker"] for t in m["tasks"]} == set(cluster.gpu_workers)
    assert m["cluster"]["resources"] == {"GPU": 1} and m["cluster"]["workers_offering"] == cluster.gpu_workers
    assert files(out) == reference["encoder-multi"]


def test_a_cuda_encoder_on_a_cluster_asks_for_a_gpu(sources, tmp_path, cluster):
    """caching_device = "cuda": the driver loads the encoder on its CPU (identity, fields) and the tasks
    go to the worker offering GPU, which resolves the device itself: no CUDA here, a typed error."""
    import dataclasses

    import torch
    from warpdata.core.errors import ConfigError
    from warpdata.features.writer import build_cache

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA: the task would succeed")
    spec = dataclasses.replace(golden.spec("encoder-multi", sources, tmp_path / "c"), caching_device="cuda")
    with pytest.raises(ConfigError, match="no CUDA device") as ei:
        build_cache(spec, workers=2, executor=f"dask://{cluster.address}")
    assert ei.value.exit_code == 78
    # a deterministic failure: no build directory is kept for a resume that would fail the same way
    assert not (tmp_path / "c").exists() and not [p for p in tmp_path.glob(".warp-tmp-build-*") if p.is_dir()]


def test_resources_no_worker_offers_fail_fast(sources, tmp_path, cluster):
    from warpdata.core.errors import ConfigError
    from warpdata.features.writer import build_cache

    with pytest.raises(ConfigError, match="TPU=2") as ei:
        build_cache(golden.spec("pixels-one", sources, tmp_path / "c"), workers=2,
                    executor=f"dask://{cluster.address}", resources={"TPU": 2})
    assert "--resources" in ei.value.hint and not (tmp_path / "c").exists()


# -- the CLI: [build] executor, its own LocalCluster, receipts --------------------------------------


def test_config_executor_dask_starts_its_own_local_cluster(cli, sources, reference, tmp_path):
    pytest.importorskip("distributed")
    out = tmp_path / "c"
    r = cli("etl", "--config", write_config(sources, out, 'executor = "dask"\nworkers = 2', "own.toml"), "--json")
    assert r.code == 0, r.err
    assert r.json()["metrics"]["executor"] == "dask"
    m = metrics(out)
    assert m["cluster"]["cluster"] == "LocalCluster" and m["cluster"]["layout"] == "processes"  # OWN_CLUSTER_LAYOUT, warp/etl/daskrunner.py
    assert files(out) == reference["pixels-multi"]


def test_warp_executor_env_and_the_flag(cli, sources, reference, tmp_path, monkeypatch):
    monkeypatch.setenv("WARP_EXECUTOR", "process")
    r = cli("etl", "--config", write_config(sources, tmp_path / "a", name="env.toml"), "--json", "-j", "2")
    assert r.code == 0, r.err
    assert r.json()["metrics"]["executor"] == "process"
    assert files(tmp_path / "a") == reference["pixels-multi"]
    r = cli("etl", "--config", write_config(sources, tmp_path / "b", name="flag.toml"), "--json", "--executor", "local")
    assert r.code == 0, r.err
    assert r.json()["metrics"]["executor"] == "local"


@pytest.mark.parametrize("build,key", [('executor = "mpi"', "build.executor"),
                                       ("resources = { GPU = -1 }", "build.resources")])
def test_bad_build_keys_name_themselves(cli, sources, tmp_path, build, key):
    r = cli("etl", "--config", write_config(sources, tmp_path / "c", build, "bad.toml"))
    assert r.code == 78 and key in r.err


def test_a_missing_dask_extra_names_the_pip_line(sources, tmp_path):
    cfg = write_config(sources, tmp_path / "c", name="nodask.toml")
    code = ("import sys; sys.modules['distributed'] = None; from warpdata.cli.app import main; "
            f"sys.exit(main(['etl', '--config', {str(cfg)!r}, '--executor', 'dask']))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 78, r.stderr
    assert "pip install 'dask" in r.stderr and not (tmp_path / "c").exists()


def test_kill_the_driver_then_rerun_reuses_the_receipted_parts(cli, sources, reference, tmp_path):
    out = tmp_path / "c"
    cfg = write_config(sources, out, "workers = 1", "kill.toml")
    for _attempt in range(5):
        kill_when(spawn_etl(cfg), lambda: len(list(tmp_path.glob(".warp-tmp-build-*/receipts/part-*.json"))) >= 2)
        if not out.exists():
            break
        import shutil

        shutil.rmtree(out)
    else:
        pytest.skip("the build finished before it could be killed, 5 times")
    done = len(list(tmp_path.glob(".warp-tmp-build-*/receipts/part-*.json")))
    assert done >= 2
    r = cli("etl", "--config", cfg, "--json")
    assert r.code == 0, r.err
    assert r.json()["metrics"]["shards_reused"] == done
    assert files(out) == reference["pixels-multi"]
    assert not list(tmp_path.glob(".warp-tmp-*"))  # the build directory and its lock are gone


def test_quarantine_is_exported_as_parquet(reference):
    import io

    import pyarrow.parquet as pq

    t = pq.read_table(io.BytesIO(reference["pixels-multi"]["quarantine.parquet"])).to_pylist()
    jsonl = [json.loads(line) for line in reference["pixels-multi"]["quarantine.jsonl"].decode().splitlines()]
    assert t == [{k: r[k] for k in ("run", "sample_id", "source", "reason", "message")} for r in jsonl]
    summary = pq.read_table(io.BytesIO(reference["pixels-multi"]["summary.parquet"])).to_pylist()
    assert summary[0]["scope"] == "aggregate" and summary[0]["total"] == summary[0]["kept"] + len(t)
