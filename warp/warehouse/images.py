"""Image probing for validation: size, EXIF orientation, truncation; no pixel decode.

:func:`probe` reads a file's bytes (the ETL hashes them anyway) and returns
an :class:`ImageProbe` with the stored size, the EXIF orientation (1-8) and
the *oriented* size (what a viewer shows, the frame labels are drawn in), or
raises :class:`ProbeError` with a quarantine reason code: ``decode-error``
(not an image / unreadable header), ``truncated`` (a JPEG without its end
marker), ``too-many-pixels`` or ``impossible-header`` (the header checks of
:func:`warpdata.formats.imageinfo.size_problem`, before any decode). JPEG headers come from simplejpeg (libjpeg-turbo); the EXIF
orientation is read by a small APP1/TIFF parser below, so JPEG probing never
builds a PIL image. Other formats fall back to Pillow's lazy open.
"""

from __future__ import annotations

import struct
import warnings
from dataclasses import dataclass

from warpdata.core.errors import Rejected
from warpdata.formats.imageinfo import (
    DEFAULT_MAX_PIXELS,
    ImageHeaderError,
    UnknownImageFormat,
    image_info,
    size_problem,
)

JPEG_SOI = b"\xff\xd8"
JPEG_EOI = b"\xff\xd9"


ProbeError = Rejected  # the one "rejected with a reason" class (warpdata.core.errors)


@dataclass(frozen=True)
class ImageProbe:
    kind: str  # "jpeg" | "png" | ... (Pillow's format name, lower case)
    width: int  # stored
    height: int
    orientation: int  # EXIF 1..8 (1 = as stored)

    @property
    def oriented_size(self) -> tuple[int, int]:
        # orientations 5-8 swap the axes (transpose / rotate 90)
        if self.orientation >= 5:
            return self.height, self.width
        return self.width, self.height


def exif_orientation_jpeg(data: bytes | memoryview) -> int:
    """EXIF orientation tag of a JPEG (1 if absent or malformed)."""
    mv = memoryview(data)
    n = len(mv)
    pos = 2
    while pos + 4 <= n:
        if mv[pos] != 0xFF:
            return 1
        marker = mv[pos + 1]
        if marker in (0xD8, 0x01) or 0xD0 <= marker <= 0xD7:
            pos += 2
            continue
        if marker in (0xDA, 0xD9):  # start of scan: no more metadata segments
            return 1
        seglen = (mv[pos + 2] << 8) | mv[pos + 3]
        if seglen < 2:
            return 1
        if marker == 0xE1 and bytes(mv[pos + 4:pos + 10]) == b"Exif\x00\x00":
            return _tiff_orientation(mv[pos + 10:pos + 2 + seglen])
        pos += 2 + seglen
    return 1


def _tiff_orientation(t: memoryview) -> int:
    if len(t) < 8:
        return 1
    bo = bytes(t[:2])
    if bo == b"II":
        e = "<"
    elif bo == b"MM":
        e = ">"
    else:
        return 1
    (ifd,) = struct.unpack_from(e + "I", t, 4)
    if ifd + 2 > len(t):
        return 1
    (count,) = struct.unpack_from(e + "H", t, ifd)
    for i in range(count):
        off = ifd + 2 + 12 * i
        if off + 12 > len(t):
            return 1
        tag, typ, _cnt = struct.unpack_from(e + "HHI", t, off)
        if tag == 0x0112:
            (val,) = struct.unpack_from(e + "H", t, off + 8) if typ == 3 else (1,)
            return val if 1 <= val <= 8 else 1
    return 1


def probe(data: bytes, max_pixels: int = DEFAULT_MAX_PIXELS) -> ImageProbe:
    try:
        info = image_info(data)
    except (ImageHeaderError, UnknownImageFormat):
        info = None  # the decoders below name the problem, or read formats imageinfo does not know
    if info is not None:
        bad = size_problem(info.format, info.width, info.height, len(data), max_pixels, data)
        if bad:
            raise ProbeError(*bad)
    if data[:2] == JPEG_SOI:
        import simplejpeg

        try:
            h, w, _cs, _ss = simplejpeg.decode_jpeg_header(data)
        except ValueError as e:
            raise ProbeError("decode-error", f"JPEG header is unreadable: {e}") from None
        # A JPEG ends with EOI; encoders may pad a few zero bytes after it.
        if JPEG_EOI not in data[-64:]:
            raise ProbeError("truncated", f"JPEG has no end-of-image marker ({len(data)} bytes): truncated")
        return ImageProbe("jpeg", int(w), int(h), exif_orientation_jpeg(data))
    import io

    from PIL import Image, UnidentifiedImageError

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)  # the cap is max_pixels
            im = Image.open(io.BytesIO(data))
        with im:
            w, h = im.size
            if w * h > max_pixels:
                raise ProbeError("too-many-pixels", f"{(im.format or 'image').upper()} header declares {w}x{h} "
                                 f"= {w * h:,} pixels, over the cap of {max_pixels:,}")
            fmt = (im.format or "unknown").lower()
            try:
                orient = int(im.getexif().get(0x0112, 1))
            except Exception:  # malformed EXIF is ignored like browsers do
                orient = 1
    except Image.DecompressionBombError as e:
        raise ProbeError("too-many-pixels", str(e)) from None
    except (UnidentifiedImageError, OSError, ValueError) as e:
        raise ProbeError("decode-error", f"not a readable image: {e}") from None
    return ImageProbe(fmt, int(w), int(h), orient if 1 <= orient <= 8 else 1)
