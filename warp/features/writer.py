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
  any change builds a new one, which takes from the previous one every
  shard whose task identity (recipe + its own records, not its index) is unchanged,
  verified by its recorded SHA-256 (docs/formats/feature-shard.md,
  "Reusing the shards of the previous version"). The manifest is sealed by ``content_sha256``
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
cuts the probed records by their keys (or fixed counts) into :class:`PartTask` s (:func:`build_part`:
pure, one WFS1 file each, receipted), runs them on any executor
(``warpdata.etl.executors``), turns the parts into shards (re-cutting, after a
late decode failure, the runs the cut over the surviving records ends elsewhere)
and commits. Inside a task, decoding runs on the worker's thread pool (Pillow
releases the GIL while decoding and resizing) one to two batches ahead of the
encoder, into preallocated rotating buffers, so the encoder is fed while the
next batch decodes; the encoder is loaded once per worker process
(:func:`worker_encoder`). Per batch the build records the time the task waited
for decoded pixels (I/O + decode), the encoder time and the write time
(``metrics.json``, with the executor and where each part ran).

The code is in three modules, one per stage: :mod:`warpdata.features.cachespec` (the spec, the
fingerprint and :class:`ShardCacheWriter`), :mod:`warpdata.features.parts` (one part on a worker)
and :mod:`warpdata.features.build` (the driver side); this module keeps their names importable
from ``warpdata.features.writer``.
"""

from __future__ import annotations

from warpdata.features.build import (
    build_cache,
    source_entries,
)
from warpdata.features.cachespec import (
    DEFAULT_SHARD_SIZE,
    KIND,
    PIXEL_BATCH,
    SHARD_PATTERN,
    BuildResult,
    CacheSpec,
    ShardCacheWriter,
    SourceDir,
    base_fields,
    code_versions,
    fingerprint_inputs,
)
from warpdata.features.parts import (
    BUILD_PREFIX,
    HEADER_BYTES,
    PART_PATTERN,
    EncoderRef,
    PartResult,
    PartTask,
    build_part,
    header_problem,
    preload_encoder,
    task_sha256,
    worker_encoder,
)

__all__ = [
    "BUILD_PREFIX",
    "BuildResult",
    "CacheSpec",
    "DEFAULT_SHARD_SIZE",
    "EncoderRef",
    "HEADER_BYTES",
    "KIND",
    "PART_PATTERN",
    "PIXEL_BATCH",
    "PartResult",
    "PartTask",
    "SHARD_PATTERN",
    "ShardCacheWriter",
    "SourceDir",
    "base_fields",
    "build_cache",
    "build_part",
    "code_versions",
    "fingerprint_inputs",
    "header_problem",
    "preload_encoder",
    "source_entries",
    "task_sha256",
    "worker_encoder",
]
