"""One vocabulary for every ``warp etl`` config: the ``[build]`` section and the thresholds.

docs/design.md §11, "One vocabulary", is the table this module implements:

* ``[build]``: the keys every pipeline reads (:data:`COMMON`: ``executor``, ``workers``,
  ``resources``), with one wording, plus the few that only one pipeline has (:data:`OWN`). A key
  that is not in the pipeline's ``[build]`` is refused (exit 78) naming the key and the file, and,
  when another pipeline takes it, saying which (:func:`check_build_keys`).
* ``[validation] max_<metric>_fraction = { warn, fail }``: one threshold schema
  (:func:`threshold_schema`) with :class:`~warpdata.etl.quarantine.Thresholds`' defaults, one
  verdict wording (:mod:`warpdata.etl.quarantine`).
* A build's identity is its ``fingerprint`` in every ``--json`` document (:data:`IDENTITY`), read
  from each pipeline's manifest under the name it has there (:func:`fingerprint_of`).
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from typing import Any

from warpdata.core.canonical import identity
from warpdata.core.config import ConfigSource, Field, non_negative
from warpdata.core.errors import ConfigError
from warpdata.etl.executorspec import check_spec
from warpdata.etl.quarantine import Thresholds
from warpdata.etl.workers import MAX_WORKERS, workers_check

WAREHOUSE, FEATURE_CACHE, TILES = "tensor warehouse", "feature cache", "tiled array"

IDENTITY = "fingerprint"
# the name the warehouse's manifest gives its build identity (its content version); tiles keep theirs
# in two parts, recipe and input (fingerprint_of)
LEGACY_IDENTITY = ("version",)


def _executor_check(v: Any) -> str | None:
    # a port no scheduler can listen on is the config's mistake: check_spec refuses it here, not
    # after the 10 s the connect waits (docs/design.md §11)
    return check_spec(v)


def _resources_check(v: Any) -> str | None:
    ok = all(isinstance(k, str) and k and isinstance(n, (int, float)) and not isinstance(n, bool) and n > 0
             for k, n in v.items())
    return None if ok else "must be a table of resource names to positive amounts, e.g. { GPU = 1 }"


def _fraction(v: Any) -> str | None:
    return None if 0 <= v <= 1 else "must be a fraction between 0 and 1"


COMMON: dict[str, Field] = {
    "workers": Field(int, 0, f"concurrent tasks, at most {MAX_WORKERS}; 0 = WARP_WORKERS or the CPU count",
                     check=workers_check),
    "executor": Field(str, "", "where tasks run: local (this process's threads), process, dask, dask://HOST:PORT, "
                               "dask:SCHEDULER_FILE or ray; empty = WARP_EXECUTOR or local",
                      check=_executor_check),
    "resources": Field(dict, None, "abstract resources every task asks of a Dask/Ray cluster, e.g. { GPU = 1 } "
                                   "(the feature cache asks { GPU = 1 } by default when its encoder runs on CUDA)",
                       check=_resources_check),
}

OWN: dict[str, dict[str, Field]] = {
    WAREHOUSE: {
        "durable": Field(bool, True, "fsync every shard before the version appears (survives power loss); "
                                     "false leaves write-back to the OS: a killed process still never leaves a "
                                     "partial version, a power cut may"),
        "overlap": Field(bool, True, "start building shards while the header pass still reads images (a first "
                                    "build or --clear, local source and output); the bytes and the version are "
                                    "the same either way; false: read every header first"),
    },
    FEATURE_CACHE: {
        "decode_threads": Field(int, 0, "image decode threads per worker process (0: the worker count locally, "
                                        "else the CPUs divided among the workers)", check=non_negative),
    },
    TILES: {
        "task_mb": Field((int, float), 64, "input MB per range task on process/dask/ray (whole slabs of every level)",
                         check=lambda v: None if v > 0 else "must be > 0"),
    },
}


def build_schema(pipeline: str) -> dict[str, Field]:
    """The ``[build]`` schema of ``pipeline`` (:data:`WAREHOUSE`, :data:`FEATURE_CACHE` or :data:`TILES`)."""
    return {**COMMON, **OWN[pipeline]}


def check_build_keys(config: Mapping[str, Any], pipeline: str, source: ConfigSource) -> None:
    """Refuse a ``[build]`` key ``pipeline`` does not read, naming it, the file and who reads it."""
    section = config.get("build")
    if not isinstance(section, Mapping):
        return  # absent, or not a table: the schema check says so
    schema = build_schema(pipeline)
    for key in section:
        if key in schema:
            continue
        owner = next((p for p, keys in OWN.items() if key in keys), None)
        close = difflib.get_close_matches(str(key), list(schema), n=1, cutoff=0.6)
        hint = (f"'{key}' is a {owner} setting; " if owner else f"did you mean '{close[0]}'? " if close else "")
        hint += f"[build] of a {pipeline} takes {', '.join(sorted(schema))} (docs/design.md §11)"
        raise ConfigError(f"{source.where(f'build.{key}')}: unknown key 'build.{key}' in the [build] section of "
                          f"{source.path}", hint=hint, file=source.path, key=f"build.{key}")


def threshold_schema() -> dict[str, dict[str, Field]]:
    """``max_invalid_fraction``, ``max_missing_fraction``, ``max_empty_fraction``: ``{ warn, fail }``
    each, defaults those of :class:`~warpdata.etl.quarantine.Thresholds`; an integer reads as a
    number (``fail = 0`` is 0.0), so a manifest's thresholds never depend on how they were typed."""
    out = {}
    for metric, t in Thresholds().items():
        what = metric.removesuffix("_fraction")
        out[f"max_{metric}"] = {
            "warn": Field(float, t.warn, f"warn when the {what} fraction of samples exceeds this",
                          check=_fraction),
            "fail": Field(float, t.fail, f"fail (exit 65) when the {what} fraction of samples exceeds this",
                          check=_fraction),
        }
    return out


