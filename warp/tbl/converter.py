"""WebDataset tar -> TBL v2, streaming, in constant memory.

Contract: :func:`convert` reads the tar once, front to back (a path, ``-``
for stdin, gzip detected by magic), groups members into samples by
WebDataset key, and writes one TBL entry per sample: the image member is the
payload (format and size read from its header, never decoded), every other
member of the sample is a sidecar kept in the sample's JSON metadata
(``{"key", "name", "sidecars": {ext: text}, "binary": {ext: base64}}``).
Every member is stored, attached as a sidecar, or counted as skipped with
its reason (:attr:`ConvertResult.skipped`): nothing is dropped silently.

A plain file goes in two passes. Pass 1 walks the headers
(:func:`~warpdata.tbl.tarstream.scan_members`: one ``pread`` brings a
header, the small sidecars after it and the head of the next image) and
plans every sample: payload chosen, format and size read from the head the
scan brought, sidecars read, metadata JSON built, skips counted; the plans
are packed into a spool (:class:`_PlanSpool`, memory up to 1 MiB, then an
anonymous file). Pass 2 knows the sample count, so the output's layout, and
reads each payload once, straight into the writer's ``O_DIRECT`` staging
buffer (:meth:`TblWriter.payload_slot`), checksums it there and writes.
Headers are read once (no counting pre-pass); an image's first bytes come
with pass 1's window and all of it in pass 2. A pipe or gzip stream is
planned and written sample by sample, into spools the writer moves into
place at close.

Compression runs in ``workers`` threads (the C code releases the GIL);
payloads stored as they are (JPEG, PNG... with ``--compression auto``) are
only checksummed, in the calling thread: two C passes of ~25 us per 120 KB
photo cost less than a hand-off to a thread. Results are written in input
order, so the output bytes do not depend on the worker count or the input
route. At most ``4 * workers`` samples are in flight, and the writer spools
index and metadata to disk, so peak memory does not grow with the number of
samples. The output is written under a temporary name and renamed at the
end: an interrupted run leaves no ``OUT``. Unless ``replace`` (``--force``),
that rename never replaces a file (:func:`warpdata.core.atomic.rename_noreplace`):
of two runs into one ``OUT`` exactly one succeeds, the other fails with
"already exists" (exit 2) and leaves the winner's file as it is.
"""

from __future__ import annotations

import base64
import contextlib
import errno
import json
import os
import struct
import tempfile
import time
import uuid
from collections import Counter, deque
from collections.abc import Callable, Generator, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from json.encoder import encode_basestring as _jstr  # json.dumps' own (C) string encoder
from pathlib import Path
from typing import Any

from warpdata.core.atomic import rename_noreplace, temp_prefix
from warpdata.core.errors import DataError, UsageError, WarpError, os_failure
from warpdata.core.names import TMP_PREFIX
from warpdata.formats.imageinfo import EXTENSION_FORMATS, image_info
from warpdata.formats.tbl import (
    COMPRESSIONS,
    FORMAT_CODES,
    MAX_DIM,
    EncodedSample,
    TblReader,
    TblWriter,
    crc16,
    crc32,
    encode_sample,
    resolve_compression,
)
from warpdata.tbl.tarstream import (
    DEFAULT_MAX_MEMBER,
    Sample,
    TarFormatError,
    open_input,
    read_at,
    read_at_into,
    scan_members,
)

ON_ERROR = ("raise", "skip", "warn")
MAX_SKIP_EXAMPLES = 50  # skipped members listed by name; the rest are only counted
# a plain file is read with pread (tarstream), past any buffer; this one serves gzip input and pipes,
# where a bigger member is read straight into its own bytes (with 1 MiB every payload was copied twice)
_READ_BUFFER = 16 << 10
_DEFER_ABOVE = 16 << 10  # members bigger than this are read when needed, where they are needed


@dataclass
class ConvertRequest:
    input: str  # path or "-"
    output: str
    compression: str = "auto"
    level: int | None = None
    workers: int = 0  # 0 = number of CPUs
    verify: bool = False
    on_error: str = "raise"
    fsync: bool = True
    max_member_bytes: int = DEFAULT_MAX_MEMBER  # a bigger member is an error (gzip bombs, bad headers)
    replace: bool = False  # replace an existing output (--force); else it is an error, checked atomically


