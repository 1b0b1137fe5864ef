"""``warp etl`` for arrays: ``[source] format = "raw" | "npy"`` → Zarr v3 (pyramid).

The input (a file, or ``-`` for stdin) is streamed through a
:class:`~warpdata.tiles.writer.TileWriter` straight into its slab buffers
(``readinto``, no intermediate copy); nothing holds the whole array. Raw
input is little-endian C-order bytes of ``[source] shape`` / ``dtype``;
``.npy`` input carries its own shape and dtype in its header. Relative paths
are relative to the config file.

Local outputs are built in a temporary sibling directory and put in place
when complete, swapped with an existing output in one step
(``warpdata.tiles.replace``); an existing output with the same recipe and the same
input (CRC-32C of the input bytes, recorded in its manifest) is reused
unless ``--clear``. S3 outputs are written object by object, ``zarr.json``
and ``manifest.json`` last; an existing S3 output is replaced only with
``--clear``.

``--executor`` / ``[build] executor`` / ``WARP_EXECUTOR`` other than ``local``
run :class:`RangeTask` s (row ranges whole at every pyramid level, each read
from the input by the worker: a shared path or ``s3://``) on a process pool,
Dask or Ray; the driver commits the metadata. The tree is byte-identical to
the local executor's (docs/formats/zarr-tiles.md, "On an executor").

Every range that finishes gets a create-only receipt (its task hash and the
SHA-256 digests of the objects it wrote) in the build directory
``.warp-tmp-build-<hash12>-<name>`` or beside an ``s3://`` output; a rerun after
``kill -9`` rebuilds only the ranges without a receipt whose objects still hash
to it (docs/formats/receipts.md, "Tiled arrays"). Standard input has no journal.
"""

from __future__ import annotations

import io
import json
import logging
import os
import sys
import time
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

from warpdata.core import progress as _progress
from warpdata.core.config import Field, validate
from warpdata.core.errors import (
    ConfigError,
    DataError,
    InfrastructureError,
    InternalError,
    MissingInputError,
    UsageError,
)
from warpdata.core.names import MANIFEST_NAME, ZARR_ARRAY
from warpdata.etl import buildconfig
from warpdata.etl.pipelines import EtlRequest, EtlResult
from warpdata.tiles.pyramid import METHODS

log = logging.getLogger(__name__)

RECIPE_VERSION = 1
READ_BLOCK = 8 << 20  # read-ahead of an object-store input
HEADER_BLOCK = 64 << 10
TASK_BYTES = 64 << 20  # input bytes per range task, about (docs/formats/zarr-tiles.md, "On an executor")


def _positive_list(v: list) -> str | None:
    return None if v and all(isinstance(x, int) and not isinstance(x, bool) and x > 0 for x in v) else \
        "must be a non-empty list of positive integers"


def _shards(v: Any) -> str | None:
    if isinstance(v, str):
        return None if v in ("auto", "none") else "must be \"auto\", \"none\" or a list of sizes"
    return _positive_list(v)


def _level(v: int) -> str | None:
    return None if 1 <= v <= 22 else "must be between 1 and 22"


SCHEMA = {
    "source": {
        "format": Field(str, choices=("raw", "npy"), help="raw little-endian bytes, or a .npy file"),
        "path": Field(str, default=None, help="input file ('-' = stdin); relative to the config file"),
        "shape": Field(list, default=None, item_type=int, help="array shape, slowest dimension first (raw input)"),
        "dtype": Field(str, default=None, help="u8, u16, u32, f32 or f64 (raw input)"),
    },
    "output": {
        "path": Field(str, default=None, help="output directory or s3://bucket/prefix"),
        "axes": Field(list, default=None, item_type=str, help="dimension names, e.g. [\"z\", \"y\", \"x\"]"),
    },
    "tiles": {
        "chunks": Field(list, item_type=int, check=_positive_list, help="tile (chunk) shape, one size per dimension"),
        "shards": Field((list, str), default="auto", check=_shards,
                        help="shard shape, \"auto\" (<= 64 MiB) or \"none\" for one object per chunk"),
        "level": Field(int, default=1, check=_level, help="zstd level (1 is fastest)"),
        "backend": Field(str, default="auto", env="WARP_BACKEND", help="auto, cpu or gpu"),
        "fill_value": Field((int, float), default=0, help="value of padding in edge chunks"),
        "threads": Field(int, default=0, help="CPU compression threads (0 = WARP_WORKERS or all cores)"),
    },
    "build": buildconfig.build_schema(buildconfig.TILES),
    "multiscale": {
        "levels": Field(int, default=1, check=lambda v: None if 1 <= v <= 32 else "must be between 1 and 32",
                        help="pyramid levels (1 = full resolution only)"),
        "method": Field(str, default="median", choices=METHODS, help="2x downsampling filter"),
    },
}


def _resolve(path: str, base: Path) -> str:
    if path == "-" or "://" in path or os.path.isabs(path):
        return path
    return str((base / path).resolve())


