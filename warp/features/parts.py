"""One part of a feature-cache build on the ETL kit: :class:`PartTask` in, one WFS1 file and a
:class:`PartResult` out (:func:`build_part`: pure, receipted), the worker's encoder and decode
pool, the header check, and the re-pack of parts into shards (docs/formats/feature-shard.md,
"Building on an executor").
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import socket
import sys
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from warpdata.core.atomic import TMP_PREFIX, build_lock
from warpdata.core.canonical import identity, sha256_file
from warpdata.core.errors import DataError, MissingInputError
from warpdata.etl.objectstore import put_create_only
from warpdata.etl.quarantine import (
    Quarantine,
)
from warpdata.features.cachespec import (
    SHARD_PATTERN,
    CacheSpec,
    _encode_caption,
)
from warpdata.features.encoders import BatchEncoder, load_encoder, resolve_device
from warpdata.features.scan import MediaItem
from warpdata.features.transform import DecodeFailure, load_image, load_video_frame, probe
from warpdata.formats.featshard import FeatureShardReader, FeatureShardWriter, FieldSpec
from warpdata.formats.imageinfo import (
    DEFAULT_MAX_PIXELS,
    ImageHeaderError,
    UnknownImageFormat,
    image_info,
    size_problem,
)
from warpdata.storage.locations import filesystem, parse_location

log = logging.getLogger(__name__)

# --- the build on the ETL kit (docs/formats/feature-shard.md, "Building on an executor") -----------

BUILD_PREFIX = f"{TMP_PREFIX}build-"
PART_PATTERN = "part-{:05d}.wfs"


@dataclass(frozen=True)
class EncoderRef:
    """What a worker needs to load the encoder; the key of the per-process encoder cache."""

    name: str
    device: str  # as the driver resolved it, or as configured ("cuda", "cuda:1") for cluster workers
    dtype: str
    options: str  # canonical JSON of the factory's keyword arguments
    size: tuple[int, int]


_ENCODERS: dict[EncoderRef, Any] = {}
_ENCODER_LOCK = threading.Lock()
_ENCODER_LOADS = [0]  # encoders this process has loaded (metrics.json: once per worker)


def worker_encoder(ref: EncoderRef):
    """The :class:`~warpdata.features.encoders.BatchEncoder` of ``ref``, loaded once per process:
    every task a worker runs (and every thread of a local build) shares it."""
    with _ENCODER_LOCK:
        be = _ENCODERS.get(ref)
        if be is None:
            device = resolve_device(ref.device)
            enc = load_encoder(ref.name, device=device, dtype=ref.dtype, options=json.loads(ref.options))
            be = _ENCODERS[ref] = BatchEncoder(enc, device, ref.size, name=ref.name)
            _ENCODER_LOADS[0] += 1
        return be


def preload_encoder(ref: EncoderRef) -> None:
    """A worker's start-up hook (a Dask ``WorkerPlugin``, a process pool's initializer): load the
    encoder before the first task. A failure is left to the first task, which raises it typed."""
    with contextlib.suppress(Exception):
        worker_encoder(ref)


_POOLS: dict[str, ThreadPoolExecutor] = {}
_POOL_LOCK = threading.Lock()


def _decode_pool(key: str, threads: int) -> ThreadPoolExecutor:
    """The decode threads of this process: one pool shared by the tasks running here."""
    with _POOL_LOCK:
        pool = _POOLS.get(key)
        if pool is None:
            pool = _POOLS[key] = ThreadPoolExecutor(max(1, threads), thread_name_prefix="warp-fc-decode")
        return pool


@dataclass
class PartTask:
    """One shard task: a fixed run of records, decoded, encoded and written as one WFS1 file.

    Pure: the file's bytes depend only on the task (docs/formats/receipts.md), wherever it runs.
    """

    index: int
    path: str  # <build dir>/part-NNNNN.wfs
    recipe: str  # cachespec.recipe_identity: the fingerprint's config, encoder and code, not the sources
    spec: CacheSpec
    fields: list[FieldSpec]
    items: list[MediaItem]
    # each item's encoder batch: its position in its task // batch size under the key cut, its
    # position in the scan // batch size under fixed counts (docs/formats/feature-shard.md)
    batches: list[int]
    encoder: EncoderRef | None
    decode_threads: int
    pool_key: str
    # [output] path on object storage (docs/features-config.md, "Output on object storage"): where the
    # worker uploads the finished part, create-only: as its shard when it stored every record, else
    # beside the store's receipts (a late decode failure re-cuts the shards after it)
    upload_shard: str | None = None
    upload_part: str | None = None


@dataclass
class PartResult:
    index: int
    records: int
    sha256: str | None  # None: every record failed to decode (no file)
    bytes: int
    failures: list[list[Any]]  # [position in the task, reason, message]
    orig_sizes: list[list[int]]  # oriented [height, width] of every stored record
    truncated: int  # captions cut at max_caption_bytes
    batches: list[dict[str, Any]] = field(default_factory=list)  # timings (metrics.json)
    worker: str = ""
    encoder_loads: int = 0
    reused: bool = False


def _where() -> str:
    """Where a task runs: the Dask worker's address, else host:pid."""
    if "distributed" in sys.modules:
        try:
            # lazy: only inside a Dask worker, where it is loaded already
            from distributed import get_worker

            return str(get_worker().address)
        except (ImportError, ValueError):
            pass
    return f"{socket.gethostname()}:{os.getpid()}"


