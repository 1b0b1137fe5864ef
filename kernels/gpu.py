"""GPU tile backend: CuPy lift/transpose kernel + nvCOMP batched zstd (RAW frames).

Per slab (seed 003, "Streaming Architecture"):

1. the caller fills a **pinned** host slab buffer (two of them: double
   buffering, one per CUDA stream);
2. ``submit`` enqueues on that slot's stream: async H2D copy into a device
   staging buffer, the lift/transpose kernel (one thread per output element:
   the gather formula of :func:`warpdata.formats.tiling.source_index_map`,
   edge padding with the fill value) into a device tile buffer, then nvCOMP
   batched zstd over the tiles (batches bounded by :func:`plan_batches`) with
   ``BitstreamKind.RAW`` — plain zstd frames that any zstd decoder (and so
   zarr-python / tensorstore) reads; the default NVCOMP_NATIVE kind adds an
   nvCOMP header and is not zstd;
3. the compressed tiles are packed on the device into one buffer and copied
   D2H asynchronously into a pinned output buffer;
4. ``collect`` waits for that slot's stream and slices the frames out.

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
from warpdata.formats.tiling import SlabPlan

from . import TileBackend

_UINT_FOR_SIZE = {1: ("unsigned char", np.uint8), 2: ("unsigned short", np.uint16),
                  4: ("unsigned int", np.uint32), 8: ("unsigned long long", np.uint64)}

# One thread per output element, grid-stride loop. Elements are moved as
# unsigned integers of the same width (floats keep their exact bits).
KERNEL_SOURCE = r"""
extern "C" __global__ void warp_lift_transpose(
    const ELEM* __restrict__ src, ELEM* __restrict__ dst,
    const long long* __restrict__ shape, const long long* __restrict__ tile,
    const long long* __restrict__ counts, const int ndim,
    const long long rows, const long long tile_elems, const long long total, const ELEM fill)
{
    for (long long o = (long long)blockIdx.x * blockDim.x + threadIdx.x; o < total;
         o += (long long)blockDim.x * gridDim.x) {
        long long tnum = o / tile_elems;
        long long toff = o - tnum * tile_elems;
        long long s = 0, stride = 1;
        bool ok = true;
        for (int d = ndim - 1; d >= 0; --d) {
            long long ti = tnum % counts[d]; tnum /= counts[d];
            long long ni = toff % tile[d];   toff /= tile[d];
            long long c = ti * tile[d] + ni;
            long long lim = (d == 0) ? rows : shape[d];
            ok = ok && (c < lim);
            s += c * stride;
            stride *= shape[d];
        }
        dst[o] = ok ? src[s] : fill;
    }
}
"""


@dataclass(frozen=True)
class KernelParams:
    """The integers the kernel receives for one slab geometry."""

    shape: tuple[int, ...]  # slab shape: (tile rows, s_1, …)
    tile: tuple[int, ...]
    counts: tuple[int, ...]  # (1, t_1, …)
    tile_elems: int
    total: int  # output elements = tiles_per_slab * tile_elems

    @classmethod
    def from_plan(cls, plan: SlabPlan) -> KernelParams:
        tile = plan.geometry.tile
        counts = plan.slab_counts
        te = math.prod(tile)
        return cls(plan.slab_shape, tile, counts, te, math.prod(counts) * te)


def kernel_gather(params: KernelParams, rows: int) -> np.ndarray:
    """What the kernel computes, in numpy: source index per output element (−1 = fill).

    Mirrors ``KERNEL_SOURCE`` step by step (same loop order, same integer
    ops) so the CPU tests pin down the index math the GPU runs.
    """
    o = np.arange(params.total, dtype=np.int64)
    tnum = o // params.tile_elems
    toff = o - tnum * params.tile_elems
    s = np.zeros_like(o)
    ok = np.ones(o.shape, dtype=bool)
    stride = 1
    for d in range(len(params.shape) - 1, -1, -1):
        ti = tnum % params.counts[d]
        tnum = tnum // params.counts[d]
        ni = toff % params.tile[d]
        toff = toff // params.tile[d]
        c = ti * params.tile[d] + ni
        lim = rows if d == 0 else params.shape[d]
        ok &= c < lim
        s += c * stride
        stride *= params.shape[d]
    return np.where(ok, s, -1)


def emulate_kernel(slab: np.ndarray, params: KernelParams, rows: int, fill) -> np.ndarray:
    """The kernel's output for ``slab`` computed on the CPU: (tiles, tile_elems)."""
    idx = kernel_gather(params, rows)
    flat = slab.reshape(-1)
    out = np.where(idx >= 0, flat[np.maximum(idx, 0)], slab.dtype.type(fill))
    return out.reshape(-1, params.tile_elems)


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

    def __init__(self, *, level: int = 1, threads: int | None = None) -> None:
        super().__init__(level=level, threads=threads)
        self.plan: SlabPlan | None = None
        self._slots: list[dict] = []
        self._schedule = SlotSchedule(2)
        self._host_slabs: list[np.ndarray] = []

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
        try:
            nvcomp.Codec(algorithm="Zstd", bitstream_kind=nvcomp.BitstreamKind.RAW)
        except Exception as e:
            return f"nvCOMP zstd codec unavailable: {e}"
        return None

    def prepare(self, plan: SlabPlan) -> None:
        cp, nvcomp = _imports()
        self.plan = plan
        self.params = KernelParams.from_plan(plan)
        g = plan.geometry
        ctype, utype = _UINT_FOR_SIZE[g.dtype.itemsize]
        self._utype = utype
        self._kernel = cp.RawKernel(KERNEL_SOURCE.replace("ELEM", ctype), "warp_lift_transpose")
        self._fill_bits = np.array(plan.fill, dtype=g.dtype).view(utype)[()]
        self._shape_d = cp.asarray(np.array(self.params.shape, dtype=np.int64))
        self._tile_d = cp.asarray(np.array(self.params.tile, dtype=np.int64))
        self._counts_d = cp.asarray(np.array(self.params.counts, dtype=np.int64))
        n_tiles, tile_nbytes = plan.tiles_per_slab, g.tile_nbytes
        self._batches = plan_batches(n_tiles, tile_nbytes, self.MAX_BATCH_BYTES)
        bound = max_compressed_size(tile_nbytes)
        _, out_cap = pack_offsets([bound] * n_tiles)
        self._slots = []
        for _ in range(2):
            stream = cp.cuda.Stream(non_blocking=True)
            self._slots.append({
                "stream": stream,
                "stage": cp.empty(self.params.shape, dtype=utype),
                "tiles": cp.empty((n_tiles, self.params.tile_elems), dtype=utype),
                "packed": cp.empty(out_cap, dtype=np.uint8),
                "host_out": _pinned_empty(cp, out_cap, np.uint8),
                "codec": nvcomp.Codec(algorithm="Zstd", bitstream_kind=nvcomp.BitstreamKind.RAW,
                                      cuda_stream=stream.ptr),
                "event": None, "sizes": None, "offsets": None,
            })

    def alloc_slab(self) -> np.ndarray:
        cp, _ = _imports()
        buf = _pinned_empty(cp, math.prod(self.plan.slab_shape), self.plan.geometry.dtype)
        self._host_slabs.append(buf)
        return buf.reshape(self.plan.slab_shape)

    def submit(self, slab: np.ndarray, rows: int) -> int:
        cp, nvcomp = _imports()
        k, slot_no = self._schedule.submit()
        s = self._slots[slot_no]
        p = self.params
        with s["stream"]:
            s["stage"].set(slab.view(self._utype), stream=s["stream"])  # async from pinned memory
            threads = 256
            blocks = min(max(1, -(-p.total // threads)), 65535 * 8)
            self._kernel((blocks,), (threads,), (
                s["stage"], s["tiles"], self._shape_d, self._tile_d, self._counts_d, np.int32(len(p.shape)),
                np.int64(rows), np.int64(p.tile_elems), np.int64(p.total), self._utype(self._fill_bits)))
            frames = []
            tiles_u8 = s["tiles"].view(np.uint8).reshape(len(s["tiles"]), -1)
            for a, b in self._batches:
                batch = nvcomp.as_arrays([tiles_u8[i] for i in range(a, b)], cuda_stream=s["stream"].ptr)
                frames.extend(s["codec"].encode(batch))
            dev = [cp.asarray(f).view(np.uint8).reshape(-1) for f in frames]
            sizes = [int(d.size) for d in dev]
            offsets, total = pack_offsets(sizes)
            for d, off in zip(dev, offsets, strict=True):
                s["packed"][off:off + d.size] = d
            s["packed"][:total].get(out=s["host_out"][:total], stream=s["stream"], blocking=False)
            s["event"] = s["stream"].record()
        s["sizes"], s["offsets"] = sizes, offsets
        return k

    def ready(self, ticket: int) -> bool:
        return bool(self._slots[ticket % len(self._slots)]["event"].done)

    def collect(self, ticket: int) -> list[bytes]:
        slot_no = self._schedule.collect(ticket)
        s = self._slots[slot_no]
        s["event"].synchronize()
        host = s["host_out"]
        return [host[o:o + n].tobytes() for o, n in zip(s["offsets"], s["sizes"], strict=True)]

    def close(self) -> None:
        self._slots = []
        self._host_slabs = []


def _pinned_empty(cp, n: int, dtype) -> np.ndarray:
    """A numpy array over page-locked host memory (fast, truly async H2D/D2H copies)."""
    dtype = np.dtype(dtype)
    mem = cp.cuda.alloc_pinned_memory(n * dtype.itemsize)
    return np.frombuffer(mem, dtype=dtype, count=n)