@dataclass
class ConvertResult:
    output: str
    samples: int = 0
    members: int = 0
    sidecars: int = 0
    skipped: int = 0
    skipped_by_reason: dict[str, int] = field(default_factory=dict)
    skipped_examples: list[dict[str, str]] = field(default_factory=list)
    input_bytes: int = 0  # payload bytes before compression
    stored_bytes: int = 0
    tar_bytes: int | None = None
    output_bytes: int = 0
    compressed_samples: int = 0
    seconds: float = 0.0
    verified: bool | None = None
    formats: dict[str, int] = field(default_factory=dict)

    @property
    def samples_per_s(self) -> float:
        return self.samples / self.seconds if self.seconds > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        d = dict(self.__dict__)
        d["samples_per_s"] = round(self.samples_per_s, 1)
        d["seconds"] = round(self.seconds, 3)
        d["ratio"] = round(self.output_bytes / self.tar_bytes, 4) if self.tar_bytes else None
        return d


def _ext_format(ext: str) -> str | None:
    return EXTENSION_FORMATS.get(ext.lower().rsplit(".", 1)[-1])


def choose_payload(sample: Sample) -> int | None:
    """Index in ``sample.members`` of the image that becomes the payload, or None."""
    for i, (ext, _m) in enumerate(sample.members):
        if ext.lower() in EXTENSION_FORMATS:
            return i
    for i, (ext, _m) in enumerate(sample.members):
        if _ext_format(ext):
            return i
    return None


_PAYLOAD_RANK: dict[str, int] = {}


def _payload_at(members: list) -> int | None:
    """:func:`choose_payload` for the converter's member tuples ``(ext, name, size, offset, data)``."""
    best, at = 2, None
    for i, m in enumerate(members):
        rank = _PAYLOAD_RANK.get(m[0])
        if rank is None:
            ext = m[0]
            rank = 0 if ext.lower() in EXTENSION_FORMATS else 1 if _ext_format(ext) else 2
            if len(_PAYLOAD_RANK) < 1024:
                _PAYLOAD_RANK[ext] = rank
        if rank < best:
            best, at = rank, i
            if not rank:
                break
    return at


def _sidecars_json(key: str, members: list, payload_at: int, on_skip, fd: int) -> tuple[bytes, int]:
    """The sample's JSON metadata and how many sidecars it carries (the other members, one per extension).

    Members are the converter's tuples ``(ext, name, size, offset, data)``;
    a member read on from ``fd`` when its bytes did not come with it. A text
    member goes to ``sidecars``, one that is not UTF-8 to ``binary`` as base64.
    """
    ext0, name0 = members[payload_at][:2]
    text: dict[str, str] = {}
    binary: dict[str, str] = {}
    for i, (ext, name, size, off, data) in enumerate(members):
        if i == payload_at:
            continue
        if ext in text or ext in binary or ext == ext0:
            on_skip(name, f"a second '.{ext}' member in sample {key!r}")
            continue
        if len(data) < size:
            data = read_at(fd, off, size, name)
        try:
            text[ext] = data.decode("utf-8")
        except UnicodeDecodeError:
            binary[ext] = base64.b64encode(data).decode("ascii")
    return meta_json(key, name0, text, binary), len(text) + len(binary)


def meta_json(key: str, name: str, text: dict[str, str], binary: dict[str, str]) -> bytes:
    """``canonical_json({"key", "name", "sidecars", "binary"})`` of a sample, written out directly.

    The same bytes (tests/test_tbl_scan.py checks it against :func:`canonical_json`):
    keys sorted (``binary`` < ``key`` < ``name`` < ``sidecars``, extensions
    sorted), no spaces, strings escaped by the same C function ``json.dumps``
    uses with ``ensure_ascii=False``, empty maps left out. At ~1 us it costs
    a quarter of building the dict and sorting it in ``json.dumps``.
    """
    s = _jstr
    head = ('{"binary":{' + ",".join([s(k) + ":" + s(binary[k]) for k in sorted(binary)]) + '},"key":'
            if binary else '{"key":')
    tail = (',"sidecars":{' + ",".join([s(k) + ":" + s(text[k]) for k in sorted(text)]) + "}}"
            if text else "}")
    return (head + s(key) + ',"name":' + s(name) + tail).encode("utf-8")