def _groups(batches: Sequence[int]) -> list[tuple[int, int]]:
    """Consecutive runs of one batch number, as (start, stop)."""
    out: list[tuple[int, int]] = []
    for i, b in enumerate(batches):
        if out and batches[out[-1][0]] == b:
            out[-1] = (out[-1][0], i + 1)
        else:
            out.append((i, i + 1))
    return out


def build_part(task: PartTask) -> PartResult:
    """Decode, transform, encode and write one part; same task → same bytes, on any worker."""
    spec = task.spec
    h, w = spec.size
    be = worker_encoder(task.encoder) if task.encoder is not None else None
    items = task.items
    groups = _groups(task.batches)
    nbuf = 3  # one being encoded/written, up to two decoding ahead
    cap = max((b - a for a, b in groups), default=0)
    bufs = [np.empty((cap, 3, h, w), np.uint8) for _ in range(min(nbuf, len(groups)))]
    sizes = [np.zeros((cap, 2), np.uint32) for _ in range(len(bufs))]
    pool = _decode_pool(task.pool_key, task.decode_threads)

    def decode_one(bi: int, j: int, it: MediaItem):
        try:
            load = load_video_frame if it.is_video else load_image
            oh, ow = load(it.path, spec.size, bufs[bi][j], interpolation=spec.interpolation)
        except DecodeFailure as e:
            return e
        sizes[bi][j] = (oh, ow)
        return None

    def submit(gi: int):
        a, b = groups[gi]
        return [pool.submit(decode_one, gi % nbuf, j, items[a + j]) for j in range(b - a)]

    writer = FeatureShardWriter(task.path, task.fields, meta={"task": task_sha256(task)},
                                fsync=False)  # the cache directory is fsync'd as a whole (atomic_dir)
    inflight = {gi: submit(gi) for gi in range(min(nbuf - 1, len(groups)))}
    failures: list[list[Any]] = []
    orig: list[list[int]] = []
    truncated = 0
    timings: list[dict[str, Any]] = []
    try:
        for gi, (a, b) in enumerate(groups):
            t0 = time.perf_counter()
            results = [f.result() for f in inflight.pop(gi)]
            t_wait = time.perf_counter() - t0
            if gi + nbuf - 1 < len(groups):
                inflight[gi + nbuf - 1] = submit(gi + nbuf - 1)
            bi = gi % nbuf
            chunk = items[a:b]
            ok = []
            for j, (it, err) in enumerate(zip(chunk, results, strict=True)):
                if err is None:
                    ok.append(j)
                else:
                    failures.append([a + j, err.reason, f"{it.key}: {err.message}"])
            n = len(ok)
            t_enc = t_write = 0.0
            if n:
                sel = np.asarray(ok)
                pix = bufs[bi][:n] if n == len(chunk) else bufs[bi][sel]
                caps = [chunk[j].caption for j in ok]
                rec: dict[str, np.ndarray] = {}
                if be is not None:
                    t1 = time.perf_counter()
                    rec.update(be(pix, caps, [chunk[j].key for j in ok]))
                    t_enc = time.perf_counter() - t1
                t2 = time.perf_counter()
                if spec.effective_store_pixels:
                    rec["pixels"] = pix
                cap_arr = np.zeros((n, spec.max_caption_bytes), np.uint8)
                cap_len = np.zeros(n, np.uint32)
                for k, c in enumerate(caps):
                    raw, cut = _encode_caption(c, spec.max_caption_bytes)
                    truncated += cut
                    cap_arr[k, :len(raw)] = np.frombuffer(raw, np.uint8)
                    cap_len[k] = len(raw)
                rec["caption"], rec["caption_len"] = cap_arr, cap_len
                rec["size"] = np.broadcast_to(np.asarray([h, w], np.uint16), (n, 2))
                rec["orig_size"] = sizes[bi][sel]
                rec["is_video"] = np.asarray([chunk[j].is_video for j in ok], bool)
                writer.append_batch(rec)
                orig.extend(rec["orig_size"].tolist())
                t_write = time.perf_counter() - t2
            timings.append({"n": n, "io_decode_wait_s": round(t_wait, 5), "encode_s": round(t_enc, 5),
                            "write_s": round(t_write, 5)})
        if writer.count:
            info = writer.close()
            sha, nbytes = info.sha256, info.bytes
            if task.upload_shard is not None:
                # an object already there came from an earlier run of this task: the same bytes
                put_create_only(task.path, task.upload_part if failures else task.upload_shard)
                os.unlink(task.path)
        else:
            writer.abort()
            sha, nbytes = None, 0
    except BaseException:
        writer.abort()
        for fs in inflight.values():
            for f in fs:
                f.cancel()
        raise
    return PartResult(task.index, len(orig), sha, nbytes, failures, orig, truncated, timings, _where(),
                      _ENCODER_LOADS[0])


