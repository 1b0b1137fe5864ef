"""2× downsampling for multiscale pyramids, streamed along dimension 0.

Each level halves every downsampled dimension (``ceil(s/2)``) by reducing
2×…×2 windows. Methods:

* ``median`` (default): the lower median (the ``(W-1)//2``-th order
  statistic of the ``W`` window values) — an exact value of the input, so
  integer data stays integer and no new intensities appear (the
  "median (order statistic) filtering");
* ``mean``: arithmetic mean, rounded to nearest for integer dtypes;
* ``nearest``: the window's first element (plain 2× subsampling).

Odd sizes: the last window of a dimension replicates its edge, which leaves
the median and mean of the real values unchanged. :class:`Downsampler`
takes row blocks of any height and carries an odd row over to the next
block, so the result does not depend on how the input was split.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from warpdata.core.errors import ConfigError

METHODS = ("median", "mean", "nearest")
MAX_PYRAMID_DIMS = 16


def downsampled_shape(shape: Sequence[int], factors: Sequence[int]) -> tuple[int, ...]:
    return tuple(-(-s // f) for s, f in zip(shape, factors, strict=True))


def reduce_block(block: np.ndarray, factors: Sequence[int], method: str) -> np.ndarray:
    """Downsample a whole block (every dimension complete) by ``factors`` (1 or 2 each)."""
    if method not in METHODS:
        raise ConfigError(f"unknown downsampling method {method!r}", hint="use one of: " + ", ".join(METHODS))
    if block.ndim > MAX_PYRAMID_DIMS:
        raise ConfigError(f"multiscale output supports at most {MAX_PYRAMID_DIMS} dimensions of size > 1",
                          hint="set [multiscale] levels = 1")
    factors = tuple(int(f) for f in factors)
    if method == "nearest":
        return np.ascontiguousarray(block[tuple(slice(None, None, f) for f in factors)])
    pad = [(0, (f - s % f) % f) for s, f in zip(block.shape, factors, strict=True)]
    if any(p for _, p in pad):
        block = np.pad(block, pad, mode="edge")
    out_shape = [s // f for s, f in zip(block.shape, factors, strict=True)]
    split = [x for n, f in zip(out_shape, factors, strict=True) for x in (n, f)]
    D = block.ndim
    perm = list(range(0, 2 * D, 2)) + list(range(1, 2 * D, 2))
    W = int(np.prod(factors))
    win = block.reshape(split).transpose(perm).reshape(out_shape + [W])
    if method == "median":
        k = (W - 1) // 2
        return np.ascontiguousarray(np.partition(win, k, axis=-1)[..., k])
    mean = win.mean(axis=-1, dtype=np.float64)
    if block.dtype.kind in "ui":
        info = np.iinfo(block.dtype)
        return np.clip(np.rint(mean), info.min, info.max).astype(block.dtype)
    return mean.astype(block.dtype)


class Downsampler:
    """Streams row blocks (along dimension 0) through :func:`reduce_block`."""

    def __init__(self, row_shape: Sequence[int], dtype, factors: Sequence[int], method: str = "median") -> None:
        if method not in METHODS:
            raise ConfigError(f"unknown downsampling method {method!r}", hint="use one of: " + ", ".join(METHODS))
        self.row_shape = tuple(row_shape)
        self.dtype = np.dtype(dtype)
        self.factors = tuple(factors)
        self.method = method
        self._carry: np.ndarray | None = None

    def push(self, rows: np.ndarray) -> np.ndarray | None:
        """Downsampled rows for ``rows`` (plus any carried row); None when nothing completes."""
        f0 = self.factors[0]
        if self._carry is not None:
            rows = np.concatenate([self._carry, rows], axis=0)
            self._carry = None
        usable = rows.shape[0] - rows.shape[0] % f0
        if usable < rows.shape[0]:
            self._carry = rows[usable:].copy()
        if usable == 0:
            return None
        return reduce_block(rows[:usable], self.factors, self.method)

    def finish(self) -> np.ndarray | None:
        """The last downsampled row when an odd row was left over (edge-replicated)."""
        if self._carry is None:
            return None
        rows, self._carry = self._carry, None
        return reduce_block(rows, self.factors, self.method)
