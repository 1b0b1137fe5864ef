"""Build a feature cache: scan → decode/crop/resize → (encode) → WFS1 shards + manifest.

Contract:

* :class:`ShardCacheWriter` appends record batches to ``shard-NNNNN.wfs``
  files of exactly ``shard_size`` records (the last one may be shorter),
  append-only, each renamed into place when full; :meth:`close` returns the
  shard entries (name, records, bytes, sha256) for the manifest.
* :func:`build_cache` is the whole build for one :class:`CacheSpec`. The
  cache directory is fixed (``[output] path``); its ``manifest.json`` carries
  ``"kind": "feature-cache"`` and a fingerprint: SHA-256 of the canonical JSON
  of the dataset config (with a content digest of every usable source), the
  encoder identity (callable, version, weights hash, dtype, device type) and
  the code versions (warpdata, WFS format, Pillow, torch). A cache whose
  fingerprint matches and whose shards are present is reused untouched;
  any change rebuilds it. The manifest is sealed by ``content_sha256``
  (:mod:`.manifest`); an unsealed or damaged one is rebuilt. The new cache is
  built in a temporary sibling and exchanged with the old one in one step
  (:func:`warpdata.core.atomic.atomic_dir`), so a killed build leaves the old cache
  or the new one, never neither.
* Quarantine thresholds are checked after the scan (fail fast) and again
  after decoding, before the rename: a failing build leaves nothing behind
  unless ``allow_invalid``.
* Sources: one folder (``CacheSpec.source``) or several (``CacheSpec.sources``,
  the ``[[directory]]`` tables), scanned in order into one record sequence;
  with several, keys are ``d<i>/<path>`` and the manifest's ``sources`` gives
  each folder's record range, ``num_repeats`` and caption prefix
  (docs/formats/feature-shard.md, "Sources"; both join the fingerprint). With
  one folder the cache is exactly what it was before ``sources`` existed.
* Beside the shards: ``keys.txt`` (record keys in order), ``quarantine.jsonl``
  and ``records.parquet`` (one row per record: record, key, caption,
  is_video, original height/width, shard, shard_index), which becomes the
  queryable ``records`` table of a dataset published with ``warp publish
  --from``. All are outputs, not fingerprint inputs.

``[output] path`` may be an object-store URL (``s3://bucket/prefix``): the build stages here, each
worker uploads the part it built create-only, the receipts live in the store, and the version's
files go up with ``manifest.json`` last, then ``latest`` (docs/features-config.md, "Output on
object storage"; :mod:`warpdata.features.remote`). The bytes are those of a local build.

The build runs on the ETL kit (docs/formats/feature-shard.md, "Building on an
executor"): the driver scans and probes every header (:func:`~warpdata.features.transform.probe`),
cuts the probed records by count into :class:`PartTask` s (:func:`build_part`:
pure, one WFS1 file each, receipted), runs them on any executor
(``warpdata.etl.executors``), turns the parts into shards (re-packing after a
late decode failure so every shard but the last holds ``shard_size`` records)
and commits. Inside a task, decoding runs on the worker's thread pool (Pillow
releases the GIL while decoding and resizing) one to two batches ahead of the
encoder, into preallocated rotating buffers, so the encoder is fed while the
next batch decodes; the encoder is loaded once per worker process
(:func:`worker_encoder`). Per batch the build records the time the task waited
for decoded pixels (I/O + decode), the encoder time and the write time
(``metrics.json``, with the executor and where each part ran).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import threading
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from warpdata.artifacts.manifests import MANIFEST_NAME
from warpdata.core.atomic import TMP_PREFIX, atomic_dir, atomic_file, atomic_write_bytes
from warpdata.core.canonical import canonical_json, identity, seal
from warpdata.core.errors import ConfigError, DataError
from warpdata.core.names import FEATURE_CACHE
from warpdata.etl.quarantine import (
    Quarantine,
    RunSummary,
    Thresholds,
    evaluate_summaries,
    register_reason,
)
from warpdata.features.manifest import MANIFEST_VERSION
from warpdata.features.scan import MediaItem, scan, source_digest
from warpdata.features.transform import DecodeFailure, load_image, load_video_frame
from warpdata.formats.featshard import VERSION as WFS_VERSION
from warpdata.formats.featshard import FeatureShardWriter, FieldSpec
from warpdata.formats.imageinfo import DEFAULT_MAX_PIXELS, IMAGE_LIMIT_REASONS

log = logging.getLogger(__name__)

KIND = FEATURE_CACHE
SHARD_PATTERN = "shard-{:05d}.wfs"
DEFAULT_SHARD_SIZE = 512
PIXEL_BATCH = 64  # decode batch when no encoder sets one


class ShardCacheWriter:
    """Append-only writer of fixed-size shards into one directory."""

    def __init__(self, directory: str | os.PathLike, fields: Sequence[FieldSpec], *,
                 shard_size: int = DEFAULT_SHARD_SIZE, record_crc: bool = True, fsync: bool = True,
                 meta: Mapping[str, Any] | None = None) -> None:
        if shard_size < 1:
            raise ConfigError(f"shard_size must be >= 1, got {shard_size}")
        self.directory = Path(directory)
        self.fields = list(fields)
        self.shard_size = shard_size
        self._record_crc, self._fsync, self._meta = record_crc, fsync, dict(meta or {})
        self._cur: FeatureShardWriter | None = None
        self.shards: list[dict[str, Any]] = []
        self.records = 0

    def _open_next(self) -> FeatureShardWriter:
        i = len(self.shards)
        return FeatureShardWriter(self.directory / SHARD_PATTERN.format(i), self.fields,
                                  meta={**self._meta, "shard": i}, record_crc=self._record_crc,
                                  fsync=self._fsync)

    def _finish_current(self) -> None:
        if self._cur is None:
            return
        info = self._cur.close()
        self.shards.append({"path": os.path.basename(info.path), "records": info.records,
                            "bytes": info.bytes, "sha256": info.sha256})
        self._cur = None

    def append_batch(self, batch: Mapping[str, np.ndarray]) -> None:
        n = len(next(iter(batch.values()))) if batch else 0
        start = 0
        while start < n:
            if self._cur is None:
                self._cur = self._open_next()
            take = min(self.shard_size - self._cur.count, n - start)
            self._cur.append_batch({k: v[start:start + take] for k, v in batch.items()})
            start += take
            self.records += take
            if self._cur.count == self.shard_size:
                self._finish_current()

    def close(self) -> list[dict[str, Any]]:
        self._finish_current()
        return list(self.shards)

    def abort(self) -> None:
        if self._cur is not None:
            self._cur.abort()
            self._cur = None


for _reason in IMAGE_LIMIT_REASONS:  # header checks of every image pipeline (formats/imageinfo.py)
    register_reason(*_reason)


@dataclass(frozen=True)
class SourceDir:
    """One ``[[directory]]`` of a multi-source cache (docs/features-config.md)."""

    path: str
    num_repeats: int = 1  # times the sampler yields each of its records per epoch; records are stored once
    caption_prefix: str | None = None  # None: the cache-wide CacheSpec.caption_prefix


@dataclass
class CacheSpec:
    """Everything a build needs; ``etl.py`` fills it from the TOML config.

    One source directory (``source``, today's ``[source] path``) or several (``sources``, the
    ``[[directory]]`` tables; ``source`` is then ignored). With ``sources`` every key is prefixed
    ``d<i>/`` and the manifest records each directory's record range and ``num_repeats``.
    """

    source: str
    output: str
    size: tuple[int, int]
    caption_prefix: str = ""
    caption_ext: str = ".txt"
    interpolation: str = "bicubic"
    max_caption_bytes: int = 512
    encoder: str = ""  # "" = store preprocessed pixels only
    encoder_options: dict[str, Any] = field(default_factory=dict)
    encoder_dtype: str = "float16"
    caching_batch_size: int = 64
    caching_device: str = "auto"
    shard_size: int | None = None  # default: caching_batch_size with an encoder, else 512
    store_pixels: bool | None = None  # default: True without an encoder
    thresholds: Thresholds = field(default_factory=Thresholds)
    sources: list[SourceDir] | None = None
    max_pixels: int = DEFAULT_MAX_PIXELS  # images declaring more are quarantined too-many-pixels, undecoded

    def scan_roots(self) -> list[tuple[str, str, str]]:
        """(directory, caption prefix, key prefix) of every source directory, in order."""
        if self.sources is None:
            return [(self.source, self.caption_prefix, "")]
        return [(d.path, self.caption_prefix if d.caption_prefix is None else d.caption_prefix, f"d{i}/")
                for i, d in enumerate(self.sources)]

    def source_label(self) -> str:
        return self.source if self.sources is None else ", ".join(d.path for d in self.sources)

    @property
    def effective_shard_size(self) -> int:
        if self.shard_size is not None:
            return self.shard_size
        return self.caching_batch_size if self.encoder else DEFAULT_SHARD_SIZE

    @property
    def effective_store_pixels(self) -> bool:
        return (not self.encoder) if self.store_pixels is None else self.store_pixels


@dataclass
class BuildResult:
    status: str  # built | up-to-date
    path: str
    manifest: dict[str, Any]
    metrics: dict[str, Any]
    reasons: list[str] = field(default_factory=list)  # why it was (re)built


def base_fields(spec: CacheSpec) -> list[FieldSpec]:
    h, w = spec.size
    fields = []
    if spec.effective_store_pixels:
        fields.append(FieldSpec("pixels", "uint8", (3, h, w)))
    fields += [FieldSpec("caption", "uint8", (spec.max_caption_bytes,)),
               FieldSpec("caption_len", "uint32"),
               FieldSpec("size", "uint16", (2,)),
               FieldSpec("orig_size", "uint32", (2,)),
               FieldSpec("is_video", "bool")]
    return fields


def code_versions(with_torch: bool) -> dict[str, str]:
    import PIL
    import warpdata

    v = {"warpdata": warpdata.__version__, "wfs": str(WFS_VERSION), "pillow": PIL.__version__,
         "numpy": np.__version__}
    if with_torch:
        import torch

        v["torch"] = torch.__version__
    return v


def fingerprint_inputs(spec: CacheSpec, digest: str, encoder_identity: dict[str, Any] | None) -> dict[str, Any]:
    h, w = spec.size
    dataset: dict[str, Any] = {
        "caption_prefix": spec.caption_prefix, "caption_ext": spec.caption_ext,
        "target_size": [h, w], "interpolation": spec.interpolation,
        "max_caption_bytes": spec.max_caption_bytes, "store_pixels": spec.effective_store_pixels,
        "shard_size": spec.effective_shard_size, "source_digest": digest}
    if spec.max_pixels != DEFAULT_MAX_PIXELS:  # another cap keeps other records
        dataset["max_pixels"] = spec.max_pixels
    if spec.sources is not None:
        # num_repeats changes no stored byte but what a reader samples: the identity covers it
        # (docs/formats/feature-shard.md, "Sources"); the digest covers each directory's content by key
        dataset["sources"] = [{"caption_prefix": prefix, "num_repeats": d.num_repeats}
                              for d, (_, prefix, _) in zip(spec.sources, spec.scan_roots(), strict=True)]
    return {
        "dataset": dataset,
        "encoder": encoder_identity,
        "code": code_versions(encoder_identity is not None),
    }


def _existing(path: Path) -> dict[str, Any] | None:
    m = path / MANIFEST_NAME
    if not m.is_file():
        return None
    try:
        data = json.loads(m.read_bytes())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    return data if isinstance(data, dict) else None


def _sealed(path: Path) -> dict[str, Any] | None:
    """The manifest if it passes the schema and its content seal, else None (the cache is rebuilt)."""
    from warpdata.features.manifest import read

    try:
        return read(path)
    except (DataError, OSError):
        return None


def _shards_present(path: Path, manifest: dict[str, Any]) -> bool:
    try:
        return all((path / s["path"]).stat().st_size == s["bytes"] for s in manifest.get("shards", []))
    except (OSError, KeyError, TypeError):
        return False


def _encode_caption(text: str, limit: int) -> tuple[bytes, bool]:
    raw = text.encode("utf-8")
    if len(raw) <= limit:
        return raw, False
    # cut on a UTF-8 character boundary: never store half a character
    cut = raw[:limit]
    return cut.decode("utf-8", errors="ignore").encode("utf-8"), True


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
            from warpdata.features.encoders import BatchEncoder, load_encoder, resolve_device

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
    fingerprint: str
    spec: CacheSpec
    fields: list[FieldSpec]
    items: list[MediaItem]
    batches: list[int]  # each item's encoder batch: its position in the scan // batch size
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
    import socket
    import sys

    if "distributed" in sys.modules:
        try:
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

    writer = FeatureShardWriter(task.path, task.fields, meta={"fingerprint": task.fingerprint, "shard": task.index},
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
                from warpdata.etl.objectstore import put_create_only

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


def task_sha256(task: PartTask) -> str:
    """What a part's receipt binds to: the cache fingerprint (config, encoder, code, every source's
    content), the part's place and its records and batches."""
    return identity([task.fingerprint, task.index, [[it.key, it.digest] for it in task.items], task.batches])