def batching(batches: Sequence[int]) -> list[int]:
    """A task's encoder batches as the lengths of its consecutive runs: what its bytes depend on
    (the batch numbers themselves are scan positions, which records elsewhere move)."""
    return [b - a for a, b in _groups(batches)]


def task_sha256(task: PartTask) -> str:
    """A part's identity: what its receipt binds to and what its shard's meta says
    (``"task"``). The recipe (config with the cut rule, encoder, code; not the other shards'
    sources), its records (key and content digest) and its encoder batches: the same task in
    another version of the cache is the same bytes (docs/formats/feature-shard.md, "Reusing the
    shards of the previous version"). Not the part's index: a cut that appears or disappears
    before it moves the index by one, not the records, so the shard is reused under its new name."""
    return identity([task.recipe, [[it.key, it.digest] for it in task.items], batching(task.batches)])


def adopt(task: PartTask, entry: dict[str, Any], path: str, max_caption_bytes: int) -> PartResult | None:
    """The result of ``task`` from a shard of the previous version, ``entry`` of its manifest, now at
    ``path`` (a link or copy made for this build): None unless the entry's task identity is this
    task's and the file holds the recorded size and SHA-256 (a shard edited since is rebuilt).
    The stored records' original sizes are read back from the shard (``records.parquet`` needs
    them); which captions were cut comes from the task's own captions."""
    if entry.get("task") != task_sha256(task) or entry.get("records") != len(task.items):
        return None
    try:
        if os.stat(path).st_size != entry["bytes"] or sha256_file(path) != entry["sha256"]:
            return None
        with FeatureShardReader(path) as r:
            if r.meta.get("task") != entry["task"] or len(r) != len(task.items):
                return None
            orig = r.records["orig_size"].tolist()
    except (OSError, DataError, MissingInputError):
        return None
    truncated = sum(_encode_caption(it.caption, max_caption_bytes)[1] for it in task.items)
    return PartResult(task.index, len(orig), entry["sha256"], entry["bytes"], [], orig, truncated,
                      worker=_where(), reused=True)


