"""Parquet bytes handed to Arrow in Arrow's own memory.

``pq.read_table(pa.BufferReader(data))`` over Python ``bytes`` wraps them in a buffer that
holds a Python reference. Arrow reads a Parquet file with futures on its thread pools, and the
callbacks of the last of them drop their references to the file reader, and through it to
that buffer, on a pool thread, just *after* ``read_table`` has returned. When that drop is the
last one, the pool thread must take the GIL to free the ``bytes``; if the interpreter is
finalizing by then (a command that ends right after the read, on a loaded machine), Python
ends the thread inside a C++ destructor and the process aborts with "terminate called without
an active exception" (exit 134) after printing the right output. It was caught in a core dump
of ``warp diff --rows``: 1 run in ~70 with three running at once on two cores.

:func:`arrow_reader` copies the bytes into a buffer Arrow allocated (no Python object behind
it), so whichever thread frees it never needs the GIL. Meant for side tables and manifests'
blobs (kilobytes to a few MB), read once and dropped.
"""

from __future__ import annotations

from typing import Any


def arrow_buffer(data: bytes | bytearray | memoryview) -> Any:
    """A ``pyarrow.Buffer`` in memory Arrow allocated, holding a copy of ``data``."""
    import pyarrow as pa

    view = memoryview(data).cast("B")
    buf = pa.allocate_buffer(view.nbytes)
    if view.nbytes:
        memoryview(buf).cast("B")[:] = view
    return buf


def arrow_reader(data: bytes | bytearray | memoryview) -> Any:
    """A ``pyarrow.BufferReader`` over :func:`arrow_buffer` of ``data``: pass it to
    ``pq.read_table`` / ``pq.ParquetFile`` where ``pa.BufferReader(data)`` would go."""
    import pyarrow as pa

    return pa.BufferReader(arrow_buffer(data))
