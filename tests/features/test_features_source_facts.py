"""A feature-cache source folder on S3 is listed, not read, on an up-to-date rerun
(docs/features-config.md, "Sources on object storage"; warp/features/sources.py).

Requests are counted by the moto S3 server: a cold build reads each object once; the no-op rerun
lists the folder once and sends no GET or HEAD for any source object; a media object overwritten
with other bytes is detected from the listing and read by the scan, no caption is read again, and
the cache is the one a cold build of the new folder makes.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from warpdata.sampledata import captions

pytestmark = pytest.mark.s3


def tree(root: Path) -> dict[str, bytes]:
    # metrics.json holds the run's timings; every other file is the cache's content
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and p.name != "metrics.json"}


def upload(s3, media: Path, prefix: str) -> list[str]:
    keys = []
    for p in sorted(media.rglob("*")):
        if p.is_file():
            keys.append(f"{prefix}/{p.relative_to(media).as_posix()}")
            s3.client.put_object(Bucket=s3.bucket, Key=keys[-1], Body=p.read_bytes())
    return keys


def source_requests(s3, prefix: str) -> dict[str, Any]:
    reqs = s3.requests()
    """Listings of the source folder, GETs of each source object, HEADs of any."""
    return {"LIST": len([q for q in reqs if q["method"] == "GET" and q["key"] == "" and "list-type" in q["query"]
                         and f"prefix={prefix}" in q["query"]]),
            "GET": Counter(q["key"] for q in reqs if q["method"] == "GET" and q["key"].startswith(prefix + "/")),
            "HEAD": len([q for q in reqs if q["method"] == "HEAD" and q["key"].startswith(prefix + "/")])}


def etl(cli, cfg: Path, *args) -> dict:
    r = cli("etl", "--config", cfg, "--json", *args)
    assert r.code == 0, r.err
    return r.json()


def test_a_rerun_lists_once_and_reads_nothing_then_only_a_changed_object_is_scanned(cli, s3, tmp_path, monkeypatch):
    monkeypatch.setenv("WARP_CACHE_DIR", str(tmp_path / "cache"))
    gen = captions.generate(tmp_path / "cap", count=12, seed=3)
    media = Path(gen["path"])
    keys = upload(s3, media, "src")
    cfg = Path(gen["config"])
    out = tmp_path / "out"
    args = ("--input", s3.url("src"), "--output", str(out))

    s3.reset_counts()
    first = etl(cli, cfg, *args)
    assert first["status"] == "built"
    cold = source_requests(s3, "src")
    assert cold["LIST"] == 1 and cold["HEAD"] == 0
    # each object read once: the captions and the media the scan hashes (it keeps their bytes for
    # the build); the media of a rejected record (no caption, an empty one, not an image) not at all
    assert max(cold["GET"].values()) == 1
    assert "src/broken/no_caption.jpg" not in cold["GET"] and "src/broken/notes.pdf" not in cold["GET"]

    # the cache is the one a local copy of the folder builds
    ref = tmp_path / "ref"
    assert etl(cli, cfg, "--input", str(media), "--output", str(ref))["fingerprint"] == first["fingerprint"]
    assert tree(out) == tree(ref)

    # the no-op rerun: one listing, no source object read
    s3.reset_counts()
    again = etl(cli, cfg, *args)
    assert again["status"] == "up-to-date" and again["fingerprint"] == first["fingerprint"]
    assert source_requests(s3, "src") == {"LIST": 1, "GET": Counter(), "HEAD": 0}
    assert len(s3.requests()) == 1

    # one image overwritten with another's bytes: its listed size/ETag differ; the scan reads it (and
    # nothing else), the new version's build copies the other media it decodes, each once
    images = sorted(k for k in keys if k.startswith("src/group_000/") and k.endswith(".jpg"))
    changed, donor = images[0], images[1]
    new_bytes = (media / donor[len("src/"):]).read_bytes()
    s3.client.put_object(Bucket=s3.bucket, Key=changed, Body=new_bytes)
    (media / changed[len("src/"):]).write_bytes(new_bytes)  # the local copy, for the cold build below
    s3.reset_counts()
    third = etl(cli, cfg, *args)
    assert third["status"] == "built" and third["fingerprint"] != first["fingerprint"]
    got = source_requests(s3, "src")
    assert got["LIST"] == 1 and got["HEAD"] == 0 and max(got["GET"].values()) == 1
    assert not [k for k in got["GET"] if k.endswith(".txt")]  # no caption read again
    assert changed in got["GET"]
    assert set(got["GET"]) <= set(cold["GET"])

    ref2 = tmp_path / "ref2"
    assert etl(cli, cfg, "--input", str(media), "--output", str(ref2))["fingerprint"] == third["fingerprint"]
    assert tree(out) == tree(ref2)

    s3.reset_counts()
    assert etl(cli, cfg, *args)["status"] == "up-to-date"
    assert source_requests(s3, "src") == {"LIST": 1, "GET": Counter(), "HEAD": 0}
    # the mirror went with each run; the facts stay for the next
    assert not (tmp_path / "cache" / "etl-source").exists()
    assert [p.name.split("-")[0] for p in (tmp_path / "cache" / "etl-source-facts").iterdir()] == ["features"]


def test_the_scan_reads_only_the_changed_object_when_the_version_is_there(cli, s3, tmp_path, monkeypatch):
    """A media object replaced, then put back: the second change is read by the scan alone (one GET),
    and the version it names is the first build's, still in the store (an s3:// output keeps every
    version), so nothing else is read. The same for a caption, which its media file depends on."""
    monkeypatch.setenv("WARP_CACHE_DIR", str(tmp_path / "cache"))
    gen = captions.generate(tmp_path / "cap", count=8, seed=5)
    media = Path(gen["path"])
    keys = upload(s3, media, "src")
    cfg = Path(gen["config"])
    args = ("--input", s3.url("src"), "--output", s3.url("fc"))
    first = etl(cli, cfg, *args)
    images = sorted(k for k in keys if k.startswith("src/group_001/") and k.endswith(".png"))
    key = images[0]
    original = (media / key[len("src/"):]).read_bytes()
    s3.client.put_object(Bucket=s3.bucket, Key=key, Body=original + b"\0")  # other bytes: another ETag
    etl(cli, cfg, *args)
    s3.client.put_object(Bucket=s3.bucket, Key=key, Body=original)
    s3.reset_counts()
    back = etl(cli, cfg, *args)
    assert back["status"] == "up-to-date" and back["fingerprint"] == first["fingerprint"]
    got = source_requests(s3, "src")
    assert got == {"LIST": 1, "GET": Counter({key: 1}), "HEAD": 0}

    # a caption replaced, then put back: the caption is read, and its media file (the record's
    # digest covers both), nothing else
    cap = key.rsplit(".", 1)[0] + ".txt"
    text = (media / cap[len("src/"):]).read_bytes()
    s3.client.put_object(Bucket=s3.bucket, Key=cap, Body=b"another caption\n")
    assert etl(cli, cfg, *args)["fingerprint"] != first["fingerprint"]
    s3.client.put_object(Bucket=s3.bucket, Key=cap, Body=text)
    s3.reset_counts()
    back = etl(cli, cfg, *args)
    assert back["status"] == "up-to-date" and back["fingerprint"] == first["fingerprint"]
    assert source_requests(s3, "src") == {"LIST": 1, "GET": Counter({cap: 1, key: 1}), "HEAD": 0}
