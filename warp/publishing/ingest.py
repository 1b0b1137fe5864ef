"""Walking raw folders and checking each file before it is published.

:func:`walk` yields the entries under a root in a deterministic order
(depth first, each directory's names in bytewise order), one directory
listing in memory at a time (``os.scandir``), so a folder of millions of
files streams. Directories are descended without following symlinks; every
other entry (files, symlinks, FIFOs, sockets) is yielded so that
:func:`check_file` can accept or quarantine it with a reason.

:func:`check_file` accepts a file only when

* its path, after resolving symlinks, stays inside the root (a link out of
  the folder is ``path-outside-root``),
* it is a regular file (``not-regular-file``),
* it is not empty (``empty-content``) and at most ``max_bytes``
  (``too-large``),
* for images: its header parses (``formats/imageinfo.py``; Pillow for
  formats it does not know), a JPEG/PNG is not cut short (``truncated``),
  it declares at most ``max_pixels`` pixels (``too-many-pixels``, a
  decompression bomb) and no more than its bytes can hold
  (``impossible-header``), both from the header alone
  (:func:`warpdata.formats.imageinfo.size_problem`).

Reason codes are the quarantine vocabulary of :mod:`warpdata.etl.quarantine`.
"""

from __future__ import annotations

import hashlib
import itertools
import os
import stat
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from warpdata.core.atomic import TMP_PREFIX
from warpdata.core.errors import DataError, MissingInputError, Rejected, UsageError
from warpdata.etl.quarantine import register_reason
from warpdata.formats.imageinfo import (
    DEFAULT_MAX_PIXELS,
    IMAGE_LIMIT_REASONS,
    ImageHeaderError,
    UnknownImageFormat,
    image_info,
    size_problem,
)
from warpdata.publishing.publish import PublishRequest, publish
from warpdata.registry.manifest import NAME_RE, REF_TYPES, Binding, validate_dataset_id

# lazy third-party imports: pyarrow and PIL (heavy) are imported inside the functions that use
# them, so importing this module loads none of them

__all__ = ["IMAGE_EXTENSIONS", "FileInfo", "IngestOptions", "IngestResult", "Rejected", "check_file",
           "ingest_imagefolder", "ingest_paired", "ingest_table", "walk"]

IMAGE_EXTENSIONS = frozenset({"jpg", "jpeg", "jpe", "png", "webp", "bmp", "dib", "tif", "tiff", "gif"})

for _code, _cat, _help in (
    ("unsupported-extension", "invalid", "the file's extension is not one of the accepted image types"),
    ("unpaired", "missing", "a paired layout has this stem on one side only"),
    ("bad-path", "invalid", "the path holds a NUL byte, which no file name can contain"),
    *IMAGE_LIMIT_REASONS,
):
    register_reason(_code, _cat, _help)


@dataclass(frozen=True)
class FileInfo:
    rel: str  # POSIX path relative to the root: the artifact member name
    size: int
    width: int | None = None
    height: int | None = None
    format: str | None = None
    sha256: str | None = None


def walk(root: str, *, skip: frozenset[str] = frozenset()) -> Iterator[str]:
    """Relative POSIX paths of every non-directory entry under ``root``, in a fixed order.

    ``skip`` names absolute real paths of directories not to descend (e.g. a
    paired mask folder that lives inside the image folder). Names starting
    with '.' (``.DS_Store``, editor droppings) and warp's temporary files are
    not content and are not yielded.
    """
    def listing(d: str, rel: str) -> Iterator[tuple[str, str, bool]]:
        with os.scandir(d) as it:
            entries = sorted(((e.name.encode("utf-8", "surrogateescape"), e) for e in it
                              if not e.name.startswith((".", TMP_PREFIX))), key=lambda t: t[0])
        for _, e in entries:
            is_dir = e.is_dir(follow_symlinks=False)
            if not (is_dir and os.path.realpath(e.path) in skip):
                yield e.path, rel + e.name, is_dir

    stack = [listing(root, "")]  # one sorted listing per open directory: depth-first in name order
    while stack:
        nxt = next(stack[-1], None)
        if nxt is None:
            stack.pop()
            continue
        path, rel, is_dir = nxt
        if is_dir:
            stack.append(listing(path, rel + "/"))
        else:
            yield rel


