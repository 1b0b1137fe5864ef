"""Tile-compression backends: one conformance suite every backend subclasses.

A backend is done when its subclass of :class:`BackendConformance` passes.
The GPU subclass carries the ``gpu`` marker and skips itself without a CUDA
device and its packages; the GPU backend's pure parts (kernel index math,
batching, slot scheduling) are tested on the CPU below against numpy.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import zstandard
from hypothesis import given
from hypothesis import strategies as st
from warpdata import kernels
from warpdata.core.errors import ConfigError, DependencyError
from warpdata.formats.tiling import SlabPlan, TileGeometry, lift_transpose
from warpdata.kernels import gpu as gpu_mod

DTYPES = ["uint8", "uint16", "uint32", "float32", "float64"]


def _frame(payload) -> bytes:
    """The zstd frame of a chunk payload after checking the crc32c codec's suffix (backends checksum by default)."""
    import google_crc32c

    b = bytes(payload)
    frame, crc = b[:-4], b[-4:]
    assert int.from_bytes(crc, "little") == google_crc32c.value(frame), "chunk CRC-32C does not match its frame"
    return frame


def _slab_tiles(a: np.ndarray, plan: SlabPlan, slab: int, fill) -> np.ndarray:
    n0 = plan.geometry.tile[0]
    rows = a[slab * n0:(slab + 1) * n0]
    return lift_transpose(rows, plan.geometry.tile, fill).reshape(plan.tiles_per_slab, -1)


class BackendConformance:
    """Subclasses set ``name``; everything else is shared."""

    name: str

    @pytest.fixture
    def backend(self):
        b = kernels.get_backend(self.name, level=1, threads=2)
        yield b
        b.close()

    def _run(self, backend, a: np.ndarray, tile, fill=0):
        geo = TileGeometry.create(a.shape, tile, a.dtype)
        plan = SlabPlan(geo.elided(), fill)
        backend.prepare(plan)
        bufs = [backend.alloc_slab() for _ in range(2)]
        frames_per_slab = []
        pending = []
        ea = a.reshape(plan.geometry.shape)
        for s in range(plan.n_slabs):
            buf = bufs[s % 2]
            if len(pending) == 2:
                frames_per_slab.append(backend.collect(pending.pop(0)))
            rows = plan.rows(s)
            buf[:rows] = ea[s * plan.geometry.tile[0]: s * plan.geometry.tile[0] + rows]
            pending.append(backend.submit(buf, rows))
        frames_per_slab += [backend.collect(t) for t in pending]
        return plan, ea, frames_per_slab

    @pytest.mark.parametrize("dtype", DTYPES)
    def test_frames_are_plain_zstd_of_the_tiled_bytes(self, backend, dtype):
        a = (np.random.default_rng(1).random((11, 9, 7)) * 200).astype(dtype)
        plan, ea, slabs = self._run(backend, a, (4, 4, 3), fill=5)
        assert len(slabs) == 3
        d = zstandard.ZstdDecompressor()
        for s, frames in enumerate(slabs):
            assert len(frames) == plan.tiles_per_slab
            want = _slab_tiles(ea, plan, s, 5)
            for i, f in enumerate(frames):
                f = _frame(f)
                assert zstandard.get_frame_parameters(f).content_size == want[i].nbytes
                assert d.decompress(f, max_output_size=want[i].nbytes) == want[i].tobytes()

    def test_size_one_dimensions_and_one_slab(self, backend):
        a = np.arange(2 * 1 * 5, dtype=np.uint16).reshape(2, 1, 5)
        plan, ea, slabs = self._run(backend, a, (4, 4, 2))
        assert plan.geometry.shape == (2, 5) and len(slabs) == 1
        want = _slab_tiles(ea, plan, 0, 0)
        got = [zstandard.ZstdDecompressor().decompress(_frame(f), max_output_size=want[0].nbytes) for f in slabs[0]]
        assert got == [w.tobytes() for w in want]

    def test_alloc_slab_has_slab_shape(self, backend):
        geo = TileGeometry.create((10, 6, 6), (4, 3, 3), "f32")
        plan = SlabPlan(geo.elided(), 0.0)
        backend.prepare(plan)
        buf = backend.alloc_slab()
        assert buf.shape == (4, 6, 6) and buf.dtype == np.float32 and buf.flags.c_contiguous

    def test_whole_writer_round_trip(self, tmp_path):
        import zarr
        from warpdata.tiles.writer import TileWriter

        a = (np.random.default_rng(2).random((19, 13, 11)) * 4000).astype(np.uint16)
        with TileWriter(tmp_path / "a.zarr", a.shape, a.dtype, (8, 8, 8), backend=self.name, fsync=False) as w:
            w.write_array(a)
        np.testing.assert_array_equal(zarr.open_array(str(tmp_path / "a.zarr"), mode="r")[...], a)


