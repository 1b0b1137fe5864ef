"""Zstandard frame headers: read the content size, add it where a compressor left it out.

A zstd frame may omit its decompressed size (``Frame_Content_Size``, RFC 8878
§3.1.1.1): streaming compressors do (tensorstore, some GPU codecs). Readers
that size their output from the header then fail on such frames — python-zstd,
numcodecs before 0.16, older numcodecs.js and neuroglancer (tensorstore issue
#182, numcodecs PR #707). warp's chunks always carry it, as zstandard's and
numcodecs' one-shot compressors write it, so every reader can size its buffer.

:func:`with_content_size` rewrites only the header of a frame that lacks the
field (the blocks are untouched, so the frame stays valid and decodes to the
same bytes) and returns any other frame unchanged, without a copy.

Header layout: magic ``28 B5 2F FD``; descriptor byte (bits 7-6 FCS flag,
bit 5 single segment, bit 3 reserved, bit 2 checksum, bits 1-0 dictionary-id
flag); a window byte unless single segment; 0/1/2/4 bytes of dictionary id;
0/1/2/4/8 bytes of content size (flag 0 means none, or 1 byte when single
segment; flag 1 stores ``size - 256`` in 2 bytes).
"""

from __future__ import annotations

from typing import Any

from warpdata.core.errors import DataError

MAGIC = b"\x28\xb5\x2f\xfd"
_DID_BYTES = (0, 1, 2, 4)
_FCS_BYTES = (0, 2, 4, 8)


def _header(frame: Any) -> tuple[int, int, int, int]:
    """(descriptor, offset of the content-size field, its length, header length)."""
    mv = memoryview(frame).cast("B")
    if len(mv) < 6 or bytes(mv[:4]) != MAGIC:
        raise DataError("not a zstd frame (bad magic number)", hint="the chunk is damaged or not zstd-compressed")
    fhd = mv[4]
    if fhd & 0x08:
        raise DataError("zstd frame header has its reserved bit set", hint="the chunk is damaged")
    single = (fhd >> 5) & 1
    pos = 5 + (0 if single else 1) + _DID_BYTES[fhd & 3]
    fcs_flag = fhd >> 6
    n = 1 if (fcs_flag == 0 and single) else _FCS_BYTES[fcs_flag]
    if len(mv) < pos + n:
        raise DataError("zstd frame is shorter than its header", hint="the chunk is truncated")
    return fhd, pos, n, pos + n


def content_size(frame: Any) -> int | None:
    """The decompressed size the frame header declares, or None when it does not declare one."""
    fhd, pos, n, _ = _header(frame)
    if n == 0:
        return None
    value = int.from_bytes(memoryview(frame).cast("B")[pos:pos + n], "little")
    return value + 256 if n == 2 else value


def with_content_size(frame: Any, size: int) -> Any:
    """``frame`` with ``size`` in its header: unchanged (same object) if it already declares a size."""
    fhd, pos, n, end = _header(frame)
    if n:
        declared = content_size(frame)
        if declared != size:
            raise DataError(f"zstd frame declares {declared} bytes, expected {size}", hint="the chunk is damaged")
        return frame
    if size < 0:
        raise ValueError(f"content size must be >= 0, got {size}")
    flag, nbytes = (2, 4) if size < 1 << 32 else (3, 8)
    mv = memoryview(frame).cast("B")
    head = bytearray(mv[:pos])
    head[4] = (fhd & 0x3F) | (flag << 6)
    return bytes(head) + size.to_bytes(nbytes, "little") + mv[end:]
