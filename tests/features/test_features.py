"""Feature cache: scan + quarantine, transform, build + fingerprint, encoders, reader LRU."""

from __future__ import annotations

import io
import json
import os
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from warpdata.core.errors import ConfigError, DataError
from warpdata.etl.quarantine import Quarantine, Threshold, Thresholds
from warpdata.features.reader import ShardCache, caption_text
from warpdata.features.scan import scan
from warpdata.features.transform import crop_box, load_image, load_video_frame, round16, target_size
from warpdata.features.writer import CacheSpec, build_cache
from warpdata.formats.featshard import FeatureShardChecksumError, FeatureShardReader

LOOSE = Thresholds(max_invalid_fraction=Threshold(fail=0.9), max_missing_fraction=Threshold(fail=0.9))


def _jpeg(img: np.ndarray, **kw) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(img).save(buf, format="JPEG", quality=92, **kw)
    return buf.getvalue()


def _img(seed: int, w: int = 48, h: int = 36) -> np.ndarray:
    rng = np.random.default_rng(seed)
    base = rng.integers(0, 256, size=(1, 1, 3))
    yy, xx = np.mgrid[0:h, 0:w]
    return np.clip(base + (xx[..., None] * 2 + yy[..., None]) % 64, 0, 255).astype(np.uint8)


def make_dataset(root: Path, n: int, *, groups: int = 2) -> Path:
    for i in range(n):
        g = root / f"g{i % groups}"
        g.mkdir(parents=True, exist_ok=True)
        if i % 3 == 0:
            Image.fromarray(_img(i, 40 + i, 30 + i)).save(g / f"s{i:03d}.png")
        else:
            (g / f"s{i:03d}.jpg").write_bytes(_jpeg(_img(i, 40 + i, 30 + 2 * i)))
        (g / f"s{i:03d}.txt").write_text(f"sample {i}\n", encoding="utf-8")
    return root


def spec_for(src: Path, out: Path, **kw) -> CacheSpec:
    base = {"size": (32, 32), "thresholds": LOOSE}
    base.update(kw)
    return CacheSpec(source=str(src), output=str(out), **base)


# --- transform ---------------------------------------------------------------------------

def test_target_size_rounds_sides_to_multiples_of_16():
    assert target_size(256) == (256, 256)
    assert target_size(250) == (256, 256)
    assert target_size(247) == (240, 240)
    assert target_size(5) == (16, 16)
    assert target_size([100, 200]) == (96, 208)
    assert target_size([300]) == (304, 304)
    assert round16(24) == 32 and round16(23.9) == 16
    for bad in ([1, 2, 3], "256", True, 0, [16, -16]):
        with pytest.raises(ConfigError):
            target_size(bad)


def test_crop_box_is_centred_with_the_target_aspect():
    assert crop_box(200, 100, 64, 64) == (50.0, 0.0, 150.0, 100.0)
    assert crop_box(100, 200, 32, 64) == (0.0, 0.0, 100.0, 200.0)
    x0, y0, x1, y1 = crop_box(1000, 300, 48, 32)
    assert (x1 - x0) / (y1 - y0) == pytest.approx(1.5) and y0 == 0 and x0 == pytest.approx(275)


def test_center_crop_drops_the_sides(tmp_path):
    img = np.zeros((100, 200, 3), np.uint8)
    img[:, :50] = (255, 0, 0)
    img[:, 50:150] = (0, 255, 0)
    img[:, 150:] = (0, 0, 255)
    Image.fromarray(img).save(tmp_path / "a.png")
    out = np.empty((3, 32, 32), np.uint8)
    assert load_image(str(tmp_path / "a.png"), (32, 32), out, interpolation="nearest") == (100, 200)
    assert (out[1] == 255).all() and (out[0] == 0).all() and (out[2] == 0).all()


def test_exif_orientation_is_applied(tmp_path):
    img = np.zeros((60, 120, 3), np.uint8)
    img[:, :60] = 255  # left half white in the stored frame
    im = Image.fromarray(img)
    exif = im.getexif()
    exif[0x0112] = 6  # display rotated 90° clockwise: the white half ends up on top
    (tmp_path / "r.jpg").write_bytes(_jpeg(img, exif=exif.tobytes()))
    out = np.empty((3, 64, 32), np.uint8)
    assert load_image(str(tmp_path / "r.jpg"), (64, 32), out) == (120, 60)  # oriented (h, w)
    assert out[:, :24].mean() > 200 and out[:, 40:].mean() < 50


