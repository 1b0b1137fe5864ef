"""WebDataset tar -> TBL v2, streaming, in constant memory.

Contract: :func:`convert` reads the tar once, front to back (a path, ``-``
for stdin, gzip detected by magic), groups members into samples by
WebDataset key, and writes one TBL entry per sample: the image member is the
payload (format and size read from its header, never decoded), every other
member of the sample is a sidecar kept in the sample's JSON metadata
(``{"key", "name", "sidecars": {ext: text}, "binary": {ext: base64}}``).
Every member is stored, attached as a sidecar, or counted as skipped with
its reason (:attr:`ConvertResult.skipped`): nothing is dropped silently.

Compression runs in ``workers`` threads (the C code releases the GIL);
payloads stored as they are (JPEG, PNG... with ``--compression auto``) are
only checksummed, in the reading thread: two C passes of ~25 us per 120 KB
photo cost less than a hand-off to a thread. Results are written in input
order, so the output bytes do not depend on the worker count. At most ``4 * workers`` samples are in flight,
and the writer spools index and metadata to disk, so peak memory does not
grow with the number of samples. The output is written under a temporary
name and renamed at the end: an interrupted run leaves no ``OUT``.
"""

from __future__ import annotations

import base64
import os
import time
from collections import Counter, deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from json.encoder import encode_basestring as _jstr  # json.dumps' own (C) string encoder
from pathlib import Path
from typing import Any

