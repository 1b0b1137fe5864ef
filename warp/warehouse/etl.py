"""``warp etl`` for detection labels (coco, yolo, jsonl) → a tensor warehouse version.

Phases (each timed into ``metrics.json``):

1. **config** — :mod:`warpdata.warehouse.config` validates the TOML.
2. **labels** — :mod:`~warpdata.warehouse.labels` loads and checks records.
3. **probe** — :mod:`~warpdata.warehouse.validate` reads and SHA-256s every
   image, probes headers and checks boxes in the EXIF-oriented frame. The
   :class:`~warpdata.etl.quarantine.Quarantine` verdict is checked *before any
   transform*: over a ``fail`` threshold the ETL stops with exit 65 and the
   worst offenders, unless ``--allow-invalid``.
4. **version** — SHA-256 of the canonical recipe: transform, validation and
   thresholds, class table, samples per shard, code and library versions,
   the content hash of every label file and every image (never paths and
   sizes). If ``<root>/v*-<hash12>/`` exists and verifies, it is reused
   ("up-to-date", nothing is rewritten) unless ``--clear``/``WAREHOUSE_CLEAR``.
5. **build** — the valid samples are cut, in label order, into fixed lists
   of ``samples_per_shard``; each list is one :class:`ShardTask`, a pure,
   picklable unit (:func:`build_shard`: same task → same bytes) that a
   thread or process pool — or Dask/Ray, by mapping :func:`build_shard` over
   :func:`plan` — runs independently. A worker owns its whole shard: it
   decodes into the shard's preallocated arrays and streams the file with
   its SHA-256 (no megabyte arrays shipped between processes). Shards are
   written (tmp + rename) into ``<root>/.warp-tmp-build-<hash12>/`` with a
   ``.json`` receipt; a rerun after a crash reuses every receipted shard
   whose checksum verifies. An exclusive ``flock`` serialises concurrent
   ETLs of the same version.
6. **finalize** — full-decode failures (truncated data the header pass
   missed) join the quarantine and the verdict is re-checked; then the
   manifest (canonical JSON, validated against ``manifest.schema.json``),
   ``metrics.json``, Parquet summaries and ``samples.parquet`` (one row per
   written sample: key, shard, index, boxes, classes, ids, source path, label file and the
   annotation of each box in it) are
   written (outputs, not version inputs) and the build
   directory is renamed to ``<root>/vYYYYMMDD-<hash12>/`` in one step: a
   killed ETL never leaves a visible version.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import fcntl
import json
import logging
import os
import shutil
import tempfile
import threading
import time
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from warpdata import __version__
from warpdata.core.atomic import (
    TMP_PREFIX,
    atomic_file,
    atomic_write_bytes,
    exchange,
    fsync_dir,
    temp_prefix,
)
from warpdata.core.canonical import canonical_json, identity, seal
from warpdata.core.directio import BLOCK, AlignedFile
from warpdata.core.errors import DataError
from warpdata.etl.driver import DriveReport, Plug, drive
from warpdata.etl.executors import (
    ExecutorSpec,
    close_started,
    open_runner,
    require,
    resolve_executor,
    start_runner,
)
from warpdata.etl.pipelines import EtlRequest, EtlResult
from warpdata.etl.quarantine import Quarantine, describe_check
from warpdata.etl.receipts import Journal
from warpdata.etl.workers import resolve_workers
from warpdata.formats import twh1
from warpdata.warehouse import config as wconfig
from warpdata.warehouse import labels as wlabels
from warpdata.warehouse import manifest as wmanifest
from warpdata.warehouse.scan import Scan, scan
from warpdata.warehouse.transform import (
    DecodeError,
    Transformer,
    TransformSpec,
    library_versions,
    transform_boxes,
)
from warpdata.warehouse.validate import ValidSample

log = logging.getLogger(__name__)

CODE_VERSION = f"warpdata {__version__}; twh1/{twh1.SHARD_VERSION}; warehouse-etl/1"
BUILD_PREFIX = f"{TMP_PREFIX}build-"


@dataclass
class ShardTask:
    """One output shard from a fixed list of inputs: a pure, independently schedulable unit."""

    index: int
    shard_id: str
    path: str
    spec: TransformSpec
    max_boxes: int
    capacity: int
    samples: list[ValidSample]
    # an output on object storage: the worker uploads the finished shard here, create-only, and
    # drops its local copy (docs/formats/receipts.md, "Object storage")
    upload: str | None = None


@dataclass
class ShardResult:
    index: int
    shard_id: str
    file_name: str
    samples: int
    sha256: str | None
    size_bytes: int
    failures: list[list[str]] = field(default_factory=list)  # [run, key, source, reason, message]
    timings: dict[str, float] = field(default_factory=dict)
    reused: bool = False
    direct_bytes: int = 0  # bytes that reached the file with O_DIRECT (the rest through the page cache)


_local = threading.local()


# pixels are handed to the disk in pieces of about this size while the shard fills up
FLUSH_BYTES = 16 << 20
# shards smaller than this are written through the page cache: each O_DIRECT write waits for the
# device, which costs more than the copy it saves on a small file (measured on a 60-image demo
# warehouse of 16 small shards: 361-366 img/s with O_DIRECT, 394-443 without)
DIRECT_MIN_SHARD_BYTES = 8 << 20


def _worker_state(task: ShardTask) -> tuple[twh1.ShardBuilder, Transformer, ThreadPoolExecutor]:
    """Per-thread (or per-process) builder, transformer and I/O thread, reused across shards."""
    key = (task.spec, task.capacity, task.max_boxes)
    st = getattr(_local, "state", None)
    if st is None or st[0] != key:
        spec = task.spec
        b = twh1.ShardBuilder(capacity=task.capacity, width=spec.width, height=spec.height,
                              max_boxes=task.max_boxes, dtype=spec.dtype)
        io = st[3] if st is not None else ThreadPoolExecutor(1, thread_name_prefix="warp-etl-io")
        st = (key, b, Transformer(spec), io)
        _local.state = st
    return st[1], st[2], st[3]


# what an own Dask LocalCluster's workers import before they fork (warp/etl/executors.py)
WORKER_PRELOAD = ("numpy", "cv2", "warpdata.warehouse.etl")


def _init_process_worker() -> None:
    import cv2

    cv2.setNumThreads(1)


def build_shard(task: ShardTask) -> ShardResult:
    """Decode, transform and write one shard; same task → same bytes, on any machine or worker."""
    import hashlib

    builder, tr, io = _worker_state(task)
    builder.reset()
    tr.decode_s = tr.resize_s = 0.0
    read_s = 0.0
    failures: list[list[str]] = []
    spec = task.spec
    name = os.path.basename(task.path)
    sha, size = None, 0
    builder.last_write_s = {"hash": 0.0, "write": 0.0}
    # the shard is written to a temporary sibling while it fills up (whole pages of pixels go to
    # the disk from a background thread, O_DIRECT where the filesystem allows: no page-cache copy)
    # and renamed into place once complete; no fsync here: a background thread syncs each
    # finished shard while the workers go on, and finalize waits for all of them; a torn shard
    # left by a crash fails its checksum when a rerun considers reusing it
    out_dir = os.path.dirname(task.path)
    if task.upload is not None and not os.path.isdir(out_dir):
        # a worker on another machine than the driver, whose staging directory is not there: the
        # shard goes to the store from this machine's temporary directory
        out_dir = tempfile.gettempdir()
    fd, tmp = tempfile.mkstemp(prefix=temp_prefix(), suffix="-" + name, dir=out_dir)
    os.close(fd)
    flushed = direct_bytes = 0
    try:
        big = task.capacity * builder.image_nbytes >= DIRECT_MIN_SHARD_BYTES
        with AlignedFile(tmp, io=io, direct=None if big else False) as dst:
            for s in task.samples:
                t0 = time.perf_counter()
                try:
                    if s.url is not None and not (s.local and os.path.exists(s.local)):
                        # a worker without the header pass's spool: one more GET, checked against its hash
                        from warpdata.warehouse.remote import read_source

                        data = read_source(s.url, s.sha256)
                        st = None
                    else:
                        with open(s.local or s.image, "rb") as f:
                            st = os.fstat(f.fileno())
                            data = f.read()
                except OSError as e:
                    raise DataError(f"{s.key}: could not be read during the build: {e}",
                                    hint="the source changed while the ETL ran; rerun 'warp etl'",
                                    path=s.image) from None
                # the header pass hashed this file; re-hash only if it was touched since (size, mtime, inode)
                if st is not None and (st.st_size, st.st_mtime_ns, st.st_ino) != s.stat_key and \
                        hashlib.sha256(data).hexdigest() != s.sha256:
                    raise DataError(f"{s.key}: changed while the ETL ran (content hash differs from the header pass)",
                                    hint="rerun 'warp etl' once the dataset is no longer being written",
                                    path=s.image)
                read_s += time.perf_counter() - t0
                slot = builder.image_slot()
                try:
                    g = tr(data, s.probe, slot)
                except DecodeError as e:
                    failures.append([s.run, s.key, s.source, e.reason, f"{s.key}: {e.message}"])
                    continue
                builder.commit(key=s.key, boxes=transform_boxes(s.boxes, g, spec), classes=s.classes,
                               frame_id=s.frame_id, run_id=s.run_id, orig_size=s.probe.oriented_size,
                               affine=(g.sx, g.sy, float(g.px), float(g.py)))
                done = builder.count * builder.image_nbytes
                if done - flushed >= FLUSH_BYTES:
                    # committed slots are final: their whole pages can be written now
                    end = done - done % BLOCK
                    dst.submit(twh1.IMAGE_ALIGN + flushed, builder.image_bytes()[flushed:end])
                    flushed = end
            if builder.count:
                # waits for the pieces still in flight itself, after hashing
                sha = builder.write_direct(dst, written=flushed)
            direct_bytes = dst.direct_bytes
        if builder.count:
            os.chmod(tmp, 0o644)
            if task.upload is not None:
                from warpdata.etl.objectstore import put_create_only

                size = os.path.getsize(tmp)
                put_create_only(tmp, task.upload)
                os.unlink(tmp)
            else:
                os.replace(tmp, task.path)
                size = os.path.getsize(task.path)
        else:
            os.unlink(tmp)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    res = ShardResult(task.index, task.shard_id, name, builder.count, sha, size, failures,
                      {"read": read_s, "decode": tr.decode_s, "resize": tr.resize_s,
                       "hash": builder.last_write_s["hash"], "write": builder.last_write_s["write"]},
                      direct_bytes=min(direct_bytes, size))
    return res


def task_sha256(task: ShardTask) -> str:
    """What a receipt binds to: the shard id, its transform and every input's content hash."""
    return identity([task.shard_id, task.capacity, task.max_boxes, asdict(task.spec),
                     [[s.key, s.sha256] for s in task.samples]])


