"""Every validation reason code, each triggered by a real broken sample, in each label format."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from warpdata.core.config import ConfigSource
from warpdata.sampledata.photos import encode_jpeg, synthetic_photo
from warpdata.warehouse import config as wconfig
from warpdata.warehouse.images import exif_orientation_jpeg, probe
from warpdata.warehouse.scan import scan
from warpdata.warehouse.transform import orient


def _img(rng, w=60, h=40) -> bytes:
    return encode_jpeg(synthetic_photo(rng, w, h))


def _cfg(d: Path, text: str) -> wconfig.WarehouseConfig:
    import tomllib

    p = d / "t.toml"
    p.write_text(text)
    return wconfig.load(tomllib.loads(text), ConfigSource(str(p), text), p)


def _reasons(sc) -> dict[str, str]:
    return {r.sample_id: r.reason for r in sc.quarantine.records}


def test_jsonl_every_reason(tmp_path):
    rng = np.random.default_rng(0)
    good = _img(rng)
    (tmp_path / "ok.jpg").write_bytes(good)
    (tmp_path / "ok2.jpg").write_bytes(_img(rng))
    (tmp_path / "noise.jpg").write_bytes(rng.integers(0, 256, 500, dtype=np.uint8).tobytes())
    (tmp_path / "cut.jpg").write_bytes(good[: len(good) // 2])
    (tmp_path / "adir.jpg").mkdir()
    for name in ("oob", "clip", "degen", "many", "trunc8", "size", "cls", "nan", "dup"):
        (tmp_path / f"{name}.jpg").write_bytes(good)
    rows = [
        {"image": "ok.jpg", "boxes": [[1, 1, 10, 10]], "classes": ["a"], "frame_id": 3, "run_id": "r1"},
        {"image": "ok2.jpg", "boxes": [], "classes": []},
        {"image": "missing.jpg", "boxes": [], "classes": []},
        {"image": "adir.jpg", "boxes": [], "classes": []},
        {"image": "noise.jpg", "boxes": [], "classes": []},
        {"image": "cut.jpg", "boxes": [], "classes": []},
        {"image": "oob.jpg", "boxes": [[10, 10, 70, 20]], "classes": ["a"]},
        {"image": "clip.jpg", "boxes": [[-0.5, 0, 60.5, 40.9]], "classes": ["b"]},
        {"image": "degen.jpg", "boxes": [[5, 5, 5, 9]], "classes": ["a"]},
        {"image": "many.jpg", "boxes": [[1, 1, 5, 5]] * 4, "classes": ["a"] * 4},
        {"image": "size.jpg", "boxes": [], "classes": [], "width": 61, "height": 40},
        {"image": "cls.jpg", "boxes": [[1, 1, 5, 5]], "classes": ["zebra"]},
        {"image": "cls.jpg", "boxes": [[1, 1, 5, 5]], "classes": [7]},
        {"image": "dup.jpg", "boxes": [], "classes": []},
        {"image": "dup.jpg", "boxes": [], "classes": []},
        {"image": 5},
        {"image": "x.jpg", "boxes": [[1, 2, 3]], "classes": ["a"]},
    ]
    lines = [json.dumps(r) for r in rows]
    lines.append('{"image": "nan.jpg", "boxes": [[NaN, 1, 5, 5]], "classes": ["a"]}')
    lines.append("{not json")
    (tmp_path / "l.jsonl").write_text("\n".join(lines) + "\n")
    cfg = _cfg(tmp_path, '[source]\nformat = "jsonl"\nlabels = "l.jsonl"\nclasses = ["a", "b"]\n'
                         '[transform]\nmax_boxes = 3\noverflow = "reject"\n')
    sc = scan(cfg)
    got = _reasons(sc)
    assert got["missing.jpg"] == "missing-file"
    assert got["adir.jpg"] == "unreadable"
    assert got["noise.jpg"] == "decode-error"
    assert got["cut.jpg"] == "truncated"
    assert got["oob.jpg"] == "box-out-of-bounds"
    assert got["degen.jpg"] == "box-degenerate"
    assert got["many.jpg"] == "too-many-boxes"
    assert got["size.jpg"] == "bad-size"
    assert got["cls.jpg"] == "unknown-class"
    assert got["dup.jpg#dup15"] == "duplicate"
    assert got["nan.jpg"] == "non-finite"
    assert got["l.jsonl:16"] == "bad-schema" and got["x.jpg"] == "bad-schema" and got["l.jsonl:19"] == "bad-schema"
    valid = {s.key: s for s in sc.valid}
    assert set(valid) == {"ok.jpg", "ok2.jpg", "clip.jpg", "dup.jpg"}
    # within the 1-px tolerance: clipped, not rejected
    assert valid["clip.jpg"].boxes.tolist() == [[0.0, 0.0, 60.0, 40.0]]
    assert valid["ok.jpg"].frame_id == 3 and valid["ok.jpg"].run_id == "r1" and valid["ok.jpg"].run == "r1"
    assert valid["ok2.jpg"].empty
    agg = sc.quarantine.aggregate()
    assert agg.missing == 2 and agg.invalid == len(got) - 2
    # the second 'cls.jpg' line is a duplicate of a rejected one: counted once
    assert sum(1 for r in sc.quarantine.records if r.sample_id == "cls.jpg") == 1


def test_overflow_truncate_keeps_first_boxes(tmp_path):
    rng = np.random.default_rng(1)
    (tmp_path / "a.jpg").write_bytes(_img(rng))
    (tmp_path / "l.jsonl").write_text(json.dumps({"image": "a.jpg", "boxes": [[i, i, i + 5, i + 5] for i in range(5)],
                                                  "classes": [0, 1, 0, 1, 0]}) + "\n")
    sc = scan(_cfg(tmp_path, '[source]\nformat = "jsonl"\nlabels = "l.jsonl"\n[transform]\nmax_boxes = 2\n'))
    assert sc.truncated_boxes == 3
    assert sc.valid[0].boxes.tolist() == [[0, 0, 5, 5], [1, 1, 6, 6]] and sc.valid[0].classes.tolist() == [0, 1]


def test_coco_orphans_duplicates_schema_and_unknown_category(tmp_path):
    rng = np.random.default_rng(2)
    (tmp_path / "images").mkdir()
    for n in ("a", "b", "c", "d"):
        (tmp_path / "images" / f"{n}.jpg").write_bytes(_img(rng))
    doc = {"images": [{"id": 1, "file_name": "a.jpg", "width": 60, "height": 40},
                      {"id": 2, "file_name": "b.jpg"},
                      {"id": 2, "file_name": "c.jpg"},
                      {"id": 3, "file_name": "d.jpg"},
                      {"file_name": "e.jpg"}],
           "annotations": [{"id": 1, "image_id": 1, "category_id": 1, "bbox": [1, 1, 5, 5]},
                           {"id": 2, "image_id": 99, "category_id": 1, "bbox": [1, 1, 5, 5]},
                           {"id": 3, "image_id": 3, "category_id": 42, "bbox": [1, 1, 5, 5]},
                           {"id": 4, "image_id": 2, "category_id": 1, "bbox": [1, 1, 0, 5]}],
           "categories": [{"id": 1, "name": "thing"}]}
    (tmp_path / "annotations.json").write_text(json.dumps(doc))
    sc = scan(_cfg(tmp_path, '[source]\nformat = "coco"\n'))
    got = _reasons(sc)
    assert got["annotations.json#annotation:2"] == "orphan-label"
    assert got["images/c.jpg#dup2"] == "duplicate"
    assert got["images/d.jpg"] == "unknown-class"
    assert got["images/b.jpg"] == "box-degenerate"
    assert got["e.jpg"] == "bad-schema"
    assert [s.key for s in sc.valid] == ["images/a.jpg"]
    assert sc.labels.classes == [{"id": 1, "name": "thing"}]


def test_coco_file_that_is_not_coco_is_a_data_error(tmp_path):
    (tmp_path / "annotations.json").write_text("[1, 2]")
    from warpdata.core.errors import DataError

    with pytest.raises(DataError, match="not a COCO annotation file"):
        scan(_cfg(tmp_path, '[source]\nformat = "coco"\n'))
    (tmp_path / "annotations.json").write_text("{broken")
    with pytest.raises(DataError, match="not valid JSON"):
        scan(_cfg(tmp_path, '[source]\nformat = "coco"\n'))


def test_yolo_orphans_schema_out_of_range_and_empty(tmp_path):
    rng = np.random.default_rng(3)
    (tmp_path / "images" / "train").mkdir(parents=True)
    (tmp_path / "labels" / "train").mkdir(parents=True)
    for n in ("a", "b", "c", "d", "e"):
        (tmp_path / "images" / "train" / f"{n}.jpg").write_bytes(_img(rng))
    (tmp_path / "labels" / "train" / "a.txt").write_text("0 0.5 0.5 0.2 0.2\n1 0.25 0.25 0.1 0.1\n")
    (tmp_path / "labels" / "train" / "b.txt").write_text("0 0.5 0.5 0.2\n")
    (tmp_path / "labels" / "train" / "c.txt").write_text("0 1.8 0.5 0.2 0.2\n")
    (tmp_path / "labels" / "train" / "d.txt").write_text("5 0.5 0.5 0.2 0.2\n")
    (tmp_path / "labels" / "train" / "ghost.txt").write_text("0 0.5 0.5 0.2 0.2\n")
    sc = scan(_cfg(tmp_path, '[source]\nformat = "yolo"\nclasses = ["x", "y"]\n'))
    got = _reasons(sc)
    assert got["labels/train/ghost.txt"] == "orphan-label"
    assert got["images/train/b.jpg"] == "bad-schema"
    assert got["images/train/c.jpg"] == "box-out-of-bounds"
    assert got["images/train/d.jpg"] == "unknown-class"
    valid = {s.key: s for s in sc.valid}
    assert set(valid) == {"images/train/a.jpg", "images/train/e.jpg"}
    assert valid["images/train/e.jpg"].empty and valid["images/train/a.jpg"].run == "train"
    np.testing.assert_allclose(valid["images/train/a.jpg"].boxes[0], [24, 16, 36, 24])


@pytest.mark.parametrize("orientation", range(1, 9))
def test_orientation_matches_pillow_exif_transpose(orientation):
    import io

    from PIL import Image, ImageOps

    rng = np.random.default_rng(orientation)
    arr = rng.integers(0, 256, size=(16, 24, 3), dtype=np.uint8)
    im = Image.fromarray(arr)
    exif = Image.Exif()
    exif[0x0112] = orientation
    buf = io.BytesIO()
    im.save(buf, "JPEG", quality=95, exif=exif.tobytes())
    data = buf.getvalue()
    assert exif_orientation_jpeg(data) == orientation
    pr = probe(data)
    decoded = np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))
    want = np.asarray(ImageOps.exif_transpose(Image.open(io.BytesIO(data))).convert("RGB"))
    got = orient(decoded, orientation)
    assert (got == want).all()
    assert pr.oriented_size == (want.shape[1], want.shape[0])


def test_probe_png_and_non_images():
    from warpdata.sampledata.photos import encode_png
    from warpdata.warehouse.images import ProbeError

    rng = np.random.default_rng(0)
    p = probe(encode_png(synthetic_photo(rng, 20, 10)))
    assert (p.kind, p.width, p.height, p.orientation) == ("png", 20, 10, 1)
    with pytest.raises(ProbeError) as ei:
        probe(b"hello world")
    assert ei.value.reason == "decode-error"


def test_paths_leaving_the_root_are_quarantined_and_never_sources(tmp_path):
    rng = np.random.default_rng(7)
    root = tmp_path / "ds"
    (root / "images").mkdir(parents=True)
    (root / "images" / "ok.jpg").write_bytes(_img(rng))
    (tmp_path / "outside.jpg").write_bytes(_img(rng))  # a valid image whose boxes fit
    (root / "images" / "link.jpg").symlink_to(tmp_path / "outside.jpg")
    rows = [{"image": "ok.jpg", "boxes": [], "classes": []},
            {"image": str(tmp_path / "outside.jpg"), "boxes": [[1, 1, 5, 5]], "classes": [0]},
            {"image": "../../outside.jpg", "boxes": [[1, 1, 5, 5]], "classes": [0]},
            {"image": "link.jpg", "boxes": [[1, 1, 5, 5]], "classes": [0]},
            {"image": "a/../../../outside.jpg", "boxes": [], "classes": []}]
    (root / "l.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    sc = scan(_cfg(root, '[source]\nformat = "jsonl"\nlabels = "l.jsonl"\nimages = "images"\n'))
    got = _reasons(sc)
    assert got == {str(tmp_path / "outside.jpg"): "path-outside-root", "../../outside.jpg": "path-outside-root",
                   "images/link.jpg": "path-outside-root", "a/../../../outside.jpg": "path-outside-root"}
    assert [s.key for s in sc.valid] == ["images/ok.jpg"]
    assert [k for k, *_ in sc.sources] == ["images/ok.jpg"]


def test_limits_from_the_config(tmp_path):
    rng = np.random.default_rng(8)
    (tmp_path / "images").mkdir()
    (tmp_path / "images" / "a.jpg").write_bytes(_img(rng, 400, 300))
    (tmp_path / "images" / "b.jpg").write_bytes(_img(rng))
    (tmp_path / "labels").mkdir()
    (tmp_path / "labels" / "b.txt").write_text("70000 0.5 0.5 0.1 0.1\n")
    small = (tmp_path / "images" / "b.jpg").stat().st_size
    sc = scan(_cfg(tmp_path, f'[source]\nformat = "yolo"\n[limits]\nmax_image_mb = {(small + 10) / 1e6}\n'))
    got = {r.sample_id: (r.reason, r.message) for r in sc.quarantine.records}
    assert got["images/a.jpg"][0] == "too-large" and "raise it in [limits]" in got["images/a.jpg"][1]
    assert got["images/b.jpg"][0] == "unknown-class" and "max_class_id = 65535" in got["images/b.jpg"][1]
    assert not sc.valid and sc.labels.classes == []  # no 70,001-entry class table
    sc = scan(_cfg(tmp_path, '[source]\nformat = "yolo"\n[limits]\nmax_class_id = 70000\n'))
    assert {s.key for s in sc.valid} == {"images/a.jpg", "images/b.jpg"} and len(sc.labels.classes) == 70001


def test_coco_without_categories_is_refused(tmp_path):
    from warpdata.core.errors import DataError

    (tmp_path / "images").mkdir()
    doc = {"images": [{"id": 1, "file_name": "a.jpg"}],
           "annotations": [{"id": 1, "image_id": 1, "category_id": 3, "bbox": [1, 1, 5, 5]}]}
    (tmp_path / "annotations.json").write_text(json.dumps(doc))
    with pytest.raises(DataError, match="no 'categories' list"):
        scan(_cfg(tmp_path, '[source]\nformat = "coco"\n'))


def test_missing_image_folder_is_named(tmp_path):
    from warpdata.core.errors import MissingInputError

    doc = {"images": [{"id": i, "file_name": f"{i}.jpg"} for i in range(64)], "annotations": [],
           "categories": [{"id": 1, "name": "a"}]}
    (tmp_path / "annotations.json").write_text(json.dumps(doc))
    with pytest.raises(MissingInputError, match=r"image folder .*imagez does not exist \(64 labelled"):
        scan(_cfg(tmp_path, '[source]\nformat = "coco"\nimages = "imagez"\n'))


@pytest.mark.parametrize("extra, key", [
    ("[transform]\nmax_boxes = 1000000000000\n", "transform.max_boxes"),
    ("[output]\nshard_samples = 1000000000000\n", "output.shard_samples"),
    ("[output]\nshard_size_mb = 1e12\n", "output.shard_size_mb"),
])
def test_declared_sizes_never_drive_allocation(tmp_path, extra, key):
    from warpdata.core.errors import ConfigError

    with pytest.raises(ConfigError) as e:
        _cfg(tmp_path, '[source]\nformat = "coco"\n' + extra)
    assert key in e.value.message and "max_shard_mb" in e.value.hint
    _cfg(tmp_path, '[source]\nformat = "coco"\n' + extra + "[limits]\nmax_shard_mb = 1e30\n")  # raised: accepted