class _Input:
    """The input stream plus the shape/dtype it carries."""

    def __init__(self, fmt: str, path: str, shape, dtype, where, block: int = READ_BLOCK) -> None:
        from warpdata.formats.tiling import normalize_dtype

        self.path = path
        self.name = "stdin" if path == "-" else path
        self.url = "://" in path and not path.startswith("file://")
        if path == "-":
            self.f: BinaryIO = sys.stdin.buffer
            self.size = None
        elif self.url:
            from warpdata.storage.locations import filesystem, parse_location

            loc = parse_location(path)
            fs = filesystem(loc)
            try:
                info = fs.info(loc.path)
                self.size = int(info["size"])
                self.etag = str(info.get("ETag") or info.get("etag") or "")
                self.f = fs.open(loc.path, "rb", block_size=block)
            except FileNotFoundError:
                raise MissingInputError(f"input {path} does not exist", hint="check [source] path or --input") from None
        else:
            try:
                self.f = open(path, "rb", buffering=0)  # noqa: SIM115 (closed in close())
            except FileNotFoundError:
                raise MissingInputError(f"input {path} does not exist", hint="check [source] path or --input") from None
            except IsADirectoryError:
                raise ConfigError(f"input {path} is a directory", hint="point [source] path at a file") from None
            self.size = os.fstat(self.f.fileno()).st_size
        header = 0
        self.fmt = fmt
        if fmt == "npy":
            shape, dtype, header = self._npy_header(shape, dtype, where)
        else:
            if shape is None:
                raise ConfigError(f"{where('source')}: raw input needs [source] shape",
                                  hint="add shape = [Z, Y, X] (slowest dimension first) under [source]")
            if dtype is None:
                raise ConfigError(f"{where('source')}: raw input needs [source] dtype",
                                  hint="add dtype = \"u16\" (u8, u16, u32, f32, f64) under [source]")
        self.shape = tuple(int(s) for s in shape)
        self.dtype = normalize_dtype(dtype)
        expected = int(self.dtype.itemsize)
        for s in self.shape:
            expected *= s
        self.expected = expected
        self.header = header  # bytes before the array's first element
        if self.size is not None and self.size - header != expected:
            raise DataError(f"{self.name}: holds {self.size - header} data bytes but shape {list(self.shape)} "
                            f"{self.dtype.name} needs {expected}",
                            hint="fix [source] shape/dtype to match the file", path=self.name)

    def _npy_header(self, shape, dtype, where):
        import numpy as np
        from numpy.lib import format as npformat

        f = self.f if isinstance(self.f, io.BufferedIOBase) or self.url else \
            io.BufferedReader(self.f)  # type: ignore[arg-type]
        self.f = f
        try:
            major, _minor = npformat.read_magic(f)
            reader = npformat.read_array_header_1_0 if major == 1 else npformat.read_array_header_2_0
            npshape, fortran, npdtype = reader(f)
        except ValueError as e:
            raise DataError(f"{self.name}: not a valid .npy file ({e})", hint="write it with numpy.save",
                            path=self.name) from None
        if fortran:
            raise DataError(f"{self.name}: the .npy array is in Fortran order",
                            hint="save it with np.save(path, np.ascontiguousarray(a))", path=self.name)
        if shape is not None and tuple(shape) != tuple(npshape):
            raise ConfigError(f"{where('source.shape')}: shape {shape} does not match the .npy header {list(npshape)}",
                              hint="remove [source] shape (npy files carry their own)")
        from warpdata.formats.tiling import normalize_dtype

        if dtype is not None and normalize_dtype(dtype) != normalize_dtype(np.dtype(npdtype)):
            raise ConfigError(f"{where('source.dtype')}: dtype {dtype} does not match the .npy header {np.dtype(npdtype)}",
                              hint="remove [source] dtype (npy files carry their own)")
        return npshape, np.dtype(npdtype), f.tell()

    def readinto(self, mv: memoryview) -> int:
        return self.f.readinto(mv) or 0

    def fingerprint(self) -> dict[str, Any]:
        """What names this input's version for the receipts journal: path, size and mtime (a file),
        URL, size and ETag (an object). docs/formats/receipts.md, "Tiled arrays"."""
        if self.url:
            return {"url": self.path, "size": self.size, "etag": getattr(self, "etag", "")}
        st = os.fstat(self.f.fileno())
        return {"path": os.path.realpath(self.path), "size": st.st_size, "mtime_ns": st.st_mtime_ns}

    def close(self) -> None:
        if self.path != "-":
            self.f.close()


def _stream(inp: _Input, writer, bar) -> None:
    """Move every byte of the input into the writer's slab buffers."""
    while True:
        mv = writer.reserve()
        if mv is None:
            if writer.bytes_received >= writer.bytes_expected:
                break
            writer.wait()
            continue
        n = inp.readinto(mv)
        if n == 0:
            break
        writer.commit(n)
        bar.advance(n)
    if writer.bytes_received == writer.bytes_expected and inp.readinto(memoryview(bytearray(1))):
        raise DataError(f"{inp.name}: input continues past the {writer.bytes_expected} bytes of shape "
                        f"{list(writer.geometry.shape)} {writer.geometry.dtype.name}",
                        hint="fix [source] shape/dtype to match the input", path=inp.name)