def test_jpeg_draft_decoding_matches_full_decode_closely(tmp_path):
    big = np.asarray(Image.fromarray(_img(3, 64, 64)).resize((640, 480), Image.BILINEAR))
    (tmp_path / "b.jpg").write_bytes(_jpeg(big))
    out = np.empty((3, 64, 64), np.uint8)
    load_image(str(tmp_path / "b.jpg"), (64, 64), out)
    ref = np.asarray(Image.open(tmp_path / "b.jpg").convert("RGB").resize((64, 64), Image.BICUBIC,
                                                                            box=crop_box(640, 480, 64, 64)))
    assert np.abs(out.transpose(1, 2, 0).astype(int) - ref.astype(int)).mean() < 3


def _write_video(path: Path, frames: int = 9) -> None:
    import cv2

    w = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"MJPG"), 5, (64, 48))
    assert w.isOpened()
    for i in range(frames):
        w.write(np.full((48, 64, 3), 20 * i, np.uint8))
    w.release()


def test_video_middle_frame_is_decoded(tmp_path):
    pytest.importorskip("cv2")
    _write_video(tmp_path / "v.avi")
    out = np.empty((3, 32, 32), np.uint8)
    assert load_video_frame(str(tmp_path / "v.avi"), (32, 32), out) == (48, 64)
    assert abs(float(out.mean()) - 80) < 6  # frame 4 of 9 has value 80


# --- scan + quarantine ---------------------------------------------------------------------

def test_scan_quarantines_every_reason_with_runs(tmp_path):
    src = tmp_path / "src"
    make_dataset(src, 4)
    g = src / "g1"
    (g / "nocap.jpg").write_bytes(_jpeg(_img(9)))
    (g / "empty.jpg").write_bytes(_jpeg(_img(9)))
    (g / "empty.txt").write_text("  \n\t")
    (g / "latin1.jpg").write_bytes(_jpeg(_img(9)))
    (g / "latin1.txt").write_bytes("caf\xe9".encode("latin-1"))
    (g / "doc.pdf").write_bytes(b"%PDF")
    (g / "doc.txt").write_text("a pdf")
    (g / "orphan.txt").write_text("no media")
    (g / ".hidden.jpg").write_bytes(b"junk")
    (src / "top.jpg").write_bytes(_jpeg(_img(1)))
    (src / "TOP.txt").write_text("upper-case caption name does not match")
    q = Quarantine()
    res = scan(src, q, caption_prefix="photo: ")
    assert [it.key for it in res.items] == ["g0/s000.png", "g0/s002.jpg", "g1/s001.jpg", "g1/s003.png"]
    assert res.items[0].caption == "photo: sample 0" and res.items[0].run == "g0"
    assert res.orphan_captions == 2  # orphan.txt, TOP.txt
    by = {r.sample_id: (r.reason, r.run) for r in q.records}
    assert by == {"g1/nocap.jpg": ("missing-caption", "g1"), "g1/empty.jpg": ("empty-caption", "g1"),
                  "g1/latin1.jpg": ("bad-caption", "g1"), "g1/doc.pdf": ("unsupported-format", "g1"),
                  "top.jpg": ("missing-caption", ".")}
    assert "'.pdf' is not a supported image format" in next(r.message for r in q.records if r.reason == "unsupported-format")
    summ = q.summary()["runs"]
    assert summ["g1"]["missing"] == 1 and summ["g1"]["invalid"] == 3 and summ["."]["missing"] == 1


def test_videos_are_samples_when_opencv_decodes_them(tmp_path):
    pytest.importorskip("cv2")
    src = tmp_path / "src"
    make_dataset(src, 2, groups=1)
    _write_video(src / "g0" / "clip.avi")
    (src / "g0" / "clip.txt").write_text("a clip")
    (src / "g0" / "broken.mp4").write_bytes(b"\0\0\0\x18ftypmp42 not really a video")
    (src / "g0" / "broken.txt").write_text("broken clip")
    res = build_cache(spec_for(src, tmp_path / "cache"))
    m = res.manifest
    assert m["records"] == 3 and m["quarantine"]["aggregate"]["by_reason"] == {"decode-error": 1}
    with ShardCache(tmp_path / "cache") as c:
        flags = [bool(c.get(i)["is_video"]) for i in range(3)]
    keys = (tmp_path / "cache" / "keys.txt").read_text().split()
    assert dict(zip(keys, flags, strict=True)) == {"g0/clip.avi": True, "g0/s000.png": False, "g0/s001.jpg": False}