def _record(journal: Any, task: ShardTask, res: ShardResult) -> None:
    """Receipt a finished shard (``journal``: a :class:`Journal` or its :class:`ReceiptWriter`)."""
    d = asdict(res)
    d.pop("timings")
    d.pop("reused")
    (journal.add if hasattr(journal, "add") else journal.record)(task.shard_id, task_sha256(task), res.sha256,
                                                                   res.size_bytes, d)


def _reuse_receipt(task: ShardTask, receipt: dict[str, Any],
                   store_sizes: dict[str, int] | None = None) -> ShardResult | None:
    """The receipted result of ``task`` if its receipt names this task and its shard verifies
    (the driver deletes a receipt that does not, with the shard: warp/etl/driver.py).

    A shard on object storage verifies by its listed size (its SHA-256 is in
    the manifest, checked by ``warp inspect --verify``): reading every shard
    back would cost what building it did.
    """
    try:
        if receipt["task_sha256"] != task_sha256(task):
            return None
        res = ShardResult(**receipt["result"])
        if (res.shard_id, res.file_name) != (task.shard_id, os.path.basename(task.path)):
            return None  # the manifest would name another shard's file for this one
        if res.samples + len(res.failures) != len(task.samples) or \
                not {f[1] for f in res.failures} <= {s.key for s in task.samples}:
            return None  # the counts and quarantine would be another task's
        if task.upload is not None:
            if res.samples and (store_sizes or {}).get(res.file_name) != res.size_bytes:
                return None
        elif res.samples:
            with twh1.TWH1Shard(task.path) as sh:
                sh.verify(res.sha256)
    except DataError:
        return None
    res.reused = True
    res.timings = {}
    return res


