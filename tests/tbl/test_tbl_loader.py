"""TblLoader: decode correctness, shuffle, exact-once sharding, filters, torch adaptors."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from warpdata.core.errors import DataError, UsageError
from warpdata.formats import tbl
from warpdata.sampledata.photos import encode_jpeg, encode_png, synthetic_photo
from warpdata.tbl.loader import ImageDecoder, TblLoader


@pytest.fixture(scope="module")
def tbl_file(tmp_path_factory):
    rng = np.random.default_rng(5)
    p = tmp_path_factory.mktemp("ld") / "x.tbl"
    with tbl.TblWriter(p, fsync=False) as w:
        for i in range(23):
            wd, ht = 40 + 8 * (i % 5), 32 + 4 * (i % 3)
            img = synthetic_photo(rng, wd, ht)
            w.add(encode_png(img) if i % 7 == 0 else encode_jpeg(img, 92), metadata={"key": f"k{i:02d}"})
        w.close(warp_metadata=True)
    return p


@given(n=st.integers(1, 40), bs=st.integers(1, 7), world=st.integers(1, 5), mode=st.sampled_from(["exact", "pad", "drop"]))
def test_split_over_ranks(n, bs, world, mode, tmp_path_factory):
    """Exact: each sample once; pad: equal batch counts, repeats < world; drop_last: equal full batches."""
    p = _small_tbl(tmp_path_factory, n)
    kw = dict(drop_last=mode == "drop", pad=mode == "pad", threads=1, shuffle=True, seed=1)
    if mode == "drop" and n < world * bs:
        with pytest.raises(UsageError, match="no batch"):
            TblLoader(p, bs, rank=0, world_size=world, **kw)
        return
    loaders = [TblLoader(p, bs, rank=r, world_size=world, **kw) for r in range(world)]
    per_rank = [ld.batch_indices() for ld in loaders]
    seen = sorted(int(i) for b in per_rank for x in b for i in x)
    counts = {len(b) for b in per_rank}
    if mode == "exact":
        assert seen == list(range(n)) and max(counts) - min(counts) <= 1
    elif mode == "pad":
        assert set(seen) == set(range(n)) and len(counts) == 1 and len(seen) - n < world
    else:
        assert len(set(seen)) == len(seen) and len(counts) == 1
        assert all(len(x) == bs for b in per_rank for x in b) and n - len(seen) < world * bs


_SMALL: dict = {}


def _small_tbl(tmp_path_factory, n):
    if n not in _SMALL:
        p = tmp_path_factory.mktemp("small") / f"{n}.tbl"
        rng = np.random.default_rng(n)
        with tbl.TblWriter(p, fsync=False) as w:
            for _ in range(n):
                w.add(encode_jpeg(synthetic_photo(rng, 16, 16), 80))
        _SMALL[n] = p
    return _SMALL[n]


def test_decode_matches_simplejpeg_and_pillow(tbl_file):
    import io

    import simplejpeg
    from PIL import Image

    r = tbl.TblReader(tbl_file)
    batches = list(TblLoader(r, 5, threads=2))
    images = [im for b in batches for im in b.images]
    assert [int(i) for b in batches for i in b.indices] == list(range(23))
    for i, im in enumerate(images):
        data = bytes(r[i])
        ref = np.asarray(Image.open(io.BytesIO(data)).convert("RGB")) if i % 7 == 0 else \
            simplejpeg.decode_jpeg(data, colorspace="RGB")
        assert im.dtype == np.uint8 and np.array_equal(im, ref)


def test_resize_and_dct_downscale(tbl_file):
    batches = list(TblLoader(tbl_file, 8, size=(16, 20), threads=2))
    assert [b.images.shape for b in batches] == [(8, 16, 20, 3), (8, 16, 20, 3), (7, 16, 20, 3)]
    dec = ImageDecoder((12, 15))
    rng = np.random.default_rng(0)
    big = encode_jpeg(synthetic_photo(rng, 120, 96))
    out = dec(big, tbl.FORMAT_CODES["jpeg"], 120, 96)
    assert out.shape == (12, 15, 3)
    # the result is close to a full decode resized the same way: DCT scaling changes detail, not content
    import simplejpeg
    from PIL import Image

    full = np.asarray(Image.fromarray(simplejpeg.decode_jpeg(big)).resize((15, 12), Image.BILINEAR))
    assert np.abs(full.astype(int) - out.astype(int)).mean() < 12
    exact = np.empty((96, 120, 3), np.uint8)
    assert np.shares_memory(ImageDecoder((96, 120))(big, 1, 120, 96, exact), exact)  # decoded in place


def test_shuffle_seeded_and_epoch_dependent(tbl_file):
    def order(seed, epoch):
        ld = TblLoader(tbl_file, 4, shuffle=True, seed=seed, threads=1)
        ld.set_epoch(epoch)
        return [int(i) for b in ld for i in b.indices]

    a = order(1, 0)
    assert sorted(a) == list(range(23)) and a != list(range(23))
    assert a == order(1, 0) and a != order(1, 1) and a != order(2, 0)


@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_ranks_from_the_environment_cover_exactly_once(tbl_file, world, monkeypatch):
    seen, counts = [], []
    for rank in range(world):
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("WORLD_SIZE", str(world))
        ld = TblLoader(tbl_file, 4, shuffle=True, seed=3, threads=2)
        got = list(ld)
        counts.append(len(got))
        assert len(got) == len(ld)
        seen += [int(i) for b in got for i in b.indices]
    assert sorted(seen) == list(range(23)) and max(counts) - min(counts) <= 1


def test_filter_predicate_and_metadata(tbl_file):
    ld = TblLoader(tbl_file, 50, filter=lambda s: s.format == "png", with_metadata=True, threads=1)
    (b,) = list(ld)
    assert b.indices.tolist() == [0, 7, 14, 21]
    assert [m["key"] for m in b.metadata] == ["k00", "k07", "k14", "k21"]


def test_bad_rank_and_corrupt_sample(tbl_file, tmp_path):
    with pytest.raises(UsageError):
        TblLoader(tbl_file, 4, rank=2, world_size=2)
    b = bytearray(tbl_file.read_bytes())
    r = tbl.TblReader(tbl_file)
    b[r.info(3).offset + 200] ^= 0xFF
    p = tmp_path / "bad.tbl"
    p.write_bytes(b)
    with pytest.raises(tbl.ChecksumMismatch, match="k03"):
        list(TblLoader(p, 4, threads=2))
    with pytest.raises(DataError, match="could not be decoded"):
        # without verification the damaged JPEG reaches the decoder, which must fail loudly or
        # decode; a truncated image must never pass silently as a different sample
        bb = bytearray(tbl_file.read_bytes())
        bb[r.info(0).offset + 8: r.info(0).offset + 16] = b"\0" * 8  # PNG IHDR length/type destroyed
        p2 = tmp_path / "bad2.tbl"
        p2.write_bytes(bb)
        list(TblLoader(p2, 4, threads=1, verify="off"))
    with pytest.raises(DataError, match="1 corrupt sample.*sample 3"):
        TblLoader(p, 4, verify="full")  # the whole file is checked before the first batch


def test_torch_dataloader_with_workers(tbl_file):
    torch = pytest.importorskip("torch")
    from warpdata.tbl.torch_adaptor import TblDataset, TblIterableDataset

    ds = TblDataset(tbl_file, size=16)
    dl = torch.utils.data.DataLoader(ds, batch_size=5, num_workers=2)
    idx = []
    for imgs, ids in dl:
        assert imgs.dtype == torch.uint8 and imgs.shape[1:] == (16, 16, 3)
        idx += ids.tolist()
    assert idx == list(range(23))
    seen = []
    for world_rank in range(2):
        it = TblIterableDataset(tbl_file, 3, size=8, shuffle=True, seed=4, rank=world_rank, world_size=2)
        dl = torch.utils.data.DataLoader(it, batch_size=None, num_workers=2)
        got = list(dl)
        assert len(got) == len(it)
        seen += [int(i) for b in got for i in b["indices"]]
        assert all(b["images"].shape[1:] == (8, 8, 3) for b in got)
    assert sorted(seen) == list(range(23))


def test_buffer_pool_reuses_only_unreferenced_buffers():
    from warpdata.tbl.loader import BufferPool

    pool = BufferPool(keep=2)
    def addr(x):
        return x.__array_interface__["data"][0]

    a = pool.take(1000)
    where = addr(a)  # no reference kept: a reference would pin the buffer
    del a
    b = pool.take(800)  # nothing refers to the first buffer any more: reused
    assert addr(b) == where
    c = pool.take(800)  # b is alive: a new buffer
    assert not np.shares_memory(b, c)
    view = b.reshape(20, 40)[3]
    del b
    assert not np.shares_memory(pool.take(800), view)  # a view of a view still pins it
    torch = pytest.importorskip("torch")
    t = torch.from_numpy(pool.take(5000))
    assert not np.shares_memory(pool.take(5000), t.numpy())  # a tensor on the buffer pins it too


@pytest.mark.parametrize("size", [None, 24])
@pytest.mark.parametrize("threads", [1, 2])
def test_kept_batches_stay_intact_and_dropped_ones_are_recycled(tbl_file, size, threads):
    ref = [b.images for b in TblLoader(tbl_file, 3, size=size, threads=1, prefetch=1)]
    ref = [np.array(im) for imgs in ref for im in imgs]  # private copies
    kept = list(TblLoader(tbl_file, 3, size=size, threads=threads, prefetch=1))
    got = [im for b in kept for im in b.images]
    assert len(got) == len(ref) == 23
    for g, r in zip(got, ref, strict=True):
        assert np.array_equal(g, r)  # later batches never overwrote earlier, still-held ones
    ld = TblLoader(tbl_file, 3, size=size, threads=threads, prefetch=1)
    for b in ld:  # each batch dropped before the next is made: a handful of buffers serve them all
        for k, im in enumerate(b.images):
            assert np.array_equal(im, ref[int(b.indices[k])])
    assert ld._pool.allocated <= ld._pool.keep < len(ld)  # buffers were reused


def test_a_state_saved_every_step_hashes_the_selection_once(tbl_file, monkeypatch):
    import hashlib

    import warpdata.tbl.loader as tl

    calls, sha256 = [], hashlib.sha256

    def counting(*a):  # hashlib is shared: count only hashes of the selection's bytes
        if a and len(a[0]) == 8 * len(ld.selection):
            calls.append(1)
        return sha256(*a)

    ld = TblLoader(tbl_file, 4, shuffle=True, seed=3, threads=1)
    monkeypatch.setattr(tl.hashlib, "sha256", counting)
    fps = {ld.state_dict(k)["fingerprint"] for k in range(4)}
    assert len(fps) == 1 and len(calls) == 1
    want = sha256(np.ascontiguousarray(ld.selection, np.int64).tobytes())
    want.update(repr((len(ld.reader), ld.shuffle, ld.seed)).encode())
    assert fps == {want.hexdigest()[:16]}  # states saved before still load
    ld.seed = 4  # another seed is another fingerprint, never a stale one
    assert ld.state_dict(0)["fingerprint"] not in fps
