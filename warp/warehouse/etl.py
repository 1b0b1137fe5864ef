"""``warp etl`` for detection labels (coco, yolo, jsonl) → a tensor warehouse version.

Phases (each timed into ``metrics.json``):

1. **config** — :mod:`warpdata.warehouse.config` validates the TOML.
2. **labels** — :mod:`~warpdata.warehouse.labels` loads and checks records.
3. **probe** — :mod:`~warpdata.warehouse.scan` (with
   :mod:`~warpdata.warehouse.validate`) reads and SHA-256s every
   image, probes headers and checks boxes in the EXIF-oriented frame. The
   :class:`~warpdata.etl.quarantine.Quarantine` verdict is checked *before any
   shard is kept*: over a ``fail`` threshold the ETL stops with exit 65 and the
   worst offenders, unless ``--allow-invalid``. On a first build (or ``--clear``)
   of a local source the shards of the samples already probed are built while
   the pass reads on, and adopted once the version is known
   (:mod:`~warpdata.warehouse.overlap`; docs/design.md §11).
4. **version** — SHA-256 of the canonical recipe: transform, validation and
   thresholds, class table, samples per shard, code and library versions,
   the content hash of every label file and every image, by its key relative
   to the source root (never the root's folder or URL, nor sizes): the same
   bytes from a folder, S3 or an HTTP host are one version. If ``<root>/v*-<hash12>/`` exists and verifies, it is reused
   ("up-to-date", nothing is rewritten) unless ``--clear``/``WAREHOUSE_CLEAR``.
5. **build** — the valid samples are cut, in label order, into lists of at
   most ``samples_per_shard`` (where the keys say: :class:`~warpdata.warehouse.shards.ShardCutter`); each list is one
   :class:`~warpdata.warehouse.shards.ShardTask`, a pure,
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
   missed) join the quarantine and the verdict is re-checked; then
   (:mod:`~warpdata.warehouse.finalize`) the
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
import dataclasses
import datetime as _dt
import json
import logging
import shutil
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

from warpdata import __version__
from warpdata.core.atomic import TMP_PREFIX, atomic_write_bytes
from warpdata.core.canonical import identity, sha256_file
from warpdata.core.errors import DataError
from warpdata.etl import objectstore
from warpdata.etl.driver import DriveReport, Plug, drive
from warpdata.etl.executors import (
    ExecutorSpec,
    close_started,
    make_runner,
    open_runner,
    require,
    resolve_executor,
    start_runner,
)
from warpdata.etl.pipelines import EtlRequest, EtlResult
from warpdata.etl.quarantine import Quarantine, Verdict, describe_check
from warpdata.etl.receipts import Journal
from warpdata.etl.spool import prune_empty, remove_mirror
from warpdata.etl.workers import resolve_workers
from warpdata.formats import twh1
from warpdata.warehouse import config as wconfig
from warpdata.warehouse import labels as wlabels
from warpdata.warehouse import manifest as wmanifest
from warpdata.warehouse import overlap as woverlap
from warpdata.warehouse.finalize import (
    BUILD_PREFIX,
    LOOKUP_ROW_GROUP,
    build_metrics,
    commit_version,
    export_samples,
    export_summaries,
    finish_in_store,
    fresh_build_dir,
    fsync_path,
    manifest_doc,
    remove_leftovers,
    verify_version,
    version_lock,
)
from warpdata.warehouse.finalize import write_parquet as _write_parquet
from warpdata.warehouse.scan import Scan, scan
from warpdata.warehouse.shards import (
    SHARD_CUT,
    WORKER_PRELOAD,
    ShardResult,
    ShardTask,
    build_shard,
    drop_shard,
    init_process_worker,
    plan,
    record_receipt,
    reuse_receipt,
    samples_per_shard,
    task_sha256,
)
from warpdata.warehouse.shards import reuse_receipt as _reuse_receipt
from warpdata.warehouse.transform import SCALE_POLICY, TransformSpec, library_versions
from warpdata.warehouse.validate import ValidSample

# the last two are the older private names that tests/etl/test_receipts_damaged.py and bench/why_latency.py use
__all__ = ["BUILD_PREFIX", "CODE_VERSION", "LOOKUP_ROW_GROUP", "Scan", "ShardResult", "ShardTask", "build_shard",
           "plan", "remove_leftovers", "run", "samples_per_shard", "scan", "task_sha256",
           "_reuse_receipt", "_write_parquet"]

log = logging.getLogger(__name__)

CODE_VERSION = f"warpdata {__version__}; twh1/{twh1.SHARD_VERSION}; warehouse-etl/1"


def _preload() -> None:
    """Import what finalize needs (jsonschema + its dependencies, pyarrow.parquet: ~0.2 s in a fresh
    process) while the build runs, instead of serially after the last shard. Not during the header
    pass: its threads need the GIL, the build's decoders mostly release it."""
    with contextlib.suppress(ImportError):
        import jsonschema  # noqa: F401
        import pyarrow.parquet  # noqa: F401


