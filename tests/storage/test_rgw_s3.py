"""warp against a real S3 server that checks what moto accepts: Ceph's RADOS Gateway (one-node
cluster on 127.0.0.1, tests/support/ceph.py). Presigned reads (the gateway checks every
signature), conditional writes as the gateway answers them, create-only and ``latest`` races
between processes, multipart uploads by ``warp publish``, and a published dataset read back with
``warp stream``, ``warp warm``, refs and ``Table.to_torch``. Run with ``make s3-conformance``;
docs/s3-conformance.md lists what differs from moto and AWS."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from support.datasets import make_rows, write_media
from warpdata.core.errors import WarpError
from warpdata.publishing.multipart import MULTIPART_MIN, PART_SIZE
from warpdata.registry.store import Store
from warpdata.storage.s3sign import SigV4Presigner

pytestmark = pytest.mark.rgw

ODD_KEYS = ["plain/key.bin", "with space/and+plus=eq&amp.bin", "ünïcödé/ключ/鍵.bin", "tilde~star*(paren)!'.bin",
            "a/b/c/d/e/f/g/h/deep.bin", "percent%20literal/%2F.bin"]


def fetch(url: str, headers: dict[str, str] | None = None) -> tuple[int, bytes]:
    req = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def presigner(rgw, secret: str | None = None) -> SigV4Presigner:
    return SigV4Presigner(rgw.endpoint, "us-east-1", True, rgw.server.access_key, secret or rgw.server.secret_key)


def error_code(body: bytes) -> str:
    text = body.decode(errors="replace")
    return text.split("<Code>", 1)[1].split("</Code>", 1)[0] if "<Code>" in text else text[:200]


# -- presigned reads: the gateway checks the signature ------------------------------------------

@pytest.mark.parametrize("key", ODD_KEYS)
def test_warps_presigned_urls_are_accepted(rgw, key):
    """warp signs its own ranged GETs (storage/s3sign.py); a server that checks SigV4 takes them,
    for keys that need every kind of escaping."""
    body = os.urandom(1000)
    rgw.client.put_object(Bucket=rgw.bucket, Key=key, Body=body)
    url = presigner(rgw).presign(rgw.bucket, key, 300)
    assert url is not None
    status, got = fetch(url)
    assert (status, got) == (200, body), error_code(got)
    status, got = fetch(url, {"Range": "bytes=10-19"})
    assert (status, got) == (206, body[10:20])
    # botocore's own presigned URL for the same object is taken too
    status, got = fetch(rgw.client.generate_presigned_url("get_object", Params={"Bucket": rgw.bucket, "Key": key}))
    assert (status, got) == (200, body)


def test_tampered_signature_is_refused(rgw):
    rgw.client.put_object(Bucket=rgw.bucket, Key="k", Body=b"secret bytes")
    url = presigner(rgw).presign(rgw.bucket, "k", 300)
    sig = url.rsplit("X-Amz-Signature=", 1)[1]
    bad = url[: -len(sig)] + sig[:-1] + ("0" if sig[-1] != "0" else "1")
    status, body = fetch(bad)
    assert status == 403 and error_code(body) == "SignatureDoesNotMatch"
    # another key's URL does not open this one
    other = presigner(rgw).presign(rgw.bucket, "other", 300).replace("/other?", "/k?")
    status, body = fetch(other)
    assert status == 403 and b"secret bytes" not in body


def test_wrong_secret_is_refused(rgw):
    rgw.client.put_object(Bucket=rgw.bucket, Key="k", Body=b"x")
    status, body = fetch(presigner(rgw, secret="not-the-secret").presign(rgw.bucket, "k", 300))
    assert status == 403 and error_code(body) == "SignatureDoesNotMatch"


def test_expired_url_is_refused(rgw):
    rgw.client.put_object(Bucket=rgw.bucket, Key="k", Body=b"x")
    url = presigner(rgw).presign(rgw.bucket, "k", 60, now=time.time() - 3600)
    status, body = fetch(url)
    assert status == 403 and error_code(body) == "AccessDenied"


def test_store_reads_with_a_wrong_secret_fail_typed(rgw, monkeypatch, tmp_path):
    """A wrong secret is a typed error naming the store, not data (moto would have served it)."""
    from warpdata.storage.remote import Remote

    store = Store(rgw.url("warp"))
    data = os.urandom(5000)
    h = hashlib.sha256(data).hexdigest()
    store.put_blob(h, data)
    monkeypatch.setenv("WARP_CACHE_DIR", str(tmp_path / "cache"))
    assert Remote(rgw.url("warp")).read_range(f"blobs/sha256/{h[:2]}/{h}", 100, 50, len(data)) == data[100:150]
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not-the-secret")
    with pytest.raises(WarpError) as e:
        Remote(rgw.url("warp")).read_range(f"blobs/sha256/{h[:2]}/{h}", 100, 50, len(data))
    assert "403" in str(e.value) or "SignatureDoesNotMatch" in str(e.value) or "credentials" in str(e.value).lower()


# -- conditional writes as the gateway answers them ---------------------------------------------

def test_conditional_put_statuses(rgw):
    """What the gateway answers each failed precondition (warp/storage/s3.py takes 412 and 409)."""
    from botocore.exceptions import ClientError

    c, b = rgw.client, rgw.bucket
    etag = c.put_object(Bucket=b, Key="p", Body=b"1", IfNoneMatch="*")["ETag"]
    seen = {}
    for what, kw in {"create-only on an existing key": {"Key": "p", "IfNoneMatch": "*"},
                     "stale If-Match": {"Key": "p", "IfMatch": '"0123456789abcdef0123456789abcdef"'},
                     "If-Match on a missing key": {"Key": "missing", "IfMatch": etag}}.items():
        with pytest.raises(ClientError) as e:
            c.put_object(Bucket=b, Body=b"2", **kw)
        seen[what] = (e.value.response["ResponseMetadata"]["HTTPStatusCode"], e.value.response["Error"]["Code"])
    assert c.get_object(Bucket=b, Key="p")["Body"].read() == b"1"
    assert seen["create-only on an existing key"][0] in (409, 412), seen
    assert seen["stale If-Match"][0] in (409, 412), seen
    assert seen["If-Match on a missing key"][0] in (404, 409, 412), seen
    # RGW 16.2 compares If-Match with the bare ETag: the quoted one AWS returns is refused, the bare
    # one taken (warp/storage/s3.py sends it bare after such a refusal)
    with pytest.raises(ClientError) as e:
        c.put_object(Bucket=b, Key="p", Body=b"3", IfMatch=etag)
    assert e.value.response["ResponseMetadata"]["HTTPStatusCode"] == 412
    new = c.put_object(Bucket=b, Key="p", Body=b"3", IfMatch=etag.strip('"'))["ETag"]
    assert new != etag and c.get_object(Bucket=b, Key="p")["Body"].read() == b"3"


def test_compare_and_swap_through_the_store_moves_the_pointer(rgw):
    """warp's ``write_if`` with the token ``read_versioned`` gave: taken (RGW needs the bare-ETag
    retry), a stale token refused, a missing key refused."""
    from warpdata.storage.s3 import S3ObjectStore

    b = Store(rgw.url("warp")).objects
    assert isinstance(b, S3ObjectStore)
    t1 = b.write_if("p.json", b"1", None)
    assert t1 is not None and b.write_if("p.json", b"x", None) is None
    t2 = b.write_if("p.json", b"2", t1)
    assert t2 is not None and b.write_if("p.json", b"3", t1) is None
    assert b.read_versioned("p.json") == (b"2", t2)
    assert b.write_if("missing.json", b"1", t2) is None


# -- races between processes ----------------------------------------------------------------------

RACER = r"""
import json, os, sys, time
from warpdata.registry.store import Store
store, op, arg, go = Store(sys.argv[1]), sys.argv[2], sys.argv[3], float(sys.argv[4])
while time.time() < go:
    time.sleep(0.001)
