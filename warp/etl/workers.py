"""One parser for worker counts: ``--workers`` > config > ``WARP_WORKERS`` > CPUs.

Every ETL and conversion command reads ``WARP_WORKERS`` through
:func:`resolve_workers`, so a bad value fails the same way everywhere
(:class:`~warpdata.core.errors.ConfigError`, exit 78).
"""

from __future__ import annotations

import os

from warpdata.core import envvars
from warpdata.core.errors import ConfigError

# the most workers a run may ask for: a thread, process or LocalCluster worker each, so a typo (-j
# 20000) would start that many before the first task; an external cluster's size is its own. The
# bound of WARP_WORKERS in the registry of variables (warp(1) ENVIRONMENT) is the same number.
MAX_WORKERS = envvars.MAX_WORKERS
_TOO_MANY_HINT = f"ask for at most {MAX_WORKERS} workers (the CPU count here is {{cpus}})"


def cpu_count() -> int:
    """CPUs this process may run on (its affinity mask where the OS has one)."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return max(1, os.cpu_count() or 1)


def env_workers() -> int | None:
    """``WARP_WORKERS`` as a positive integer, None when unset; ConfigError when malformed or over
    :data:`MAX_WORKERS` (its bound in :mod:`warpdata.core.envvars`)."""
    n = envvars.number("WARP_WORKERS")
    return None if n is None else int(n)


def check_workers(n: int, where: str, *, key: str | None = None) -> int:
    """``n`` when it is at most :data:`MAX_WORKERS`, else ConfigError (exit 78) naming ``where``."""
    if n > MAX_WORKERS:
        raise ConfigError(f"{where}: {n} workers is more than the {MAX_WORKERS} a run may start",
                          hint=_TOO_MANY_HINT.format(cpus=cpu_count()), key=key)
    return n


def workers_check(value: int) -> str | None:
    """A config schema check (``Field(check=...)``) of ``[build] workers``."""
    if value < 0:
        return "must be >= 0"
    if value > MAX_WORKERS:
        return f"must be at most {MAX_WORKERS} (0 = WARP_WORKERS or the CPU count)"
    return None


def resolve_workers(explicit: int | None = None, configured: int | None = None, *,
                    default: int | None = None) -> int:
    """The worker count: ``explicit`` (--workers), then ``configured`` (config file, 0 = unset),
    then ``WARP_WORKERS``, then ``default`` or the CPU count.

    ``WARP_WORKERS`` is validated even when an explicit value wins, so a
    typo in the environment is reported instead of silently ignored.
    """
    env = env_workers()
    for v, where in ((explicit, "--workers/-j"), (configured, "[build] workers"), (env, "WARP_WORKERS")):
        if v:
            return check_workers(max(1, int(v)), where)
    return default if default is not None else cpu_count()


# threads of a header pass per worker, at most HEADER_THREADS_CAP: the pass reads each source once
# and waits on the disk more than it computes (0.16-0.18 ms of CPU per image read cold, 0.27-0.30 ms
# of wall on 2 threads, 0.19-0.24 ms on 8: BENCHMARKS.md, "Dask's own LocalCluster: workers as
# threads"); its reads and hashing release the GIL
HEADER_THREADS_PER_WORKER = 4
HEADER_THREADS_CAP = 32


def header_threads(workers: int) -> int:
    """Threads for a header pass on this machine when ``workers`` tasks run at once: a few per
    worker, so the disk's latency overlaps, never fewer than ``workers``."""
    return max(workers, min(HEADER_THREADS_CAP, HEADER_THREADS_PER_WORKER * workers))
