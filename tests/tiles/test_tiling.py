"""Tiling math (formats/tiling.py) against a plain numpy reference."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from warpdata.core.errors import ConfigError, DataError
from warpdata.formats.tiling import (
    MAX_DIMS,
    SlabPlan,
    TileGeometry,
    gather_tile,
    grid_indices,
    lift_transpose,
    normalize_dtype,
    source_index_map,
    tile_counts,
    tiled_shape,
    untile,
)

DTYPES = ["uint8", "uint16", "uint32", "float32", "float64"]


def reference(a: np.ndarray, tile, fill) -> np.ndarray:
    """The formula of docs/formats/zarr-tiles.md verbatim: pad, lift to (t0,n0,t1,n1,…), transpose to (t…, n…)."""
    counts = tile_counts(a.shape, tile)
    padded = np.pad(a, [(0, c * n - s) for s, c, n in zip(a.shape, counts, tile, strict=True)],
                    constant_values=fill)
    D = a.ndim
    lifted = padded.reshape([x for c, n in zip(counts, tile, strict=True) for x in (c, n)])
    return lifted.transpose(list(range(0, 2 * D, 2)) + list(range(1, 2 * D, 2)))


@st.composite
def arrays_and_tiles(draw, max_dims=4, max_size=9):
    d = draw(st.integers(1, max_dims))
    shape = tuple(draw(st.lists(st.integers(0, max_size), min_size=d, max_size=d)))
    tile = tuple(draw(st.lists(st.integers(1, 6), min_size=d, max_size=d)))
    dtype = draw(st.sampled_from(DTYPES))
    seed = draw(st.integers(0, 2**32 - 1))
    a = (np.random.default_rng(seed).random(shape) * 250).astype(dtype)
    fill = draw(st.sampled_from([0, 7]))
    return a, tile, fill


@given(arrays_and_tiles())
def test_lift_transpose_matches_reference(case):
    a, tile, fill = case
    got = lift_transpose(a, tile, fill)
    assert got.shape == tiled_shape(a.shape, tile)
    np.testing.assert_array_equal(got, reference(a, tile, fill))
    if a.size:
        np.testing.assert_array_equal(untile(got, a.shape), a)


@given(arrays_and_tiles(max_dims=3, max_size=7))
def test_source_index_map_is_the_same_gather(case):
    a, tile, fill = case
    idx = source_index_map(a.shape, tile)
    expect = lift_transpose(a, tile, fill).reshape(-1)
    flat = a.reshape(-1)
    got = np.where(idx >= 0, flat[np.maximum(idx, 0)] if flat.size else fill, a.dtype.type(fill))
    np.testing.assert_array_equal(got, expect)


@given(arrays_and_tiles(max_dims=3))
def test_gather_tile_equals_tiled_rows(case):
    a, tile, fill = case
    tiled = lift_transpose(a, tile, fill).reshape(-1, int(np.prod(tile)))
    buf = np.empty(tile, dtype=a.dtype)
    for i, idx in enumerate(grid_indices(tile_counts(a.shape, tile))):
        if a.size == 0:
            break
        gather_tile(a, tuple(idx), tile, fill, buf)
        np.testing.assert_array_equal(buf.reshape(-1), tiled[i])


def test_non_contiguous_input_and_reused_output():
    base = np.arange(10 * 12 * 14, dtype=np.uint16).reshape(10, 12, 14)
    a = base[::2, 1:, ::3]
    out = np.full(tiled_shape(a.shape, (2, 5, 3)), 99, dtype=np.uint16)
    res = lift_transpose(a, (2, 5, 3), 0, out=out)
    assert res is out
    np.testing.assert_array_equal(out, reference(a, (2, 5, 3), 0))


def test_nan_fill_for_floats():
    a = np.ones((3, 3), np.float32)
    t = lift_transpose(a, (2, 2), np.nan)
    assert np.isnan(t[1, 1, 1, 1]) and t[0, 0, 0, 0] == 1.0


def test_sixty_four_dimensions_with_elision():
    shape = (3,) * 12 + (1,) * 52
    a = np.random.default_rng(0).integers(0, 200, shape).astype(np.uint8)
    geo = TileGeometry.create(shape, (2,) * 64, "u8")
    assert geo.tile == (2,) * 12 + (1,) * 52  # size-1 dimensions get tile 1
    assert geo.elided().shape == (3,) * 12
    full = lift_transpose(a, geo.tile, 5)  # 128 lifted axes: planned on strides
    assert full.shape == tiled_shape(shape, geo.tile) == (2**12, 2**12)
    small = lift_transpose(a.reshape((3,) * 12), (2,) * 12, 5)
    np.testing.assert_array_equal(full.reshape(-1), small.reshape(-1))


def test_all_size_one_dims_keep_one():
    geo = TileGeometry.create((1, 1, 1), (4, 4, 4), "f64")
    assert geo.kept == (2,) and geo.elided().shape == (1,)
    assert geo.expand_index((0,)) == (0, 0, 0)


@pytest.mark.parametrize(("shape", "tile", "match"), [
    ((), (), "0-dimensional"),
    ((2,) * (MAX_DIMS + 1), (1,) * (MAX_DIMS + 1), "exceed the limit"),
    ((4, 4), (2,), "has 1 dimensions"),
    ((4, 4), (2, 0), "must be an integer >= 1"),
    ((4, -1), (2, 2), "invalid size"),
])
def test_invalid_geometry(shape, tile, match):
    with pytest.raises(ConfigError, match=match):
        TileGeometry.create(shape, tile, "u16")


@pytest.mark.parametrize("name", ["u8", "uint16", "<u4", "f32", "float64", np.uint16, np.dtype("<f4")])
def test_dtype_spellings(name):
    assert normalize_dtype(name).name in DTYPES


@pytest.mark.parametrize("name", ["int16", "complex64", "f16", "bool"])
def test_unsupported_dtypes(name):
    with pytest.raises(ConfigError, match="unsupported dtype"):
        normalize_dtype(name)


def test_big_endian_is_rejected_with_a_hint():
    with pytest.raises(DataError) as e:
        normalize_dtype(np.dtype(">u2"))
    assert "astype" in e.value.hint


def test_slab_plan_rows_and_tiles():
    geo = TileGeometry.create((10, 7, 9), (4, 3, 5), "u16")
    plan = SlabPlan(geo.elided(), 0)
    assert plan.slab_shape == (4, 7, 9)
    assert plan.n_slabs == 3 and [plan.rows(i) for i in range(3)] == [4, 4, 2]
    assert plan.tiles_per_slab == 3 * 2 and plan.slab_counts == (1, 3, 2)
    assert plan.row_nbytes == 7 * 9 * 2
