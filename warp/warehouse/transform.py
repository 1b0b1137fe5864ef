"""Deterministic image transforms: decode, orient, resize or letterbox, CHW, normalize.

The one code path both the ETL and the live (dev) loader run, so a shard
sample and a live sample are the same bytes. :class:`Transformer` owns
preallocated buffers (decode buffer, HWC canvas, planes) and writes the
result straight into a caller's CHW array (a shard slot), so the hot path
allocates nothing: simplejpeg decodes into the reused buffer, OpenCV resizes
into a view of the canvas, and ``cv2.split`` writes the channel planes into
the output (0.6 ms for resize + split of a 0.6 MP photo here, vs 3.6 ms for
Pillow's bilinear resize). All three release the GIL, so threads scale.

Geometry (see :func:`geometry`): letterbox scales by ``s = min(W/w, H/h)``,
rounds the content size to integers ``nw, nh`` and centres it
(``px = (W-nw)//2``); boxes are then scaled by the *final integer* ratios
``nw/w`` and ``nh/h`` plus the padding, so they match the pixels exactly.
``resize`` stretches to ``W x H``. Boxes are clipped to the image.

Decoding: JPEG with simplejpeg (libjpeg-turbo, accurate DCT and upsampling,
strict: a corrupt or truncated stream raises); anything else, and JPEGs
simplejpeg cannot convert to RGB (CMYK), with Pillow. EXIF orientation is
applied to the pixels before resizing, exactly like ``PIL.ImageOps.exif_transpose``.

Scaled decode (``decode = "scaled"``, the default; :func:`dct_scale`): a JPEG is
decoded in the DCT domain at the smallest of libjpeg-turbo's power-of-two scales
1/2, 1/4, 1/8 whose output, ``ceil(w/d) x ceil(h/d)`` in the stored frame, still
covers the content size ``nw x nh`` (swapped for EXIF orientations 5-8, which
transpose the frame); otherwise at full size. Geometry and boxes are computed
from the *original* oriented ``w x h`` exactly as for a full decode, and the
decoded image is resized by the exact ratios ``d*nw/w``, ``d*nh/h`` (OpenCV's
``fx``/``fy``): scaled pixel ``i`` covers source pixels ``[d*i, d*(i+1))``, so
when ``w`` is not a multiple of ``d`` the last decoded column is only partly
image and a plain resize to ``nw`` would stretch the content by up to 1/2 px at
the far edge; the exact ratio keeps pixels on the boxes (any extra column
OpenCV's rounding makes is dropped). Decode + letterbox then costs 1.40 instead
of 1.81 CPU-ms per 600-900 px photo to 320 px, 4.13 instead of 5.44 per 1080p
photo to 640 (the entropy decoding, which no scale skips, is most of what is
left). On photos the pixels differ from a full decode by a mean |d| <= 3 and a
PSNR >= 33 dB per image (measured: mean 1.1, PSNR 35-42 dB; BENCHMARKS.md, "DCT-scaled
decode in the warehouse"), and are closer to an antialiased (INTER_AREA) resize
of the full image than the full decode's linear resize is. ``decode = "full"``
keeps the full-size decode. The policy is part of the version recipe
(:data:`SCALE_POLICY`), so the two never share a version.
"""

from __future__ import annotations

import io
import math
import time
from dataclasses import dataclass

import numpy as np
from warpdata.core.errors import Rejected
from warpdata.warehouse.images import JPEG_SOI, ImageProbe

DecodeError = Rejected  # the one "rejected with a reason" class (warpdata.core.errors)

DECODE_MODES = ("scaled", "full")
# libjpeg-turbo's power-of-two DCT scales (the SIMD reduced IDCTs), smallest output first. Its
# other n/8 factors are never used: letting simplejpeg pick any n/8 that covers the content (3/8
# for a third of the 600-900 px photos to 320) decoded slower than 1/2 for all of them, 1.24
# against 1.16 CPU-ms a photo (BENCHMARKS.md, Session 11)
DCT_DENOMINATORS = (8, 4, 2)
# what the version recipe records of each mode: change the text when the policy changes
SCALE_POLICY = {
    "scaled": "jpeg dct-scale/1: smallest of 1/2 1/4 1/8 whose ceil(w/d) x ceil(h/d) covers the content size "
              "(stored frame), resized by d*nw/w x d*nh/h (cv2 fx/fy); else full size",
    "full": "jpeg full size",
}