# --- build, fingerprint, atomicity ---------------------------------------------------------

def test_pixel_cache_records_match_their_sources(tmp_path):
    src = make_dataset(tmp_path / "src", 11)
    (src / "g0" / "bad.jpg").write_bytes(b"\xff\xd8\xff\xe0garbage")
    (src / "g0" / "bad.txt").write_text("x")
    res = build_cache(spec_for(src, tmp_path / "cache", shard_size=4, caption_prefix="p: "), workers=2)
    assert res.status == "built"
    m = res.manifest
    assert m["kind"] == "feature-cache" and m["records"] == 11
    assert [s["records"] for s in m["shards"]] == [4, 4, 3]
    assert m["quarantine"]["aggregate"]["by_reason"] == {"decode-error": 1}
    keys = (tmp_path / "cache" / "keys.txt").read_text().splitlines()
    assert len(keys) == 11 and keys == sorted(keys)
    with ShardCache(tmp_path / "cache") as c:
        for i, key in enumerate(keys):
            r = c.get(i)
            n = int(key.split("/s")[1].split(".")[0])
            assert caption_text(r["caption"], r["caption_len"]) == f"p: sample {n}"
            ref = np.empty((3, 32, 32), np.uint8)
            assert tuple(r["orig_size"]) == load_image(str(src / key), (32, 32), ref)
            np.testing.assert_array_equal(r["pixels"], ref)
            assert tuple(r["size"]) == (32, 32)
    q = [json.loads(line) for line in (tmp_path / "cache" / "quarantine.jsonl").read_text().splitlines()]
    assert [(r["sample_id"], r["reason"]) for r in q] == [("g0/bad.jpg", "decode-error")]


def test_build_is_deterministic_across_worker_counts(tmp_path):
    src = make_dataset(tmp_path / "src", 9)
    a = build_cache(spec_for(src, tmp_path / "a", shard_size=4), workers=1).manifest
    b = build_cache(spec_for(src, tmp_path / "b", shard_size=4), workers=3).manifest
    assert a["fingerprint"] == b["fingerprint"]
    assert [s["sha256"] for s in a["shards"]] == [s["sha256"] for s in b["shards"]]
    assert (tmp_path / "a" / "manifest.json").read_bytes() == (tmp_path / "b" / "manifest.json").read_bytes()


def test_fingerprint_reuse_and_invalidation(tmp_path):
    src = make_dataset(tmp_path / "src", 6)
    out = tmp_path / "cache"
    first = build_cache(spec_for(src, out))
    shard0 = out / first.manifest["shards"][0]["path"]
    mtime = shard0.stat().st_mtime_ns
    again = build_cache(spec_for(src, out))
    assert again.status == "up-to-date" and shard0.stat().st_mtime_ns == mtime
    # same-size caption edit: content changes, paths and sizes do not
    cap = src / "g0" / "s000.txt"
    cap.write_text(cap.read_text().replace("sample", "sampel"))
    r = build_cache(spec_for(src, out))
    assert r.status == "built" and r.reasons == ["fingerprint changed (dataset)"]
    assert r.manifest["fingerprint"] != first.manifest["fingerprint"]
    r = build_cache(spec_for(src, out, size=(48, 48)))
    assert r.reasons == ["fingerprint changed (dataset)"]
    r = build_cache(spec_for(src, out, size=(48, 48), encoder="pool8-hash", caching_device="cpu"))
    assert r.reasons == ["fingerprint changed (dataset, encoder, code)"]  # code: torch version joins
    r = build_cache(spec_for(src, out, size=(48, 48), encoder="pool8-hash", caching_device="cpu",
                             encoder_options={"seed": 1}))
    assert r.reasons == ["fingerprint changed (encoder)"]
    r = build_cache(spec_for(src, out, size=(48, 48), encoder="pool8-hash", caching_device="cpu",
                             encoder_options={"seed": 1}), clear=True)
    assert r.reasons == ["--clear"]
    (out / r.manifest["shards"][0]["path"]).unlink()
    r = build_cache(spec_for(src, out, size=(48, 48), encoder="pool8-hash", caching_device="cpu",
                             encoder_options={"seed": 1}))
    assert r.reasons == ["shards missing or resized"]
    # an edited side file (keys.txt, same size: one letter of a key) is
    # caught by the manifest's side_tables, not kept as up to date (docs/formats/feature-shard.md)
    keys = out / "keys.txt"
    keys.write_bytes(keys.read_bytes().replace(b"s000", b"s00X", 1))
    r = build_cache(spec_for(src, out, size=(48, 48), encoder="pool8-hash", caching_device="cpu",
                             encoder_options={"seed": 1}))
    assert r.status == "built" and r.reasons == ["side files edited or missing"]
    assert b"s00X" not in keys.read_bytes()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cache", "src"]  # no temp dirs left


