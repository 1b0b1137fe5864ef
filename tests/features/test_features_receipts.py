"""The feature cache on the ETL driver (warp/etl/driver.py): a damaged or foreign receipt in an S3
build is deleted *with its part's object* and the part rebuilt (rule 2 of docs/formats/receipts.md).
Parts are uploaded create-only, so before the feature cache ran on the driver a foreign receipt's
object stayed in place of the rebuilt bytes and the version named a SHA-256 its shard did not have.
The run reports what the driver did with the journal, with the same keys as the other pipelines."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

pytestmark = pytest.mark.s3

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("features_golden", ROOT / "tests/golden/features/make_golden.py")
golden = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(golden)

DAMAGED = b'{"receipt": 1, "shard_id": "part-000'  # cut short: does not parse
JUNK = b"not the part" * 100


@pytest.fixture(scope="module")
def sources(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("fc-receipts")
    golden.make_sources(root)
    return root


def _stored(s3, prefix: str) -> dict[str, bytes]:
    got = s3.client.list_objects_v2(Bucket=s3.bucket, Prefix=prefix + "/").get("Contents", [])
    return {o["Key"][len(prefix) + 1:]: s3.client.get_object(Bucket=s3.bucket, Key=o["Key"])["Body"].read()
            for o in got if not o["Key"].endswith("/metrics.json")}


def _foreign(sid: str) -> bytes:
    """A receipt that parses but names another task (another build's, or a hand-edited one)."""
    return json.dumps({"receipt": 1, "shard_id": sid, "task_sha256": "0" * 64, "sha256": "1" * 64,
                       "size_bytes": len(JUNK), "result": {"index": 2, "records": 2, "sha256": "1" * 64,
                                                           "bytes": len(JUNK), "failures": [],
                                                           "orig_sizes": [[8, 8], [8, 8]], "truncated": 0}}).encode()


def test_s3_damaged_and_foreign_receipts_are_deleted_with_their_parts(sources, s3, tmp_path, monkeypatch):
    from warpdata.features.writer import build_cache

    monkeypatch.setenv("WARP_CACHE_DIR", str(tmp_path / "cache"))
    url = s3.url("fc-damaged")
    first = build_cache(golden.spec("pixels-one", sources, url), workers=1, executor="local")
    assert first.metrics["receipts"] == {"tasks": 4, "reused": 0, "built": 4, "dropped": 0, "listed": 1,
                                         "read": 0, "written": 4}
    vp = first.path.split(f"s3://{s3.bucket}/", 1)[1]
    reference = _stored(s3, vp)
    # a killed run's state: no manifest, a damaged receipt, and a foreign one whose part object
    # holds other bytes
    s3.client.delete_object(Bucket=s3.bucket, Key=f"{vp}/manifest.json")
    journal = f"fc-damaged/.warp-tmp-build-{first.manifest['fingerprint'][:12]}/receipts"
    s3.client.put_object(Bucket=s3.bucket, Key=f"{journal}/part-00001.json", Body=DAMAGED)
    s3.client.put_object(Bucket=s3.bucket, Key=f"{journal}/part-00002.json", Body=_foreign("part-00002"))
    s3.client.put_object(Bucket=s3.bucket, Key=f"{vp}/shard-00002.wfs", Body=JUNK)
    s3.reset_counts()
    again = build_cache(golden.spec("pixels-one", sources, url), workers=1, executor="local")
    assert again.status == "built" and again.path == first.path
    assert again.metrics["receipts"] == {"tasks": 4, "reused": 0, "built": 4, "dropped": 2, "listed": 1,
                                         "read": 2, "written": 4}
    assert _stored(s3, vp) == reference
    assert s3.client.list_objects_v2(Bucket=s3.bucket, Prefix=journal).get("KeyCount") == 0


def test_a_receipt_whose_failures_or_counts_are_not_its_tasks_is_not_reused(tmp_path):
    """The receipt's task hash and the part's bytes verify, but its result counts other records or
    names failure positions outside the task (a negative one quarantined another task's image)."""
    import hashlib
    from types import SimpleNamespace

    from warpdata.features.parts import PartResult, PartTask, _reuse, task_sha256

    part = tmp_path / "part-00001.wfs"
    part.write_bytes(b"three records")
    items = [SimpleNamespace(key=f"k{i}", digest=f"d{i}") for i in range(3)]
    task = PartTask(index=1, path=str(part), recipe="f" * 64, spec=None, fields=[], items=items,
                    batches=[0, 0, 0], encoder=None, decode_threads=1, pool_key="")
    result = {"index": 1, "records": 2, "sha256": hashlib.sha256(b"three records").hexdigest(),
              "bytes": 13, "failures": [[2, "decode-error", "m"]], "orig_sizes": [[8, 8], [8, 8]], "truncated": 0}
    receipt = {"task_sha256": task_sha256(task), "result": result}
    assert isinstance(_reuse(task, receipt), PartResult)  # the honest receipt is reused
    for forged in ({"failures": [[-1, "decode-error", "m"]]}, {"failures": [[3, "decode-error", "m"]]},
                   {"failures": [["0", "decode-error", "m"]]}, {"records": 3}, {"index": 0}):
        assert _reuse(task, {**receipt, "result": {**result, **forged}}) is None, forged
