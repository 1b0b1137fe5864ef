"""DCT-scaled JPEG decode in the warehouse ETL (warp/warehouse/transform.py, "Scaled decode").

Photos come from ``real_photo_corpus``: the real photographs scikit-image / scikit-learn ship when
either is installed, else the photo-like synthetic generator; the documented tolerance holds for
both (BENCHMARKS.md, "DCT-scaled decode in the warehouse").
"""

from __future__ import annotations

import io
import json
import math
from pathlib import Path

import numpy as np
import pytest
from warpdata.formats import twh1
from warpdata.sampledata.detection import generate
from warpdata.sampledata.photos import real_photo_corpus
from warpdata.warehouse import config as wconfig
from warpdata.warehouse import transform as wt
from warpdata.warehouse.images import ImageProbe, ProbeError, probe
from warpdata.warehouse.shards import ShardTask, task_sha256
from warpdata.warehouse.transform import Transformer, TransformSpec, dct_scale, geometry

# the documented tolerance of scaled against full decode, per image, over the content pixels
MIN_PSNR_DB = 33.0
MAX_MEAN_ABS = 3.0


def _psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = float(np.mean((a.astype(np.float64) - b) ** 2))
    return 99.0 if mse == 0 else 10 * math.log10(255 ** 2 / mse)


def _letterbox(data: bytes, spec: TransformSpec) -> tuple[np.ndarray, wt.Geometry]:
    out = np.empty((3, spec.height, spec.width), np.uint8)
    g = Transformer(spec)(data, probe(data), out)
    return out, g


def _content(img: np.ndarray, g: wt.Geometry) -> np.ndarray:
    return img[:, g.py:g.py + g.nh, g.px:g.px + g.nw]


def _with_orientation(jpeg: bytes, orientation: int) -> bytes:
    """The same scan data with an EXIF orientation tag (Pillow re-encodes the same pixels the same way)."""
    from PIL import Image

    with Image.open(io.BytesIO(jpeg)) as im:
        exif = Image.Exif()
        exif[0x0112] = orientation
        buf = io.BytesIO()
        im.save(buf, format="JPEG", quality=92, exif=exif.tobytes())
    return buf.getvalue()


