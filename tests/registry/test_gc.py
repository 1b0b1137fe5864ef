"""Store garbage collection (issue 39 item 5; docs/formats/registry.md, "Garbage collection").

Two versions of a chunked tensor warehouse (16 photos at 128 px, 8 a shard, one stored chunk per
sample image; version 2 relabels, replaces and appends one photo each) share most chunks. Dropping
version 1 and collecting with no grace deletes exactly the chunks and files only version 1 used;
version 2 still reads whole. Run on a local folder store and on moto S3, with real publishes.
"""

from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path

import numpy as np
import pytest
from warpdata.core.errors import (
    DataError,
    InfrastructureError,
    LockTimeoutError,
    ManifestCorruptedError,
    ReadOnlyStoreError,
    UsageError,
)
from warpdata.publishing.publish import PublishRequest, publish
from warpdata.registry import gc
from warpdata.registry.manifest import blob_key
from warpdata.registry.store import Store
from warpdata.sampledata.detection import edit, generate

IMAGE = 128 * 128 * 3  # bytes of one sample image: the chunk target, one image a chunk


@pytest.fixture(scope="module")
def versions(tmp_path_factory):
    """Two warehouse versions built with `warp etl` (the second a 3-photo edit of the first)."""
    from support.warehouses import etl_version

    base = tmp_path_factory.mktemp("gcwh")
    src = base / "coco"
    generate(src, count=16, seed=3, min_side=64, max_side=96, broken=False)

    def etl(name: str) -> str:
        return etl_version(src, base / name, size=128, max_boxes=4, shards="shard_samples = 8")

    v1 = etl("wh1")
    edit(src, relabel=1, replace=1, append=1, seed=5)
    return v1, etl("wh2")


@pytest.fixture(params=["local", "s3"])
def store_url(request, tmp_path):
    if request.param == "local":
        return str(tmp_path / "store")
    return request.getfixturevalue("s3").url("warp")


def _publish(store: Store, path: str, **kw):
    return publish(PublishRequest("ws/wh", from_paths=[path], chunk_target=IMAGE, **kw), store=store)


def _stored(store: Store, version: str) -> set[str]:
    return gc.referenced_hashes(store.get_manifest("ws/wh", version))


def _blobs(store: Store) -> set[str]:
    return {k.rsplit("/", 1)[-1] for k, _n, _t in store.list_objects("blobs/")}


def _reads_whole(store_url: str, tmp_path: Path, monkeypatch, cli) -> None:
    """Every sample of latest reads, every shard verifies, and `warp inspect --verify` passes."""
    import warpdata.warehouse as wh

    monkeypatch.setenv("WARP_CACHE_DIR", str(tmp_path / f"cache-{time.monotonic_ns()}"))
    with wh.open("ws/wh", store=store_url) as w:
        assert len(w) == 17
        got = w.batch(np.arange(len(w)))
        assert all(len(v) == 17 for v in got.values())
        assert len(w.verify()) == w.num_shards
    monkeypatch.setenv("WARP_STORE", store_url)
    r = cli("inspect", "ws/wh", "--verify")
    assert r.code == 0, r.err


def test_dropping_v1_deletes_exactly_the_chunks_only_v1_used(versions, store_url, tmp_path, monkeypatch, cli,
                                                            request):
    v1, v2 = versions
    store = Store(store_url)
    r1 = _publish(store, v1)
    r2 = _publish(store, v2)
    m2 = store.get_manifest("ws/wh", r2.version_hash)
    assert any(s.chunks for a in m2.artifacts.values() for s in a.shards)
    only_v1 = _stored(store, r1.version_hash) - _stored(store, r2.version_hash)
    shared = _stored(store, r1.version_hash) & _stored(store, r2.version_hash)
    assert only_v1 and len(shared) > len(only_v1)  # the versions share most chunks
    before = _blobs(store)

    s3 = request.getfixturevalue("s3") if store_url.startswith("s3://") else None
    if s3:
        s3.reset_counts()
    res = gc.collect(Store(store_url), drop=[f"ws/wh@{r1.version_hash[:12]}"], grace=0)
    if s3:  # gc's cost: LISTs, one GET per manifest it marks, the marker, the deletions
        lists = [r for r in s3.requests("GET") if "list-type" in r["query"]]
        # the --drop's version prefix; datasets/, blobs/, datasets/ again before the first deletion
        assert len(lists) == 4
        assert s3.count("GET", "warp/datasets/ws/wh/versions/") == 1  # version 2's manifest only
        assert s3.count("GET", "warp/datasets/ws/wh/latest.json") == 1  # the --drop is not latest
        assert s3.count("GET", "warp/gc/") == 1 and s3.count("PUT", "warp/gc/sweep.json") == 2
        assert s3.count("PUT") == 2 and s3.count("GET", "warp/blobs/") == 0
        assert s3.count("HEAD") == 1  # the dropped version's manifest exists
        assert s3.count("DELETE") == len(only_v1) + 1  # the blobs and version 1's manifest
        assert s3.count() == len(lists) + 1 + 1 + 1 + 2 + 1 + len(only_v1) + 1
    assert set(res.deleted) == only_v1 == before - _blobs(store)
    assert res.blobs_deleted == len(only_v1) and res.versions_kept == 1 and res.blobs_missing == 0
    assert res.versions_dropped == [f"ws/wh@{r1.version_hash}"]
    assert not store.has_manifest("ws/wh", r1.version_hash)
    _reads_whole(store_url, tmp_path, monkeypatch, cli)

    again = gc.collect(Store(store_url), grace=0)  # a second run finds nothing more
    assert again.blobs_deleted == 0 and again.blobs_referenced == len(_stored(store, r2.version_hash))