_HEAD_MORE = 64 << 10  # a payload whose header does not fit the scan's window: this much is read for it


def _image_info(fd: int, name: str, size: int, off: int, data: bytes):
    """:func:`image_info` of a payload of which ``data`` may be only the head (the rest at ``off`` in ``fd``).

    The parsers read the header by index and raise on any byte past the
    end, so a head that holds the header gives the same answer as the whole
    payload; one that does not (a large EXIF block before a JPEG's frame
    header) raises, and the parse is retried on more of it, then on all of it.
    """
    if len(data) == size:
        return image_info(data, name=name)
    if data:
        with contextlib.suppress(DataError):
            return image_info(data, name=name)
    if size > _HEAD_MORE:
        with contextlib.suppress(DataError):
            return image_info(read_at(fd, off, _HEAD_MORE, name), name=name)
    return image_info(read_at(fd, off, size, name), name=name)


def _plan_name(meta: bytes) -> str:
    """A planned sample's payload member name (for errors), from its metadata: the converter writes it there."""
    return json.loads(meta)["name"]


class _PlanSpool:
    """The converter's planned samples, in order, in memory up to :attr:`CAP` bytes and on disk past it.

    A plan is ``(size, offset, data, format code, width, height, metadata)``
    of the payload member; ``data`` is its bytes when the scan brought all of
    them (small images), else empty (read in pass 2); its name is in the
    metadata. Packed at 28 bytes plus metadata and such small payloads: peak
    memory stays flat in the number of samples. The file is anonymous
    (``TemporaryFile``): nothing is left behind, whatever happens.
    """

    CAP = 1 << 20
    READ = 1 << 20  # the spilled part is read back in pieces this big (a record may straddle two)
    REC = struct.Struct("<QQHHBI")  # offset, size, width, height, format, metadata bytes; then data bytes (u32)
    DATA = struct.Struct("<I")

    def __init__(self, where: str) -> None:
        self.where = where
        self.count = 0
        self._buf = bytearray()
        self._file = None

    def add(self, size: int, off: int, data: bytes, fmt: int, w: int, h: int, meta: bytes) -> None:
        buf = self._buf
        buf += self.REC.pack(off, size, w, h, fmt, len(meta))
        buf += meta
        buf += self.DATA.pack(len(data))
        if data:
            buf += data
        self.count += 1
        if len(buf) >= self.CAP:
            if self._file is None:
                os.makedirs(self.where, exist_ok=True)  # where the writer will put OUT (it would make it too)
                self._file = tempfile.TemporaryFile(dir=self.where)  # noqa: SIM115 - closed by close()
            self._file.write(buf)
            buf.clear()

    def __iter__(self) -> Iterator[tuple]:
        if self._file is not None:
            self._file.seek(0)
            rest = b""
            while True:
                chunk = self._file.read(self.READ)
                if not chunk:
                    break
                rest = yield from self._parse(rest + chunk if rest else chunk)
            if rest:
                raise OSError(f"the converter's plan spool ends inside a record ({len(rest)} bytes left)")
        rest = yield from self._parse(bytes(self._buf))
        if rest:
            raise OSError("the converter's plan spool ends inside a record")

    def _parse(self, b: bytes) -> Generator[tuple, None, bytes]:
        """Yield the whole records in ``b``; return the bytes of a cut last one."""
        unpack, n = self.REC.unpack_from, self.REC.size
        unpack_n = self.DATA.unpack_from
        pos, end = 0, len(b)
        while pos + n <= end:
            off, size, w, h, fmt, nm = unpack(b, pos)
            at = pos + n + nm
            if at + 4 > end:
                break
            (nd,) = unpack_n(b, at)
            stop = at + 4 + nd
            if stop > end:
                break
            yield size, off, b[at + 4:stop] if nd else b"", fmt, w, h, b[pos + n:at]
            pos = stop
        return b[pos:]

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
        self._buf = bytearray()


