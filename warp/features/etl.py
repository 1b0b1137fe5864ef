"""``warp etl`` for ``[source] format = "captions"``: build a feature cache.

Contract: ``run(EtlRequest) -> EtlResult``. The config (documented in
``examples/captions.toml`` and ``examples/captions-multi.toml``; the design's
names are mapped in ``docs/features-config.md``) is validated against
:data:`SCHEMA` with line numbers, each ``[[directory]]`` table against
:data:`DIRECTORY_SCHEMA`; an unknown key is an error naming it (exit 78).
The sources are ``[source] path`` (one folder) or ``[[directory]]`` tables
(several, each with ``num_repeats`` and an optional ``caption_prefix``), never
both; the size is ``[transform] resolution`` or ``resolutions`` (the design's
spelling: ``[256]`` or ``[[256, 256]]``), never both. ``--input`` overrides
``[source] path`` (not ``[[directory]]``) and ``--output`` the cache
path; ``--clear`` rebuilds; ``--allow-invalid`` builds past failed
thresholds. ``--workers`` / ``[build] workers`` / ``WARP_WORKERS`` set the concurrent shard
tasks and ``--executor`` / ``[build] executor`` / ``WARP_EXECUTOR`` where they run (the same
parsing as every ``warp etl`` pipeline: ``warpdata.etl.executors``); ``[build] resources`` is
what each task asks of a Dask/Ray cluster (``{ GPU = 1 }`` by default when the encoder runs on
CUDA). The result is
``built`` or ``up-to-date`` (the fingerprint matched); its summary is the
``--json`` document.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from warpdata.core.config import ConfigSource, Field, non_negative, positive, validate
from warpdata.core.errors import ConfigError, UsageError
from warpdata.core.names import FEATURE_CACHE
from warpdata.etl import buildconfig, spool
from warpdata.etl.executors import resolve_executor
from warpdata.etl.pipelines import EtlRequest, EtlResult
from warpdata.etl.quarantine import sources_named
from warpdata.etl.workers import resolve_workers
from warpdata.features.remote import is_url
from warpdata.features.sources import RemoteFolder
from warpdata.features.transform import INTERPOLATIONS, target_size
from warpdata.features.writer import CacheSpec, SourceDir, build_cache
from warpdata.formats.imageinfo import DEFAULT_MAX_PIXELS

MAX_REPEATS = 1_000_000  # the manifest schema's bound too (warp/features/manifest.schema.json)


def _shards_row(m: dict[str, Any]) -> str:
    """``N x S`` when every shard but the last holds S records (a count cut), else the count and the
    cap (shards cut where the record keys say: docs/formats/feature-shard.md)."""
    shards = m.get("shards", [])
    size = m.get("shard_size")
    if all(s.get("records") == size for s in shards[:-1]):
        return f"{len(shards)} x {size}"
    return f"{len(shards)}, at most {size} records each"


def _repeats(v: Any) -> str | None:
    return None if 1 <= v <= MAX_REPEATS else f"must be an integer from 1 to {MAX_REPEATS}"


DIRECTORY_SCHEMA: dict[str, Any] = {
    "path": Field(str, help="directory tree of images/videos with same-name captions"),
    "num_repeats": Field(int, 1, "times the loader yields each of its records per epoch (stored once)",
                         check=_repeats),
    "caption_prefix": Field(str, None, "text prepended to its captions (default: [source] caption_prefix)"),
}

SCHEMA: dict[str, Any] = {
    "directory": Field(list, [], "source folders, one [[directory]] table each (path, num_repeats, "
                                 "caption_prefix), instead of [source] path", item_type=dict),
    "source": {
        "format": Field(str, help="must be \"captions\"", choices=("captions",)),
        "path": Field(str, None, "directory tree of images/videos with same-name .txt captions "
                                 "(or [[directory]] tables)"),
        "caption_prefix": Field(str, "", "text prepended to every caption"),
        "caption_ext": Field(str, ".txt", "extension of caption files"),
    },
    "transform": {
        "resolution": Field((int, list), None, "target size: 256 or [height, width]; sides rounded to a "
                                               "multiple of 16"),
        "resolutions": Field(list, None, "the design's spelling of resolution: [256] or [[height, width]] "
                                         "(one size)"),
        "interpolation": Field(str, "bicubic", "resize filter", choices=tuple(INTERPOLATIONS)),
    },
    "encoder": {
        "name": Field(str, "", "\"\" stores pixels; a built-in name (pool8-hash), module:function, or an entry point"),
        "caching_batch_size": Field(int, 64, "images per encoder call", check=positive),
        "caching_device": Field(str, "auto", "auto (CUDA if available), cuda, cuda:N or cpu"),
        "dtype": Field(str, "float16", "dtype of the stored features", choices=("float16", "float32")),
        "options": Field(dict, {}, "keyword arguments for the encoder factory"),
    },
    "cache": {
        "shard_size": Field(int, 0, "exactly this many records per shard (0: shards cut by the records' keys, "
                            "at most caching_batch_size with an encoder, else 512)",
                            check=non_negative),
        "max_caption_bytes": Field(int, 512, "stored caption bytes per record (UTF-8, truncated on a character)",
                                   check=positive),
        "store_pixels": Field(bool, None, "keep the preprocessed pixels too (default: only without an encoder)"),
    },
    "validation": buildconfig.threshold_schema(),
    "output": {
        "path": Field(str, help="cache directory (replaced when the fingerprint changes)"),
    },
    "limits": {
        "max_pixels": Field(int, DEFAULT_MAX_PIXELS, "images whose header declares more pixels are quarantined "
                                                     "too-many-pixels, never decoded (the warehouse's [limits] "
                                                     "max_pixels)", check=positive),
    },
    "build": buildconfig.build_schema(buildconfig.FEATURE_CACHE),
}

# Top-level names of the design's config that warp reads elsewhere (docs/features-config.md):
# still unknown keys, but the error says where they go.
DESIGN_NAMES = {
    "resolutions": "[transform] resolutions",
    "resolution": "[transform] resolution",
    "caching_batch_size": "[encoder] caching_batch_size",
    "caching_device": "[encoder] caching_device",
    "sd3_shard_size": "[cache] shard_size",
    "shard_size": "[cache] shard_size",
    "num_repeats": "num_repeats inside each [[directory]] table",
    "caption_prefix": "[source] caption_prefix, or caption_prefix inside a [[directory]] table",
    "path": "[source] path, or path inside a [[directory]] table",
}

def check_config(data: dict[str, Any], source: ConfigSource) -> dict[str, Any]:
    """The validated config: :data:`SCHEMA` with defaults, each ``[[directory]]`` against its own schema."""
    for key in data:
        if key in DESIGN_NAMES and key not in SCHEMA:
            raise ConfigError(f"{source.where(key)}: unknown key '{key}'",
                              hint=f"warp reads it as {DESIGN_NAMES[key]} (docs/features-config.md)",
                              file=source.path, key=key)
    buildconfig.check_build_keys(data, buildconfig.FEATURE_CACHE, source)
    cfg = validate(data, SCHEMA, source)
    dirs = []
    for i, d in enumerate(cfg["directory"]):
        name = f"directory[{i}]"
        if "path" not in d:
            raise ConfigError(f"{source.where(name)}: missing required key '{name}.path' "
                              f"([[directory]] table {i + 1} names no folder)",
                              hint="give every [[directory]] table a path = \"...\"", file=source.path,
                              key=f"{name}.path")
        dirs.append(validate(d, DIRECTORY_SCHEMA, source, prefix=f"{name}."))
    cfg["directory"] = dirs
    return cfg


def _size(t: dict[str, Any], source: ConfigSource) -> tuple[int, int]:
    """(height, width) from ``resolution`` or the design's ``resolutions``: exactly one of them."""
    one, many = t["resolution"], t["resolutions"]
    if one is not None and many is not None:
        raise ConfigError(f"{source.where('transform.resolutions')}: both 'transform.resolution' and "
                          "'transform.resolutions' are given", file=source.path, key="transform.resolutions",
                          hint="keep one: resolution = 256 (or [height, width]), or resolutions = [256] "
                               "(or [[height, width]])")
    if one is None and many is None:
        raise ConfigError(f"{source.where('transform')}: missing required key 'transform.resolution' "
                          "(the target size)", file=source.path, key="transform.resolution",
                          hint="add `resolution = 256` (or the design's `resolutions = [256]`) under [transform]")
    key, value = ("transform.resolution", one) if many is None else ("transform.resolutions", many)
    hint = None
    if many is not None:
        hint = ("write resolutions = [256] for a square or [[height, width]]: a feature cache holds one "
                "size, and resolutions = [256, 256] would be two square sizes")
        if len(many) != 1:
            raise ConfigError(f"{source.where(key)}: '{key}' must list exactly one size, got {many!r}",
                              hint=hint, file=source.path, key=key)
        value = many[0]
        if isinstance(value, list) and len(value) != 2:
            raise ConfigError(f"{source.where(key)}: '{key}[0]' must be an integer or [height, width], "
                              f"got {value!r}", hint=hint, file=source.path, key=key)
    try:
        return target_size(value)
    except ConfigError as e:
        raise ConfigError(f"{source.where(key)}: '{key}': {e.message}", hint=hint or e.hint,
                          file=source.path, key=key) from None


