"""`warp inspect --preview`: the pictures are decoded back and checked where they must be right."""

from __future__ import annotations

import io
import json
import math
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from warpdata.artifacts.preview import CAPTION_H, PAD, TILE, class_color


def decode(png: bytes) -> np.ndarray:
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    return np.asarray(Image.open(io.BytesIO(png)).convert("RGB"))


@pytest.fixture(scope="module")
def warehouse(tmp_path_factory):
    """A real tensor warehouse from the synthetic detection set (warp etl)."""
    from warpdata.cli.app import main
    from warpdata.sampledata.detection import generate

    d = tmp_path_factory.mktemp("det") / "coco"
    generate(d, count=6, seed=5, min_side=64, max_side=120)
    cfg = d / "t.toml"
    cfg.write_text("""
[source]
format = "coco"
path = "."
labels = "annotations.json"

[transform]
target_size = 64
max_boxes = 8

[validation]
max_invalid_fraction = { warn = 0.0, fail = 0.9 }
max_missing_fraction = { warn = 0.0, fail = 0.9 }

[output]
root = "../warehouse"
shard_samples = 4
""")
    assert main(["-q", "etl", "--config", str(cfg)]) == 0
    return next(p for p in (d.parent / "warehouse").iterdir() if (p / "manifest.json").exists())