def test_an_aborted_publishs_blob_is_kept_while_young_and_deleted_once_old(store_url):
    store = Store(store_url)
    data = b"left by a publish killed before its manifest"
    h = hashlib.sha256(data).hexdigest()
    store.put_blob(h, data)
    kept = gc.collect(store, grace=3600)
    assert (kept.blobs_deleted, kept.blobs_young, kept.bytes_young) == (0, 1, len(data))
    assert store.has_blob(h)
    later = time.time() + 2 * 3600  # the same listing, two hours on
    gone = gc.collect(store, grace=3600, now=later)
    assert gone.deleted == [h] and (gone.blobs_young, gone.bytes_deleted) == (0, len(data))
    assert not store.has_blob(h)


def test_dry_run_deletes_nothing_and_reports_the_same_counts(versions, store_url):
    v1, v2 = versions
    store = Store(store_url)
    r1 = _publish(store, v1)
    _publish(store, v2)
    before = sorted(store.list_objects(""))
    drop = [f"ws/wh@{r1.version_hash}"]
    dry = gc.collect(store, drop=drop, grace=0, dry_run=True)
    assert sorted(store.list_objects("")) == before  # no marker, no manifest dropped, no blob deleted
    real = gc.collect(store, drop=drop, grace=0)
    fields = ("versions_kept", "versions_dropped", "blobs_listed", "bytes_listed", "blobs_referenced",
              "blobs_deleted", "bytes_deleted", "blobs_young", "deleted")
    assert [getattr(dry, f) for f in fields] == [getattr(real, f) for f in fields]
    assert dry.to_dict()["blobs_to_delete"] == real.to_dict()["blobs_deleted"] > 0


def test_dropping_the_version_latest_points_at_is_refused(versions, tmp_path):
    v1, _v2 = versions
    store = Store(str(tmp_path / "store"))
    r1 = _publish(store, v1)
    before = sorted(store.list_objects(""))
    for spec in (f"ws/wh@{r1.version_hash}", f"ws/wh@{r1.version_hash[:8]}", "ws/wh@latest"):
        with pytest.raises(UsageError, match="latest"):
            gc.collect(store, drop=[spec], grace=0)
    with pytest.raises(UsageError, match="WS/NAME@VERSION"):
        gc.collect(store, drop=["ws/wh"], grace=0)
    assert sorted(store.list_objects("")) == before and gc.read_marker(store) is None