def run(req: EtlRequest) -> EtlResult:
    remote = _remote_output(req)
    if remote is not None:
        return _run_to_store(req, remote)
    return _run_prestarted(req)


def _run_prestarted(req: EtlRequest, store: str | None = None) -> EtlResult:
    """A distributed executor is started while the driver scans the inputs (it takes seconds)."""
    cfg = wconfig.load(req.config, req.source, req.config_path, input_override=req.input,
                       output_override=req.output, workers_override=req.workers)
    executor = resolve_executor(req.executor, cfg.executor, config_file=str(req.config_path) if req.config_path else None)
    if not executor.distributed:
        return _run(req, store=store)
    require(executor)
    if executor.kind != "dask":  # Ray must be initialised from the main thread
        return _run(req, store=store)
    started = start_runner(executor, resolve_workers(req.workers, cfg.workers), initializer=init_process_worker,
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
    text = req.output
    if text is None:
        o = req.config.get("output")
        text = o.get("root") if isinstance(o, dict) and isinstance(o.get("root"), str) else None
    return text.rstrip("/") if objectstore.is_url(text) else None


def _run_to_store(req: EtlRequest, url: str) -> EtlResult:
    """Shards go to the store from the workers that built them, create-only, each receipted in the
    store; the driver uploads the summaries, then the manifest, then ``latest``. A killed driver's
    rerun resumes from the store alone (docs/formats/receipts.md, "Object storage")."""
    objectstore.check_reachable(url)
    staging = objectstore.staging_root(url)
    try:
        return _run_prestarted(dataclasses.replace(req, output=str(staging)), store=url)
    finally:
        # built or failed, the staging folder goes once no other build of this store is in it
        # (the receipts are in the store: a rerun needs nothing here)
        prune_empty(staging, staging.parent)


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
    workers = resolve_workers(req.workers, cfg.workers)
    executor = resolve_executor(req.executor, cfg.executor, config_file=str(req.config_path) if req.config_path else None)
    import cv2  # heavy (OpenCV): only a build needs it, never the CLI's start-up

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
                with open_runner(executor, workers, initializer=init_process_worker,
                                 preload=WORKER_PRELOAD, access=_access(cfg, store)) as r:
                    sc = scan(cfg, workers, r)
        elif store is None and not cfg.remote_root and executor.kind in ("thread", "process", "dask") and \
                woverlap.wanted(cfg, cfg.output_root, req.clear):
            return _run_overlapped(req, cfg, workers, executor, phases, t_start, t_started_wall, started)
        else:
            sc = scan(cfg, workers)
        return _build(req, cfg, sc, workers, executor, phases, t_start, t_started_wall, started, store)
    finally:
        if cfg.remote_root:
            remove_mirror(cfg.root)


def _run_overlapped(req: EtlRequest, cfg: wconfig.WarehouseConfig, workers: int, executor: ExecutorSpec,
                    phases: dict[str, float], t_start: float, t_started_wall: float,
                    started: Future | None) -> EtlResult:
    """Phases 2-6 of a local source and output with the header pass overlapped with the build
    (warp/warehouse/overlap.py): the shards of every full list of samples are built while the
    pass reads on, then adopted once the version is known; the same runner builds the rest."""
    own: list[Any] = []

    def get_runner() -> Any:
        if started is not None:
            runner = started.result()
        else:
            own.append(make_runner(executor, workers, init_process_worker, cfg.resources, WORKER_PRELOAD,
                                   _access(cfg, None)))
            runner = own[0]
        if executor.distributed:  # as drive() names the cluster it runs on (warp/etl/driver.py)
            log.info("etl cluster: " + ", ".join(f"{k} {v}" for k, v in runner.describe().items()))
        return runner

    folder = woverlap.folder_for(cfg.output_root)
    folder.mkdir(parents=True)
    try:
        sc, ov = woverlap.scan_building(cfg, workers, get_runner, folder, _spec(cfg),
                                        started.done if started is not None else lambda: True)
        handed = started
        if own:
            handed = Future()
            handed.set_result(own[0])
        return _build(req, cfg, sc, workers, executor, phases, t_start, t_started_wall, handed, None, ov)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
        if own:
            own[0].close()


def _spec(cfg: wconfig.WarehouseConfig) -> TransformSpec:
    return TransformSpec(cfg.width, cfg.height, cfg.resize_mode, cfg.dtype, cfg.pad_value, cfg.interpolation,
                         cfg.decode)


def _build(req: EtlRequest, cfg: wconfig.WarehouseConfig, sc: Scan, workers: int, executor: ExecutorSpec,
           phases: dict[str, float], t_start: float, t_started_wall: float, started: Future | None,
           store: str | None = None, ov: woverlap.Overlap | None = None) -> EtlResult:
    """Phases 4-6 after the scan: the version, the shards, the manifest and the commit."""
    phases.update(sc.phases)
    # the verdict before any shard is kept (overlapped shards are still in their own folder), as if every
    # probed sample decodes
    pre = Quarantine()
    pre.merge(sc.quarantine)
    _judge(pre, sc.valid, req, cfg, {})
    kept = sc.kept(cfg.skip_empty)
    if not kept:
        q = sc.quarantine.aggregate()
        raise DataError(f"{cfg.root}: no valid samples to write ({len(sc.valid)} valid, "
                        f"{q.missing + q.invalid} quarantined)",
                        hint="check [source] paths and labels; 'skip_empty' drops samples without boxes")
    per_shard = samples_per_shard(cfg, len(kept))
    sources = sorted(sc.sources)
    recipe = _recipe(cfg, sc.labels, sources, per_shard)
    version = identity(recipe)
    root = cfg.output_root
    store_vdir = None
    if store is not None:
        store_vdir, existing = _store_version(req, cfg, store, version, t_start)
        if existing is not None:
            return existing
    with version_lock(root, version):
        if not req.clear and store is None:
            existing = _local_version(req, cfg, version, workers, t_start)
            if existing is not None:
                return existing
        # the overlapped pass's folder is this run's own: its time is the filesystem's clock, which
        # may run behind t_started_wall, so it is named, not told by age (warehouse/overlap.py)
        build_dir = fresh_build_dir(root, version, clear=req.clear, older_than=t_started_wall,
                                    spare=(ov.folder.name,) if ov is not None else ())
        if store is None:
            return _build_locked(req, cfg, sc, workers, executor, phases, t_start, started, store, store_vdir,
                                 recipe, version, kept, per_shard, sources, build_dir, ov)
        try:
            return _build_locked(req, cfg, sc, workers, executor, phases, t_start, started, store, store_vdir,
                                 recipe, version, kept, per_shard, sources, build_dir)
        finally:
            # the staging copy of a build to object storage: its receipts are in the store, so a
            # failed build leaves nothing here either (finish_in_store moved a built one away)
            shutil.rmtree(build_dir, ignore_errors=True)
            shutil.rmtree(root / store_vdir, ignore_errors=True)


def _build_locked(req: EtlRequest, cfg: wconfig.WarehouseConfig, sc: Scan, workers: int, executor: ExecutorSpec,
                  phases: dict[str, float], t_start: float, started: Future | None, store: str | None,
                  store_vdir: str | None, recipe: dict[str, Any], version: str, kept: list[ValidSample],
                  per_shard: int, sources: list[tuple[str, str, int]], build_dir: Path,
                  ov: woverlap.Overlap | None = None) -> EtlResult:
    """Phases 5-6 under the version's lock, in ``build_dir``."""
    root = cfg.output_root
    journal, store_sizes = _journal(build_dir, store, store_vdir, version)
    tasks = plan(kept, per_shard, _spec(cfg), cfg.max_boxes, build_dir,
                 None if store is None else f"{store}/{store_vdir}", fixed=bool(cfg.shard_samples))
    # shards built while the header pass ran, when their task is plan()'s own (warehouse/overlap.py)
    prebuilt = ov.adopt(tasks) if ov is not None else {}
    threading.Thread(target=_preload, name="warp-etl-preload", daemon=True).start()
    t = time.perf_counter()
    results, drove = _run_tasks(tasks, executor, workers, len(kept), cfg.durable, journal, started, store_sizes,
                                _access(cfg, store), prebuilt)
    workers = drove.cluster.get("threads") or drove.cluster.get("workers") or workers
    # overlapped: the build began when the first task went to the workers, during the header pass
    phases["build"] = time.perf_counter() - t + (ov.build_s if ov is not None else 0.0)

    t = time.perf_counter()
    doc = _outputs(req, cfg, sc, recipe, version, sources, build_dir, tasks, results)
    metrics = _write_metrics(build_dir, results, phases, workers, cfg, doc, sc, executor, drove, t_start, ov)
    if store is not None:
        dest, counts, upload_s = finish_in_store(store, store_vdir, build_dir, doc, results, journal, root)
        return _store_result(_finished(doc, Path(store_vdir), metrics, phases, t, t_start), dest, counts,
                             upload_s)
    journal.remove()
    final = commit_version(build_dir, root, version, doc, results, durable=cfg.durable, workers=workers)
    res = _finished(doc, final, metrics, phases, t, t_start)
    atomic_write_bytes(final / "metrics.json", json.dumps(metrics, indent=2, sort_keys=True).encode())
    return res


def _outputs(req: EtlRequest, cfg: wconfig.WarehouseConfig, sc: Scan, recipe: dict[str, Any], version: str,
             sources: list[tuple[str, str, int]], build_dir: Path, tasks: list[ShardTask],
             results: list[ShardResult]) -> dict[str, Any]:
    """The final verdict, with the full-decode failures (truncated data the header pass missed) in
    the quarantine; then the side tables in ``build_dir`` and the sealed manifest (not yet written)."""
    failed = {f[1]: f for r in results for f in r.failures}
    verdict = _judge(sc.quarantine, sc.valid, req, cfg, failed)
    files = export_summaries(build_dir, sc.quarantine, sources)
    files["samples"] = export_samples(build_dir, tasks, results, cfg.root)
    return manifest_doc(cfg, recipe, version, CODE_VERSION, sc.quarantine, verdict, sc.labels.classes, results,
                        files, build_dir)


def _judge(q: Quarantine, valid: list[ValidSample], req: EtlRequest, cfg: wconfig.WarehouseConfig,
           failed: dict[str, list[str]]) -> Verdict:
    """Accept every valid sample into ``q`` but those ``failed`` (rejected with their failure), then
    stop with exit 65 over a ``fail`` threshold unless ``--allow-invalid``."""
    for s in valid:
        if s.key in failed:
            q.reject(*failed[s.key])
        else:
            q.accept(s.run, s.key, empty=s.empty, keep=not (cfg.skip_empty and s.empty))
    verdict = q.evaluate(cfg.thresholds)
    verdict.raise_for_status(allow_invalid=req.allow_invalid, what=str(cfg.root))
    return verdict


def _recipe(cfg: wconfig.WarehouseConfig, ls: wlabels.LabelSet, sources: list[tuple[str, str, int]],
            per_shard: int) -> dict[str, Any]:
    """What the version hashes (phase 4): everything that decides the bytes, content hashes
    rather than paths and sizes. Never where the source lives: the same label and image bytes from
    a folder, ``s3://…`` or ``https://…`` are one version (the manifest's ``dataset_root`` still
    names the source this copy was built from; it is provenance, not identity)."""
    label_hashes = [[wlabels.rel_path(cfg.root, lf), sha256_file(lf) if lf.is_file() else "missing"]
                    for lf in sorted(ls.label_files)]
    return {
        "format": f"TWH1/{twh1.SHARD_VERSION}", "code_version": CODE_VERSION, "source_format": cfg.format,
        "images": cfg.images, "transform": cfg.transform_dict(),
        "validation": cfg.validation_dict(), "thresholds": cfg.thresholds.to_dict(), "classes": ls.classes,
        "samples_per_shard": per_shard, "shard_cut": "fixed" if cfg.shard_samples else SHARD_CUT,
        "libraries": library_versions(),
        "decoder": {"jpeg": "simplejpeg accurate-dct accurate-upsample strict", "other": "pillow",
                    "jpeg_scale": SCALE_POLICY[cfg.decode]},
        "resizer": "opencv cv2.resize + cv2.split", "labels": label_hashes,
        "sources_sha256": identity([list(s) for s in sources]), "num_sources": len(sources),
    }


def _store_version(req: EtlRequest, cfg: wconfig.WarehouseConfig, store: str, version: str,
                   t_start: float) -> tuple[str, EtlResult | None]:
    """The version directory's name in ``store``, and the result when it holds this version
    complete already (up to date unless ``--clear``)."""
    vdir, complete = objectstore.find_version_dir(store, version)
    if complete and not req.clear:
        dest = f"{store}/{vdir}"
        doc = wmanifest.parse(objectstore.read_manifest(dest), f"{dest}/{wmanifest.MANIFEST_NAME}")
        _check_existing_verdict(doc, req, cfg, vdir)
        present = objectstore.list_sizes(dest)
        return vdir, _store_result(_result(doc, Path(vdir), "up-to-date", {}, time.perf_counter() - t_start),
                                   dest, {"uploaded": 0, "reused": len(present)}, 0.0)
    if vdir is None or complete:
        vdir = wmanifest.version_dir_name(version, _dt.datetime.now(_dt.UTC).strftime("%Y%m%d"))
    return vdir, None


def _local_version(req: EtlRequest, cfg: wconfig.WarehouseConfig, version: str, workers: int,
                   t_start: float) -> EtlResult | None:
    """The result when a version directory under the output root holds this version and verifies."""
    for cand in wmanifest.find_versions(cfg.output_root, version):
        doc = verify_version(cand, version, workers)
        if doc is not None:
            _check_existing_verdict(doc, req, cfg, cand.name)
            return _result(doc, cand, "up-to-date", {}, time.perf_counter() - t_start)
        log.warning(f"{cand} is incomplete or corrupt: rebuilding it")
    return None


def _journal(build_dir: Path, store: str | None, vdir: str | None,
             version: str) -> tuple[Journal, dict[str, int] | None]:
    """The receipts of this build, and the sizes of the shards already in the store (if any):
    receipts of an output on object storage live in the store, beside the version, so a rerun
    needs nothing local."""
    if store is None:
        return Journal(str(build_dir)), None
    return Journal(f"{store}/{BUILD_PREFIX}{version[:12]}"), objectstore.list_sizes(f"{store}/{vdir}")


def _write_metrics(build_dir: Path, results: list[ShardResult], phases: dict[str, float], workers: int,
                   cfg: wconfig.WarehouseConfig, doc: dict[str, Any], sc: Scan, executor: ExecutorSpec,
                   drove: DriveReport, t_start: float, ov: woverlap.Overlap | None = None) -> dict[str, Any]:
    metrics = build_metrics(results, phases, workers, cfg, doc["num_samples"], sc.truncated_boxes, sc.quarantine,
                            time.perf_counter() - t_start)
    metrics["created_at_ms"] = int(time.time() * 1000)
    metrics["executor"] = executor.text
    metrics["cluster"] = drove.cluster
    metrics["receipts"] = drove.as_dict()
    metrics["header_pass"] = sc.header_pass
    if ov is not None:
        metrics["overlap"] = ov.as_dict()
    atomic_write_bytes(build_dir / "metrics.json", json.dumps(metrics, indent=2, sort_keys=True).encode())
    return metrics


def _finished(doc: dict[str, Any], path: Path, metrics: dict[str, Any], phases: dict[str, float], t: float,
              t_start: float) -> EtlResult:
    """The result of a build, its finalize phase (started at ``t``) and wall time in ``metrics``."""
    phases["finalize"] = time.perf_counter() - t
    metrics["phases_s"] = {k: round(v, 4) for k, v in phases.items()}
    metrics["wall_s"] = round(time.perf_counter() - t_start, 4)
    return _result(doc, path, "built", metrics, metrics["wall_s"])


def _check_existing_verdict(doc: dict[str, Any], req: EtlRequest, cfg: wconfig.WarehouseConfig, name: str) -> None:
    if doc["summary"]["verdict"]["status"] == "fail" and not req.allow_invalid:
        v = Verdict.from_dict(doc["summary"]["verdict"])
        v.allowed = False
        v.raise_for_status(what=f"{cfg.root} (existing {name}, built with --allow-invalid)")


def _run_tasks(tasks: list[ShardTask], executor: ExecutorSpec, workers: int, total: int, durable: bool,
               journal: Journal, started: Future | None = None, store_sizes: dict[str, int] | None = None,
               access: list[tuple[str, str]] = (),
               prebuilt: dict[int, ShardResult] | None = None) -> tuple[list[ShardResult], DriveReport]:
    """Reuse every receipted shard, run the rest on ``executor``, receipt each as it finishes
    (warp/etl/driver.py); ``durable``: each finished local shard is synced by a background thread
    while the workers go on. ``prebuilt``: shards built during the header pass (by task index),
    receipted here and not run again."""
    prebuilt = prebuilt or {}
    with contextlib.ExitStack() as stack:
        syncer = stack.enter_context(ThreadPoolExecutor(1, thread_name_prefix="warp-fsync")) if durable else None

        def fsync_built(task: ShardTask, r: ShardResult) -> None:
            if r.samples and syncer is not None and task.upload is None:
                syncer.submit(fsync_path, task.path)

        plug = Plug(receipt_id=lambda t: t.shard_id, reuse=lambda t, rec: reuse_receipt(t, rec, store_sizes),
                    drop=drop_shard, record=record_receipt, index=lambda r: r.index,
                    units=lambda r: r.samples + len(r.failures))
        written0 = journal.writes
        for i, r in prebuilt.items():
            record_receipt(journal, tasks[i], r)
            fsync_built(tasks[i], r)
        written = journal.writes - written0
        # the runner keeps at most 2 tasks per worker in flight (memory); receipts go to the store in the
        # background (every one is written before the manifest)
        todo = [t for t in tasks if t.index not in prebuilt]
        results, report = drive(todo, build_shard, journal, plug, executor=executor, workers=workers,
                                label="building shards", unit="img",
                                total=total - sum(r.samples + len(r.failures) for r in prebuilt.values()),
                                on_result=fsync_built, initializer=init_process_worker, started=started,
                                preload=WORKER_PRELOAD, access=access)
        if prebuilt:
            results = sorted([*results, *prebuilt.values()], key=lambda r: r.index)
            report.tasks += len(prebuilt)
            report.built += len(prebuilt)
            report.receipts_written += written
            if started is not None and not todo:  # the runner that built them is the one drive() would open
                report.cluster = started.result().describe()
    if tasks:
        # every task is done: temporary files left now are from workers killed mid-shard (their
        # tasks were rerun elsewhere) and must not reach the version
        for leftover in Path(tasks[0].path).parent.glob(f"{TMP_PREFIX}*"):
            with contextlib.suppress(FileNotFoundError):
                leftover.unlink()
    return results, report


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

