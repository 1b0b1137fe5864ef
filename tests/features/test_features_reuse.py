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
    assert len(sizes) == 6 and max(sizes) <= 16 and sum(sizes) == 61  # the key cut: at most 16 a shard
    assert before["fingerprint_inputs"]["dataset"]["shard_cut"] == cutter.RULE
    assert before["manifest_version"] == 3 and all(len(s["task"]) == 64 for s in before["shards"])
    assert "parts" in before["shards"][-1] and "parts" not in before["shards"][0]  # the last one is re-cut
    names = [s["path"] for s in before["shards"]]
    old = tree(out)

    first_shard_caption(media).write_text("a caption that changed\n", encoding="utf-8")
    res = etl(cli, cfg, "--input", media, "--output", out)
    assert res["status"] == "built" and res["fingerprint"] != before["fingerprint"]
    assert rebuilt(out) == [0]
    assert metrics(out)["shards_from_previous"] == 5
    new = tree(out)
    assert new["shard-00000.wfs"] != old["shard-00000.wfs"]
    for name in names[1:]:
        assert new[name] == old[name], name
    after = json.loads((out / "manifest.json").read_text())
    assert [s["task"] for s in after["shards"][1:]] == [s["task"] for s in before["shards"][1:]]

    # what a cold build of the same sources writes
    ref = tmp_path / "ref"
    assert etl(cli, cfg, "--input", media, "--output", ref)["fingerprint"] == res["fingerprint"]
    assert rebuilt(ref) == list(range(6))
    assert new == tree(ref)
    assert cli("inspect", out, "--verify").code == 0