def thresholds(validation: Mapping[str, Any], source: ConfigSource) -> Thresholds:
    """The thresholds of a validated ``[validation]`` table (other keys in it are the pipeline's).
    A ``warn`` above its ``fail`` is refused naming the metric's key and line; an unset one has its
    default (``{ warn = 0.1 }`` alone is above the default fail of 0.05), which the hint says."""
    defaults = dict(Thresholds().items())
    for key in threshold_schema():
        warn, fail = validation[key]["warn"], validation[key]["fail"]
        if warn is not None and fail is not None and warn > fail:
            dotted, d = f"validation.{key}", defaults[key.removeprefix("max_")]
            raise ConfigError(f"{source.where(dotted)}: '{dotted}': warn = {warn} is above fail = {fail}",
                              hint="lower warn or raise fail" + (f" (fail is {d.fail} when not given)"
                                                                 if d.fail is not None else ""),
                              file=source.path, key=dotted)
    try:
        return Thresholds.from_dict({k: validation[k] for k in threshold_schema()})
    except ConfigError as e:
        raise ConfigError(f"{source.where('validation')}: {e.message}", hint=e.hint, file=source.path) from None


def fingerprint_of(doc: Mapping[str, Any]) -> str | None:
    """A build's identity from its manifest, under its name or an older one: the feature cache's
    ``fingerprint``, the warehouse's ``version``; a tiled array's manifest keeps the recipe and the
    input's CRC-32C apart (``recipe_key``, ``input_crc32c``), and its fingerprint is their identity."""
    for key in (IDENTITY, *LEGACY_IDENTITY):
        v = doc.get(key)
        if isinstance(v, str) and v:
            return v
    if isinstance(doc.get("recipe_key"), str) and doc.get("input_crc32c") is not None:
        return identity({"recipe_key": doc["recipe_key"], "input_crc32c": doc["input_crc32c"]})
    return None
