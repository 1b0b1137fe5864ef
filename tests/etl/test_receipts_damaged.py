"""A damaged or foreign receipt is deleted with its shard and the task rebuilt (rule 2 of
docs/formats/receipts.md), for a local output and one on S3; it used to end every resume with
exit 70 ("please report this"), and on S3 a foreign receipt's shard object was kept in place of the
rebuilt bytes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support.warehouses import coco_config
from warpdata.sampledata.detection import generate

DAMAGED = b'{"receipt": 1, "shard_id": "shard-000'  # cut short: does not parse
JUNK = b"not the shard" * 100


def _foreign(shard_id: str) -> bytes:
    """A receipt that parses but names another task (another build's, or a hand-edited one)."""
    return json.dumps({"receipt": 1, "shard_id": shard_id, "task_sha256": "0" * 64, "sha256": "1" * 64,
                       "size_bytes": len(JUNK), "result": {"index": 2, "shard_id": shard_id,
                                                           "file_name": f"{shard_id}.twh1", "samples": 4,
                                                           "sha256": "1" * 64, "size_bytes": len(JUNK),
                                                           "failures": [], "direct_bytes": 0}}).encode()


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    d = tmp_path_factory.mktemp("damaged") / "coco"
    generate(d, count=20, seed=3, min_side=64, max_side=120)
    return d


def _etl(cli, cfg: Path, *args: str) -> dict:
    r = cli("etl", "--config", cfg, "--json", *args)
    assert r.code == 0, r.err
    return r.json()


def _files(path: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(path.iterdir()) if p.name != "metrics.json"}


def test_local_damaged_and_foreign_receipts_are_rebuilt(cli, dataset, tmp_path):
    out = tmp_path / "wh"
    cfg = coco_config(dataset, out, fail=0.3)
    first = _etl(cli, cfg, "-j", "1")
    reference = _files(Path(first["path"]))
    # the version gone, a build directory left with a damaged and a foreign receipt (and its shard)
    for p in Path(first["path"]).iterdir():
        p.unlink()
    Path(first["path"]).rmdir()
    build = out / f".warp-tmp-build-{first['version'][:12]}"
    (build / "receipts").mkdir(parents=True)
    (build / "receipts" / "shard-00001.json").write_bytes(DAMAGED)
    (build / "receipts" / "shard-00002.json").write_bytes(_foreign("shard-00002"))
    (build / "shard-00002.twh1").write_bytes(JUNK)
    again = _etl(cli, cfg, "-j", "1")
    assert again["shards_reused"] == 0 and again["shards_built"] == first["shards"]
    # one listing of the journal, each receipt read once, both dropped with their shards (warp/etl/driver.py)
    assert {k: again["receipts"][k] for k in ("listed", "read", "dropped")} == {"listed": 1, "read": 2, "dropped": 2}
    assert _files(Path(again["path"])) == reference


@pytest.mark.s3
def test_s3_damaged_and_foreign_receipts_are_deleted_with_their_objects(cli, dataset, tmp_path, s3, monkeypatch):
    monkeypatch.setenv("WARP_CACHE_DIR", str(tmp_path / "cache"))
    cfg = coco_config(dataset, tmp_path / "unused", fail=0.3)
    first = _etl(cli, cfg, "--output", s3.url("wh"), "-j", "1")
    vdir = first["path"].rsplit("/", 1)[-1]
    keys = [o["Key"] for o in s3.client.list_objects_v2(Bucket=s3.bucket, Prefix=f"wh/{vdir}/")["Contents"]]
    reference = {k.rsplit("/", 1)[-1]: s3.client.get_object(Bucket=s3.bucket, Key=k)["Body"].read() for k in keys}
    reference.pop("metrics.json")
    # the version's manifest gone (a killed run's state), a damaged receipt, and a foreign one whose
    # object holds other bytes
    s3.client.delete_object(Bucket=s3.bucket, Key=f"wh/{vdir}/manifest.json")
    journal = f"wh/.warp-tmp-build-{first['version'][:12]}/receipts"
    s3.client.put_object(Bucket=s3.bucket, Key=f"{journal}/shard-00001.json", Body=DAMAGED)
    s3.client.put_object(Bucket=s3.bucket, Key=f"{journal}/shard-00002.json", Body=_foreign("shard-00002"))
    s3.client.put_object(Bucket=s3.bucket, Key=f"wh/{vdir}/shard-00002.twh1", Body=JUNK)
    again = _etl(cli, cfg, "--output", s3.url("wh"), "-j", "1")
    assert again["path"] == first["path"] and again["shards_reused"] == 0
    assert {k: again["receipts"][k] for k in ("listed", "read", "dropped")} == {"listed": 1, "read": 2, "dropped": 2}
    got = {k: s3.client.get_object(Bucket=s3.bucket, Key=f"wh/{vdir}/{k}")["Body"].read() for k in reference}
    assert got == reference
    assert s3.client.list_objects_v2(Bucket=s3.bucket, Prefix=journal).get("KeyCount") == 0


def test_a_receipt_whose_result_names_another_shards_file_is_not_reused(dataset, tmp_path):
    """The receipt's task hash and the shard's bytes verify, but its result names shard 0's file (the
    manifest would list shard 0 twice and shard 1's samples would read shard 0's pixels), or counts
    and quarantines samples that are not the task's."""
    from warpdata.warehouse import etl as wetl
    from warpdata.warehouse import labels as wlabels
    from warpdata.warehouse.transform import TransformSpec
    from warpdata.warehouse.validate import probe_all

    ls = wlabels.load("coco", dataset, ("annotations.json",), "images", (), 0.0)
    valid = [o.sample for o in probe_all(ls.records, workers=1, tolerance=0.5, min_box=0.0, max_boxes=8,
                                         overflow="truncate") if o.sample is not None]
    (tmp_path / "b").mkdir()
    tasks = wetl.plan(valid[:8], 4, TransformSpec(32, 32), 8, tmp_path / "b")
    results = [wetl.build_shard(t) for t in tasks]
    receipt = {"task_sha256": wetl.task_sha256(tasks[1]), "sha256": results[1].sha256,
               "result": {k: v for k, v in vars(results[1]).items() if k not in ("timings", "reused")}}
    assert wetl._reuse_receipt(tasks[1], receipt) is not None  # the honest receipt verifies
    for key, other in (("file_name", results[0].file_name), ("shard_id", results[0].shard_id),
                       ("samples", results[1].samples + 1),
                       ("failures", [["coco", "images/not-in-this-shard.jpg", "x", "decode-error", "m"]])):
        crafted = {**receipt, "result": {**receipt["result"], key: other}}
        assert wetl._reuse_receipt(tasks[1], crafted) is None, key