def _drop_shard(task: ShardTask) -> None:
    """Delete the shard of a receipt that did not verify, locally and in the store: its upload is
    create-only, so an object left there would be kept in place of the rebuilt bytes."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(task.path)
    if task.upload is not None:
        from warpdata.storage.locations import filesystem, parse_location

        loc = parse_location(task.upload)
        with contextlib.suppress(FileNotFoundError):
            filesystem(loc).rm_file(loc.path)


def samples_per_shard(cfg: wconfig.WarehouseConfig, n: int) -> int:
    """From the size target, capped so ``n`` samples make at least ``min_shards`` shards.

    Depends only on the config and the input count, never on the worker count,
    so shard boundaries (and bytes) are the same however the build runs.
    """
    if cfg.shard_samples:
        return cfg.shard_samples
    one = twh1.Layout.compute(dtype=cfg.dtype, width=cfg.width, height=cfg.height, channels=3,
                              max_boxes=cfg.max_boxes, samples=1, key_bytes=64, run_bytes=8).size
    by_size = max(1, int(cfg.shard_size_mb * 1e6 // max(one - twh1.IMAGE_ALIGN, 1)))
    return max(1, min(by_size, -(-n // cfg.min_shards)))


def plan(samples: list[ValidSample], per_shard: int, spec: TransformSpec, max_boxes: int,
         build_dir: Path) -> list[ShardTask]:
    tasks = []
    for i, start in enumerate(range(0, len(samples), per_shard)):
        sid = f"shard-{i:05d}"
        tasks.append(ShardTask(i, sid, str(build_dir / f"{sid}.twh1"), spec, max_boxes, per_shard,
                               samples[start:start + per_shard]))
    return tasks


def _workers(req: EtlRequest, cfg: wconfig.WarehouseConfig) -> int:
    return resolve_workers(req.workers, cfg.workers)


def _verify_version(path: Path, version: str, workers: int) -> dict[str, Any] | None:
    """The manifest if ``path`` is a complete, checksum-verified build of ``version``."""
    try:
        doc = wmanifest.read(path)
    except DataError:
        return None
    if doc.get("version") != version:
        return None

    def ok(sh: dict) -> bool:
        p = path / sh["relative_path"]
        try:
            if p.stat().st_size != sh["size_bytes"]:
                return False
            with twh1.TWH1Shard(p) as s:
                s.verify(sh["checksum_sha256"])
            return True
        except (OSError, DataError):
            return False

    with ThreadPoolExecutor(max(1, workers)) as ex:
        return doc if all(ex.map(ok, doc["shards"])) else None


def _build_lock(root: Path, version: str):
    from warpdata.core.atomic import build_lock

    return build_lock(root / f"{BUILD_PREFIX}{version[:12]}.lock", f"version {version[:12]} in {root}")


# per-sample side tables are cut in row groups of this many rows, so `warp why` reads one row group
# (found from the footer's statistics) instead of a million rows (docs/lineage.md)
LOOKUP_ROW_GROUP = 16384


def _write_parquet(path: Path, columns: dict[str, Any], row_group_size: int | None = None) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = columns if isinstance(columns, pa.Table) else pa.table(columns)
    with atomic_file(path, fsync=False) as f:
        pq.write_table(table, f, compression="zstd", row_group_size=row_group_size)


def _export_samples(d: Path, tasks: list[ShardTask], results: list[ShardResult], dataset_root: Path) -> str:
    """``samples.parquet``: one row per written sample, in reader order (``wh[sample]``).

    Rows follow the shards' commit order (each task's samples minus its
    full-decode failures), so the bytes depend only on the plan and the
    failures, never on the worker count or scheduling.
    """
    import pyarrow as pa

    failed = {r.index: {f[1] for f in r.failures} for r in results}
    written = {r.index for r in results if r.samples}
    cols: dict[str, list] = {c: [] for c in ("key", "shard_id", "shard_index", "n_boxes", "class_ids",
                                             "frame_id", "run_id", "source_path", "label_source",
                                             "annotation_ids")}
    # the driver's per-sample work bounds a cluster's rate (docs/design.md §11): plain string and
    # list operations here, no Path object per sample
    prefix = os.path.join(str(dataset_root), "")

    def source_path(image: str) -> str:
        if image.startswith(prefix) and os.path.normpath(image) == image:
            return image[len(prefix):].replace(os.sep, "/")
        return wlabels.rel_path(dataset_root, Path(image))

    for t in tasks:
        if t.index not in written:
            continue
        i = 0
        for s in t.samples:
            if s.key in failed.get(t.index, ()):
                continue
            cols["key"].append(s.key)
            cols["shard_id"].append(t.shard_id)
            cols["shard_index"].append(i)
            cols["n_boxes"].append(len(s.boxes))
            cols["class_ids"].append(s.classes.tolist() if hasattr(s.classes, "tolist") else [int(c) for c in s.classes])
            cols["frame_id"].append(int(s.frame_id))
            cols["run_id"].append(s.run_id)
            cols["source_path"].append(source_path(s.image))
            cols["label_source"].append(s.source)
            cols["annotation_ids"].append(s.ann_ids)
            i += 1
    n = len(cols["key"])
    table = pa.table({
        "sample": pa.array(range(n), pa.int64()),
        "key": pa.array(cols["key"], pa.string()),
        "shard_id": pa.array(cols["shard_id"], pa.string()),
        "shard_index": pa.array(cols["shard_index"], pa.int32()),
        "n_boxes": pa.array(cols["n_boxes"], pa.int32()),
        "class_ids": pa.array(cols["class_ids"], pa.list_(pa.int32())),
        "frame_id": pa.array(cols["frame_id"], pa.int64()),
        "run_id": pa.array(cols["run_id"], pa.string()),
        "source_path": pa.array(cols["source_path"], pa.string()),
        "label_source": pa.array(cols["label_source"], pa.string()),
        "annotation_ids": pa.array(cols["annotation_ids"], pa.list_(pa.string())),
    })
    _write_parquet(d / "samples.parquet", table, LOOKUP_ROW_GROUP)
    return "samples.parquet"


def _export_summaries(d: Path, q: Quarantine, sources: list[tuple[str, str, int]]) -> dict[str, str]:
    files = q.write_parquet(d)
    _write_parquet(d / "sources.parquet", {"key": [s[0] for s in sources], "sha256": [s[1] for s in sources],
                                           "size": [s[2] for s in sources]}, LOOKUP_ROW_GROUP)
    return {**files, "sources": "sources.parquet", "metrics": "metrics.json"}


def _preload() -> None:
    """Import what finalize needs (jsonschema + its dependencies, pyarrow.parquet: ~0.2 s in a fresh
    process) while the build runs, instead of serially after the last shard. Not during the header
    pass: its threads need the GIL, the build's decoders mostly release it."""
    with contextlib.suppress(ImportError):
        import jsonschema  # noqa: F401
        import pyarrow.parquet  # noqa: F401


