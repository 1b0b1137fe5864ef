"""Receipts at scale on object storage (docs/formats/receipts.md): written in the background as
shards finish, 16 at a time, every one in place when the writer closes; on resume one listing of
the journal, then the receipts read concurrently: one GET each, never a listing per receipt."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import unquote

import pytest
from warpdata.etl.receipts import RECEIPT_CONCURRENCY, Journal

pytestmark = pytest.mark.s3

N = 3 * RECEIPT_CONCURRENCY + 5


def test_receipts_are_written_in_the_background_and_listed_once_on_resume(s3):
    base = s3.url("wh/.warp-tmp-build-0123456789ab")
    s3.reset_counts()
    with Journal(base).writer() as out:
        for i in range(N):
            out.add(f"shard-{i:05d}", f"{i:064x}", f"{i + 1:064x}", 100 + i, {"index": i})
    assert s3.count("PUT", "wh/.warp-tmp-build-0123456789ab/receipts/") == N  # one create-only PUT each
    s3.reset_counts()
    got = Journal(base).load_all()
    assert sorted(got) == [f"shard-{i:05d}" for i in range(N)]
    assert all(got[f"shard-{i:05d}"]["size_bytes"] == 100 + i for i in range(N))
    listings = [r for r in s3.requests("GET") if r["key"] == "" or "list-type" in r["query"]]
    assert len(listings) == 1, listings
    assert s3.count("GET", "wh/.warp-tmp-build-0123456789ab/receipts/shard-") == N


def test_a_failed_receipt_write_surfaces_when_the_writer_closes(s3):
    from warpdata.core.errors import InfrastructureError

    journal = Journal(s3.url("wh/.warp-tmp-build-ba9876543210"))
    out = journal.writer()
    out.add("shard-00000", "0" * 64, "1" * 64, 1, {})
    out.close()
    # the same shard with other content: a second driver disagreeing about a task's bytes is a bug
    out = journal.writer()
    out.add("shard-00000", "0" * 64, "2" * 64, 1, {})
    with pytest.raises(Exception) as ei:
        out.close()
    assert "already exists with different content" in str(ei.value)
    assert not isinstance(ei.value, InfrastructureError)


def test_a_worker_without_the_drivers_staging_directory_uploads_its_shard(s3, tmp_path):
    """A build worker on another machine than the driver: the staging directory its task names is
    not there, yet the shard reaches the store with the bytes a local build gives."""
    from warpdata.sampledata.detection import generate
    from warpdata.warehouse import etl as wetl
    from warpdata.warehouse import labels as wlabels
    from warpdata.warehouse.transform import TransformSpec
    from warpdata.warehouse.validate import probe_all

    d = tmp_path / "coco"
    generate(d, count=4, seed=2, min_side=64, max_side=96)
    ls = wlabels.load("coco", d, ("annotations.json",), "images", (), 0.0)
    valid = [o.sample for o in probe_all(ls.records, workers=1, tolerance=0.5, min_box=0.0, max_boxes=8,
                                         overflow="truncate") if o.sample is not None]
    spec = TransformSpec(32, 32)
    (here,) = wetl.plan(valid, len(valid), spec, 8, tmp_path / "staging")
    (tmp_path / "staging").mkdir()
    local = wetl.build_shard(here)
    (there,) = wetl.plan(valid, len(valid), spec, 8, tmp_path / "not-on-this-machine")
    there.upload = s3.url("wh/v1/shard-00000.twh1")
    res = wetl.build_shard(there)
    got = s3.client.get_object(Bucket=s3.bucket, Key="wh/v1/shard-00000.twh1")["Body"].read()
    assert res.sha256 == local.sha256 and len(got) == res.size_bytes
    assert got == Path(here.path).read_bytes()  # the bytes of the build on the driver's machine
    assert not (tmp_path / "not-on-this-machine").exists()


def _tiles_config(d: Path, out: str) -> Path:
    import numpy as np

    np.arange(64 * 24, dtype="<u2").tofile(d / "in.raw")
    p = d / "tiles.toml"
    p.write_text(f'[source]\nformat = "raw"\npath = "in.raw"\nshape = [64, 24]\ndtype = "u16"\n'
                 f'[output]\npath = "{out}"\n[tiles]\nchunks = [4, 8]\nshards = "none"\n'
                 f'[build]\ntask_mb = 0.0005\n')
    return p


def _pipeline_config(pipeline: str, tmp_path: Path, out: str) -> Path:
    from support.featurecache import write_config
    from support.warehouses import coco_config
    from warpdata.sampledata import captions
    from warpdata.sampledata.detection import generate

    d = tmp_path / pipeline
    if pipeline == "warehouse":
        generate(d, count=12, seed=4, min_side=48, max_side=80)
        return coco_config(d, out)
    if pipeline == "feature cache":
        captions.generate(d / "a", count=12, seed=1)
        captions.generate(d / "b", count=10, seed=2)
        return write_config(d, out)
    d.mkdir()
    return _tiles_config(d, out)


@pytest.mark.parametrize(("pipeline", "executor"), [("warehouse", "local"), ("feature cache", "local"),
                                                    ("tiles", "local"), ("tiles", "process")])
def test_every_pipeline_writes_one_receipt_per_task_and_lists_the_journal_once(
        cli, s3, tmp_path, monkeypatch, pipeline, executor):
    """The same driver for the three (warp/etl/driver.py): one create-only PUT per task, handed to the
    background writer, one listing of the journal, and the counts in the run's report."""
    monkeypatch.setenv("WARP_CACHE_DIR", str(tmp_path / "cache"))
    cfg = _pipeline_config(pipeline, tmp_path, s3.url("out"))
    s3.reset_counts()
    r = cli("etl", "--config", cfg, "--json", "--executor", executor, "-j", "2")
    assert r.code == 0, r.err
    rep = r.json()["receipts"]
    assert rep["tasks"] >= 3 and rep["built"] == rep["written"] == rep["tasks"], rep
    assert (rep["listed"], rep["read"], rep["reused"], rep["dropped"]) == (1, 0, 0, 0)
    puts = [q for q in s3.requests("PUT") if "/receipts/" in q["key"]]
    assert len(puts) == rep["written"]
    listings = [unquote(q["query"]) for q in s3.requests("GET")
                if "list-type" in q["query"] and "receipts" in unquote(q["query"])]
    # one listing to find what is receipted; the journal's removal after the manifest may list once more
    assert len([q for q in listings if "delimiter=/" in q]) == 1, listings
    assert len(listings) <= 2, listings


def test_the_background_writer_holds_at_most_its_bound_of_receipts(s3):
    """Receipts are handed over far faster than the store takes them: add() waits once
    PENDING_RECEIPTS are in flight instead of queueing every receipt of the run in memory."""
    from warpdata.etl.receipts import PENDING_RECEIPTS

    journal = Journal(s3.url("wh/.warp-tmp-build-00000000bound"))
    most = 0
    with journal.writer() as out:
        for i in range(3 * PENDING_RECEIPTS):
            out.add(f"shard-{i:05d}", f"{i:064x}", f"{i + 1:064x}", 1, {"index": i})
            most = max(most, len(out.pending))
    assert most <= PENDING_RECEIPTS
    assert len(Journal(s3.url("wh/.warp-tmp-build-00000000bound")).load_all()) == 3 * PENDING_RECEIPTS