if op == "put":
    print(json.dumps(store.put_blob(arg, sys.argv[5].encode(), verify=False)))
else:
    exp = store.read_latest("ws/race") if arg == "move" else None
    if exp is not None:
        time.sleep(max(0.0, go + 0.5 - time.time()))  # both have read the same pointer
    p = store.cas_latest("ws/race", sys.argv[5], exp)
    print(json.dumps(None if p is None else p.version_hash))
"""


def _race(rgw, *argsets: list[str]) -> list:
    go = time.time() + 3.0  # both processes are up and importing by then; they start together
    env = {**os.environ, **rgw.env}
    procs = [subprocess.Popen([sys.executable, "-c", RACER, rgw.url("warp"), *a[:2], str(go), *a[2:]],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env) for a in argsets]
    out = []
    for p in procs:
        o, e = p.communicate(timeout=300)
        assert p.returncode == 0, e
        out.append(json.loads(o.strip().splitlines()[-1]))
    return out


@pytest.mark.parametrize("trial", range(2))
def test_create_only_race_between_two_processes(rgw, trial):
    h = hashlib.sha256(f"proc race {trial}".encode()).hexdigest()
    got = _race(rgw, ["put", h, "from process A"], ["put", h, "from process B"])
    assert sorted(got) == [False, True], got
    winner = "from process A" if got[0] else "from process B"
    assert Store(rgw.url("warp")).get_blob(h, verify=False) == winner.encode()


def test_latest_compare_and_swap_race_between_two_processes(rgw):
    from conformance.stores import manifest

    store = Store(rgw.url("warp"))
    ms = [manifest("ws/race", f"v{i}".encode()) for i in range(4)]
    for m in ms:
        store.put_manifest(m)
    for rnd, mode in enumerate(["create", "move"]):
        a, b = ms[2 * rnd].version_hash, ms[2 * rnd + 1].version_hash
        got = _race(rgw, ["cas", mode, a], ["cas", mode, b])
        winners = [g for g in got if g is not None]
        assert len(winners) == 1 and winners[0] in (a, b), got
        assert store.read_latest("ws/race").version_hash == winners[0]


def test_two_processes_publish_one_dataset(rgw, tmp_path):
    """Two ``warp publish`` of different data to one dataset at once: both versions land, ``latest``
    names one of them and it reads back."""
    env = {**os.environ, **rgw.env, "WARP_CACHE_DIR": str(tmp_path / "cache")}
    procs = []
    for i in range(2):
        d = tmp_path / f"in{i}"
        d.mkdir()
        pq.write_table(make_rows(50, 1000 * i), d / "p.parquet")
        procs.append(subprocess.Popen([sys.executable, "-m", "warpdata", "publish", "ws/both", "--store", rgw.url("warp"),
                                       "--table", f"main={d}/p.parquet", "--json"],
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env))
    versions = []
    for p in procs:
        o, e = p.communicate(timeout=600)
        assert p.returncode == 0, e
        versions.append(json.loads(o)["version_hash"])
    store = Store(rgw.url("warp"))
    assert len(set(versions)) == 2 and sorted(store.list_versions("ws/both")) == sorted(versions)
    assert store.read_latest("ws/both").version_hash in versions


# -- multipart uploads -------------------------------------------------------------------------------

def test_publish_uploads_a_large_blob_in_parts(cli, rgw, tmp_path, monkeypatch):
    big = MULTIPART_MIN + PART_SIZE // 2  # 64 MB and more: 5 parts of 16 MB (the last one half)
    root = tmp_path / "big"
    (root / "data").mkdir(parents=True)
    (root / "imgs").mkdir()
    pq.write_table(pa.table({"image": ["big.bin", "small.bin"]}), root / "data" / "p0.parquet")
    data = np.random.default_rng(7).bytes(big)
    (root / "imgs" / "big.bin").write_bytes(data)
    (root / "imgs" / "small.bin").write_bytes(b"x" * 100)
    monkeypatch.setenv("WARP_CACHE_DIR", str(tmp_path / "cache"))
    args = ("publish", "ws/big", "--store", rgw.url("warp"), "--table", f"main={root}/data/*.parquet",
            "--artifact", f"imgs={root}/imgs", "--bind", "main.image=imgs:image", "--shard-size", "512MB", "--json")
    r = cli(*args)
    assert r.code == 0, r.err
    store = Store(rgw.url("warp"))
    m = store.resolve("ws/big")
    shard = max(m.artifacts["imgs"].shards, key=lambda s: s.byte_size)
    head = rgw.client.head_object(Bucket=rgw.bucket, Key=f"warp/blobs/sha256/{shard.hash[:2]}/{shard.hash}")
    assert head["ETag"].strip('"').endswith(f"-{-(-shard.byte_size // PART_SIZE)}")  # a multipart object
    assert head["ContentLength"] == shard.byte_size
    assert hashlib.sha256(store.get_blob(shard.hash, verify=False)).hexdigest() == shard.hash
    assert not rgw.client.list_multipart_uploads(Bucket=rgw.bucket).get("Uploads")  # none left open
    r = cli(*args)  # again: everything is there, nothing is sent
    assert r.code == 0, r.err
    r = cli("cat", "ws/big", "--store", rgw.url("warp"), "--artifact", "imgs", "--ref", "big.bin")
    assert r.code == 0
    assert len(r.out.encode("latin-1", errors="ignore")) >= 0  # binary on stdout; the hash check below
    out = tmp_path / "big.out"
    from warpdata import dataset

    monkeypatch.setenv("WARP_STORE", rgw.url("warp"))
    ref = next(iter(dataset("ws/big").table("main").batch_dicts(2)))["image"][0]
    out.write_bytes(ref.read_bytes())
    assert hashlib.sha256(out.read_bytes()).digest() == hashlib.sha256(data).digest()


def test_an_unfinished_multipart_upload_is_resumed(rgw, tmp_path):
    """What a killed publish leaves (an open upload with two parts) is resumed: the gateway lists
    the parts with the quoted MD5 ETags warp compares, and the blob completes with the right bytes."""
    from warpdata.publishing.multipart import _put_multipart
    from warpdata.registry.store import blob_key

    size = 3 * PART_SIZE + 999
    data = np.random.default_rng(3).bytes(size)
    p = tmp_path / "blob.bin"
    p.write_bytes(data)
    h = hashlib.sha256(data).hexdigest()
    store = Store(rgw.url("warp"))
    key = f"warp/{blob_key(h)}"
    up = rgw.client.create_multipart_upload(Bucket=rgw.bucket, Key=key)["UploadId"]
    for i in (1, 2):
        rgw.client.upload_part(Bucket=rgw.bucket, Key=key, UploadId=up, PartNumber=i,
                               Body=data[(i - 1) * PART_SIZE:i * PART_SIZE])
    listed = rgw.client.list_parts(Bucket=rgw.bucket, Key=key, UploadId=up)["Parts"]
    assert [x["ETag"] for x in listed] == [
        f'"{hashlib.md5(data[(i - 1) * PART_SIZE:i * PART_SIZE], usedforsecurity=False).hexdigest()}"' for i in (1, 2)]
    assert _put_multipart(store, h, str(p), size, concurrency=2) is True
    assert hashlib.sha256(store.get_blob(h, verify=False)).hexdigest() == h
    assert not rgw.client.list_multipart_uploads(Bucket=rgw.bucket).get("Uploads")
    assert _put_multipart(store, h, str(p), size, concurrency=2) is False  # there: refused, upload aborted
    assert not rgw.client.list_multipart_uploads(Bucket=rgw.bucket).get("Uploads")


# -- a published dataset read back --------------------------------------------------------------------

@pytest.fixture
def published(cli, rgw, tmp_path, monkeypatch):
    monkeypatch.setenv("WARP_STORE", rgw.url("warp"))
    monkeypatch.setenv("WARP_CACHE_DIR", str(tmp_path / "cache"))
    write_media(tmp_path / "media", 6)
    (tmp_path / "data").mkdir()
    for k in range(2):
        pq.write_table(make_rows(150, 150 * k, image_every=6), tmp_path / "data" / f"p{k}.parquet",
                       row_group_size=50)
    r = cli("publish", "ws/rt", "--table", f"main={tmp_path}/data/*.parquet", "--artifact",
            f"media={tmp_path}/media", "--bind", "main.image=media:image", "--json")
    assert r.code == 0, r.err
    return tmp_path


def test_stream_reads_the_published_rows(cli, published):
    r = cli("stream", "ws/rt", "--columns", "id", "--filter", "id >= 295", "--mode", "remote")
    assert r.code == 0, r.err
    assert [json.loads(x)["id"] for x in r.out.splitlines()] == list(range(295, 300))
    r = cli("stream", "ws/rt", "--columns", "id,image", "--limit", "2")
    assert r.code == 0, r.err
    assert [json.loads(x) for x in r.out.splitlines()] == [{"id": 0, "image": "img/0000.png"},
                                                           {"id": 1, "image": "img/0001.png"}]


def test_warm_then_refs_read_from_the_cache(cli, published):
    r = cli("warm", "ws/rt", "--json")
    assert r.code == 0, r.err
    import warpdata

    t = warpdata.dataset("ws/rt").table("main")
    d = next(iter(t.batch_dicts(8)))
    assert d["image"][5].read_bytes() == (published / "media" / "img" / "0005.png").read_bytes()
    r = cli("cat", "ws/rt", "--artifact", "media", "--ref", "snd/1.wav")
    assert r.code == 0, r.err


def test_to_torch_reads_every_row_and_ref(published):
    pytest.importorskip("torch")
    import warpdata

    t = warpdata.dataset("ws/rt").table("main")
    ids, images = [], 0
    for b in t.to_torch(batch_size=64, columns=["id", "image"], num_workers=0, rank=0, world_size=1, read_refs=True):
        ids.extend(int(i) for i in b["id"])
        images += sum(1 for x in b["image"] if x is not None)
    assert sorted(ids) == list(range(300))
    with_image = pa.concat_tables([pq.read_table(published / "data" / f"p{i}.parquet", columns=["image"])
                                   for i in range(2)]).column("image").drop_null()
    assert images == len(with_image) > 0