def _input_crc(path: str, skip: int = 0) -> str:
    """CRC-32C of the array's bytes: the file past its first ``skip`` bytes (a .npy header)."""
    import numpy as np
    from warpdata.formats import crc as crc32c

    crc = 0
    buf = np.empty(8 << 20, dtype=np.uint8)
    mv = memoryview(buf)
    if "://" in path and not path.startswith("file://"):  # an input on object storage: one streamed read
        from warpdata.storage.locations import filesystem, parse_location

        loc = parse_location(path)
        opened = filesystem(loc).open(loc.path, "rb", block_size=8 << 20)
    else:
        opened = open(path, "rb", buffering=0)  # noqa: SIM115 (closed by the with below)
    with opened as f:
        f.seek(skip)
        while n := f.readinto(mv):
            crc = crc32c.extend(crc, buf[:n])
    return f"{crc:08x}"


def run(req: EtlRequest) -> EtlResult:
    from warpdata.core.canonical import identity
    from warpdata.kernels import resolve as resolve_backend
    from warpdata.storage.locations import parse_location

    buildconfig.check_build_keys(req.config, buildconfig.TILES, req.source)
    cfg = validate(req.config, SCHEMA, req.source)
    where = req.source.where
    base = Path(req.config_path).resolve().parent
    if req.input is not None:
        src_path = req.input if req.input == "-" or "://" in req.input else os.path.abspath(req.input)
    elif cfg["source"]["path"] is None:
        raise ConfigError(f"{where('source')}: missing [source] path", hint="add path = \"volume.raw\" or pass --input")
    else:
        src_path = _resolve(cfg["source"]["path"], base)
    out_url = req.output if req.output is not None else cfg["output"]["path"]
    if out_url is None:
        raise ConfigError(f"{where('output')}: missing [output] path", hint="add [output] path = \"volume.zarr\" or pass --output")
    if req.output is None:
        out_url = _resolve(out_url, base)
    tiles = cfg["tiles"]
    shards = tiles["shards"]
    shards = None if shards == "none" else shards
    backend_name = resolve_backend(tiles["backend"])
    from warpdata.etl.executors import require, resolve_executor
    from warpdata.etl.workers import resolve_workers

    build = cfg["build"]
    executor = resolve_executor(req.executor, build["executor"] or None)
    require(executor)
    if executor.kind == "thread":
        # one process: its compression threads are the workers (--workers > [tiles] threads > WARP_WORKERS)
        threads = resolve_workers(req.workers, tiles["threads"] or build["workers"])
    else:
        workers = resolve_workers(req.workers, build["workers"])
        threads = tiles["threads"] or 1  # per task: the parallelism is the tasks'

    # on an executor the driver reads the header only (the tasks read the rows)
    inp = _Input(cfg["source"]["format"], src_path, cfg["source"]["shape"], cfg["source"]["dtype"], where,
                 block=READ_BLOCK if executor.kind == "thread" else HEADER_BLOCK)
    try:
        if len(tiles["chunks"]) != len(inp.shape):
            raise ConfigError(f"{where('tiles.chunks')}: chunks {tiles['chunks']} has {len(tiles['chunks'])} "
                              f"dimensions but the array has {len(inp.shape)} (shape {list(inp.shape)})",
                              hint="give one chunk size per array dimension")
        recipe = {"format": "zarr-v3", "version": RECIPE_VERSION, "shape": list(inp.shape), "dtype": inp.dtype.name,
                  "chunks": tiles["chunks"], "shards": shards, "level": tiles["level"],
                  "fill_value": tiles["fill_value"], "levels": cfg["multiscale"]["levels"],
                  "method": cfg["multiscale"]["method"], "axes": cfg["output"]["axes"], "backend": backend_name}
        recipe_key = identity(recipe)
        loc = parse_location(out_url)
        up_to_date = _UpToDate(loc, recipe_key, inp, req.clear)
        if (old := up_to_date()) is not None:
            return _result(old, loc.path, "up-to-date", 0.0)
        extra = {"recipe": recipe, "recipe_key": recipe_key, "source": {"format": cfg["source"]["format"], "name":
                 os.path.basename(inp.name)}}
        kwargs = dict(shards=shards, fill_value=tiles["fill_value"],
                      level=tiles["level"], backend=backend_name, threads=threads,
                      levels=cfg["multiscale"]["levels"], method=cfg["multiscale"]["method"],
                      axes=cfg["output"]["axes"], manifest_extra=extra)
        t0 = time.perf_counter()
        if executor.kind != "thread" and inp.path == "-":
            raise ConfigError(f"--executor {executor.text}: the workers cannot read this process's stdin",
                              hint="write the input to a file the workers can read (a shared filesystem "
                                   "or s3://...), or use the local executor")
        counts: dict[str, Any] = {}
        if inp.path == "-":
            # standard input cannot be read again: no journal, one streaming writer (nothing to resume)
            if loc.protocol != "file":
                _clear_remote(loc, out_url, req.clear)
            result = _write(inp, loc.path if loc.protocol == "file" else out_url, tiles["chunks"], kwargs, fsync=True)
        else:
            job = _Build(inp, loc, out_url, recipe_key, tiles["chunks"], kwargs, executor,
                         workers if executor.kind != "thread" else 1, int(build["task_mb"] * (1 << 20)), req.clear)
            job.resources = None if build["resources"] is None else {k: float(n) for k, n in build["resources"].items()}
            result = job.run(up_to_date)
            if result is None:  # another driver built it while this one waited for the lock
                return _result(up_to_date.manifest, loc.path, "up-to-date", 0.0)
            counts = {**job.counts, "receipts": job.receipts}
        seconds = time.perf_counter() - t0
    finally:
        inp.close()
    if getattr(result, "status", "built") == "up-to-date":  # a killed run had committed it
        return _result(result.manifest, out_url, "up-to-date", 0.0)
    res = _result(result.manifest, out_url if loc.protocol != "file" else loc.path, "built", seconds)
    res.summary["executor"] = executor.text
    res.summary.update(counts)
    if getattr(result, "cluster", None):
        res.summary["cluster"] = result.cluster
    return res