def _overlap(dirs: list[Any], source: ConfigSource) -> None:
    """Two ``[[directory]]`` tables naming one folder, or one inside the other, would cache files twice."""
    real = [Path(os.path.realpath(d.path)) for d in dirs]
    for j in range(len(real)):
        for i in range(j):
            if real[j] == real[i]:
                how = "is the same folder as"
            elif real[i] in real[j].parents:
                how = "lies inside"
            elif real[j] in real[i].parents:
                how = "contains"
            else:
                continue
            key = f"directory[{j}].path"
            raise ConfigError(f"{source.where(key)}: '{key}' ({dirs[j].path}) {how} 'directory[{i}].path' "
                              f"({dirs[i].path}): its files would be cached twice", file=source.path, key=key,
                              hint="list each folder once; weight it with num_repeats instead")


def spec_from_config(cfg: dict[str, Any], base: Path, req: EtlRequest | None = None,
                     source: ConfigSource | None = None):
    """``cfg`` as :func:`check_config` returns it."""
    where = source or ConfigSource(str(base), "")
    src = cfg["source"]
    dirs = cfg.get("directory") or []
    if dirs and req is not None and req.input:
        raise UsageError(f"--input replaces [source] path, but {where.path} lists its folders as [[directory]] "
                         "tables", hint="drop --input, or edit the [[directory]] paths")
    if dirs and src["path"] is not None:
        raise ConfigError(f"{where.where('source.path')}: both 'source.path' and [[directory]] tables name "
                          "source folders", file=where.path, key="source.path",
                          hint="keep one: [source] path for one folder, or one [[directory]] table per folder")
    source_path = (req.input if req and req.input else None) or src["path"]
    if not dirs and source_path is None:
        raise ConfigError(f"{where.where('source')}: missing required key 'source.path' (the source folder)",
                          file=where.path, key="source.path",
                          hint="add `path = ...` under [source], or one [[directory]] table per folder")
    if source_path == "-":
        raise ConfigError("the captions pipeline reads a directory, not stdin (--input -)",
                          hint="pass a directory with --input DIR")
    out_path = (req.output if req and req.output else None) or cfg["output"]["path"]

    def rel(p: str) -> str:
        if is_url(p):  # an object-store output (docs/features-config.md, "Output on object storage")
            return p
        q = Path(p).expanduser()
        return str(q if q.is_absolute() else base / q)

    sources = None
    if dirs:
        sources = [SourceDir(rel(d["path"]), d["num_repeats"], d["caption_prefix"]) for d in dirs]
        _overlap(sources, where)
    size = _size(cfg["transform"], where)
    thresholds = buildconfig.thresholds(cfg["validation"], where)
    enc, cache = cfg["encoder"], cfg["cache"]
    return CacheSpec(source="" if sources else rel(source_path), output=rel(out_path), size=size,
                     caption_prefix=src["caption_prefix"], caption_ext=src["caption_ext"],
                     interpolation=cfg["transform"]["interpolation"],
                     max_caption_bytes=cache["max_caption_bytes"], encoder=enc["name"],
                     encoder_options=dict(enc["options"]), encoder_dtype=enc["dtype"],
                     caching_batch_size=enc["caching_batch_size"], caching_device=enc["caching_device"],
                     shard_size=cache["shard_size"] or None, store_pixels=cache["store_pixels"],
                     thresholds=thresholds, sources=sources, max_pixels=cfg["limits"]["max_pixels"])


