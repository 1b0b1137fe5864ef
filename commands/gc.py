"""Delete the blobs of a dataset store that no version uses.

Marks every blob a version manifest of any dataset references (shards, their chunks, indexes),
then deletes the unreferenced blobs older than --grace (default 24h; younger ones may be an
upload in progress). --drop WS/NAME@VERSION deletes that version's manifest first, so the blobs
only it used go too; the version latest points at is never dropped (exit 2). A manifest gc cannot
read stops it before any deletion (exit 65). A publish running at the same time stays whole: gc
leaves a marker (gc/sweep.json) that publish checks before moving latest
(docs/formats/registry.md, "Garbage collection"). --dry-run deletes nothing and reports the same
counts. This is the store; 'warp cache gc' trims the local blob cache.
"""

from __future__ import annotations

from typing import Annotated

import typer
from warpdata.cli import output as out
from warpdata.cli.options import StoreOption

EXAMPLES = """
  warp gc --dry-run
  warp gc --store s3://bucket/warp --grace 7d
  warp gc --drop vision/coco@3fa9c2e1b7d0 --json
"""


def main(
    drop: Annotated[list[str] | None, typer.Option(
        "--drop", metavar="WS/NAME@VERSION",
        help="Delete this version's manifest first (repeatable); never the version latest points at.")] = None,
    grace: Annotated[str, typer.Option(
        "--grace", metavar="DURATION",
        help="Keep unreferenced blobs modified less than this long ago: 24h, 30m, 7d, or 0.")] = "24h",
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Delete nothing; report what would go.")] = False,
    store: StoreOption = None,
) -> int:
    from warpdata.core.sizes import format_size
    from warpdata.registry.gc import collect, parse_drop, parse_grace

    seconds = parse_grace(grace)  # bad options cost nothing: checked before the store is opened
    for spec in drop or ():
        parse_drop(spec)
    r = collect(store, drop=list(drop or ()), grace=seconds, dry_run=dry_run)
    if out.options().json:
        out.emit_json(r.to_dict())
        return 0
    verb = "would delete" if dry_run else "deleted"
    out.info(f"{r.store}: {r.versions_kept} version(s) of {r.datasets} dataset(s) kept, "
             f"{len(r.versions_dropped)} {'to drop' if dry_run else 'dropped'}")
    for v in r.versions_dropped:
        out.info(f"  {'would drop' if dry_run else 'dropped'} {v.split('@')[0]}@{v.split('@')[1][:12]}")
    out.info(f"blobs: {r.blobs_listed} ({format_size(r.bytes_listed)}) in the store, {r.blobs_referenced} "
             f"referenced; {verb} {r.blobs_deleted} ({format_size(r.bytes_deleted)}); kept {r.blobs_young} "
             f"unreferenced younger than {grace} ({format_size(r.bytes_young)})")
    if r.blobs_missing:
        out.warn(f"{r.blobs_missing} blob(s) that versions reference are missing from the store; "
                 "'warp inspect WS/NAME --verify' names them")
    if r.other_objects:
        out.info(f"left alone: {r.other_objects} object(s) under blobs/ that are not named as blobs")
    out.detail(out.requests_line(r.requests))
    return 0
