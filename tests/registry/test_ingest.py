"""`warp ingest`: raw layouts -> a published dataset (local store, and moto S3 for the remote case)."""

from __future__ import annotations

import io
import json
import os

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import warpdata
from PIL import Image


def jpeg(w: int, h: int, color=(200, 30, 30)) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (w, h), color).save(buf, "JPEG")
    return buf.getvalue()


def png(w: int, h: int, value: int = 1) -> bytes:
    buf = io.BytesIO()
    Image.new("L", (w, h), value).save(buf, "PNG")
    return buf.getvalue()


def make_folder(root, per_class=3):
    """root/<cat|dog>/<name>.jpg, sizes (10+i) x (20+i); returns {rel: bytes}."""
    files = {}
    for c in ("cat", "dog"):
        (root / c).mkdir(parents=True, exist_ok=True)
        for i in range(per_class):
            data = jpeg(10 + i, 20 + i)
            rel = f"{c}/{c}{i}.jpg"
            (root / rel).write_bytes(data)
            files[rel] = data
    return files


def rows_of(ds_id, table="main"):
    return warpdata.dataset(ds_id).table(table).to_arrow().to_pylist()


def test_imagefolder_table_artifact_binding(cli, tmp_path):
    files = make_folder(tmp_path / "pets")
    r = cli("ingest", "imagefolder", tmp_path / "pets", "ws/pets", "--json")
    assert r.code == 0, r.err
    doc = r.json()
    assert doc["rows"] == 6 and doc["quarantined"] == 0 and doc["manifest_written"]
    rows = rows_of("ws/pets")
    assert [x["image"] for x in rows] == sorted(files)
    assert rows[0] == {"id": "cat/cat0.jpg", "label": "cat", "image": "cat/cat0.jpg", "width": 10, "height": 20,
                       "bytes": len(files["cat/cat0.jpg"])}
    assert {x["label"] for x in rows} == {"cat", "dog"}
    ds = warpdata.dataset("ws/pets")
    assert ds.tables == ["main"]  # no quarantine table when nothing was quarantined
    b = ds.manifest.bindings[0]
    assert (b.table, b.column, b.artifact, b.ref_type) == ("main", "image", "images", "image")
    art = ds.artifact("images")
    assert sorted(art.members()) == sorted(files)
    assert art.read("dog/dog2.jpg") == files["dog/dog2.jpg"]