@contextlib.contextmanager
def _local_sources(spec: Any) -> Iterator[tuple[Any, dict[str, RemoteFolder]]]:
    """``spec`` with its source folders on object storage (``s3://…``) named by a mirror of this run
    (warp/etl/spool.py), and those folders by their mirror path. A folder is scanned from one listing
    and its source facts, and its media copied into the mirror only when the version is built
    (warp/features/sources.py); the mirror is removed when the build ends, however it ends, swept
    after a kill. The cache's bytes depend on the files' keys and contents only, so they are a
    local folder's."""
    urls = [spec.source] if spec.sources is None else [d.path for d in spec.sources]
    remote = [u for u in urls if is_url(u)]
    if not remote:
        yield spec, {}
        return
    mirror = spool.mirror_root(remote[0])
    spool.sweep(spool.spool_base())
    spool.claim(mirror)
    try:
        local = {u: str(mirror / f"src-{i}") for i, u in enumerate(remote)}
        folders = {local[u]: RemoteFolder(u, Path(local[u])) for u in remote}
        sources = None if spec.sources is None else \
            [dataclasses.replace(d, path=local.get(d.path, d.path)) for d in spec.sources]
        with sources_named({path: url for url, path in local.items()}):
            yield dataclasses.replace(spec, source=local.get(spec.source, spec.source), sources=sources), folders
    finally:
        spool.remove_mirror(mirror)