def _image_dims(data: bytes, rel: str, max_pixels: int = DEFAULT_MAX_PIXELS) -> tuple[str, int, int]:
    try:
        info = image_info(data, "image")
    except ImageHeaderError as e:
        raise Rejected("decode-error", e.message) from None
    except UnknownImageFormat:
        import io
        import warnings

        from PIL import Image, UnidentifiedImageError

        try:  # formats imageinfo.py does not parse (e.g. TGA, PPM): Pillow's header check
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", Image.DecompressionBombWarning)  # our own cap decides below
                with Image.open(io.BytesIO(data)) as im:
                    fmt, w, h = (im.format or "unknown").lower(), int(im.size[0]), int(im.size[1])
                    if w * h <= max_pixels:
                        im.verify()
        except Image.DecompressionBombError as e:
            raise Rejected("too-many-pixels", f"{e}") from None
        except (UnidentifiedImageError, OSError, ValueError, SyntaxError) as e:
            raise Rejected("decode-error", f"not a readable image: {e}") from None
        bad = size_problem(fmt, w, h, len(data), max_pixels)
        if bad:
            raise Rejected(*bad) from None
        return fmt, w, h
    bad = size_problem(info.format, info.width, info.height, len(data), max_pixels, data)
    if bad:
        raise Rejected(*bad)
    if info.width <= 0 or info.height <= 0:
        raise Rejected("decode-error", f"{info.format.upper()} header gives an empty size {info.width}x{info.height}")
    tail = data[-64:]
    if info.format == "jpeg" and b"\xff\xd9" not in tail:
        raise Rejected("truncated", f"JPEG has no end-of-image marker ({len(data)} bytes): truncated")
    if info.format == "png" and b"IEND" not in tail:
        raise Rejected("truncated", f"PNG has no IEND chunk ({len(data)} bytes): truncated")
    return info.format, info.width, info.height


def check_file(root_real: str, rel: str, *, max_bytes: int, image: bool = True,
               want_hash: bool = False, max_pixels: int = DEFAULT_MAX_PIXELS) -> FileInfo:
    """Check ``rel`` under the real path ``root_real``; raise :class:`Rejected` with a reason."""
    if "\x00" in rel:  # the OS refuses such a name (ValueError from every os call): this row only
        raise Rejected("bad-path", f"{rel!r} holds a NUL byte; no file can have that name")
    parts = rel.split("/")
    if rel.startswith("/") or ".." in parts or "" in parts:
        raise Rejected("path-outside-root", f"{rel!r} is not a relative path inside {root_real}")
    real = os.path.realpath(os.path.join(root_real, rel))
    if not real.startswith(root_real.rstrip("/") + "/"):
        raise Rejected("path-outside-root", f"resolves to {real}, outside {root_real}")
    try:
        st = os.stat(real)
    except FileNotFoundError:
        raise Rejected("missing-file", "does not exist (or is a dangling symlink)") from None
    except OSError as e:
        raise Rejected("unreadable", f"cannot be stat'ed: {e.strerror}") from None
    if not stat.S_ISREG(st.st_mode):
        raise Rejected("not-regular-file", f"is a {_kind(st.st_mode)}, not a regular file")
    if st.st_size == 0:
        raise Rejected("empty-content", "is empty (0 bytes)")
    if st.st_size > max_bytes:
        raise Rejected("too-large", f"is {st.st_size} bytes, over the cap of {max_bytes}")
    if image:
        ext = rel.rsplit(".", 1)[-1].lower() if "." in rel.rsplit("/", 1)[-1] else ""
        if ext not in IMAGE_EXTENSIONS:
            raise Rejected("unsupported-extension",
                           f"extension {('.' + ext) if ext else '(none)'} is not an image type "
                           f"({', '.join(sorted(IMAGE_EXTENSIONS))})")
    if not image and not want_hash:
        return FileInfo(rel, st.st_size)
    try:
        with open(real, "rb") as f:
            data = f.read(st.st_size + 1)  # read(n) allocates n bytes up front: the size, not the cap
    except OSError as e:
        raise Rejected("unreadable", f"cannot be read: {e.strerror}") from None
    if len(data) != st.st_size:
        raise Rejected("unreadable", f"changed while being read ({st.st_size} bytes stat'ed, {len(data)} read)")
    fmt = w = h = None
    if image:
        fmt, w, h = _image_dims(data, rel, max_pixels)
    digest = hashlib.sha256(data).hexdigest() if want_hash else None
    return FileInfo(rel, st.st_size, w, h, fmt, digest)


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "directory"), (stat.S_ISFIFO, "FIFO"), (stat.S_ISSOCK, "socket"),
                       (stat.S_ISCHR, "character device"), (stat.S_ISBLK, "block device")):
        if test(mode):
            return name
    return "special file"


