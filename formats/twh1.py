"""TWH1: the tensor-warehouse shard format (spec: docs/formats/twh1.md).

A shard holds ``samples`` detection samples at one fixed size: CHW images,
boxes padded to ``max_boxes`` (xyxy, pixels of the stored image), a box mask,
and a meta region with class ids and per-sample ids. Layout, little-endian::

    [header 80 B][zero pad to image_offset (4096)]
    [images  samples*C*H*W*dtype]      CHW, row-major
    [boxes   samples*max_boxes*4*box_dtype]
    [mask    samples*max_boxes*dtype]  1 = real box, 0 = padding
    [meta    "TWHM" table: classes, frame ids, source sizes, affine, keys, run ids]
    [checksum 32 B: SHA-256 of every byte before it]

Regions start at 64-byte aligned offsets (the image region at 4096) and the
gaps are zero bytes. dtype codes: 0 = f32, 1 = f16 (docs/formats/twh1.md), 2 = u8 (an
extension: float16 of x/255 round-trips to the same uint8, so u8 loses
nothing and halves the bytes). Boxes use f32 for u8 and f32 shards and f16
for f16 shards; the mask uses the image dtype.

:class:`ShardBuilder` fills preallocated arrays (decoders write straight
into :meth:`ShardBuilder.image_slot`) and :meth:`ShardBuilder.write` streams
the file while hashing it, so the checksum costs no second read;
:meth:`ShardBuilder.write_direct` writes the same bytes with ``O_DIRECT``
from the page-aligned image memory (no page-cache copy of the pixels).
:class:`TWH1Shard` memory-maps a file and exposes zero-copy, read-only numpy
views; every structural invariant is checked on open and raises
:class:`TWH1FormatError` naming the file, field and offset; :meth:`verify`
recomputes the SHA-256 and raises :class:`TWH1ChecksumError`.
"""

from __future__ import annotations

import contextlib
import hashlib
import mmap
import os
import struct
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, BinaryIO

import numpy as np
from warpdata.core.directio import BLOCK, aligned_empty, pack_into
from warpdata.core.errors import DataError, MissingInputError

if TYPE_CHECKING:
    from warpdata.core.directio import AlignedFile

MAGIC = b"TWH1"
META_MAGIC = b"TWHM"
SHARD_VERSION = 1
META_VERSION = 1
HEADER = struct.Struct("<4sIIIIIIIQQQQQQ")  # 80 bytes
META_HEADER = struct.Struct("<4sIQQQQQQQQQ")  # 80 bytes
IMAGE_ALIGN = 4096
ALIGN = 64
CHECKSUM_SIZE = 32

DTYPES: dict[int, str] = {0: "f32", 1: "f16", 2: "u8"}
DTYPE_CODES = {v: k for k, v in DTYPES.items()}
_NP = {"f32": np.float32, "f16": np.float16, "u8": np.uint8}
# The manifest spells dtypes as docs/formats/twh1.md does.
MANIFEST_DTYPE = {"f32": "F32", "f16": "F16", "u8": "U8"}


class TWH1FormatError(DataError):
    """A TWH1 file breaks a structural rule of docs/formats/twh1.md."""

    code = "twh1-format"


class TWH1ChecksumError(DataError):
    """Stored and recomputed SHA-256 differ: the shard is corrupt."""

    code = "twh1-checksum"