def _no_samples_message(path: str, res: ConvertResult, reasons: Counter[str]) -> str:
    where = "stdin" if path == "-" else path
    if not res.members:
        return f"{where}: the tar archive holds no members, so there is no sample to write"
    why = "; ".join(f"{n} {r}" for r, n in reasons.most_common(3))
    return f"{where}: none of its {res.members} member(s) became a sample ({why}); no output written"


def _no_samples_hint(res: ConvertResult) -> dict[str, str]:
    if not res.members:
        return {"hint": "give a WebDataset tar with image members (key.jpg, key.png, ...)"}
    return {"hint": "a WebDataset sample needs an image member (.jpg, .png, .webp, ...) named KEY.EXT"}


def convert(req: ConvertRequest, progress: Callable[[int, int], None] | None = None,
            warn: Callable[[str], None] | None = None) -> ConvertResult:
    """Convert ``req.input`` to ``req.output``; ``progress(samples, tar_bytes_read)``.

    A damaged or non-tar input raises :class:`TarFormatError` naming the input;
    an input that yields no sample raises :class:`~warpdata.core.errors.DataError`.
    Either way no ``OUT`` is written.
    """
    try:
        return _convert(req, progress, warn)
    except TarFormatError as e:
        where = "stdin" if req.input == "-" else str(req.input)
        raise type(e)(f"{where}: {e.message}", hint=e.hint, **e.details) from None
    except OSError as e:
        if isinstance(e, WarpError) or not _writing_output(e, req.output):
            raise
        # the operating system refused the output (a full disk, ulimit -f): name OUT, as the user
        # gave it, not the input whose file the failing frame also held, nor a temporary sibling
        raise os_failure(e, str(req.output)) from e


# errors only a write can meet: whatever the converter was writing (OUT, or its plan spool beside OUT)
_WRITE_ERRNOS = frozenset({errno.EFBIG, errno.ENOSPC, errno.EDQUOT})


def _writing_output(e: OSError, output: str) -> bool:
    """Whether ``e`` is the operating system refusing a write of ``output`` (or of a temporary
    beside it: the writer's, the spool's), rather than a read of the input."""
    if e.filename is None:
        return e.errno in _WRITE_ERRNOS
    names = [os.fsdecode(f) for f in (e.filename, e.filename2) if isinstance(f, (str, bytes, os.PathLike))]
    out = os.path.abspath(output)
    return any(os.path.abspath(n) == out or (os.path.dirname(os.path.abspath(n)) == os.path.dirname(out)
                                             and os.path.basename(n).startswith(TMP_PREFIX)) for n in names)


def _convert(req: ConvertRequest, progress: Callable[[int, int], None] | None = None,
            warn: Callable[[str], None] | None = None) -> ConvertResult:
    """The conversion itself (see :func:`convert`)."""
    if req.compression not in COMPRESSIONS:
        raise UsageError(f"--compression {req.compression!r} is not one of {', '.join(COMPRESSIONS)}",
                         hint="auto stores JPEG/PNG/WEBP as is and LZ4-compresses the rest")
    if req.on_error not in ON_ERROR:
        raise UsageError(f"--on-error {req.on_error!r} is not one of {', '.join(ON_ERROR)}",
                         hint="raise stops at the first bad sample; skip and warn leave it out")
    if req.input != "-" and os.path.abspath(req.input) == os.path.abspath(req.output):
        raise UsageError(f"{req.output}: output would overwrite the input", hint="choose another OUT path")
    workers = req.workers or os.cpu_count() or 1
    t0 = time.perf_counter()
    res = ConvertResult(output=req.output)
    reasons: Counter[str] = Counter()
    formats: Counter[str] = Counter()

    def on_skip(name: str, reason: str) -> None:
        res.skipped += 1
        reasons[reason.split(" in sample ")[0]] += 1
        if len(res.skipped_examples) < MAX_SKIP_EXAMPLES:
            res.skipped_examples.append({"member": name, "reason": reason})

    if req.max_member_bytes <= 0:
        raise UsageError(f"--max-member-mb must be positive (got {req.max_member_bytes} bytes)",
                         hint="the default is 1024 MiB")
    if not req.replace and os.path.lexists(req.output):
        raise _exists(req.output)
    f, res.tar_bytes = open_input(req.input, buffering=_READ_BUFFER)
    # without replace, the file is written under a temporary sibling and moved to OUT only if
    # OUT is still free then (another run may have made it meanwhile)
    write_to = req.output if req.replace else _exclusive_temp(req.output)
    try:
        res = _convert_open(req, f, res, on_skip, reasons, formats, workers, t0, progress, warn, write_to)
        if write_to != req.output:
            try:
                rename_noreplace(write_to, req.output)
            except FileExistsError:
                raise _exists(req.output, meanwhile=True) from None
        return res
    finally:
        if req.input != "-":
            f.close()
        if write_to != req.output:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(write_to)