# -- layouts -> tables -> publish ------------------------------------------------
#
# Each layout streams its entries through check_file, writes the `main` rows and
# the `quarantine` rows into Parquet in row groups (memory bounded by one group),
# collects the accepted member names, and hands tables + artifacts + bindings to
# the registry's publish transaction (warp/publishing/publish.py), so the version
# is exactly what `warp publish` makes of the same tables and members.

GROUP_ROWS = 65536
CHECK_WINDOW = 512  # files checked concurrently (hashing and header parsing release the GIL)
DEFAULT_MAX_BYTES = 256 << 20
QUARANTINE_COLUMNS = ("source", "path", "reason", "message")


@dataclass
class IngestOptions:
    dataset_id: str
    store_url: str | None = None
    set_latest: bool = True
    dry_run: bool = False
    shard_size: int | None = None
    workers: int = 8
    max_bytes: int = DEFAULT_MAX_BYTES
    max_pixels: int = DEFAULT_MAX_PIXELS  # images declaring more are quarantined (too-many-pixels)
    keep_dir: str | None = None  # write the tables here (kept) instead of a temporary folder
    rehash: bool = False
    description: str | None = None


@dataclass
class IngestResult:
    layout: str
    rows: int
    quarantined: int
    reasons: dict[str, int]
    examples: list[dict[str, str]]
    tables: dict[str, str]  # name -> Parquet path (only meaningful with keep_dir)
    publish: Any  # warpdata.publishing.publish.PublishResult

    def to_dict(self) -> dict[str, Any]:
        d = {"layout": self.layout, "rows": self.rows, "quarantined": self.quarantined,
             "reasons": dict(sorted(self.reasons.items())), "quarantine_examples": self.examples}
        pub = self.publish.to_dict()
        d.update({k: v for k, v in pub.items() if v is not None or k == "latest"})
        return d


class _ParquetRows:
    """Rows appended one at a time, written as Parquet row groups of GROUP_ROWS."""

    def __init__(self, path: str, schema) -> None:
        import pyarrow.parquet as pq

        self.path = path
        self.schema = schema
        self.cols: list[list[Any]] = [[] for _ in schema.names]
        self.rows = 0
        self.writer = pq.ParquetWriter(path, schema, compression="zstd")

    def add(self, *values: Any) -> None:
        for col, v in zip(self.cols, values, strict=True):
            col.append(v)
        if len(self.cols[0]) >= GROUP_ROWS:
            self.flush()

    def add_batch(self, batch) -> None:
        self.flush()
        if batch.num_rows:
            self.writer.write_batch(batch, row_group_size=GROUP_ROWS)
            self.rows += batch.num_rows

    def flush(self) -> None:
        import pyarrow as pa

        if self.cols[0]:
            n = len(self.cols[0])
            self.writer.write_batch(pa.RecordBatch.from_arrays(
                [pa.array(c, type=f.type) for c, f in zip(self.cols, self.schema, strict=True)], schema=self.schema))
            self.rows += n
            self.cols = [[] for _ in self.schema.names]

    def close(self) -> int:
        self.flush()
        self.writer.close()
        return self.rows


class _Quarantine:
    def __init__(self, path: str) -> None:
        import pyarrow as pa

        self.rows = _ParquetRows(path, pa.schema([(c, pa.string()) for c in QUARANTINE_COLUMNS]))
        self.reasons: dict[str, int] = {}
        self.examples: list[dict[str, str]] = []

    def add(self, source: str, path: str, reason: str, message: str) -> None:
        self.rows.add(source, path, reason, message)
        self.reasons[reason] = self.reasons.get(reason, 0) + 1
        if len(self.examples) < 10:
            self.examples.append({"source": source, "path": path, "reason": reason, "message": message})


