"""Download a published dataset's shards into the local blob cache ahead of training.

Reads never need this (they stream remotely and warm the cache as they go);
warming makes later epochs and offline runs (mode=local) read locally. Blobs
already cached are verified, not downloaded again. The cache cap
(WARP_CACHE_SIZE_GB) still applies: least recently used blobs make room.
-v and --json report the store traffic (requests, bytes, retries).
"""

from __future__ import annotations

from typing import Annotated

import typer
from warpdata.cli import output as out
from warpdata.cli.options import StoreOption

EXAMPLES = """
  warp warm vision/coco-mini
  warp warm vision/coco-mini --tables main --shards 0:50 --max-bytes 200GB
  warp warm vision/coco-mini --no-artifacts --json
"""


def parse_shards(spec: str | None) -> slice | None:
    from warpdata.core.errors import UsageError

    if spec is None:
        return None
    try:
        if ":" in spec:
            a, _, b = spec.partition(":")
            return slice(int(a) if a else None, int(b) if b else None)
        i = int(spec)
        return slice(i, i + 1)
    except ValueError:
        raise UsageError(f"--shards {spec!r} is not START:STOP or an index", hint="e.g. --shards 0:50") from None


def main(
    name: Annotated[str, typer.Argument(help="Published dataset, WORKSPACE/NAME.")],
    tables: Annotated[str | None, typer.Option("--tables", help="Comma-separated tables (default: all).")] = None,
    shards: Annotated[str | None, typer.Option("--shards", metavar="START:STOP", help="Shard positions to warm in each table/artifact.")] = None,
    max_bytes: Annotated[str | None, typer.Option("--max-bytes", metavar="SIZE",
                                                  help="Download at most SIZE, with a unit (e.g. 200GB); a bare number is refused.")] = None,
    artifacts: Annotated[bool, typer.Option("--artifacts/--no-artifacts", help="Also warm artifact shards and indexes.")] = True,
    version: Annotated[str | None, typer.Option("--version", help="A version hash (default: latest).")] = None,
    store: StoreOption = None,
) -> int:
    from warpdata.core.sizes import format_size, parse_size_option
    from warpdata.read.dataset import dataset

    # before the store is touched: a bad --max-bytes must cost nothing
    budget = parse_size_option(max_bytes, "--max-bytes", "200GB") if max_bytes is not None else None
    ds = dataset(name, mode="auto", version=version, store=store)
    names = [t.strip() for t in tables.split(",") if t.strip()] if tables else None
    sel = parse_shards(shards)
    total = sum(s.byte_size for t in (names or ds.tables) for s in list(ds.manifest.tables[t].shards)[sel or slice(None)]) if all(
        t in ds.manifest.tables for t in (names or ds.tables)) else None
    with out.progress(f"warming {name}", total=total, unit="B") as bar:
        res = ds.warm(tables=names, shards=sel, max_bytes=budget, artifacts=artifacts, on_blob=bar.advance)
    traffic = ds.stats.to_dict()
    if out.options().json:
        out.emit_json({**res.to_dict(), "requests": traffic})
    else:
        out.info(f"{name}@{res.version[:12]}: {res.blobs} blob(s); downloaded {res.fetched} "
                 f"({format_size(res.fetched_bytes)}), already cached {res.cached} ({format_size(res.cached_bytes)})"
                 + (f", {res.skipped_over_budget} left out by --max-bytes" if res.skipped_over_budget else ""))
        out.detail(out.requests_line(traffic))
    return 0
