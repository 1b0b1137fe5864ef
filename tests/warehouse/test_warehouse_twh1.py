"""TWH1 shard format: golden files, malformed corpus, hypothesis round-trips, zero-copy reads."""

from __future__ import annotations

import importlib.util
import json
import pickle
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from warpdata.core.errors import DataError, ExitCode
from warpdata.formats import twh1

GOLDEN = Path(__file__).parents[1] / "golden" / "twh1"


def _golden_module():
    spec = importlib.util.spec_from_file_location("make_golden", GOLDEN / "make_golden.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("dtype", ["u8", "f16", "f32"])
def test_writer_reproduces_golden_bytes(tmp_path, dtype):
    b = _golden_module().golden_builder(dtype)
    sha = b.write_file(tmp_path / "x.twh1")
    golden = (GOLDEN / f"small_{dtype}.twh1").read_bytes()
    assert (tmp_path / "x.twh1").read_bytes() == golden
    assert sha == golden[-32:].hex()


@pytest.mark.parametrize("dtype", ["u8", "f16", "f32"])
def test_reader_decodes_golden(dtype):
    with twh1.TWH1Shard(GOLDEN / f"small_{dtype}.twh1", verify=True) as s:
        h = s.header
        assert (h.magic if hasattr(h, "magic") else "TWH1", h.shard_version, h.dtype, h.width, h.height,
                h.channels, h.max_boxes, h.samples) == ("TWH1", 1, dtype, 5, 4, 3, 3, 3)
        assert h.image_offset == 4096 and h.endianness == "little"
        assert s.images.shape == (3, 3, 4, 5)
        assert s.images.dtype == {"u8": np.uint8, "f16": np.float16, "f32": np.float32}[dtype]
        assert s.boxes.dtype == (np.float16 if dtype == "f16" else np.float32)
        assert s.keys() == ["images/é0.jpg", "images/é1.jpg", "images/é2.jpg"]
        assert [s.run_id(i) for i in range(3)] == ["run-0", "run-1", "run-0"]
        assert s.frame_ids.tolist() == [100, 101, 102]
        assert s.mask.tolist() == [[0, 0, 0], [1, 0, 0], [1, 1, 0]]
        assert s.classes.tolist() == [[-1, -1, -1], [7, -1, -1], [7, 8, -1]]
        assert s.boxes[2, 1].tolist() == [1.5, 1.0, 4.25, 3.5]
        assert s.orig_size.tolist() == [[50, 40], [51, 41], [52, 42]]
        rng = np.random.default_rng(1234)
        first = rng.integers(0, 256, size=(3, 4, 5), dtype=np.uint8)
        if dtype == "u8":
            assert (s.images[0] == first).all()
        else:
            # x/255 in f16 round-trips to the same uint8 (docs/design.md §4)
            assert (np.rint(s.images[0].astype(np.float64) * 255) == first).all()


def test_golden_header_layout_is_the_seed_layout():
    raw = (GOLDEN / "small_u8.twh1").read_bytes()
    import struct

    fields = struct.unpack_from("<4sIIIIIIIQQQQQQ", raw, 0)
    assert fields[:9] == (b"TWH1", 1, 2, 0, 5, 4, 3, 3, 3)
    image, boxes, mask, meta, checksum = fields[9:]
    assert image == 4096 and boxes == image + 192  # 180 B of pixels, aligned to 64
    assert mask >= boxes + 3 * 3 * 4 * 4 and meta >= mask + 9
    assert checksum + 32 == len(raw)
    assert raw[80:4096] == bytes(4096 - 80)  # no holes: padding is zeros


MALFORMED = json.loads((GOLDEN / "malformed" / "expected.json").read_text())


@pytest.mark.parametrize("name", sorted(MALFORMED))
def test_malformed_corpus_raises_one_typed_error(name):
    exp = MALFORMED[name]
    path = GOLDEN / "malformed" / f"{name}.twh1"
    with pytest.raises(DataError) as ei:
        s = twh1.TWH1Shard(path)
        s.verify()
    assert type(ei.value).__name__ == exp["error"]
    assert exp["message_contains"] in ei.value.message
    assert str(path) in ei.value.message
    assert ei.value.exit_code == ExitCode.DATA
    assert ei.value.hint


def test_missing_shard_is_missing_input(tmp_path):
    with pytest.raises(FileNotFoundError):
        twh1.TWH1Shard(tmp_path / "nope.twh1")


keys = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=12)


@given(dtype=st.sampled_from(["u8", "f16", "f32"]), w=st.integers(1, 9), h=st.integers(1, 9),
       mb=st.integers(1, 4), data=st.data())