def _checked(rels: Iterable[str], check: Callable[[str], FileInfo], workers: int
             ) -> Iterator[tuple[str, FileInfo | Rejected]]:
    """``(rel, FileInfo or Rejected)`` for each path, in input order, a bounded window at a time."""
    from concurrent.futures import ThreadPoolExecutor

    def one(rel: str) -> FileInfo | Rejected:
        try:
            return check(rel)
        except Rejected as r:
            return r

    it = iter(rels)
    with ThreadPoolExecutor(max_workers=max(1, workers)) as ex:
        while True:
            window = list(itertools.islice(it, CHECK_WINDOW))
            if not window:
                return
            yield from zip(window, ex.map(one, window), strict=True)


def _root(path: str, what: str) -> str:
    if not os.path.isdir(path):
        raise MissingInputError(f"{path} is not a directory", hint=f"give the {what} folder to ingest")
    return os.path.realpath(path)


def _stem_key(rel: str) -> str:
    head, _, name = rel.rpartition("/")
    stem = name.rsplit(".", 1)[0] if "." in name[1:] else name
    return f"{head}/{stem}" if head else stem


class _Workspace:
    """Where the tables are written: ``keep_dir`` or a temporary folder removed afterwards."""

    def __init__(self, keep_dir: str | None) -> None:
        self.keep = keep_dir
        if keep_dir:
            os.makedirs(keep_dir, exist_ok=True)
            self.dir = keep_dir
        else:
            import tempfile

            self.dir = tempfile.mkdtemp(prefix="warp-ingest-")

    def path(self, name: str) -> str:
        return os.path.join(self.dir, f"{name}.parquet")

    def close(self) -> None:
        if not self.keep:
            import shutil

            shutil.rmtree(self.dir, ignore_errors=True)


def _publish(layout: str, opts: IngestOptions, ws: _Workspace, rows: int, q: _Quarantine,
             artifacts: dict[str, tuple[str, list[str]]], bindings: list[tuple[str, str, str]],
             on_upload: Callable[[int], None] | None) -> IngestResult:
    qrows = q.rows.close()
    if rows == 0:
        top = ", ".join(f"{k}: {v}" for k, v in sorted(q.reasons.items(), key=lambda kv: -kv[1])) or "no files found"
        ex = q.examples[0] if q.examples else None
        raise DataError(f"{layout} ingest of {opts.dataset_id}: no valid file to publish ({qrows} quarantined; {top})"
                        + (f"; e.g. {ex['path']}: {ex['message']}" if ex else ""),
                        hint="check the folder and the options (--max-file-size, --file-column, --root)")
    tables = {"main": [ws.path("main")]}
    if qrows:
        tables["quarantine"] = [ws.path("quarantine")]
    req = PublishRequest(opts.dataset_id, tables=tables,
                         artifacts={n: root for n, (root, _) in artifacts.items()},
                         artifact_files={n: files for n, (_, files) in artifacts.items()},
                         bindings=[Binding(*col.split(".", 1), art, ref) for col, art, ref in bindings],
                         set_latest=opts.set_latest, dry_run=opts.dry_run, store_url=opts.store_url,
                         workers=opts.workers, rehash=opts.rehash, description=opts.description)
    if opts.shard_size:
        req.shard_size = opts.shard_size
    result = publish(req, on_upload=on_upload)
    return IngestResult(layout, rows, qrows, q.reasons, q.examples,
                        {k: v[0] for k, v in tables.items()}, result)


