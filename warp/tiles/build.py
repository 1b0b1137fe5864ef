"""The tiled ETL's resumable build: row ranges, range tasks, receipts and the commit.

``warp etl`` for arrays (``warp/tiles/etl.py``) hands a file or ``s3://`` input to :class:`Build`:
the plan's row ranges (whole slabs of every pyramid level, :func:`plan_ranges`), a create-only
receipt per finished range in the build directory ``.warp-tmp-build-<hash12>-<name>`` (or beside an
``s3://`` output), then the driver's commit of the metadata (``TileWriter.commit_parts``). The
ranges run as :class:`RangeTask` s on an executor's workers, or streamed through one range writer
per run of consecutive missing ranges on the local executor; the tree is byte-identical either way
(docs/formats/zarr-tiles.md, "On an executor"; docs/formats/receipts.md, "Tiled arrays").
"""

from __future__ import annotations

import contextlib
import glob
import hashlib
import math
import os
import posixpath
import shutil
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from warpdata.core import progress as _progress
from warpdata.core.atomic import TMP_PREFIX, build_lock, remove_unless_locked
from warpdata.core.canonical import canonical_json, identity
from warpdata.core.errors import (
    ConfigError,
    DataError,
    InfrastructureError,
    InternalError,
    MissingInputError,
    UsageError,
)
from warpdata.core.jsondoc import load_json
from warpdata.core.names import MANIFEST_NAME
from warpdata.etl.driver import DriveReport, Plug, split_receipted
from warpdata.etl.executors import open_runner
from warpdata.etl.receipts import Journal
from warpdata.storage import zarr_store
from warpdata.storage.locations import Location, filesystem, parse_location
from warpdata.tiles.digests import slab_digest
from warpdata.tiles.writer import TileWriter

READ_BLOCK = 8 << 20  # read-ahead of an object-store input
TASK_BYTES = 64 << 20  # input bytes per range task, about (docs/formats/zarr-tiles.md, "On an executor")


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
    h = hashlib.sha256()
    for lv_no, lv in enumerate(part["levels"]):
        for k, d in enumerate(lv["slabs"]):
            h.update(f"{lv_no} {int(lv['first_slab']) + k} {d}\n".encode())
    return h.hexdigest()


def build_base(protocol: str, path: str, key: str, url: str) -> str:
    """The build directory (local) or journal prefix (object store) of an output at ``path``: a
    sibling of the output, never inside it. A bucket's root has no sibling: ConfigError."""
    path = path.rstrip("/") or "/"
    if protocol != "file" and "/" not in path.strip("/"):
        raise ConfigError(f"[output] path {url}: a bucket's root cannot hold a tiled array beside its build "
                          "journal", hint=f"give a prefix in the bucket, like {url.rstrip('/')}/volume.zarr")
    name = posixpath.basename(path)
    parent = posixpath.dirname(path)
    return f"{'' if parent == '/' else parent}/{BUILD_PREFIX}{key[:12]}-{name}"


class Build:
    """One resumable build: the plan's row ranges, a receipt per finished range, then the commit.

    Local outputs are built in ``<parent>/.warp-tmp-build-<hash12>-<name>/`` (``hash12``: of the recipe
    and the input's fingerprint) under a cross-process lock, its journal in ``receipts/``; ``s3://``
    outputs are written in place, the journal beside them in ``<parent>/.warp-tmp-build-<hash12>-<name>/``.
    A rerun reuses every range whose receipt names the same task and whose objects still hash to the
    receipted digests, and builds the others: on the executor's workers, or (the local executor)
    streamed through one range writer per run of consecutive missing ranges.
    """

    def __init__(self, inp, loc, url: str, recipe_key: str, chunks: list[int], kwargs: dict,
                 executor, workers: int, task_bytes: int, clear: bool) -> None:
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
            with build_lock(Path(f"{self.base}.lock"), f"{self.loc.path} ({self.key[:12]})"):
                if up_to_date() is not None:
                    return None
                self._remove_other_builds()
                if self.clear:
                    shutil.rmtree(self.base, ignore_errors=True)
                return self._build()
        done = self._prepare_remote(up_to_date)
        return done if done is not None else self._build()

    def _remove_other_builds(self) -> None:
        """Build directories of this output for another recipe or input, whose lock no running ETL holds."""
        name = os.path.basename(self.loc.path.rstrip("/"))
        parent = os.path.dirname(self.loc.path.rstrip("/"))
        for d in glob.glob(os.path.join(glob.escape(parent), f"{BUILD_PREFIX}*-{glob.escape(name)}")):
            if d == self.base or not os.path.isdir(d) or os.path.islink(d) \
                    or len(os.path.basename(d)) != len(BUILD_PREFIX) + 13 + len(name):
                continue
            remove_unless_locked(d, f"{d}.lock")  # kept while an ETL of that build runs

    def _prepare_remote(self, up_to_date):
        """An object-store output: up to date when a finished array of this recipe and input is
        there (as a local output is), else resume a killed build of them, else start afresh.

        Returns the finished result when the array is there already."""
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
                    done = up_to_date.matches(load_json(fs.cat_file(mpath), mpath))
                except (FileNotFoundError, ValueError):
                    done = None
                if done is None:
                    raise ConfigError(f"{self.url} already exists",
                                      hint="pass --clear to replace it, or choose another [output] path")
                return SimpleNamespace(manifest=done, status="up-to-date")
            else:
                mpath = f"{self.loc.path.rstrip('/')}/{MANIFEST_NAME}"
                if fs.exists(mpath):  # the killed run wrote the manifest, not yet dropped its journal
                    try:
                        doc = load_json(fs.cat_file(mpath), mpath)
                    except ValueError:
                        doc = {}
                    if doc.get("recipe_key") != self.recipe_key:
                        raise ConfigError(f"{self.url} already exists",
                                          hint="pass --clear to replace it, or choose another [output] path")
                    with contextlib.suppress(FileNotFoundError):
                        fs.rm(self.base, recursive=True)
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
        local = self.loc.protocol == "file"
        w = TileWriter(self.loc.path if local else self.url, self.inp.shape, self.inp.dtype, self.chunks, fsync=True,
                       build_dir=self.base if local else None, **self.kwargs)
        journal = None
        try:
            journal = Journal(self.base if local else Location(self.loc.protocol, self.base).url)
            ranges = plan_ranges(w, self.task_bytes)
            root = w.root.url if not w.root.local else w.root.location.path
            tasks = self._tasks(ranges, root, w.plan.row_nbytes)
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
                with contextlib.suppress(Exception):
                    w.root._fs.rm(w.root.location.path, recursive=True)
                with contextlib.suppress(Exception):
                    self._drop_remote_journal()
            raise

    def _drop_remote_journal(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.fs.rm(self.base, recursive=True)

    def _tasks(self, ranges: list[tuple[int, int]], root: str, row: int) -> list[RangeTask]:
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
    for d, _dirs, names in os.walk(root):
        for n in names:
            if n.startswith(TMP_PREFIX):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(os.path.join(d, n))
