"""The one registry of environment variables warp reads.

Every ``WARP_*`` (and the few standard) variables warp honours are listed
here with their meaning; ``warp(1)`` ENVIRONMENT and ``warp doctor`` are
generated from this table. Code reads variables through :func:`get` so an
unregistered name is a bug caught by the tests.
"""

from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True)
class EnvVar:
    name: str
    help: str
    default: str | None = None


ENV_VARS: tuple[EnvVar, ...] = (
    EnvVar("WARP_STORE", "URL or path of the dataset store `publish` writes to and reads resolve from (local dir, s3://bucket/prefix, memory://name; https://host/prefix reads a store served by any static web host or CDN, read-only)", "$XDG_DATA_HOME/warp/store"),
    EnvVar("WARP_CACHE_DIR", "directory of the content-addressed blob cache", "$XDG_CACHE_HOME/warp"),
    EnvVar("WARP_CACHE_SIZE_GB", "size cap of the blob cache in GB; least recently used blobs are evicted past it", "50"),
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
    EnvVar("WARP_RETRY_BUDGET", "seconds one store read may spend retrying throttled (429, 503 SlowDown) or failed requests, with jittered exponential back-off, before it fails with exit 75; 0 retries nothing", "60"),
    EnvVar("WARP_REQUEST_DEADLINE", "seconds one attempt of a store request may take, connect, headers and body together, plus one second per MiB expected; a host that answers slower is retried within WARP_RETRY_BUDGET", "30"),
    EnvVar("WARP_DEBUG", "1 prints tracebacks for errors (same as --debug)", "0"),
    EnvVar("WARP_CONFIG_DIR", "where warp looks for its user config file `config.toml`", "$XDG_CONFIG_HOME/warp"),
    EnvVar("WARP_WORKERS", "default worker count for ETL and conversion commands", "number of CPUs"),
    EnvVar("WARP_UPLOAD_CONCURRENCY", "parts of one large blob (64 MB and over) that `warp publish` uploads at once, as an S3 multipart upload", "8"),
    EnvVar("WARP_EXECUTOR", "where `warp etl` runs its shard tasks: local (threads), process, dask (a LocalCluster), dask://HOST:PORT or dask:SCHEDULER_FILE (an existing Dask cluster), ray or ray://HOST:PORT; --executor and [build] executor take precedence", "local"),
    EnvVar("WARP_CLUSTER_WAIT", "seconds `warp etl` on an existing Dask cluster (dask://, dask:FILE) waits for a first worker to join before it stops with exit 75", "60"),
    EnvVar("WARP_BACKEND", "default tile-compression backend: auto, cpu or gpu", "auto"),
    EnvVar("WARP_DIRECT_IO", "large local writes (warehouse shards, Zarr shards, tar-to-tbl payloads when fsync is on) bypass the page cache with O_DIRECT: auto (on ext4/xfs), 1 (wherever the filesystem accepts it) or 0 (never)", "auto"),
    EnvVar("WAREHOUSE_CLEAR", "1 makes `warp etl` rebuild a tensor warehouse even if an identical version exists (same as --clear)", "0"),
    EnvVar("WARP_MODE", "default dataset read mode: auto, remote, hybrid or local (offline, cache only)", "auto"),
    EnvVar("WARP_PIN", "dataset versions a job reads instead of `latest`: WS/NAME@VERSION entries separated by commas, set once by a launcher so no rank reads the `latest` pointer (docs/partitioning.md)", None),
    EnvVar("WARP_TRUSTED_KEYS", "a file of Ed25519 public keys (`ssh-ed25519 AAAA... comment` lines or PEM `PUBLIC KEY` blocks; `#` comments): every read refuses a version no key in it signed, exit 77 (`warp publish --sign-key`; docs/formats/registry.md, Signatures)", None),
    EnvVar("WARP_PREFETCH", "default background prefetch of table shards: auto, off, or a number of shards ahead", "auto"),
    EnvVar("WARP_SQL_TIMEOUT", "seconds one DuckDB filter or query may run before it is stopped with exit 2 (docs/sql.md); 0 for no limit", "300"),
    EnvVar("WARP_SQL_MEMORY", "memory limit of one DuckDB filter or query connection, a size with a unit like 4GB (nothing spills to disk)", "a quarter of the RAM"),
    EnvVar("WARP_SQL_THREADS", "threads of one DuckDB filter or query connection", "half the CPUs"),
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