def ingest_imagefolder(root: str, opts: IngestOptions, *, id_mode: str = "path", pair: str | None = None,
                       on_file: Callable[[int], None] | None = None,
                       on_upload: Callable[[int], None] | None = None) -> IngestResult:
    """``ROOT/<label>/<file>`` -> ``main`` (id, label, image, width, height, bytes[, mask]) + ``images``."""
    import pyarrow as pa

    if id_mode not in ("stem", "path", "hash"):
        raise UsageError(f"--id {id_mode!r} is not one of stem, path, hash", hint="e.g. --id path")
    validate_dataset_id(opts.dataset_id)
    root_real = _root(root, "image")
    pair_real = _root(pair, "paired mask") if pair else None
    masks: dict[str, str | None] = {}
    if pair_real:
        for rel in walk(pair_real):  # relative path without suffix -> member (None: ambiguous)
            k = _stem_key(rel)
            masks[k] = None if k in masks else rel
            s = rel.rsplit("/", 1)[-1]
            s = _stem_key(s)
            masks.setdefault("\0" + s, rel)  # by bare stem, for masks/ flat beside class folders
    fields = [("id", pa.string()), ("label", pa.string()), ("image", pa.string()), ("width", pa.int32()),
              ("height", pa.int32()), ("bytes", pa.int64())] + ([("mask", pa.string())] if pair_real else [])
    ws = _Workspace(opts.keep_dir)
    try:
        main = _ParquetRows(ws.path("main"), pa.schema(fields))
        q = _Quarantine(ws.path("quarantine"))
        seen: set[str] = set()
        members: list[str] = []
        mask_members: list[str] = []

        def check(rel: str) -> FileInfo:
            return check_file(root_real, rel, max_bytes=opts.max_bytes, want_hash=id_mode == "hash",
                              max_pixels=opts.max_pixels)

        skip = frozenset({pair_real}) if pair_real else frozenset()
        for rel, got in _checked(walk(root_real, skip=skip), check, opts.workers):
            if on_file:
                on_file(1)
            if isinstance(got, Rejected):
                q.add("images", rel, got.reason, got.message)
                continue
            sid = {"stem": lambda g: _stem_key(g.rel).rsplit("/", 1)[-1], "path": lambda g: g.rel,
                   "hash": lambda g: g.sha256}[id_mode](got)
            if sid in seen:
                q.add("images", rel, "duplicate", f"id {sid!r} ({id_mode}) was already taken by an earlier file; "
                      "use --id path to keep both")
                continue
            mrel = None
            if pair_real:
                mrel = masks.get(_stem_key(rel))
                if mrel is None:
                    mrel = masks.get("\0" + _stem_key(rel).rsplit("/", 1)[-1])
                if mrel is None:
                    q.add("images", rel, "unpaired", f"no single file with its stem in {pair}")
                    continue
                try:
                    check_file(pair_real, mrel, max_bytes=opts.max_bytes, max_pixels=opts.max_pixels)
                except Rejected as r:
                    q.add("masks", mrel, r.reason, f"{r.message} (mask of {rel})")
                    continue
                mask_members.append(mrel)
            seen.add(sid)
            label = rel.rsplit("/", 2)[-2] if "/" in rel else None
            main.add(sid, label, rel, got.width, got.height, got.size, *([mrel] if pair_real else []))
            members.append(rel)
        rows = main.close()
        artifacts = {"images": (root, members)}
        bindings = [("main.image", "images", "image")]
        if pair_real:
            artifacts["masks"] = (pair, sorted(set(mask_members)))
            bindings.append(("main.mask", "masks", "image"))
        return _publish("imagefolder", opts, ws, rows, q, artifacts, bindings, on_upload)
    finally:
        ws.close()


