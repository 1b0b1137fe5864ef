"""Bounded decompression: every zstd frame and LZ4 block warp decodes itself, decoded to the size
its container says and never more (docs/formats/tbl-v2.md, "Limits and checks";
docs/formats/zarr-tiles.md, "Limits").

The container always knows the decoded size: a TBL entry's uncompressed size, a Zarr chunk's
shape × itemsize. A frame is checked against it *before* anything is allocated:

* zstd: python-zstandard sizes its output from the frame header's ``Frame_Content_Size``
  and ignores ``max_output_size`` when the header has one, so a 131 KB frame declaring 4 GiB
  of zeros allocates 4 GiB whatever the caller asked for. :func:`zstd` reads the declared size
  first (``zstandard.frame_content_size``, the header only) and refuses a frame declaring any
  other size than the expected one; a frame declaring none is decoded into a buffer of exactly
  the expected size (``max_output_size``: more output is an error, not a reallocation).
* Neither codec can decode more than a fixed multiple of its input (zstd: blocks regenerate at
  most Block_Maximum_Size = 128 KiB each and take at least 4 bytes, an RLE block, so 32,768x,
  RFC 8878 §3.1.1.2; an LZ4 block: 255x): an expected size past that is a lying container (a
  Zarr chunk shape of 2 GiB over a 100-byte object), refused before the output buffer is
  allocated. (libzstd 1.5.7 decodes oversized RLE blocks in frames that declare their size,
  which no compressor writes; such a frame still never passes the declared-size check.)

:func:`zstd_pieces` decodes a frame a piece at a time for readers that only checksum the bytes
(``--verify``): its memory does not depend on the expected size at all.

Both raise a :class:`FrameSizeError` naming where the frame is, what it declares and what was
expected; a frame the codec cannot decode raises the caller's ``error`` class (default
:class:`FrameError`). Formats pass their own subclasses so their callers keep catching what they
did (``tbl.DecompressionError``).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

from warpdata.core.errors import DataError

# lazy third-party imports: zstandard and lz4 are imported inside the functions that use them, so a
# reader of uncompressed files never loads them

ZSTD_BLOCK_MAX = 128 * 1024  # Block_Maximum_Size: what one block regenerates at most (RFC 8878)
ZSTD_MAX_RATIO = ZSTD_BLOCK_MAX // 4  # the smallest block is 4 bytes (an RLE block: 3-byte header + 1 byte)
LZ4_MAX_RATIO = 255  # each 255-valued length byte adds 255 bytes of match: LZ4's limit
_HINT = "the file is damaged or was crafted: re-create it from its source"
_tls = threading.local()  # one ZstdDecompressor per thread (creating one per frame costs more than a small frame)


class FrameError(DataError):
    """A compressed payload the codec cannot decode."""

    code = "bad-frame"


class FrameSizeError(FrameError):
    """A compressed payload that declares, needs or produces another decoded size than its container says."""

    code = "frame-size"


def zstd_max_output(nbytes: int) -> int:
    """The most bytes a conforming zstd frame of ``nbytes`` bytes can decode to."""
    return (nbytes // 4) * ZSTD_BLOCK_MAX


def _check_zstd(payload: Any, expected: int, where: str, source: str, error: type[DataError],
                size_error: type[DataError], hint: str, details: dict) -> int:
    """The frame header's declared size (-1: none), after refusing a frame that cannot give ``expected``."""
    import zstandard  # lazy: see the module note

    n = len(payload) if isinstance(payload, (bytes, bytearray)) else memoryview(payload).nbytes
    try:
        declared = zstandard.frame_content_size(payload)
    except zstandard.ZstdError as e:
        raise error(f"{where}: zstd decompression failed (not a zstd frame header: {e})", hint=hint,
                    **details) from None
    if declared >= 0 and declared != expected:
        raise size_error(f"{where}: the zstd frame declares {declared:,} decoded bytes, {source} "
                         f"{expected:,}", hint=hint, declared=declared, expected=expected, **details)
    if expected > zstd_max_output(n):
        raise size_error(f"{where}: {source} {expected:,} decoded bytes from a {n:,}-byte zstd frame, more "
                         f"than a zstd frame that size can hold ({zstd_max_output(n):,}: 128 KiB per 4-byte block)",
                         hint=hint, expected=expected, stored=n, **details)
    return declared


def _dctx():
    import zstandard  # lazy: see the module note

    dctx = getattr(_tls, "zd", None)
    if dctx is None:
        dctx = _tls.zd = zstandard.ZstdDecompressor()
    return dctx