def _exists(output: str, meanwhile: bool = False) -> UsageError:
    when = " (another run created it while this one converted; its file is kept)" if meanwhile else ""
    return UsageError(f"{output} already exists{when}", hint="pass --force to replace it, or choose another OUT",
                      path=output)


def _exclusive_temp(output: str) -> str:
    """A fresh name beside ``output`` (same directory, so the final move is a rename)."""
    head, name = os.path.split(os.path.abspath(output))
    return os.path.join(head, f"{temp_prefix()}{uuid.uuid4().hex[:12]}-{name}")


def _convert_open(req: ConvertRequest, f, res: ConvertResult, on_skip, reasons: Counter[str],
                  formats: Counter[str], workers: int, t0: float,
                  progress: Callable[[int, int], None] | None,
                  warn: Callable[[str], None] | None, write_to: str) -> ConvertResult:
    """Plan every sample (pass 1), then write them (pass 2) into ``write_to``; see the module docstring."""
    run = _Run(req, f, res, on_skip, formats, workers, progress, warn)
    try:
        if not run.two_pass:  # streamed: the sample count is not known up front (the writer moves payloads at close)
            run.writer = TblWriter(write_to, compression=req.compression, level=req.level, extensions=True,
                                   expected_samples=None, fsync=req.fsync)
        run.scan(f)
        if run.two_pass and run.plans.count:
            run.writer = TblWriter(write_to, compression=req.compression, level=req.level, extensions=True,
                                   expected_samples=run.plans.count, fsync=req.fsync)
            run.write_planned()
        run.drain(0)
        if not res.samples:
            raise DataError(_no_samples_message(req.input, res, reasons), **_no_samples_hint(res))
        run.writer.close(warp_metadata=True)  # type: ignore[union-attr]
    except BaseException:
        run.abort()
        raise
    finally:
        run.close()
    return _finish(req, res, run.writer, write_to, reasons, formats, t0)  # type: ignore[arg-type]