def test_failed_threshold_keeps_the_old_cache(tmp_path):
    src = make_dataset(tmp_path / "src", 6)
    out = tmp_path / "cache"
    good = build_cache(spec_for(src, out, thresholds=Thresholds()))
    for i in range(3):
        (src / "g1" / f"junk{i}.jpg").write_bytes(b"not a jpeg")
        (src / "g1" / f"junk{i}.txt").write_text("junk")
    with pytest.raises(DataError) as ei:
        build_cache(spec_for(src, out, thresholds=Thresholds()))
    assert "invalid_fraction" in ei.value.message and "decode-error" in ei.value.message
    assert ei.value.exit_code == 65
    assert json.loads((out / "manifest.json").read_text())["fingerprint"] == good.manifest["fingerprint"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cache", "src"]
    r = build_cache(spec_for(src, out, thresholds=Thresholds()), allow_invalid=True)
    assert r.manifest["verdict"] == {"status": "fail", "allowed": True, "problems": r.manifest["verdict"]["problems"]}
    assert r.manifest["records"] == 6


def test_scan_stage_failure_is_raised_before_decoding(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    for i in range(4):
        (src / f"x{i}.jpg").write_bytes(b"never decoded")
    with pytest.raises(DataError, match="missing_fraction"):
        build_cache(spec_for(src, tmp_path / "cache", thresholds=Thresholds()))


def test_refuses_to_replace_a_directory_that_is_not_a_cache(tmp_path):
    src = make_dataset(tmp_path / "src", 2)
    (tmp_path / "precious").mkdir()
    (tmp_path / "precious" / "thesis.tex").write_text("do not delete")
    with pytest.raises(ConfigError, match="not a feature cache"):
        build_cache(spec_for(src, tmp_path / "precious"))
    assert (tmp_path / "precious" / "thesis.tex").exists()


def test_cache_inside_the_source_tree_is_not_scanned(tmp_path):
    src = make_dataset(tmp_path / "src", 3)
    build_cache(spec_for(src, src / "cache"))
    r = build_cache(spec_for(src, src / "cache"))
    assert r.status == "up-to-date" and r.manifest["quarantine"]["aggregate"]["invalid"] == 0


def test_long_captions_are_cut_on_a_character_boundary(tmp_path):
    src = make_dataset(tmp_path / "src", 2, groups=1)
    (src / "g0" / "s000.txt").write_text("é" * 20)
    res = build_cache(spec_for(src, tmp_path / "c", max_caption_bytes=9))
    assert res.manifest["captions_truncated"] == 1
    with ShardCache(tmp_path / "c") as c:
        r = c.get(0)
        assert caption_text(r["caption"], r["caption_len"]) == "é" * 4


# --- encoders -----------------------------------------------------------------------------

PLUGIN = textwrap.dedent('''
    import numpy as np
    from warpdata.formats.featshard import FieldSpec

    CALLS = []

    class Enc:
        def __init__(self, device, dtype, scale=1):
            self.device, self.dtype, self.scale = device, dtype, scale
        def fields(self, h, w):
            return [FieldSpec("mean", "float32", (3,)), FieldSpec("ntok", "int32")]
        def encode(self, pixels, captions):
            CALLS.append(len(captions))
            m = pixels.float().mean(dim=(2, 3)) * self.scale
            return {"mean": m, "ntok": np.array([len(c.split()) for c in captions], np.int32)}
        def identity(self):
            return {"name": "test-enc", "version": "1", "weights_sha256": None, "dtype": self.dtype,
                    "scale": self.scale}

    def factory(device, dtype, **options):
        return Enc(device, dtype, **options)

    def bad_shape(device, dtype):
        e = Enc(device, dtype)
        e.fields = lambda h, w: [FieldSpec("mean", "float32", (4,)), FieldSpec("ntok", "int32")]
        return e
''')


@pytest.fixture
def plugin(tmp_path, monkeypatch):
    d = tmp_path / "plug"
    d.mkdir()
    name = f"warp_test_plugin_{os.getpid()}_{abs(hash(str(tmp_path))) % 10**8}"
    (d / f"{name}.py").write_text(PLUGIN)
    monkeypatch.syspath_prepend(str(d))
    yield name, d
    sys.modules.pop(name, None)


def test_encoder_plugin_module_function_is_called_in_batches(tmp_path, plugin):
    name, _ = plugin
    src = make_dataset(tmp_path / "src", 10)
    res = build_cache(spec_for(src, tmp_path / "c", encoder=f"{name}:factory", caching_batch_size=4,
                               caching_device="cpu", encoder_options={"scale": 2}))
    mod = sys.modules[name]
    assert sorted(mod.CALLS) == [2, 4, 4]  # one call per batch; concurrent shard tasks may finish in any order
    m = res.manifest
    assert [s["records"] for s in m["shards"]] == [4, 4, 2]  # shard size defaults to the batch size
    assert [f["name"] for f in m["fields"]] == ["caption", "caption_len", "size", "orig_size", "is_video",
                                                "mean", "ntok"]
    assert m["fingerprint_inputs"]["encoder"]["config_name"] == f"{name}:factory"
    assert m["fingerprint_inputs"]["encoder"]["scale"] == 2
    with ShardCache(tmp_path / "c") as c:
        r = c.get(0)
        assert r["ntok"] == 2
        ref = np.empty((3, 32, 32), np.uint8)
        load_image(str(src / (tmp_path / "c" / "keys.txt").read_text().split()[0]), (32, 32), ref)
        np.testing.assert_allclose(r["mean"], ref.reshape(3, -1).mean(1) * 2, rtol=1e-5)


def test_encoder_found_through_an_entry_point(tmp_path, plugin):
    from warpdata.features.encoders import load_encoder

    name, d = plugin
    dist = d / "warp_test_encoders-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: warp-test-encoders\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text(f"[warpdata.encoders]\ntest-enc = {name}:factory\n")
    enc = load_encoder("test-enc", device="cpu", options={"scale": 3})
    assert enc.identity()["scale"] == 3


def test_encoder_errors_are_config_or_data_errors(tmp_path, plugin):
    from warpdata.features.encoders import load_encoder

    name, _ = plugin
    with pytest.raises(ConfigError, match="unknown encoder") as ei:
        load_encoder("no-such-encoder")
    assert "pool8-hash" in ei.value.hint
    with pytest.raises(ConfigError, match="cannot be imported"):
        load_encoder("no_such_module_xyz:f")
    with pytest.raises(ConfigError, match="no attribute"):
        load_encoder(f"{name}:nope")
    with pytest.raises(ConfigError, match="rejected its options"):
        load_encoder(f"{name}:factory", options={"bogus": 1})
    src = make_dataset(tmp_path / "src", 3)
    with pytest.raises(DataError, match="shape"):
        build_cache(spec_for(src, tmp_path / "c", encoder=f"{name}:bad_shape", caching_device="cpu"))
    assert not (tmp_path / "c").exists()


def test_pool8_hash_encoder_outputs():
    import torch
    from warpdata.features.encoders import BatchEncoder, Pool8HashEncoder, tokenize

    enc = Pool8HashEncoder(device="cpu", dtype="float32", max_tokens=6, text_dim=8)
    be = BatchEncoder(enc, "cpu", (32, 48))
    px = np.random.default_rng(0).integers(0, 256, (3, 3, 32, 48), dtype=np.uint8)
    caps = ["A cat, on a mat.", "a cat on a mat", "one two three four five six seven eight"]
    out = be(px, caps)
    ref = (px.astype(np.float32) / 127.5 - 1).reshape(3, 3, 4, 8, 6, 8).mean(axis=(3, 5))
    np.testing.assert_allclose(out["latents"], ref, atol=1e-5)
    assert tokenize("A cat, on a mat.") == ["a", "cat", ",", "on", "a", "mat", "."]
    assert out["prompt_mask"].sum(1).tolist() == [6, 5, 6]  # truncated to max_tokens
    assert not out["prompt_embeds"][1, 5:].any()  # padding is zero
    np.testing.assert_array_equal(out["prompt_embeds"][0, :2], out["prompt_embeds"][1, :2])  # "a cat"
    assert not np.allclose(out["pooled_prompt_embeds"][0], out["pooled_prompt_embeds"][2])
    again = Pool8HashEncoder(device="cpu", dtype="float32", max_tokens=6, text_dim=8)
    assert again.identity() == enc.identity()
    assert Pool8HashEncoder(device="cpu", seed=1).identity()["weights_sha256"] != enc.identity()["weights_sha256"]
    assert torch.is_tensor(enc.encode(torch.from_numpy(px), caps)["latents"])


def test_resolve_device():
    import torch
    from warpdata.features.encoders import resolve_device

    assert resolve_device("cpu") == "cpu"
    with pytest.raises(ConfigError):
        resolve_device("tpu")
    if torch.cuda.is_available():
        assert resolve_device("auto") == "cuda"
    else:
        assert resolve_device("auto") == "cpu"
        with pytest.raises(ConfigError, match="no CUDA device"):
            resolve_device("cuda")


@pytest.mark.gpu
def test_pool8_hash_on_cuda_matches_cpu(tmp_path):
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    src = make_dataset(tmp_path / "src", 6)
    cpu = build_cache(spec_for(src, tmp_path / "cpu", encoder="pool8-hash", caching_device="cpu"))
    gpu = build_cache(spec_for(src, tmp_path / "gpu", encoder="pool8-hash", caching_device="cuda"))
    assert gpu.manifest["fingerprint_inputs"]["encoder"]["device_type"] == "cuda"
    assert cpu.manifest["fingerprint"] != gpu.manifest["fingerprint"]
    with ShardCache(tmp_path / "cpu") as a, ShardCache(tmp_path / "gpu") as b:
        for i in range(len(a)):
            for k in ("latents", "prompt_embeds", "pooled_prompt_embeds"):
                np.testing.assert_allclose(a.get(i)[k].astype(np.float32), b.get(i)[k].astype(np.float32),
                                           atol=2e-3)
            np.testing.assert_array_equal(a.get(i)["prompt_mask"], b.get(i)["prompt_mask"])


# --- reader -------------------------------------------------------------------------------

@pytest.fixture
def small_cache(tmp_path):
    src = make_dataset(tmp_path / "src", 13)
    build_cache(spec_for(src, tmp_path / "cache", size=(16, 16), shard_size=3))
    return tmp_path / "cache"


def test_lru_never_holds_more_than_k_shards(small_cache):
    rng = np.random.default_rng(0)
    for k in (1, 2, 3):
        with ShardCache(small_cache, max_resident=k) as c:
            assert c.num_shards == 5 and len(c) == 13
            for i in rng.integers(0, len(c), 200):
                c.get(int(i))
                assert len(c.resident()) <= k
            assert c.stats["max_resident"] == k
            assert c.stats["hits"] + c.stats["misses"] == 200
            assert c.stats["evictions"] == c.stats["misses"] - k


def test_sequential_reads_miss_once_per_shard(small_cache):
    with ShardCache(small_cache, max_resident=2) as c:
        batch = c.get_batch(range(len(c)))
        assert c.stats["misses"] == 5
        assert batch["pixels"].shape == (13, 3, 16, 16)
        out = c.allocate(4)
        got = c.get_batch([12, 0, 5], out=out)
        assert got["pixels"].base is out["pixels"] or np.shares_memory(got["pixels"], out["pixels"])
        np.testing.assert_array_equal(got["caption"][0], batch["caption"][12])


def test_records_are_copies_that_survive_eviction(small_cache):
    with ShardCache(small_cache, max_resident=1) as c:
        r0 = c.get(0)
        before = r0["pixels"].copy()
        c.get(12)  # evicts shard 0
        assert r0["pixels"].flags.owndata or r0["pixels"].base is not None
        np.testing.assert_array_equal(r0["pixels"], before)


def test_corruption_is_caught_per_record_and_per_shard(small_cache):
    m = json.loads((small_cache / "manifest.json").read_text())
    p = small_cache / m["shards"][1]["path"]
    with FeatureShardReader(p) as r:
        off = r.header.data_offset + r.layout.record_size + 100  # inside record 1 of shard 1
    data = bytearray(p.read_bytes())
    data[off] ^= 0xFF
    p.write_bytes(bytes(data))
    with ShardCache(small_cache, verify="fast") as c:
        c.get(3)
        with pytest.raises(FeatureShardChecksumError, match="record 1"):
            c.get(4)
    with ShardCache(small_cache, verify="full") as c, pytest.raises(FeatureShardChecksumError, match="SHA-256"):
        c.get(3)
    with ShardCache(small_cache, verify="off") as c:
        c.get(4)  # unchecked by request
    with ShardCache(small_cache) as c:
        problems = c.verify_all()
    assert len(problems) == 2 and all(m["shards"][1]["path"] in x for x in problems)


def test_shard_cache_rejects_other_manifests(tmp_path):
    (tmp_path / "manifest.json").write_text('{"kind": "tensor-warehouse"}')
    with pytest.raises(DataError, match="not 'feature-cache'"):
        ShardCache(tmp_path)


def test_missing_shard_is_a_missing_input_error(small_cache):
    from warpdata.core.errors import MissingInputError

    m = json.loads((small_cache / "manifest.json").read_text())
    (small_cache / m["shards"][2]["path"]).unlink()
    with ShardCache(small_cache) as c:
        c.get(0)
        with pytest.raises(MissingInputError, match="shard 2"):
            c.get(7)


def test_inspector_sniffs_only_feature_caches(small_cache, tmp_path):
    from warpdata.features import inspect as fi

    assert fi.sniff(str(small_cache), None, True)
    other = tmp_path / "other"
    other.mkdir()
    (other / "manifest.json").write_text('{"kind": "zarr-array"}')
    assert not fi.sniff(str(other), None, True)
    shard = sorted(small_cache.glob("*.wfs"))[0]
    assert fi.sniff(str(shard), shard.read_bytes()[:4096], False)
    rep = fi.inspect(str(small_cache), verify=True, head=1)
    assert rep.ok and rep.summary["records"] == 13 and rep.summary["fields"]["pixels"]["shape"] == [3, 16, 16]


def test_deleted_shard_entry_is_refused_and_verify_reports_it(small_cache):
    """Issue #3: dropping one shards[] entry used to serve 10 of 13 records and pass --verify."""
    from warpdata.features import inspect as fi

    m = json.loads((small_cache / "manifest.json").read_text())
    del m["shards"][1]
    (small_cache / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(DataError, match="content_sha256") as ei:
        ShardCache(small_cache)
    assert ei.value.exit_code == 65 and "manifest.json" in ei.value.message
    rep = fi.inspect(str(small_cache), verify=True)
    assert not rep.ok and "content_sha256" in rep.problems[0]
    with pytest.raises(DataError):
        fi.inspect(str(small_cache), verify=False)


def test_unsealed_cache_is_refused_then_rebuilt_by_etl(small_cache, tmp_path):
    m = json.loads((small_cache / "manifest.json").read_text())
    m.pop("content_sha256")
    m.pop("manifest_version")
    (small_cache / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(DataError, match="without a content hash"):
        ShardCache(small_cache)
    src = tmp_path / "src"
    res = build_cache(spec_for(src, small_cache, size=(16, 16), shard_size=3))
    assert res.status == "built" and "manifest unsealed or damaged" in res.reasons
    assert len(ShardCache(small_cache)) == 13


def test_wrong_types_in_the_manifest_are_typed_errors(small_cache):
    from warpdata.core.canonical import seal

    m = json.loads((small_cache / "manifest.json").read_text())
    m["shards"][0]["records"] = "3"
    (small_cache / "manifest.json").write_text(json.dumps(seal(m)))
    with pytest.raises(DataError, match="schema at shards/0/records"):
        ShardCache(small_cache)


def test_cache_directory_follows_the_umask(tmp_path):
    """Issue #14: the top folder of a built cache was 0700 (mkdtemp) whatever the umask."""
    src = make_dataset(tmp_path / "src", 4)
    old = os.umask(0o022)
    try:
        build_cache(spec_for(src, tmp_path / "cache", size=(16, 16)))
        assert (tmp_path / "cache").stat().st_mode & 0o777 == 0o755
        os.umask(0o027)
        build_cache(spec_for(src, tmp_path / "cache", size=(16, 16)), clear=True)
        assert (tmp_path / "cache").stat().st_mode & 0o777 == 0o750
    finally:
        os.umask(old)