def remove_leftovers(root: Path, *, keep: Path | None = None, older_than: float | None = None) -> list[str]:
    """Remove what killed ETLs left in output root ``root``; returns the removed paths.

    * build directories ``.warp-tmp-build-<hash12>/`` of other versions whose
      lock no running ETL holds (the current version's is kept: a rerun resumes
      from its receipts);
    * ``.warp-tmp-*`` files and directories (old trees of an interrupted
      replace, half-written shards) changed before ``older_than`` whose writer
      is gone.

    Called at the start of every build; a library hook for ``warp cache gc``.
    """
    removed: list[str] = []
    if not root.is_dir():
        return removed
    for d in root.glob(f"{BUILD_PREFIX}*"):
        if not d.is_dir() or d.is_symlink() or d == keep:
            continue
        lock = root / f"{d.name}.lock"
        fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                continue  # an ETL of that version is running
            shutil.rmtree(d, ignore_errors=True)
            removed.append(str(d))
            with contextlib.suppress(FileNotFoundError):
                os.unlink(lock)
        finally:
            os.close(fd)
    others = [p for p in root.glob(f"{TMP_PREFIX}*") if not p.name.startswith(BUILD_PREFIX)]
    if others:
        from warpdata.core.atomic import remove_stale_temps

        removed += remove_stale_temps([root], older_than=older_than, exclude=(BUILD_PREFIX,))
    return removed


def run(req: EtlRequest) -> EtlResult:
    remote = _remote_output(req)
    if remote is not None:
        return _run_to_store(req, remote)
    return _run_prestarted(req)


