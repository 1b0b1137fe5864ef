"""``warp etl`` for ``[source] format = "captions"``: build a feature cache.

Contract: ``run(EtlRequest) -> EtlResult``. The config (documented in
``examples/captions.toml``) is validated against :data:`SCHEMA` with line
numbers; ``--input`` overrides ``[source] path`` and ``--output`` the cache
path; ``--clear`` rebuilds; ``--allow-invalid`` builds past failed
thresholds; ``--workers`` (or ``WARP_WORKERS``) sets the decode threads. The result is
``built`` or ``up-to-date`` (the fingerprint matched); its summary is the
``--json`` document.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from warpdata.core.config import Field, non_negative, positive, validate
from warpdata.core.errors import ConfigError
from warpdata.etl.pipelines import EtlRequest, EtlResult
from warpdata.etl.quarantine import Thresholds
from warpdata.features.transform import INTERPOLATIONS, target_size


def _fraction(v: Any) -> str | None:
    return None if 0 <= v <= 1 else "must be a fraction between 0 and 1"


def _threshold() -> dict[str, Field]:
    return {"warn": Field((float, int), None, "fraction above which the build warns", check=_fraction),
            "fail": Field((float, int), None, "fraction above which the build fails (exit 65)", check=_fraction)}


SCHEMA: dict[str, Any] = {
    "source": {
        "format": Field(str, help="must be \"captions\"", choices=("captions",)),
        "path": Field(str, help="directory tree of images/videos with same-name .txt captions"),
        "caption_prefix": Field(str, "", "text prepended to every caption"),
        "caption_ext": Field(str, ".txt", "extension of caption files"),
    },
    "transform": {
        "resolution": Field((int, list), help="target size: 256 or [height, width]; sides rounded to a multiple of 16"),
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
        "shard_size": Field(int, 0, "records per shard (0: caching_batch_size with an encoder, else 512)",
                            check=non_negative),
        "max_caption_bytes": Field(int, 512, "stored caption bytes per record (UTF-8, truncated on a character)",
                                   check=positive),
        "store_pixels": Field(bool, None, "keep the preprocessed pixels too (default: only without an encoder)"),
    },
    "validation": {
        "max_invalid_fraction": _threshold(),
        "max_missing_fraction": _threshold(),
        "max_empty_fraction": _threshold(),
    },
    "output": {
        "path": Field(str, help="cache directory (replaced when the fingerprint changes)"),
    },
}

_DEFAULT_THRESHOLDS = Thresholds()


def spec_from_config(cfg: dict[str, Any], base: Path, req: EtlRequest | None = None):
    from warpdata.features.writer import CacheSpec

    src = cfg["source"]
    source_path = (req.input if req and req.input else None) or src["path"]
    if source_path == "-":
        raise ConfigError("the captions pipeline reads a directory, not stdin (--input -)",
                          hint="pass a directory with --input DIR")
    out_path = (req.output if req and req.output else None) or cfg["output"]["path"]

    def rel(p: str) -> str:
        q = Path(p).expanduser()
        return str(q if q.is_absolute() else base / q)

    try:
        size = target_size(cfg["transform"]["resolution"])
    except ConfigError as e:
        raise ConfigError(f"transform.resolution: {e.message}", hint=e.hint, key="transform.resolution") from None
    v = cfg["validation"]
    thresholds = Thresholds.from_dict({
        f"max_{m}": {"warn": v[f"max_{m}"]["warn"] if v[f"max_{m}"]["warn"] is not None else d.warn,
                     "fail": v[f"max_{m}"]["fail"] if v[f"max_{m}"]["fail"] is not None else d.fail}
        for m, d in (("invalid_fraction", _DEFAULT_THRESHOLDS.max_invalid_fraction),
                     ("missing_fraction", _DEFAULT_THRESHOLDS.max_missing_fraction),
                     ("empty_fraction", _DEFAULT_THRESHOLDS.max_empty_fraction))})
    enc, cache = cfg["encoder"], cfg["cache"]
    return CacheSpec(source=rel(source_path), output=rel(out_path), size=size,
                     caption_prefix=src["caption_prefix"], caption_ext=src["caption_ext"],
                     interpolation=cfg["transform"]["interpolation"],
                     max_caption_bytes=cache["max_caption_bytes"], encoder=enc["name"],
                     encoder_options=dict(enc["options"]), encoder_dtype=enc["dtype"],
                     caching_batch_size=enc["caching_batch_size"], caching_device=enc["caching_device"],
                     shard_size=cache["shard_size"] or None, store_pixels=cache["store_pixels"],
                     thresholds=thresholds)


def run(req: EtlRequest) -> EtlResult:
    from warpdata.features.writer import build_cache

    cfg = validate(req.config, SCHEMA, req.source)
    spec = spec_from_config(cfg, Path(req.config_path).parent, req)
    from warpdata.etl.workers import env_workers

    workers = req.workers or env_workers()  # None: build_cache picks
    res = build_cache(spec, clear=req.clear, allow_invalid=req.allow_invalid, workers=workers)
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
        "metrics": {k: met[k] for k in ("wall_s", "records_per_s", "io_decode_wait_s", "encode_s", "write_s",
                                        "scan_s", "device") if k in met},
    }
    rows = [("records", str(m.get("records"))), ("shards", f"{len(m.get('shards', []))} x {m.get('shard_size')}"),
            ("target size", "x".join(map(str, m.get("target_size", [])))),
            ("fields", ", ".join(f"{f['name']}{tuple(f['shape'])}:{f['dtype']}" for f in m.get("fields", []))),
            ("quarantined", f"{agg.get('missing', 0) + agg.get('invalid', 0)} "
                            f"{agg.get('by_reason', {})}"),
            ("fingerprint", str(m.get("fingerprint"))[:16])]
    if res.status == "built":
        rows.append(("why built", "; ".join(res.reasons)))
        rows.append(("time", f"{met.get('wall_s')} s ({met.get('records_per_s')} rec/s; decode wait "
                              f"{met.get('io_decode_wait_s')} s, encode {met.get('encode_s')} s, "
                              f"write {met.get('write_s')} s)"))
    return EtlResult(kind="feature-cache", path=res.path, summary=summary, rows=rows, status=res.status)
