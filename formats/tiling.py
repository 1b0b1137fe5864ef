"""Tiling math for N-D arrays: the lift → transpose → per-tile layout.

Contract (docs/formats/zarr-tiles.md; numpy C order, dimension 0 is
the slowest):

* an array of shape ``(s_0, …, s_{D-1})`` (``D ≤ 64``) is cut into tiles of
  shape ``(n_0, …, n_{D-1})``; ``t_d = ceil(s_d / n_d)`` tiles per dimension,
  ``T = ∏ t_d`` tiles in all;
* **lift** views it as ``(t_0, n_0, …, t_{D-1}, n_{D-1})``, **transpose**
  reorders to ``(t_0, …, t_{D-1}, n_0, …, n_{D-1})``: tile ``(i_0…i_{D-1})``
  is then one contiguous run of ``∏ n_d`` elements, C order inside the tile —
  exactly the Zarr v3 ``bytes`` encoding of that chunk;
* edge tiles are padded to the full tile shape with the fill value (Zarr's
  rule for edge chunks);
* dimensions of size ≤ 1 are elided internally (their tile size is 1 and they
  change no byte of the layout), so up to 64 dimensions work even though a
  lift would double the axis count past numpy's limit: copies are planned on
  strides, dropping unit axes and merging axes that stay contiguous.

Supported dtypes: u8, u16, u32, f32, f64, little-endian. Everything here is a
pure function of shapes (plus numpy copies); no I/O, no threads.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import product
from typing import Any

import numpy as np
from warpdata.core.errors import ConfigError, DataError

MAX_DIMS = 64

#: accepted dtype spellings → canonical Zarr v3 data_type name
DTYPE_NAMES: dict[str, str] = {
    "u8": "uint8", "uint8": "uint8", "|u1": "uint8", "u1": "uint8",
    "u16": "uint16", "uint16": "uint16", "<u2": "uint16", "u2": "uint16",
    "u32": "uint32", "uint32": "uint32", "<u4": "uint32", "u4": "uint32",
    "f32": "float32", "float32": "float32", "<f4": "float32", "f4": "float32",
    "f64": "float64", "float64": "float64", "<f8": "float64", "f8": "float64",
}
SUPPORTED_DTYPES = ("uint8", "uint16", "uint32", "float32", "float64")


def normalize_dtype(dtype: str | np.dtype | type) -> np.dtype:
    """The little-endian numpy dtype for a supported spelling (ConfigError otherwise)."""
    if isinstance(dtype, str):
        name = DTYPE_NAMES.get(dtype.strip().lower())
    else:
        try:
            dt = np.dtype(dtype)
        except TypeError:
            name = None
        else:
            name = dt.name if dt.name in SUPPORTED_DTYPES and dt.byteorder in ("=", "<", "|") else None
            if dt.name in SUPPORTED_DTYPES and dt.byteorder == ">":
                raise DataError(f"big-endian {dt.str} arrays are not supported",
                                hint="convert with arr.astype(arr.dtype.newbyteorder('<'))")
    if name is None:
        raise ConfigError(f"unsupported dtype {dtype!r}",
                          hint="use one of: u8, u16, u32, f32, f64 (or uint8, uint16, uint32, float32, float64)")
    return np.dtype(name).newbyteorder("<")


def tile_counts(shape: Sequence[int], tile: Sequence[int]) -> tuple[int, ...]:
    """``t_d = ceil(s_d / n_d)`` per dimension."""
    return tuple(-(-s // n) for s, n in zip(shape, tile, strict=True))


def check_geometry(shape: Sequence[int], tile: Sequence[int], what: str = "tile") -> None:
    """Raise ConfigError unless ``shape`` and ``tile`` describe a valid tiling."""
    if len(shape) == 0:
        raise ConfigError("a 0-dimensional array cannot be tiled", hint="give the array at least one dimension")
    if len(shape) > MAX_DIMS:
        raise ConfigError(f"{len(shape)} dimensions exceed the limit of {MAX_DIMS}",
                          hint="merge dimensions before tiling")
    if len(tile) != len(shape):
        raise ConfigError(f"{what} shape {list(tile)} has {len(tile)} dimensions but the array has {len(shape)} "
                          f"(shape {list(shape)})", hint=f"give one {what} size per array dimension")
    for d, (s, n) in enumerate(zip(shape, tile, strict=True)):
        if not isinstance(s, (int, np.integer)) or s < 0:
            raise ConfigError(f"array dimension {d} has invalid size {s!r}", hint="sizes are integers >= 0")
        if not isinstance(n, (int, np.integer)) or n < 1:
            raise ConfigError(f"{what} size {n!r} for dimension {d} must be an integer >= 1",
                              hint=f"set every {what} size to a positive integer")


@dataclass(frozen=True)
class TileGeometry:
    """An array shape and its tile shape (already validated and normalized).

    ``shape``/``tile`` are the user's dimensions (tile sizes of size-≤1
    dimensions forced to 1); ``kept`` lists the dimensions of size > 1 that
    the elided geometry (:meth:`elided`) works on.
    """

    shape: tuple[int, ...]
    tile: tuple[int, ...]
    dtype: np.dtype

    @classmethod
    def create(cls, shape: Sequence[int], tile: Sequence[int], dtype) -> TileGeometry:
        shape = tuple(int(s) for s in shape)
        tile = tuple(int(n) for n in tile)
        check_geometry(shape, tile)
        tile = tuple(1 if s <= 1 else n for s, n in zip(shape, tile, strict=True))
        return cls(shape, tile, normalize_dtype(dtype))

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def counts(self) -> tuple[int, ...]:
        return tile_counts(self.shape, self.tile)

    @property
    def n_tiles(self) -> int:
        return math.prod(self.counts)

    @property
    def tile_elements(self) -> int:
        return math.prod(self.tile)

    @property
    def tile_nbytes(self) -> int:
        return self.tile_elements * self.dtype.itemsize

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize

    @property
    def kept(self) -> tuple[int, ...]:
        """Dimensions of size > 1; at least one dimension is kept."""
        k = tuple(d for d, s in enumerate(self.shape) if s > 1)
        if k:
            return k
        return (self.ndim - 1,)

    def elided(self) -> TileGeometry:
        """The same tiling with size-≤1 dimensions dropped (byte-identical tiles)."""
        k = self.kept
        return TileGeometry(tuple(self.shape[d] for d in k), tuple(self.tile[d] for d in k), self.dtype)

    def expand_index(self, elided_index: Sequence[int]) -> tuple[int, ...]:
        """Map a tile-grid index of :meth:`elided` back to all dimensions (0 where elided)."""
        full = [0] * self.ndim
        for d, i in zip(self.kept, elided_index, strict=True):
            full[d] = int(i)
        return tuple(full)


# -- strided copy planning ---------------------------------------------------

def _simplify(shape: list[int], *stride_lists: list[int]) -> tuple[list[int], list[list[int]]]:
    """Drop unit axes and merge neighbours that are contiguous in every operand.

    Axes ``i, i+1`` merge when for every operand ``stride[i] ==
    stride[i+1] * shape[i+1]``; the result describes the same elements in
    the same order with (usually far) fewer axes.
    """
    keep = [i for i, n in enumerate(shape) if n != 1]
    shape = [shape[i] for i in keep]
    strides = [[s[i] for i in keep] for s in stride_lists]
    if not shape:
        return [1], [[0] for _ in stride_lists]
    out_shape = [shape[-1]]
    out_strides = [[s[-1]] for s in strides]
    for i in range(len(shape) - 2, -1, -1):
        if all(s[i] == o[0] * out_shape[0] for s, o in zip(strides, out_strides, strict=True)):
            out_shape[0] *= shape[i]
        else:
            out_shape.insert(0, shape[i])
            for s, o in zip(strides, out_strides, strict=True):
                o.insert(0, s[i])
    return out_shape, out_strides


def _view(base: np.ndarray, offset: int, shape: list[int], strides: list[int]) -> np.ndarray:
    """A strided view of C-contiguous ``base`` starting ``offset`` bytes into it."""
    if len(shape) > MAX_DIMS:
        raise DataError(f"tiling plan needs {len(shape)} axes after simplification (limit {MAX_DIMS})",
                        hint="use larger tiles or fewer dimensions")
    flat = base.reshape(-1)
    return np.lib.stride_tricks.as_strided(flat[offset // base.itemsize:], shape=shape, strides=strides)


def lift_transpose(a: np.ndarray, tile: Sequence[int], fill=0, out: np.ndarray | None = None) -> np.ndarray:
    """Return the tiled layout of ``a`` (shape :func:`tiled_shape`), padding = ``fill``.

    ``out`` (any C-contiguous buffer of that size and dtype) is reused when
    given: no allocation on the hot path. ``out.reshape(T, -1)[i]`` is tile ``i`` (C
    order over the tile grid), ready to compress.
    """
    shape = tuple(a.shape)
    tile = tuple(int(n) for n in tile)
    check_geometry(shape, tile)
    counts = tile_counts(shape, tile)
    D = len(shape)
    want = tiled_shape(shape, tile)
    if out is None:
        out = np.empty(want, dtype=a.dtype)
    elif out.size != math.prod(counts) * math.prod(tile) or out.dtype != a.dtype or not out.flags.c_contiguous:
        raise DataError(f"output buffer has shape {out.shape} {out.dtype}, expected {want} {a.dtype}",
                        hint="allocate it with np.empty(tiled_shape(shape, tile), dtype)")
    if a.size == 0:
        return out
    item = a.itemsize
    # byte strides of out's (t..., n...) axes
    o_str = [0] * (2 * D)
    acc = item
    for ax in range(2 * D - 1, -1, -1):
        o_str[ax] = acc
        acc *= (counts + tile)[ax]
    full = [s // n for s, n in zip(shape, tile, strict=True)]
    rem = [s % n for s, n in zip(shape, tile, strict=True)]
    ragged = [d for d in range(D) if rem[d]]
    # padding first: for each ragged dim, its last tile's slots past the data
    for d in ragged:
        sh = list(counts) + list(tile)
        sh[d] = 1
        sh[D + d] = tile[d] - rem[d]
        off = full[d] * o_str[d] + rem[d] * o_str[D + d]
        s2, (st,) = _simplify(sh, o_str)
        _view(out, off, s2, st)[...] = fill
    # data: one copy per combination of (full tiles | last partial tile) per ragged dim
    for choice in product((False, True), repeat=len(ragged)):
        edge = dict(zip(ragged, choice, strict=True))
        sh, o_s, a_s = [], [], []
        o_off = 0
        starts = []
        for d in range(D):
            if edge.get(d):
                c, m, st = 1, rem[d], full[d] * tile[d]
                o_off += full[d] * o_str[d]
            else:
                c, m, st = full[d], tile[d], 0
            sh.append((c, m))
            starts.append(st)
        if any(c == 0 or m == 0 for c, m in sh):
            continue
        src = a[tuple(slice(s, None) for s in starts)]
        shape2 = [c for c, _ in sh] + [m for _, m in sh]
        o_s = list(o_str)
        a_s = [src.strides[d] * tile[d] for d in range(D)] + [src.strides[d] for d in range(D)]
        s2, (os2, as2) = _simplify(shape2, o_s, a_s)
        dst = _view(out, o_off, s2, os2)
        srcv = np.lib.stride_tricks.as_strided(src, shape=s2, strides=as2)
        np.copyto(dst, srcv)
    return out


def tiled_shape(shape: Sequence[int], tile: Sequence[int]) -> tuple[int, ...]:
    """``counts + tile``, or ``(T, ∏ tile)`` when that would exceed numpy's 64 axes."""
    counts = tile_counts(shape, tile)
    if 2 * len(shape) > MAX_DIMS:
        return (math.prod(counts), math.prod(tile))
    return counts + tuple(int(n) for n in tile)


