"""Show and manage the content-addressed blob cache.

ACTION is one of:

  stats    blobs, bytes used against the cap (WARP_CACHE_SIZE_GB), pins, manifests
  gc       evict least recently used blobs down to --limit (default: the cap),
           remove leftovers of killed downloads and stale locks. --limit needs
           a unit: 500GB, 1.5TiB, 800MB; a bare number such as 20 is refused
           (exit 2) rather than read as 20 bytes
  verify   hash every blob; corrupt ones are deleted (exit 1 if any were found)
  clear    delete every cached blob, manifest and pointer

Blobs in use by a running reader are pinned and never evicted. The cache lives
in WARP_CACHE_DIR (default $XDG_CACHE_HOME/warp).
"""

from __future__ import annotations

from typing import Annotated, Literal

import typer
from warpdata.cli import output as out

EXAMPLES = """
  warp cache stats
  warp cache gc --limit 500GB
  warp cache verify --json
  WARP_CACHE_DIR=/scratch/warp warp cache clear
"""


def main(
    action: Annotated[Literal["stats", "gc", "verify", "clear"], typer.Argument(
        help="stats, gc, verify or clear.", metavar="ACTION", show_default=False)],
    limit: Annotated[str | None, typer.Option(
        "--limit", metavar="SIZE", help="gc: shrink the cache to at most SIZE, with a unit (500GB, 1.5TiB); a bare number is refused.")] = None,
) -> int:
    from warpdata.core.errors import UsageError
    from warpdata.core.sizes import format_size, parse_size_option
    from warpdata.storage.blobcache import BlobCache

    if limit is not None and action != "gc":
        raise UsageError("--limit only applies to 'warp cache gc'", hint="warp cache gc --limit 500GB")
    # before the cache is opened: a bad --limit must change nothing
    target = parse_size_option(limit, "--limit", "500GB") if limit is not None else None
    cache = BlobCache()
    if cache.root.exists() and not cache.root.is_dir():
        # a file where the cache belongs: the CLI names WARP_CACHE_DIR (exit 78), never "0 blobs"
        import errno
        import os

        raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), str(cache.root))
    as_json = out.options().json
    if action == "stats":
        s = cache.stats()
        if as_json:
            out.emit_json(s.to_dict())
            return 0
        used = 100.0 * s.bytes / s.cap_bytes if s.cap_bytes else 0.0
        out.table(None, ["field", "value"], [
            ["cache", s.root],
            ["blobs", s.blobs],
            ["used", f"{format_size(s.bytes)} of {format_size(s.cap_bytes)} ({used:.1f}%)"],
            ["pinned", f"{s.pinned} ({format_size(s.pinned_bytes)})"],
            ["manifests", f"{s.manifests} ({s.datasets} dataset(s))"],
            ["temp files", s.temp_files],
        ])
        return 0
    if action == "gc":
        r = cache.gc(target)
        if as_json:
            out.emit_json({**r.to_dict(), "limit_bytes": cache.cap_bytes if target is None else target})
        else:
            out.info(f"evicted {r.evicted} blob(s), freed {format_size(r.freed_bytes)}; kept {r.kept} "
                     f"({format_size(r.kept_bytes)}), {r.pinned_skipped} pinned; removed {r.temp_removed} "
                     f"temp file(s) and {r.stale_locks_removed} stale lock(s)")
        return 0
    if action == "verify":
        total = cache.stats().bytes
        with out.progress("verifying", total=total, unit="B") as bar:
            checked, bad = cache.verify(on_progress=bar.advance)
        if as_json:
            out.emit_json({"ok": not bad, "checked": checked, "corrupt": bad})
        else:
            out.info(f"checked {checked} blob(s): {len(bad)} corrupt")
            for h in bad:
                out.warn(f"blob sha256:{h} was corrupt and has been deleted; it is fetched again on next use")
        if bad and not as_json:  # under --json the document above is the whole answer
            out.error(f"{len(bad)} corrupt blob(s) in {cache.root} (deleted)",
                      "nothing to do: they are downloaded again when next read")
        return 1 if bad else 0
    freed = cache.clear()
    if as_json:
        out.emit_json({"cleared": True, "freed_bytes": freed, "cache": str(cache.root)})
    else:
        out.info(f"cleared {cache.root}: freed {format_size(freed)}")
    return 0