def test_bad_files_are_quarantined_with_reasons(cli, tmp_path):
    root = tmp_path / "pets"
    make_folder(root)
    good = jpeg(8, 8)
    (root / "cat" / "cut.jpg").write_bytes(good[: len(good) // 2])  # header intact, no EOI: truncated
    (root / "cat" / "garbage.jpg").write_bytes(b"\xff\xd8\xff\xe0" + b"\x00" * 3)  # JPEG signature, broken header
    (root / "cat" / "text.jpg").write_bytes(b"hello, not an image")
    (root / "cat" / "empty.png").write_bytes(b"")
    (root / "cat" / "big.png").write_bytes(png(400, 400, 7) + b"\0" * 5000)
    (root / "dog" / "notes.txt").write_text("labels elsewhere")
    (root / "dog" / "escape.jpg").symlink_to(tmp_path / "outside.jpg")
    (tmp_path / "outside.jpg").write_bytes(good)  # a valid image, but outside the root
    (root / "dog" / "dangling.jpg").symlink_to(root / "cat" / "gone.jpg")
    (root / "dog" / "inside.jpg").symlink_to(root / "cat" / "cat1.jpg")  # a link that stays inside: kept
    os.mkfifo(root / "dog" / "pipe.jpg")
    r = cli("ingest", "imagefolder", root, "ws/pets", "--max-file-size", "4KB", "--json")
    assert r.code == 0, r.err
    doc = r.json()
    assert doc["rows"] == 7
    q = {x["path"]: x for x in rows_of("ws/pets", "quarantine")}
    assert {p: x["reason"] for p, x in q.items()} == {
        "cat/cut.jpg": "truncated", "cat/garbage.jpg": "decode-error", "cat/text.jpg": "decode-error",
        "cat/empty.png": "empty-content", "cat/big.png": "too-large", "dog/notes.txt": "unsupported-extension",
        "dog/escape.jpg": "path-outside-root", "dog/dangling.jpg": "missing-file", "dog/pipe.jpg": "not-regular-file",
    }
    assert str(tmp_path / "outside.jpg") in q["dog/escape.jpg"]["message"]
    assert doc["quarantined"] == 9 and doc["reasons"]["decode-error"] == 2
    members = warpdata.dataset("ws/pets").artifact("images").members()
    assert "dog/inside.jpg" in members and not any(m in members for m in q)


def test_ids_stem_path_hash_and_duplicates(cli, tmp_path):
    root = tmp_path / "f"
    (root / "a").mkdir(parents=True)
    (root / "b").mkdir()
    (root / "a" / "x.jpg").write_bytes(jpeg(4, 4))
    (root / "b" / "x.jpg").write_bytes(jpeg(5, 5))
    r = cli("ingest", "imagefolder", root, "ws/ids", "--id", "stem", "--json")
    assert r.code == 0 and r.json()["rows"] == 1
    (q,) = rows_of("ws/ids", "quarantine")
    assert q["path"] == "b/x.jpg" and q["reason"] == "duplicate" and "--id path" in q["message"]
    assert cli("ingest", "imagefolder", root, "ws/ids").code == 0  # ids default to the relative path
    assert [x["id"] for x in rows_of("ws/ids")] == ["a/x.jpg", "b/x.jpg"]
    assert cli("ingest", "imagefolder", root, "ws/ids", "--id", "hash").code == 0
    import hashlib

    assert [x["id"] for x in rows_of("ws/ids")] == [hashlib.sha256((root / p).read_bytes()).hexdigest()
                                                     for p in ("a/x.jpg", "b/x.jpg")]
    assert cli("ingest", "imagefolder", root, "ws/ids", "--id", "uuid").code == 2


def test_reingest_uploads_nothing_and_equals_publish(cli, tmp_path):
    """Same version as `warp publish` of the same table and files; a second ingest sends no blob."""
    make_folder(tmp_path / "pets")
    r1 = cli("ingest", "imagefolder", tmp_path / "pets", "ws/pets", "--keep", tmp_path / "tables",
             "--shard-size", "2KB", "--json")
    assert r1.code == 0, r1.err
    first = r1.json()
    assert first["blobs_uploaded"] == first["blobs_total"] > 3
    r2 = cli("ingest", "imagefolder", tmp_path / "pets", "ws/pets", "--shard-size", "2KB", "--json")
    second = r2.json()
    assert second["version_hash"] == first["version_hash"]
    assert second["blobs_uploaded"] == 0 and second["bytes_uploaded"] == 0 and second["already_published"]
    assert sorted(os.listdir(tmp_path / "tables")) == ["main.parquet", "quarantine.parquet"]
    r3 = cli("publish", "ws/pets", "--table", f"main={tmp_path}/tables/main.parquet",
             "--artifact", f"images={tmp_path}/pets", "--bind", "main.image=images:image",
             "--shard-size", "2KB", "--dry-run", "--json")
    assert r3.code == 0, r3.err
    plan = r3.json()
    assert plan["version_hash"] == first["version_hash"] and plan["blobs_to_upload"] == 0
    # a changed file gives a new version that uploads only what changed
    (tmp_path / "pets" / "dog" / "dog0.jpg").write_bytes(jpeg(30, 30))
    r4 = cli("ingest", "imagefolder", tmp_path / "pets", "ws/pets", "--shard-size", "2KB", "--json").json()
    assert r4["version_hash"] != first["version_hash"]
    assert 0 < r4["blobs_uploaded"] < r4["blobs_total"]


def test_paired_masks(cli, tmp_path):
    root, masks = tmp_path / "img", tmp_path / "masks"
    make_folder(root, per_class=2)
    masks.mkdir()
    for rel in ("cat/cat0", "cat/cat1", "dog/dog0"):
        (masks / rel).parent.mkdir(parents=True, exist_ok=True)
        (masks / f"{rel}.png").write_bytes(png(4, 4))
    r = cli("ingest", "imagefolder", root, "ws/seg", "--pair", masks, "--json")
    assert r.code == 0, r.err
    rows = rows_of("ws/seg")
    assert [(x["image"], x["mask"]) for x in rows] == [("cat/cat0.jpg", "cat/cat0.png"), ("cat/cat1.jpg", "cat/cat1.png"),
                                                        ("dog/dog0.jpg", "dog/dog0.png")]
    (q,) = rows_of("ws/seg", "quarantine")
    assert (q["path"], q["reason"]) == ("dog/dog1.jpg", "unpaired")
    ds = warpdata.dataset("ws/seg")
    assert ds.artifact("masks").read("dog/dog0.png") == (masks / "dog/dog0.png").read_bytes()


def test_paired_folders(cli, tmp_path):
    a, b = tmp_path / "image", tmp_path / "mask"
    a.mkdir()
    b.mkdir()
    for i in range(4):
        (a / f"{i}.jpg").write_bytes(jpeg(6, 6))
    for i in (0, 1, 2, 9):
        (b / f"{i}.png").write_bytes(png(6, 6))
    (b / "2.png").write_bytes(b"\x89PNG\r\n\x1a\n")  # header cut short
    r = cli("ingest", "paired", a, b, "ws/pairs", "--json")
    assert r.code == 0, r.err
    assert [(x["id"], x["image"], x["mask"]) for x in rows_of("ws/pairs")] == [("0", "0.jpg", "0.png"),
                                                                                ("1", "1.jpg", "1.png")]
    q = {(x["source"], x["path"]): x["reason"] for x in rows_of("ws/pairs", "quarantine")}
    assert q == {("mask", "2.png"): "decode-error", ("image", "3.jpg"): "unpaired", ("mask", "9.png"): "unpaired"}
    ds = warpdata.dataset("ws/pairs")
    assert sorted(ds.artifacts) == ["image", "mask"]
    r = cli("ingest", "paired", a, b, "ws/pairs", "--names", "x,x")
    assert r.code == 2 and "twice" in r.err


@pytest.mark.parametrize("fmt", ["csv", "jsonl", "parquet"])
def test_table_with_file_columns(cli, tmp_path, fmt):
    photos = tmp_path / "photos"
    files = make_folder(photos)
    (tmp_path / "secret.jpg").write_bytes(jpeg(3, 3))
    rels = sorted(files)
    paths = [rels[0], f"./{rels[1]}", str(photos / rels[2]), "../secret.jpg", "missing.jpg", None]
    tab = pa.table({"image": paths, "caption": [f"c{i}" for i in range(6)]})
    src = tmp_path / f"t.{fmt}"
    if fmt == "csv":
        src.write_text("image,caption\n" + "".join(f"{p or ''},{c}\n" for p, c in zip(paths, tab["caption"].to_pylist(), strict=True)))
    elif fmt == "jsonl":
        src.write_text("".join(json.dumps(r) + "\n" for r in tab.to_pylist()))
    else:
        pq.write_table(tab, src)
    r = cli("ingest", "csv", src, "ws/cap", "--file-column", "image", "--root", photos, "--json")
    assert r.code == 0, r.err
    assert rows_of("ws/cap") == [{"image": rels[i], "caption": f"c{i}"} for i in range(3)]
    q = {x["source"]: x["reason"] for x in rows_of("ws/cap", "quarantine")}
    assert q == {"row 3": "path-outside-root", "row 4": "missing-file", "row 5": "missing-file"}
    ds = warpdata.dataset("ws/cap")
    assert sorted(ds.artifact("images").members()) == rels[:3]
    r = cli("ingest", "csv", src, "ws/cap", "--file-column", "path", "--root", photos)
    assert r.code == 2 and "no column 'path'" in r.err


def test_row_groups_stream(cli, tmp_path, monkeypatch):
    """Rows are written in bounded row groups, not one table built in memory."""
    import warpdata.publishing.ingest as ingest

    monkeypatch.setattr(ingest, "GROUP_ROWS", 4)
    monkeypatch.setattr(ingest, "CHECK_WINDOW", 3)
    make_folder(tmp_path / "pets", per_class=5)
    assert cli("ingest", "imagefolder", tmp_path / "pets", "ws/pets", "--keep", tmp_path / "k").code == 0
    md = pq.read_metadata(tmp_path / "k" / "main.parquet")
    assert md.num_rows == 10 and md.num_row_groups == 3


def test_walk_order_skips_and_no_symlinked_dirs(tmp_path):
    from warpdata.publishing.ingest import walk

    (tmp_path / "b").mkdir()
    (tmp_path / "a" / "z").mkdir(parents=True)
    for rel in ("b/1", "a/2", "a/z/3", "c", ".hidden", "a/.DS_Store"):
        (tmp_path / rel).write_bytes(b"x")
    (tmp_path / "link").symlink_to(tmp_path / "a")
    assert list(walk(str(tmp_path))) == ["a/2", "a/z/3", "b/1", "c", "link"]


def test_errors_are_typed(cli, tmp_path):
    r = cli("ingest", "imagefolder", tmp_path / "nope", "ws/x")
    assert r.code == 66 and "is not a directory" in r.err
    (tmp_path / "bad" / "c").mkdir(parents=True)
    (tmp_path / "bad" / "c" / "x.jpg").write_bytes(b"nope")
    r = cli("ingest", "imagefolder", tmp_path / "bad", "ws/x")
    assert r.code == 65 and "no valid file" in r.err and "decode-error" in r.err
    assert not (tmp_path / "data").exists() or not list((tmp_path / "data").rglob("*.json"))
    assert cli("ingest", "imagefolder", tmp_path / "bad", "Not An Id").code == 2
    assert cli("ingest", "tarball", tmp_path, "ws/x").code == 2
    assert cli("ingest", "paired", tmp_path, "ws/x").code == 2
    (tmp_path / "t.csv").write_text('image\n"unterminated\n')
    r = cli("ingest", "csv", tmp_path / "t.csv", "ws/x", "--file-column", "image", "--root", tmp_path)
    assert r.code == 65, r.err


def test_quiet_and_json_print_no_progress(cli, tmp_path, monkeypatch):
    monkeypatch.setenv("FORCE_COLOR", "1")  # would draw bars if not silenced
    make_folder(tmp_path / "pets")
    r = cli("-q", "ingest", "imagefolder", tmp_path / "pets", "ws/pets")
    assert r.code == 0 and r.err == "" and len(r.out.strip()) == 64
    r = cli("ingest", "imagefolder", tmp_path / "pets", "ws/pets", "--json")
    assert r.code == 0 and "checking" not in r.err and json.loads(r.out)["rows"] == 6


@pytest.mark.s3
def test_ingest_to_s3_twice_uploads_nothing(cli, s3, tmp_path, monkeypatch):
    monkeypatch.setenv("WARP_STORE", s3.url("warp"))
    make_folder(tmp_path / "pets")
    first = cli("ingest", "imagefolder", tmp_path / "pets", "ws/pets", "--json")
    assert first.code == 0, first.err
    assert s3.count("PUT", "warp/blobs/") == first.json()["blobs_total"]
    s3.reset_counts()
    second = cli("ingest", "imagefolder", tmp_path / "pets", "ws/pets", "--json")
    assert second.json()["version_hash"] == first.json()["version_hash"]
    assert second.json()["blobs_uploaded"] == 0 and s3.count("PUT") == 0
    ds = warpdata.dataset("ws/pets", mode="remote")
    assert ds.artifact("images").read("cat/cat1.jpg") == (tmp_path / "pets" / "cat" / "cat1.jpg").read_bytes()


def test_max_pixels_takes_k_m_g_units(cli, tmp_path):
    # issue 40: `--max-pixels 1M` was refused ("'1M' is not a valid integer") though sizes take units
    from warpdata.core.sizes import parse_count_option

    assert [parse_count_option(t, "--max-pixels") for t in ("89478485", "1M", "0.3k", "2.5K", " 1g ")] == \
        [89_478_485, 10**6, 300, 2500, 10**9]
    root = tmp_path / "pets"
    make_folder(root)  # (10+i) x (20+i): 200, 231 and 264 pixels per class
    (root / "cat" / "wide.jpg").write_bytes(jpeg(40, 30))  # 1,200 pixels
    r = cli("-q", "ingest", "imagefolder", root, "ws/pets", "--max-pixels", "1K")
    assert r.code == 0 and len(r.out.strip()) == 64
    assert r.err == ("warning: 1 file(s) quarantined (too-many-pixels 1); see the quarantine table, e.g. cat/wide.jpg: "
                     "JPEG header declares 40x30 = 1,200 pixels, over the cap of 1,000\n")
    r = cli("-q", "ingest", "imagefolder", root, "ws/pets", "--max-pixels", "1M", "--json")
    assert r.code == 0 and r.err == "" and (r.json()["rows"], r.json()["quarantined"]) == (7, 0)
    for bad in ("1Mi", "0", "0.5", "-3", "lots", "1.5KB"):
        r = cli("ingest", "imagefolder", root, "ws/pets", "--max-pixels", bad)
        assert (r.code, r.out) == (2, ""), bad
        assert r.err.splitlines() == [
            f"error: --max-pixels {bad!r} is not a count of at least 1",
            "hint: e.g. --max-pixels 50M: a whole number, or with K, M or G (powers of 1000: 1M = 1,000,000)"], bad
