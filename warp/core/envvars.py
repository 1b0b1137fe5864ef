"""The one registry of environment variables warp reads.

Every ``WARP_*`` (and the few standard) variables warp honours are listed
here with their meaning; ``warp(1)`` ENVIRONMENT and ``warp doctor`` are
generated from this table. Code reads variables through :func:`get` so an
unregistered name is a bug caught by the tests.

Every numeric variable has a :class:`Bound`: the values it accepts, inclusive, documented in
``warp(1)`` ENVIRONMENT. :func:`number` reads one; a value that is not a number, not finite or
outside its bound is a :class:`~warpdata.core.errors.ConfigError` (exit 78) naming the variable
and the accepted range, never a value silently clamped or passed on (``WARP_SQL_THREADS=100000``
started 32,000 DuckDB threads). The CLI checks them all (:func:`check_numbers`) before a command
runs, so a bad value is reported the same way whichever code would read it first.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

from warpdata.core.errors import ConfigError, UsageError
from warpdata.core.sizes import parse_size

# the most workers (threads, processes, LocalCluster workers) a run may start: `-j 20000` or
# WARP_WORKERS=20000 would start that many before the first task
MAX_WORKERS = 4096
# the most threads one DuckDB connection may run (WARP_SQL_THREADS): more than the cores gains nothing,
# and DuckDB starts them all when the connection opens
MAX_SQL_THREADS = 256
# the longest time limit (seconds) a query may be given: 7 days; 0 means none
MAX_SQL_TIMEOUT_S = 7 * 24 * 3600
DAY_S = 24 * 3600


@dataclass(frozen=True)
class Bound:
    """The values a numeric variable accepts, ``low`` to ``high`` inclusive.

    ``kind``: ``"int"`` (a whole number), ``"float"`` (a number) or ``"size"`` (bytes, written
    with a unit like 4GB); ``unit`` names what the number counts; ``words`` are the other values
    the variable takes (``auto``, ``off``), returned as written (lower case).
    """

    kind: str
    low: float
    high: float
    unit: str = ""
    words: tuple[str, ...] = ()

    def describe(self) -> str:
        if self.kind == "size":
            text = f"a size with a unit from {_size(self.low)} to {_size(self.high)}"
        else:
            what = "a whole number" if self.kind == "int" else "a number"
            unit = f" of {self.unit}" if self.unit else ""
            text = f"{what}{unit} from {_num(self.low)} to {_num(self.high)}"
        return f"{', '.join(self.words)} or {text}" if self.words else text


def _size(n: float) -> str:
    """``n`` bytes as the shortest exact decimal size: 10MB, 1PB."""
    for unit, mult in (("PB", 10**15), ("TB", 10**12), ("GB", 10**9), ("MB", 10**6), ("KB", 10**3)):
        if n >= mult and n % mult == 0:
            return f"{int(n) // mult}{unit}"
    return f"{int(n)}B"


def _num(v: float) -> str:
    return f"{int(v):,}" if float(v).is_integer() else f"{v:g}"


@dataclass(frozen=True)
class EnvVar:
    name: str
    help: str
    default: str | None = None
    bound: Bound | None = None  # numeric variables: the values accepted (documented in warp(1))


ENV_VARS: tuple[EnvVar, ...] = (
    EnvVar("WARP_STORE", "URL or path of the dataset store `publish` writes to and reads resolve from (local dir, s3://bucket/prefix, memory://name; https://host/prefix reads a store served by any static web host or CDN, read-only)", "$XDG_DATA_HOME/warp/store"),
    EnvVar("WARP_CACHE_DIR", "directory of the content-addressed blob cache", "$XDG_CACHE_HOME/warp"),
    EnvVar("WARP_CACHE_SIZE_GB", "size cap of the blob cache in GB; least recently used blobs are evicted past it", "50", Bound("float", 0.01, 1_000_000, "GB")),
    EnvVar("WARP_CACHE_VERIFY", "how cached blobs are checked: stamp (hash on entry and whenever the file changed) or full (hash on first use by every process)", "stamp"),
    EnvVar("WARP_S3_ENDPOINT", "S3 endpoint URL (MinIO, moto, Ceph...); also AWS_ENDPOINT_URL", None),
    EnvVar("WARP_S3_REGION", "S3 region; also AWS_REGION / AWS_DEFAULT_REGION", "us-east-1"),
    EnvVar("WARP_S3_PROFILE", "AWS profile for credentials; also AWS_PROFILE", None),
    EnvVar("WARP_S3_ANON", "1 reads S3 anonymously, without credentials (public buckets)", "0"),
    EnvVar("WARP_S3_PATH_STYLE", "1 for path-style S3 addressing (most non-AWS endpoints need it)", "0"),
    EnvVar("AWS_ENDPOINT_URL_S3", "S3 endpoint URL when WARP_S3_ENDPOINT is unset (AWS SDK convention)", None),
    EnvVar("AWS_ENDPOINT_URL", "endpoint URL when neither WARP_S3_ENDPOINT nor AWS_ENDPOINT_URL_S3 is set", None),
    EnvVar("AWS_REGION", "S3 region when WARP_S3_REGION is unset", None),
    EnvVar("AWS_DEFAULT_REGION", "S3 region when WARP_S3_REGION and AWS_REGION are unset", None),
    EnvVar("AWS_PROFILE", "AWS profile when WARP_S3_PROFILE is unset", None),
    EnvVar("WARP_RETRY_BUDGET", "seconds one store read may spend retrying throttled (429, 503 SlowDown) or failed requests, with jittered exponential back-off, before it fails with exit 75; 0 retries nothing", "60", Bound("float", 0, DAY_S, "seconds")),
    EnvVar("WARP_REQUEST_DEADLINE", "seconds one attempt of a store request may take, connect, headers and body together, plus one second per MiB expected; a host that answers slower is retried within WARP_RETRY_BUDGET", "30", Bound("float", 0.1, DAY_S, "seconds")),
    EnvVar("WARP_DEBUG", "1 prints tracebacks for errors (same as --debug)", "0"),
    EnvVar("WARP_CONFIG_DIR", "where warp looks for its user config file `config.toml`", "$XDG_CONFIG_HOME/warp"),
    EnvVar("WARP_WORKERS", "default worker count for ETL and conversion commands", "number of CPUs", Bound("int", 1, MAX_WORKERS, "workers")),
    EnvVar("WARP_UPLOAD_CONCURRENCY", "parts of one large blob (64 MB and over) that `warp publish` uploads at once, as an S3 multipart upload", "8", Bound("int", 1, 256, "parts")),
    EnvVar("WARP_EXECUTOR", "where `warp etl` runs its shard tasks: local (threads), process, dask (a LocalCluster), dask://HOST:PORT or dask:SCHEDULER_FILE (an existing Dask cluster), ray or ray://HOST:PORT; --executor and [build] executor take precedence", "local"),
    EnvVar("WARP_CLUSTER_WAIT", "seconds `warp etl` on an existing Dask cluster (dask://, dask:FILE) waits for a first worker to join before it stops with exit 75", "60", Bound("float", 0, DAY_S, "seconds")),
    EnvVar("WARP_BACKEND", "default tile-compression backend: auto, cpu or gpu", "auto"),
    EnvVar("WARP_DIRECT_IO", "large local writes (warehouse shards, Zarr shards, tar-to-tbl payloads when fsync is on) bypass the page cache with O_DIRECT: auto (on ext4/xfs), 1 (wherever the filesystem accepts it) or 0 (never)", "auto"),
    EnvVar("WAREHOUSE_CLEAR", "1 makes `warp etl` rebuild a tensor warehouse even if an identical version exists (same as --clear)", "0"),
    EnvVar("WARP_MODE", "default dataset read mode: auto, remote, hybrid or local (offline, cache only)", "auto"),
    EnvVar("WARP_PIN", "dataset versions a job reads instead of `latest`: WS/NAME@VERSION entries separated by commas, set once by a launcher so no rank reads the `latest` pointer (docs/partitioning.md)", None),
    EnvVar("WARP_TRUSTED_KEYS", "a file of Ed25519 public keys (`ssh-ed25519 AAAA... comment` lines or PEM `PUBLIC KEY` blocks; `#` comments): every read refuses a version no key in it signed, exit 77 (`warp publish --sign-key`; docs/formats/registry.md, Signatures)", None),
    EnvVar("WARP_PREFETCH", "default background prefetch of table shards: auto, off, or a number of shards ahead", "auto", Bound("int", 0, 64, "shards", words=("auto", "off"))),
    EnvVar("WARP_SQL_TIMEOUT", "seconds one DuckDB filter or query may run before it is stopped with exit 2 (docs/sql.md); 0 for no limit", "300", Bound("float", 0, MAX_SQL_TIMEOUT_S, "seconds")),
    EnvVar("WARP_SQL_MEMORY", "memory limit of one DuckDB filter or query connection, a size with a unit like 4GB (nothing spills to disk)", "a quarter of the RAM", Bound("size", 10**7, 10**15)),
    EnvVar("WARP_SQL_THREADS", "threads of one DuckDB filter or query connection", "half the CPUs", Bound("int", 1, MAX_SQL_THREADS, "threads")),
    EnvVar("RANK", "global rank of a loader given no rank= while torch.distributed is not initialised, and of `warp stream --shard auto` (set by torchrun; docs/partitioning.md)", None),
    EnvVar("WORLD_SIZE", "number of ranks of a loader given no world_size= while torch.distributed is not initialised, and of `warp stream --shard auto` (set by torchrun)", None),
    EnvVar("LOCAL_RANK", "rank within the node (set by torchrun; informational: loaders do not use it)", None),
    EnvVar("NO_COLOR", "any value disables colour (https://no-color.org)", None),
    EnvVar("FORCE_COLOR", "any value forces colour even when stderr is not a terminal", None),
    EnvVar("XDG_DATA_HOME", "base of the default store directory", "~/.local/share"),
    EnvVar("XDG_CACHE_HOME", "base of the default cache directory", "~/.cache"),
    EnvVar("XDG_CONFIG_HOME", "base of the user config directory", "~/.config"),
)

_BY_NAME = {v.name: v for v in ENV_VARS}


def get(name: str, default: str | None = None) -> str | None:
    """Read a registered environment variable (KeyError for unregistered names)."""
    if name not in _BY_NAME:
        raise KeyError(f"environment variable {name} is not in warp's registry (warp/core/envvars.py)")
    value = os.environ.get(name)
    return value if value not in (None, "") else default


def number(name: str) -> int | float | str | None:
    """The value of numeric variable ``name`` (None when unset), checked against its :class:`Bound`.

    An int for ``"int"`` bounds, a float for ``"float"``, bytes (an int) for ``"size"``, or one of
    the bound's words as written in lower case. Anything else is a ConfigError (exit 78) that names
    the variable, its value and the accepted range.
    """
    var = _BY_NAME.get(name)
    if var is None or var.bound is None:
        raise KeyError(f"environment variable {name} is not a numeric variable of warp's registry "
                       "(warp/core/envvars.py)")
    raw = get(name)
    if raw is None:
        return None
    b = var.bound
    text = raw.strip()
    if text.lower() in b.words:
        return text.lower()
    value: float | None
    try:
        if b.kind == "size":
            # a bare number is ambiguous (bytes? MB?): a size needs its unit, as on the command line
            value = None if text.replace(".", "", 1).isdigit() else parse_size(text)
        elif b.kind == "int":
            value = int(text) if text.lstrip("+-").isdigit() and len(text) <= 30 else None
        else:
            value = float(text) if len(text) <= 100 else None
    except (ValueError, UsageError):
        value = None
    if value is None or not math.isfinite(value):
        problem = "not valid" if b.words else "not " + ("a size with a unit" if b.kind == "size" else
                            "a whole number" if b.kind == "int" else "a finite number")
    elif not b.low <= value <= b.high:
        problem = "out of range"
    else:
        return value
    shown = raw if len(raw) <= 40 else raw[:37] + "..."
    default = f" ({var.default})" if var.default else ""
    raise ConfigError(f"{name}={shown!r} is {problem}: it takes {b.describe()}",
                      hint=f"change {name}, or unset it for the default{default}",
                      variable=name, value=raw, accepted=b.describe())


def check_numbers() -> None:
    """Check every numeric variable that is set (:func:`number`); the first bad one is a ConfigError."""
    for v in ENV_VARS:
        if v.bound is not None:
            number(v.name)


def flag(name: str) -> bool:
    return (get(name) or "0").strip().lower() in {"1", "true", "yes", "on"}


def xdg_dir(kind: str) -> str:
    """Base XDG directory: kind is 'data', 'cache' or 'config'."""
    env = {"data": "XDG_DATA_HOME", "cache": "XDG_CACHE_HOME", "config": "XDG_CONFIG_HOME"}[kind]
    fallback = {"data": "~/.local/share", "cache": "~/.cache", "config": "~/.config"}[kind]
    return os.path.expanduser(get(env) or fallback)


def default_store() -> str:
    return get("WARP_STORE") or os.path.join(xdg_dir("data"), "warp", "store")


def default_cache_dir() -> str:
    return get("WARP_CACHE_DIR") or os.path.join(xdg_dir("cache"), "warp")