@pytest.mark.parametrize("w,h,orientation,size", [
    (900, 601, 1, 320), (601, 900, 1, 320), (1920, 1080, 1, 640), (1920, 1080, 1, 320), (3000, 2000, 1, 320),
    (639, 480, 1, 320), (641, 480, 1, 320), (600, 400, 1, 640), (1800, 600, 6, 320), (1800, 600, 1, 320),
    (4000, 300, 8, (256, 128)), (5000, 5000, 1, 96),
])
def test_scale_is_the_smallest_power_of_two_output_that_covers_the_content(w, h, orientation, size):
    W, H = (size, size) if isinstance(size, int) else size
    spec = TransformSpec(W, H)
    p = ImageProbe("jpeg", w, h, orientation)
    d = dct_scale(spec, p)
    g = geometry(spec, *p.oriented_size)
    need = (g.nh, g.nw) if orientation >= 5 else (g.nw, g.nh)  # the content in the stored frame

    def covers(k: int) -> bool:
        return -(-w // k) >= need[0] and -(-h // k) >= need[1]

    assert d in (1, 2, 4, 8) and (covers(d) or d == 1)  # an upscale decodes at full size
    assert d == 8 or not covers(2 * d)
    assert dct_scale(TransformSpec(W, H, decode="full"), p) == 1
    assert dct_scale(spec, ImageProbe("png", w, h, orientation)) == 1


def test_rotated_orientations_choose_the_scale_in_the_stored_frame():
    # stored 1800x600, shown as 600x1800: the content is 107x320 on screen, 320x107 as stored
    spec = TransformSpec(320, 320)
    assert dct_scale(spec, ImageProbe("jpeg", 1800, 600, 6)) == 4
    # the unrotated picture of the same stored size needs a larger decode
    assert dct_scale(spec, ImageProbe("jpeg", 1800, 600, 1)) == 4
    assert dct_scale(spec, ImageProbe("jpeg", 600, 1800, 6)) == 4
    # a case where forgetting the swap would pick a scale that does not cover: stored 2600x700
    # shown rotated as 700x2600 into 320x320 -> content 86x320 on screen, 320x86 stored: 1/8 covers
    # it (325x88), while the unswapped need (86x320 against the stored sides) would say full size
    assert dct_scale(spec, ImageProbe("jpeg", 2600, 700, 6)) == 8


def test_config_and_transform_agree_on_the_modes():
    assert wconfig.DECODE_MODES == wt.DECODE_MODES
    assert set(wt.SCALE_POLICY) == set(wt.DECODE_MODES)
    assert TransformSpec(8, 8).decode == wconfig.SCHEMA["transform"]["decode"].default == "scaled"


@pytest.fixture(scope="module")
def photos():
    """600-900 px photos (to 320) and 1080-1920 px photos (to 640), as the benchmark uses."""
    small = [d for d, _, _ in real_photo_corpus(24, seed=11, min_side=600, max_side=900)]
    large = [d for d, _, _ in real_photo_corpus(4, seed=12, min_side=1080, max_side=1920)]
    return [(d, 320) for d in small] + [(d, 640) for d in large]


def test_scaled_decode_equals_full_decode_within_the_documented_tolerance(photos):
    scaled_used = 0
    closer_to_area = []
    for data, size in photos:
        full, g = _letterbox(data, TransformSpec(size, size, decode="full"))
        scaled, g2 = _letterbox(data, TransformSpec(size, size))
        area, _ = _letterbox(data, TransformSpec(size, size, interpolation="area", decode="full"))
        assert g2 == g  # the geometry (and so every box) is the full decode's
        scaled_used += dct_scale(TransformSpec(size, size), probe(data)) > 1
        # the padding is untouched, the content within the tolerance
        assert np.array_equal(np.delete(scaled, np.s_[g.px:g.px + g.nw], axis=2),
                              np.delete(full, np.s_[g.px:g.px + g.nw], axis=2))
        a, b = _content(scaled, g), _content(full, g)
        diff = np.abs(a.astype(np.int16) - b)
        assert diff.mean() <= MAX_MEAN_ABS and _psnr(a, b) >= MIN_PSNR_DB, (size, diff.mean(), _psnr(a, b))
        # the DCT-domain reduction low-passes what a linear resize of the full image aliases
        ref = _content(area, g)
        closer_to_area.append(_psnr(a, ref) - _psnr(b, ref))
    assert scaled_used >= len(photos) - 2  # a few 600 px photos to 320 need the full size
    assert np.median(closer_to_area) > 0


def test_scaled_resize_uses_the_exact_source_ratio():
    """Decoded pixel i covers source pixels [2i, 2i+2): with an odd width the last decoded column is
    half padding, and the content maps by 2*nw/w (not nw/ceil(w/2)), as an exact affine map does."""
    import cv2
    import simplejpeg

    data, w, h = next(real_photo_corpus(1, seed=5, min_side=901, max_side=901))
    assert w % 2 == 1 and h % 2 == 1
    spec = TransformSpec(320, 320)
    p = probe(data)
    assert dct_scale(spec, p) == 2
    out, g = _letterbox(data, spec)
    half = simplejpeg.decode_jpeg(data, colorspace="RGB", min_width=-(-w // 2), min_height=-(-h // 2))
    ax, ay = (w / 2) / g.nw, (h / 2) / g.nh
    m = np.array([[ax, 0, 0.5 * ax - 0.5], [0, ay, 0.5 * ay - 0.5]])
    exact = cv2.warpAffine(half, m, (g.nw, g.nh), flags=cv2.INTER_LINEAR | cv2.WARP_INVERSE_MAP,
                           borderMode=cv2.BORDER_REPLICATE).transpose(2, 0, 1)
    plain = cv2.resize(half, (g.nw, g.nh), interpolation=cv2.INTER_LINEAR).transpose(2, 0, 1)
    got = _content(out, g).astype(np.int16)
    assert np.abs(got - exact).max() <= 1  # fixed-point rounding of the two OpenCV kernels
    assert np.abs(got - plain).max() > 1  # the plain resize is measurably elsewhere


@pytest.mark.parametrize("orientation", range(2, 9))
def test_every_orientation_is_the_exact_transform_of_the_upright_result(orientation):
    data, _, _ = next(real_photo_corpus(1, seed=7, min_side=701, max_side=899))
    upright = _with_orientation(data, 1)
    turned = _with_orientation(data, orientation)
    spec = TransformSpec(320, 320)  # square: a quarter turn keeps the content size, transposed
    assert dct_scale(spec, probe(turned)) > 1
    a, ga = _letterbox(upright, spec)
    b, gb = _letterbox(turned, spec)
    want = wt.orient(_content(a, ga).transpose(1, 2, 0), orientation)
    assert np.array_equal(_content(b, gb).transpose(1, 2, 0), want)


def test_other_formats_decode_at_full_size_in_both_modes():
    from PIL import Image

    data, _, _ = next(real_photo_corpus(1, seed=9, min_side=700, max_side=800))
    with Image.open(io.BytesIO(data)) as im:
        buf = io.BytesIO()
        im.save(buf, format="PNG")
    png = buf.getvalue()
    assert dct_scale(TransformSpec(320, 320), probe(png)) == 1
    full, _ = _letterbox(png, TransformSpec(320, 320, decode="full"))
    scaled, _ = _letterbox(png, TransformSpec(320, 320))
    assert np.array_equal(full, scaled)


def test_receipts_of_scaled_and_full_shards_never_match(tmp_path):
    path = str(tmp_path / "shard-00000.twh1")
    scaled = ShardTask(0, "shard-00000", path, TransformSpec(32, 32), 8, 4, [])
    full = ShardTask(0, "shard-00000", path, TransformSpec(32, 32, decode="full"), 8, 4, [])
    assert task_sha256(scaled) != task_sha256(full)


# ---- the ETL end to end ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    """Drawn boxes on photo-like images large enough for 1/2 and 1/4 at 96 px, with the detection
    sample's broken images (an EXIF-rotated one among them)."""
    d = tmp_path_factory.mktemp("dct") / "coco"
    info = generate(d, count=24, seed=4, min_side=200, max_side=520)
    return d, info


def _config(d: Path, out: Path, decode: str | None) -> Path:
    line = "" if decode is None else f'decode = "{decode}"'
    p = d / f"t-{decode}.toml"
    p.write_text(f"""
[source]
format = "coco"
path = "."
[transform]
target_size = 96
max_boxes = 8
{line}
[validation]
max_invalid_fraction = {{ warn = 0.0, fail = 0.3 }}
max_missing_fraction = {{ warn = 0.0, fail = 0.3 }}
[output]
root = "{out}"
shard_samples = 5
""")
    return p


def _etl(cli, cfg: Path) -> dict:
    r = cli("etl", "--config", cfg, "--json")
    assert r.code == 0, r.err
    return r.json()


def _tables(path: str) -> dict[str, list]:
    t: dict[str, list] = {"boxes": [], "mask": [], "classes": [], "orig_size": [], "affine": [], "keys": [],
                          "images": []}
    for f in sorted(Path(path).glob("*.twh1")):
        with twh1.TWH1Shard(str(f)) as sh:
            for k in ("boxes", "mask", "classes", "orig_size", "affine", "images"):
                t[k].append(np.array(getattr(sh, k)))
            t["keys"].extend(sh.keys())
    return t


def test_scaled_and_full_builds_differ_in_version_and_pixels_only(cli, dataset, tmp_path):
    d, info = dataset
    scaled = _etl(cli, _config(d, tmp_path / "s", "scaled"))
    default = _etl(cli, _config(d, tmp_path / "d", None))
    full = _etl(cli, _config(d, tmp_path / "f", "full"))
    assert scaled["version"] == default["version"]  # scaled is the default
    assert scaled["version"] != full["version"]
    assert scaled["fingerprint"] != full["fingerprint"]
    ms = json.loads((Path(scaled["path"]) / "manifest.json").read_text())
    mf = json.loads((Path(full["path"]) / "manifest.json").read_text())
    assert ms["transform"]["decode"] == "scaled" and mf["transform"]["decode"] == "full"
    rs, rf = json.loads(ms["version_recipe"]), json.loads(mf["version_recipe"])
    assert rs["decoder"]["jpeg_scale"] == wt.SCALE_POLICY["scaled"]
    assert rf["decoder"]["jpeg_scale"] == wt.SCALE_POLICY["full"]
    a, b = _tables(scaled["path"]), _tables(full["path"])
    assert a["keys"] == b["keys"] and info["broken"]["exif-rotated"] in a["keys"]
    for k in ("boxes", "mask", "classes", "orig_size", "affine"):  # box geometry unchanged
        assert all(np.array_equal(x, y) for x, y in zip(a[k], b[k], strict=True)), k
    ia, ib = np.concatenate(a["images"]), np.concatenate(b["images"])
    assert not np.array_equal(ia, ib)
    diff = np.abs(ia.astype(np.int16) - ib)
    assert diff.mean() <= MAX_MEAN_ABS and _psnr(ia, ib) >= MIN_PSNR_DB


def test_scaled_samples_used_the_dct_scale(dataset):
    d, _ = dataset
    spec = TransformSpec(96, 96)
    scales = set()
    for f in sorted((d / "images").glob("*.jpg")):
        try:
            scales.add(dct_scale(spec, probe(f.read_bytes())))
        except ProbeError:  # the dataset's broken samples
            continue
    assert {2, 4} <= scales


def test_a_decode_mode_that_does_not_exist_is_a_config_error(cli, tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text('[source]\nformat = "coco"\npath = "."\n[transform]\ndecode = "fast"\n')
    r = cli("etl", "--config", bad)
    assert r.code == 78 and f"{bad}:5" in r.err and "transform.decode" in r.err and "'scaled'" in r.err


def test_every_jpeg_kind_size_mode_and_orientation_decodes_with_the_full_decode_geometry():
    """Grey, progressive, 4:4:4 / 4:2:2 / 4:2:0, 1 px to 1,500 px, every orientation, both resize
    modes and every interpolation: the scaled path runs, and its geometry is the full decode's."""
    from PIL import Image

    rng = np.random.default_rng(1)
    scales = set()
    for _ in range(60):
        w, h = int(rng.integers(1, 1500)), int(rng.integers(1, 1500))
        if rng.random() < 0.2:
            w = int(rng.integers(1, 20))
        yy, xx = np.mgrid[0:h, 0:w]
        a = np.stack([xx * 255 // w, yy * 255 // h, (xx + yy) % 64 * 4], -1).astype(np.uint8)
        buf = io.BytesIO()
        Image.fromarray(a[..., 0] if rng.random() < 0.15 else a).save(
            buf, format="JPEG", quality=int(rng.integers(70, 96)), progressive=bool(rng.random() < 0.3),
            subsampling=int(rng.choice([0, 1, 2])))
        data = _with_orientation(buf.getvalue(), int(rng.integers(1, 9)))
        W, H = int(rng.integers(8, 700)), int(rng.integers(8, 700))
        mode, interp = str(rng.choice(["letterbox", "resize"])), str(rng.choice(wconfig.INTERPOLATIONS))
        full, g = _letterbox(data, TransformSpec(W, H, mode, "u8", 114, interp, "full"))
        scaled, g2 = _letterbox(data, TransformSpec(W, H, mode, "u8", 114, interp, "scaled"))
        assert g2 == g
        scales.add(dct_scale(TransformSpec(W, H, mode), probe(data)))
    assert scales == {1, 2, 4, 8}


def test_a_truncated_jpeg_is_rejected_at_any_scale():
    data, _, _ = next(real_photo_corpus(1, seed=2, min_side=800, max_side=900))
    cut = data[:len(data) * 2 // 3] + b"\xff\xd9"  # an end marker after data cut short: the probe passes
    p = probe(cut)
    assert dct_scale(TransformSpec(320, 320), p) == 2
    for mode in ("full", "scaled"):
        with pytest.raises(wt.DecodeError) as e:
            Transformer(TransformSpec(320, 320, decode=mode))(cut, p, np.empty((3, 320, 320), np.uint8))
        assert e.value.reason == "truncated"
