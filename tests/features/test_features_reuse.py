"""A new version of a feature cache reuses, byte for byte, every shard whose task did not change
(docs/formats/feature-shard.md, "Reusing the shards of the previous version"; issue 37 item 2).

The fixture is ``warpdata.sampledata.captions`` with 60 captions, cut by the records' keys
(warp/etl/cutter.py, at most 16 records a shard: the pool8-hash encoder's batch) into eight
shards, the planted truncated JPEG failing the full decode in the last part, so the last shard is
a re-cut one. One changed caption or image rebuilds its shard alone; the others come from the
previous version (linked, or written back from its re-cut shard), verified first; a shard edited
since it was written is rebuilt. A captioned image removed from the middle, or one that starts
failing the header check, rebuilds only the shards whose records the key cut changes (where a
counting cut rebuilt every later shard); a truncated image mid-way re-cuts only the shards around
it. Every result is the cache a cold build of the same sources writes, file for file
(metrics.json aside).
"""

from __future__ import annotations

import json
import shutil
from collections import Counter
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from warpdata.etl import cutter
from warpdata.sampledata import captions


def tree(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and p.name != "metrics.json"}


def etl(cli, cfg: Path, *args) -> dict:
    r = cli("etl", "--config", cfg, "--json", *args)
    assert r.code == 0, r.err
    return r.json()


def metrics(out: Path) -> dict:
    return json.loads((out / "metrics.json").read_text())


def rebuilt(out: Path) -> list[int]:
    """The tasks this build decoded (the others came from the previous version)."""
    return [t["index"] for t in metrics(out)["tasks"] if not t["reused"]]


def by_shard(out: Path) -> dict[str, list[str]]:
    """Each shard's record keys, in order (records.parquet)."""
    got: dict[str, list[str]] = {}
    for r in pq.read_table(out / "records.parquet").to_pylist():
        got.setdefault(r["shard"], []).append(r["key"])
    return got


@pytest.fixture
def source(tmp_path) -> tuple[Path, Path]:
    gen = captions.generate(tmp_path / "cap", count=60, seed=0)
    return Path(gen["path"]), Path(gen["config"])


def first_shard_caption(media: Path) -> Path:
    return sorted(p for p in media.rglob("*.txt") if "group_000" in p.as_posix())[0]


def test_one_changed_caption_rebuilds_its_shard_alone_and_the_rest_is_reused(cli, source, tmp_path):
    media, cfg = source
    out = tmp_path / "out"
    etl(cli, cfg, "--input", media, "--output", out)
    before = json.loads((out / "manifest.json").read_text())
    sizes = [s["records"] for s in before["shards"]]
    assert len(sizes) == 8 and max(sizes) <= 16 and sum(sizes) == 61  # the key cut: at most 16 a shard
    assert before["fingerprint_inputs"]["dataset"]["shard_cut"] == cutter.RULE
    assert before["manifest_version"] == 3 and all(len(s["task"]) == 64 for s in before["shards"])
    assert "parts" in before["shards"][-1] and "parts" not in before["shards"][0]  # the last one is re-cut
    names = [s["path"] for s in before["shards"]]
    old = tree(out)

    first_shard_caption(media).write_text("a caption that changed\n", encoding="utf-8")
    res = etl(cli, cfg, "--input", media, "--output", out)
    assert res["status"] == "built" and res["fingerprint"] != before["fingerprint"]
    assert rebuilt(out) == [0]
    assert metrics(out)["shards_from_previous"] == 7
    new = tree(out)
    assert new["shard-00000.wfs"] != old["shard-00000.wfs"]
    for name in names[1:]:
        assert new[name] == old[name], name
    after = json.loads((out / "manifest.json").read_text())
    assert [s["task"] for s in after["shards"][1:]] == [s["task"] for s in before["shards"][1:]]

    # what a cold build of the same sources writes
    ref = tmp_path / "ref"
    assert etl(cli, cfg, "--input", media, "--output", ref)["fingerprint"] == res["fingerprint"]
    assert rebuilt(ref) == list(range(8))
    assert new == tree(ref)
    assert cli("inspect", out, "--verify").code == 0