def untile(tiled: np.ndarray, shape: Sequence[int]) -> np.ndarray:
    """Inverse of :func:`lift_transpose` (drops padding); for tests and readers."""
    D = len(shape)
    tile = tuple(tiled.shape[D:])
    counts = tuple(tiled.shape[:D])
    perm = [x for d in range(D) for x in (d, D + d)]
    full = tiled.transpose(perm).reshape([c * n for c, n in zip(counts, tile, strict=True)])
    return full[tuple(slice(0, s) for s in shape)]


def tile_box(index: Sequence[int], shape: Sequence[int], tile: Sequence[int]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(start, stop) of tile ``index`` in the array, clipped to the array."""
    start = tuple(i * n for i, n in zip(index, tile, strict=True))
    stop = tuple(min(s0 + n, s) for s0, n, s in zip(start, tile, shape, strict=True))
    return start, stop


def gather_tile(a: np.ndarray, index: Sequence[int], tile: Sequence[int], fill, out: np.ndarray) -> np.ndarray:
    """Copy tile ``index`` of ``a`` into ``out`` (shape ``tile``), padding with ``fill``.

    The per-tile form of :func:`lift_transpose`: the CPU backend gathers each
    tile into a small reused buffer that stays in cache for the compressor.
    """
    start, stop = tile_box(index, a.shape, tile)
    ext = tuple(b - s for s, b in zip(start, stop, strict=True))
    src = a[tuple(slice(s, b) for s, b in zip(start, stop, strict=True))]
    if ext == tuple(tile):
        np.copyto(out, src)
    else:
        out[...] = fill
        out[tuple(slice(0, e) for e in ext)] = src
    return out


def grid_indices(counts: Sequence[int]) -> np.ndarray:
    """All tile-grid indices in C order, shape (T, D)."""
    return np.stack(np.unravel_index(np.arange(math.prod(counts)), tuple(counts)), axis=1) if counts else np.zeros((1, 0), int)


def source_index_map(shape: Sequence[int], tile: Sequence[int]) -> np.ndarray:
    """For every element of the tiled layout, its linear index in ``a`` (−1 = padding).

    This is the gather formula the GPU kernel evaluates per output element
    (``kernels/gpu.py``), written with the same integer steps so it can be
    tested on the CPU: split the output index into (tile number, offset in
    tile), unravel both C-order over ``counts`` and ``tile``, add, and bounds
    check against ``shape``.
    """
    counts = tile_counts(shape, tile)
    T, E = math.prod(counts), math.prod(tile)
    o = np.arange(T * E, dtype=np.int64)
    tnum, toff = o // E, o % E
    src = np.zeros_like(o)
    valid = np.ones(o.shape, bool)
    stride = 1
    for d in range(len(shape) - 1, -1, -1):
        ti = tnum % counts[d]
        tnum //= counts[d]
        ni = toff % tile[d]
        toff //= tile[d]
        coord = ti * tile[d] + ni
        valid &= coord < shape[d]
        src += coord * stride
        stride *= shape[d]
    return np.where(valid, src, -1)


@dataclass(frozen=True)
class SlabPlan:
    """How a streamed array is cut into slabs: one tile-height of dimension 0.

    Works on the elided geometry (size-1 dimensions dropped). Slab ``i``
    holds rows ``[i*n_0, min((i+1)*n_0, s_0))`` of dimension 0; its tiles are
    the grid row ``(i, *)``, ``tiles_per_slab`` of them in C order. A slab
    buffer always has the full ``slab_shape``; the last slab may fill fewer
    rows, and the missing rows are padding.
    """

    geometry: TileGeometry  # elided
    fill: Any = 0

    @property
    def slab_shape(self) -> tuple[int, ...]:
        g = self.geometry
        return (g.tile[0],) + g.shape[1:]

    @property
    def slab_nbytes(self) -> int:
        return math.prod(self.slab_shape) * self.geometry.dtype.itemsize

    @property
    def row_nbytes(self) -> int:
        return math.prod(self.geometry.shape[1:]) * self.geometry.dtype.itemsize

    @property
    def n_slabs(self) -> int:
        return self.geometry.counts[0]

    @property
    def slab_counts(self) -> tuple[int, ...]:
        return (1,) + self.geometry.counts[1:]

    @property
    def tiles_per_slab(self) -> int:
        return math.prod(self.geometry.counts[1:])

    def rows(self, slab: int) -> int:
        n0, s0 = self.geometry.tile[0], self.geometry.shape[0]
        return max(0, min(n0, s0 - slab * n0))