def _run_prestarted(req: EtlRequest, store: str | None = None) -> EtlResult:
    """A distributed executor is started while the driver scans the inputs (it takes seconds)."""
    cfg = wconfig.load(req.config, req.source, req.config_path, input_override=req.input,
                       output_override=req.output, workers_override=req.workers)
    executor = resolve_executor(req.executor, cfg.executor)
    if not executor.distributed:
        return _run(req, store=store)
    require(executor)
    if executor.kind != "dask":  # Ray must be initialised from the main thread
        return _run(req, store=store)
    started = start_runner(executor, resolve_workers(req.workers, cfg.workers), initializer=_init_process_worker,
                           preload=WORKER_PRELOAD, access=_access(cfg, store), resources=cfg.resources)
    try:
        return _run(req, started, store=store)
    finally:
        close_started(started)


def _access(cfg: wconfig.WarehouseConfig, store: str | None) -> list[tuple[str, str]]:
    """What every worker of an existing cluster must reach: the source and the output
    (warp/etl/access.py); an output on object storage is the store, not the driver's staging."""
    return [("source", cfg.remote_root or str(cfg.root)), ("output", store or str(cfg.output_root))]


def _remote_output(req: EtlRequest) -> str | None:
    """``--output`` or ``[output] root`` when it is an object-store URL (s3://…)."""
    from warpdata.etl.objectstore import is_url

    text = req.output
    if text is None:
        o = req.config.get("output")
        text = o.get("root") if isinstance(o, dict) and isinstance(o.get("root"), str) else None
    return text.rstrip("/") if is_url(text) else None


def _run_to_store(req: EtlRequest, url: str) -> EtlResult:
    """Shards go to the store from the workers that built them, create-only, each receipted in the
    store; the driver uploads the summaries, then the manifest, then ``latest``. A killed driver's
    rerun resumes from the store alone (docs/formats/receipts.md, "Object storage")."""
    import dataclasses

    from warpdata.etl import objectstore

    objectstore.check_reachable(url)
    staging = objectstore.staging_root(url)
    return _run_prestarted(dataclasses.replace(req, output=str(staging)), store=url)


def _store_result(res: EtlResult, dest: str, counts: dict[str, int], upload_s: float) -> EtlResult:
    summary = {**res.summary, "path": dest, "upload": {**counts, "s": round(upload_s, 4)}}
    rows = [r for r in res.rows] + [("uploaded", f"{counts['uploaded']} files ({counts['reused']} already there)")]
    return EtlResult(kind=res.kind, path=dest, summary=summary, rows=rows, status=res.status, exit_code=res.exit_code,
                     metrics=res.metrics)


def _run(req: EtlRequest, started: Future | None = None, store: str | None = None) -> EtlResult:
    t_start = time.perf_counter()
    t_started_wall = time.time()
    phases: dict[str, float] = {}
    cfg = wconfig.load(req.config, req.source, req.config_path, input_override=req.input,
                       output_override=req.output, workers_override=req.workers)
    workers = _workers(req, cfg)
    executor = resolve_executor(req.executor, cfg.executor)
    import cv2

    cv2.setNumThreads(1)  # parallelism comes from whole-shard workers

    try:
        if (cfg.remote_root and (started is not None or executor.kind != "thread")) or \
                (executor.distributed and executor.address is not None):
            # the header pass of a source on object storage runs on the executor's workers, and so
            # does a shared-filesystem source's on an external cluster (a LocalCluster shares the
            # driver's machine: its threads probe as fast, without shipping the outcomes)
            if started is not None:
                sc = scan(cfg, workers, started.result())
            else:
                with open_runner(executor, workers, initializer=_init_process_worker,
                                 preload=WORKER_PRELOAD, access=_access(cfg, store)) as r:
                    sc = scan(cfg, workers, r)
        else:
            sc = scan(cfg, workers)
        return _build(req, cfg, sc, workers, executor, phases, t_start, t_started_wall, started, store)
    finally:
        if cfg.remote_root:
            from warpdata.etl.spool import remove_mirror

            remove_mirror(cfg.root)