@pytest.mark.parametrize("name", ["shard-00003.wfs", "shard-00007.wfs"])
def test_a_previous_shard_edited_since_is_rebuilt_not_reused(cli, source, tmp_path, name):
    """A direct shard (3) or the re-cut one (7) with one data byte flipped, its size kept: its
    recorded SHA-256 no longer matches, so its task is built again."""
    media, cfg = source
    out = tmp_path / "out"
    etl(cli, cfg, "--input", media, "--output", out)
    raw = bytearray((out / name).read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    (out / name).write_bytes(bytes(raw))
    first_shard_caption(media).write_text("a caption that changed\n", encoding="utf-8")
    etl(cli, cfg, "--input", media, "--output", out)
    assert rebuilt(out) == [0, int(name[6:11])]
    ref = tmp_path / "ref"
    etl(cli, cfg, "--input", media, "--output", ref)
    assert tree(out) == tree(ref)


def test_a_cache_of_manifest_version_2_still_reads_and_is_rebuilt_whole(cli, source, tmp_path):
    """An older cache (no task identities) reads as before; the next version builds every shard."""
    from warpdata.core.canonical import seal
    from warpdata.features.reader import ShardCache

    media, cfg = source
    out = tmp_path / "out"
    etl(cli, cfg, "--input", media, "--output", out)
    m = json.loads((out / "manifest.json").read_text())
    m.pop("content_sha256")
    m["manifest_version"] = 2
    for s in m["shards"]:
        s.pop("task")
        s.pop("parts", None)
    (out / "manifest.json").write_text(json.dumps(seal(m)), encoding="utf-8")
    with ShardCache(out) as c:
        assert len(c) == 61
    first_shard_caption(media).write_text("a caption that changed\n", encoding="utf-8")
    etl(cli, cfg, "--input", media, "--output", out)
    assert rebuilt(out) == list(range(8))


@pytest.mark.s3
def test_from_s3_one_overwritten_image_reads_only_that_shards_media(cli, s3, source, tmp_path, monkeypatch):
    """A source on moto S3: after one image is overwritten, the build reads the changed object (the
    scan) and the other media of its shard (the build), each once, no caption, nothing else."""
    monkeypatch.setenv("WARP_CACHE_DIR", str(tmp_path / "cache"))
    media, cfg = source
    keys = []
    for p in sorted(media.rglob("*")):
        if p.is_file():
            keys.append(f"src/{p.relative_to(media).as_posix()}")
            s3.client.put_object(Bucket=s3.bucket, Key=keys[-1], Body=p.read_bytes())
    out = tmp_path / "out"
    args = ("--input", s3.url("src"), "--output", str(out))
    etl(cli, cfg, *args)
    shard = by_shard(out)["shard-00003.wfs"]
    shard0 = {f"src/{k}" for k in shard}
    assert len(shard0) == 16

    images = sorted(k for k in keys if k.endswith(".jpg") and k not in shard0 and "broken" not in k)
    changed, donor = f"src/{shard[0]}", images[0]
    new_bytes = (media / donor[len("src/"):]).read_bytes()
    s3.client.put_object(Bucket=s3.bucket, Key=changed, Body=new_bytes)
    (media / changed[len("src/"):]).write_bytes(new_bytes)
    s3.reset_counts()
    etl(cli, cfg, *args)
    gets = Counter(q["key"] for q in s3.requests("GET") if q["key"].startswith("src/"))
    assert gets == Counter(dict.fromkeys(shard0, 1))  # 16 GETs: the changed image and its shard's 15 others
    assert [q for q in s3.requests("HEAD") if q["key"].startswith("src/")] == []
    assert rebuilt(out) == [3]

    ref = tmp_path / "ref"
    etl(cli, cfg, "--input", media, "--output", ref)
    assert tree(out) == tree(ref)


@pytest.mark.s3
def test_to_s3_a_new_version_copies_the_unchanged_shards_of_the_last_one(cli, s3, source, tmp_path, monkeypatch):
    """An s3:// output: the new version's unchanged shards are the previous version's bytes (checked
    through the blob cache, copied in the store); the version is what a local cold build writes."""
    monkeypatch.setenv("WARP_CACHE_DIR", str(tmp_path / "cache"))
    media, cfg = source
    etl(cli, cfg, "--input", media, "--output", s3.url("fc"))
    first_shard_caption(media).write_text("a caption that changed\n", encoding="utf-8")
    shutil.rmtree(tmp_path / "cache")  # a fresh machine: the shards are fetched once to be checked
    res = etl(cli, cfg, "--input", media, "--output", s3.url("fc"))
    vdir = res["path"].rstrip("/").rsplit("/", 1)[-1]
    prefix = f"fc/{vdir}/"
    got = {o["Key"][len(prefix):]: s3.client.get_object(Bucket=s3.bucket, Key=o["Key"])["Body"].read()
           for o in s3.client.list_objects_v2(Bucket=s3.bucket, Prefix=prefix)["Contents"]}
    m = json.loads(got.pop("metrics.json"))
    assert [t["index"] for t in m["tasks"] if not t["reused"]] == [0]
    assert m["shards_from_previous"] == 7
    ref = tmp_path / "ref"
    etl(cli, cfg, "--input", media, "--output", ref)
    assert got == tree(ref)