def test_a_corrupt_manifest_stops_gc_before_any_deletion(versions, store_url):
    v1, v2 = versions
    store = Store(store_url)
    _publish(store, v1)
    store.put_blob(hashlib.sha256(b"orphan").hexdigest(), b"orphan")  # would go, were marking complete
    bad = "0" * 64
    key = f"datasets/ws/other/versions/{bad}.json"
    store.put_object(key, b'{"kind": "dataset", "truncat')
    before = sorted(k for k, _n, _t in store.list_objects("blobs/"))
    with pytest.raises(ManifestCorruptedError, match="deleted nothing") as e:
        gc.collect(store, grace=0)
    assert key in str(e.value) and e.value.exit_code == 65 and e.value.details["key"] == key
    assert sorted(k for k, _n, _t in store.list_objects("blobs/")) == before
    marker = gc.read_marker(store)
    assert marker is not None and not marker.running  # publishes are not left waiting
    # a --drop in the refused run is not carried out either
    _publish(store, v2)
    stored = store.list_versions("ws/wh")
    old = next(v for v in stored if v != store.read_latest("ws/wh").version_hash)
    with pytest.raises(ManifestCorruptedError):
        gc.collect(store, drop=[f"ws/wh@{old}"], grace=0)
    assert store.list_versions("ws/wh") == stored
    # the way out: drop that version, and the run completes
    res = gc.collect(store, drop=[f"ws/other@{bad}", f"ws/wh@{old}"], grace=0)
    assert res.blobs_deleted > 1 and hashlib.sha256(b"orphan").hexdigest() in res.deleted


def test_a_manifest_written_while_gc_marks_protects_its_blobs(versions, store_url, tmp_path):
    """A publish that found v2's shared chunks present and writes its manifest after gc listed the
    manifests once: gc lists them again before its first deletion."""
    v1, v2 = versions
    scratch = Store(str(tmp_path / "scratch"))
    r2 = _publish(scratch, v2)
    m2 = scratch.get_manifest("ws/wh", r2.version_hash)
    store = Store(store_url)
    r1 = _publish(store, v1, set_latest=False)
    for h in gc.referenced_hashes(m2) - _blobs(store):  # what the publish uploaded: v2's new chunks
        store.put_blob(h, scratch.get_blob(h))
    only_v1 = _stored(store, r1.version_hash) - gc.referenced_hashes(m2)
    res = gc.collect(store, drop=[f"ws/wh@{r1.version_hash}"], grace=0,
                     before_sweep=lambda: store.put_manifest(m2))
    assert set(res.deleted) == only_v1 and res.blobs_missing == 0
    assert store.missing_blobs(sorted(gc.referenced_hashes(m2))) == []


def test_a_sweep_between_a_publishs_check_and_its_manifest_is_repaired(versions, store_url, tmp_path,
                                                                        monkeypatch, cli):
    """The race of docs/formats/registry.md, "Garbage collection": version 2's publish finds the chunks
    it shares with version 1 present; a gc then drops version 1 and deletes them (version 2 has no
    manifest yet); the publish sees the sweep's marker after writing its manifest, checks its blobs
    again and uploads the deleted ones before moving latest."""
    v1, v2 = versions
    store = Store(store_url)
    r1 = _publish(store, v1, set_latest=False)
    swept: list[gc.GcResult] = []
    real_put = store.put_manifest

    def put_manifest_after_a_sweep(manifest):
        swept.append(gc.collect(Store(store_url), drop=[f"ws/wh@{r1.version_hash}"], grace=0))
        return real_put(manifest)

    monkeypatch.setattr(store, "put_manifest", put_manifest_after_a_sweep)
    r2 = _publish(store, v2)
    needed = _stored(store, r2.version_hash)
    deleted_needed = set(swept[0].deleted) & needed
    assert deleted_needed  # the race happened: shared chunks were deleted under the publish
    assert r2.blobs_reuploaded == len(deleted_needed)
    assert store.missing_blobs(sorted(needed)) == []
    assert store.read_latest("ws/wh").version_hash == r2.version_hash
    _reads_whole(store_url, tmp_path, monkeypatch, cli)


def test_a_publishs_cost_of_the_protocol_is_one_marker_get(versions, s3):
    v1, v2 = versions
    store = Store(s3.url("warp"))
    s3.reset_counts()
    r = _publish(store, v1)
    assert r.blobs_reuploaded == 0 and s3.count("GET", "warp/gc/") == 1  # a 404: no gc ever ran
    lists = len([q for q in s3.requests("GET") if "list-type" in q["query"]])
    gc.collect(store, grace=3600)  # finished just now: within the clock margin of the next publish
    s3.reset_counts()
    r = _publish(store, v2)
    assert r.blobs_reuploaded == 0 and s3.count("GET", "warp/gc/") == 1
    # the sweep may have overlapped (by the margin): the blobs are checked once more, one LIST
    assert len([q for q in s3.requests("GET") if "list-type" in q["query"]]) == lists + 1