def _reuse(task: PartTask, receipt: dict[str, Any],
           listed: tuple[dict[str, int], dict[str, int]] | None = None) -> PartResult | None:
    """The receipted result of ``task`` when the receipt names this task and its file still verifies
    (the driver deletes a receipt that does not, with the part: warp/etl/driver.py).

    In the store (``listed``: the sizes listed under the version and under the build prefix) the
    part's object must be there with the receipted size: its SHA-256 goes into the manifest, and
    reading every part back would cost what building it did (docs/formats/receipts.md)."""
    from warpdata.core.canonical import sha256_file

    if receipt["task_sha256"] != task_sha256(task):
        return None
    res = PartResult(**receipt["result"])
    if res.records and listed is not None:
        sizes, name = (listed[1], PART_PATTERN) if res.failures else (listed[0], SHARD_PATTERN)
        if sizes.get(name.format(task.index)) != res.bytes:
            return None
    elif res.records and sha256_file(task.path) != res.sha256:
        return None
    res.reused = True
    res.batches = []
    return res


def _drop_part(task: PartTask) -> None:
    """Delete a part whose receipt did not verify (or was damaged), here and in the store: its
    upload is create-only, so an object left there would be kept in place of the rebuilt bytes."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(task.path)
    for url in (task.upload_shard, task.upload_part):
        if url is not None:
            from warpdata.storage.locations import filesystem, parse_location

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
    from warpdata.core.atomic import build_lock

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
    from warpdata.formats.imageinfo import (
        ImageHeaderError,
        UnknownImageFormat,
        image_info,
        size_problem,
    )

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
    from warpdata.features.transform import probe

    if not items:
        return {}

    def one(it: MediaItem) -> DecodeFailure | None:
        return (None if it.is_video else header_problem(it.path, max_pixels)) or probe(it.path, it.is_video)

    with ThreadPoolExecutor(max(1, min(workers, len(items)))) as pool:
        found = pool.map(one, items, chunksize=64)
        return {i: f for i, f in enumerate(found) if f is not None}


def _repack(parts: list[tuple[str, int]], out_dir: Path, first: int, per_shard: int, fields: list[FieldSpec],
            fp: str, threads: int) -> list[dict[str, Any]]:
    """Shards ``first``, ``first + 1``, … of ``per_shard`` records each from the records of ``parts``
    (path, record count), in order: the cut after a full-decode failure moved the boundaries."""
    from warpdata.formats.featshard import FeatureShardReader

    plan: list[list[tuple[str, int, int]]] = []
    cur: list[tuple[str, int, int]] = []
    n = 0
    for path, count in parts:
        a = 0
        while a < count:
            take = min(per_shard - n, count - a)
            cur.append((path, a, a + take))
            n += take
            a += take
            if n == per_shard:
                plan.append(cur)
                cur, n = [], 0
    if cur:
        plan.append(cur)

    def one(k: int) -> dict[str, Any]:
        name = SHARD_PATTERN.format(first + k)
        w = FeatureShardWriter(out_dir / name, fields, meta={"fingerprint": fp, "shard": first + k}, fsync=False)
        try:
            for path, a, b in plan[k]:
                with FeatureShardReader(path) as r:
                    w.append_batch({f.name: r.records[f.name][a:b] for f in fields})
            info = w.close()
        except BaseException:
            w.abort()
            raise
        return {"path": name, "records": info.records, "bytes": info.bytes, "sha256": info.sha256}

    with ThreadPoolExecutor(max(1, min(threads, len(plan) or 1))) as pool:
        return list(pool.map(one, range(len(plan))))


def _place(src: str, dst: Path) -> None:
    """A finished part becomes a shard of the same bytes: a hard link (same directory tree), else a copy."""
    try:
        os.link(src, dst)
    except OSError:
        import shutil

        shutil.copyfile(src, dst)


def build_cache(spec: CacheSpec, *, clear: bool = False, allow_invalid: bool = False,
                workers: int | None = None, executor: Any = None, decode_threads: int = 0,
                resources: dict[str, float] | None = None) -> BuildResult:
    """Build (or reuse) the cache of ``spec`` on ``executor`` (an ExecutorSpec or its text; default
    ``WARP_EXECUTOR`` or local threads) with ``workers`` concurrent shard tasks.

    ``decode_threads``: decode threads per worker process (0: the worker count on the local
    executor, whose tasks share one pool; elsewhere the CPUs divided among the workers started
    here, 2 on an existing cluster). ``resources``: what every task asks of a Dask/Ray cluster
    (None: ``{"GPU": 1}`` when the encoder runs on CUDA there, else nothing).
    """
    from warpdata.etl import cut
    from warpdata.etl.executors import ExecutorSpec, parse_executor, require, resolve_executor
    from warpdata.etl.workers import cpu_count

    t_start = time.perf_counter()
    from warpdata.features import remote as fremote

    store_url = spec.output.rstrip("/") if fremote.is_url(spec.output) else None
    if store_url is not None:
        # docs/features-config.md, "Output on object storage": staged here, shards uploaded by the
        # workers, receipts in the store; an unreachable store stops the run before any work (exit 75)
        from warpdata.etl import objectstore

        objectstore.check_reachable(store_url)
        outp = objectstore.staging_root(store_url) / "cache"
    else:
        outp = Path(spec.output)
    ex = executor if isinstance(executor, ExecutorSpec) else (
        parse_executor(executor) if executor else resolve_executor())
    require(ex)
    n_workers = max(1, workers or cpu_count())
    # the encoder first: a bad encoder config is reported before any data is read
    enc = batch_encoder = enc_ref = None
    device = None
    if spec.encoder:
        from warpdata.features.encoders import BatchEncoder, load_encoder, resolve_device

        # on a cluster the workers hold the GPUs: the driver loads the encoder on its CPU for the
        # identity and the fields only, and the tasks resolve caching_device where they run
        remote_cuda = ex.distributed and spec.caching_device.startswith("cuda")
        device = spec.caching_device if remote_cuda else resolve_device(spec.caching_device)
        enc = load_encoder(spec.encoder, device="cpu" if remote_cuda else device, dtype=spec.encoder_dtype,
                           options=spec.encoder_options)
        batch_encoder = BatchEncoder(enc, "cpu" if remote_cuda else device, spec.size, name=spec.encoder)
        enc_ref = EncoderRef(spec.encoder, device, spec.encoder_dtype,
                             canonical_json(spec.encoder_options).decode("utf-8"), tuple(spec.size))
    if resources is None:
        resources = {"GPU": 1} if device is not None and device.startswith("cuda") and ex.distributed else {}

    q = Quarantine()
    t_scan0 = time.perf_counter()
    items: list[MediaItem] = []
    item_source: list[int] = []  # index of each item's source directory
    orphan_captions = 0
    for i, (root, prefix, key_prefix) in enumerate(spec.scan_roots()):
        scanned = scan(root, _RootRelative(q, root, key_prefix), caption_prefix=prefix, caption_ext=spec.caption_ext, exclude=(outp,),
                       key_prefix=key_prefix)
        items += scanned.items
        item_source += [i] * len(scanned.items)
        orphan_captions += scanned.orphan_captions
    t_scan = time.perf_counter() - t_scan0

    # fail fast: rejections found by the scan already exceed a fail threshold
    agg = q.aggregate()
    pending = RunSummary(**{**agg.__dict__, "by_reason": dict(agg.by_reason)})
    pending.total += len(items)
    pending.non_empty += len(items)
    examples: dict[str, list[dict[str, str]]] = {}
    for r in q.record_dicts():
        ex_list = examples.setdefault(r["reason"], [])
        if len(ex_list) < 3:
            ex_list.append(r)
    early = evaluate_summaries([("aggregate", pending)], spec.thresholds, examples)
    early.raise_for_status(allow_invalid=allow_invalid, what=spec.source_label())

    enc_identity = None
    if enc is not None:
        enc_identity = {"config_name": spec.encoder, **enc.identity(), "device_type": device.split(":")[0]}
    inputs = fingerprint_inputs(spec, source_digest(items), enc_identity)
    fp = identity(inputs)

    old = _existing(outp)
    reasons: list[str] = []
    target = None
    if store_url is not None:
        target, up = _store_target(store_url, fp, clear, reasons, t_scan)
        if up is not None:
            return up
    elif outp.exists():
        if old is None or old.get("kind") != KIND:
            if old is not None or any(outp.iterdir()):
                raise ConfigError(f"{outp} exists and is not a feature cache",
                                  hint="choose another [output] path; warp only replaces its own caches")
            reasons.append("new cache")
        elif (sealed := _sealed(outp)) is not None and sealed.get("fingerprint") == fp and not clear \
                and _shards_present(outp, sealed):
            return BuildResult("up-to-date", str(outp), sealed, {"scan_s": round(t_scan, 4)})
        elif clear:
            reasons.append("--clear")
        elif old.get("fingerprint") != fp:
            prev = old.get("fingerprint_inputs", {})
            changed = [k for k in ("dataset", "encoder", "code") if identity(prev.get(k)) != identity(inputs[k])] \
                if isinstance(prev, dict) else []
            reasons.append("fingerprint changed" + (f" ({', '.join(changed)})" if changed else ""))
        elif _sealed(outp) is None:
            reasons.append("manifest unsealed or damaged")
        else:
            reasons.append("shards missing or resized")
    else:
        reasons.append("new cache")

    # the driver pass: every header, so the plan holds only records a full decode can store
    t0 = time.perf_counter()
    probed = _probe_all(items, n_workers, spec.max_pixels)
    pre = Quarantine()
    pre.merge(q)
    for i, it in enumerate(items):
        f = probed.get(i)
        if f is None:
            pre.accept(it.run, it.key)
        else:
            pre.reject(it.run, it.key, it.key, f.reason, f"{it.key}: {f.message}")
    pre.evaluate(spec.thresholds).raise_for_status(allow_invalid=allow_invalid, what=spec.source_label())
    t_probe = time.perf_counter() - t0

    fields = base_fields(spec) + (batch_encoder.fields if batch_encoder else [])
    batch = spec.caching_batch_size if spec.encoder else PIXEL_BATCH
    per_shard = spec.effective_shard_size
    h, w = spec.size
    planned = [i for i in range(len(items)) if i not in probed]
    runs = cut(planned, per_shard)
    name_hash = identity(os.path.abspath(outp))[:8]
    build_dir = outp.parent / f"{BUILD_PREFIX}{fp[:12]}-{name_hash}"
    if decode_threads <= 0:
        if ex.kind == "thread":
            decode_threads = n_workers
        elif ex.address is None:
            decode_threads = max(1, cpu_count() // n_workers)
        else:
            decode_threads = 2
    own_pool = None
    if ex.kind == "thread":
        own_pool = f"build-{os.getpid()}-{id(spec)}-{time.monotonic_ns()}"
        _POOLS[own_pool] = ThreadPoolExecutor(decode_threads, thread_name_prefix="warp-fc-decode")
        if enc_ref is not None:
            with _ENCODER_LOCK:  # this process's tasks share the driver's encoder
                _ENCODERS.setdefault(enc_ref, batch_encoder)
    pool_key = own_pool or f"threads-{decode_threads}"
    tasks = [PartTask(j, str(build_dir / PART_PATTERN.format(j)), fp, spec, fields, [items[i] for i in run],
                      [i // batch for i in run], enc_ref, decode_threads, pool_key)
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
                          t_start, outp, target)
    finally:
        if own_pool is not None:
            _POOLS.pop(own_pool).shutdown(wait=False)
            if enc_ref is not None:
                with _ENCODER_LOCK:
                    if _ENCODERS.get(enc_ref) is batch_encoder:
                        del _ENCODERS[enc_ref]


def _store_target(url: str, fp: str, clear: bool, reasons: list[str], t_scan: float):
    """``(StoreTarget, None)`` for a version to build in the store at ``url``, or ``(None, result)``
    when a complete version of fingerprint ``fp`` is there (one listing, one manifest GET)."""
    import datetime as _dt

    from warpdata.etl import objectstore
    from warpdata.features import manifest as fmanifest
    from warpdata.features.remote import StoreTarget, version_name

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


def _point_latest(url: str, vdir: str) -> None:
    """``<url>/latest`` names ``vdir`` (the last version built, as a local cache path holds the last
    cache built): written when it names another one."""
    from warpdata.etl import objectstore
    from warpdata.storage.locations import filesystem, parse_location

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
    import functools

    from warpdata.etl.driver import Plug, drive

    listed = None
    # what every worker of an existing cluster must reach (warp/etl/access.py): the build directory,
    # or the store it uploads its parts to; the sources are the driver's (or its spool's) folders
    access = [("output", target.url if target is not None else os.path.dirname(tasks[0].path))] if tasks else []
    if target is not None:
        from warpdata.etl import objectstore

        # what a killed run already uploaded: one listing of the version, one of the build prefix
        listed = (objectstore.list_sizes(target.version_url), objectstore.list_sizes(target.build_url))
    ref = tasks[0].encoder if tasks else None
    plug = Plug(receipt_id=lambda t: f"part-{t.index:05d}", reuse=lambda t, rec: _reuse(t, rec, listed),
                drop=_drop_part, record=_record, index=lambda r: r.index, units=lambda r: len(tasks[r.index].items))
    return drive(tasks, build_part, journal, plug, executor=ex, workers=workers, label="caching", unit="img",
                 total=total, initializer=functools.partial(preload_encoder, ref) if ref is not None else None,
                 resources=resources or None, access=access)


def _build(spec: CacheSpec, tasks: list[PartTask], runs: list[Sequence[int]], items: list[MediaItem],
           item_source: list[int], probed: dict[int, DecodeFailure], q: Quarantine, inputs: dict[str, Any],
           fp: str, fields: list[FieldSpec], build_dir: Path, ex: Any, n_workers: int,
           resources: dict[str, float], clear: bool, allow_invalid: bool, metrics: dict[str, Any],
           reasons: list[str], orphan_captions: int, device: str | None, t_start: float,
           outp: Path, target: Any = None) -> BuildResult:
    import shutil

    from warpdata.etl.receipts import Journal

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
    try:
        results, drove = _run_parts(tasks, ex, n_workers, journal, resources, len(items) - len(probed), target)
    except (DataError, ConfigError):
        shutil.rmtree(build_dir, ignore_errors=True)  # a deterministic failure: a rerun would meet it again
        if target is not None:
            journal.remove()
        raise
    t_build = time.perf_counter() - t0

    # verdicts in scan order, as if one process had decoded every item in turn
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
    verdict = q.evaluate(spec.thresholds)
    try:
        verdict.raise_for_status(allow_invalid=allow_invalid, what=spec.source_label())
    except DataError:
        shutil.rmtree(build_dir, ignore_errors=True)
        if target is not None:
            journal.remove()
        raise
    for problem in verdict.problems():
        log.warning(problem + (" (--allow-invalid)" if verdict.allowed else ""))
    truncated = sum(r.truncated for r in results)
    if truncated:
        log.warning(f"{truncated} caption(s) longer than max_caption_bytes={spec.max_caption_bytes} were "
                    "truncated in the stored text (encoders saw the full caption)")
    kept = [i for run in runs for i in run if i not in late]
    kept_keys = [items[i].key for i in kept]
    kept_source = [item_source[i] for i in kept]
    sizes = [s for r in results for s in r.orig_sizes]
    kept_rows = [(items[i].caption, items[i].is_video, int(oh), int(ow)) for i, (oh, ow) in zip(kept, sizes, strict=True)]
    records = len(kept)
    # parts before the first full-decode failure are the shards; after it the boundaries moved
    first_late = next((r.index for r in results if r.failures), len(results))
    t0 = time.perf_counter()
    if target is not None:
        # the parts after the first late failure are re-cut here: bring them back from the store
        _fetch_parts([(tasks[r.index], r) for r in results[first_late:] if r.records])
    final = outp if target is None else outp.parent / target.vdir
    with atomic_dir(final, replace=True) as tmp:
        shards = []
        for r in results[:first_late]:
            name = SHARD_PATTERN.format(r.index)
            if target is None:  # in the store the worker uploaded it under this name already
                _place(tasks[r.index].path, tmp / name)
            shards.append({"path": name, "records": r.records, "bytes": r.bytes, "sha256": r.sha256})
        shards += _repack([(tasks[r.index].path, r.records) for r in results[first_late:] if r.records], tmp,
                          first_late, spec.effective_shard_size, fields, fp, n_workers)
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
        manifest = seal(manifest)  # docs/formats/feature-shard.md: the reader checks it on open
        atomic_write_bytes(tmp / "keys.txt", ("\n".join(kept_keys) + ("\n" if kept_keys else "")).encode("utf-8"),
                           fsync=False)
        _write_records(tmp / "records.parquet", kept_keys, kept_rows, shards,
                       None if spec.sources is None else [f"d{i}" for i in kept_source])
        atomic_write_bytes(tmp / "quarantine.jsonl",
                           b"".join(canonical_json(r) + b"\n" for r in q.record_dicts()), fsync=False)
        q.write_parquet(tmp)
        wall = time.perf_counter() - t_start
        bt = [b for r in results for b in r.batches]
        metrics.update({
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
            "shards_repacked": len(shards) - first_late,
            "tasks": [{"index": r.index, "records": r.records, "worker": r.worker, "encoder_loads": r.encoder_loads,
                       "reused": r.reused} for r in results],
        })
        atomic_write_bytes(tmp / "metrics.json", json.dumps(metrics, indent=1, sort_keys=True).encode(), fsync=False)
        atomic_write_bytes(tmp / MANIFEST_NAME, json.dumps(manifest, indent=1, sort_keys=True,
                                                           ensure_ascii=False).encode("utf-8"), fsync=False)
    if target is not None:
        return _finish_in_store(target, final, manifest, metrics, reasons, journal, build_dir, first_late, results)
    journal.remove()
    shutil.rmtree(build_dir, ignore_errors=True)
    return BuildResult("built", str(outp), manifest, metrics, reasons)


def _fetch_parts(parts: list[tuple[PartTask, PartResult]]) -> None:
    """Each part's WFS1 file back at ``task.path`` from the store, checked against its receipted
    SHA-256; one that is gone or differs (an interrupted re-cut wrote over a part uploaded under
    its shard name) is built again here: a task's bytes depend only on the task."""
    import dataclasses

    from warpdata.core.canonical import sha256_file
    from warpdata.core.errors import InternalError
    from warpdata.features import remote as fremote

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
                     reasons: list[str], journal: Any, build_dir: Path, first_late: int,
                     results: list[PartResult]) -> BuildResult:
    """The version's files to the store (docs/features-config.md, "Output on object storage"):
    re-cut shards and ``metrics.json`` (plain PUTs: a rerun may change them before the manifest names
    them), every other file create-only, ``manifest.json`` last, then ``latest``; then the receipts,
    the build prefix and the staging copy go."""
    import shutil

    from warpdata.etl import objectstore
    from warpdata.features import remote as fremote

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
    built = sum(1 for r in results[:first_late] if r.records and not r.reused)
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
    import pyarrow as pa
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
    from warpdata.formats.featshard import Layout

    return Layout.pack(list(fields)).record_size