class _UpToDate:
    """A local output with this recipe and this input (CRC-32C of its bytes) already there; the input's
    CRC-32C is computed at most once (it is asked again after waiting for another driver's lock)."""

    def __init__(self, loc, recipe_key: str, inp: _Input, clear: bool) -> None:
        self.loc, self.recipe_key, self.inp, self.clear = loc, recipe_key, inp, clear
        self.crc: str | None = None
        self.manifest: dict[str, Any] = {}

    def __call__(self) -> dict[str, Any] | None:
        if self.loc.protocol != "file" or self.clear or self.inp.path == "-" or self.inp.url:
            return None
        try:
            old = json.loads(Path(self.loc.path, MANIFEST_NAME).read_bytes())
        except (OSError, ValueError):
            return None
        return self.matches(old)

    def matches(self, old: Any) -> dict[str, Any] | None:
        """``old`` (a finished output's manifest, local or in a store) if it holds this recipe and
        this input's bytes (their CRC-32C: the input is read once to know)."""
        if self.clear or self.inp.path == "-" or not isinstance(old, dict) or old.get("recipe_key") != self.recipe_key:
            return None
        if self.crc is None:
            self.crc = _input_crc(self.inp.path, self.inp.header)
        if old.get("input_crc32c") != self.crc:
            return None
        self.manifest = old
        return old


def _clear_remote(loc, out_url: str, clear: bool) -> None:
    from warpdata.storage.locations import filesystem

    fs = filesystem(loc)
    if fs.exists(loc.path) and fs.ls(loc.path):
        if not clear:
            raise ConfigError(f"{out_url} already exists",
                              hint="pass --clear to replace it, or choose another [output] path")
        fs.rm(loc.path, recursive=True)


def _write(inp: _Input, url: str, chunks: list[int], kwargs: dict, fsync: bool):
    from warpdata.tiles.writer import TileWriter

    w = TileWriter(url, inp.shape, inp.dtype, chunks, fsync=fsync, **kwargs)
    try:
        with _progress.progress(f"tiling {inp.name}", total=inp.expected, unit="B") as bar:
            _stream(inp, w, bar)
        return w.close()
    except BaseException:
        w.abort()
        raise


@dataclass
class RangeTask:
    """Rows ``[a, b)`` of dimension 0 (of the array without its size-1 dimensions), every pyramid level
    of them: a pure task (the same objects wherever it runs) that reads only its own input bytes."""

    index: int
    input: str  # a local path on a filesystem the workers share, or a URL (s3://…)
    offset: int  # where row a starts in the input
    shape: tuple[int, ...]
    dtype: str
    chunks: list[int]
    rows: tuple[int, int]
    store: str  # the root the objects go to: the driver's build directory or the s3:// prefix
    kwargs: dict[str, Any] = field(default_factory=dict)
    sha256: str = ""  # the task hash its receipt binds to (docs/formats/receipts.md, "Tiled arrays")


def tile_range(task: RangeTask) -> dict[str, Any]:
    """Write every object of ``task``'s rows; returns the counts and CRC-32C the driver commits."""
    from warpdata.storage import zarr_store
    from warpdata.tiles.writer import TileWriter

    kwargs = {k: v for k, v in task.kwargs.items() if k != "manifest_extra"}
    w = TileWriter(task.store, task.shape, task.dtype, task.chunks, fsync=True, rows=task.rows,
                   _store=zarr_store.Store(task.store, fsync=True), **kwargs)
    f = _open_range(task.input, task.offset, w.bytes_expected)
    try:
        while w.bytes_received < w.bytes_expected:
            mv = w.reserve()
            if mv is None:
                w.wait()
                continue
            n = f.readinto(mv[:w.bytes_expected - w.bytes_received]) or 0
            if n == 0:
                raise DataError(f"{task.input}: ends before row {task.rows[1]} (byte {task.offset + w.bytes_received})",
                                hint="the input changed while the ETL ran; rerun it", path=task.input)
            w.commit(n)
        w.close()
    except BaseException:
        w.abort()
        raise
    finally:
        f.close()
    part = w.range_part(task.rows)
    if part is None:
        raise InternalError(f"range {task.rows} of {task.store}: an object has no content hash after close()")
    return {**part, "index": task.index}


