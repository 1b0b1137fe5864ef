"""``warp doctor`` cache checks: the cache directory, and whether big writes bypass the page cache."""

from __future__ import annotations

import contextlib
import os
import tempfile

from warpdata.checks.registry import PASS, SKIP, WARN, CheckResult, check, dir_check
from warpdata.core import envvars
from warpdata.core.directio import (
    BLOCK,
    DIRECT_FILESYSTEMS,
    AlignedFile,
    aligned_empty,
    filesystem_type,
    wants_direct,
)


@check("cache-dir", "cache")
def cache_dir() -> CheckResult:
    return dir_check(envvars.default_cache_dir(), "cache directory", "WARP_CACHE_DIR")


@check("direct-io", "cache")
def direct_io() -> CheckResult:
    """Where ETL output goes by default (the working directory): will big writes skip the page cache?"""
    path = os.getcwd()
    fs = filesystem_type(path) or "unknown"
    mode = (envvars.get("WARP_DIRECT_IO") or "auto").strip().lower()
    facts = {"path": path, "filesystem": fs, "WARP_DIRECT_IO": mode}
    if not wants_direct(path):
        why = "WARP_DIRECT_IO=0" if mode in ("0", "no", "off", "false") else \
            f"{fs} is not one of {', '.join(sorted(DIRECT_FILESYSTEMS))}" if hasattr(os, "O_DIRECT") else \
            "this system has no O_DIRECT"
        return CheckResult(PASS, f"{path} ({fs}): big writes go through the page cache ({why})", facts=facts)
    try:
        fd, tmp = tempfile.mkstemp(prefix=".warp-doctor-", dir=path)
        os.close(fd)
    except OSError as e:
        return CheckResult(SKIP, f"{path} is not writable ({e.strerror}): O_DIRECT not tried", facts=facts)
    try:
        with AlignedFile(tmp, direct=True) as f:
            f.write(0, aligned_empty(BLOCK))
            used = f.direct_bytes == BLOCK
    except OSError as e:
        used = False
        facts["error"] = f"{type(e).__name__}: {e}"
    finally:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
    facts["direct"] = used
    if not used:
        return CheckResult(WARN, f"{path} ({fs}) refuses O_DIRECT: big writes fall back to the page cache",
                           "set WARP_DIRECT_IO=0 to stop trying, or write to an ext4/xfs volume", facts=facts)
    return CheckResult(PASS, f"{path} ({fs}): big writes (warehouse and Zarr shards) use O_DIRECT", facts=facts)