@pytest.mark.parametrize("name", ["shard-00003.wfs", "shard-00005.wfs"])
def test_a_previous_shard_edited_since_is_rebuilt_not_reused(cli, source, tmp_path, name):
    """A direct shard (3) or the re-cut one (5) with one data byte flipped, its size kept: its
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
    assert rebuilt(out) == list(range(6))


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
    shard = by_shard(out)["shard-00002.wfs"]
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
    assert rebuilt(out) == [2]

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
    assert m["shards_from_previous"] == 5
    ref = tmp_path / "ref"
    etl(cli, cfg, "--input", media, "--output", ref)
    assert got == tree(ref)


# --- records removed, newly failing, or failing late mid-way: the key cut keeps the later shards ---

def middle_image(out: Path) -> str:
    """The key of a captioned JPEG near the middle of the cache (its records in key order)."""
    keys = (out / "keys.txt").read_text(encoding="utf-8").split()
    return next(k for k in keys[len(keys) // 2:] if k.endswith(".jpg"))


def shifting_image(out: Path) -> str:
    """The key of a captioned JPEG whose removal changes how many shards the key cut makes, so
    every later shard moves to the next index (computed with the cutter over the planned records:
    the stored ones and the late decode failure)."""
    keys = (out / "keys.txt").read_text(encoding="utf-8").split()
    late = [json.loads(line)["sample_id"] for line in (out / "quarantine.jsonl").read_text().splitlines()
            if json.loads(line)["reason"] == "truncated"]
    planned = sorted(keys + late)
    n = len(cutter.cut_by_keys(planned, 16, False, key=str))
    return next(k for i, k in enumerate(planned) if k.endswith(".jpg") and k not in late and i > len(planned) // 4
                and len(cutter.cut_by_keys(planned[:i] + planned[i + 1:], 16, False, key=str)) != n)


def change(media: Path, key: str, how: str) -> None:
    img = media / key
    if how == "removed":  # the captioned image gone from the source
        img.unlink()
        img.with_suffix(".txt").unlink()
    elif how == "garbage":  # now fails the header check (decode-error), before any decode
        img.write_bytes(b"\xff\xd8\xff\xe0 not a JPEG any more " * 4)
    else:  # "truncated": an intact header, cut short: passes the header pass, fails the full decode
        raw = img.read_bytes()
        img.write_bytes(raw[: len(raw) // 3])


def shard_files(out: Path) -> dict[tuple[str, ...], bytes]:
    """Each shard's bytes by its records' keys."""
    return {tuple(keys): (out / name).read_bytes() for name, keys in by_shard(out).items()}


def fixed_config(cfg: Path, tmp_path: Path) -> Path:
    """The same config with ``[cache] shard_size = 16``: counting cuts, as asked."""
    fixed = tmp_path / "fixed.toml"
    fixed.write_text(cfg.read_text(encoding="utf-8") + "\n[cache]\nshard_size = 16\n", encoding="utf-8")
    return fixed


@pytest.mark.parametrize("how, pick, rebuilt_key, rebuilt_fixed",
                         [("removed", middle_image, 1, 3), ("garbage", middle_image, 1, 3),
                          ("removed", shifting_image, 2, 3)], ids=["removed", "garbage", "removed-shifting"])
def test_a_record_gone_from_the_middle_rebuilds_only_the_shards_the_cut_changes(
        cli, source, tmp_path, how, pick, rebuilt_key, rebuilt_fixed):
    """One captioned image removed from the middle, or overwritten with garbage (now refused by
    the header check): the key cut rebuilds the shard that held it (1 task of 8), every other shard
    is the previous one byte for byte; with ``[cache] shard_size = 16`` (counting cuts) the same
    edit rebuilds that shard and every later one (3 tasks of 4). Removing an image whose absence
    makes a new cut (``removed-shifting``) rebuilds the 2 runs around it (of 9), and every later
    shard is the previous one under the next index (3 tasks of 4 with counting cuts)."""
    media, cfg = source
    fixed_cfg = fixed_config(cfg, tmp_path)
    out, out_fixed = tmp_path / "out", tmp_path / "fixed"
    etl(cli, cfg, "--input", media, "--output", out)
    etl(cli, fixed_cfg, "--input", media, "--output", out_fixed)
    assert json.loads((out_fixed / "manifest.json").read_text())["fingerprint_inputs"]["dataset"]["shard_cut"] \
        == "fixed"
    old = shard_files(out)
    victim = pick(out)

    change(media, victim, how)
    etl(cli, cfg, "--input", media, "--output", out)
    etl(cli, fixed_cfg, "--input", media, "--output", out_fixed)
    new = shard_files(out)
    fresh = [keys for keys in new if keys not in old]  # runs the cut changed: built again
    assert len(rebuilt(out)) == len(fresh) == rebuilt_key and 1 <= len(fresh) <= 3
    assert any(victim in keys for keys in old if keys not in new)
    for keys, raw in new.items():
        if keys in old:
            assert raw == old[keys], keys  # reused byte for byte
    assert metrics(out)["shards_from_previous"] == len(new) - len(fresh)
    assert (len(new) != len(old)) == (pick is shifting_image)  # later shards under the next index
    assert len(rebuilt(out_fixed)) == rebuilt_fixed > rebuilt_key

    ref = tmp_path / "ref"
    etl(cli, cfg, "--input", media, "--output", ref)
    assert tree(out) == tree(ref)
    assert cli("inspect", out, "--verify").code == 0


def test_a_late_decode_failure_mid_way_recuts_only_the_shards_around_it(cli, source, tmp_path):
    """A JPEG cut short mid-way passes the header pass and fails the full decode: its task alone is
    decoded again (its content changed), and of the shards only the runs the key cut over the
    surviving records ends elsewhere are re-cut from the parts; every other shard is a part as it
    is, the previous version's bytes. The layout is the key cut over the records that survived.
    With the image intact again, the next version is the first one byte for byte."""
    media, cfg = source
    out = tmp_path / "out"
    etl(cli, cfg, "--input", media, "--output", out)
    old, first = shard_files(out), tree(out)
    victim = middle_image(out)
    intact = (media / victim).read_bytes()
    change(media, victim, "truncated")
    etl(cli, cfg, "--input", media, "--output", out)
    m, met = json.loads((out / "manifest.json").read_text()), metrics(out)
    assert len(rebuilt(out)) == 1
    assert m["quarantine"]["aggregate"]["by_reason"]["truncated"] == 2  # the planted one and this one
    recut = [s for s in m["shards"][:-1] if "parts" in s]  # the last shard is re-cut for the planted one
    assert 1 <= len(recut) == met["shards_repacked"] - 1 <= 3
    keys = (out / "keys.txt").read_text(encoding="utf-8").split()
    assert [list(k) for k in shard_files(out)] == cutter.cut_by_keys(keys, 16, False, key=str)
    for keys_, raw in shard_files(out).items():
        if keys_ in old and victim not in keys_:
            assert raw == old[keys_]
    ref = tmp_path / "ref"
    etl(cli, cfg, "--input", media, "--output", ref)
    assert tree(out) == tree(ref)

    # the image intact again: its task is built again, the parts the re-cut spread over shards
    # are written back from them, and the cache is the first one, byte for byte
    (media / victim).write_bytes(intact)
    etl(cli, cfg, "--input", media, "--output", out)
    assert len(rebuilt(out)) == 1 and metrics(out)["shards_repacked"] == 1  # the planted late failure's
    assert metrics(out)["shards_from_previous"] == len(metrics(out)["tasks"]) - 1
    assert tree(out) == first


@pytest.mark.s3
def test_from_s3_a_removed_image_reads_only_the_media_of_the_shards_the_cut_changes(
        cli, s3, source, tmp_path, monkeypatch):
    """A source on moto S3, one captioned image (and its caption) deleted from the middle: the
    build GETs the media of the shard the key cut changes, each once (15 GETs), where counting
    cuts (``[cache] shard_size = 16``) GET the media of that shard and every later one (45)."""
    monkeypatch.setenv("WARP_CACHE_DIR", str(tmp_path / "cache"))
    media, cfg = source
    fixed_cfg = fixed_config(cfg, tmp_path)
    for p in sorted(media.rglob("*")):
        if p.is_file():
            s3.client.put_object(Bucket=s3.bucket, Key=f"src/{p.relative_to(media).as_posix()}", Body=p.read_bytes())
    out, out_fixed = tmp_path / "out", tmp_path / "fixed"
    etl(cli, cfg, "--input", s3.url("src"), "--output", str(out))
    etl(cli, fixed_cfg, "--input", s3.url("src"), "--output", str(out_fixed))
    old, old_fixed = shard_files(out), shard_files(out_fixed)
    victim = middle_image(out)
    for key in (victim, victim[:-4] + ".txt"):
        s3.client.delete_object(Bucket=s3.bucket, Key=f"src/{key}")
    change(media, victim, "removed")

    def source_gets() -> Counter:
        return Counter(q["key"][len("src/"):] for q in s3.requests("GET") if q["key"].startswith("src/"))

    s3.reset_counts()
    etl(cli, cfg, "--input", s3.url("src"), "--output", str(out))
    gets = source_gets()
    fresh = [k for keys in shard_files(out) if keys not in old for k in keys]
    assert gets == Counter(dict.fromkeys(fresh, 1)) and sum(gets.values()) == 15
    assert len(rebuilt(out)) == 1

    s3.reset_counts()
    etl(cli, fixed_cfg, "--input", s3.url("src"), "--output", str(out_fixed))
    gets_fixed = source_gets()
    fresh_fixed = [k for keys in shard_files(out_fixed) if keys not in old_fixed for k in keys]
    # the rebuilt shards' stored records, and the late decode failure among their tasks' records
    assert set(fresh_fixed) <= set(gets_fixed) <= set(fresh_fixed) | {"group_001/truncated.jpg"}
    assert set(gets_fixed.values()) == {1}
    assert sum(gets_fixed.values()) == 45

    ref = tmp_path / "ref"
    etl(cli, cfg, "--input", media, "--output", ref)
    assert tree(out) == tree(ref)


@pytest.mark.s3
def test_to_s3_a_late_failure_that_moves_later_shards_gives_the_cold_build(cli, s3, source, tmp_path, monkeypatch):
    """An s3:// output, a JPEG cut short whose loss makes the key cut over the surviving records
    one cut fewer or more: the parts after it are shards under an index moved by one (fetched,
    checked and put under their new name), the parts around it re-cut; the version is what a
    local cold build writes."""
    monkeypatch.setenv("WARP_CACHE_DIR", str(tmp_path / "cache"))
    media, cfg = source
    ref = tmp_path / "ref"
    etl(cli, cfg, "--input", media, "--output", ref)
    kept = (ref / "keys.txt").read_text(encoding="utf-8").split()
    n = len(cutter.cut_by_keys(kept, 16, False, key=str))
    victim = next(k for i, k in enumerate(kept) if k.endswith(".jpg") and i > len(kept) // 4
                  and len(cutter.cut_by_keys(kept[:i] + kept[i + 1:], 16, False, key=str)) != n)
    etl(cli, cfg, "--input", media, "--output", s3.url("fc"))
    change(media, victim, "truncated")
    res = etl(cli, cfg, "--input", media, "--output", s3.url("fc"))
    prefix = f"fc/{res['path'].rstrip('/').rsplit('/', 1)[-1]}/"
    got = {o["Key"][len(prefix):]: s3.client.get_object(Bucket=s3.bucket, Key=o["Key"])["Body"].read()
           for o in s3.client.list_objects_v2(Bucket=s3.bucket, Prefix=prefix)["Contents"]}
    m = json.loads(got.pop("metrics.json"))
    assert m["shards_moved"] > 0 and 1 <= m["shards_repacked"] <= 4
    assert len([t for t in m["tasks"] if not t["reused"]]) == 1  # the task of the image cut short
    etl(cli, cfg, "--input", media, "--output", ref)
    assert got == tree(ref)
    assert json.loads(got["manifest.json"])["records"] == len(kept) - 1