def _align(n: int, a: int = ALIGN) -> int:
    return -(-n // a) * a


def box_dtype(dtype: str) -> str:
    return "f16" if dtype == "f16" else "f32"


@dataclass(frozen=True)
class Header:
    shard_version: int
    dtype: str
    endianness: str  # "little" | "big"
    width: int
    height: int
    channels: int
    max_boxes: int
    samples: int
    image_offset: int
    boxes_offset: int
    mask_offset: int
    meta_offset: int
    checksum_offset: int

    def pack(self) -> bytes:
        return HEADER.pack(MAGIC, self.shard_version, DTYPE_CODES[self.dtype],
                           0 if self.endianness == "little" else 1, self.width, self.height,
                           self.channels, self.max_boxes, self.samples, self.image_offset,
                           self.boxes_offset, self.mask_offset, self.meta_offset, self.checksum_offset)

    def to_dict(self) -> dict:
        return dict(self.__dict__)


@dataclass(frozen=True)
class Layout:
    """Offsets of every region for a given shape (what a conforming writer emits)."""

    header: Header
    meta: tuple[int, ...]  # classes, frame_ids, orig_size, affine, key_index, key_bytes, run_index, run_bytes, end
    size: int

    @classmethod
    def compute(cls, *, dtype: str, width: int, height: int, channels: int, max_boxes: int,
                samples: int, key_bytes: int, run_bytes: int) -> Layout:
        isz = np.dtype(_NP[dtype]).itemsize
        bsz = np.dtype(_NP[box_dtype(dtype)]).itemsize
        image_offset = IMAGE_ALIGN
        boxes_offset = _align(image_offset + samples * channels * height * width * isz)
        mask_offset = _align(boxes_offset + samples * max_boxes * 4 * bsz)
        meta_offset = _align(mask_offset + samples * max_boxes * isz)
        o = meta_offset + META_HEADER.size
        classes = _align(o)
        frame_ids = _align(classes + samples * max_boxes * 4)
        orig = _align(frame_ids + samples * 8)
        affine = _align(orig + samples * 8)
        key_index = _align(affine + samples * 16)
        key_data = key_index + (samples + 1) * 8
        run_index = _align(key_data + key_bytes)
        run_data = run_index + (samples + 1) * 8
        end = run_data + run_bytes
        checksum_offset = _align(end)
        hdr = Header(SHARD_VERSION, dtype, "little", width, height, channels, max_boxes, samples,
                     image_offset, boxes_offset, mask_offset, meta_offset, checksum_offset)
        return cls(hdr, (classes, frame_ids, orig, affine, key_index, key_data, run_index, run_data, end),
                   checksum_offset + CHECKSUM_SIZE)


class ShardBuilder:
    """Preallocated arrays for up to ``capacity`` samples; reusable via :meth:`reset`."""

    def __init__(self, *, capacity: int, width: int, height: int, max_boxes: int,
                 dtype: str = "u8", channels: int = 3) -> None:
        if dtype not in DTYPE_CODES:
            raise ValueError(f"dtype must be one of {sorted(DTYPE_CODES)}, got {dtype!r}")
        self.capacity, self.width, self.height = capacity, width, height
        self.channels, self.max_boxes, self.dtype = channels, max_boxes, dtype
        # page-aligned, so whole pages of pixels can go to the disk without a page-cache copy
        nbytes = capacity * channels * height * width * np.dtype(_NP[dtype]).itemsize
        self._image_flat = aligned_empty(nbytes)
        self.images = self._image_flat.view(_NP[dtype]).reshape(capacity, channels, height, width)
        self.boxes = np.zeros((capacity, max_boxes, 4), _NP[box_dtype(dtype)])
        self.mask = np.zeros((capacity, max_boxes), _NP[dtype])
        self.classes = np.full((capacity, max_boxes), -1, np.int32)
        self.frame_ids = np.full(capacity, -1, np.int64)
        self.orig_size = np.zeros((capacity, 2), np.uint32)
        self.affine = np.zeros((capacity, 4), np.float32)
        self.keys: list[bytes] = []
        self.run_ids: list[bytes] = []
        self.last_write_s: dict[str, float] = {}

    @property
    def count(self) -> int:
        return len(self.keys)

    def reset(self) -> None:
        n = self.count
        self.boxes[:n] = 0
        self.mask[:n] = 0
        self.classes[:n] = -1
        self.frame_ids[:n] = -1
        self.keys.clear()
        self.run_ids.clear()

    def image_slot(self) -> np.ndarray:
        """The CHW array the next sample's image must be written into."""
        if self.count >= self.capacity:
            raise ValueError(f"shard is full ({self.capacity} samples)")
        return self.images[self.count]

    def commit(self, *, key: str, boxes: np.ndarray, classes: np.ndarray, frame_id: int = -1,
               run_id: str = "", orig_size: tuple[int, int] = (0, 0),
               affine: tuple[float, float, float, float] = (1.0, 1.0, 0.0, 0.0)) -> int:
        """Record the sample whose image is in :meth:`image_slot`; returns its index."""
        i = self.count
        if i >= self.capacity:
            raise ValueError(f"shard is full ({self.capacity} samples)")
        nb = len(boxes)
        if nb > self.max_boxes:
            raise ValueError(f"{key}: {nb} boxes > max_boxes={self.max_boxes}")
        if nb:
            self.boxes[i, :nb] = boxes
            self.classes[i, :nb] = classes
            self.mask[i, :nb] = 1
        self.frame_ids[i] = frame_id
        self.orig_size[i] = orig_size
        self.affine[i] = affine
        self.keys.append(key.encode("utf-8"))
        self.run_ids.append(run_id.encode("utf-8"))
        return i

    def layout(self) -> Layout:
        return Layout.compute(dtype=self.dtype, width=self.width, height=self.height,
                              channels=self.channels, max_boxes=self.max_boxes, samples=self.count,
                              key_bytes=sum(map(len, self.keys)), run_bytes=sum(map(len, self.run_ids)))

    @property
    def image_nbytes(self) -> int:
        """Bytes of one sample's image (the stride of :attr:`images`)."""
        return self.images[0].nbytes

    def image_bytes(self) -> np.ndarray:
        """The image region's bytes so far, a flat uint8 view; page-aligned (see :meth:`write_direct`)."""
        return self._image_flat[:self.count * self.image_nbytes]

    def _pieces(self, lay: Layout) -> list:
        """The file's bytes before the checksum, in order, as buffers (zero gaps included)."""
        pieces: list = []
        pos = 0

        def put(buf) -> None:
            nonlocal pos
            if isinstance(buf, np.ndarray):
                buf = np.ascontiguousarray(buf).reshape(-1).view(np.uint8)
            pieces.append(buf)
            pos += len(memoryview(buf).cast("B"))

        def pad_to(off: int) -> None:
            if off < pos:
                raise AssertionError("TWH1 layout regions overlap")
            if off > pos:
                put(bytes(off - pos))

        n = self.count
        hdr = lay.header
        put(hdr.pack())
        pad_to(hdr.image_offset)
        put(self.image_bytes())
        pad_to(hdr.boxes_offset)
        put(self.boxes[:n])
        pad_to(hdr.mask_offset)
        put(self.mask[:n])
        pad_to(hdr.meta_offset)
        classes, frame_ids, orig, affine, key_index, key_data, run_index, run_data, end = lay.meta
        put(META_HEADER.pack(META_MAGIC, META_VERSION, classes, frame_ids, orig, affine,
                             key_index, key_data, run_index, run_data, end))
        pad_to(classes)
        put(self.classes[:n])
        pad_to(frame_ids)
        put(self.frame_ids[:n])
        pad_to(orig)
        put(self.orig_size[:n])
        pad_to(affine)
        put(self.affine[:n])
        for idx_off, items in ((key_index, self.keys), (run_index, self.run_ids)):
            pad_to(idx_off)
            index = np.zeros(n + 1, "<u8")
            if n:
                np.cumsum([len(k) for k in items], out=index[1:])
            put(index)
            put(b"".join(items))
        pad_to(hdr.checksum_offset)
        return pieces

    def write(self, f: BinaryIO, *, chunk: int = 8 << 20) -> str:
        """Stream the shard to ``f`` while hashing it; returns the SHA-256 hex (also stored in the file)."""
        h = hashlib.sha256()
        clock = time.perf_counter
        spent = {"hash": 0.0, "write": 0.0}
        for buf in self._pieces(self.layout()):
            mv = memoryview(buf).cast("B")
            for s in range(0, len(mv), chunk):
                part = mv[s:s + chunk]
                t0 = clock()
                h.update(part)
                t1 = clock()
                f.write(part)
                spent["hash"] += t1 - t0
                spent["write"] += clock() - t1
        digest = h.digest()
        f.write(digest)
        self.last_write_s = spent  # observability: time hashing vs writing, seconds
        return digest.hex()

    def write_direct(self, out: AlignedFile, *, written: int = 0) -> str:
        """Write the shard through ``out`` (an :class:`~warpdata.core.directio.AlignedFile` on an
        empty file) and return the SHA-256 hex; same bytes as :meth:`write`.

        The first ``written`` bytes of :meth:`image_bytes` must already be at their
        place in the file (submitted while the shard was being filled; a multiple
        of 4096). The image region starts at a page-aligned file offset and the
        builder's image memory is page-aligned, so every whole page of pixels goes
        to the device without a page-cache copy; the header page is written last,
        after everything else, so a torn file never carries a valid header.
        """
        clock = time.perf_counter
        lay = self.layout()
        pieces = self._pieces(lay)
        img = self.image_bytes()
        base = lay.header.image_offset
        if base % BLOCK or written % BLOCK or written > len(img):
            raise ValueError(f"write_direct: {written} bytes written is not a whole number of pages")
        whole = len(img) // BLOCK * BLOCK
        t0 = clock()
        if whole > written:  # the device writes the remaining pixels while this thread hashes
            out.submit(base + written, img[written:whole])
        t1 = clock()
        h = hashlib.sha256()
        for buf in pieces:
            h.update(buf)
        digest = h.digest()
        t2 = clock()
        # the rest (the last partial page of pixels, boxes, mask, meta, checksum) from one bounce buffer
        if len(pieces) < 3 or len(pieces[2]) != len(img):
            raise AssertionError("TWH1 pieces must start with header, pad, images")
        rest = [img[whole:], *pieces[3:], digest]  # pieces: header, pad, images, then the rest
        tail_len = lay.size - base - whole
        tail = aligned_empty(-(-tail_len // BLOCK) * BLOCK)
        if pack_into(tail, rest) != tail_len:
            raise AssertionError(f"TWH1 tail does not match the layout's {tail_len} bytes")
        out.submit(base + whole, tail)
        out.wait()
        head = aligned_empty(base)
        pack_into(head, pieces[:2])
        out.write(0, head)
        out.truncate(lay.size)
        self.last_write_s = {"hash": t2 - t1, "write": (t1 - t0) + (clock() - t2)}
        return digest.hex()

    def write_file(self, path: str | os.PathLike) -> str:
        with open(path, "wb") as f:
            return self.write(f)


_LAZY_ATTRS = frozenset({"header", "images", "boxes", "mask", "classes", "frame_ids", "orig_size",
                         "affine", "_key_index", "_run_index", "_key_data", "_run_data", "_meta", "_size"})


class TWH1Shard:
    """A memory-mapped TWH1 shard with zero-copy, read-only numpy views.

    The shard is the whole file ``path``, or, with ``offset`` and ``length``,
    the ``length`` bytes at ``offset`` inside it (a member of a cached tar
    shard, mapped in place: the map starts at the page boundary below
    ``offset`` and every view is taken relative to the member). ``name``
    replaces the path in messages.

    Picklable: only the location travels; the map is reopened lazily on first
    use in the receiving process (DataLoader workers never copy the data).
    """

    def __init__(self, path: str | os.PathLike, *, verify: bool = False, offset: int = 0,
                 length: int | None = None, name: str | None = None) -> None:
        self.path = str(path)
        self.offset, self.length, self.name = int(offset), length, name or self.path
        self._mm: mmap.mmap | memoryview | None = None
        self._open()
        if verify:
            self.verify()

    def __getstate__(self) -> dict:
        return {"path": self.path, "offset": self.offset, "length": self.length, "name": self.name}

    def __setstate__(self, state: dict) -> None:
        self.path = state["path"]
        self.offset, self.length = state.get("offset", 0), state.get("length")
        self.name = state.get("name", self.path)
        self._mm = None

    def _err(self, msg: str, **details) -> TWH1FormatError:
        return TWH1FormatError(f"{self.name}: {msg}", path=self.name,
                               hint="the shard is damaged or not TWH1; rebuild it with 'warp etl --clear'",
                               **details)

    def _open(self) -> None:
        try:
            fd = os.open(self.path, os.O_RDONLY)
        except FileNotFoundError:
            raise MissingInputError(f"{self.path}: shard file does not exist",
                                    hint="the warehouse is incomplete; rebuild it with 'warp etl --clear'") from None
        try:
            file_size = os.fstat(fd).st_size
            size = file_size - self.offset if self.length is None else self.length
            if self.offset + size > file_size:
                raise self._err(f"{self.path} is {file_size} bytes, too short for {size} bytes at {self.offset}",
                                offset=0)
            if size < HEADER.size:
                raise self._err(f"file is {size} bytes, shorter than the {HEADER.size}-byte header", offset=0)
            start = self.offset - self.offset % mmap.ALLOCATIONGRANULARITY  # mmap offsets are page-aligned
            mm = mmap.mmap(fd, 0 if self.length is None and not start else self.offset - start + size,
                           access=mmap.ACCESS_READ, offset=start)
        finally:
            os.close(fd)
        self._size = size
        # the whole file is the map itself; a member is a slice of it (views are relative to the member)
        buf = mm if self.offset == 0 and self.length is None else memoryview(mm)[self.offset - start:][:size]
        try:
            self._parse(buf)
        except BaseException:
            for k in _LAZY_ATTRS:
                self.__dict__.pop(k, None)
            _unmap(buf, mm)
            raise
        self._map, self._mm = mm, buf

    def _parse(self, mm) -> None:
        (magic, ver, dcode, endian, w, h, c, mb, n, io, bo, mo, meo, co) = HEADER.unpack_from(mm, 0)
        if magic != MAGIC:
            raise self._err(f"bad magic {magic!r} (expected {MAGIC!r})", offset=0)
        if ver != SHARD_VERSION:
            raise self._err(f"shard_version {ver} is not supported (this reader knows {SHARD_VERSION})", offset=4)
        if dcode not in DTYPES:
            raise self._err(f"dtype code {dcode} is unknown (0=f32, 1=f16, 2=u8)", offset=8)
        if endian not in (0, 1):
            raise self._err(f"endianness {endian} is neither 0 (little) nor 1 (big)", offset=12)
        if min(w, h, c) == 0:
            raise self._err(f"zero dimension: width={w} height={h} channels={c}", offset=16)
        dtype = DTYPES[dcode]
        order = "<" if endian == 0 else ">"
        isz = np.dtype(_NP[dtype]).itemsize
        bsz = np.dtype(_NP[box_dtype(dtype)]).itemsize
        regions = [("image_offset", io, n * c * h * w * isz, 40), ("boxes_offset", bo, n * mb * 4 * bsz, 48),
                   ("mask_offset", mo, n * mb * isz, 56), ("meta_offset", meo, META_HEADER.size, 64)]
        prev_end = HEADER.size
        for name, off, length, hoff in regions:
            if off < prev_end:
                raise self._err(f"{name}={off} overlaps the previous region (ends at {prev_end})", offset=hoff)
            prev_end = off + length
        if co < prev_end:
            raise self._err(f"checksum_offset={co} overlaps the meta region", offset=72)
        if co + CHECKSUM_SIZE != self._size:
            raise self._err(f"file is {self._size} bytes but checksum_offset+32 = {co + CHECKSUM_SIZE} "
                            "(truncated or trailing bytes)", offset=72)
        self.header = Header(ver, dtype, "little" if endian == 0 else "big", w, h, c, mb, n,
                             io, bo, mo, meo, co)
        mmagic, mver, *moffs = META_HEADER.unpack_from(mm, meo)
        if mmagic != META_MAGIC or mver != META_VERSION:
            raise self._err(f"meta region at {meo} has magic {mmagic!r} version {mver} "
                            f"(expected {META_MAGIC!r} version {META_VERSION})", offset=meo)
        classes, frame_ids, orig, affine, key_index, key_data, run_index, run_data, end = moffs
        sizes = [(classes, n * mb * 4), (frame_ids, n * 8), (orig, n * 8), (affine, n * 16),
                 (key_index, (n + 1) * 8)]
        prev = meo + META_HEADER.size
        for off, length in sizes:
            if off < prev or off + length > co:
                raise self._err(f"meta table entry at {off} (+{length}) lies outside the meta region", offset=meo)
            prev = off + length
        if key_data != key_index + (n + 1) * 8 or run_data != run_index + (n + 1) * 8 or not (
                key_data <= run_index <= run_data <= end <= co):
            raise self._err("meta string tables are inconsistent", offset=meo)
        self._meta = moffs
        dt = np.dtype(_NP[dtype]).newbyteorder(order)
        bdt = np.dtype(_NP[box_dtype(dtype)]).newbyteorder(order)
        self.images = np.frombuffer(mm, dt, n * c * h * w, io).reshape(n, c, h, w)
        self.boxes = np.frombuffer(mm, bdt, n * mb * 4, bo).reshape(n, mb, 4)
        self.mask = np.frombuffer(mm, dt, n * mb, mo).reshape(n, mb)
        self.classes = np.frombuffer(mm, "<i4", n * mb, classes).reshape(n, mb)
        self.frame_ids = np.frombuffer(mm, "<i8", n, frame_ids)
        self.orig_size = np.frombuffer(mm, "<u4", n * 2, orig).reshape(n, 2)
        self.affine = np.frombuffer(mm, "<f4", n * 4, affine).reshape(n, 4)
        self._key_index = np.frombuffer(mm, "<u8", n + 1, key_index)
        self._run_index = np.frombuffer(mm, "<u8", n + 1, run_index)
        for name, idx, base, limit in (("key", self._key_index, key_data, run_index),
                                       ("run id", self._run_index, run_data, end)):
            if n and (idx[0] != 0 or (np.diff(idx.astype(np.int64)) < 0).any() or base + int(idx[-1]) > limit):
                raise self._err(f"{name} string index is not monotonic or points past its table", offset=base)
        self._key_data, self._run_data = key_data, run_data

    def _ensure(self) -> None:
        if self._mm is None:
            self._open()

    def __getattr__(self, name: str):
        # After unpickling, the views appear on first touch (lazy reopen).
        if name in _LAZY_ATTRS and self.__dict__.get("_mm") is None and "path" in self.__dict__:
            self._open()
            return self.__dict__[name]
        raise AttributeError(name)

    def __len__(self) -> int:
        return self.header.samples

    def _string(self, index: np.ndarray, base: int, i: int) -> str:
        self._ensure()
        if not 0 <= i < len(self):
            raise IndexError(f"sample {i} out of range for {self.name} ({len(self)} samples)")
        a, b = int(index[i]), int(index[i + 1])
        return bytes(self._mm[base + a:base + b]).decode("utf-8")

    def key(self, i: int) -> str:
        return self._string(self._key_index, self._key_data, i)

    def run_id(self, i: int) -> str:
        return self._string(self._run_index, self._run_data, i)

    def keys(self) -> list[str]:
        return [self.key(i) for i in range(len(self))]

    def num_boxes(self, i: int) -> int:
        return int(np.count_nonzero(self.mask[i]))

    def stored_checksum(self) -> str:
        self._ensure()
        co = self.header.checksum_offset
        return bytes(self._mm[co:co + CHECKSUM_SIZE]).hex()

    def compute_checksum(self, chunk: int = 16 << 20) -> str:
        self._ensure()
        h = hashlib.sha256()
        mv = memoryview(self._mm)
        co = self.header.checksum_offset
        for s in range(0, co, chunk):
            h.update(mv[s:min(s + chunk, co)])
        mv.release()
        return h.hexdigest()

    def verify(self, expected: str | None = None) -> str:
        """Recompute the SHA-256; raise TWH1ChecksumError on mismatch with the stored (and ``expected``)."""
        got = self.compute_checksum()
        stored = self.stored_checksum()
        if got != stored:
            raise TWH1ChecksumError(f"{self.name}: SHA-256 mismatch: stored {stored}, computed {got}",
                                    hint="the shard is corrupt; rebuild with 'warp etl --clear'",
                                    path=self.name, stored=stored, computed=got)
        if expected is not None and expected != got:
            raise TWH1ChecksumError(f"{self.name}: SHA-256 {got} differs from the manifest's {expected}",
                                    hint="the shard does not belong to this manifest; rebuild with 'warp etl --clear'",
                                    path=self.name, stored=expected, computed=got)
        return got

    def close(self) -> None:
        mm = self.__dict__.get("_mm")
        if mm is not None:
            for k in ("images", "boxes", "mask", "classes", "frame_ids", "orig_size", "affine",
                      "_key_index", "_run_index"):
                self.__dict__.pop(k, None)
            # views still alive elsewhere keep the map; it closes when they go
            _unmap(mm, self.__dict__.pop("_map", mm))
            self._mm = None

    def __enter__(self) -> TWH1Shard:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _unmap(buf: mmap.mmap | memoryview, mm: mmap.mmap) -> None:
    """Close a map (and the member slice over it) unless a caller still holds a view into it."""
    with contextlib.suppress(BufferError):
        if isinstance(buf, memoryview):
            buf.release()
        mm.close()


def read_header(path: str | os.PathLike) -> Header:
    """Parse and check only the header (cheap; used by sniffers and inspectors)."""
    with TWH1Shard(path) as s:
        return s.header


def is_twh1(head: bytes | None) -> bool:
    return bool(head) and head[:4] == MAGIC


__all__ = ["MAGIC", "Header", "Layout", "ShardBuilder", "TWH1Shard", "TWH1FormatError",
           "TWH1ChecksumError", "read_header", "is_twh1"]
