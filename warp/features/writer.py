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

Decoding runs on a thread pool (Pillow releases the GIL while decoding and
resizing) one to two batches ahead of the encoder, into preallocated
rotating buffers, so the encoder is fed while the next batch decodes. Per
batch the build records the time the main thread waited for decoded pixels
(I/O + decode), the encoder time and the write time (``metrics.json``).
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from warpdata.artifacts.manifests import MANIFEST_NAME
from warpdata.core import progress as _progress
from warpdata.core.atomic import atomic_dir, atomic_file, atomic_write_bytes
from warpdata.core.canonical import canonical_json, identity, seal
from warpdata.core.errors import ConfigError, DataError
from warpdata.core.names import FEATURE_CACHE
from warpdata.etl.quarantine import Quarantine, RunSummary, Thresholds, evaluate_summaries
from warpdata.features.manifest import MANIFEST_VERSION
from warpdata.features.scan import MediaItem, scan, source_digest
from warpdata.features.transform import DecodeFailure, load_image, load_video_frame
from warpdata.formats.featshard import VERSION as WFS_VERSION
from warpdata.formats.featshard import FeatureShardWriter, FieldSpec

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


def build_cache(spec: CacheSpec, *, clear: bool = False, allow_invalid: bool = False,
                workers: int | None = None) -> BuildResult:
    t_start = time.perf_counter()
    outp = Path(spec.output)
    # the encoder first: a bad encoder config is reported before any data is read
    enc = batch_encoder = None
    device = None
    if spec.encoder:
        from warpdata.features.encoders import BatchEncoder, load_encoder, resolve_device

        device = resolve_device(spec.caching_device)
        enc = load_encoder(spec.encoder, device=device, dtype=spec.encoder_dtype, options=spec.encoder_options)
        batch_encoder = BatchEncoder(enc, device, spec.size)

    q = Quarantine()
    t_scan0 = time.perf_counter()
    items: list[MediaItem] = []
    item_source: list[int] = []  # index of each item's source directory
    orphan_captions = 0
    for i, (root, prefix, key_prefix) in enumerate(spec.scan_roots()):
        scanned = scan(root, q, caption_prefix=prefix, caption_ext=spec.caption_ext, exclude=(outp,),
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
        ex = examples.setdefault(r["reason"], [])
        if len(ex) < 3:
            ex.append(r)
    early = evaluate_summaries([("aggregate", pending)], spec.thresholds, examples)
    early.raise_for_status(allow_invalid=allow_invalid, what=spec.source_label())

    enc_identity = None
    if enc is not None:
        enc_identity = {"config_name": spec.encoder, **enc.identity(), "device_type": device.split(":")[0]}
    inputs = fingerprint_inputs(spec, source_digest(items), enc_identity)
    fp = identity(inputs)

    old = _existing(outp)
    reasons: list[str] = []
    if outp.exists():
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

    fields = base_fields(spec) + (batch_encoder.fields if batch_encoder else [])
    batch = spec.caching_batch_size if spec.encoder else PIXEL_BATCH
    n_workers = max(1, workers or os.cpu_count() or 1)
    h, w = spec.size
    metrics: dict[str, Any] = {"scan_s": round(t_scan, 4), "batches": [], "workers": n_workers,
                               "batch_size": batch}
    truncated = 0
    kept_keys: list[str] = []
    kept_rows: list[tuple[str, bool, int, int]] = []  # caption, is_video, original height, width
    kept_source: list[int] = []  # source directory of each kept record
    with atomic_dir(outp, replace=True) as tmp, ThreadPoolExecutor(n_workers) as pool:
        # atomic_dir fsyncs every file before the rename: no per-shard fsync needed
        writer = ShardCacheWriter(tmp, fields, shard_size=spec.effective_shard_size,
                                  meta={"fingerprint": fp}, fsync=False)
        nbuf = 3  # one being encoded/written, up to two decoding ahead
        bufs = [np.empty((batch, 3, h, w), np.uint8) for _ in range(nbuf)]
        sizes = [np.zeros((batch, 2), np.uint32) for _ in range(nbuf)]
        chunks = [items[i:i + batch] for i in range(0, len(items), batch)]
        chunk_sources = [item_source[i:i + batch] for i in range(0, len(items), batch)]

        def decode_one(bi: int, j: int, it: MediaItem):
            try:
                load = load_video_frame if it.is_video else load_image
                oh, ow = load(it.path, spec.size, bufs[bi][j], interpolation=spec.interpolation)
            except DecodeFailure as e:
                return e
            sizes[bi][j] = (oh, ow)
            return None

        def submit(ci: int):
            bi = ci % nbuf
            return [pool.submit(decode_one, bi, j, it) for j, it in enumerate(chunks[ci])]

        inflight = {ci: submit(ci) for ci in range(min(nbuf - 1, len(chunks)))}
        try:
            with _progress.progress("caching", total=len(items), unit="img") as bar:
                for ci, chunk in enumerate(chunks):
                    t0 = time.perf_counter()
                    results = [f.result() for f in inflight.pop(ci)]
                    t_wait = time.perf_counter() - t0
                    if ci + nbuf - 1 < len(chunks):
                        inflight[ci + nbuf - 1] = submit(ci + nbuf - 1)
                    bi = ci % nbuf
                    ok = []
                    for j, (it, err) in enumerate(zip(chunk, results, strict=True)):
                        if err is None:
                            ok.append(j)
                            q.accept(it.run, it.key)
                        else:
                            q.reject(it.run, it.key, it.path, err.reason, f"{it.key}: {err.message}")
                    n = len(ok)
                    t_enc = t_write = 0.0
                    if n:
                        sel = np.asarray(ok)
                        pix = bufs[bi][:n] if n == len(chunk) else bufs[bi][sel]
                        caps = [chunk[j].caption for j in ok]
                        rec: dict[str, np.ndarray] = {}
                        if batch_encoder is not None:
                            t1 = time.perf_counter()
                            rec.update(batch_encoder(pix, caps))
                            t_enc = time.perf_counter() - t1
                        t2 = time.perf_counter()
                        if spec.effective_store_pixels:
                            rec["pixels"] = pix
                        cap = np.zeros((n, spec.max_caption_bytes), np.uint8)
                        cap_len = np.zeros(n, np.uint32)
                        for k, c in enumerate(caps):
                            raw, cut = _encode_caption(c, spec.max_caption_bytes)
                            truncated += cut
                            cap[k, :len(raw)] = np.frombuffer(raw, np.uint8)
                            cap_len[k] = len(raw)
                        rec["caption"], rec["caption_len"] = cap, cap_len
                        rec["size"] = np.broadcast_to(np.asarray([h, w], np.uint16), (n, 2))
                        rec["orig_size"] = sizes[bi][sel]
                        rec["is_video"] = np.asarray([chunk[j].is_video for j in ok], bool)
                        writer.append_batch(rec)
                        kept_keys.extend(chunk[j].key for j in ok)
                        kept_source.extend(chunk_sources[ci][j] for j in ok)
                        kept_rows.extend((chunk[j].caption, chunk[j].is_video, int(oh), int(ow))
                                         for j, (oh, ow) in zip(ok, rec["orig_size"].tolist(), strict=True))
                        t_write = time.perf_counter() - t2
                    metrics["batches"].append({"n": n, "io_decode_wait_s": round(t_wait, 5),
                                               "encode_s": round(t_enc, 5), "write_s": round(t_write, 5)})
                    bar.advance(len(chunk))
            shards = writer.close()
        except BaseException:
            writer.abort()
            for fs in inflight.values():
                for f in fs:
                    f.cancel()
            raise

        verdict = q.evaluate(spec.thresholds)
        verdict.raise_for_status(allow_invalid=allow_invalid, what=spec.source_label())
        for problem in verdict.problems():
            log.warning(problem + (" (--allow-invalid)" if verdict.allowed else ""))
        if truncated:
            log.warning(f"{truncated} caption(s) longer than max_caption_bytes={spec.max_caption_bytes} were "
                     "truncated in the stored text (encoders saw the full caption)")
        manifest = {
            "kind": KIND,
            "format": "WFS1",
            "format_version": WFS_VERSION,
            "manifest_version": MANIFEST_VERSION,
            "fingerprint": fp,
            "fingerprint_inputs": inputs,
            "records": writer.records,
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
        wall = time.perf_counter() - t_start
        bt = metrics["batches"]
        metrics.update({
            "wall_s": round(wall, 4),
            "records": writer.records,
            "records_per_s": round(writer.records / wall, 2) if wall > 0 else None,
            "io_decode_wait_s": round(sum(b["io_decode_wait_s"] for b in bt), 4),
            "encode_s": round(sum(b["encode_s"] for b in bt), 4),
            "write_s": round(sum(b["write_s"] for b in bt), 4),
            "device": device or "none",  # what caching_device resolved to ("auto": cuda if available)
            "caching_device": spec.caching_device if spec.encoder else None,
        })
        atomic_write_bytes(tmp / "metrics.json", json.dumps(metrics, indent=1, sort_keys=True).encode(), fsync=False)
        atomic_write_bytes(tmp / MANIFEST_NAME, json.dumps(manifest, indent=1, sort_keys=True,
                                                           ensure_ascii=False).encode("utf-8"), fsync=False)
    return BuildResult("built", str(outp), manifest, metrics, reasons)


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
    with atomic_file(path, fsync=False) as f:
        pq.write_table(table, f, compression="zstd")


def _record_size(fields: Sequence[FieldSpec]) -> int:
    from warpdata.formats.featshard import Layout

    return Layout.pack(list(fields)).record_size
