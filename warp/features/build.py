"""The whole feature-cache build for one :class:`~warpdata.features.cachespec.CacheSpec`:
:func:`build_cache` scans, probes, cuts parts, runs them on an executor, re-packs and commits,
locally or into an object store (the contract: :mod:`warpdata.features.writer`;
docs/formats/feature-shard.md, docs/features-config.md).
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as _dt
import functools
import hashlib
import json
import logging
import os
import shutil
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
from warpdata.artifacts.manifests import MANIFEST_NAME
from warpdata.core import sidetables
from warpdata.core.atomic import TMP_PREFIX, atomic_dir, atomic_file, atomic_write_bytes
from warpdata.core.canonical import canonical_json, identity, seal, sha256_file
from warpdata.core.errors import ConfigError, DataError, InternalError, MissingInputError
from warpdata.etl import cutter, objectstore
from warpdata.etl.driver import Plug, drive
from warpdata.etl.executors import (
    ExecutorSpec,
    parse_executor,
    require,
    resolve_executor,
)
from warpdata.etl.quarantine import (
    Quarantine,
    RunSummary,
    evaluate_summaries,
)
from warpdata.etl.receipts import Journal
from warpdata.etl.workers import cpu_count
from warpdata.features import manifest as fmanifest
from warpdata.features import remote as fremote
from warpdata.features.cachespec import (
    KIND,
    PIXEL_BATCH,
    SHARD_PATTERN,
    BuildResult,
    CacheSpec,
    _existing,
    _sealed,
    _shards_present,
    base_fields,
    fingerprint_inputs,
    recipe_identity,
)
from warpdata.features.encoders import BatchEncoder, load_encoder, resolve_device
from warpdata.features.manifest import MANIFEST_VERSION
from warpdata.features.parts import (
    _ENCODER_LOCK,
    _ENCODERS,
    _POOLS,
    BUILD_PREFIX,
    PART_PATTERN,
    EncoderRef,
    PartResult,
    PartTask,
    _build_lock,
    _drop_part,
    _place,
    _probe_all,
    _record,
    _repack,
    _reuse,
    _RootRelative,
    adopt,
    build_part,
    preload_encoder,
    reassemble,
    task_sha256,
)
from warpdata.features.remote import StoreTarget, version_name
from warpdata.features.scan import MediaItem, scan, source_digest
from warpdata.features.transform import DecodeFailure
from warpdata.formats.featshard import VERSION as WFS_VERSION
from warpdata.formats.featshard import FieldSpec, Layout
from warpdata.storage.blobcache import BlobCache
from warpdata.storage.locations import filesystem, parse_location
from warpdata.storage.remote import Remote

log = logging.getLogger(__name__)


def build_cache(spec: CacheSpec, *, clear: bool = False, allow_invalid: bool = False,
                workers: int | None = None, executor: Any = None, decode_threads: int = 0,
                resources: dict[str, float] | None = None,
                remote: dict[str, Any] | None = None) -> BuildResult:
    """Build (or reuse) the cache of ``spec`` on ``executor`` (an ExecutorSpec or its text; default
    ``WARP_EXECUTOR`` or local threads) with ``workers`` concurrent shard tasks.

    ``decode_threads``: decode threads per worker process (0: the worker count on the local
    executor, whose tasks share one pool; elsewhere the CPUs divided among the workers started
    here, 2 on an existing cluster). ``resources``: what every task asks of a Dask/Ray cluster
    (None: ``{"GPU": 1}`` when the encoder runs on CUDA there, else nothing). ``remote``: the
    source folders on object storage, by the local mirror path ``spec`` names them by
    (:class:`warpdata.features.sources.RemoteFolder`): scanned from their listing and source facts,
    their media copied only when the version is built (docs/features-config.md).
    """
    t_start = time.perf_counter()

    store_url = spec.output.rstrip("/") if fremote.is_url(spec.output) else None
    if store_url is not None:
        # docs/features-config.md, "Output on object storage": staged here, shards uploaded by the
        # workers, receipts in the store; an unreachable store stops the run before any work (exit 75)
        objectstore.check_reachable(store_url)
        outp = objectstore.staging_root(store_url) / "cache"
    else:
        outp = Path(spec.output)
    ex = executor if isinstance(executor, ExecutorSpec) else (
        parse_executor(executor) if executor else resolve_executor())
    require(ex)
    n_workers = max(1, workers or cpu_count())
    # the encoder first: a bad encoder config is reported before any data is read
    enc, batch_encoder, enc_ref, device = _load_build_encoder(spec, ex)
    if resources is None:
        resources = {"GPU": 1} if device is not None and device.startswith("cuda") and ex.distributed else {}

    q = Quarantine()
    t_scan0 = time.perf_counter()
    remote = remote or {}
    items, item_source, orphan_captions = _scan_sources(spec, q, outp, remote)
    t_scan = time.perf_counter() - t_scan0

    _fail_fast(q, len(items), spec, allow_invalid)  # rejections found by the scan already exceed a threshold

    enc_identity = None if enc is None else {"config_name": spec.encoder, **enc.identity(),
                                             "device_type": device.split(":")[0]}
    inputs = fingerprint_inputs(spec, source_digest(items), enc_identity)
    fp = identity(inputs)
    recipe = recipe_identity(inputs)

    old = _existing(outp)
    reasons: list[str] = []
    target = None
    prev: Previous | None = None  # the complete version whose unchanged shards this one reuses
    if store_url is not None:
        target, up = _store_target(store_url, fp, clear, reasons, t_scan)
        if up is not None:
            return up
        if not clear:
            prev = _previous_in_store(store_url, target.vdir)
    else:
        done = _local_reasons(outp, old, fp, clear, inputs, reasons, t_scan)
        if done is not None:
            return done
        if not clear and old is not None and old.get("kind") == KIND:
            prev = _previous_local(outp)

    # the driver pass: every header, so the plan holds only records a full decode can store
    t0 = time.perf_counter()
    probed = _probe_sources(items, remote, n_workers, spec.max_pixels)
    _check_probed(q, items, probed, spec, allow_invalid)
    t_probe = time.perf_counter() - t0

    fields = base_fields(spec) + (batch_encoder.fields if batch_encoder else [])
    batch = spec.caching_batch_size if spec.encoder else PIXEL_BATCH
    h, w = spec.size
    planned = [i for i in range(len(items)) if i not in probed]
    runs = _cut_runs(planned, items, spec)
    name_hash = identity(os.path.abspath(outp))[:8]
    build_dir = outp.parent / f"{BUILD_PREFIX}{fp[:12]}-{name_hash}"
    if decode_threads <= 0:
        decode_threads = _default_decode_threads(ex, n_workers)
    own_pool = None
    if ex.kind == "thread":
        own_pool = f"build-{os.getpid()}-{id(spec)}-{time.monotonic_ns()}"
        _POOLS[own_pool] = ThreadPoolExecutor(decode_threads, thread_name_prefix="warp-fc-decode")
        if enc_ref is not None:
            with _ENCODER_LOCK:  # this process's tasks share the driver's encoder
                _ENCODERS.setdefault(enc_ref, batch_encoder)
    pool_key = own_pool or f"threads-{decode_threads}"
    tasks = [PartTask(j, str(build_dir / PART_PATTERN.format(j)), recipe, spec, fields, [items[i] for i in run],
                      _batches(run, batch, spec), enc_ref, decode_threads, pool_key)
             for j, run in enumerate(runs)]
    if target is not None:
        for t in tasks:
            t.upload_shard = target.shard_url(SHARD_PATTERN.format(t.index))
            t.upload_part = target.part_url(PART_PATTERN.format(t.index))
    metrics: dict[str, Any] = {"scan_s": round(t_scan, 4), "probe_s": round(t_probe, 4), "batches": [],
                               "workers": n_workers, "batch_size": batch, "executor": ex.text,
                               "decode_threads": decode_threads}
    try:
        with _build_lock(build_dir):
            return _build(spec, tasks, runs, items, item_source, probed, q, inputs, fp, fields, build_dir, ex,
                          n_workers, resources, clear, allow_invalid, metrics, reasons, orphan_captions, device,
                          t_start, outp, target, prev, remote)
    finally:
        if own_pool is not None:
            _POOLS.pop(own_pool).shutdown(wait=False)
            if enc_ref is not None:
                with _ENCODER_LOCK:
                    if _ENCODERS.get(enc_ref) is batch_encoder:
                        del _ENCODERS[enc_ref]


def _cut_runs(planned: list[int], items: list[MediaItem], spec: CacheSpec) -> list[list[int]]:
    """``planned`` (item indices in scan order) cut into the runs that become shards: by the
    records' keys (:mod:`warpdata.etl.cutter`, cap ``effective_shard_size``), or every
    ``effective_shard_size`` records when ``spec.shard_cut`` is ``"fixed"``
    (docs/formats/feature-shard.md, "Shard boundaries")."""
    return cutter.cut_by_keys(planned, spec.effective_shard_size, spec.shard_cut == "fixed", key=lambda i: items[i].key)


def _batches(run: Sequence[int], batch: int, spec: CacheSpec) -> list[int]:
    """Each record's encoder batch in its task: its position in the task // ``batch`` under the key
    cut, so a task's batches (and bytes) depend on its records alone; its scan position // ``batch``
    under fixed counts, the single-process writer's batches (docs/formats/feature-shard.md)."""
    if spec.shard_cut == "fixed":
        return [i // batch for i in run]
    return [k // batch for k in range(len(run))]


def _probe_sources(items: list[MediaItem], remote: dict[str, Any], workers: int, max_pixels: int
                   ) -> dict[int, DecodeFailure]:
    """The header pass's failures by item index. A media object on object storage whose listing
    facts are unchanged since it was last probed gives its recorded verdict, without a GET; every
    other item is probed (a remote one copied into its mirror first), and its verdict recorded."""
    known: dict[int, DecodeFailure | None] = {}
    for folder in remote.values():
        known.update(folder.known_probes(items, max_pixels))
    todo = [i for i in range(len(items)) if i not in known]
    for folder in remote.values():  # a source on object storage: the media the probe reads
        folder.materialize([items[i] for i in todo])
    found = _probe_all([items[i] for i in todo], workers, max_pixels)
    fresh = {i: found.get(j) for j, i in enumerate(todo)}
    for folder in remote.values():
        folder.record_probes(items, fresh, max_pixels)
    return {i: f for i, f in {**known, **fresh}.items() if f is not None}


def _scan_sources(spec: CacheSpec, q: Quarantine, outp: Path, remote: dict[str, Any]
                  ) -> tuple[list[MediaItem], list[int], int]:
    """(every usable item of every source folder in order, each item's source index, captions without
    media); rejections go to ``q``. A folder in ``remote`` is scanned from its store's listing."""
    items: list[MediaItem] = []
    item_source: list[int] = []
    orphan_captions = 0
    for i, (root, prefix, key_prefix) in enumerate(spec.scan_roots()):
        if root in remote:
            scanned = remote[root].scan(_RootRelative(q, root, key_prefix), caption_prefix=prefix,
                                        caption_ext=spec.caption_ext, key_prefix=key_prefix)
        else:
            scanned = scan(root, _RootRelative(q, root, key_prefix), caption_prefix=prefix,
                           caption_ext=spec.caption_ext, exclude=(outp,), key_prefix=key_prefix)
        items += scanned.items
        item_source += [i] * len(scanned.items)
        orphan_captions += scanned.orphan_captions
    return items, item_source, orphan_captions


def _check_probed(q: Quarantine, items: list[MediaItem], probed: dict[int, Any], spec: CacheSpec,
                  allow_invalid: bool) -> None:
    """Stop before building when the scan's and the header pass's rejections exceed a fail threshold."""
    pre = Quarantine()
    pre.merge(q)
    for i, it in enumerate(items):
        f = probed.get(i)
        if f is None:
            pre.accept(it.run, it.key)
        else:
            pre.reject(it.run, it.key, it.key, f.reason, f"{it.key}: {f.message}")
    pre.evaluate(spec.thresholds).raise_for_status(allow_invalid=allow_invalid, what=spec.source_label())


def _load_build_encoder(spec: CacheSpec, ex: ExecutorSpec) -> tuple[Any, Any, EncoderRef | None, str | None]:
    """(encoder, batch encoder, the workers' reference to it, device), all None without ``[encoder]``."""
    if not spec.encoder:
        return None, None, None, None
    # on a cluster the workers hold the GPUs: the driver loads the encoder on its CPU for the
    # identity and the fields only, and the tasks resolve caching_device where they run
    remote_cuda = ex.distributed and spec.caching_device.startswith("cuda")
    device = spec.caching_device if remote_cuda else resolve_device(spec.caching_device)
    enc = load_encoder(spec.encoder, device="cpu" if remote_cuda else device, dtype=spec.encoder_dtype,
                       options=spec.encoder_options)
    batch_encoder = BatchEncoder(enc, "cpu" if remote_cuda else device, spec.size, name=spec.encoder)
    enc_ref = EncoderRef(spec.encoder, device, spec.encoder_dtype,
                         canonical_json(spec.encoder_options).decode("utf-8"), tuple(spec.size))
    return enc, batch_encoder, enc_ref, device


def _fail_fast(q: Quarantine, n_items: int, spec: CacheSpec, allow_invalid: bool) -> None:
    """Stop before any decoding when the scan's rejections alone exceed a fail threshold."""
    agg = q.aggregate()
    pending = RunSummary(**{**agg.__dict__, "by_reason": dict(agg.by_reason)})
    pending.total += n_items
    pending.non_empty += n_items
    examples: dict[str, list[dict[str, str]]] = {}
    for r in q.record_dicts():
        ex_list = examples.setdefault(r["reason"], [])
        if len(ex_list) < 3:
            ex_list.append(r)
    early = evaluate_summaries([("aggregate", pending)], spec.thresholds, examples)
    early.raise_for_status(allow_invalid=allow_invalid, what=spec.source_label())


def _local_reasons(outp: Path, old: dict[str, Any] | None, fp: str, clear: bool, inputs: dict[str, Any],
                   reasons: list[str], t_scan: float) -> BuildResult | None:
    """The up-to-date result when the local cache at ``outp`` can be kept; else None, with why it is
    rebuilt appended to ``reasons``."""
    if outp.exists():
        if old is None or old.get("kind") != KIND:
            if old is not None or any(outp.iterdir()):
                raise ConfigError(f"{outp} exists and is not a feature cache",
                                  hint="choose another [output] path; warp only replaces its own caches")
            reasons.append("new cache")
        elif (sealed := _sealed(outp)) is not None and sealed.get("fingerprint") == fp and not clear \
                and _shards_present(outp, sealed) and not _side_errors(outp, sealed):
            return BuildResult("up-to-date", str(outp), sealed, {"scan_s": round(t_scan, 4)})
        elif clear:
            reasons.append("--clear")
        elif old.get("fingerprint") != fp:
            prev = old.get("fingerprint_inputs", {})
            changed = [k for k in ("dataset", "encoder", "code") if identity(prev.get(k)) != identity(inputs[k])] \
                if isinstance(prev, dict) else []
            reasons.append("fingerprint changed" + (f" ({', '.join(changed)})" if changed else ""))
        elif (sealed := _sealed(outp)) is None:
            reasons.append("manifest unsealed or damaged")
        elif _shards_present(outp, sealed):
            reasons.append("side files edited or missing")
        else:
            reasons.append("shards missing or resized")
    else:
        reasons.append("new cache")
    return None


def _side_errors(outp: Path, manifest: dict[str, Any]) -> list[Any]:
    """The side files of the cache at ``outp`` that differ from the manifest's ``side_tables``: a
    cache whose ``records.parquet`` was edited is rebuilt, not kept (docs/formats/feature-shard.md)."""
    return sidetables.errors(outp, manifest, str(outp / MANIFEST_NAME), fmanifest.REBUILD_HINT)


def _default_decode_threads(ex: ExecutorSpec, n_workers: int) -> int:
    """Decode threads per worker process: the worker count on local threads (one shared pool), the
    CPUs divided among the workers started here, 2 on an existing cluster."""
    if ex.kind == "thread":
        return n_workers
    if ex.address is None:
        return max(1, cpu_count() // n_workers)
    return 2


def _store_target(url: str, fp: str, clear: bool, reasons: list[str], t_scan: float):
    """``(StoreTarget, None)`` for a version to build in the store at ``url``, or ``(None, result)``
    when a complete version of fingerprint ``fp`` is there (one listing, one manifest GET)."""

    vdir, complete = objectstore.find_version_dir(url, fp)
    if complete and not clear:
        where = f"{url}/{vdir}"
        m = fmanifest.parse(objectstore.read_manifest(where), f"{where}/{MANIFEST_NAME}",
                            hint=f"a version in the store is never edited in place: remove {where}/ and rerun")
        _point_latest(url, vdir)
        return None, BuildResult("up-to-date", where, m, {"scan_s": round(t_scan, 4),
                                                          "shards_reused": len(m["shards"]), "shards_built": 0})
    if vdir is not None and not complete:
        reasons.append("resuming the version an interrupted run was writing")
    elif complete:
        reasons.append("--clear")
    else:
        reasons.append("new version in the store")
    if vdir is None or complete:
        vdir = version_name(fp, _dt.datetime.now(_dt.UTC).strftime("%Y%m%d"))
    return StoreTarget(url, vdir, fp), None


@dataclasses.dataclass
class Previous:
    """The previous complete version of a cache, whose shards a new version's unchanged tasks reuse
    (docs/formats/feature-shard.md, "Reusing the shards of the previous version")."""

    where: str  # the cache directory, or the version's URL
    manifest: dict[str, Any]  # sealed and checked
    remote: Any = None  # a Remote over the version (object storage)
    shards: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)  # shard entries by task identity
    # a part a re-cut spread over shards, by its task identity: (shard entry, first record there,
    # the part's first and end record, the part's SHA-256), in record order
    recut: dict[str, list[tuple[dict[str, Any], int, int, int, str]]] = dataclasses.field(default_factory=dict)
    _files: dict[str, str | None] = dataclasses.field(default_factory=dict)
    _late: dict[str, tuple[str, str]] | None = None

    def __post_init__(self) -> None:
        for e in self.manifest.get("shards", []):
            if isinstance(e.get("task"), str):  # manifest_version 3
                self.shards[e["task"]] = e
            off = 0
            for tid, a, b, sha in e.get("parts", ()):
                self.recut.setdefault(tid, []).append((e, off, a, b, sha))
                off += b - a

    def shard_file(self, entry: dict[str, Any]) -> str | None:
        """A local file of the shard ``entry``, checked against its recorded size and SHA-256; None
        when it is gone or differs."""
        name = str(entry["path"])
        if name in self._files:
            return self._files[name]
        got: str | None = None
        if self.remote is None:
            p = Path(self.where) / name
            with contextlib.suppress(OSError):
                if p.stat().st_size == entry["bytes"] and sha256_file(p) == entry["sha256"]:
                    got = str(p)
        else:  # through the blob cache: a shard this machine has read is not downloaded again
            h, n = str(entry["sha256"]), int(entry["bytes"])
            with contextlib.suppress(DataError, MissingInputError):
                got = str(BlobCache().fetch(h, lambda f: fremote.stream_object(self.remote, name, f, n), size=n,
                                            source=self.remote.url_of(name)))
        self._files[name] = got
        return got

    def late_failures(self) -> dict[str, tuple[str, str]] | None:
        """The previous version's quarantine (``quarantine.jsonl``, checked against its recorded
        SHA-256) by key: a reused part's late decode failures. None when it does not check."""
        if self._late is None:
            side = (self.manifest.get(sidetables.FIELD) or {}).get("quarantine.jsonl")
            if side is None:
                return None
            if self.remote is None:
                try:
                    raw: bytes | None = (Path(self.where) / "quarantine.jsonl").read_bytes()
                except OSError:
                    return None
            else:
                raw = self.remote.get("quarantine.jsonl")
            if raw is None or hashlib.sha256(raw).hexdigest() != side["sha256"]:
                return None
            recs = [json.loads(line) for line in raw.decode("utf-8").splitlines() if line.strip()]
            self._late = {str(r["sample_id"]): (str(r["reason"]), str(r["message"])) for r in recs}
        return self._late


def _previous_local(outp: Path) -> Previous | None:
    sealed = _sealed(outp)  # an unsealed or damaged manifest: nothing is reused
    prev = Previous(str(outp), sealed) if sealed is not None else None
    return prev if prev is not None and (prev.shards or prev.recut) else None


def _previous_in_store(url: str, vdir: str) -> Previous | None:
    """The version ``<url>/latest`` names, unless it is ``vdir``: one GET of ``latest`` (absent before
    the first version), one of its manifest; None when there is none or it does not read."""
    raw = Remote(url).get("latest")
    name = raw.decode("utf-8", "replace").strip() if raw is not None else ""
    if not fremote.VERSION_RE.match(name) or name == vdir:
        return None  # the first version, or a damaged pointer: every shard is built
    vurl = f"{url}/{name}"
    remote = Remote(vurl)
    doc = remote.get(MANIFEST_NAME)
    if doc is None:
        return None
    try:
        m = fmanifest.parse(doc, f"{vurl}/{MANIFEST_NAME}")
    except DataError:
        return None
    prev = Previous(vurl, m, remote)
    return prev if prev.shards or prev.recut else None


def _adopt_previous(tasks: list[PartTask], prev: Previous, target: Any, spec: CacheSpec) -> dict[int, PartResult]:
    """The tasks whose identity names a shard of ``prev`` (or a part its re-cut spread over shards),
    each with those shards verified (size and SHA-256 recorded in ``prev``'s sealed manifest) and
    its part in place: linked into the build directory, or copied server-side into the new version
    in the store; a re-cut part written again from them. A shard that does not verify is left
    alone: its task is built."""
    out: dict[int, PartResult] = {}
    for t in tasks:
        tid = task_sha256(t)
        if tid in prev.shards:
            entry = prev.shards[tid]
            r = _adopt_local(t, entry, prev, spec) if target is None else _adopt_in_store(t, entry, prev, spec)
        elif tid in prev.recut:
            r = _reassemble(t, prev.recut[tid], prev, spec)
        else:
            continue
        if r is not None:
            out[t.index] = r
    return out


def _adopt_local(t: PartTask, entry: dict[str, Any], prev: Previous, spec: CacheSpec) -> PartResult | None:
    src = Path(prev.where) / entry["path"]
    tmp = Path(t.path).with_name(f"{TMP_PREFIX}adopt-{Path(t.path).name}")
    with contextlib.suppress(FileNotFoundError):
        tmp.unlink()
    try:
        try:
            os.link(src, tmp)
        except FileNotFoundError:
            return None
        except OSError:  # another filesystem
            shutil.copyfile(src, tmp)
    except FileNotFoundError:
        return None
    r = adopt(t, entry, str(tmp), spec.max_caption_bytes)  # the link checked: what is adopted is what was checked
    if r is None:
        tmp.unlink()
        return None
    os.replace(tmp, t.path)
    return r


def _adopt_in_store(t: PartTask, entry: dict[str, Any], prev: Previous, spec: CacheSpec) -> PartResult | None:
    """Verified through the blob cache, then copied server-side to where the task's worker would
    have uploaded it."""
    p = prev.shard_file(entry)
    r = adopt(t, entry, p, spec.max_caption_bytes) if p is not None else None
    if r is not None:
        fremote.copy_object(f"{prev.where}/{entry['path']}", t.upload_shard)
    return r


def _reassemble(t: PartTask, ranges: list[tuple[dict[str, Any], int, int, int, str]], prev: Previous,
                spec: CacheSpec) -> PartResult | None:
    """The part of ``t`` written again from the previous version's re-cut shards that hold its
    records (each verified), with its late decode failures from that version's quarantine."""
    files: list[tuple[str, int, int, int]] = []
    end = 0
    for entry, off, a, b, _ in sorted(ranges, key=lambda x: x[2]):
        path = prev.shard_file(entry) if a == end else None
        if path is None:
            return None
        files.append((path, off, a, b))
        end = b
    shas = {x[4] for x in ranges}
    failures: list[list[Any]] = []
    if end < len(t.items):
        late = prev.late_failures()
        if late is None:
            return None
        failures = [[i, *late[it.key]] for i, it in enumerate(t.items) if it.key in late]
    if len(shas) != 1:
        return None
    return reassemble(t, files, shas.pop(), failures, spec.max_caption_bytes)


def _point_latest(url: str, vdir: str) -> None:
    """``<url>/latest`` names ``vdir`` (the last version built, as a local cache path holds the last
    cache built): written when it names another one."""
    loc = parse_location(url)
    fs = filesystem(loc)
    try:
        now = objectstore._call(url, fs.cat_file, loc.join("latest").path)
    except FileNotFoundError:
        now = b""
    if now.strip() != vdir.encode():
        objectstore._call(url, fs.pipe_file, loc.join("latest").path, (vdir + "\n").encode())


def _run_parts(tasks: list[PartTask], ex: Any, workers: int, journal: Any, resources: dict[str, float],
               total: int, target: Any = None) -> tuple[list[PartResult], Any]:
    """Reuse every receipted part, run the rest on ``ex``, receipt each as it finishes
    (warp/etl/driver.py)."""
    listed = None
    # what every worker of an existing cluster must reach (warp/etl/access.py): the build directory,
    # or the store it uploads its parts to; the sources are the driver's (or its spool's) folders
    access = [("output", target.url if target is not None else os.path.dirname(tasks[0].path))] if tasks else []
    if target is not None:
        # what a killed run already uploaded: one listing of the version, one of the build prefix
        listed = (objectstore.list_sizes(target.version_url), objectstore.list_sizes(target.build_url))
    ref = tasks[0].encoder if tasks else None
    by_index = {t.index: t for t in tasks}
    plug = Plug(receipt_id=lambda t: f"part-{t.index:05d}", reuse=lambda t, rec: _reuse(t, rec, listed),
                drop=_drop_part, record=_record, index=lambda r: r.index, units=lambda r: len(by_index[r.index].items))
    return drive(tasks, build_part, journal, plug, executor=ex, workers=workers, label="caching", unit="img",
                 total=total, initializer=functools.partial(preload_encoder, ref) if ref is not None else None,
                 resources=resources or None, access=access)


def _build(spec: CacheSpec, tasks: list[PartTask], runs: list[Sequence[int]], items: list[MediaItem],
           item_source: list[int], probed: dict[int, DecodeFailure], q: Quarantine, inputs: dict[str, Any],
           fp: str, fields: list[FieldSpec], build_dir: Path, ex: Any, n_workers: int,
           resources: dict[str, float], clear: bool, allow_invalid: bool, metrics: dict[str, Any],
           reasons: list[str], orphan_captions: int, device: str | None, t_start: float,
           outp: Path, target: Any = None, prev: Previous | None = None,
           remote: dict[str, Any] | None = None) -> BuildResult:
    h, w = spec.size
    if clear and build_dir.exists():
        shutil.rmtree(build_dir)
    build_dir.mkdir(parents=True, exist_ok=True)
    for leftover in build_dir.glob(f"{TMP_PREFIX}*"):  # half-written parts of a killed run (we hold the lock)
        with contextlib.suppress(FileNotFoundError):
            leftover.unlink()
    # in the store, beside the version, the receipts let a rerun on any machine resume from the store alone
    journal = Journal(str(build_dir) if target is None else target.build_url)
    if target is not None and clear:
        journal.remove()
    t0 = time.perf_counter()
    # the shards of the previous version whose task is unchanged, verified and taken as they are;
    # only the other tasks' media are copied from a source on object storage and decoded
    adopted = _adopt_previous(tasks, prev, target, spec) if prev is not None else {}
    todo = [t for t in tasks if t.index not in adopted]
    for folder in (remote or {}).values():
        folder.materialize([it for t in todo for it in t.items])
    try:
        results, drove = _run_parts(todo, ex, n_workers, journal, resources, sum(len(t.items) for t in todo), target)
        results = sorted([*results, *adopted.values()], key=lambda r: r.index)
    except (DataError, ConfigError):
        shutil.rmtree(build_dir, ignore_errors=True)  # a deterministic failure: a rerun would meet it again
        if target is not None:
            journal.remove()
        raise
    t_build = time.perf_counter() - t0

    late = _verdicts_in_scan_order(tasks, results, runs, items, probed, q)
    verdict = q.evaluate(spec.thresholds)
    try:
        verdict.raise_for_status(allow_invalid=allow_invalid, what=spec.source_label())
    except DataError:
        shutil.rmtree(build_dir, ignore_errors=True)
        if target is not None:
            journal.remove()
        raise
    truncated = _log_problems(verdict, results, spec)
    kept = [i for run in runs for i in run if i not in late]
    kept_keys = [items[i].key for i in kept]
    kept_source = [item_source[i] for i in kept]
    sizes = [s for r in results for s in r.orig_sizes]
    kept_rows = [(items[i].caption, items[i].is_video, int(oh), int(ow)) for i, (oh, ow) in zip(kept, sizes, strict=True)]
    records = len(kept)
    t0 = time.perf_counter()
    layout = _final_layout(tasks, results, runs, kept, items, spec)
    if target is not None:
        # a part re-cut here or placed under another index: brought back from the store (verified)
        _fetch_parts([(tasks[j], results[j]) for j in layout.fetch])
    final = outp if target is None else outp.parent / target.vdir
    with atomic_dir(final, replace=True) as tmp:
        shards: list[dict[str, Any]] = [{}] * len(layout.runs)
        for k, j in layout.placed.items():
            r, name = results[j], SHARD_PATTERN.format(k)
            # in the store the worker uploaded it under its own index's name already
            if target is None or k != j:
                _place(tasks[j].path, tmp / name)
            shards[k] = {"path": name, "records": r.records, "bytes": r.bytes, "sha256": r.sha256,
                         "task": task_sha256(tasks[j])}
        recut = sorted(layout.recut)
        for k, entry in zip(recut, _repack([layout.recut[k] for k in recut], tmp, recut, fields, n_workers),
                            strict=True):
            shards[k] = entry
        t_repack = time.perf_counter() - t0
        manifest = {
            "kind": KIND,
            "format": "WFS1",
            "format_version": WFS_VERSION,
            "manifest_version": MANIFEST_VERSION,
            "fingerprint": fp,
            "fingerprint_inputs": inputs,
            "records": records,
            "shard_size": spec.effective_shard_size,
            "target_size": [h, w],
            "fields": [f.to_dict() for f in fields],
            "record_size": _record_size(fields),
            "shards": shards,
            "captions_truncated": truncated,
            "orphan_captions": orphan_captions,
            "quarantine": q.summary(),
            "verdict": {"status": verdict.status, "allowed": verdict.allowed, "problems": verdict.problems()},
        }
        if spec.sources is not None:
            manifest["sources"] = source_entries(spec, kept_source)
        # the side files by SHA-256 and size, inside the seal: `warp why` and `warp inspect --verify`
        # check them (docs/formats/feature-shard.md, "Cache manifest")
        manifest[sidetables.FIELD] = sidetables.record(tmp, _write_side_files(tmp, kept_keys, kept_rows, shards,
                                                                              kept_source, spec, q))
        manifest = seal(manifest)  # docs/formats/feature-shard.md: the reader checks it on open
        wall = time.perf_counter() - t_start
        metrics.update(_run_metrics(results, layout, records, wall, t_build, t_repack, device, spec, drove))
        metrics["shards_from_previous"] = len(adopted)
        atomic_write_bytes(tmp / "metrics.json", json.dumps(metrics, indent=1, sort_keys=True).encode(), fsync=False)
        atomic_write_bytes(tmp / MANIFEST_NAME, json.dumps(manifest, indent=1, sort_keys=True,
                                                           ensure_ascii=False).encode("utf-8"), fsync=False)
    if target is not None:
        built = sum(1 for k, j in layout.placed.items() if k == j and not results[j].reused)
        return _finish_in_store(target, final, manifest, metrics, reasons, journal, build_dir, built)
    journal.remove()
    shutil.rmtree(build_dir, ignore_errors=True)
    return BuildResult("built", str(outp), manifest, metrics, reasons)


@dataclasses.dataclass
class ShardLayout:
    """The shards of a version: ``runs``, the key cut (or fixed counts) over the records that
    survived every decode; shard ``k`` is part ``placed[k]`` as it is when that part stored every
    record of its task and its task's run is run ``k``, else re-cut from the part ranges
    ``recut[k]`` (path, first and end record, task identity, part SHA-256). ``fetch``: the parts
    an output on object storage must bring back (re-cut, or placed under another index)."""

    runs: list[list[int]]
    placed: dict[int, int]
    recut: dict[int, list[tuple[str, int, int, str, str]]]
    fetch: list[int]


def _final_layout(tasks: list[PartTask], results: list[PartResult], runs: list[Sequence[int]], kept: list[int],
                  items: list[MediaItem], spec: CacheSpec) -> ShardLayout:
    """Where each stored record goes (docs/formats/feature-shard.md, "Building on an executor",
    step 5): with no late decode failure every part is its shard; after one, the cut is made again
    over the records that survived, and only the runs it ends elsewhere are re-cut: with the key
    cut the runs around the failure (a later part keeps its records, maybe under an index moved
    by one), with fixed counts every run from the failure on."""
    failed = any(r.failures for r in results)
    final = _cut_runs(kept, items, spec) if failed else [list(r) for r in runs]
    whole = {tuple(runs[r.index]): r.index for r in results if not r.failures and r.records}
    where: dict[int, tuple[int, int]] = {}  # item index -> (part, record in the part)
    for r in results:
        lost = {f[0] for f in r.failures}
        pos = 0
        for p, i in enumerate(runs[r.index]):
            if p not in lost:
                where[i] = (r.index, pos)
                pos += 1
    placed: dict[int, int] = {}
    recut: dict[int, list[tuple[str, int, int, str, str]]] = {}
    for k, run in enumerate(final):
        j = whole.get(tuple(run))
        if j is not None:
            placed[k] = j
            continue
        ranges: list[tuple[str, int, int, str, str]] = []
        for i in run:
            part, pos = where[i]
            if ranges and ranges[-1][0] == tasks[part].path and ranges[-1][2] == pos:
                ranges[-1] = (*ranges[-1][:2], pos + 1, *ranges[-1][3:])
            else:
                ranges.append((tasks[part].path, pos, pos + 1, task_sha256(tasks[part]), str(results[part].sha256)))
        recut[k] = ranges
    by_path = {t.path: t.index for t in tasks}
    fetch = {j for k, j in placed.items() if k != j} | {by_path[x[0]] for rs in recut.values() for x in rs}
    return ShardLayout(final, placed, recut, sorted(fetch))


def _log_problems(verdict: Any, results: list[PartResult], spec: CacheSpec) -> int:
    """Log the verdict's problems and the truncated captions; returns how many captions were truncated."""
    for problem in verdict.problems():
        log.warning(problem + (" (--allow-invalid)" if verdict.allowed else ""))
    truncated = sum(r.truncated for r in results)
    if truncated:
        log.warning(f"{truncated} caption(s) longer than max_caption_bytes={spec.max_caption_bytes} were "
                    "truncated in the stored text (encoders saw the full caption)")
    return truncated


def _write_side_files(tmp: Path, kept_keys: list[str], kept_rows: list[tuple[str, bool, int, int]],
                      shards: list[dict[str, Any]], kept_source: list[int], spec: CacheSpec, q: Quarantine) -> list[str]:
    """``keys.txt``, ``records.parquet``, ``quarantine.jsonl`` and the quarantine's Parquet beside the
    shards; returns their names."""
    atomic_write_bytes(tmp / "keys.txt", ("\n".join(kept_keys) + ("\n" if kept_keys else "")).encode("utf-8"),
                       fsync=False)
    _write_records(tmp / "records.parquet", kept_keys, kept_rows, shards,
                   None if spec.sources is None else [f"d{i}" for i in kept_source])
    atomic_write_bytes(tmp / "quarantine.jsonl",
                       b"".join(canonical_json(r) + b"\n" for r in q.record_dicts()), fsync=False)
    return ["keys.txt", "records.parquet", "quarantine.jsonl", *q.write_parquet(tmp).values()]


def _verdicts_in_scan_order(tasks: list[PartTask], results: list[PartResult], runs: list[Sequence[int]],
                            items: list[MediaItem], probed: dict[int, DecodeFailure],
                            q: Quarantine) -> dict[int, tuple[str, str]]:
    """Every item's verdict into ``q`` in scan order, as if one process had decoded every item in turn;
    returns the late (full-decode) failures by item index."""
    late: dict[int, tuple[str, str]] = {}
    for task, res in zip(tasks, results, strict=True):
        for pos, reason, message in res.failures:
            late[runs[task.index][pos]] = (reason, message)
    for i, it in enumerate(items):
        if i in probed:
            q.reject(it.run, it.key, it.key, probed[i].reason, f"{it.key}: {probed[i].message}")
        elif i in late:
            q.reject(it.run, it.key, it.key, *late[i])
        else:
            q.accept(it.run, it.key)
    return late


def _run_metrics(results: list[PartResult], layout: ShardLayout, records: int, wall: float,
                 t_build: float, t_repack: float, device: str | None, spec: CacheSpec, drove: Any) -> dict[str, Any]:
    """The run's figures for ``metrics.json`` (timings, rates, where each part ran)."""
    bt = [b for r in results for b in r.batches]
    return {
        "batches": bt,
        "wall_s": round(wall, 4),
        "build_s": round(t_build, 4),
        "repack_s": round(t_repack, 4),
        "records": records,
        "records_per_s": round(records / wall, 2) if wall > 0 else None,
        "io_decode_wait_s": round(sum(b["io_decode_wait_s"] for b in bt), 4),
        "encode_s": round(sum(b["encode_s"] for b in bt), 4),
        "write_s": round(sum(b["write_s"] for b in bt), 4),
        "device": device or "none",  # what caching_device resolved to ("auto": cuda if available)
        "caching_device": spec.caching_device if spec.encoder else None,
        "cluster": drove.cluster,
        "receipts": drove.as_dict(),
        "shards_reused": sum(r.reused for r in results),
        "shards_built": sum(not r.reused for r in results),
        "shards_repacked": len(layout.recut),
        "shards_moved": sum(1 for k, j in layout.placed.items() if k != j),
        "tasks": [{"index": r.index, "records": r.records, "worker": r.worker, "encoder_loads": r.encoder_loads,
                   "reused": r.reused} for r in results],
    }


def _fetch_parts(parts: list[tuple[PartTask, PartResult]]) -> None:
    """Each part's WFS1 file back at ``task.path`` from the store, checked against its receipted
    SHA-256; one that is gone or differs (an interrupted re-cut wrote over a part uploaded under
    its shard name) is built again here: a task's bytes depend only on the task."""

    for task, res in parts:
        url = task.upload_part if res.failures else task.upload_shard
        tmp = f"{task.path}.{TMP_PREFIX}get"
        if fremote.get_file(url, tmp) and sha256_file(tmp) == res.sha256:
            os.replace(tmp, task.path)
            continue
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        again = build_part(dataclasses.replace(task, upload_shard=None, upload_part=None))
        if again.sha256 != res.sha256:
            raise InternalError(f"part {task.index} rebuilt to SHA-256 {again.sha256}, its receipt says "
                                f"{res.sha256}", hint="a part's bytes must depend only on its task; please report this")


def _finish_in_store(target: Any, local: Path, manifest: dict[str, Any], metrics: dict[str, Any],
                     reasons: list[str], journal: Any, build_dir: Path, built: int) -> BuildResult:
    """The version's files to the store (docs/features-config.md, "Output on object storage"):
    re-cut shards, parts placed under another index than their own, and ``metrics.json`` (plain
    PUTs: a rerun may change them before the manifest names them), every other file create-only,
    ``manifest.json`` last, then ``latest``; then the receipts, the build prefix and the staging
    copy go. ``built``: the parts their workers uploaded under their shard's name."""

    t_up = time.perf_counter()
    names = {s["path"] for s in manifest["shards"]}
    recut = sorted(p.name for p in local.glob("shard-*.wfs"))
    for name in recut:
        fremote.put_overwrite(str(local / name), target.shard_url(name))
        (local / name).unlink()
    # parts uploaded under a shard name that the re-cut did not reach (late failures dropped records)
    stray = [n for n in objectstore.list_sizes(target.version_url)
             if n.startswith("shard-") and n.endswith(".wfs") and n not in names]
    fremote.remove(target.version_url, stray)
    fremote.put_overwrite(str(local / "metrics.json"), target.shard_url("metrics.json"))
    (local / "metrics.json").unlink()
    dest, counts = objectstore.upload_version(local, target.url)
    counts = {"uploaded": counts["uploaded"] + built + len(recut) + 1, "reused": counts["reused"]}
    journal.remove()
    fremote.remove(target.build_url)
    shutil.rmtree(local, ignore_errors=True)
    shutil.rmtree(build_dir, ignore_errors=True)
    metrics["upload"] = {**counts, "s": round(time.perf_counter() - t_up, 4)}
    return BuildResult("built", dest, manifest, metrics, reasons)


def source_entries(spec: CacheSpec, kept_source: list[int]) -> list[dict[str, Any]]:
    """The manifest's ``sources``: each directory's contiguous record range and sampling weight."""
    assert spec.sources is not None
    counts = np.bincount(np.asarray(kept_source, np.int64), minlength=len(spec.sources)).tolist()
    entries, first = [], 0
    for i, ((_, prefix, _), d, n) in enumerate(zip(spec.scan_roots(), spec.sources, counts, strict=True)):
        entries.append({"name": f"d{i}", "first_record": first, "records": int(n),
                        "num_repeats": d.num_repeats, "caption_prefix": prefix})
        first += int(n)
    return entries


def _write_records(path: Path, keys: list[str], rows: list[tuple[str, bool, int, int]],
                   shards: list[dict[str, Any]], sources: list[str] | None = None) -> None:
    """``records.parquet``: one row per stored record, in record order (queryable once published).

    Deterministic: rows follow the record order, which is the scan order
    whatever the worker count; written under a temporary name and renamed.
    """
    import pyarrow as pa  # lazy: heavy, and only the commit writes records.parquet
    import pyarrow.parquet as pq

    shard_of: list[str] = []
    index_in: list[int] = []
    for sh in shards:
        shard_of.extend([sh["path"]] * sh["records"])
        index_in.extend(range(sh["records"]))
    if len(shard_of) != len(keys):
        raise DataError(f"{path}: {len(keys)} records kept but the shards hold {len(shard_of)}",
                        hint="this is a bug in the feature-cache writer; rebuild with --clear and report it")
    table = pa.table({
        "record": pa.array(range(len(keys)), pa.int64()),
        "key": pa.array(keys, pa.string()),
        "caption": pa.array([r[0] for r in rows], pa.string()),
        "is_video": pa.array([r[1] for r in rows], pa.bool_()),
        "height": pa.array([r[2] for r in rows], pa.int32()),
        "width": pa.array([r[3] for r in rows], pa.int32()),
        "shard": pa.array(shard_of, pa.string()),
        "shard_index": pa.array(index_in, pa.int32()),
    })
    if sources is not None:  # multi-source caches: which [[directory]] (d<i>) each record came from
        table = table.append_column("source", pa.array(sources, pa.string()))
    with atomic_file(path, fsync=False) as f:  # row groups: `warp why` reads one (docs/lineage.md)
        pq.write_table(table, f, compression="zstd", row_group_size=16384)


def _record_size(fields: Sequence[FieldSpec]) -> int:
    return Layout.pack(list(fields)).record_size
