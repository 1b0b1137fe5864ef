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
run :class:`~warpdata.tiles.build.RangeTask` s (row ranges whole at every pyramid level, each read
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
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
from numpy.lib import format as npformat
from warpdata.core import progress as _progress
from warpdata.core.canonical import identity
from warpdata.core.config import Field, validate
from warpdata.core.errors import ConfigError, DataError, MissingInputError
from warpdata.core.jsondoc import load_json
from warpdata.core.names import MANIFEST_NAME, ZARR_ARRAY
from warpdata.etl import buildconfig, sourcefacts
from warpdata.etl.executors import require, resolve_executor
from warpdata.etl.pipelines import EtlRequest, EtlResult
from warpdata.etl.workers import resolve_workers
from warpdata.formats import crc as crc32c
from warpdata.formats.tiling import normalize_dtype
from warpdata.kernels import resolve as resolve_backend
from warpdata.storage.locations import filesystem, parse_location
from warpdata.tiles.build import READ_BLOCK, Build
from warpdata.tiles.pyramid import METHODS
from warpdata.tiles.writer import TileWriter

log = logging.getLogger(__name__)

RECIPE_VERSION = 1
HEADER_BLOCK = 64 << 10
FACTS = "tiles"  # the pipeline's name among the source facts (warp/etl/sourcefacts.py)
FACT_KEY = ""  # an input is one object: its facts file holds one fact, under the empty key


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
        self.path = path
        self.name = "stdin" if path == "-" else path
        self.url = "://" in path and not path.startswith("file://")
        self.block = block
        self._f: BinaryIO | None = None
        self.fact: dict[str, Any] | None = None  # what an earlier run learnt of an unchanged input object
        if path == "-":
            self._f = sys.stdin.buffer
            self.size = None
        elif self.url:
            # one listing (no HEAD, no GET): an object whose size and ETag are the ones recorded when
            # it was last read is not read again to know its header or its CRC-32C
            # (warp/etl/sourcefacts.py; docs/formats/zarr-tiles.md, "Inputs on object storage")
            self.listed = sourcefacts.list_object(path)
            if self.listed is None:
                raise MissingInputError(f"input {path} does not exist", hint="check [source] path or --input")
            self.size = self.listed.size
            self.etag = self.listed.tag or ""
            fact = sourcefacts.load_facts(path, FACTS).get(FACT_KEY)
            if sourcefacts.unchanged(fact, self.listed) and fact.get("format") == fmt \
                    and isinstance(fact.get("crc32c"), str) and isinstance(fact.get("header"), int):
                self.fact = fact
        else:
            try:
                self._f = open(path, "rb", buffering=0)  # noqa: SIM115 (closed in close())
            except FileNotFoundError:
                raise MissingInputError(f"input {path} does not exist", hint="check [source] path or --input") from None
            except IsADirectoryError:
                raise ConfigError(f"input {path} is a directory", hint="point [source] path at a file") from None
            self.size = os.fstat(self._f.fileno()).st_size
        header = 0
        self.fmt = fmt
        if fmt == "npy" and self.fact is not None and isinstance(self.fact.get("shape"), list):
            shape, dtype, header = self._check_npy(shape, dtype, self.fact["shape"], np.dtype(self.fact["dtype"]),
                                                   where), np.dtype(self.fact["dtype"]), int(self.fact["header"])
        elif fmt == "npy":
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

    @property
    def f(self) -> BinaryIO:
        """The input stream, opened on first use: an unchanged object-store input whose output is up
        to date is never opened."""
        if self._f is None:
            loc = parse_location(self.path)
            try:
                self._f = filesystem(loc).open(loc.path, "rb", block_size=self.block, size=self.size)
            except FileNotFoundError:
                raise MissingInputError(f"input {self.path} does not exist",
                                        hint="check [source] path or --input") from None
        return self._f

    @f.setter
    def f(self, value: BinaryIO) -> None:
        self._f = value

    def learnt(self) -> dict[str, Any]:
        """What a run knows of an object-store input, to record (facts of the listing it was read under)."""
        return {"format": self.fmt, "header": self.header, "shape": list(self.shape), "dtype": self.dtype.name}

    def _npy_header(self, shape, dtype, where):
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
        return self._check_npy(shape, dtype, npshape, np.dtype(npdtype), where), np.dtype(npdtype), f.tell()

    @staticmethod
    def _check_npy(shape, dtype, npshape, npdtype, where):
        """The .npy header's shape, when the config's shape and dtype (if given) agree with it."""
        if shape is not None and tuple(shape) != tuple(npshape):
            raise ConfigError(f"{where('source.shape')}: shape {shape} does not match the .npy header {list(npshape)}",
                              hint="remove [source] shape (npy files carry their own)")
        if dtype is not None and normalize_dtype(dtype) != normalize_dtype(npdtype):
            raise ConfigError(f"{where('source.dtype')}: dtype {dtype} does not match the .npy header {npdtype}",
                              hint="remove [source] dtype (npy files carry their own)")
        return tuple(npshape)

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
        if self.path != "-" and self._f is not None:
            self._f.close()


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
    crc = 0
    buf = np.empty(8 << 20, dtype=np.uint8)
    mv = memoryview(buf)
    if "://" in path and not path.startswith("file://"):  # an input on object storage: one streamed read
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
    build = cfg["build"]
    executor = resolve_executor(req.executor, build["executor"] or None, config_file=str(req.config_path) if req.config_path else None)
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
            raise ConfigError(f"{executor.named}: the workers cannot read this process's stdin",
                              hint="write the input to a file the workers can read (a shared filesystem "
                                   "or s3://...), or use the local executor")
        counts: dict[str, Any] = {}
        if inp.path == "-":
            # standard input cannot be read again: no journal, one streaming writer (nothing to resume)
            if loc.protocol != "file":
                _clear_remote(loc, out_url, req.clear)
            result = _write(inp, loc.path if loc.protocol == "file" else out_url, tiles["chunks"], kwargs, fsync=True)
        else:
            job = Build(inp, loc, out_url, recipe_key, tiles["chunks"], kwargs, executor,
                        workers if executor.kind != "thread" else 1, int(build["task_mb"] * (1 << 20)), req.clear)
            job.resources = None if build["resources"] is None else {k: float(n) for k, n in build["resources"].items()}
            result = job.run(up_to_date)
            if result is None:  # another driver built it while this one waited for the lock
                return _result(up_to_date.manifest, loc.path, "up-to-date", 0.0)
            counts = {**job.counts, "receipts": job.receipts}
        seconds = time.perf_counter() - t0
        _record(inp, result.manifest.get("input_crc32c"))
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
        # an object-store input is checked only when its CRC-32C is known from its source facts: else
        # knowing it costs a read of the whole input, as the build does
        if self.loc.protocol != "file" or self.clear or self.inp.path == "-" or (self.inp.url and self.inp.fact is None):
            return None
        try:
            old = load_json(Path(self.loc.path, MANIFEST_NAME).read_bytes(), MANIFEST_NAME)
        except (OSError, ValueError):
            return None
        return self.matches(old)

    def matches(self, old: Any) -> dict[str, Any] | None:
        """``old`` (a finished output's manifest, local or in a store) if it holds this recipe and
        this input's bytes (their CRC-32C: the input is read once to know)."""
        if self.clear or self.inp.path == "-" or not isinstance(old, dict) or old.get("recipe_key") != self.recipe_key:
            return None
        if self.crc is None and self.inp.fact is not None:
            self.crc = str(self.inp.fact["crc32c"])
        if self.crc is None:
            self.crc = _input_crc(self.inp.path, self.inp.header)
            _record(self.inp, self.crc)
        if old.get("input_crc32c") != self.crc:
            return None
        self.manifest = old
        return old


def _record(inp: _Input, crc: str | None) -> None:
    """Keep what this run learnt of an object-store input (its header, its CRC-32C) with the
    listing facts it was read under, for the next run (warp/etl/sourcefacts.py)."""
    if not inp.url or not isinstance(crc, str) or inp.listed.tag is None:
        return
    fact = sourcefacts.listing_facts(inp.listed.size, inp.listed.tag, crc32c=crc, **inp.learnt())
    if fact != inp.fact:
        sourcefacts.save_facts(inp.path, {FACT_KEY: fact}, FACTS)
        inp.fact = fact


def _clear_remote(loc, out_url: str, clear: bool) -> None:
    fs = filesystem(loc)
    if fs.exists(loc.path) and fs.ls(loc.path):
        if not clear:
            raise ConfigError(f"{out_url} already exists",
                              hint="pass --clear to replace it, or choose another [output] path")
        fs.rm(loc.path, recursive=True)


def _write(inp: _Input, url: str, chunks: list[int], kwargs: dict, fsync: bool):
    w = TileWriter(url, inp.shape, inp.dtype, chunks, fsync=fsync, **kwargs)
    try:
        with _progress.progress(f"tiling {inp.name}", total=inp.expected, unit="B") as bar:
            _stream(inp, w, bar)
        return w.close()
    except BaseException:
        w.abort()
        raise


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