class _Run:
    """One conversion's planning and writing state: the passes of :func:`_convert_open`.

    Pass 1 (:meth:`scan`) groups the members into samples and plans each
    (:meth:`plan`): into the spool for a plain file, straight to :meth:`emit`
    for a pipe or gzip stream. Pass 2 (:meth:`write_planned`) writes the
    spooled plans. Samples reach the writer in input order (:meth:`drain`).
    """

    def __init__(self, req: ConvertRequest, f, res: ConvertResult, on_skip, formats: Counter[str], workers: int,
                 progress: Callable[[int, int], None] | None, warn: Callable[[str], None] | None) -> None:
        self.req, self.res, self.on_skip, self.formats = req, res, on_skip, formats
        self.progress, self.warn = progress, warn
        try:  # members that come without (all of) their bytes are read on from here: plain files, stdin included
            self.fd = f.fileno()
        except (OSError, AttributeError, ValueError):
            self.fd = -1
        # a plain file is planned whole before anything is written: the plans give the sample count
        # the output's layout needs, in the same pass over the headers (no counting pre-pass). Pipes
        # and gzip streams are written as they are read, into spools the writer moves at close
        self.two_pass = req.input != "-" and res.tar_bytes is not None
        self.plans = _PlanSpool(os.path.dirname(os.path.abspath(req.output)))
        self.writer: TblWriter | None = None
        self.pool = ThreadPoolExecutor(workers, thread_name_prefix="tbl-encode") if workers > 1 else None
        self.pending: deque = deque()
        self.window = 4 * workers
        self.read_to = 0  # tar bytes read so far (uncompressed), for progress
        self.as_is: dict[int, bool] = {}  # format code -> stored as is (no compression) under req.compression

    def scan(self, f) -> None:
        """Pass 1: group the members into samples by WebDataset key and :meth:`plan` each."""
        res, on_skip, plan = self.res, self.on_skip, self.plan
        # members come as (name, size, kind, file offset, bytes or their head): a big member of a
        # plain file is read only once known to be a payload, straight into the writer's staging buffer
        key: str | None = None
        cur: list = []  # the current sample's members: (ext, name, size, offset, bytes or their head)
        for name, size, kind, off, data in scan_members(f, max_member=self.req.max_member_bytes,
                                                        defer_above=_DEFER_ABOVE):
            res.members += 1
            if kind != "file":
                on_skip(name, f"not a regular file ({kind})")
                continue
            slash = name.rfind("/")  # split_key, inline: WebDataset key up to the base name's first dot
            dot = name.find(".", slash + 1)
            if dot <= slash + 1:
                on_skip(name, "no extension in the file name, so no WebDataset key")
                continue
            k = name[:dot]
            if k != key:
                if cur:
                    plan(key, cur)  # type: ignore[arg-type]
                key, cur = k, []
            cur.append((name[dot + 1:], name, size, off, data))
        if cur:
            plan(key, cur)  # type: ignore[arg-type]

    def plan(self, key: str, members: list) -> None:
        """Choose the payload, read its format and size, build the metadata; or skip the sample."""
        req, on_skip = self.req, self.on_skip
        at = _payload_at(members)
        if at is None:
            names = ", ".join(m[1] for m in members)
            for m in members:
                on_skip(m[1], f"sample {key!r} has no image member ({names})")
            return
        _ext, name, size, off, data = members[at]
        try:
            info = _image_info(self.fd, name, size, off, data)
        except DataError as e:
            if req.on_error == "raise":
                raise DataError(f"{req.input}: {e.message}",
                                hint="fix or remove the member, or rerun with --on-error skip (or warn)",
                                member=name, key=key) from None
            if req.on_error == "warn" and self.warn:
                self.warn(f"skipping sample {key!r}: {e.message}")
            for m in members:
                on_skip(m[1], f"bad image header ({e.__class__.__name__})")
            return
        meta, n_side = _sidecars_json(key, members, at, on_skip, self.fd)
        self.res.sidecars += n_side
        self.formats[info.format] += 1
        w, h = info.width, info.height
        w, h = (w if 0 < w <= MAX_DIM else 0), (h if 0 < h <= MAX_DIM else 0)
        if len(data) < size:
            data = b""  # (a head: pass 2 reads it all, into the writer's staging buffer)
        if self.two_pass:
            self.plans.add(size, off, data, FORMAT_CODES.get(info.format, 0), w, h, meta)
        else:
            self.emit(name, size, off, data, FORMAT_CODES.get(info.format, 0), w, h, meta)

    def _added(self) -> None:
        self.res.samples += 1
        if self.progress:
            self.progress(self.res.samples, self.read_to)

    def drain(self, limit: int) -> None:
        """Hand the samples in flight to the writer, in order, until ``limit`` are left."""
        pending, writer = self.pending, self.writer
        while len(pending) > limit:
            fut = pending.popleft()
            writer.add_encoded(fut.result() if isinstance(fut, Future) else fut)  # type: ignore[union-attr]
            self._added()

    def emit(self, name: str | None, size: int, off: int, data: bytes, fmt: int, w: int, h: int,
             meta: bytes) -> None:
        """Checksum (and maybe compress) one planned sample and hand it to the writer, in order.

        ``data`` is the payload, or empty when it is to be read from ``off``
        (``name``, for errors, None for the name in ``meta``).
        """
        req, fd = self.req, self.fd
        self.read_to = off + size
        if name is None:
            name = _plan_name(meta)
        stored_as_is = self.as_is.get(fmt)
        if stored_as_is is None:  # as encode_sample decides it
            stored_as_is = self.as_is[fmt] = resolve_compression(req.compression, fmt) == "none"
        if stored_as_is:  # checksums only: ~25 us of C per 120 KB photo, less than handing it to a thread
            if len(data) < size:  # straight into the writer's staging buffer, where it offers one
                if self.pending:
                    self.drain(0)  # the slot is where the next payload goes: everything before it is written
                slot = self.writer.payload_slot(size)  # type: ignore[union-attr]
                if slot is not None:
                    read_at_into(fd, slot, off, size, name)
                    data = slot
                else:
                    data = read_at(fd, off, size, name)
            elif self.pending:  # compressed samples before it are still in the pool: it waits its turn
                self.pending.append(EncodedSample(data, size, 0, crc16(data), crc32(data), fmt, w, h, meta))
                self.drain(self.window)
                return
            self.writer.add_stored(data, size, 0, crc16(data), crc32(data), fmt, w, h, meta)  # type: ignore[union-attr]
            self._added()
            return
        if len(data) < size:
            data = read_at(fd, off, size, name)
        kwargs = dict(format=fmt, width=w, height=h, compression=req.compression, level=req.level,
                      trailer=True, metadata=meta)
        if self.pool:
            self.pending.append(self.pool.submit(encode_sample, data, **kwargs))
        else:
            self.pending.append(encode_sample(data, **kwargs))
        self.drain(self.window)

    def write_planned(self) -> None:
        """Pass 2 over the spooled plans, its common case inline (a payload stored as is, nothing
        compressed in flight): one preadv into the staging buffer, two CRC passes over it while it is
        in cache, one add."""
        writer, fd, res, progress, as_is = self.writer, self.fd, self.res, self.progress, self.as_is
        slot_of, add_stored, preadv = writer.payload_slot, writer.add_stored, os.preadv  # type: ignore[union-attr]
        for size, off, data, fmt, w, h, meta in self.plans:
            if self.pending or not as_is.get(fmt):  # (the first of a format decides it, in emit)
                self.emit(None, size, off, data, fmt, w, h, meta)
                continue
            self.read_to = read_to = off + size
            if not data:
                slot = slot_of(size)
                if slot is not None:
                    if size and preadv(fd, [slot], off) != size:
                        read_at_into(fd, slot, off, size, _plan_name(meta))
                    data = slot
                else:
                    data = read_at(fd, off, size, _plan_name(meta))
            add_stored(data, size, 0, crc16(data), crc32(data), fmt, w, h, meta)
            res.samples += 1
            if progress:
                progress(res.samples, read_to)

    def abort(self) -> None:
        for fut in self.pending:
            if isinstance(fut, Future):
                fut.cancel()
        if self.writer is not None:
            self.writer.abort()

    def close(self) -> None:
        self.plans.close()
        if self.pool:
            self.pool.shutdown(wait=True, cancel_futures=True)


def _finish(req: ConvertRequest, res: ConvertResult, writer: TblWriter, write_to: str, reasons: Counter[str],
            formats: Counter[str], t0: float) -> ConvertResult:
    """Fill in the result from the closed writer; with ``req.verify``, read the output back and check it."""
    res.input_bytes, res.stored_bytes = writer.bytes_in, writer.bytes_stored
    res.compressed_samples = writer.compressed_samples
    res.output_bytes = Path(write_to).stat().st_size
    res.skipped_by_reason = dict(sorted(reasons.items()))
    res.formats = dict(sorted(formats.items()))
    if req.verify:
        with TblReader(write_to, verify=True) as r:
            problems = r.verify_all()
            if len(r) != res.samples:
                raise DataError(f"{req.output}: holds {len(r)} samples after writing {res.samples}",
                                hint="the disk may be full or failing; convert again")
        if problems:
            raise DataError(f"{req.output}: verification after writing found {len(problems)} corrupt "
                            f"sample(s), first: {problems[0].message}",
                            hint="the disk or memory may be failing; convert again")
        res.verified = True
    res.seconds = time.perf_counter() - t0
    return res