def test_warehouse_grid_boxes_land_on_the_boxes(cli, warehouse, tmp_path):
    from warpdata.warehouse.reader import Warehouse

    r = cli("inspect", warehouse, "--preview", tmp_path / "grid.png", "--head", 4)
    assert r.code == 0, r.err
    assert r.out.strip() == str(tmp_path / "grid.png")
    pic = decode((tmp_path / "grid.png").read_bytes())
    wh = Warehouse(warehouse)
    scale = 256 // 64
    cols = 2
    checked = 0
    for i in range(4):
        s = wh[i]
        x0 = PAD + (i % cols) * (64 * scale + PAD)
        y0 = PAD + (i // cols) * (64 * scale + CAPTION_H + PAD)
        for b in range(int(s.mask.sum())):
            x1, y1, x2, y2 = (round(float(v) * scale) for v in s.boxes[b])
            color = np.array(class_color(int(s.classes[b])))
            if x2 - x1 < 12 or y2 - y1 < 12:
                continue
            # the outline's left and bottom edges, at mid-height / mid-width of the box
            left = pic[y0 + (y1 + y2) // 2, x0 + x1]
            bottom = pic[y0 + y2 - 1, x0 + (x1 + x2) // 2]
            assert np.array_equal(left, color), (i, b, left, color)
            assert np.array_equal(bottom, color), (i, b, bottom, color)
            # below the label tab and just inside the outline there is the image again
            if y2 - y1 > 40:
                yy, xx = (y1 + y2) // 2, x1 + 3
                assert np.array_equal(pic[y0 + yy, x0 + xx], np.asarray(s.image)[:, yy // scale, xx // scale])
            checked += 1
    wh.close()
    assert checked >= 2
    # with no box drawn at all, the test above would fail: the tile corners are image pixels
    assert pic.shape == (PAD + 2 * (256 + CAPTION_H + PAD), PAD + 2 * (256 + PAD), 3)


def test_preview_to_stdout_is_png_bytes(warehouse):
    import subprocess
    import sys

    run = subprocess.run([sys.executable, "-m", "warpdata", "inspect", str(warehouse), "--preview", "-", "--head", "2"],
                         capture_output=True, check=True)
    png = run.stdout
    assert decode(png).shape[1] == PAD + 2 * (256 + PAD)


def test_tbl_contact_sheet_tile_count_and_size(cli, tmp_path):
    from warpdata.formats.tbl import write_tbl

    colors = [(255, 0, 0), (0, 255, 0), (0, 0, 255), (255, 255, 0), (0, 255, 255)]
    imgs = []
    for c in colors:
        buf = io.BytesIO()
        Image.new("RGB", (80, 40), c).save(buf, "PNG")
        imgs.append(buf.getvalue())
    write_tbl(tmp_path / "x.tbl", imgs)
    r = cli("inspect", tmp_path / "x.tbl", "--preview", tmp_path / "s.png", "--json")
    assert r.code == 0, r.err
    assert r.json()["tiles"] == 5
    pic = decode((tmp_path / "s.png").read_bytes())
    cols = math.ceil(math.sqrt(5))
    assert pic.shape == (PAD + 2 * (TILE + CAPTION_H + PAD), PAD + cols * (TILE + PAD), 3)
    for i, c in enumerate(colors):  # the 2:1 image fills the tile's width, centred vertically
        x0, y0 = PAD + (i % cols) * (TILE + PAD), PAD + (i // cols) * (TILE + CAPTION_H + PAD)
        assert tuple(pic[y0 + TILE // 2, x0 + TILE // 2]) == c
        assert tuple(pic[y0 + TILE // 2, x0 + 1]) == c
        assert tuple(pic[y0 + 5, x0 + TILE // 2]) == (24, 24, 24)  # letterbox band above


def test_published_dataset_contact_sheet(cli, tmp_path):
    (tmp_path / "f" / "a").mkdir(parents=True)
    for i in range(3):
        Image.new("RGB", (10, 10), (0, 0, 200)).save(tmp_path / "f" / "a" / f"{i}.png")
    assert cli("ingest", "imagefolder", tmp_path / "f", "ws/sheet").code == 0
    r = cli("inspect", "ws/sheet", "--preview", tmp_path / "p.png", "--json")
    assert r.code == 0, r.err
    assert r.json()["tiles"] == 3 and r.json()["kind"] == "dataset"
    pic = decode((tmp_path / "p.png").read_bytes())
    assert tuple(pic[PAD + TILE // 2, PAD + TILE // 2]) == (0, 0, 200)


def test_zarr_pyramid_slices_and_histogram(cli, tmp_path):
    from warpdata.tiles.writer import TileWriter

    a = np.zeros((5, 64, 48), np.uint16)
    a[:, :, 24:] = 1000  # left half dark, right half bright
    a[2, :8, :8] = 500  # only in the middle slice
    with TileWriter(tmp_path / "v.zarr", a.shape, a.dtype, (5, 16, 16), backend="cpu", fsync=False, levels=2) as w:
        w.write_array(a)
    r = cli("inspect", tmp_path / "v.zarr", "--preview", tmp_path / "z.png", "--json")
    assert r.code == 0, r.err
    assert r.json()["tiles"] == 2
    pic = decode((tmp_path / "z.png").read_bytes())
    assert tuple(pic[PAD + 10, PAD + 5]) == (0, 0, 0) and tuple(pic[PAD + 10, PAD + 40]) == (255, 255, 255)
    assert tuple(pic[PAD + 2, PAD + 2]) == (127, 127, 127)  # the middle slice is the one drawn
    x1 = PAD + 48 + PAD  # level 1 is beside level 0
    assert tuple(pic[PAD + 5, x1 + 2]) == (0, 0, 0) and tuple(pic[PAD + 5, x1 + 20]) == (255, 255, 255)
    hist = pic[PAD + 64 + CAPTION_H + PAD:, :256 + PAD]
    assert (hist == (0, 130, 200)).all(axis=-1).any()


def test_etl_metrics_bar_chart(cli, tmp_path):
    m = {"phases_s": {"scan": 1.0, "build": 4.0}, "cpu_s": {"decode": 2.0},
         "skip_reasons": {"truncated": 3, "decode-error": 1}}
    (tmp_path / "metrics.json").write_text(json.dumps(m))
    r = cli("inspect", tmp_path / "metrics.json", "--preview", tmp_path / "m.png", "--json")
    assert r.code == 0, r.err
    from warpdata.artifacts.preview import metrics_chart

    p = metrics_chart(str(tmp_path / "metrics.json"))
    lengths = [t[2] for t in p.tiles]
    assert lengths == [320, 80, 320, 320, round(320 / 3)]  # bars scale with the values, longest first
    pic = decode((tmp_path / "m.png").read_bytes())
    x, y, n = p.tiles[1]  # "scan": a quarter of "build"
    assert tuple(pic[y + 3, x + n - 1]) == class_color(1) and tuple(pic[y + 3, x + n + 1]) != class_color(1)


def test_feature_cache_pixels_with_captions(cli, tmp_path):
    from warpdata.etl.quarantine import Thresholds
    from warpdata.features.writer import CacheSpec, build_cache

    src = tmp_path / "src"
    src.mkdir()
    for i in range(3):
        Image.new("RGB", (32, 32), (0, 200, 0)).save(src / f"s{i}.png")
        (src / f"s{i}.txt").write_text(f"a green square {i}")
    build_cache(CacheSpec(source=str(src), output=str(tmp_path / "cache"), size=(32, 32),
                          thresholds=Thresholds()), workers=1)
    r = cli("inspect", tmp_path / "cache", "--preview", tmp_path / "f.png", "--json")
    assert r.code == 0, r.err
    pic = decode((tmp_path / "f.png").read_bytes())
    assert tuple(pic[PAD + 16, PAD + 16]) == (0, 200, 0)
    assert (pic[PAD + 32 + 2: PAD + 32 + CAPTION_H, PAD: PAD + 32] > 200).any()  # caption text drawn


def test_preview_errors_are_typed(cli, tmp_path):
    r = cli("inspect", tmp_path / "nope", "--preview", tmp_path / "x.png")
    assert r.code == 66
    (tmp_path / "metrics.json").write_text("{\"phases_s\": 3}")
    r = cli("inspect", tmp_path / "metrics.json", "--preview", tmp_path / "x.png")
    assert r.code in (65, 2) and not (tmp_path / "x.png").exists()
    assert not Path(tmp_path / "x.png").exists()
