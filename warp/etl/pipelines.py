"""The ``warp etl`` pipelines, chosen by the config's ``[source] format``.

One ``etl`` command builds three kinds of artifact; the config says which:

=============================== ========================= =====================
``[source] format``             pipeline                  writes (manifest kind)
=============================== ========================= =====================
``coco``, ``yolo``, ``jsonl``   tensor warehouse          ``tensor-warehouse``
``raw``, ``npy``                tiled tensor → Zarr v3    ``zarr-array``
``captions``                    feature cache             ``feature-cache``
=============================== ========================= =====================

A pipeline is ``run(request: EtlRequest) -> EtlResult`` in its own module; it
validates the whole config against its own schema (``warpdata.core.config``) and
raises :class:`~warpdata.core.errors.WarpError` subclasses on failure.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from warpdata.core.config import ConfigSource
from warpdata.core.errors import ConfigError
from warpdata.core.registry import load

PIPELINES: dict[str, str] = {
    "captions": "warpdata.features.etl:run",
    "coco": "warpdata.warehouse.etl:run",
    "yolo": "warpdata.warehouse.etl:run",
    "jsonl": "warpdata.warehouse.etl:run",
    "raw": "warpdata.tiles.etl:run",
    "npy": "warpdata.tiles.etl:run",
}


@dataclass
class EtlRequest:
    config_path: Path
    config: dict[str, Any]  # the parsed TOML, not yet validated
    source: ConfigSource  # for error locations
    clear: bool = False
    allow_invalid: bool = False
    workers: int | None = None
    executor: str | None = None  # --executor: local, process, dask, dask://HOST:PORT, dask:FILE, ray
    input: str | None = None  # overrides [source] path; "-" is stdin
    output: str | None = None  # overrides [output] root


@dataclass
class EtlResult:
    kind: str  # manifest kind written
    path: str  # the artifact's path: what `-q` prints, what `publish --from` takes
    summary: dict[str, Any]  # the --json document
    rows: list[tuple[str, str]] = field(default_factory=list)  # human summary
    status: str = "built"  # built | up-to-date
    exit_code: int = 0
    # timings and counts of a build (metrics.json); commands render them, pipelines never print
    metrics: dict[str, Any] = field(default_factory=dict)


def resolve(config: dict[str, Any], source: ConfigSource):
    src = config.get("source")
    if not isinstance(src, dict) or "format" not in src:
        raise ConfigError(f"{source.where('source')}: missing [source] format",
                          hint="set [source] format to one of: " + ", ".join(sorted(PIPELINES)),
                          file=source.path, key="source.format")
    fmt = src["format"]
    if fmt not in PIPELINES:
        close = difflib.get_close_matches(str(fmt), list(PIPELINES), n=1)
        raise ConfigError(f"{source.where('source.format')}: unknown source format {fmt!r}",
                          hint=(f"did you mean {close[0]!r}? " if close else "") + "known: " + ", ".join(sorted(PIPELINES)),
                          file=source.path, key="source.format")
    return load(PIPELINES[fmt], "etl pipeline")
