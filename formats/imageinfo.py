"""Image format, width and height from the first bytes of a file, without decoding.

Contract: :func:`image_info` reads only container headers (JPEG SOF markers,
PNG IHDR, GIF logical screen, BMP DIB header, WEBP VP8/VP8L/VP8X chunks,
TIFF/BigTIFF first IFD) and returns :class:`ImageInfo` ``(format, width,
height)``. It never decodes pixels, so it costs microseconds per image.

* Data in none of these formats raises :class:`UnknownImageFormat`.
* A recognised signature with a header that is cut short or inconsistent
  raises :class:`ImageHeaderError`.
* Sizes are the stored (encoded) size: an EXIF orientation tag is not
  applied, as every decoder that ignores EXIF would not apply it either.

:func:`size_problem` is the shared sanity check of every pipeline that decodes images
(ingest, warehouse, feature cache), run on the header alone before any pixel is decoded:

* ``too-many-pixels``: width × height over a cap (default :data:`DEFAULT_MAX_PIXELS`, Pillow's
  ``MAX_IMAGE_PIXELS``), the decompression bomb (a 30000² PNG of a few MB decodes to 2.7 GB);
* ``impossible-header``: a declared size the data cannot hold. PNG rows are deflated (at most
  1032:1) from at least one filter byte plus one bit per pixel; GIF codes are at most 12 bits for
  at most 4096 pixels; an uncompressed BMP stores every row. A file smaller than that bound
  declares pixels it does not contain.

:func:`sniff_format` only looks at the signature. Both accept ``bytes``,
``bytearray``, ``memoryview`` or anything exposing the buffer protocol and
never copy more than a header's worth of bytes.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from warpdata.core.errors import DataError

__all__ = ["DEFAULT_MAX_PIXELS", "IMAGE_LIMIT_REASONS", "ImageHeaderError", "ImageInfo", "UnknownImageFormat",
           "image_info", "min_encoded_bytes", "size_problem", "sniff_format", "EXTENSION_FORMATS"]

#: pixel cap of every image pipeline unless configured: Pillow's ``Image.MAX_IMAGE_PIXELS``
DEFAULT_MAX_PIXELS = 89_478_485

#: the quarantine reasons of :func:`size_problem` (code, category, help), registered by each pipeline
IMAGE_LIMIT_REASONS = (
    ("too-many-pixels", "invalid", "the image header declares more pixels than the cap ([limits] max_pixels, "
                                   "--max-pixels); it was not decoded"),
    ("impossible-header", "invalid", "the image header declares a size the file's bytes cannot hold"),
)

# file extensions (lower case, without dot) WebDataset tars use for images
EXTENSION_FORMATS: dict[str, str] = {
    "jpg": "jpeg", "jpeg": "jpeg", "jpe": "jpeg", "png": "png", "webp": "webp", "bmp": "bmp",
    "dib": "bmp", "tif": "tiff", "tiff": "tiff", "gif": "gif",
}


class UnknownImageFormat(DataError):
    """The bytes start with no image signature this module knows."""

    code = "unknown-image-format"


class ImageHeaderError(DataError):
    """A known image signature whose header is truncated or inconsistent."""

    code = "bad-image-header"


@dataclass(frozen=True)
class ImageInfo:
    format: str  # jpeg | png | webp | bmp | tiff | gif
    width: int
    height: int


def sniff_format(data) -> str | None:
    """The image format named by the signature of ``data``, or None."""
    head = bytes(memoryview(data)[:16])
    if head[:3] == b"\xff\xd8\xff":
        return "jpeg"
    if head[:8] == b"\x89PNG\r\n\x1a\n":
        return "png"
    if head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        return "webp"
    if head[:6] in (b"GIF87a", b"GIF89a"):
        return "gif"
    if head[:2] == b"BM":
        return "bmp"
    if head[:4] in (b"II*\x00", b"MM\x00*", b"II+\x00", b"MM\x00+"):
        return "tiff"
    return None


def image_info(data, name: str = "<bytes>") -> ImageInfo:
    """Format, width and height of the image in ``data`` (``name`` is used in errors)."""
    mv = memoryview(data).cast("B") if not isinstance(data, bytes) else data
    fmt = sniff_format(mv)
    if fmt is None:
        raise UnknownImageFormat(f"{name}: not a JPEG, PNG, WEBP, BMP, TIFF or GIF image "
                                 f"(first bytes {bytes(mv[:8]).hex(' ')})",
                                 hint="check the file's extension and contents")
    try:
        w, h = _PARSERS[fmt](mv)
    except (struct.error, IndexError, ValueError) as e:
        raise ImageHeaderError(f"{name}: truncated or malformed {fmt.upper()} header ({e})",
                               hint="re-encode the image or drop it from the dataset") from None
    if w < 0 or h < 0:
        raise ImageHeaderError(f"{name}: {fmt.upper()} header gives a negative size {w}x{h}",
                               hint="re-encode the image or drop it from the dataset")
    return ImageInfo(fmt, w, h)


# JPEG start-of-frame markers carry the size; C4 (DHT), C8 (JPG) and CC (DAC) do not
_SOF = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}
_STANDALONE = frozenset(range(0xD0, 0xD8)) | {0x01, 0xD8}


def _jpeg(mv) -> tuple[int, int]:
    n = len(mv)
    i = 2
    while True:
        # a marker is one or more 0xFF fill bytes, then the marker code
        if mv[i] != 0xFF:
            raise ValueError(f"expected a marker at byte {i}")
        while mv[i] == 0xFF:
            i += 1
        marker = mv[i]
        i += 1
        if marker in _STANDALONE:
            continue
        if marker == 0xD9 or marker == 0xDA:
            raise ValueError("no start-of-frame marker before the image data")
        seglen = (mv[i] << 8) | mv[i + 1]
        if seglen < 2:
            raise ValueError(f"segment length {seglen} at byte {i}")
        if marker in _SOF:
            if i + 7 > n:
                raise ValueError("start-of-frame segment cut short")
            h = (mv[i + 3] << 8) | mv[i + 4]
            w = (mv[i + 5] << 8) | mv[i + 6]
            return w, h
        i += seglen


def _png(mv) -> tuple[int, int]:
    if bytes(mv[12:16]) != b"IHDR":
        raise ValueError("first chunk is not IHDR")
    w, h = struct.unpack_from(">II", mv, 16)
    return w, h


def _gif(mv) -> tuple[int, int]:
    return struct.unpack_from("<HH", mv, 6)


def _bmp(mv) -> tuple[int, int]:
    (dib,) = struct.unpack_from("<I", mv, 14)
    if dib == 12:  # BITMAPCOREHEADER: unsigned 16-bit sizes
        return struct.unpack_from("<HH", mv, 18)
    if dib < 40:
        raise ValueError(f"DIB header size {dib}")
    w, h = struct.unpack_from("<ii", mv, 18)
    return w, abs(h)  # negative height = top-down rows


def _webp(mv) -> tuple[int, int]:
    chunk = bytes(mv[12:16])
    if chunk == b"VP8 ":
        if bytes(mv[23:26]) != b"\x9d\x01\x2a":
            raise ValueError("VP8 frame start code missing")
        w, h = struct.unpack_from("<HH", mv, 26)
        return w & 0x3FFF, h & 0x3FFF
    if chunk == b"VP8L":
        if mv[20] != 0x2F:
            raise ValueError("VP8L signature missing")
        (bits,) = struct.unpack_from("<I", mv, 21)
        return 1 + (bits & 0x3FFF), 1 + ((bits >> 14) & 0x3FFF)
    if chunk == b"VP8X":
        b = bytes(mv[24:30])
        if len(b) < 6:
            raise ValueError("VP8X chunk cut short")
        return 1 + int.from_bytes(b[0:3], "little"), 1 + int.from_bytes(b[3:6], "little")
    raise ValueError(f"unknown WEBP chunk {chunk!r}")


def _tiff(mv) -> tuple[int, int]:
    e = "<" if bytes(mv[:2]) == b"II" else ">"
    (magic,) = struct.unpack_from(e + "H", mv, 2)
    if magic == 43:  # BigTIFF: 8-byte offsets and counts, 20-byte entries
        (ifd,) = struct.unpack_from(e + "Q", mv, 8)
        (count,) = struct.unpack_from(e + "Q", mv, ifd)
        entry0, esize = ifd + 8, 20
    else:
        (ifd,) = struct.unpack_from(e + "I", mv, 4)
        (count,) = struct.unpack_from(e + "H", mv, ifd)
        entry0, esize = ifd + 2, 12
    w = h = None
    for k in range(count):
        at = entry0 + k * esize
        tag, typ = struct.unpack_from(e + "HH", mv, at)
        if tag not in (256, 257):
            continue
        voff = at + (8 if esize == 12 else 12)
        if typ == 3:
            (v,) = struct.unpack_from(e + "H", mv, voff)
        elif typ in (4, 16):
            (v,) = struct.unpack_from(e + ("I" if typ == 4 else "Q"), mv, voff)
        else:
            raise ValueError(f"size tag {tag} has type {typ}")
        if tag == 256:
            w = v
        else:
            h = v
        if w is not None and h is not None:
            return w, h
    raise ValueError("first IFD has no ImageWidth/ImageLength")


_PARSERS = {"jpeg": _jpeg, "png": _png, "gif": _gif, "bmp": _bmp, "webp": _webp, "tiff": _tiff}


def min_encoded_bytes(fmt: str, width: int, height: int, data=None) -> int:
    """A lower bound on the bytes an image of ``fmt`` and this size takes (0: no bound known).

    ``data`` (the file's bytes, or its first ones) lets a BMP header say whether it is
    uncompressed and how many bits a pixel takes."""
    if width <= 0 or height <= 0:
        return 0
    if fmt == "png":  # per row: a filter byte + >= 1 bit per pixel; deflate expands at most 1032:1
        return (height * (1 + (width + 7) // 8)) // 1032
    if fmt == "gif":  # LZW: one code of <= 12 bits yields <= 4096 pixels
        return (width * height) // 4096
    if fmt == "bmp" and data is not None:
        try:
            dib, = struct.unpack_from("<I", data, 14)
            if dib >= 40:
                bpp, comp = struct.unpack_from("<HI", data, 28)
                if comp in (0, 3) and bpp in (1, 4, 8, 16, 24, 32):  # BI_RGB / BI_BITFIELDS: every row stored
                    return 54 + height * (((width * bpp + 31) // 32) * 4)
        except struct.error:
            return 0
    return 0


def size_problem(fmt: str, width: int, height: int, nbytes: int, max_pixels: int = DEFAULT_MAX_PIXELS,
                 data=None) -> tuple[str, str] | None:
    """``(reason, message)`` when an image's header fails the checks of the module docstring, else None."""
    if width * height > max_pixels:
        return ("too-many-pixels", f"{fmt.upper()} header declares {width}x{height} = {width * height:,} pixels, "
                                   f"over the cap of {max_pixels:,}")
    need = min_encoded_bytes(fmt, width, height, data)
    if nbytes < need:
        return ("impossible-header", f"{fmt.upper()} header declares {width}x{height} pixels, which take at least "
                                     f"{need:,} bytes, but the file has {nbytes:,}")
    return None