def test_publish_waits_for_an_unfinished_sweep_and_gives_up_with_exit_75(versions, tmp_path, monkeypatch):
    v1, v2 = versions
    store = Store(str(tmp_path / "store"))
    _publish(store, v1, set_latest=False)
    sweep_id, started, token = gc._begin(store)  # a gc elsewhere, still sweeping
    real_put = store.put_manifest
    victims: list[str] = []

    def put_manifest_while_it_deletes(manifest):  # the sweep deletes a shared chunk meanwhile
        victims.append(sorted(gc.referenced_hashes(manifest) & _blobs(store))[0])
        store.delete_object(blob_key(victims[0]))
        return real_put(manifest)

    monkeypatch.setattr(store, "put_manifest", put_manifest_while_it_deletes)
    with pytest.raises(InfrastructureError, match="gc/sweep.json") as e:
        publish(PublishRequest("ws/wh", from_paths=[v2], chunk_target=IMAGE), store=store, gc_wait=0)
    assert e.value.exit_code == 75 and "latest was not moved" in str(e.value)
    assert store.read_latest("ws/wh") is None  # latest is not moved while blobs may be missing
    assert store.has_blob(victims[0])  # what the sweep deleted so far was uploaded again before giving up
    monkeypatch.setattr(store, "put_manifest", real_put)

    naps: list[float] = []

    def nap(seconds: float) -> None:  # the sweep finishes while the publish waits
        naps.append(seconds)
        gc._finish(store, sweep_id, started, token, 1)

    done = gc.wait_for_sweep(store, gc.read_marker(store), timeout=60, sleep=nap)
    assert len(naps) == 1 and not done.running and done.sweep_id == sweep_id
    # the rerun: its manifest is stored, the sweep finished moments ago: blobs checked, latest moved
    store.delete_object(blob_key(victims[0]))
    r = publish(PublishRequest("ws/wh", from_paths=[v2], chunk_target=IMAGE), store=store)
    assert r.already_published and r.blobs_reuploaded == 1 and store.has_blob(victims[0])
    assert store.read_latest("ws/wh").version_hash == r.version_hash


def test_a_sweep_whose_process_is_gone_is_not_waited_for(tmp_path):
    import json
    import socket
    import subprocess
    import sys

    store = Store(str(tmp_path / "store"))
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True, check=True).stdout.strip()
    doc = {"kind": "warp-gc-sweep", "id": "dead", "host": socket.gethostname(), "pid": int(dead),
           "started": time.time(), "finished": None}
    assert store.swap_object(gc.MARKER_KEY, json.dumps(doc).encode(), None)
    marker = gc.read_marker(store)
    assert marker.running and marker.abandoned(time.time())
    assert gc.wait_for_sweep(store, marker, timeout=0, sleep=pytest.fail) is not None
    # and the next gc takes it over
    res = gc.collect(store)
    assert res.blobs_deleted == 0 and not gc.read_marker(store).running


def test_one_sweep_at_a_time(tmp_path):
    store = Store(str(tmp_path / "store"))
    gc._begin(store)  # this process: alive, so not abandoned
    with pytest.raises(LockTimeoutError, match="another warp gc") as e:
        gc.collect(store)
    assert e.value.exit_code == 75


def test_a_corrupt_marker_is_a_data_error_naming_it(tmp_path):
    store = Store(str(tmp_path / "store"))
    store.put_object(gc.MARKER_KEY, b"not json")
    with pytest.raises(DataError, match="gc/sweep.json"):
        gc.read_marker(store)


def test_a_read_only_store_refuses():
    with pytest.raises(ReadOnlyStoreError):
        gc.collect(Store("https://example.invalid/warp"), grace=0)


@pytest.mark.parametrize("spec, seconds", [("24h", 86400), ("30m", 1800), ("7d", 604800), ("0", 0), ("45s", 45),
                                           ("1.5h", 5400)])
def test_grace_durations(spec, seconds):
    assert gc.parse_grace(spec) == seconds


@pytest.mark.parametrize("spec", ["5", "-1h", "1w", "", "h"])
def test_grace_without_a_unit_is_refused(spec):
    with pytest.raises(UsageError):
        gc.parse_grace(spec)


def test_local_listing_skips_writer_temporaries(tmp_path):
    store = Store(str(tmp_path / "store"))
    data = b"x"
    h = hashlib.sha256(data).hexdigest()
    store.put_blob(h, data)
    tmp = Path(store.url_of(blob_key(h))).parent / ".warp-tmp-123-abc"
    tmp.write_bytes(b"half")
    os.utime(tmp, (0, 0))
    assert [k for k, _n, _t in store.list_objects("blobs/")] == [blob_key(h)]