@dataclass(frozen=True)
class TransformSpec:
    width: int
    height: int
    resize_mode: str = "letterbox"
    dtype: str = "u8"
    pad_value: int = 114
    interpolation: str = "linear"
    decode: str = "scaled"  # "scaled" | "full": see the module docstring


@dataclass(frozen=True)
class Geometry:
    nw: int
    nh: int
    px: int
    py: int
    sx: float
    sy: float


def geometry(spec: TransformSpec, w: int, h: int) -> Geometry:
    """Content size, padding and box scale for a ``w x h`` (oriented) source."""
    W, H = spec.width, spec.height
    if spec.resize_mode == "resize":
        nw, nh = W, H
    else:
        s = min(W / w, H / h)
        nw = max(1, min(W, int(math.floor(w * s + 0.5))))
        nh = max(1, min(H, int(math.floor(h * s + 0.5))))
    px, py = (W - nw) // 2, (H - nh) // 2
    return Geometry(nw, nh, px, py, nw / w, nh / h)


def dct_scale(spec: TransformSpec, probe: ImageProbe) -> int:
    """The DCT scale denominator ``d`` (1, 2, 4 or 8) a JPEG is decoded at under ``spec``.

    The largest ``d`` whose decoded size ``ceil(width/d) x ceil(height/d)`` (stored frame) covers
    the letterbox content size ``nw x nh`` of the oriented source, transposed for orientations 5-8;
    1 for ``decode = "full"`` and for anything but JPEG.
    """
    if spec.decode != "scaled" or probe.kind != "jpeg":
        return 1
    ow, oh = probe.oriented_size
    g = geometry(spec, ow, oh)
    need_w, need_h = (g.nh, g.nw) if probe.orientation >= 5 else (g.nw, g.nh)
    for d in DCT_DENOMINATORS:
        if -(-probe.width // d) >= need_w and -(-probe.height // d) >= need_h:
            return d
    return 1


def transform_boxes(boxes: np.ndarray, g: Geometry, spec: TransformSpec) -> np.ndarray:
    """Scale xyxy boxes (oriented source pixels) into the output frame; float32, clipped."""
    if len(boxes) == 0:
        return np.zeros((0, 4), np.float32)
    b = np.asarray(boxes, np.float64) * np.array([g.sx, g.sy, g.sx, g.sy]) + np.array([g.px, g.py, g.px, g.py])
    np.clip(b[:, 0::2], 0, spec.width, out=b[:, 0::2])
    np.clip(b[:, 1::2], 0, spec.height, out=b[:, 1::2])
    return b.astype(np.float32)


def orient(a: np.ndarray, orientation: int) -> np.ndarray:
    """Apply EXIF orientation to an HWC array (same result as PIL's exif_transpose)."""
    if orientation == 2:
        return a[:, ::-1]
    if orientation == 3:
        return a[::-1, ::-1]
    if orientation == 4:
        return a[::-1]
    if orientation == 5:
        return a.transpose(1, 0, 2)
    if orientation == 6:
        return np.rot90(a, k=-1)
    if orientation == 7:
        return a[::-1, ::-1].transpose(1, 0, 2)
    if orientation == 8:
        return np.rot90(a, k=1)
    return a


def library_versions() -> dict[str, str]:
    """Versions of everything that touches pixels: part of the version recipe."""
    import cv2
    import PIL
    import simplejpeg

    return {"simplejpeg": simplejpeg.__version__, "opencv": cv2.__version__, "pillow": PIL.__version__,
            "numpy": np.__version__}


class Transformer:
    """Decode + transform into caller-provided CHW arrays, reusing buffers."""

    def __init__(self, spec: TransformSpec) -> None:
        import cv2

        self.spec = spec
        self._cv2 = cv2
        self._interp = {"linear": cv2.INTER_LINEAR, "nearest": cv2.INTER_NEAREST,
                        "area": cv2.INTER_AREA, "cubic": cv2.INTER_CUBIC}[spec.interpolation]
        self.canvas = np.full((spec.height, spec.width, 3), spec.pad_value, np.uint8)
        self._decode_buf = np.empty(1 << 20, np.uint8)
        self._planes = np.empty((3, spec.height, spec.width), np.uint8) if spec.dtype != "u8" else None
        self._lut = None
        if spec.dtype != "u8":
            # x/255 through a LUT: one gather instead of an astype chain (docs/design.md §4)
            self._lut = (np.arange(256, dtype=np.float64) / 255.0).astype(np.float16 if spec.dtype == "f16" else np.float32)
        self._last_geom: Geometry | None = None
        self._scratch: np.ndarray | None = None  # an exact-ratio resize's output one column/row larger
        self.decode_s = 0.0
        self.resize_s = 0.0

    def decode(self, data: bytes, probe: ImageProbe) -> np.ndarray:
        """HWC uint8 RGB at full size, oriented. Raises DecodeError(reason, message)."""
        return orient(self.decode_scaled(data, probe, 1)[0], probe.orientation)

    def decode_scaled(self, data: bytes, probe: ImageProbe, d: int) -> tuple[np.ndarray, int]:
        """HWC uint8 RGB in the stored frame (EXIF orientation not applied), decoded at scale ``1/d``
        (a JPEG simplejpeg decodes) or full size (the Pillow fallback); returns it with the scale it
        has. Raises DecodeError(reason, message)."""
        arr = None
        if data[:2] == JPEG_SOI:
            import simplejpeg

            dw, dh = -(-probe.width // d), -(-probe.height // d)
            need = dw * dh * 3
            if self._decode_buf.size < need:
                self._decode_buf = np.empty(need, np.uint8)
            try:
                if d == 1:
                    arr = simplejpeg.decode_jpeg(data, colorspace="RGB", fastdct=False, fastupsample=False,
                                                 buffer=self._decode_buf, strict=True)
                else:
                    # the smallest n/8 scale whose output is >= (dw, dh) is exactly 1/d
                    arr = simplejpeg.decode_jpeg(data, colorspace="RGB", fastdct=False, fastupsample=False,
                                                 buffer=self._decode_buf, strict=True, min_width=dw,
                                                 min_height=dh)
            except ValueError as e:
                msg = str(e)
                low = msg.lower()
                if "premature end" in low or "truncat" in low or "corrupt" in low:
                    raise DecodeError("truncated", f"JPEG data is truncated or corrupt: {msg}") from None
                if "colorspace" not in low and "conversion" not in low:
                    raise DecodeError("decode-error", f"JPEG does not decode: {msg}") from None
                arr = None  # e.g. CMYK: Pillow converts it below
            if arr is not None and (arr.shape[0] != dh or arr.shape[1] != dw):
                raise DecodeError("decode-error", f"decoded size {arr.shape[1]}x{arr.shape[0]} differs from "
                                  f"the header's {probe.width}x{probe.height} at scale 1/{d}")
        if arr is None:
            from PIL import Image

            d = 1
            try:
                with Image.open(io.BytesIO(data)) as im:
                    im.load()
                    arr = np.asarray(im.convert("RGB"))
            except (OSError, ValueError) as e:
                low = str(e).lower()
                reason = "truncated" if "truncat" in low else "decode-error"
                raise DecodeError(reason, f"image does not decode: {e}") from None
            if arr.shape[0] != probe.height or arr.shape[1] != probe.width:
                raise DecodeError("decode-error", f"decoded size {arr.shape[1]}x{arr.shape[0]} differs from "
                                  f"the header's {probe.width}x{probe.height}")
        return arr, d

    def _region(self, g: Geometry) -> np.ndarray:
        """The content region of the canvas for geometry ``g``, its padding strips set."""
        spec, c = self.spec, self.canvas
        if g != self._last_geom:
            # only the padding strips change with the geometry
            c[:g.py] = spec.pad_value
            c[g.py + g.nh:] = spec.pad_value
            c[:, :g.px] = spec.pad_value
            c[:, g.px + g.nw:] = spec.pad_value
            self._last_geom = g
        return c[g.py:g.py + g.nh, g.px:g.px + g.nw]

    def resize_into(self, hwc: np.ndarray, out: np.ndarray) -> Geometry:
        """Resize/letterbox ``hwc`` (full size, oriented) and write CHW into ``out`` (shape (3, H, W),
        spec dtype)."""
        cv2 = self._cv2
        c = self.canvas
        h, w = hwc.shape[:2]
        g = geometry(self.spec, w, h)
        region = self._region(g)
        if not hwc.flags.c_contiguous:
            hwc = np.ascontiguousarray(hwc)
        if (w, h) == (g.nw, g.nh):
            np.copyto(region, hwc)
        else:
            res = cv2.resize(hwc, (g.nw, g.nh), dst=region, interpolation=self._interp)
            if not np.shares_memory(res, c):  # OpenCV refused the view: copy the result in
                np.copyto(region, res)
        self._split(out)
        return g

    def resize_scaled_into(self, arr: np.ndarray, probe: ImageProbe, d: int, out: np.ndarray) -> Geometry:
        """Letterbox ``arr``, the stored-frame image decoded at scale ``1/d``, and write CHW into ``out``.

        The geometry is the full-size source's. The resize runs in the stored frame, where decoded
        pixel ``i`` covers source pixels ``[d*i, d*(i+1))`` from the top-left corner, by the exact
        ratios ``d*nw/w`` (module docstring); the orientation is applied to the small result (a
        mirror moves the partly-image last column to the front, where no resize ratio could place
        it right).
        """
        cv2 = self._cv2
        c = self.canvas
        g = geometry(self.spec, *probe.oriented_size)
        region = self._region(g)
        o = probe.orientation
        cw, ch = (g.nh, g.nw) if o >= 5 else (g.nw, g.nh)  # the content in the stored frame
        fx, fy = d * cw / probe.width, d * ch / probe.height
        if fx == 1.0 and fy == 1.0:
            content = arr[:ch, :cw]
        else:
            # OpenCV rounds the output size, which may hold one column or row past the content
            h, w = arr.shape[:2]
            rw, rh = round(w * fx), round(h * fy)
            if o == 1 and (rw, rh) == (cw, ch):
                dst = region
            else:
                if self._scratch is None:
                    side = max(self.spec.width, self.spec.height) + 2
                    self._scratch = np.empty((side, side, 3), np.uint8)
                dst = self._scratch[:rh, :rw] if max(rw, rh) <= self._scratch.shape[0] else None
            content = cv2.resize(arr, None, dst=dst, fx=fx, fy=fy, interpolation=self._interp)[:ch, :cw]
        if not np.shares_memory(content, c):
            np.copyto(region, orient(content, o))
        self._split(out)
        return g

    def _split(self, out: np.ndarray) -> None:
        """The canvas as CHW planes into ``out`` (converted to the spec's dtype)."""
        cv2 = self._cv2
        c = self.canvas
        if self._lut is None:
            planes = [out[0], out[1], out[2]]
            res = cv2.split(c, planes)
            if not np.shares_memory(res[0], out):
                for i in range(3):
                    out[i] = res[i]
        else:
            p = self._planes
            cv2.split(c, [p[0], p[1], p[2]])
            np.take(self._lut, p, out=out, mode="clip")

    def __call__(self, data: bytes, probe: ImageProbe, out: np.ndarray) -> Geometry:
        t0 = time.perf_counter()
        arr, d = self.decode_scaled(data, probe, dct_scale(self.spec, probe))
        t1 = time.perf_counter()
        if d == 1:
            g = self.resize_into(orient(arr, probe.orientation), out)
        else:
            g = self.resize_scaled_into(arr, probe, d, out)
        self.resize_s += time.perf_counter() - t1
        self.decode_s += t1 - t0
        return g