def ingest_paired(a: str, b: str, opts: IngestOptions, *, names: tuple[str, str] | None = None,
                  image: bool = True, on_file: Callable[[int], None] | None = None,
                  on_upload: Callable[[int], None] | None = None) -> IngestResult:
    """Two folders matched by relative path without suffix -> ``main`` (id, A, B, width, height, bytes)."""
    import pyarrow as pa

    validate_dataset_id(opts.dataset_id)
    a_real, b_real = _root(a, "first"), _root(b, "second")
    if names is None:
        na, nb = os.path.basename(a_real), os.path.basename(b_real)
        names = (na, nb) if na != nb and all(NAME_RE.match(n) and n not in ("id", "width", "height", "bytes")
                                              for n in (na, nb)) else ("a", "b")
    na, nb = names
    for n in names:
        if not NAME_RE.match(n) or n in ("id", "width", "height", "bytes"):
            raise UsageError(f"--names: {n!r} cannot name a column and an artifact",
                             hint="use letters, digits, '_', '.', '-' (not id/width/height/bytes), e.g. --names image,mask")
    if na == nb:
        raise UsageError(f"--names gives {na!r} twice", hint="e.g. --names image,mask")
    other: dict[str, str | None] = {}
    for rel in walk(b_real):
        k = _stem_key(rel)
        other[k] = None if k in other else rel  # None: two files share the stem
    schema = pa.schema([("id", pa.string()), (na, pa.string()), (nb, pa.string()), ("width", pa.int32()),
                        ("height", pa.int32()), ("bytes", pa.int64())])
    ws = _Workspace(opts.keep_dir)
    try:
        main = _ParquetRows(ws.path("main"), schema)
        q = _Quarantine(ws.path("quarantine"))
        seen: set[str] = set()
        ma: list[str] = []
        mb: list[str] = []

        def check(rel: str) -> FileInfo:
            return check_file(a_real, rel, max_bytes=opts.max_bytes, image=image, max_pixels=opts.max_pixels)

        skip = frozenset({b_real})
        for rel, got in _checked(walk(a_real, skip=skip), check, opts.workers):
            if on_file:
                on_file(1)
            k = _stem_key(rel)
            if isinstance(got, Rejected):
                q.add(na, rel, got.reason, got.message)
                other.pop(k, None)
                continue
            if k in seen:
                q.add(na, rel, "duplicate", f"stem {k!r} is taken by another file in {a}")
                continue
            seen.add(k)
            if k not in other:
                q.add(na, rel, "unpaired", f"no file with stem {k!r} in {b}")
                continue
            brel = other.pop(k)
            if brel is None:
                q.add(nb, k, "duplicate", f"several files in {b} have stem {k!r}")
                continue
            try:
                check_file(b_real, brel, max_bytes=opts.max_bytes, image=image, max_pixels=opts.max_pixels)
            except Rejected as r:
                q.add(nb, brel, r.reason, f"{r.message} (pair of {rel})")
                continue
            main.add(k, rel, brel, got.width, got.height, got.size)
            ma.append(rel)
            mb.append(brel)
        for k in sorted(other):
            if other[k] is not None:
                q.add(nb, other[k], "unpaired", f"no file with stem {k!r} in {a}")
        rows = main.close()
        ref = "image" if image else "file"
        return _publish("paired", opts, ws, rows, q, {na: (a, ma), nb: (b, mb)},
                        [(f"main.{na}", na, ref), (f"main.{nb}", nb, ref)], on_upload)
    finally:
        ws.close()


TABLE_READERS = {".csv": "csv", ".parquet": "parquet", ".pq": "parquet", ".jsonl": "jsonl",
                 ".ndjson": "jsonl", ".json": "jsonl"}


def _batches(path: str) -> Iterator[Any]:
    """Record batches of a CSV, JSONL or Parquet file (CSV and Parquet stream)."""
    fmt = TABLE_READERS.get(os.path.splitext(path)[1].lower())
    if fmt is None:
        raise UsageError(f"{path}: not a .csv, .jsonl or .parquet file", hint="give a CSV, JSONL or Parquet table")
    if not os.path.isfile(path):
        raise MissingInputError(f"{path} does not exist", hint="give the table that lists the files")
    try:
        if fmt == "csv":
            import pyarrow.csv as pacsv

            yield from pacsv.open_csv(path)
        elif fmt == "parquet":
            import pyarrow.parquet as pq

            yield from pq.ParquetFile(path).iter_batches(batch_size=GROUP_ROWS)
        else:
            import pyarrow.json as pajson

            yield from pajson.read_json(path).to_batches(max_chunksize=GROUP_ROWS)
    except (OSError, ValueError) as e:  # pyarrow's ArrowInvalid is a ValueError
        raise DataError(f"{path}: cannot be read as {fmt.upper()}: {e}",
                        hint="fix the file, or convert it to Parquet yourself") from None


def _member_path(v: str, root_real: str, root: str) -> str:
    """A table's file value as a member path relative to the root (absolute paths under it made relative)."""
    p = v.replace(os.sep, "/") if os.sep != "/" else v
    if os.path.isabs(p):
        rp = os.path.abspath(p)
        if rp.startswith(root_real + "/"):
            return rp[len(root_real) + 1:]
        ra = os.path.abspath(root)
        if rp.startswith(ra + "/"):
            return rp[len(ra) + 1:]
        return p  # check_file reports it as path-outside-root
    while p.startswith("./"):
        p = p[2:]
    return p