from warpdata.errors import DataError, UsageError
from warpdata.formats.imageinfo import EXTENSION_FORMATS, image_info
from warpdata.formats.tbl import (
    COMPRESSIONS,
    FORMAT_CODES,
    MAX_DIM,
    EncodedSample,
    TblReader,
    TblWriter,
    canonical_json,
    crc16,
    crc32,
    encode_sample,
    resolve_compression,
)
from warpdata.tbl.tarstream import (
    _WINDOW_BIG,
    _WINDOW_SMALL,
    BLOCK,
    DEFAULT_MAX_MEMBER,
    ZERO_BLOCK,
    Sample,
    TarFormatError,
    group_samples,
    iter_members,
    member_data,
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


_IMAGE_EXT: dict[bytes, bool] = {}
_EXTENDED_TYPES = frozenset(b"LKxg")
_REGULAR_TYPES = frozenset(b"0\x007")


def _is_image_ext(ext: bytes) -> bool:
    got = _IMAGE_EXT.get(ext)
    if got is None:
        e = ext.decode("utf-8", "surrogateescape")
        got = e.lower() in EXTENSION_FORMATS or _ext_format(e) is not None
        if len(_IMAGE_EXT) < 1024:
            _IMAGE_EXT[ext] = got
    return got


def _count_plain(path: str, max_member: int) -> int | None:
    """:func:`count_samples` for the common archive, at ~1 us a member; None to ask the full parser.

    Reads only the headers, from windows of the file read with one pread each
    (a header and the small members after it, as :func:`scan_members` does),
    and groups keys as bytes. Anything beyond plain ustar/GNU regular files
    and directories (PAX or GNU long-name records, base-256 sizes, a member
    over the limit, a cut) returns None and the full parser decides, raising
    its typed errors. The count only places the payloads: were it ever wrong,
    the writer moves them at close (TblWriter ``expected_samples``), so the
    output is the same either way.
    """
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        end = os.fstat(fd).st_size
        if os.pread(fd, 2, 0) == b"\x1f\x8b":
            return None
        pread = os.pread
        pos = n = 0
        key: bytes | None = None
        image = False
        win, win_at, win_end, small = b"", 0, 0, True
        while pos + BLOCK <= end:
            if pos + BLOCK > win_end:
                win = pread(fd, min(_WINDOW_SMALL if small else _WINDOW_BIG, end - pos), pos)
                win_at, win_end, small = pos, pos + len(win), False
                if len(win) < BLOCK:
                    return None
            rel = pos - win_at
            hdr = win[rel:rel + BLOCK]
            typ = hdr[156]
            if typ in _EXTENDED_TYPES or hdr[124] & 0x80:
                return None
            if hdr == ZERO_BLOCK:
                break
            try:  # no checksum test: the conversion pass checks every header and stops at a bad one
                size = int(hdr[124:136].split(b"\0", 1)[0].strip(b" ") or b"0", 8)
            except ValueError:
                return None
            pos += BLOCK + ((size + BLOCK - 1) & -BLOCK)
            if pos > end or size < 0:
                return None
            if pos > win_end:
                small = True  # the next header lies past a big member: a small window will do
            if typ not in _REGULAR_TYPES:
                continue  # directories, links...: skipped, and they do not end a sample
            if size > max_member:
                return None
            name = hdr[:100].split(b"\0", 1)[0]
            if hdr[345] and hdr[257:263] == b"ustar\0":
                name = hdr[345:500].split(b"\0", 1)[0] + b"/" + name
            slash = name.rfind(b"/")
            dot = name.find(b".", slash + 1)
            if dot <= slash + 1:
                continue  # no WebDataset key: skipped
            if name[:dot] != key:
                n += image
                key, image = name[:dot], False
            image = image or _is_image_ext(name[dot + 1:])
        if pos < end and pos + BLOCK > end:
            return None  # a cut header: the full parser names it
        return n + image
    finally:
        os.close(fd)


def count_samples(path: str, max_member: int = DEFAULT_MAX_MEMBER) -> int | None:
    """How many samples a seekable, uncompressed tar holds (headers only), else None."""
    if path == "-":
        return None
    fast = _count_plain(path, max_member)
    if fast is not None:
        return fast
    # header reads + seeks: a small buffer serves the next header of small
    # members without a syscall and costs one 16 KiB read after a big one
    f, size = open_input(path, buffering=16 << 10)
    try:
        if size is None or not f.seekable():
            return None
        n = 0
        for s in group_samples(iter_members(f, with_data=False, max_member=max_member), lambda _n, _r: None):
            n += choose_payload(s) is not None
        return n
    finally:
        f.close()


def _sidecar_metadata(sample: Sample, payload_at: int, on_skip) -> tuple[bytes, int]:
    """The sample's JSON metadata and how many sidecars it carries."""
    key, ext0, m0 = sample.key, *sample.members[payload_at]
    text: dict[str, str] = {}
    binary: dict[str, str] = {}
    for i, (ext, m) in enumerate(sample.members):
        if i == payload_at:
            continue
        if ext in text or ext in binary or ext == ext0:
            on_skip(m.name, f"a second '.{ext}' member in sample {key!r}")
            continue
        data = member_data(m)
        try:
            text[ext] = data.decode("utf-8")
        except UnicodeDecodeError:
            binary[ext] = base64.b64encode(data).decode("ascii")
    meta: dict[str, Any] = {"key": key, "name": m0.name}
    if text:
        meta["sidecars"] = text
    if binary:
        meta["binary"] = binary
    return canonical_json(meta), len(text) + len(binary)


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
    """:func:`_sidecar_metadata` for the converter's member tuples: the JSON and the sidecar count."""
    ext0, name0 = members[payload_at][:2]
    text: dict[str, str] = {}
    binary: dict[str, str] = {}
    for i, (ext, name, size, off, data) in enumerate(members):
        if i == payload_at:
            continue
        if ext in text or ext in binary or ext == ext0:
            on_skip(name, f"a second '.{ext}' member in sample {key!r}")
            continue
        if data is None:
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
    an input that yields no sample raises :class:`~warpdata.errors.DataError`.
    Either way no ``OUT`` is written.
    """
    try:
        return _convert(req, progress, warn)
    except TarFormatError as e:
        where = "stdin" if req.input == "-" else str(req.input)
        raise type(e)(f"{where}: {e.message}", hint=e.hint, **e.details) from None


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
    expected = count_samples(req.input, req.max_member_bytes)
    f, res.tar_bytes = open_input(req.input, buffering=_READ_BUFFER)
    writer = TblWriter(req.output, compression=req.compression, level=req.level, extensions=True,
                       expected_samples=expected, fsync=req.fsync)
    pool = ThreadPoolExecutor(workers, thread_name_prefix="tbl-encode") if workers > 1 else None
    pending: deque = deque()
    window = 4 * workers
    try:  # members that come without their bytes (plain files only, stdin included) are read from here
        fd = f.fileno()
    except (OSError, AttributeError, ValueError):
        fd = -1
    read_to = 0  # tar bytes read so far (uncompressed), for progress
    add_stored = writer.add_stored
    as_is: dict[str, bool] = {}  # image format -> stored as is (no compression) under req.compression

    def drain(limit: int) -> None:
        while len(pending) > limit:
            fut = pending.popleft()
            writer.add_encoded(fut.result() if isinstance(fut, Future) else fut)
            res.samples += 1
            if progress:
                progress(res.samples, read_to)

    def sample(key: str, members: list) -> None:
        """Write one sample: its image member is the payload, the other members its sidecars."""
        at = _payload_at(members)
        if at is None:
            names = ", ".join(m[1] for m in members)
            for m in members:
                on_skip(m[1], f"sample {key!r} has no image member ({names})")
            return
        ext0, name0, size, off, data = members[at]
        in_place = False
        if data is None:  # not read yet: straight into the writer's staging buffer where it offers one
            if pending:
                drain(0)  # the slot is where the next payload goes: everything before it is written
            slot = writer.payload_slot(size)
            if slot is not None:
                read_at_into(fd, slot, off, size, name0)
                data, in_place = slot, True
            else:
                data = read_at(fd, off, size, name0)
        try:
            info = image_info(data, name=name0)
        except DataError as e:
            if req.on_error == "raise":
                raise DataError(f"{req.input}: {e.message}",
                                hint="fix or remove the member, or rerun with --on-error skip (or warn)",
                                member=name0, key=key) from None
            if req.on_error == "warn" and warn:
                warn(f"skipping sample {key!r}: {e.message}")
            for m in members:
                on_skip(m[1], f"bad image header ({e.__class__.__name__})")
            return
        meta, n_side = _sidecars_json(key, members, at, on_skip, fd)
        res.sidecars += n_side
        fmt = info.format
        formats[fmt] += 1
        stored_as_is = as_is.get(fmt)
        if stored_as_is is None:  # as encode_sample decides it, from the format's code (GIF is 0, unknown)
            stored_as_is = as_is[fmt] = resolve_compression(req.compression, FORMAT_CODES.get(fmt, 0)) == "none"
        if stored_as_is:  # checksums only: ~25 us of C per 120 KB photo, less than handing it to a thread
            w, h = info.width, info.height
            w, h = (w if 0 < w <= MAX_DIM else 0), (h if 0 < h <= MAX_DIM else 0)
            if pending:  # compressed samples before it are still in the pool: it waits its turn
                pending.append(EncodedSample(data, size, 0, crc16(data), crc32(data), FORMAT_CODES.get(fmt, 0),
                                             w, h, meta))
                drain(window)
                return
            add_stored(data, size, 0, crc16(data), crc32(data), FORMAT_CODES.get(fmt, 0), w, h, meta)
            res.samples += 1
            if progress:
                progress(res.samples, read_to)
            return
        if in_place:
            data = bytes(data)  # compressed bytes go elsewhere: the slot is only lent until the next write
        kwargs = dict(format=fmt, width=info.width, height=info.height,
                      compression=req.compression, level=req.level, trailer=True, metadata=meta)
        if pool:
            pending.append(pool.submit(encode_sample, data, **kwargs))
        else:
            pending.append(encode_sample(data, **kwargs))
        drain(window)

    try:
        # members come as (name, size, kind, file offset, bytes or None): a big member of a plain
        # file is read only once known to be a payload, straight into the writer's staging buffer
        key: str | None = None
        cur: list = []  # the current sample's members: (ext, name, size, offset, bytes or None)
        for name, size, kind, off, data in scan_members(f, max_member=req.max_member_bytes,
                                                        defer_above=_DEFER_ABOVE):
            res.members += 1
            read_to = off + size
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
                    sample(key, cur)  # type: ignore[arg-type]
                key, cur = k, []
            cur.append((name[dot + 1:], name, size, off, data))
        if cur:
            sample(key, cur)  # type: ignore[arg-type]
        drain(0)
        if not res.samples:
            raise DataError(_no_samples_message(req.input, res, reasons), **_no_samples_hint(res))
        writer.close(warp_metadata=True)
    except BaseException:
        for fut in pending:
            if isinstance(fut, Future):
                fut.cancel()
        writer.abort()
        raise
    finally:
        if pool:
            pool.shutdown(wait=True, cancel_futures=True)
        if req.input != "-":
            f.close()
    res.input_bytes, res.stored_bytes = writer.bytes_in, writer.bytes_stored
    res.compressed_samples = writer.compressed_samples
    res.output_bytes = Path(req.output).stat().st_size
    res.skipped_by_reason = dict(sorted(reasons.items()))
    res.formats = dict(sorted(formats.items()))
    if req.verify:
        with TblReader(req.output, verify=True) as r:
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
