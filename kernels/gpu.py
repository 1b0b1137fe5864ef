"""GPU tile backend: CuPy lift/transpose kernel + nvCOMP batched zstd (RAW frames).

Per slab (docs/formats/zarr-tiles.md):

1. the caller fills a **pinned** host slab buffer (two of them: double
   buffering, one per CUDA stream);
2. ``submit`` enqueues on that slot's stream: async H2D copy into a device
   staging buffer, the lift/transpose kernel (one thread per output element:
   the gather formula of :func:`warpdata.formats.tiling.source_index_map`,
   edge padding with the fill value) into a device tile buffer whose tiles
   start ``TILE_ALIGN``-aligned, then nvCOMP batched zstd over the tiles
   (batches bounded by :func:`plan_batches`) with ``BitstreamKind.RAW`` —
   plain zstd frames that any zstd decoder (and so zarr-python / tensorstore)
   reads; the default NVCOMP_NATIVE kind adds an nvCOMP header and is not
   zstd. Nothing waits: nvCOMP syncs only when an output's size is touched;
3. ``collect`` waits for that slot's event, reads the frame sizes, packs the
   frames on the device into one buffer, copies it D2H into a pinned output
   arena and returns memoryviews of the chunk payloads, valid until
   ``release``: with ``checksum`` on (the default) each frame is followed by
   its CRC-32C (the Zarr ``crc32c`` codec, computed on the host from the
   arena, after any header fix-up: :func:`finish_payloads`).

Two slots let slab *k+1*'s H2D copy and kernel overlap slab *k*'s
compression and D2H. nvCOMP's zstd has no level: ``level`` is recorded but
has no effect on the GPU. CuPy and ``nvidia.nvcomp`` are imported lazily:
either the CUDA 12 pair (``cupy-cuda12x`` + ``nvidia-nvcomp-cu12``) or the
CUDA 13 pair (``cupy-cuda13x`` + ``nvidia-nvcomp-cu13``) works — both install
the same import names. The pure parts (kernel parameters and index math,
batch planning, slot scheduling) run without a GPU and are tested on the CPU
against numpy.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
from warpdata.formats import crc as crc32c
from warpdata.formats.tiling import SlabPlan
from warpdata.formats.zarr_v3 import CRC_SIZE, chunk_crc
from warpdata.formats.zstdframe import content_size, with_content_size
from warpdata.kernels import TileBackend

# lazy third-party imports: cupy (the optional [gpu] extra) is imported inside the functions that
# use it, so importing this module does not load it: the module imports on a machine without CUDA

_UINT_FOR_SIZE = {1: ("unsigned char", np.uint8), 2: ("unsigned short", np.uint16),
                  4: ("unsigned int", np.uint32), 8: ("unsigned long long", np.uint64)}

#: byte alignment of every tile's start in the device tile buffer. nvCOMP's batched
#: compressors have per-algorithm minimum alignments for input chunk pointers (the C API
#: exposes them as nvcomp*CompressGetRequiredAlignments, https://docs.nvidia.com/cuda/nvcomp/c_api.html;
#: the Python API does not), so tiles are never packed back to back at odd byte offsets
#: (a 3x3x3 u8 tile is 27 bytes); 256 is cudaMalloc's own alignment and covers any of them.
TILE_ALIGN = 256

# One thread per output element, grid-stride loop; every index is 64-bit (a slab may
# hold more than 2^31 elements). Elements are moved as unsigned integers of the same
# width (floats keep their exact bits, NaN payloads and -0.0 included). Output element
# (tile tnum, offset toff) lands at tnum * tile_stride + toff: tiles start TILE_ALIGN-aligned.
KERNEL_SOURCE = r"""
extern "C" __global__ void warp_lift_transpose(
    const ELEM* __restrict__ src, ELEM* __restrict__ dst,
    const long long* __restrict__ shape, const long long* __restrict__ tile,
    const long long* __restrict__ counts, const int ndim,
    const long long rows, const long long tile_elems, const long long tile_stride,
    const long long total, const ELEM fill)
{
    for (long long o = (long long)blockIdx.x * blockDim.x + threadIdx.x; o < total;
         o += (long long)blockDim.x * gridDim.x) {
        const long long tnum = o / tile_elems;
        const long long toff = o - tnum * tile_elems;
        long long t = tnum, r = toff, s = 0, stride = 1;
        bool ok = true;
        for (int d = ndim - 1; d >= 0; --d) {
            const long long ti = t % counts[d]; t /= counts[d];
            const long long ni = r % tile[d];   r /= tile[d];
            const long long c = ti * tile[d] + ni;
            const long long lim = (d == 0) ? rows : shape[d];
            ok = ok && (c < lim);
            s += c * stride;
            stride *= shape[d];
        }
        dst[tnum * tile_stride + toff] = ok ? src[s] : fill;
    }
}
"""


def tile_stride_elems(tile_elems: int, itemsize: int, align: int = TILE_ALIGN) -> int:
    """Elements from one tile's start to the next in the device tile buffer (≥ ``tile_elems``).

    ``align`` is a multiple of every supported itemsize (1, 2, 4, 8), so the
    stride is a whole number of elements and every tile starts ``align``-aligned.
    """
    nbytes = tile_elems * itemsize
    return -(-nbytes // align) * align // itemsize


def fill_bits(fill, dtype) -> np.generic:
    """The fill value as the unsigned integer of the same width the kernel moves.

    Cast exactly as numpy's ``out[...] = fill`` in :func:`~warpdata.formats.tiling.lift_transpose`
    and ``gather_tile`` does, then reinterpreted: the GPU pads with the same bytes the CPU does.
    """
    dtype = np.dtype(dtype)
    return np.array(fill, dtype=dtype).view(_UINT_FOR_SIZE[dtype.itemsize][1])[()]


@dataclass(frozen=True)
class KernelParams:
    """The integers the kernel receives for one slab geometry."""

    shape: tuple[int, ...]  # slab shape: (tile rows, s_1, …)
    tile: tuple[int, ...]
    counts: tuple[int, ...]  # (1, t_1, …)
    tile_elems: int
    total: int  # output elements = tiles_per_slab * tile_elems
    tile_stride: int = 0  # elements between tile starts in the output buffer (0: = tile_elems)

    @classmethod
    def from_plan(cls, plan: SlabPlan, align: int = TILE_ALIGN) -> KernelParams:
        tile = plan.geometry.tile
        counts = plan.slab_counts
        te = math.prod(tile)
        return cls(plan.slab_shape, tile, counts, te, math.prod(counts) * te,
                   tile_stride_elems(te, plan.geometry.dtype.itemsize, align))

    @property
    def n_tiles(self) -> int:
        return self.total // self.tile_elems

    @property
    def stride(self) -> int:
        return self.tile_stride or self.tile_elems


def kernel_gather(params: KernelParams, rows: int, o: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """What the kernel computes, in numpy: (source index, destination index) per output element.

    Source −1 means fill. Mirrors ``KERNEL_SOURCE`` step by step (same loop
    order, same 64-bit integer ops) so the CPU tests pin down the index math
    the GPU runs. ``o`` selects output elements (default: all of them), so
    huge geometries can be checked on a sample.
    """
    o = np.arange(params.total, dtype=np.int64) if o is None else np.asarray(o, dtype=np.int64)
    tnum = o // params.tile_elems
    toff = o - tnum * params.tile_elems
    t, r = tnum.copy(), toff.copy()
    s = np.zeros_like(o)
    ok = np.ones(o.shape, dtype=bool)
    stride = np.int64(1)
    for d in range(len(params.shape) - 1, -1, -1):
        ti = t % params.counts[d]
        t = t // params.counts[d]
        ni = r % params.tile[d]
        r = r // params.tile[d]
        c = ti * params.tile[d] + ni
        lim = rows if d == 0 else params.shape[d]
        ok &= c < lim
        s += c * stride
        stride = stride * np.int64(params.shape[d])
    return np.where(ok, s, -1), tnum * params.stride + toff


def emulate_kernel(slab: np.ndarray, params: KernelParams, rows: int, fill) -> np.ndarray:
    """The kernel's output for ``slab`` computed on the CPU: (tiles, tile_elems), padding dropped."""
    src, dst = kernel_gather(params, rows)
    utype = _UINT_FOR_SIZE[slab.dtype.itemsize][1]
    flat = slab.reshape(-1).view(utype)
    out = np.zeros(params.n_tiles * params.stride, dtype=utype)  # the stride gap is never written
    out[dst] = np.where(src >= 0, flat[np.maximum(src, 0)], fill_bits(fill, slab.dtype))
    return out.reshape(params.n_tiles, params.stride)[:, :params.tile_elems].view(slab.dtype)


