"""Single-size image transform for the feature cache: center crop + resize.

Contract: :func:`target_size` turns the config's ``resolution`` (an int for
a square, or ``[height, width]``) into sides rounded to the nearest multiple
of 16 (at least 16), as the latent grids of diffusion models need.
:func:`load_image` decodes a file, applies its EXIF orientation, converts to
RGB (alpha is dropped), crops the largest centred box with the target's
aspect ratio and resizes it to the target, writing ``3×H×W`` uint8 into a
caller-provided buffer. It returns the original (oriented) size. The result
is deterministic for a given Pillow version, which is part of the cache
fingerprint.

JPEGs use libjpeg's DCT-domain downscaling (``Image.draft``) when the image
is at least twice the target: decode dominates the build (docs/design.md §4) and
this is where it pays. :func:`load_video_frame` does the same for the middle
frame of a video (OpenCV's FFmpeg backend). Decode failures raise :class:`DecodeFailure` with a
quarantine reason (``decode-error`` or ``truncated``).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence

import numpy as np
from PIL import Image, ImageOps
from warpdata.core.errors import ConfigError, Rejected

INTERPOLATIONS = {
    "nearest": Image.Resampling.NEAREST,
    "bilinear": Image.Resampling.BILINEAR,
    "bicubic": Image.Resampling.BICUBIC,
    "lanczos": Image.Resampling.LANCZOS,
}
_ROTATED = {5, 6, 7, 8}  # EXIF orientations that swap width and height


DecodeFailure = Rejected  # the one "rejected with a reason" class (warpdata.core.errors)


def round16(x: float) -> int:
    return max(16, int(math.floor(x / 16 + 0.5)) * 16)


def target_size(resolution: int | Sequence[int]) -> tuple[int, int]:
    """(height, width) from ``resolution``, each side rounded to a multiple of 16."""
    if isinstance(resolution, bool):
        raise ConfigError(f"resolution must be an integer or [height, width], got {resolution!r}")
    if isinstance(resolution, int):
        h = w = resolution
    elif isinstance(resolution, Sequence) and len(resolution) == 2 and all(
            isinstance(v, int) and not isinstance(v, bool) for v in resolution):
        h, w = resolution
    elif isinstance(resolution, Sequence) and len(resolution) == 1 and isinstance(resolution[0], int):
        h = w = resolution[0]
    else:
        raise ConfigError(f"resolution must be an integer or [height, width], got {resolution!r}",
                          hint="e.g. resolution = 256 or resolution = [256, 384]")
    if h <= 0 or w <= 0 or h > 16384 or w > 16384:
        raise ConfigError(f"resolution {resolution!r} must be between 1 and 16384 pixels per side")
    return round16(h), round16(w)


def crop_box(width: int, height: int, tw: int, th: int) -> tuple[float, float, float, float]:
    """The largest centred box of ``width×height`` with aspect ``tw:th``."""
    scale = max(tw / width, th / height)
    cw, ch = min(width, tw / scale), min(height, th / scale)  # min: float error must not leave the image
    x0, y0 = max(0.0, (width - cw) / 2), max(0.0, (height - ch) / 2)
    return (x0, y0, min(float(width), x0 + cw), min(float(height), y0 + ch))


def _open_header(im: Image.Image) -> tuple[int, int, int]:
    """(EXIF orientation, oriented width, oriented height): what the header alone says."""
    orientation = im.getexif().get(0x0112, 1) if im.format in ("JPEG", "TIFF", "WEBP", "PNG") else 1
    w0, h0 = im.size
    if orientation in _ROTATED:
        w0, h0 = h0, w0
    return orientation, w0, h0


def _image_failure(e: BaseException) -> DecodeFailure:
    """The quarantine verdict of an exception raised while opening or decoding an image."""
    if isinstance(e, OSError):
        text = str(e)
        if "truncated" in text or "broken data stream" in text:
            return DecodeFailure("truncated", f"image is truncated: {text}")
        return DecodeFailure("decode-error", f"cannot decode image: {text}")
    return DecodeFailure("decode-error", f"cannot decode image: {e}")


_IMAGE_ERRORS = (OSError, Image.DecompressionBombError, Image.DecompressionBombWarning, ValueError, SyntaxError)


def probe(path: str, is_video: bool = False) -> DecodeFailure | None:
    """The failure a full decode of ``path`` is certain to meet in its header, or None.

    Runs exactly the steps :func:`load_image` (:func:`load_video_frame`) runs
    before decoding pixels (open, header, EXIF; for a video, opening the
    container), with the same error mapping: a failure here is the failure
    the full decode reports, word for word. Data cut short after an intact
    header passes the probe and fails the full decode later
    (docs/formats/feature-shard.md, "Building on an executor").
    """
    if is_video:
        try:
            import cv2
        except ImportError:
            return DecodeFailure("unsupported-format", "video needs OpenCV (pip install opencv-python-headless)")
        cap = cv2.VideoCapture(path)
        try:
            if not cap.isOpened():
                return DecodeFailure("decode-error", "cannot open video (unknown container or codec)")
        finally:
            cap.release()
        return None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with Image.open(path) as im:
                _open_header(im)
    except _IMAGE_ERRORS as e:
        return _image_failure(e)
    return None


def load_image(path: str, size: tuple[int, int], out: np.ndarray, *,
               interpolation: str = "bicubic") -> tuple[int, int]:
    """Decode ``path`` into ``out`` (3×H×W uint8); return the oriented (height, width)."""
    th, tw = size
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with Image.open(path) as im:
                orientation, w0, h0 = _open_header(im)
                if im.format == "JPEG":
                    # draft picks the largest scale 1/2^k that keeps the image >= the request
                    scale = max(tw / w0, th / h0)
                    req = (math.ceil(w0 * scale), math.ceil(h0 * scale))
                    im.draft("RGB", (req[1], req[0]) if orientation in _ROTATED else req)
                im.load()
                img = ImageOps.exif_transpose(im) if orientation != 1 else im
                if img.mode != "RGB":
                    img = img.convert("RGB")
                box = crop_box(img.width, img.height, tw, th)
                # box coordinates are in the (possibly draft-reduced) image: crop in that frame
                res = img.resize((tw, th), INTERPOLATIONS[interpolation], box=box)
    except _IMAGE_ERRORS as e:
        raise _image_failure(e) from None
    arr = np.asarray(res)
    out[...] = arr.transpose(2, 0, 1)
    return h0, w0


def load_video_frame(path: str, size: tuple[int, int], out: np.ndarray, *,
                     interpolation: str = "bicubic") -> tuple[int, int]:
    """Decode the middle frame of a video into ``out``; return its (height, width)."""
    try:
        import cv2
    except ImportError:
        raise DecodeFailure("unsupported-format", "video needs OpenCV (pip install opencv-python-headless)") from None
    cap = cv2.VideoCapture(path)
    try:
        if not cap.isOpened():
            raise DecodeFailure("decode-error", "cannot open video (unknown container or codec)")
        n = int(cap.get(cv2.CAP_PROP_FRAME_COUNT))
        if n > 1:
            cap.set(cv2.CAP_PROP_POS_FRAMES, n // 2)
        ok, frame = cap.read()
        if not ok or frame is None:
            raise DecodeFailure("truncated" if n > 0 else "decode-error",
                                f"cannot read frame {max(n // 2, 0)} of {n}")
    finally:
        cap.release()
    th, tw = size
    img = Image.fromarray(np.ascontiguousarray(frame[..., ::-1]))  # BGR -> RGB
    res = img.resize((tw, th), INTERPOLATIONS[interpolation], box=crop_box(img.width, img.height, tw, th))
    out[...] = np.asarray(res).transpose(2, 0, 1)
    return img.height, img.width
