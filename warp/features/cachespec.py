"""What a feature cache is built from: :class:`CacheSpec` (one ``warp etl`` config), its fields,
fingerprint and code versions, and :class:`ShardCacheWriter`, the append-only writer of
fixed-size WFS1 shards. The build itself is :mod:`warpdata.features.build` (the contract of the
whole build: :mod:`warpdata.features.writer`; docs/formats/feature-shard.md).
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import warpdata
from warpdata.artifacts.manifests import MANIFEST_NAME
from warpdata.core.canonical import identity
from warpdata.core.errors import ConfigError, DataError
from warpdata.core.jsondoc import load_json
from warpdata.core.names import FEATURE_CACHE
from warpdata.etl import cutter
from warpdata.etl.quarantine import (
    Thresholds,
    register_reason,
)
from warpdata.features.manifest import read
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
    shard_size: int | None = None  # set: fixed counts; default: key cut, cap caching_batch_size with an encoder, else 512
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
    def shard_cut(self) -> str:
        """How records are cut into shards (docs/formats/feature-shard.md, "Shard boundaries"):
        ``"fixed"`` (every ``effective_shard_size`` records) when ``[cache] shard_size`` is set, as
        asked, or the size is under 8; else :data:`warpdata.etl.cutter.RULE`, the key cut with
        ``effective_shard_size`` as its cap. The fingerprint names it: a cache cut another way is
        another version."""
        return "fixed" if self.shard_size is not None or self.effective_shard_size < 8 else cutter.RULE

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
    import PIL  # lazy: a heavy third-party package, loaded only when a build fingerprints its code

    v = {"warpdata": warpdata.__version__, "wfs": str(WFS_VERSION), "pillow": PIL.__version__,
         "numpy": np.__version__}
    if with_torch:
        import torch  # lazy: heavy, and only for an encoder that runs on torch

        v["torch"] = torch.__version__
    return v


def fingerprint_inputs(spec: CacheSpec, digest: str, encoder_identity: dict[str, Any] | None) -> dict[str, Any]:
    h, w = spec.size
    dataset: dict[str, Any] = {
        "caption_prefix": spec.caption_prefix, "caption_ext": spec.caption_ext,
        "target_size": [h, w], "interpolation": spec.interpolation,
        "max_caption_bytes": spec.max_caption_bytes, "store_pixels": spec.effective_store_pixels,
        "shard_size": spec.effective_shard_size, "shard_cut": spec.shard_cut, "source_digest": digest}
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


def recipe_identity(inputs: Mapping[str, Any]) -> str:
    """The recipe part of a fingerprint: everything in ``inputs`` (:func:`fingerprint_inputs`) but
    the whole-source digest. A shard task's identity is this plus the task's own records, so an
    unchanged shard keeps its identity (and its bytes) when another shard's sources change
    (docs/formats/feature-shard.md, "Reusing the shards of the previous version")."""
    dataset = {k: v for k, v in inputs["dataset"].items() if k != "source_digest"}
    return identity({**inputs, "dataset": dataset})


def _existing(path: Path) -> dict[str, Any] | None:
    m = path / MANIFEST_NAME
    if not m.is_file():
        return None
    try:
        data = load_json(m.read_bytes(), str(m))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    return data if isinstance(data, dict) else None


def _sealed(path: Path) -> dict[str, Any] | None:
    """The manifest if it passes the schema and its content seal, else None (the cache is rebuilt)."""
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