def plan_batches(n_tiles: int, tile_nbytes: int, max_batch_bytes: int) -> list[tuple[int, int]]:
    """Split ``n_tiles`` into contiguous (start, stop) batches of at most ``max_batch_bytes`` input.

    nvCOMP's temporary and output space grow with the batch; bounding the
    input per call bounds device memory. Every batch has ≥ 1 tile.
    """
    if n_tiles <= 0:
        return []
    per = max(1, max_batch_bytes // max(tile_nbytes, 1))
    return [(i, min(i + per, n_tiles)) for i in range(0, n_tiles, per)]


def max_compressed_size(nbytes: int) -> int:
    """zstd's worst-case frame size for ``nbytes`` of input (ZSTD_COMPRESSBOUND)."""
    margin = ((128 << 10) - nbytes) >> 11 if nbytes < (128 << 10) else 0
    return nbytes + (nbytes >> 8) + margin + 64


def pack_offsets(sizes: Sequence[int], align: int = 8) -> tuple[list[int], int]:
    """Offsets of frames packed back to back (each aligned), and the total bytes."""
    offs, pos = [], 0
    for n in sizes:
        offs.append(pos)
        pos += -(-int(n) // align) * align
    return offs, pos


@dataclass
class SlotSchedule:
    """Which of the ``n`` slots (pinned buffer + stream) slab *k* uses, and when it frees.

    Slab *k* uses slot ``k % n``; a slot is busy from ``submit`` to
    ``collect``; submitting to a busy slot or collecting out of order is a
    bug the schedule refuses (raises), so the double buffer can never
    overwrite bytes still in flight.
    """

    n: int = 2
    busy: dict[int, int] = field(default_factory=dict)  # slot -> slab number
    next_submit: int = 0
    next_collect: int = 0

    def submit(self) -> tuple[int, int]:
        k = self.next_submit
        slot = k % self.n
        if slot in self.busy:
            raise RuntimeError(f"slot {slot} still holds slab {self.busy[slot]}: collect it before submitting slab {k}")
        self.busy[slot] = k
        self.next_submit += 1
        return k, slot

    def collect(self, k: int) -> int:
        if k != self.next_collect:
            raise RuntimeError(f"slab {k} collected out of order (expected {self.next_collect})")
        slot = k % self.n
        if self.busy.get(slot) != k:
            raise RuntimeError(f"slab {k} is not in flight")
        del self.busy[slot]
        self.next_collect += 1
        return slot


def _imports():
    """(cupy, nvidia.nvcomp) — ImportError with the reason when missing."""
    import cupy
    from nvidia import nvcomp

    return cupy, nvcomp


class GpuBackend(TileBackend):
    name = "gpu"
    MAX_BATCH_BYTES = 1 << 30
    THREADS_PER_BLOCK = 256

    def __init__(self, *, level: int = 1, threads: int | None = None, checksum: bool = True) -> None:
        super().__init__(level=level, threads=threads, checksum=checksum)
        self.plan: SlabPlan | None = None
        self._slots: list[dict] = []
        self._schedule = SlotSchedule(2)
        self._host_slabs: list[np.ndarray] = []
        self._free_out: list[np.ndarray] = []  # pinned output arenas not lent to a ticket
        self._lent: dict[int, np.ndarray] = {}  # ticket -> the arena its frames live in

    @classmethod
    def probe(cls) -> str | None:
        try:
            import cupy
        except ImportError:
            return "cupy is not installed"
        except Exception as e:  # a broken CUDA install raises other errors at import
            return f"cupy failed to import: {e}"
        try:
            n = cupy.cuda.runtime.getDeviceCount()
        except Exception as e:
            return f"no usable CUDA device ({e})"
        if n < 1:
            return "no CUDA device"
        try:
            from nvidia import nvcomp
        except ImportError:
            return "nvidia-nvcomp is not installed"
        except Exception as e:  # e.g. a cu12 wheel without a CUDA 12 runtime to load
            return f"nvidia-nvcomp failed to import: {e}"
        try:
            nvcomp.Codec(algorithm="Zstd", bitstream_kind=nvcomp.BitstreamKind.RAW)
        except Exception as e:  # nvCOMP < 4 has no BitstreamKind (AttributeError lands here too)
            return f"nvCOMP zstd codec unavailable: {e}"
        return None

    def prepare(self, plan: SlabPlan) -> None:
        cp, nvcomp = _imports()
        self.close()
        self.plan = plan
        self.params = p = KernelParams.from_plan(plan)
        g = plan.geometry
        ctype, utype = _UINT_FOR_SIZE[g.dtype.itemsize]
        self._utype = utype
        self._kernel = cp.RawKernel(KERNEL_SOURCE.replace("ELEM", ctype), "warp_lift_transpose")
        self._fill_bits = fill_bits(plan.fill, g.dtype)
        self._shape_d = cp.asarray(np.array(p.shape, dtype=np.int64))
        self._tile_d = cp.asarray(np.array(p.tile, dtype=np.int64))
        self._counts_d = cp.asarray(np.array(p.counts, dtype=np.int64))
        self._tile_nbytes = g.tile_nbytes
        self._batches = plan_batches(p.n_tiles, g.tile_nbytes, self.MAX_BATCH_BYTES)
        # every frame gets CRC_SIZE bytes of room after it for its CRC-32C (finish_payloads)
        self._out_cap = pack_offsets([max_compressed_size(g.tile_nbytes) + CRC_SIZE] * p.n_tiles)[1]
        device_id = cp.cuda.Device().id
        for _ in range(2):
            stream = cp.cuda.Stream(non_blocking=True)
            self._slots.append({
                "stream": stream,
                "stage": cp.empty(p.shape, dtype=utype),
                # tile i at bytes [i * stride, i * stride + tile_nbytes): TILE_ALIGN-aligned starts
                "tiles": cp.empty((p.n_tiles, p.stride), dtype=utype),
                "packed": cp.empty(self._out_cap, dtype=np.uint8),
                # the stream is passed as a plain cudaStream_t integer (nvCOMP Python API,
                # Codec(cuda_stream=...), https://docs.nvidia.com/cuda/nvcomp/py_api.html)
                "codec": nvcomp.Codec(algorithm="Zstd", bitstream_kind=nvcomp.BitstreamKind.RAW,
                                      device_id=device_id, cuda_stream=stream.ptr),
                "event": None, "frames": None, "slab": None,
            })
        # cp.asarray above copies on the legacy default stream, which the non-blocking slot
        # streams do not wait for (CUDA "stream synchronization behavior"): finish it now
        cp.cuda.runtime.deviceSynchronize()

    def alloc_slab(self) -> np.ndarray:
        cp, _ = _imports()
        buf = _pinned_empty(cp, math.prod(self.plan.slab_shape), self.plan.geometry.dtype)
        self._host_slabs.append(buf)
        return buf.reshape(self.plan.slab_shape)

    def submit(self, slab: np.ndarray, rows: int) -> int:
        """Enqueue H2D copy, lift/transpose kernel and nvCOMP encode on the slot's stream; no wait.

        nvCOMP schedules encode without blocking and synchronizes on the first
        touch of an output Array's attributes (size, CUDA array interface):
        https://github.com/zarr-developers/zarr-python/pull/2863 (review comment by
        the nvCOMP author). So nothing here reads the outputs: sizes are read in
        :meth:`collect`, after :meth:`ready` says the stream got past the encode.
        """
        cp, nvcomp = _imports()
        p = self.params
        if slab.shape != p.shape or not slab.flags.c_contiguous or slab.nbytes != self.plan.slab_nbytes:
            raise ValueError(f"submit() needs a C-contiguous slab of shape {p.shape} from alloc_slab(), "
                             f"got {slab.shape} {slab.dtype}")
        k, slot_no = self._schedule.submit()
        s = self._slots[slot_no]
        stream = s["stream"]
        rt = cp.cuda.runtime
        # only the filled rows travel; the kernel never reads past `rows` (it pads instead).
        # runtime.memcpyAsync(dst, src, size, kind, stream) takes plain integers in every CuPy
        # release (cupy/cuda/runtime.pyx), unlike ndarray.get(blocking=...), which is CuPy 13+.
        nbytes = rows * (slab.nbytes // p.shape[0])
        rt.memcpyAsync(s["stage"].data.ptr, slab.ctypes.data, nbytes, rt.memcpyHostToDevice, stream.ptr)
        blocks = min(max(1, -(-p.total // self.THREADS_PER_BLOCK)), 65535 * 8)
        with stream:  # RawKernel launches on the current stream
            self._kernel((blocks,), (self.THREADS_PER_BLOCK,), (
                s["stage"], s["tiles"], self._shape_d, self._tile_d, self._counts_d, np.int32(len(p.shape)),
                np.int64(rows), np.int64(p.tile_elems), np.int64(p.stride), np.int64(p.total),
                self._fill_bits))
            tiles_u8 = s["tiles"].view(np.uint8)  # (n_tiles, stride * itemsize)
            frames = []
            for a, b in self._batches:
                # Codec.encode takes a list of Arrays and returns one compressed Array per input
                # (batched); with BitstreamKind.RAW each is one plain zstd frame, no nvCOMP header
                # (nvCOMP Python samples, NVIDIA/CUDALibrarySamples nvCOMP/examples/python/nvcomp_basic.ipynb)
                batch = nvcomp.as_arrays([tiles_u8[i, :self._tile_nbytes] for i in range(a, b)],
                                         cuda_stream=stream.ptr)
                frames.extend(s["codec"].encode(batch))
        # the nvCOMP-owned outputs stay referenced until collect() has copied them out
        s["frames"], s["slab"] = frames, slab
        s["event"] = stream.record()
        return k

    def ready(self, ticket: int) -> bool:
        ev = self._slots[ticket % len(self._slots)]["event"]
        return ev is None or bool(ev.done)

    def collect(self, ticket: int) -> list[memoryview]:
        cp, _ = _imports()
        slot_no = self._schedule.collect(ticket)
        s = self._slots[slot_no]
        stream, frames = s["stream"], s["frames"]
        rt = cp.cuda.runtime
        s["event"].synchronize()
        # first touch of the outputs: Array.buffer_size is the compressed byte count and the CUDA
        # array interface gives the device pointer (nvcomp_basic.ipynb prints both)
        sizes = [int(f.buffer_size) for f in frames]
        ptrs = [int(f.__cuda_array_interface__["data"][0]) for f in frames]
        offsets, total = pack_offsets([n + CRC_SIZE for n in sizes])  # room for each frame's CRC-32C
        base = s["packed"].data.ptr
        for ptr, off, n in zip(ptrs, offsets, sizes, strict=True):
            if n:
                rt.memcpyAsync(base + off, ptr, n, rt.memcpyDeviceToDevice, stream.ptr)
        host = self._free_out.pop() if self._free_out else _pinned_empty(cp, self._out_cap, np.uint8)
        rt.memcpyAsync(host.ctypes.data, base, total, rt.memcpyDeviceToHost, stream.ptr)
        stream.synchronize()
        s["frames"] = s["slab"] = None  # copies done: nvCOMP may free its outputs now
        self._lent[ticket] = host
        return finish_payloads(host, offsets, sizes, self._tile_nbytes, self.checksum)

    def release(self, ticket) -> None:
        host = self._lent.pop(ticket, None)
        if host is not None:
            self._free_out.append(host)

    def close(self) -> None:
        # wait for the streams, then drop nvCOMP outputs and codecs before the streams they
        # were bound to (a dict would free "stream" first: its insertion order)
        for s in self._slots:
            s["stream"].synchronize()
            s["frames"] = s["slab"] = s["event"] = None
            s["codec"] = None
        self._slots = []
        self._schedule = SlotSchedule(2)
        self._host_slabs = []
        self._free_out = []
        self._lent = {}


def finish_payloads(host: np.ndarray, offsets: Sequence[int], sizes: Sequence[int], tile_nbytes: int,
                    checksum: bool) -> list:
    """The chunk payloads of frames packed in ``host`` at ``offsets`` (``sizes`` bytes each, then
    ``CRC_SIZE`` free bytes): content size added where missing, then each frame's CRC-32C appended.

    Runs on the host after the D2H copy; pure, so the CPU tests check it on frames of any shape.
    """
    mv = memoryview(host).cast("B")
    views: list = [mv[o:o + n] for o, n in zip(offsets, sizes, strict=True)]
    if views and content_size(views[0]) is None:
        # nvCOMP's RAW zstd frames may leave the decompressed size out of the header (its docs
        # do not say): add it, as the cpu backend's frames carry it, so readers that size
        # their output from the header (older numcodecs, numcodecs.js, neuroglancer) work
        views = [with_content_size(v, tile_nbytes) for v in views]
    if not checksum:
        return views
    out = []
    for v, o, n in zip(views, offsets, sizes, strict=True):
        if isinstance(v, memoryview):  # still in the arena: the CRC goes into the free bytes after it
            host[o + n:o + n + CRC_SIZE] = np.frombuffer(crc32c.extend(0, v).to_bytes(CRC_SIZE, "little"), np.uint8)
            out.append(mv[o:o + n + CRC_SIZE])
        else:  # a rewritten header made a new bytes object
            out.append(v + chunk_crc(v))
    return out


def _pinned_empty(cp, n: int, dtype) -> np.ndarray:
    """A numpy array over page-locked host memory (fast, truly async H2D/D2H copies).

    ``np.frombuffer`` over ``cupy.cuda.alloc_pinned_memory`` is CuPy's documented
    pattern (docs.cupy.dev, "cupy.cuda.alloc_pinned_memory"); the array keeps the
    PinnedMemoryPointer alive.
    """
    dtype = np.dtype(dtype)
    mem = cp.cuda.alloc_pinned_memory(max(1, n) * dtype.itemsize)
    return np.frombuffer(mem, dtype=dtype, count=n)