def _build(req: EtlRequest, cfg: wconfig.WarehouseConfig, sc: Scan, workers: int, executor: ExecutorSpec,
           phases: dict[str, float], t_start: float, t_started_wall: float, started: Future | None,
           store: str | None = None) -> EtlResult:
    ls, q, valid, sources, truncated_boxes = sc.labels, sc.quarantine, sc.valid, sc.sources, sc.truncated_boxes
    phases.update(sc.phases)

    # The verdict before any transform, as if every probed sample decodes.
    pre = Quarantine()
    pre.merge(q)
    for s in valid:
        pre.accept(s.run, s.key, empty=s.empty, keep=not (cfg.skip_empty and s.empty))
    pre.evaluate(cfg.thresholds).raise_for_status(allow_invalid=req.allow_invalid, what=str(cfg.root))

    kept = sc.kept(cfg.skip_empty)
    if not kept:
        raise DataError(f"{cfg.root}: no valid samples to write ({len(valid)} valid, "
                        f"{q.aggregate().missing + q.aggregate().invalid} quarantined)",
                        hint="check [source] paths and labels; 'skip_empty' drops samples without boxes")
    per_shard = samples_per_shard(cfg, len(kept))
    spec = TransformSpec(cfg.width, cfg.height, cfg.resize_mode, cfg.dtype, cfg.pad_value, cfg.interpolation)
    label_hashes = []
    from warpdata.core.canonical import sha256_file

    for lf in sorted(ls.label_files):
        label_hashes.append([wlabels.rel_path(cfg.root, lf), sha256_file(lf) if lf.is_file() else "missing"])
    sources_sorted = sorted(sources)
    recipe = {
        "format": f"TWH1/{twh1.SHARD_VERSION}", "code_version": CODE_VERSION, "source_format": cfg.format,
        "dataset_root": cfg.dataset_root_text, "images": cfg.images, "transform": cfg.transform_dict(),
        "validation": cfg.validation_dict(), "thresholds": cfg.thresholds.to_dict(), "classes": ls.classes,
        "samples_per_shard": per_shard, "libraries": library_versions(),
        "decoder": {"jpeg": "simplejpeg accurate-dct accurate-upsample strict", "other": "pillow"},
        "resizer": "opencv cv2.resize + cv2.split", "labels": label_hashes,
        "sources_sha256": identity([list(s) for s in sources_sorted]), "num_sources": len(sources_sorted),
    }
    version = identity(recipe)
    root = cfg.output_root

    store_vdir = None
    if store is not None:
        from warpdata.etl import objectstore

        store_vdir, complete = objectstore.find_version_dir(store, version)
        if complete and not req.clear:
            dest = f"{store}/{store_vdir}"
            doc = wmanifest.parse(objectstore.read_manifest(dest), f"{dest}/{wmanifest.MANIFEST_NAME}")
            _check_existing_verdict(doc, req, cfg, store_vdir)
            present = objectstore.list_sizes(dest)
            return _store_result(_result(doc, Path(store_vdir), "up-to-date", {}, time.perf_counter() - t_start),
                                 dest, {"uploaded": 0, "reused": len(present)}, 0.0)
        if store_vdir is None or complete:
            store_vdir = wmanifest.version_dir_name(version, _dt.datetime.now(_dt.UTC).strftime("%Y%m%d"))
    with _build_lock(root, version):
        if not req.clear and store is None:
            for cand in wmanifest.find_versions(root, version):
                doc = _verify_version(cand, version, workers)
                if doc is not None:
                    _check_existing_verdict(doc, req, cfg, cand.name)
                    return _result(doc, cand, "up-to-date", {}, time.perf_counter() - t_start)
                log.warning(f"{cand} is incomplete or corrupt: rebuilding it")
        build_dir = root / f"{BUILD_PREFIX}{version[:12]}"
        remove_leftovers(root, keep=build_dir, older_than=t_started_wall)
        if req.clear and build_dir.exists():
            shutil.rmtree(build_dir)
        build_dir.mkdir(parents=True, exist_ok=True)
        for leftover in build_dir.glob(f"{TMP_PREFIX}*"):  # half-written files of a killed run (we hold the lock)
            leftover.unlink()
        store_sizes = None
        if store is not None:
            # receipts live in the store, beside the version, so a rerun needs nothing local
            journal = Journal(f"{store}/{BUILD_PREFIX}{version[:12]}")
            store_sizes = objectstore.list_sizes(f"{store}/{store_vdir}")
        else:
            journal = Journal(str(build_dir))
        tasks = plan(kept, per_shard, spec, cfg.max_boxes, build_dir)
        if store is not None:
            for task in tasks:
                task.upload = f"{store}/{store_vdir}/{os.path.basename(task.path)}"
        threading.Thread(target=_preload, name="warp-etl-preload", daemon=True).start()
        t = time.perf_counter()
        if cfg.durable:
            with ThreadPoolExecutor(1, thread_name_prefix="warp-fsync") as syncer:
                results, drove = _run_tasks(tasks, executor, workers, len(kept), syncer, journal, started,
                                            store_sizes, _access(cfg, store))
        else:
            results, drove = _run_tasks(tasks, executor, workers, len(kept), None, journal, started, store_sizes,
                                        _access(cfg, store))
        cluster = drove.cluster
        workers = cluster.get("threads") or cluster.get("workers") or workers
        phases["build"] = time.perf_counter() - t

        t = time.perf_counter()
        failed: dict[str, list[str]] = {}
        for r in results:
            for f in r.failures:
                failed[f[1]] = f
        for s in valid:
            if s.key in failed:
                q.reject(*failed[s.key])
            else:
                q.accept(s.run, s.key, empty=s.empty, keep=not (cfg.skip_empty and s.empty))
        verdict = q.evaluate(cfg.thresholds)
        verdict.raise_for_status(allow_invalid=req.allow_invalid, what=str(cfg.root))

        shards = []
        first = 0
        for r in results:
            if not r.samples:
                continue
            shards.append({"id": r.shard_id, "relative_path": r.file_name, "shard_version": twh1.SHARD_VERSION,
                           "samples": r.samples, "width": cfg.width, "height": cfg.height, "channels": 3,
                           "max_boxes": cfg.max_boxes, "dtype": twh1.MANIFEST_DTYPE[cfg.dtype],
                           "endianness": "Little", "checksum_sha256": r.sha256, "size_bytes": r.size_bytes,
                           "first_sample": first})
            first += r.samples
        files = _export_summaries(build_dir, q, sources_sorted)
        files["samples"] = _export_samples(build_dir, tasks, results, cfg.root)
        doc = {
            "kind": wmanifest.KIND, "format": "TWH1", "manifest_version": wmanifest.MANIFEST_VERSION,
            "dataset_root": cfg.dataset_root_text, "source_format": cfg.format,
            "transform": cfg.transform_dict(), "version": version,
            "version_recipe": canonical_json(recipe).decode("utf-8"), "code_version": CODE_VERSION,
            "default_dtype": twh1.MANIFEST_DTYPE[cfg.dtype], "default_shard_version": twh1.SHARD_VERSION,
            "thresholds": cfg.thresholds.to_dict(),
            "summary": {**q.summary(), "verdict": verdict.to_dict()}, "shards": shards,
            "classes": ls.classes, "num_samples": first, "box_format": "xyxy-pixels", "files": files,
        }
        # sealed: no timestamp or timing inside, so the same inputs give the same manifest bytes
        # wherever and whenever they are built (docs/formats/twh1.md, "Manifest")
        doc = seal(doc)
        wmanifest.validate_manifest(doc, str(build_dir / wmanifest.MANIFEST_NAME))
        metrics = _metrics(results, phases, workers, cfg, first, truncated_boxes, q, time.perf_counter() - t_start)
        metrics["created_at_ms"] = int(time.time() * 1000)
        metrics["executor"] = executor.text
        metrics["cluster"] = cluster
        metrics["receipts"] = drove.as_dict()
        metrics["header_pass"] = sc.header_pass
        atomic_write_bytes(build_dir / "metrics.json", json.dumps(metrics, indent=2, sort_keys=True).encode())
        if store is not None:
            return _finish_in_store(store, store_vdir, build_dir, doc, metrics, results, journal, phases, t,
                                    t_start, root)
        journal.remove()
        if cfg.durable:
            _fsync_files([build_dir / r.file_name for r in results if r.samples and r.reused], workers)
        atomic_write_bytes(build_dir / wmanifest.MANIFEST_NAME, canonical_json(doc), fsync=cfg.durable)
        fsync_dir(build_dir)
        date = _dt.datetime.now(_dt.UTC).strftime("%Y%m%d")
        final = root / wmanifest.version_dir_name(version, date)
        old = None
        if final.exists():
            # --clear or a corrupt copy from today: trade places in one step (no instant without a
            # version directory); the build directory's name then holds the old tree
            if exchange(build_dir, final):
                old = build_dir
            else:  # the two-rename fallback of warpdata.core.atomic (docs/formats/twh1.md)
                old = root / f"{temp_prefix()}old-{final.name}"
                os.replace(final, old)
                os.replace(build_dir, final)
        else:
            os.replace(build_dir, final)
        fsync_dir(root)
        for stale in wmanifest.find_versions(root, version):
            if stale != final:  # --clear or a corrupt copy from another day
                shutil.rmtree(stale, ignore_errors=True)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
        phases["finalize"] = time.perf_counter() - t
        metrics["phases_s"] = {k: round(v, 4) for k, v in phases.items()}
        metrics["wall_s"] = round(time.perf_counter() - t_start, 4)
        atomic_write_bytes(final / "metrics.json", json.dumps(metrics, indent=2, sort_keys=True).encode())
    return _result(doc, final, "built", metrics, metrics["wall_s"])