def codec_crc(codec, data: bytes) -> int:
    """The CRC zarr-python's own crc32c codec appends to ``data``."""
    from zarr.core.array_spec import ArrayConfig, ArraySpec
    from zarr.core.buffer import default_buffer_prototype
    from zarr.core.dtype import parse_data_type

    spec = ArraySpec(shape=(len(data),), dtype=parse_data_type("uint8", zarr_format=3), fill_value=0,
                     config=ArrayConfig.from_dict({}), prototype=default_buffer_prototype())
    out = codec._encode_sync(default_buffer_prototype().buffer.from_bytes(data), spec).to_bytes()
    assert out[:-4] == data
    return int.from_bytes(out[-4:], "little")


class TestCpuBackend(BackendConformance):
    name = "cpu"

    def test_output_is_identical_for_any_thread_count(self):
        a = (np.random.default_rng(3).random((8, 64, 64)) * 3000).astype(np.uint16)
        results = []
        for threads in (1, 3):
            b = kernels.get_backend("cpu", threads=threads)
            _, _, slabs = self._run(b, a, (4, 8, 8))
            assert len(b._tasks) >= threads  # every thread gets work
            b.close()
            results.append([bytes(f) for frames in slabs for f in frames])
        assert results[0] == results[1]

    def test_slab_buffers_are_recycled(self):
        from warpdata.kernels import cpu

        geo = TileGeometry.create((4, 32, 32), (4, 8, 8), "u8")
        plan = SlabPlan(geo.elided(), 0)
        b = kernels.get_backend("cpu")
        b.prepare(plan)
        first = b.alloc_slab()
        ptr = first.__array_interface__["data"][0]
        b.close()
        b2 = kernels.get_backend("cpu")
        b2.prepare(plan)
        assert b2.alloc_slab().__array_interface__["data"][0] == ptr
        b2.close()
        assert any(x.nbytes == plan.slab_nbytes for x in cpu._POOL)

    @pytest.mark.parametrize("checksum", [True, False])
    @pytest.mark.parametrize("direct", [True, False])
    @pytest.mark.parametrize("level", [1, 3])
    def test_frames_are_byte_identical_to_zstandard_compress(self, direct, level, checksum):
        """Same zstd parameters as zstandard/numcodecs (level, no checksum, content size): same bytes,
        followed by exactly what zarr-python's crc32c codec appends (or nothing, checksum off)."""
        from warpdata.kernels.cpu import CpuBackend
        from zarr.codecs import Crc32cCodec

        a = (np.random.default_rng(5).random((9, 40, 24)) * 3000).astype(np.uint16)
        b = CpuBackend(level=level, threads=2, direct=direct, checksum=checksum)
        plan, ea, slabs = self._run(b, a, (4, 16, 8))
        c = zstandard.ZstdCompressor(level=level, write_checksum=False)
        codec = Crc32cCodec()
        for s, frames in enumerate(slabs):
            want = [c.compress(w) for w in _slab_tiles(ea, plan, s, 0)]
            if checksum:
                want = [w + np.array([codec_crc(codec, w)], "<u4").tobytes() for w in want]
            assert [bytes(f) for f in frames] == want
        b.close()

    def test_arenas_are_reused_only_after_release(self):
        from warpdata.kernels.cpu import CpuBackend

        b = CpuBackend(threads=2)
        assert b.direct  # cffi is a dependency: the fast path is what runs
        geo = TileGeometry.create((8, 32, 32), (4, 8, 8), "u16")
        plan = SlabPlan(geo.elided(), 0)
        b.prepare(plan)
        slab = b.alloc_slab()
        slab[...] = 7
        t1 = b.submit(slab, 4)
        f1 = b.collect(t1)
        kept = [bytes(f) for f in f1]
        t2 = b.submit(slab, 4)  # t1 not released: its frames must stay intact
        b.collect(t2)
        assert t2.arena is not t1.arena and [bytes(f) for f in f1] == kept
        arena = t1.arena
        b.release(t1)
        t3 = b.submit(slab, 4)
        assert t3.arena is arena
        b.collect(t3)
        b.release(t2)
        b.release(t3)
        b.close()

    def test_groups_finish_one_after_another_and_are_signalled_before_the_slab(self):
        """set_groups orders the tasks object by object: with one thread, every group but the last
        is signalled while the slab is still compressing, and its frames are the slab's own."""
        import threading

        from warpdata.kernels.cpu import CpuBackend

        a = (np.random.default_rng(7).random((4, 64, 64)) * 3000).astype(np.uint16)
        geo = TileGeometry.create(a.shape, (4, 8, 8), a.dtype)
        plan = SlabPlan(geo.elided(), 0)
        b = CpuBackend(threads=1)
        b.prepare(plan)
        # two interleaved groups (even and odd tiles), as shards are in the tile grid's C order
        groups = [list(range(0, 64, 2)), list(range(1, 64, 2))]
        b.set_groups(groups)
        assert b._tasks[0][0] == 0 and all(t % 2 == 0 for ts in b._tasks[:len(b._tasks) // 2] for t in ts)
        slab = b.alloc_slab()
        slab[...] = a
        gate = threading.Event()
        b._pool.submit(gate.wait)  # the one worker waits: every callback is registered before any task runs
        ticket = b.submit(slab, 4)
        seen: list[tuple[int, bool, list[bytes]]] = []
        assert b.on_group_ready(ticket, lambda g: seen.append((g, b.ready(ticket),
                                                                [bytes(f) for f in b.group_frames(ticket, groups[g])])))
        gate.set()
        frames = [bytes(f) for f in b.collect(ticket)]
        assert [(g, ready) for g, ready, _ in seen] == [(0, False), (1, True)]
        for g, _, got in seen:
            assert got == [frames[t] for t in groups[g]]
        c = zstandard.ZstdCompressor(level=1, write_checksum=False)
        assert [_frame(f) for f in frames] == [c.compress(w) for w in _slab_tiles(a, plan, 0, 0)]
        b.release(ticket)
        b.close()

    def test_groups_must_cover_the_slab_once(self):
        from warpdata.core.errors import InternalError
        from warpdata.kernels.cpu import CpuBackend

        b = CpuBackend(threads=1)
        b.prepare(SlabPlan(TileGeometry.create((4, 16, 16), (4, 8, 8), "u8").elided(), 0))
        with pytest.raises(InternalError, match="do not cover"):
            b.set_groups([[0, 1], [1, 2, 3]])
        b.close()

    def test_the_bytes_fallback_does_not_signal_groups(self):
        from warpdata.kernels.cpu import CpuBackend

        b = CpuBackend(threads=1, direct=False)
        plan = SlabPlan(TileGeometry.create((4, 16, 16), (4, 8, 8), "u8").elided(), 0)
        b.prepare(plan)
        b.set_groups([[0, 3], [1, 2]])
        slab = b.alloc_slab()
        slab[...] = 3
        ticket = b.submit(slab, 4)
        assert b.on_group_ready(ticket, lambda g: None) is False
        frames = b.collect(ticket)  # in tile order although the tasks ran 0, 3, 1, 2
        c = zstandard.ZstdCompressor(level=1, write_checksum=False)
        assert [_frame(f) for f in frames] == [c.compress(w) for w in _slab_tiles(slab, plan, 0, 0)]
        b.close()


@pytest.mark.gpu
@pytest.mark.skipif(gpu_mod.GpuBackend.probe() is not None,
                    reason=f"gpu backend unavailable: {gpu_mod.GpuBackend.probe()}")
class TestGpuBackend(BackendConformance):
    name = "gpu"


# -- registry ---------------------------------------------------------------------

def test_registry_names_and_hints():
    assert set(kernels.BACKENDS) == {"cpu", "gpu"}
    assert "pip install 'warp-toolchain[gpu]'" in kernels.BACKENDS["gpu"].install
    avail = kernels.availability()
    assert avail["cpu"] is None
    if avail["gpu"] is not None:
        assert "warp-toolchain[gpu]" in avail["gpu"]


def test_auto_and_env(monkeypatch):
    monkeypatch.delenv("WARP_BACKEND", raising=False)
    expected = "gpu" if gpu_mod.GpuBackend.probe() is None else "cpu"
    assert kernels.resolve("auto") == expected == kernels.resolve(None)
    monkeypatch.setenv("WARP_BACKEND", "cpu")
    assert kernels.resolve(None) == "cpu"
    monkeypatch.setenv("WARP_BACKEND", "tpu")
    with pytest.raises(ConfigError, match="unknown tile backend 'tpu'"):
        kernels.resolve(None)


@pytest.mark.skipif(gpu_mod.GpuBackend.probe() is None, reason="a GPU is available here")
def test_missing_gpu_is_a_dependency_error_with_hint():
    with pytest.raises(DependencyError) as e:
        kernels.get_backend("gpu")
    assert "warp-toolchain[gpu]" in (e.value.hint or "")


def test_importing_the_registry_imports_no_backend():
    import subprocess
    import sys

    code = ("import sys, warpdata.kernels as k; "
            "print(any(m in sys.modules for m in ('warpdata.kernels.cpu', 'warpdata.kernels.gpu', 'cupy', 'zstandard')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


# -- GPU pure parts on the CPU ---------------------------------------------------------

@st.composite
def slab_cases(draw):
    d = draw(st.integers(1, 4))
    shape = tuple(draw(st.lists(st.integers(2, 9), min_size=d, max_size=d)))
    tile = tuple(draw(st.lists(st.integers(1, 5), min_size=d, max_size=d)))
    dtype = draw(st.sampled_from(DTYPES))
    return shape, tile, dtype, draw(st.integers(0, 2**31))


@given(slab_cases())
def test_kernel_index_math_matches_numpy_tiling(case):
    shape, tile, dtype, seed = case
    a = (np.random.default_rng(seed).random(shape) * 250).astype(dtype)
    geo = TileGeometry.create(shape, tile, dtype)
    plan = SlabPlan(geo.elided(), 9)
    params = gpu_mod.KernelParams.from_plan(plan)
    ea = a.reshape(plan.geometry.shape)
    n0 = plan.geometry.tile[0]
    for s in range(plan.n_slabs):
        rows = plan.rows(s)
        slab = np.full(plan.slab_shape, 77, dtype=dtype)  # garbage past `rows` must never leak
        slab[:rows] = ea[s * n0: s * n0 + rows]
        got = gpu_mod.emulate_kernel(slab, params, rows, 9)
        want = lift_transpose(ea[s * n0: s * n0 + rows], plan.geometry.tile, 9).reshape(plan.tiles_per_slab, -1)
        np.testing.assert_array_equal(got, want)


def test_kernel_source_has_the_emulated_steps():
    src = gpu_mod.KERNEL_SOURCE
    for step in ("t % counts[d]", "r % tile[d]", "(d == 0) ? rows : shape[d]", "ok ? src[s] : fill",
                 "dst[tnum * tile_stride + toff]"):
        assert step in src
    # every index is 64-bit: the only 32-bit ints are the dimension count and counter
    import re

    assert re.findall(r"\bint\s+(\w+)", src) == ["ndim", "d"]
    assert "unsigned" not in src.replace("ELEM", "")


def _reference_gather(params, rows, o):
    """Independent reference: numpy's unravel/ravel of tile number and in-tile offset."""
    tnum, toff = np.divmod(o, params.tile_elems)
    grid = np.unravel_index(tnum, params.counts)
    inner = np.unravel_index(toff, params.tile)
    coord = [g * n + i for g, n, i in zip(grid, params.tile, inner, strict=True)]
    lim = (rows,) + tuple(params.shape[1:])
    valid = np.logical_and.reduce([c < m for c, m in zip(coord, lim, strict=True)])
    src = np.ravel_multi_index(coord, params.shape, mode="clip")
    return np.where(valid, src, -1), tnum * params.stride + toff


@pytest.mark.parametrize("dtype", DTYPES)
def test_kernel_index_math_is_64_bit_for_slabs_past_2_31_elements(dtype):
    # a slab of 2 x 50000 x 50001 elements (5e9 > 2^31): sampled, never materialized
    geo = TileGeometry.create((3, 50000, 50001), (2, 4096, 4000), dtype)
    plan = SlabPlan(geo.elided(), 0)
    params = gpu_mod.KernelParams.from_plan(plan)
    assert params.total > 2**32 and math.prod(params.shape) > 2**32
    rng = np.random.default_rng(7)
    o = np.concatenate([np.arange(2**31 - 5, 2**31 + 5), rng.integers(0, params.total, 2000),
                        np.arange(params.total - 20, params.total)])
    for rows in (2, 1):  # full slab, then the last slab with one row left
        got_src, got_dst = gpu_mod.kernel_gather(params, rows, o)
        want_src, want_dst = _reference_gather(params, rows, o)
        np.testing.assert_array_equal(got_src, want_src)
        np.testing.assert_array_equal(got_dst, want_dst)
        assert got_src.max() > 2**31 and got_dst.max() > 2**32
    # the last element of the last tile: padding in dim 1 and 2 (50000 % 4096, 50001 % 4000)
    src, _ = gpu_mod.kernel_gather(params, 2, np.array([params.total - 1]))
    assert src[0] == -1


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("tile", [(1, 1, 1), (3, 3, 3), (2, 5, 7), (4, 64, 64)])
def test_tiles_start_aligned_and_never_overlap(dtype, tile):
    geo = TileGeometry.create((5, 70, 70), tile, dtype)
    plan = SlabPlan(geo.elided(), 0)
    params = gpu_mod.KernelParams.from_plan(plan)
    item = np.dtype(dtype).itemsize
    assert params.stride >= params.tile_elems
    assert (params.stride * item) % gpu_mod.TILE_ALIGN == 0
    assert (params.stride - params.tile_elems) * item < gpu_mod.TILE_ALIGN
    _, dst = gpu_mod.kernel_gather(params, plan.rows(0))
    assert len(np.unique(dst)) == dst.size  # a bijection onto the tile slots
    starts = dst[:: params.tile_elems]
    assert np.all((starts * item) % gpu_mod.TILE_ALIGN == 0)
    assert np.all(dst // params.stride == np.arange(dst.size) // params.tile_elems)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("fill", [float("nan"), -0.0, 1e30, 0])
def test_edge_padding_has_the_cpu_backends_fill_bits(dtype, fill):
    """The kernel pads with fill_bits(fill) moved as unsigned ints: same bytes as lift_transpose."""
    a = (np.random.default_rng(4).random((5, 6, 7)) * 100).astype(dtype)
    geo = TileGeometry.create(a.shape, (4, 4, 4), dtype)
    plan = SlabPlan(geo.elided(), fill)
    params = gpu_mod.KernelParams.from_plan(plan)
    for s in range(plan.n_slabs):
        rows = plan.rows(s)
        slab = np.full(plan.slab_shape, 3, dtype=dtype)
        slab[:rows] = a[s * 4: s * 4 + rows]
        got = gpu_mod.emulate_kernel(slab, params, rows, fill)
        want = lift_transpose(a[s * 4: s * 4 + rows], (4, 4, 4), fill).reshape(plan.tiles_per_slab, -1)
        assert got.tobytes() == want.tobytes()
    bits = gpu_mod.fill_bits(fill, dtype)
    assert bits.dtype.itemsize == np.dtype(dtype).itemsize and bits.dtype.kind == "u"
    assert np.array(bits).view(dtype).tobytes() == np.array(fill, dtype=dtype).tobytes()


_HOST_PRELUDE = """
#define __global__
struct warp_dim3 { unsigned int x; };
static warp_dim3 blockIdx = {0}, threadIdx = {0}, blockDim = {1}, gridDim = {1};
"""


@pytest.mark.skipif(__import__("shutil").which("g++") is None, reason="needs g++ to build the kernel for the host")
@pytest.mark.parametrize("dtype", DTYPES)
def test_kernel_source_itself_matches_lift_transpose(tmp_path, dtype):
    """KERNEL_SOURCE compiled as host C++ (one thread: blockIdx 0, gridDim 1) on real slabs.

    This runs the CUDA source's own index math and padding, not the numpy mirror.
    """
    import ctypes
    import subprocess

    ctype, utype = gpu_mod._UINT_FOR_SIZE[np.dtype(dtype).itemsize]
    src = tmp_path / "k.cpp"
    src.write_text(_HOST_PRELUDE + gpu_mod.KERNEL_SOURCE.replace("ELEM", ctype))
    lib = tmp_path / "k.so"
    subprocess.run(["g++", "-O1", "-shared", "-fPIC", "-o", str(lib), str(src)], check=True)
    fn = ctypes.CDLL(str(lib)).warp_lift_transpose
    ll = ctypes.c_longlong
    fn.argtypes = [ctypes.c_void_p] * 5 + [ctypes.c_int, ll, ll, ll, ll, ctypes.c_uint64]
    fn.restype = None
    a = (np.random.default_rng(8).random((7, 10, 9)) * 200).astype(dtype)
    tile = (3, 4, 5)
    fill = 7
    geo = TileGeometry.create(a.shape, tile, dtype)
    plan = SlabPlan(geo.elided(), fill)
    p = gpu_mod.KernelParams.from_plan(plan)
    dims = [np.array(x, dtype=np.int64) for x in (p.shape, p.tile, p.counts)]
    for s in range(plan.n_slabs):
        rows = plan.rows(s)
        slab = np.full(plan.slab_shape, 99, dtype=dtype)  # garbage past `rows` must never leak
        slab[:rows] = a[s * 3: s * 3 + rows]
        out = np.full(p.n_tiles * p.stride, 0xAB, dtype=utype)
        fn(slab.ctypes.data, out.ctypes.data, *(d.ctypes.data for d in dims), len(p.shape), rows,
           p.tile_elems, p.stride, p.total, int(gpu_mod.fill_bits(fill, dtype)))
        got = out.reshape(p.n_tiles, p.stride)[:, :p.tile_elems].view(dtype)
        want = lift_transpose(a[s * 3: s * 3 + rows], tile, fill).reshape(plan.tiles_per_slab, -1)
        assert got.tobytes() == want.tobytes()
        # the alignment gap between tiles is left untouched
        assert np.all(out.reshape(p.n_tiles, p.stride)[:, p.tile_elems:] == utype(0xAB))


@given(st.integers(0, 5000), st.integers(1, 1 << 20), st.integers(1, 1 << 26))
def test_plan_batches_cover_every_tile_once(n, tile_nbytes, cap):
    batches = gpu_mod.plan_batches(n, tile_nbytes, cap)
    covered = [i for a, b in batches for i in range(a, b)]
    assert covered == list(range(n))
    for a, b in batches:
        assert b > a and ((b - a) * tile_nbytes <= cap or b - a == 1)


def test_compress_bound_holds_for_incompressible_data():
    rng = np.random.default_rng(0)
    c = zstandard.ZstdCompressor(level=1)
    for n in (1, 100, 4096, 128 << 10, 1 << 20):
        data = rng.integers(0, 256, n, dtype=np.uint8).tobytes()
        assert len(c.compress(data)) <= gpu_mod.max_compressed_size(n)


def test_pack_offsets_are_aligned_and_disjoint():
    offs, total = gpu_mod.pack_offsets([5, 8, 1, 0, 17])
    assert offs == [0, 8, 16, 24, 24] and total == 48
    assert all(o % 8 == 0 for o in offs)


def test_slot_schedule_never_reuses_a_busy_slot():
    s = gpu_mod.SlotSchedule(2)
    assert s.submit() == (0, 0) and s.submit() == (1, 1)
    with pytest.raises(RuntimeError, match="still holds slab 0"):
        s.submit()
    with pytest.raises(RuntimeError, match="out of order"):
        s.collect(1)
    assert s.collect(0) == 0
    assert s.submit() == (2, 0)
    assert s.collect(1) == 1 and s.collect(2) == 0
    assert not s.busy and math.isclose(s.next_submit, 3)


@pytest.mark.parametrize("with_size", [True, False])
@pytest.mark.parametrize("checksum", [True, False])
def test_gpu_payloads_get_content_size_and_crc32c_on_the_host(with_size, checksum):
    """GpuBackend.collect's host-side step, run on frames packed as collect packs them (8-aligned,
    CRC_SIZE free bytes after each): every payload has its size declared, its CRC-32C and decodes."""
    import google_crc32c

    rng = np.random.default_rng(9)
    tiles = [rng.integers(0, 50, 300 + 37 * i, dtype=np.uint8).tobytes() for i in range(5)]
    tiles = [t.ljust(600, b"\0") for t in tiles]  # one tile size, as in a slab
    c = zstandard.ZstdCompressor(level=1, write_content_size=with_size, write_checksum=False)
    frames = []
    for t in tiles:
        with c.stream_writer(buf := __import__("io").BytesIO(), closefd=False) as w:  # streaming: no size
            w.write(t)
        frames.append(c.compress(t) if with_size else buf.getvalue())
    assert (zstandard.get_frame_parameters(frames[0]).content_size == 600) is with_size
    offsets, total = gpu_mod.pack_offsets([len(f) + 4 for f in frames])
    host = np.full(total, 0xEE, np.uint8)
    for f, o in zip(frames, offsets, strict=True):
        host[o:o + len(f)] = np.frombuffer(f, np.uint8)
    out = gpu_mod.finish_payloads(host, offsets, [len(f) for f in frames], 600, checksum)
    for payload, t in zip(out, tiles, strict=True):
        b = bytes(payload)
        if checksum:
            b, crc = b[:-4], b[-4:]
            assert int.from_bytes(crc, "little") == google_crc32c.value(b)
        assert zstandard.get_frame_parameters(b).content_size == 600
        assert zstandard.ZstdDecompressor().decompress(b) == t