def _reuse(task: PartTask, receipt: dict[str, Any],
           listed: tuple[dict[str, int], dict[str, int]] | None = None) -> PartResult | None:
    """The receipted result of ``task`` when the receipt names this task and its file still verifies
    (the driver deletes a receipt that does not, with the part: warp/etl/driver.py).

    In the store (``listed``: the sizes listed under the version and under the build prefix) the
    part's object must be there with the receipted size: its SHA-256 goes into the manifest, and
    reading every part back would cost what building it did (docs/formats/receipts.md)."""
    if receipt["task_sha256"] != task_sha256(task):
        return None
    res = PartResult(**receipt["result"])
    n = len(task.items)
    if res.index != task.index or res.records + len(res.failures) != n or any(
            not (isinstance(f[0], int) and 0 <= f[0] < n) for f in res.failures):
        return None  # a receipt whose result is not this task's records (damaged or forged): rebuilt
    if res.records and listed is not None:
        sizes, name = (listed[1], PART_PATTERN) if res.failures else (listed[0], SHARD_PATTERN)
        if sizes.get(name.format(task.index)) != res.bytes:
            return None
    elif res.records and sha256_file(task.path) != res.sha256:
        return None
    res.reused = True
    res.batches = []
    return res


def reassemble(task: PartTask, ranges: list[tuple[str, int, int, int]], sha256: str,
               failures: list[list[Any]], max_caption_bytes: int) -> PartResult | None:
    """The part of ``task`` written again from the records a re-cut of the previous version spread
    over its shards: ``ranges`` (a verified shard file, the first record there, the part's first
    and end record), ``failures`` (the part's late decode failures, from the previous version's
    quarantine). None unless the bytes are ``sha256``, the part's recorded SHA-256. Uploaded as
    :func:`build_part` uploads a part."""
    kept = len(task.items) - len(failures)
    if not kept or sum(b - a for _, _, a, b in ranges) != kept:
        return None
    for path, off, a, b in ranges:  # every range inside its shard before a byte is written
        with FeatureShardReader(path) as r:
            if off + b - a > len(r):
                return None
    # committed when the block ends, removed if it raises (warp/core/atomic.py, CommitOnSuccess)
    with FeatureShardWriter(task.path, task.fields, meta={"task": task_sha256(task)}, fsync=False) as writer:
        for path, off, a, b in ranges:
            with FeatureShardReader(path) as r:
                writer.append_batch({f.name: r.records[f.name][off:off + b - a] for f in task.fields})
    info = writer.info
    if info.sha256 != sha256:
        os.unlink(task.path)
        return None
    with FeatureShardReader(task.path) as r:
        orig = r.records["orig_size"].tolist()
    failed = {f[0] for f in failures}
    truncated = sum(_encode_caption(it.caption, max_caption_bytes)[1] for i, it in enumerate(task.items)
                    if i not in failed)
    if task.upload_shard is not None:
        put_create_only(task.path, task.upload_part if failures else task.upload_shard)
        os.unlink(task.path)
    return PartResult(task.index, kept, info.sha256, info.bytes, failures, orig, truncated, worker=_where(),
                      reused=True)


def _drop_part(task: PartTask) -> None:
    """Delete a part whose receipt did not verify (or was damaged), here and in the store: its
    upload is create-only, so an object left there would be kept in place of the rebuilt bytes."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(task.path)
    for url in (task.upload_shard, task.upload_part):
        if url is not None:
            loc = parse_location(url)
            with contextlib.suppress(FileNotFoundError):
                filesystem(loc).rm_file(loc.path)


def _record(out: Any, task: PartTask, r: PartResult) -> None:
    d = asdict(r)
    for k in ("batches", "reused", "worker", "encoder_loads"):
        d.pop(k)
    out.add(f"part-{r.index:05d}", task_sha256(task), r.sha256, r.bytes, d)


def _build_lock(build_dir: Path):
    """One build of a cache at a time: a second waits, then finds the first one's result."""
    return build_lock(build_dir.parent / f"{build_dir.name}.lock", str(build_dir.parent))