def zstd(payload: Any, expected: int, *, where: str, source: str = "the container expects",
         error: type[DataError] = FrameError, size_error: type[DataError] = FrameSizeError, hint: str = _HINT,
         **details: object) -> bytes:
    """Decode one zstd frame to exactly ``expected`` bytes, allocating no more than that.

    ``where`` starts every message ("FILE: sample 3 at offset 4096"), ``source`` says where
    ``expected`` comes from ("the index says"); ``details`` go into the error. Raises
    ``size_error`` when the frame declares another size, cannot reach ``expected`` or decodes to
    another size, ``error`` when it does not decode.
    """
    import zstandard  # lazy: see the module note

    declared = _check_zstd(payload, expected, where, source, error, size_error, hint, details)
    try:
        # with a declared size (= expected) the output buffer is exactly that size; without one,
        # max_output_size is the buffer and more output is an error ("did not decompress full frame")
        out = _dctx().decompress(payload, max_output_size=max(expected, 1))
    except zstandard.ZstdError as e:
        if declared < 0 and "did not decompress full frame" in str(e):  # the buffer filled up first
            raise size_error(f"{where}: the zstd frame (no declared size) decodes to more bytes than "
                             f"{source} ({expected:,})", hint=hint, expected=expected, **details) from None
        raise error(f"{where}: zstd decompression failed ({e})", hint=hint, **details) from None
    if len(out) != expected:
        raise size_error(f"{where}: the zstd frame decodes to {len(out):,} bytes, {source} {expected:,}",
                         hint=hint, expected=expected, got=len(out), **details)
    return out


def zstd_pieces(payload: Any, expected: int, *, where: str, source: str = "the container expects",
                error: type[DataError] = FrameError, size_error: type[DataError] = FrameSizeError,
                hint: str = _HINT, piece: int = 1 << 22, **details: object) -> Iterator[bytes]:
    """:func:`zstd` in pieces of at most ``piece`` bytes, for a reader that only needs to see the bytes
    (a checksum): memory stays at one piece plus the frame's window (at most 128 MiB, libzstd's
    default limit; a frame asking for more is an ``error``), whatever ``expected`` is."""
    import zstandard  # lazy: see the module note

    declared = _check_zstd(payload, expected, where, source, error, size_error, hint, details)
    total = 0
    try:
        with zstandard.ZstdDecompressor().stream_reader(payload) as r:
            while True:
                b = r.read(piece)
                if not b:
                    break
                total += len(b)
                if total > expected:
                    what = "(no declared size) " if declared < 0 else ""
                    raise size_error(f"{where}: the zstd frame {what}decodes to more bytes than {source} "
                                     f"({expected:,})", hint=hint, expected=expected, **details)
                yield b
    except zstandard.ZstdError as e:
        raise error(f"{where}: zstd decompression failed ({e})", hint=hint, **details) from None
    if total != expected:
        raise size_error(f"{where}: the zstd frame decodes to {total:,} bytes, {source} {expected:,}",
                         hint=hint, expected=expected, got=total, **details)


def lz4_block(payload: Any, expected: int, *, where: str, source: str = "the container expects",
              error: type[DataError] = FrameError, size_error: type[DataError] = FrameSizeError, hint: str = _HINT,
              **details: object) -> bytes:
    """Decode one LZ4 block (no size prefix) to exactly ``expected`` bytes, allocating no more than that."""
    import lz4.block  # lazy: see the module note

    n = len(payload) if isinstance(payload, (bytes, bytearray)) else memoryview(payload).nbytes
    if expected > n * LZ4_MAX_RATIO + 16:
        raise size_error(f"{where}: {source} {expected:,} decoded bytes from a {n:,}-byte LZ4 block, more "
                         f"than LZ4's {LZ4_MAX_RATIO}x expansion allows", hint=hint,
                         expected=expected, stored=n, **details)
    try:
        out = lz4.block.decompress(payload, uncompressed_size=expected)
    except (lz4.block.LZ4BlockError, ValueError) as e:  # a corrupt block, or a size it refuses
        raise error(f"{where}: lz4 decompression failed ({e})", hint=hint, **details) from None
    if len(out) != expected:
        raise size_error(f"{where}: the LZ4 block decodes to {len(out):,} bytes, {source} {expected:,}", hint=hint, expected=expected, got=len(out), **details)
    return out