def ingest_table(path: str, opts: IngestOptions, *, file_columns: list[str], root: str,
                 ref_type: str = "image", artifact: str | None = None,
                 on_file: Callable[[int], None] | None = None,
                 on_upload: Callable[[int], None] | None = None) -> IngestResult:
    """A CSV/JSONL/Parquet table whose ``file_columns`` name files under ``root``.

    Rows whose files all pass :func:`check_file` are kept (file columns rewritten
    to member paths relative to ``root``); the others go to ``quarantine`` with
    their row number.
    """
    import pyarrow as pa

    validate_dataset_id(opts.dataset_id)
    if ref_type not in REF_TYPES:
        raise UsageError(f"--type {ref_type!r} is not one of {', '.join(REF_TYPES)}", hint="e.g. --type image")
    used: set[str] = set()  # members named by a kept row
    if not file_columns:
        raise UsageError("no --file-column given", hint="name the column(s) holding file paths, e.g. --file-column image")
    root_real = _root(root, "--root")
    artifact = artifact or ("images" if ref_type == "image" else "files")
    image = ref_type == "image"
    known: dict[str, FileInfo | Rejected] = {}
    ws = _Workspace(opts.keep_dir)
    try:
        q = _Quarantine(ws.path("quarantine"))
        main: _ParquetRows | None = None
        row0 = 0

        def norm(v: str) -> str:
            return _member_path(v, root_real, root)

        def check(rel: str) -> FileInfo:
            return check_file(root_real, rel, max_bytes=opts.max_bytes, image=image, max_pixels=opts.max_pixels)

        for batch in _batches(path):
            names = batch.schema.names
            missing = [c for c in file_columns if c not in names]
            if missing:
                raise UsageError(f"{path}: no column {', '.join(map(repr, missing))}",
                                 hint=f"columns: {', '.join(names)}")
            cols = {c: batch.column(c).cast(pa.string()).to_pylist() for c in file_columns}
            fresh = sorted({norm(v) for vals in cols.values() for v in vals if v} - known.keys())
            for rel, got in _checked(fresh, check, opts.workers):
                if on_file:
                    on_file(1)
                known[rel] = got
            keep: list[int] = []
            for i in range(batch.num_rows):
                bad = None
                for c in file_columns:
                    v = cols[c][i]
                    if not v:
                        bad = (c, "", "missing-file", f"row {row0 + i}: column {c!r} is empty")
                        break
                    got = known[norm(v)]
                    if isinstance(got, Rejected):
                        bad = (c, v, got.reason, f"row {row0 + i}: {got.message}")
                        break
                if bad:
                    q.add(f"row {row0 + i}", bad[1], bad[2], bad[3])
                else:
                    keep.append(i)
                    used.update(norm(cols[c][i]) for c in file_columns)
            take = pa.array(keep, type=pa.int64())
            arrays, fields = [], []
            for f, col in zip(batch.schema, batch.columns, strict=True):
                if f.name in file_columns:  # file columns become member paths relative to the root
                    col, f = pa.array([norm(v) if v else v for v in cols[f.name]], type=pa.string()), \
                        pa.field(f.name, pa.string())
                arrays.append(col.take(take))
                fields.append(f)
            kept = pa.RecordBatch.from_arrays(arrays, schema=pa.schema(fields))
            if main is None:
                main = _ParquetRows(ws.path("main"), kept.schema)
            elif kept.schema != main.schema:
                try:
                    kept = kept.cast(main.schema)
                except (ValueError, TypeError, NotImplementedError):
                    raise DataError(f"{path}: rows from {row0} have columns {kept.schema} but earlier rows had "
                                    f"{main.schema}", hint="give the table consistent column types") from None
            main.add_batch(kept)
            row0 += batch.num_rows
        if main is None:
            raise DataError(f"{path}: the table has no rows", hint="give a table listing files")
        rows = main.close()
        members = sorted(used)
        return _publish("table", opts, ws, rows, q, {artifact: (root, members)},
                        [(f"main.{c}", artifact, ref_type) for c in file_columns], on_upload)
    finally:
        ws.close()