def test_round_trip(tmp_path_factory, dtype, w, h, mb, data):
    n = data.draw(st.integers(0, 5))
    b = twh1.ShardBuilder(capacity=5, width=w, height=h, max_boxes=mb, dtype=dtype)
    expect = []
    for _ in range(n):
        img = data.draw(st.binary(min_size=3 * w * h, max_size=3 * w * h))
        arr = np.frombuffer(img, np.uint8).reshape(3, h, w)
        nb = data.draw(st.integers(0, mb))
        boxes = np.array(data.draw(st.lists(st.lists(st.integers(0, 500), min_size=4, max_size=4),
                                            min_size=nb, max_size=nb)), np.float32).reshape(-1, 4)
        cls = np.array(data.draw(st.lists(st.integers(0, 2**31 - 1), min_size=nb, max_size=nb)), np.int32)
        key, run = data.draw(keys), data.draw(keys)
        fid = data.draw(st.integers(-1, 2**62))
        b.image_slot()[:] = arr
        b.commit(key=key, boxes=boxes, classes=cls, frame_id=fid, run_id=run)
        expect.append((arr, boxes, cls, key, run, fid))
    path = tmp_path_factory.mktemp("rt") / "s.twh1"
    sha = b.write_file(path)
    with twh1.TWH1Shard(path, verify=True) as s:
        assert len(s) == n and s.stored_checksum() == sha
        for i, (arr, boxes, cls, key, run, fid) in enumerate(expect):
            assert (s.images[i] == arr.astype(s.images.dtype)).all()
            nb = len(boxes)
            assert s.num_boxes(i) == nb
            assert (s.boxes[i, :nb] == boxes.astype(s.boxes.dtype)).all()
            assert (s.boxes[i, nb:] == 0).all()
            assert s.classes[i, :nb].tolist() == cls.tolist() and (s.classes[i, nb:] == -1).all()
            assert s.key(i) == key and s.run_id(i) == run and int(s.frame_ids[i]) == fid


def test_builder_reset_reuses_buffers_without_leaking(tmp_path):
    b = twh1.ShardBuilder(capacity=2, width=2, height=2, max_boxes=2)
    b.image_slot()[:] = 9
    b.commit(key="a", boxes=np.ones((2, 4), np.float32), classes=np.array([1, 2]))
    b.write_file(tmp_path / "a.twh1")
    b.reset()
    b.image_slot()[:] = 1
    b.commit(key="b", boxes=np.zeros((0, 4), np.float32), classes=np.array([], np.int32))
    b.write_file(tmp_path / "b.twh1")
    with twh1.TWH1Shard(tmp_path / "b.twh1") as s:
        assert len(s) == 1 and s.num_boxes(0) == 0 and (s.classes[0] == -1).all() and (s.boxes[0] == 0).all()
    with pytest.raises(ValueError):
        b.commit(key="c", boxes=np.zeros((3, 4), np.float32), classes=np.zeros(3, np.int32))


def test_views_are_zero_copy_read_only_and_pickle_by_path():
    s = twh1.TWH1Shard(GOLDEN / "small_u8.twh1")
    img = s.images[1]
    assert not img.flags.writeable
    assert img.base is not None and not img.flags.owndata
    with pytest.raises(ValueError):
        img[0, 0, 0] = 1
    blob = pickle.dumps(s)
    assert len(blob) < 300  # the path, not the data
    s2 = pickle.loads(blob)
    assert (s2.images == s.images).all() and s2.key(2) == s.key(2)


def test_is_twh1_and_read_header():
    assert twh1.is_twh1((GOLDEN / "small_u8.twh1").read_bytes()[:8])
    assert not twh1.is_twh1(b"TBL\x02")
    assert twh1.read_header(GOLDEN / "small_f16.twh1").dtype == "f16"


def _filled_builder(dtype: str, w: int, h: int, n: int, capacity: int = 9) -> twh1.ShardBuilder:
    rng = np.random.default_rng(w * 131 + h * 7 + n)
    b = twh1.ShardBuilder(capacity=capacity, width=w, height=h, max_boxes=3, dtype=dtype)
    for i in range(n):
        slot = b.image_slot()
        slot[...] = rng.integers(0, 256, slot.shape)
        b.commit(key=f"img/{i}.jpg", boxes=np.array([[1, 2, 3, 4]] * (i % 4), np.float32),
                 classes=np.arange(i % 4, dtype=np.int32), frame_id=i, run_id=f"run{i % 2}")
    return b


@pytest.mark.parametrize("direct", [True, False])
@pytest.mark.parametrize(("dtype", "w", "h", "n"), [("u8", 64, 64, 7), ("u8", 5, 4, 3), ("f16", 33, 17, 9),
                                                    ("f32", 40, 40, 1), ("u8", 64, 32, 0)])
def test_write_direct_gives_the_same_bytes_as_write(tmp_path, direct, dtype, w, h, n):
    """O_DIRECT writing (pixels flushed early, header page last) is byte-identical to the streaming writer,
    for image sizes that are and are not whole pages, with and without pages written before the end."""
    from warpdata.core.directio import BLOCK, AlignedFile

    b = _filled_builder(dtype, w, h, n)
    ref = tmp_path / "ref.twh1"
    sha = b.write_file(ref)
    for flush_pages in (0, 1, None):
        path = tmp_path / f"direct-{flush_pages}.twh1"
        path.touch()
        flat = b.image_bytes()
        written = len(flat) // BLOCK * BLOCK if flush_pages is None else min(flush_pages * BLOCK,
                                                                              len(flat) // BLOCK * BLOCK)
        with AlignedFile(path, direct=direct) as f:
            f.submit(twh1.IMAGE_ALIGN, flat[:written])
            assert b.write_direct(f, written=written) == sha
        assert path.read_bytes() == ref.read_bytes()
        twh1.TWH1Shard(path, verify=True).close()


def test_write_direct_rejects_a_partial_page_already_written(tmp_path):
    from warpdata.core.directio import AlignedFile

    b = _filled_builder("u8", 64, 64, 2)
    (tmp_path / "x").touch()
    with AlignedFile(tmp_path / "x") as f, pytest.raises(ValueError, match="whole number of pages"):
        b.write_direct(f, written=100)


def test_builder_images_are_page_aligned():
    b = twh1.ShardBuilder(capacity=3, width=7, height=5, max_boxes=1, dtype="f32")
    assert b.images.ctypes.data % 4096 == 0 and b.images.flags.c_contiguous