def _check_existing_verdict(doc: dict[str, Any], req: EtlRequest, cfg: wconfig.WarehouseConfig, name: str) -> None:
    if doc["summary"]["verdict"]["status"] == "fail" and not req.allow_invalid:
        from warpdata.etl.quarantine import Verdict

        v = Verdict.from_dict(doc["summary"]["verdict"])
        v.allowed = False
        v.raise_for_status(what=f"{cfg.root} (existing {name}, built with --allow-invalid)")


def _finish_in_store(store: str, vdir: str, build_dir: Path, doc: dict[str, Any], metrics: dict[str, Any],
                     results: list[ShardResult], journal: Journal, phases: dict[str, float], t: float,
                     t_start: float, root: Path) -> EtlResult:
    """The shards are in the store already: upload the rest, the manifest last, then ``latest``,
    then drop the store's receipts and the local staging copy."""
    from warpdata.etl import objectstore

    atomic_write_bytes(build_dir / wmanifest.MANIFEST_NAME, canonical_json(doc))
    local = root / vdir
    if local.exists():
        shutil.rmtree(local)
    os.replace(build_dir, local)
    t_up = time.perf_counter()
    dest, counts = objectstore.upload_version(local, store)
    built = sum(1 for r in results if r.samples and not r.reused)
    counts = {"uploaded": counts["uploaded"] + built, "reused": counts["reused"] - built}
    journal.remove()
    shutil.rmtree(local, ignore_errors=True)
    phases["finalize"] = time.perf_counter() - t
    metrics["phases_s"] = {k: round(v, 4) for k, v in phases.items()}
    metrics["wall_s"] = round(time.perf_counter() - t_start, 4)
    res = _result(doc, Path(vdir), "built", metrics, metrics["wall_s"])
    return _store_result(res, dest, counts, time.perf_counter() - t_up)