def run(req: EtlRequest) -> EtlResult:
    cfg = check_config(req.config, req.source)
    spec = spec_from_config(cfg, Path(req.config_path).parent, req, req.source)
    b = cfg["build"]
    executor = resolve_executor(req.executor, b["executor"] or None, config_file=str(req.config_path) if req.config_path else None)
    with _local_sources(spec) as (local_spec, folders):
        res = build_cache(local_spec, remote=folders, clear=req.clear, allow_invalid=req.allow_invalid,
                          workers=resolve_workers(req.workers, b["workers"]), executor=executor,
                          decode_threads=b["decode_threads"],
                          resources=None if b["resources"] is None else {k: float(v) for k, v in b["resources"].items()})
    m = res.manifest
    agg = m.get("quarantine", {}).get("aggregate", {})
    met = res.metrics
    summary = {
        "fingerprint": m.get("fingerprint"),
        "records": m.get("records"),
        "shards": len(m.get("shards", [])),
        "shard_size": m.get("shard_size"),
        "target_size": m.get("target_size"),
        "fields": {f["name"]: {"dtype": f["dtype"], "shape": f["shape"]} for f in m.get("fields", [])},
        "quarantine": agg,
        "verdict": m.get("verdict", {}).get("status"),
        "rebuild_reasons": res.reasons,
        # tasks with a valid receipt at the start of the run, and tasks run (docs/formats/receipts.md)
        "shards_reused": met.get("shards_reused", len(m.get("shards", []))) if res.status == "built"
        else len(m.get("shards", [])),
        "shards_built": met.get("shards_built", 0) if res.status == "built" else 0,
        "metrics": {k: met[k] for k in ("wall_s", "records_per_s", "io_decode_wait_s", "encode_s", "write_s",
                                        "scan_s", "device", "caching_device", "executor", "shards_reused",
                                        "shards_built", "shards_repacked") if k in met},
    }
    if res.status == "built" and "receipts" in met:  # what the driver did with the journal (warp/etl/driver.py)
        summary["receipts"] = met["receipts"]
    if "upload" in met:  # an object-store output: what went up and what was there already
        summary["path"] = res.path
        summary["upload"] = met["upload"]
    if "sources" in m:  # [[directory]] builds: each folder's records and weight
        summary["sources"] = [{**s, "path": d.path} for s, d in zip(m["sources"], spec.sources or [], strict=True)]
        summary["samples_per_epoch"] = sum(s["records"] * s["num_repeats"] for s in m["sources"])
    rows = [("records", str(m.get("records"))), ("shards", _shards_row(m)),
            ("target size", "x".join(map(str, m.get("target_size", [])))),
            ("fields", ", ".join(f"{f['name']}{tuple(f['shape'])}:{f['dtype']}" for f in m.get("fields", []))),
            ("quarantined", f"{agg.get('missing', 0) + agg.get('invalid', 0)} "
                            f"{agg.get('by_reason', {})}"),
            ("fingerprint", str(m.get("fingerprint"))[:16])]
    if "sources" in m:
        rows.insert(1, ("sources", ", ".join(f"{s['name']} {s['records']}x{s['num_repeats']}" for s in m["sources"])
                        + f" = {summary['samples_per_epoch']} samples/epoch"))
    if res.status == "built":
        rows.append(("why built", "; ".join(res.reasons)))
        rows.append(("time", f"{met.get('wall_s')} s ({met.get('records_per_s')} rec/s; decode wait "
                              f"{met.get('io_decode_wait_s')} s, encode {met.get('encode_s')} s, "
                              f"write {met.get('write_s')} s)"))
    return EtlResult(kind=FEATURE_CACHE, path=res.path, summary=summary, rows=rows, status=res.status)