def _open_range(path: str, offset: int, length: int):
    if "://" in path and not path.startswith("file://"):
        from warpdata.storage.locations import filesystem, parse_location

        loc = parse_location(path)
        # one ranged read-ahead the size of the task's bytes (at most READ_BLOCK at a time)
        f = filesystem(loc).open(loc.path, "rb", block_size=max(1 << 20, min(length, READ_BLOCK)))
    else:
        f = open(path, "rb", buffering=0)  # noqa: SIM115 (closed by the caller)
    f.seek(offset)
    return f


MIN_RANGES = 16  # a small array is still cut this fine (when its slabs allow): up to 16 workers busy


def plan_ranges(w, task_bytes: int = TASK_BYTES) -> list[tuple[int, int]]:
    """Row ranges of the writer ``w``'s array: whole slabs of every pyramid level each (so no task
    needs another's rows), about ``task_bytes`` of input, and at least :data:`MIN_RANGES` when
    there is room.

    The cut depends only on the array, the pyramid and ``task_bytes``: never on the executor or the
    worker count, so a run killed on one executor resumes on another from the same receipts.
    """
    import math

    if w._empty:
        return []
    e = w.plan.geometry
    total, row = e.shape[0], w.plan.row_nbytes
    kept0 = w.geometry.kept[0]
    align, below, lw = 1, 1, w
    while lw is not None:
        if lw._empty or lw.geometry.kept[0] != kept0:
            return [(0, total)]  # a level whose first dimension is another one: one task does all
        align = math.lcm(align, lw.plan.geometry.tile[0] * below)
        if lw._down is not None:
            below *= lw._down.factors[0]
        lw = lw._next
    per = max(1, task_bytes // max(1, align * row)) * align
    share = -(-total // MIN_RANGES)
    per = min(per, max(align, -(-share // align) * align))
    return [(a, min(a + per, total)) for a in range(0, total, per)]


BUILD_PREFIX = ".warp-tmp-build-"  # core/atomic.py's TMP_PREFIX + "build-", as the other ETLs'


def range_sha256(part: dict[str, Any]) -> str:
    """A range's content hash (its receipt's ``sha256``): one line ``<level> <slab> <slab digest>\\n``
    per slab of every level, in order (docs/formats/receipts.md, "Tiled arrays")."""
    import hashlib

    h = hashlib.sha256()
    for lv_no, lv in enumerate(part["levels"]):
        for k, d in enumerate(lv["slabs"]):
            h.update(f"{lv_no} {int(lv['first_slab']) + k} {d}\n".encode())
    return h.hexdigest()


def build_base(protocol: str, path: str, key: str, url: str) -> str:
    """The build directory (local) or journal prefix (object store) of an output at ``path``: a
    sibling of the output, never inside it. A bucket's root has no sibling: ConfigError."""
    import posixpath

    path = path.rstrip("/") or "/"
    if protocol != "file" and "/" not in path.strip("/"):
        raise ConfigError(f"[output] path {url}: a bucket's root cannot hold a tiled array beside its build "
                          "journal", hint=f"give a prefix in the bucket, like {url.rstrip('/')}/volume.zarr")
    name = posixpath.basename(path)
    parent = posixpath.dirname(path)
    return f"{'' if parent == '/' else parent}/{BUILD_PREFIX}{key[:12]}-{name}"


class _Build:
    """One resumable build: the plan's row ranges, a receipt per finished range, then the commit.

    Local outputs are built in ``<parent>/.warp-tmp-build-<hash12>-<name>/`` (``hash12``: of the recipe
    and the input's fingerprint) under a cross-process lock, its journal in ``receipts/``; ``s3://``
    outputs are written in place, the journal beside them in ``<parent>/.warp-tmp-build-<hash12>-<name>/``.
    A rerun reuses every range whose receipt names the same task and whose objects still hash to the
    receipted digests, and builds the others: on the executor's workers, or (the local executor)
    streamed through one range writer per run of consecutive missing ranges.
    """

    def __init__(self, inp: _Input, loc, url: str, recipe_key: str, chunks: list[int], kwargs: dict,
                 executor, workers: int, task_bytes: int, clear: bool) -> None:
        from warpdata.core.canonical import identity

        self.inp, self.loc, self.url, self.chunks, self.kwargs = inp, loc, url, chunks, kwargs
        self.executor, self.workers, self.task_bytes, self.clear = executor, workers, task_bytes, clear
        self.key = identity({"recipe_key": recipe_key, "input": inp.fingerprint()})
        self.counts: dict[str, int] = {}
        self.receipts: dict[str, int] = {}  # what the driver did with the journal (warp/etl/driver.py)
        self.resources: dict[str, float] | None = None  # [build] resources: what each task asks of Dask/Ray
        self.recipe_key = recipe_key
        self.base = build_base(loc.protocol, loc.path, self.key, url)  # the build directory / journal prefix

    # -- the whole run ----------------------------------------------------------------------
    def run(self, up_to_date):
        if self.loc.protocol == "file":
            from warpdata.core.atomic import build_lock

            with build_lock(Path(f"{self.base}.lock"), f"{self.loc.path} ({self.key[:12]})"):
                if up_to_date() is not None:
                    return None
                self._remove_other_builds()
                if self.clear:
                    import shutil

                    shutil.rmtree(self.base, ignore_errors=True)
                return self._build()
        done = self._prepare_remote(up_to_date)
        return done if done is not None else self._build()

    def _remove_other_builds(self) -> None:
        """Build directories of this output for another recipe or input, whose lock no running ETL holds."""
        import contextlib
        import fcntl
        import glob
        import shutil

        name = os.path.basename(self.loc.path.rstrip("/"))
        parent = os.path.dirname(self.loc.path.rstrip("/"))
        for d in glob.glob(os.path.join(glob.escape(parent), f"{BUILD_PREFIX}*-{glob.escape(name)}")):
            if d == self.base or not os.path.isdir(d) or os.path.islink(d) \
                    or len(os.path.basename(d)) != len(BUILD_PREFIX) + 13 + len(name):
                continue
            lock = f"{d}.lock"
            fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    continue  # an ETL of that build is running
                shutil.rmtree(d, ignore_errors=True)
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(lock)
            finally:
                os.close(fd)

    def _prepare_remote(self, up_to_date: _UpToDate):
        """An object-store output: up to date when a finished array of this recipe and input is
        there (as a local output is), else resume a killed build of them, else start afresh.

        Returns the finished result when the array is there already."""
        import contextlib

        from warpdata.core.canonical import canonical_json
        from warpdata.storage.locations import Location, filesystem

        fs = filesystem(self.loc)
        self.fs = fs
        marker = f"{self.base}/build.json"
        if fs.exists(self.loc.path) and fs.ls(self.loc.path):
            if self.clear:
                fs.rm(self.loc.path, recursive=True)
                with contextlib.suppress(FileNotFoundError):
                    fs.rm(self.base, recursive=True)
            elif not fs.exists(marker):
                mpath = f"{self.loc.path.rstrip('/')}/{MANIFEST_NAME}"
                try:
                    done = up_to_date.matches(json.loads(fs.cat_file(mpath)))
                except (FileNotFoundError, ValueError):
                    done = None
                if done is None:
                    raise ConfigError(f"{self.url} already exists",
                                      hint="pass --clear to replace it, or choose another [output] path")
                from types import SimpleNamespace

                return SimpleNamespace(manifest=done, status="up-to-date")
            else:
                mpath = f"{self.loc.path.rstrip('/')}/{MANIFEST_NAME}"
                if fs.exists(mpath):  # the killed run wrote the manifest, not yet dropped its journal
                    try:
                        doc = json.loads(fs.cat_file(mpath))
                    except ValueError:
                        doc = {}
                    if doc.get("recipe_key") != self.recipe_key:
                        raise ConfigError(f"{self.url} already exists",
                                          hint="pass --clear to replace it, or choose another [output] path")
                    with contextlib.suppress(FileNotFoundError):
                        fs.rm(self.base, recursive=True)
                    from types import SimpleNamespace

                    return SimpleNamespace(manifest=doc, status="up-to-date")
        elif self.clear:
            with contextlib.suppress(FileNotFoundError):
                fs.rm(self.base, recursive=True)
        if not fs.exists(marker):
            # names this build before its first object: a rerun after a kill at any point finds it
            fs.pipe_file(marker, canonical_json({"build": self.key, "output": self.url}) + b"\n")
        self._journal_loc = Location(self.loc.protocol, self.base)
        return None

    def _build(self):
        from warpdata.etl.executors import open_runner
        from warpdata.etl.receipts import Journal
        from warpdata.storage.locations import Location
        from warpdata.tiles.writer import TileWriter

        local = self.loc.protocol == "file"
        w = TileWriter(self.loc.path if local else self.url, self.inp.shape, self.inp.dtype, self.chunks, fsync=True,
                       build_dir=self.base if local else None, **self.kwargs)
        journal = None
        try:
            journal = Journal(self.base if local else Location(self.loc.protocol, self.base).url)
            ranges = plan_ranges(w, self.task_bytes)
            root = w.root.url if not w.root.local else w.root.location.path
            tasks = self._tasks(ranges, root, w.plan.row_nbytes)
            from warpdata.etl.driver import DriveReport, Plug, split_receipted

            # a range's objects are written again in place by its rebuild (plain PUTs, not
            # create-only): a receipt that does not verify is all there is to drop. A receipted part
            # names its task by its rows (its index is not stored)
            by_rows = {tuple(t.rows): t.index for t in tasks}
            plug = Plug(receipt_id=lambda t: _sid(t.index), reuse=lambda t, rec: self._reuse(w, t, rec),
                        drop=lambda t: None, index=lambda p: by_rows[tuple(p["rows"])])
            report = DriveReport()
            parts, todo = split_receipted(tasks, journal, plug, report)
            self.counts = {"ranges": len(tasks), "ranges_reused": len(parts), "ranges_built": len(todo)}

            cluster: dict[str, Any] = {}
            # receipts go to the journal in the background as ranges finish, every one written
            # before the manifest (docs/formats/receipts.md), as the driver does for the other pipelines
            with _progress.progress(f"tiling {self.inp.name}", total=self.inp.expected, unit="B") as bar, \
                    journal.writer() as receipts_out:
                def finished(part: dict) -> None:
                    i = int(part["index"])
                    part = {k: v for k, v in part.items() if k != "index"}
                    receipts_out.add(_sid(i), tasks[i].sha256, range_sha256(part),
                                     sum(int(lv["stored_bytes"]) for lv in part["levels"]), part)
                    parts[i] = part
                    bar.advance(int(part["bytes"]))

                bar.advance(sum(int(p["bytes"]) for p in parts.values()))
                if todo and self.executor.kind == "thread":
                    self._stream(w, root, todo, ranges, finished)
                elif todo:
                    n = self.workers if self.executor.distributed else min(self.workers, len(todo))
                    access = [("source", self.inp.path), ("output", self.url)]  # warp/etl/access.py
                    with open_runner(self.executor, n, access=access, resources=self.resources) as runner:
                        cluster = runner.describe()
                        for p in runner.imap_unordered(tile_range, todo):
                            finished(p)
            report.built = len(todo)
            report.receipts_listed, report.receipts_read = journal.listings, journal.reads
            report.receipts_written = journal.writes
            self.receipts = report.as_dict()
            if local:
                _remove_temps(w.root.location.path)  # objects half-written by workers killed mid-task
            w.on_committed = journal.remove if local else self._drop_remote_journal
            result = w.commit_parts([parts[i] for i in range(len(tasks))])
            result.cluster = cluster
            return result
        except BaseException as e:
            # bad input or config: nothing here is worth resuming. Anything else (an unreachable
            # store, a worker lost, Ctrl-C) keeps what is receipted, as a kill -9 does, so the
            # rerun resumes (docs/formats/receipts.md, "Tiled arrays")
            resumable = not isinstance(e, DataError | ConfigError | UsageError | MissingInputError)
            w.abort(discard=not resumable)
            if not local and not resumable:  # the prefix was empty (or --clear emptied it), or held this build's own objects
                import contextlib

                with contextlib.suppress(Exception):
                    w.root._fs.rm(w.root.location.path, recursive=True)
                with contextlib.suppress(Exception):
                    self._drop_remote_journal()
            raise

    def _drop_remote_journal(self) -> None:
        import contextlib

        with contextlib.suppress(FileNotFoundError):
            self.fs.rm(self.base, recursive=True)

    def _tasks(self, ranges: list[tuple[int, int]], root: str, row: int) -> list[RangeTask]:
        from warpdata.core.canonical import identity

        inp = self.inp
        task_kwargs = {k: v for k, v in self.kwargs.items() if k not in ("manifest_extra", "threads")}
        task_kwargs["threads"] = self.kwargs.get("threads") or 1
        out = []
        for i, (a, b) in enumerate(ranges):
            # what a receipt binds to: the build (recipe + input fingerprint), the range's index and rows
            out.append(RangeTask(i, inp.path, inp.header + a * row, tuple(inp.shape), inp.dtype.name,
                                 list(self.chunks), (a, b), root, task_kwargs,
                                 sha256=identity({"build": self.key, "index": i, "rows": [a, b]})))
        return out

    def _reuse(self, w, task: RangeTask, receipt: dict[str, Any]) -> dict[str, Any] | None:
        """The receipted part of ``task`` if its receipt names this task and every object of the range
        still hashes to the receipted slab digests; otherwise None (the driver drops the receipt and
        the range is rebuilt: warp/etl/driver.py)."""
        try:
            part = receipt["result"]
            ok = (receipt["task_sha256"] == task.sha256 and part["rows"] == list(task.rows)
                  and range_sha256(part) == receipt["sha256"] and _objects_match(w, task.rows, part))
        except (InfrastructureError, ConfigError):
            raise  # the store did not answer or refused (a ConfigError is a ValueError): the run ends
        except (KeyError, TypeError, ValueError, AttributeError):
            ok = False
        return part if ok else None

    def _stream(self, w, root: str, todo: list[RangeTask], ranges, finished) -> None:
        """The local executor: stream each run of consecutive missing ranges through one range writer
        (the same bytes as the executors' tasks), receipting each range once its objects are written."""
        from warpdata.storage import zarr_store
        from warpdata.tiles.writer import TileWriter

        runs: list[list[RangeTask]] = []
        for t in todo:
            if runs and runs[-1][-1].index + 1 == t.index:
                runs[-1].append(t)
            else:
                runs.append([t])
        inp = self.inp
        kwargs = {k: v for k, v in self.kwargs.items() if k != "manifest_extra"}
        for run in runs:
            a, b = run[0].rows[0], run[-1].rows[1]
            rw = TileWriter(root, inp.shape, inp.dtype, self.chunks, fsync=True, rows=(a, b),
                            _store=zarr_store.Store(root, fsync=True), **kwargs)
            pending = list(run)

            def receipt_ready(rw=rw, pending=pending) -> None:
                while pending and (p := rw.range_part(pending[0].rows)) is not None:
                    finished({**p, "index": pending.pop(0).index})

            try:
                inp.f.seek(run[0].offset)
                while rw.bytes_received < rw.bytes_expected:
                    mv = rw.reserve()
                    if mv is None:
                        rw.wait()
                        receipt_ready()
                        continue
                    n = inp.readinto(mv[:rw.bytes_expected - rw.bytes_received])
                    if n == 0:
                        raise DataError(f"{inp.name}: ends before row {b} (byte {run[0].offset + rw.bytes_received})",
                                        hint="the input changed while the ETL ran; rerun it", path=inp.name)
                    rw.commit(n)
                    receipt_ready()
                rw.close()
            except BaseException:
                rw.abort()
                raise
            receipt_ready()
            if pending:
                raise InternalError(f"{root}: rows {pending[0].rows} have no content hash after close()")


def _sid(index: int) -> str:
    return f"range-{index:05d}"


def _objects_match(w, rows: tuple[int, int], part: dict[str, Any]) -> bool:
    """Whether every object of rows ``[a, b)`` (every level) hashes to ``part``'s slab digests."""
    import hashlib
    from concurrent.futures import ThreadPoolExecutor

    from warpdata.tiles.writer import slab_digest

    jobs = []  # (level writer, slab, expected digest)
    lw, lo, hi, level = w, rows[0], rows[1], 0
    while lw is not None:
        lv = part["levels"][level]
        slabs = lw.slab_range((lo, hi))
        if int(lv["first_slab"]) != (slabs.start if slabs else 0) or len(lv["slabs"]) != len(slabs):
            return False
        jobs += [(lw, s, d) for s, d in zip(slabs, lv["slabs"], strict=True)]
        if lw._next is not None:
            lo, hi = lw._next_rows((lo, hi))
            if hi is None:
                hi = lw._next.plan.geometry.shape[0] if not lw._next._empty else 0
        lw, level = lw._next, level + 1
    if level != len(part["levels"]):
        return False

    def check(job) -> bool:
        lw, s, expected = job
        keys = [lw._object_key(s, o) for o in range(len(lw._tiles_per_obj))]
        try:
            digests = [hashlib.sha256(lw.store.get(k)).hexdigest() for k in keys]
        except MissingInputError:
            return False
        return slab_digest(zip(keys, digests, strict=True)) == expected

    with ThreadPoolExecutor(8 if not w.root.local else 2) as pool:
        return all(pool.map(check, jobs))


def _remove_temps(root: str) -> None:
    from warpdata.core.atomic import TMP_PREFIX

    for d, _dirs, names in os.walk(root):
        for n in names:
            if n.startswith(TMP_PREFIX):
                with suppress(FileNotFoundError):
                    os.unlink(os.path.join(d, n))


def _result(manifest: dict, path: str, status: str, seconds: float) -> EtlResult:
    raw, stored = manifest.get("raw_bytes", 0), manifest.get("stored_bytes", 0)
    levels = manifest.get("levels") or [{}]
    stored0 = levels[0].get("stored_bytes", stored)
    ratio = raw / stored0 if stored0 else 0.0  # full resolution: raw bytes over its stored bytes
    gbps = raw / seconds / 1e9 if seconds > 0 else None
    summary = {
        "shape": manifest.get("shape"), "dtype": manifest.get("dtype"), "chunks": manifest.get("chunks"),
        "shards": manifest.get("shards"), "levels": len(manifest.get("levels", [])),
        "backend": manifest.get("backend"), "raw_bytes": raw, "stored_bytes": stored,
        "ratio": round(ratio, 4), "seconds": round(seconds, 3), "gb_per_s": round(gbps, 4) if gbps else None,
        "input_crc32c": manifest.get("input_crc32c"),
        "fingerprint": buildconfig.fingerprint_of(manifest),  # the build identity (docs/design.md §11)
        "ome_zarr": manifest.get("ome_zarr"),
    }
    rows = [("shape", f"{manifest.get('shape')} {manifest.get('dtype')}"),
            ("chunks / shards", f"{manifest.get('chunks')} / {manifest.get('shards') or 'unsharded'}"),
            ("levels", str(summary["levels"])), ("backend", str(summary["backend"])),
            ("size", f"{raw / 1e6:.1f} MB -> {stored0 / 1e6:.1f} MB (ratio {ratio:.2f})"
             + (f", {stored / 1e6:.1f} MB with all levels" if len(levels) > 1 else ""))]
    if isinstance(manifest.get("ome_zarr"), dict):
        rows.append(("OME-Zarr", str(manifest["ome_zarr"].get("text"))))
    if gbps:
        rows.append(("speed", f"{gbps:.3f} GB/s in {seconds:.2f} s"))
    return EtlResult(kind=ZARR_ARRAY, path=path, summary=summary, rows=rows, status=status)
