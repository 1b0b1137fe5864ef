"""A feature cache on object storage (docs/features-config.md, "Output on object storage"), on moto S3.

* built to ``s3://`` it holds the bytes a local build holds (every file but metrics.json), also when a
  late decode failure re-cuts the shards after it;
* request budget: per part one PUT of its bytes and one of its receipt, per re-cut shard one GET and
  one PUT, and a fixed overhead per run; reading costs 2 GETs to open and 1 GET per shard per node;
* a driver killed with kill -9 resumes from the store alone (an empty WARP_CACHE_DIR);
* an unreachable store is exit 75 with a hint that the rerun resumes;
* training straight from S3: ``FeatureCacheDataset`` in a DataLoader with worker processes;
* bytes that lie (a replaced shard, a longer object, a forged ``latest``) are typed errors.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
from support.featurecache import write_config
from support.processes import kill_when, spawn_etl

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("features_golden", ROOT / "tests/golden/features/make_golden.py")
golden = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(golden)


@pytest.fixture(scope="module")
def sources(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("fc-s3")
    golden.make_sources(root)
    return root


def files(cache: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(cache.iterdir()) if p.name != "metrics.json"}


@pytest.fixture(scope="module")
def reference(sources) -> dict[str, dict[str, bytes]]:
    """pixels-multi (a late decode failure re-cuts 3 shards) and pixels-one, built locally."""
    return {case: files(golden.build(case, sources, workers=1, executor="local"))
            for case in ("pixels-multi", "pixels-one")}


@pytest.fixture
def cache_dir(tmp_path, monkeypatch) -> Path:
    d = tmp_path / "warp-cache"
    monkeypatch.setenv("WARP_CACHE_DIR", str(d))
    return d


def stored(s3, prefix: str) -> dict[str, bytes]:
    """Every object under ``prefix/`` but metrics.json, by name."""
    got = s3.client.list_objects_v2(Bucket=s3.bucket, Prefix=prefix + "/").get("Contents", [])
    return {o["Key"][len(prefix) + 1:]: s3.client.get_object(Bucket=s3.bucket, Key=o["Key"])["Body"].read()
            for o in got if not o["Key"].endswith("/metrics.json")}


def version_prefix(res_path: str, s3) -> str:
    return res_path.split(f"s3://{s3.bucket}/", 1)[1]


@pytest.mark.parametrize("case", ["pixels-multi", "pixels-one"])
def test_a_cache_built_on_s3_holds_the_bytes_of_a_local_build_within_the_request_budget(
        sources, reference, s3, cache_dir, case):
    from warpdata.features.writer import build_cache

    url = s3.url(f"fc-{case}")
    s3.reset_counts()
    res = build_cache(golden.spec(case, sources, url), workers=2)
    assert res.status == "built" and res.path.startswith(url + "/v")
    sent = s3.requests()  # what the build sent, before this test reads anything back
    vp = version_prefix(res.path, s3)
    assert stored(s3, vp) == reference[case]
    assert s3.client.get_object(Bucket=s3.bucket, Key=f"fc-{case}/latest")["Body"].read() == \
        (vp.rsplit("/", 1)[1] + "\n").encode()
    # nothing of the build is left: no receipts, no parts, no staging copy
    keys = [o["Key"] for o in s3.client.list_objects_v2(Bucket=s3.bucket, Prefix=f"fc-{case}/").get("Contents", [])]
    assert not [k for k in keys if "/.warp-tmp-" in k]
    assert not list((cache_dir / "etl-staging").glob("*/*"))

    # the budget, per part and per re-cut shard, with a fixed overhead per run
    m = res.metrics
    tasks = m["tasks"]
    parts = sum(1 for t in tasks if t["records"])
    recut = m["shards_repacked"]
    wfs_puts = [r for r in sent if r["method"] == "PUT" and r["key"].endswith(".wfs")]
    receipt_puts = [r for r in sent if r["method"] == "PUT" and "/receipts/" in r["key"]]
    # (``latest`` is read once per run: the previous version, whose unchanged shards a build reuses)
    object_gets = [r for r in sent if r["method"] == "GET" and r["key"] and r["key"] != f"fc-{case}/latest"]
    assert len(wfs_puts) == parts + recut  # one upload per part, plus each re-cut shard once
    assert len(receipt_puts) == len(tasks)  # one create-only receipt per task
    assert len(object_gets) <= recut  # only parts re-cut after a late failure come back
    # the rest is per run, whatever the size: listings, the version's other files, latest, clean-up
    assert len(sent) - len(wfs_puts) - len(receipt_puts) - len(object_gets) <= 40
    # the manifest comes after every shard, and latest after the manifest
    puts = [r["key"] for r in sent if r["method"] == "PUT"]
    man = puts.index(f"{vp}/manifest.json")
    assert all(i < man for i, k in enumerate(puts) if k.endswith(".wfs"))
    assert puts[man + 1] == f"fc-{case}/latest"

    # the same build again: up to date from one listing and one manifest GET, nothing sent
    s3.reset_counts()
    again = build_cache(golden.spec(case, sources, url), workers=2)
    assert again.status == "up-to-date" and again.path == res.path
    assert s3.count("PUT") == 0 and s3.count("GET", f"{vp}/") == 1


@pytest.mark.parametrize("executor", ["process", "dask"])
def test_workers_in_other_processes_upload_the_same_bytes(sources, reference, s3, cache_dir, executor):
    """A process pool and a Dask LocalCluster (2 worker processes): each worker uploads what it built."""
    if executor == "dask":
        pytest.importorskip("distributed")
    from warpdata.features.writer import build_cache

    url = s3.url(f"fc-{executor}")
    res = build_cache(golden.spec("pixels-multi", sources, url), workers=2, executor=executor)
    assert stored(s3, version_prefix(res.path, s3)) == reference["pixels-multi"]
    assert res.metrics["executor"] == executor and res.metrics["shards_built"] == len(res.metrics["tasks"])


def test_shard_uploads_are_create_only(sources, reference, s3, cache_dir):
    from warpdata.features.writer import build_cache

    url = s3.url("fc-co")
    s3.reset_counts()
    build_cache(golden.spec("pixels-one", sources, url), workers=2)
    puts = [r for r in s3.requests("PUT", "fc-co/") if r["key"].endswith(".wfs") or "/receipts/" in r["key"]
            or r["key"].endswith("/manifest.json")]
    assert puts and all(r["if_none_match"] == "*" for r in puts), puts


def etl_config(sources: Path, out: str, build: str = "workers = 1", name: str = "fc-s3.toml") -> Path:
    return write_config(sources, out, build, name)


def test_cli_json_names_the_version_and_counts_shards(cli, sources, reference, s3, cache_dir):
    url = s3.url("fc-cli")
    r = cli("etl", "--config", etl_config(sources, "unused", name="cli.toml"), "--output", url, "--json")
    assert r.code == 0, r.err
    doc = r.json()
    assert doc["path"].startswith(url + "/v") and doc["status"] == "built"
    assert doc["shards_built"] == 7 and doc["shards_reused"] == 0 and doc["upload"]["uploaded"] > 0
    assert stored(s3, version_prefix(doc["path"], s3)) == reference["pixels-multi"]
    r = cli("etl", "--config", etl_config(sources, url, name="cli2.toml"), "--json")
    assert r.code == 0, r.err
    assert r.json()["status"] == "up-to-date" and r.json()["shards_reused"] == 7 and r.json()["shards_built"] == 0


def test_kill_the_driver_then_rerun_resumes_from_the_store_alone(cli, sources, reference, s3, cache_dir):
    url = s3.url("fc-kill")
    cfg = etl_config(sources, url, name="kill.toml")

    def receipts() -> list[str]:
        got = s3.client.list_objects_v2(Bucket=s3.bucket, Prefix="fc-kill/.warp-tmp-build-").get("Contents", [])
        return [o["Key"] for o in got if "/receipts/" in o["Key"]]

    env = {**os.environ, **s3.env, "WARP_CACHE_DIR": str(cache_dir)}
    for _attempt in range(5):
        kill_when(spawn_etl(cfg, env=env), lambda: len(receipts()) >= 2)
        if not s3.count("PUT", "fc-kill/latest"):
            break
        s3.client.delete_object(Bucket=s3.bucket, Key="fc-kill/latest")
        for o in s3.client.list_objects_v2(Bucket=s3.bucket, Prefix="fc-kill/").get("Contents", []):
            s3.client.delete_object(Bucket=s3.bucket, Key=o["Key"])
        s3.reset_counts()
    else:
        pytest.skip("the build finished before it could be killed, 5 times")
    done = len(receipts())
    assert done >= 2
    listed = s3.client.list_objects_v2(Bucket=s3.bucket, Prefix="fc-kill/v").get("Contents", [])
    assert not any(o["Key"].endswith("/manifest.json") for o in listed)  # no visible half version
    shutil.rmtree(cache_dir)  # nothing local survives: the store alone is the journal
    s3.reset_counts()
    r = cli("etl", "--config", cfg, "--json", "-j", "2")
    assert r.code == 0, r.err
    doc = r.json()
    assert doc["shards_reused"] == done and doc["shards_built"] == 7 - done
    vp = version_prefix(doc["path"], s3)
    # a reused part is not sent again (re-cut shards after the late failure are written once more)
    first_puts = [q["key"] for q in s3.requests("PUT", f"{vp}/") if q["key"].endswith(".wfs")]
    assert len(first_puts) <= 7 - done + doc["metrics"]["shards_repacked"]
    assert stored(s3, vp) == reference["pixels-multi"]
    assert not receipts()


def test_an_unreachable_store_is_a_temporary_failure(cli, sources, s3, cache_dir, monkeypatch):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    for var in ("WARP_S3_ENDPOINT", "AWS_ENDPOINT_URL"):
        monkeypatch.setenv(var, f"http://127.0.0.1:{port}")
    monkeypatch.setenv("WARP_S3_RETRIES", "1")
    r = cli("etl", "--config", etl_config(sources, s3.url("fc-dead"), name="dead.toml"))
    assert r.code == 75, r.err
    assert "rerun" in r.err and "Traceback" not in r.err
    assert not list((cache_dir / "etl-staging").glob("*/*"))


# -- training straight from S3 --------------------------------------------------------------------

@pytest.fixture
def built(sources, reference, s3, cache_dir):
    from warpdata.features.writer import build_cache

    url = s3.url("fc-read")
    res = build_cache(golden.spec("pixels-multi", sources, url), workers=2)
    return url, res


def test_a_dataloader_with_workers_reads_the_s3_cache_fetching_each_shard_once(sources, built, s3, cache_dir):
    import torch
    from torch.utils.data import DataLoader
    from warpdata.features.reader import ShardCache
    from warpdata.features.torch import FeatureCacheDataset

    url, res = built
    vp = version_prefix(res.path, s3)
    local = ShardCache(sources / "cache-pixels-multi-1")
    s3.reset_counts()
    ds = FeatureCacheDataset(url)
    loader = DataLoader(ds, batch_size=4, num_workers=2, shuffle=False)
    got = {k: torch.cat([b[k] for b in loader]) for k in ds.fields}
    want = local.get_batch(range(len(local)))
    assert len(ds) == len(local) == len(got["caption_len"])
    for k in ds.fields:
        assert np.array_equal(got[k].numpy(), want[k]), k
    # 2 GETs to open (latest, manifest), then each shard once for the node: the workers share the blob cache
    nshards = len(res.manifest["shards"])
    assert s3.count("GET", "fc-read/latest") == 1 and s3.count("GET", f"{vp}/manifest.json") == 1
    assert s3.count("GET", f"{vp}/shard-") == nshards
    assert s3.count() == 2 + nshards
    ds.cache.close()

    # opened again: the shards come from the blob cache, hashed when they landed
    s3.reset_counts()
    with ShardCache(url, verify="full") as again:
        assert np.array_equal(again.get(len(again) - 1)["caption"], local.get(len(local) - 1)["caption"])
        assert again.verify_all() == []
    assert s3.count() == 2


def test_shard_downloads_survive_throttling(sources, built, s3, cache_dir, monkeypatch):
    """Every other request answered 503 SlowDown: each shard is still fetched whole and verified,
    each fault retried once (the store's retry policy, as for every other read)."""
    from support.httpserve import FaultProxy
    from warpdata.features.reader import ShardCache

    url, res = built
    local = ShardCache(sources / "cache-pixels-multi-1")
    with FaultProxy(s3.endpoint, fail_every=2) as proxy:
        for var in ("WARP_S3_ENDPOINT", "AWS_ENDPOINT_URL"):
            monkeypatch.setenv(var, proxy.url)
        with ShardCache(url) as c:
            got = c.get_batch(range(len(c)))
            assert c.verify_all() == []
        assert proxy.faults >= len(res.manifest["shards"])
    want = local.get_batch(range(len(local)))
    for k in want:
        assert np.array_equal(got[k], want[k]), k


def test_the_version_url_opens_too_and_pickles_without_the_connection(built, s3, cache_dir):
    import pickle

    from warpdata.features.reader import ShardCache

    url, res = built
    with ShardCache(res.path) as c:
        assert len(c) == res.manifest["records"]
        c2 = pickle.loads(pickle.dumps(c))
        assert c2.get(0)["caption_len"] == c.get(0)["caption_len"]
        c2.close()


def test_big_batch_loader_from_s3(built, cache_dir):
    from warpdata.features.torch import BigBatchLoader

    url, res = built
    loader = BigBatchLoader(url, micro_batch_size=2, accumulation_steps=2, num_workers=2, drop_last=False)
    seen = sum(len(step.batch["caption_len"]) for step in loader)
    # each record as often as its directory's num_repeats, from the one stored copy
    assert seen == sum(src["records"] * src["num_repeats"] for src in res.manifest["sources"]) > len(loader.dataset)


# -- bytes that lie -------------------------------------------------------------------------------

def test_a_replaced_shard_is_caught_by_its_hash(built, s3, cache_dir):
    from warpdata.core.errors import BlobCorruptedError
    from warpdata.features.reader import ShardCache

    url, res = built
    key = f"{version_prefix(res.path, s3)}/shard-00001.wfs"
    data = bytearray(s3.client.get_object(Bucket=s3.bucket, Key=key)["Body"].read())
    data[-1] ^= 0xFF
    s3.client.put_object(Bucket=s3.bucket, Key=key, Body=bytes(data))
    with ShardCache(url) as c, pytest.raises(BlobCorruptedError, match="shard-00001.wfs"):
        c.get(res.manifest["shards"][0]["records"])
    assert not list((cache_dir / "blobs").glob(f"*/{res.manifest['shards'][1]['sha256']}"))


def test_an_object_longer_than_the_manifest_says_stops_the_read(built, s3, cache_dir):
    from warpdata.core.errors import DataError
    from warpdata.features.reader import ShardCache

    url, res = built
    key = f"{version_prefix(res.path, s3)}/shard-00000.wfs"
    data = s3.client.get_object(Bucket=s3.bucket, Key=key)["Body"].read()
    s3.client.put_object(Bucket=s3.bucket, Key=key, Body=data + b"\0" * (3 << 20))
    with ShardCache(url) as c, pytest.raises(DataError, match="holds more"):
        c.get(0)


@pytest.mark.parametrize("pointer", [b"../../etc\n", b"v20260101-zzzz\n", b"x" * 5000])
def test_a_forged_latest_pointer_is_refused(built, s3, cache_dir, pointer):
    from warpdata.core.errors import DataError
    from warpdata.features.reader import ShardCache

    url, _ = built
    s3.client.put_object(Bucket=s3.bucket, Key="fc-read/latest", Body=pointer)
    with pytest.raises(DataError, match="latest names"):
        ShardCache(url)


def test_an_edited_manifest_is_refused(built, s3, cache_dir):
    from warpdata.core.errors import DataError
    from warpdata.features.reader import ShardCache

    url, res = built
    key = f"{version_prefix(res.path, s3)}/manifest.json"
    doc = json.loads(s3.client.get_object(Bucket=s3.bucket, Key=key)["Body"].read())
    doc["records"] -= 1
    doc["shards"][0]["records"] -= 1
    s3.client.put_object(Bucket=s3.bucket, Key=key, Body=json.dumps(doc).encode())
    with pytest.raises(DataError, match="content_sha256"):
        ShardCache(url)


def test_a_prefix_without_a_cache_names_what_it_expected(s3, cache_dir):
    from warpdata.core.errors import MissingInputError
    from warpdata.features.reader import ShardCache

    with pytest.raises(MissingInputError, match="neither a feature cache"):
        ShardCache(s3.url("nothing-here"))


# -- warp publish --from s3://… -------------------------------------------------------------------

def test_publish_from_the_s3_cache_is_the_version_a_local_publish_makes(cli, sources, built, s3, cache_dir):
    from warpdata.features.reader import ShardCache

    url, res = built
    vp = version_prefix(res.path, s3)
    nshards = len(res.manifest["shards"])
    s3.reset_counts()
    r = cli("publish", "img/caps", "--from", url, "--json", "--store", s3.url("store"))
    assert r.code == 0, r.err
    got = r.json()
    assert got["blobs_uploaded"] > 0
    # each shard read once from the cache's version (into the blob cache), never listed or HEADed
    assert s3.count("GET", f"{vp}/shard-") == nshards and s3.count("HEAD", f"{vp}/") == 0
    assert s3.count("GET", f"{vp}/metrics.json") == 0
    # the same files as the local build: the same blobs and manifest, hence the same version
    r = cli("publish", "img/caps", "--from", sources / "cache-pixels-multi-1", "--json", "--store", s3.url("store2"))
    assert r.code == 0, r.err
    assert r.json()["version_hash"] == got["version_hash"]

    # a machine that has the shards in its blob cache (it trained from them) fetches none again
    s3.reset_counts()
    r = cli("publish", "img/caps", "--from", url, "--json", "--store", s3.url("store3"))
    assert r.code == 0, r.err
    assert r.json()["version_hash"] == got["version_hash"] and s3.count("GET", f"{vp}/shard-") == 0

    local = ShardCache(sources / "cache-pixels-multi-1")
    with ShardCache("img/caps", store=s3.url("store")) as pub:
        assert len(pub) == len(local)
        for i in (0, len(local) // 2, len(local) - 1):
            assert np.array_equal(pub.get(i)["pixels"], local.get(i)["pixels"])


def test_publish_from_an_s3_prefix_without_a_cache_fails_typed(cli, s3, cache_dir, monkeypatch):
    monkeypatch.setenv("WARP_STORE", s3.url("store"))
    r = cli("publish", "img/none", "--from", s3.url("nothing"))
    assert r.code != 0 and "neither a feature cache" in r.err and "Traceback" not in r.err


def test_a_cache_built_from_s3_sources_holds_the_bytes_of_a_local_build(cli, sources, s3, cache_dir, tmp_path):
    """[[directory]] paths on s3:// (they were read as 's3:/…', exit 66): the same cache bytes as the
    local folders give, and the run's local copy of the sources is gone afterwards."""
    for p in sorted(sources.rglob("*")):
        rel = p.relative_to(sources).as_posix()
        if p.is_file() and rel.startswith(("a/", "b/")):
            s3.client.put_object(Bucket=s3.bucket, Key=f"src/{rel}", Body=p.read_bytes())
    r = cli("etl", "--config", write_config(sources, tmp_path / "local-cache", name="fc-local.toml"), "--json", "-j", "1")
    assert r.code == 0, r.err
    local_files = files(Path(r.json()["path"]))
    cfg = write_config(sources, tmp_path / "s3-cache", name="fc-s3src.toml")
    text = cfg.read_text().replace('path = "a/media"', f'path = "{s3.url("src/a/media")}"')
    cfg.write_text(text.replace('path = "b/media"', f'path = "{s3.url("src/b/media")}"'))
    r = cli("etl", "--config", cfg, "--json", "-j", "1")
    assert r.code == 0, r.err
    got = files(Path(r.json()["path"]))
    # every file alike, the quarantine's too: its records name each rejected file relative to its
    # source root (docs/formats/feature-shard.md), wherever the sources lie
    assert got == local_files
    quarantined = [json.loads(line) for line in got["quarantine.jsonl"].splitlines()]
    assert quarantined and not any(q["source"].startswith(("s3:", "/")) for q in quarantined), quarantined
    assert [d["path"] for d in r.json()["sources"]] == [s3.url("src/a/media"), s3.url("src/b/media")]
    # the version is the content's: the S3 sources' fingerprint is the folders'
    assert json.loads(got["manifest.json"])["fingerprint"] == json.loads(local_files["manifest.json"])["fingerprint"]
    # nothing of the run's copy is left, not even the folders it was in
    assert not (cache_dir / "etl-source").exists(), sorted(cache_dir.rglob("*"))