def _fsync_path(p: str | Path) -> None:
    fd = os.open(p, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_files(paths: list[Path], workers: int) -> None:
    with ThreadPoolExecutor(max(1, workers)) as ex:
        list(ex.map(_fsync_path, paths))


def _run_tasks(tasks: list[ShardTask], executor: ExecutorSpec, workers: int, total: int,
               syncer: Executor | None, journal: Journal,
               started: Future | None = None, store_sizes: dict[str, int] | None = None,
               access: list[tuple[str, str]] = ()) -> tuple[list[ShardResult], DriveReport]:
    """Reuse every receipted shard, run the rest on ``executor``, receipt each as it finishes
    (warp/etl/driver.py)."""
    def fsync_built(task: ShardTask, r: ShardResult) -> None:
        if r.samples and syncer is not None and task.upload is None:
            syncer.submit(_fsync_path, task.path)

    plug = Plug(receipt_id=lambda t: t.shard_id, reuse=lambda t, rec: _reuse_receipt(t, rec, store_sizes),
                drop=_drop_shard, record=_record, index=lambda r: r.index,
                units=lambda r: r.samples + len(r.failures))
    # the runner keeps at most 2 tasks per worker in flight (memory); receipts go to the store in the
    # background (every one is written before the manifest)
    results, report = drive(tasks, build_shard, journal, plug, executor=executor, workers=workers,
                            label="building shards", unit="img", total=total, on_result=fsync_built,
                            initializer=_init_process_worker, started=started, preload=WORKER_PRELOAD,
                            access=access)
    if tasks:
        # every task is done: temporary files left now are from workers killed mid-shard (their
        # tasks were rerun elsewhere) and must not reach the version
        for leftover in Path(tasks[0].path).parent.glob(f"{TMP_PREFIX}*"):
            with contextlib.suppress(FileNotFoundError):
                leftover.unlink()
    return results, report


def _metrics(results: list[ShardResult], phases: dict[str, float], workers: int, cfg: wconfig.WarehouseConfig,
             written: int, truncated_boxes: int, q: Quarantine, wall: float) -> dict[str, Any]:
    cpu: dict[str, float] = {}
    for r in results:
        for k, v in r.timings.items():
            cpu[k] = cpu.get(k, 0.0) + v
    build_s = phases.get("build", 0.0)
    nbytes = sum(r.size_bytes for r in results)
    built = [r for r in results if not r.reused]
    n_built = sum(r.samples for r in built)
    return {
        "workers": workers, "executor": cfg.executor, "phases_s": {k: round(v, 4) for k, v in phases.items()},
        "cpu_s": {k: round(v, 4) for k, v in sorted(cpu.items())},
        "cpu_ms_per_sample": {k: round(1000 * v / n_built, 4) for k, v in sorted(cpu.items())} if n_built else {},
        "samples_written": written, "samples_built": n_built, "shards": len([r for r in results if r.samples]),
        "shards_reused": len(results) - len(built), "bytes_written": nbytes,
        "build_samples_per_s": round(n_built / build_s, 2) if build_s and n_built else None,
        "build_mb_per_s": round(sum(r.size_bytes for r in built) / 1e6 / build_s, 2) if build_s and built else None,
        "durable": cfg.durable, "skip_reasons": q.aggregate().by_reason, "skipped_empty": q.aggregate().skipped,
        "truncated_boxes": truncated_boxes, "wall_s": round(wall, 4),
        # how the built shards reached the disk: O_DIRECT (no page-cache copy) or buffered
        "direct_io_fraction": round(sum(r.direct_bytes for r in built) / max(1, sum(r.size_bytes for r in built)), 4),
    }


def _result(doc: dict[str, Any], path: Path, status: str, metrics: dict[str, Any], wall: float) -> EtlResult:
    agg = doc["summary"]["aggregate"]
    verdict = doc["summary"]["verdict"]
    # "fingerprint" in every pipeline's --json (docs/design.md §11); "version" is the older name, kept
    summary = {"fingerprint": doc["version"], "version": doc["version"], "path": str(path), "samples": doc["num_samples"],
               "shards": len(doc["shards"]), "counts": agg, "verdict": verdict["status"],
               "allowed_invalid": verdict["allowed"], "wall_s": round(wall, 4)}
    if metrics:
        summary["rate_samples_per_s"] = metrics.get("build_samples_per_s")
        summary["shards_reused"] = metrics.get("shards_reused", 0)
        summary["shards_built"] = metrics.get("shards", 0) - metrics.get("shards_reused", 0)
        summary["executor"] = metrics.get("executor")
        if "receipts" in metrics:
            summary["receipts"] = metrics["receipts"]
    else:
        summary["shards_reused"], summary["shards_built"] = len(doc["shards"]), 0
    rows = [("version", doc["version"][:12] + "…"), ("samples", str(doc["num_samples"])),
            ("shards", str(len(doc["shards"]))),
            ("quarantined", f"{agg['missing']} missing, {agg['invalid']} invalid"),
            ("empty", f"{agg['empty']} ({agg['skipped']} skipped)"), ("validation", verdict["status"])]
    if verdict["status"] != "ok":
        for p in [c for c in verdict["checks"] if c["status"] != "ok"][:3]:
            log.warning(describe_check(p))
    return EtlResult(kind=wmanifest.KIND, path=str(path), summary=summary, rows=rows, status=status,
                     metrics=metrics)