class _RootRelative:
    """A quarantine whose records name files relative to their source root (with the ``d<i>/`` key
    prefix of a multi-source cache), never by absolute path: the quarantine table is published
    with the cache, and a machine-local path in it is refused by ``warp publish --from``."""

    def __init__(self, q: Quarantine, root: str, key_prefix: str) -> None:
        self._q, self._root, self._prefix = q, os.path.abspath(root), key_prefix

    def reject(self, run: str, sample_id: str, source: str, code: str, message: str) -> bool:
        if os.path.isabs(source):
            rel = os.path.relpath(source, self._root)
            source = self._prefix + (rel.replace(os.sep, "/") if not rel.startswith("..") else os.path.basename(source))
        return self._q.reject(run, sample_id, source, code, message)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._q, name)


HEADER_BYTES = 1 << 18  # enough for any header imageinfo parses (a JPEG's SOF follows its EXIF segments)


def header_problem(path: str, max_pixels: int) -> DecodeFailure | None:
    """``too-many-pixels`` / ``impossible-header`` from the file's header alone
    (:func:`warpdata.formats.imageinfo.size_problem`), before Pillow opens it; None if it passes
    or is not a format imageinfo parses (the decoder's own checks then apply)."""
    try:
        with open(path, "rb") as f:
            head = f.read(HEADER_BYTES)
            nbytes = os.fstat(f.fileno()).st_size
        info = image_info(head, path)
    except (OSError, ImageHeaderError, UnknownImageFormat):
        return None  # the full probe names it
    bad = size_problem(info.format, info.width, info.height, nbytes, max_pixels, head)
    return DecodeFailure(*bad) if bad else None


def _probe_all(items: Sequence[MediaItem], workers: int, max_pixels: int = DEFAULT_MAX_PIXELS
               ) -> dict[int, DecodeFailure]:
    """Every item's header, on a thread pool: the failures a full decode is certain to meet."""
    if not items:
        return {}

    def one(it: MediaItem) -> DecodeFailure | None:
        return (None if it.is_video else header_problem(it.path, max_pixels)) or probe(it.path, it.is_video)

    with ThreadPoolExecutor(max(1, min(workers, len(items)))) as pool:
        found = pool.map(one, items, chunksize=64)
        return {i: f for i, f in enumerate(found) if f is not None}


def _repack(final: list[list[tuple[str, int, int, str, str]]], out_dir: Path, indices: list[int],
            fields: list[FieldSpec], threads: int) -> list[dict[str, Any]]:
    """The re-cut shards: shard ``indices[k]`` holds the part ranges ``final[k]`` (path, first and
    end record of the part, task identity, SHA-256), in order. The key cut over the records that
    survived a late decode failure ends a run elsewhere than the parts do near the failure
    (docs/formats/feature-shard.md, "Building on an executor"). A re-cut shard's entry names the
    part ranges it holds (``parts``: task identity, first and end record of the part, the part's
    SHA-256), and its identity is theirs."""

    def one(k: int) -> dict[str, Any]:
        name = SHARD_PATTERN.format(indices[k])
        held = [[t, a, b, sha] for _, a, b, t, sha in final[k]]
        tid = identity(["re-cut", held])
        with FeatureShardWriter(out_dir / name, fields, meta={"task": tid}, fsync=False) as w:
            for path, a, b, _, _ in final[k]:
                with FeatureShardReader(path) as r:
                    w.append_batch({f.name: r.records[f.name][a:b] for f in fields})
        info = w.info
        return {"path": name, "records": info.records, "bytes": info.bytes, "sha256": info.sha256, "task": tid,
                "parts": held}

    with ThreadPoolExecutor(max(1, min(threads, len(final) or 1))) as pool:
        return list(pool.map(one, range(len(final))))


def _place(src: str, dst: Path) -> None:
    """A finished part becomes a shard of the same bytes: a hard link (same directory tree), else a copy."""
    try:
        os.link(src, dst)
    except OSError:
        shutil.copyfile(src, dst)
