"""The remote header pass (``warehouse.remote.probe_batch``) against moto S3: GETs run ahead of the
probing in a bounded window, yet outcomes come back in record order, one GET per image, and an object
that vanished after the listing or a store that stopped answering are told apart."""

from __future__ import annotations

import io
import os

import pytest
from PIL import Image
from warpdata.core.errors import InfrastructureError
from warpdata.warehouse import remote
from warpdata.warehouse.config import Limits
from warpdata.warehouse.labels import LabelRecord

PARAMS = dict(tolerance=0.5, min_box=0.0, max_boxes=8, overflow="truncate")


def _jpeg(side: int) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (side, side + 1), (side % 256, 0, 0)).save(buf, "JPEG")
    return buf.getvalue()


def _batch(s3, mirror, n: int, *, missing: tuple[int, ...] = (), url: str | None = None) -> remote.ProbeBatch:
    recs, sizes = [], {}
    for i in range(n):
        key = f"images/{i:03d}.jpg"
        data = _jpeg(16 + i)
        if i not in missing:
            s3.client.put_object(Bucket=s3.bucket, Key=f"src/{key}", Body=data)
        sizes[key] = len(data)  # listed before it vanished, for the missing ones
        recs.append(LabelRecord(key=key, root=str(mirror), run="r", boxes=[], classes=[], source="labels.json",
                                width=None, height=None))
    return remote.ProbeBatch(0, url or s3.url("src"), str(mirror), recs, sizes, PARAMS, Limits())


@pytest.mark.s3
def test_outcomes_keep_record_order_past_the_prefetch_window(s3, tmp_path):
    mirror = tmp_path / "mirror"
    (mirror / remote.SPOOL).mkdir(parents=True)
    n = 3 * remote.PREFETCH + 1
    batch = _batch(s3, mirror, n, missing=(5, n - 1))
    s3.reset_counts()
    _, out, learnt = remote.probe_batch(batch)
    assert len(out) == n
    assert s3.count("GET") == n and s3.count("HEAD") == 0  # one GET per image, the vanished ones included
    for i, o in enumerate(out):
        if i in (5, n - 1):
            assert o.reject[3] == "missing-file" and "disappeared during the header pass" in o.reject[4]
            assert o.reject[1] == f"images/{i:03d}.jpg" and o.sample is None
        else:
            assert o.reject is None, o.reject
            assert o.sample.key == f"images/{i:03d}.jpg"
            assert o.sample.probe.width == 16 + i  # the record's own image, not a neighbour's
    spooled = sorted(os.listdir(mirror / remote.SPOOL))
    assert len(spooled) == n - 2 and not [f for f in spooled if f.endswith(".tmp")]
    assert learnt == {}  # no listed tags given: nothing to recognise the objects by next time


@pytest.mark.s3
def test_objects_with_known_facts_are_not_read_and_give_the_same_outcomes(s3, tmp_path):
    mirror = tmp_path / "mirror"
    (mirror / remote.SPOOL).mkdir(parents=True)
    batch = _batch(s3, mirror, 6)
    batch.tags = {k: f"etag-{k}" for k in batch.sizes}
    _, first, learnt = remote.probe_batch(batch)
    assert sorted(learnt) == sorted(batch.sizes) and all(f["tag"] == f"etag-{k}" for k, f in learnt.items())
    listing = remote.Listing(dict(batch.sizes), dict(batch.tags))
    listing.tags["images/002.jpg"] = "etag-changed"  # this object changed since: read again
    batch.known = remote.known_facts(learnt, listing)
    assert "images/002.jpg" not in batch.known and len(batch.known) == 5
    s3.reset_counts()
    _, again, relearnt = remote.probe_batch(batch)
    assert s3.count("GET") == 1 and sorted(relearnt) == ["images/002.jpg"]
    for a, b in zip(first, again, strict=True):
        assert (a.reject, a.source_hash) == (b.reject, b.source_hash)
        assert a.sample.probe == b.sample.probe and a.sample.sha256 == b.sample.sha256


@pytest.mark.s3
def test_a_store_that_stops_answering_is_an_infrastructure_error(s3, tmp_path, monkeypatch):
    import socket

    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{sock.getsockname()[1]}"
    mirror = tmp_path / "mirror"
    (mirror / remote.SPOOL).mkdir(parents=True)
    batch = _batch(s3, mirror, 3)
    for var in ("WARP_S3_ENDPOINT", "AWS_ENDPOINT_URL"):
        monkeypatch.setenv(var, dead)
    monkeypatch.setenv("WARP_S3_RETRIES", "0")
    with pytest.raises(InfrastructureError) as ei:
        remote.probe_batch(batch)
    assert "images/000.jpg" in str(ei.value)
