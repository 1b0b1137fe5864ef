"""Show what changed between two versions: rows by key, members by content.

For a published dataset WS/NAME: rows added, removed and changed (any column
differs) per table, matched by --key (default: the first of key, path, id,
sample_id, name both versions have; without one, rows are compared whole), and
each artifact's members added, removed and changed. --key without --table
compares the one table that has that column. --from and --to pick versions of a
published dataset only: two directories are the versions. The cost follows the
change: Parquet shards and tar shards whose hashes both versions share are
never read, so a 0.1 % change reads about 0.1 % of the data plus the two
manifests. --rows lists the keys; --json gives the counts and the lists.

For two local artifacts of one kind (tensor-warehouse versions, feature
caches, Zarr arrays): shards added, removed and changed by the hashes their
manifests record, and samples by key from the per-sample side table, without
reading payloads.

Exit status: 0 when the versions hold the same data, 1 when they differ.
"""

from __future__ import annotations

from typing import Annotated

import typer
from warpdata.cli.options import StoreOption

EXAMPLES = """
  warp diff vision/coco-mini --from 3f2a9c1e0b7d            # against latest
  warp diff vision/coco-mini --from 3f2a9c --to 81be07 --table main --key image_id --rows
  warp diff vision/coco-mini --from 3f2a9c --json | jq '.tables[] | {table, added, removed, changed}'
  warp diff warehouse/v20261122-3f2a9c1e0b7d warehouse/v20261125-81be0711aa02
"""


def main(
    target: Annotated[str, typer.Argument(help="WS/NAME of a published dataset, or a local artifact directory.",
                                          metavar="WS/NAME|DIR")],
    other: Annotated[str | None, typer.Argument(help="The second local artifact (same kind).", metavar="[DIR2]")] = None,
    from_: Annotated[str | None, typer.Option("--from", metavar="V1", help="The older version (hash or prefix).")] = None,
    to: Annotated[str | None, typer.Option("--to", metavar="V2", help="The newer version (default: latest).")] = None,
    table: Annotated[str | None, typer.Option("--table", metavar="T", help="Compare only this table.")] = None,
    key: Annotated[str | None, typer.Option("--key", metavar="COL", help="The column rows are matched by; without --table, the one table that has it is compared.")] = None,
    rows: Annotated[bool, typer.Option("--rows", help="List the keys added, removed and changed.")] = False,
    store: StoreOption = None,
) -> int:
    from warpdata.cli import output as out
    from warpdata.core.sizes import format_size
    from warpdata.lineage.diff import DiffRequest, diff

    res = diff(DiffRequest(target, from_version=from_, to_version=to, other=other, table=table, key=key,
                           rows=rows, store_url=store))
    rc = 0 if res.same else 1
    if out.options().json:
        out.emit_json(res.to_dict())
        return rc
    out.data(f"{res.target}: {res.from_version[:12]} -> {res.to_version[:12]}: {res.summary()}")
    if res.tables:
        out.table(None, ["table", "key", "added", "removed", "changed", "status"],
                  [[t.table, t.key or "(whole rows)", t.added, t.removed, t.changed,
                    t.status + (" (schema)" if t.schema_changed else "")] for t in res.tables])
    if res.artifacts:
        out.table(None, ["artifact", "added", "removed", "changed", "status"],
                  [[a.artifact, a.added, a.removed, a.changed, a.status] for a in res.artifacts])
    if rows:
        for t in res.tables:
            for sign, keys in (("+", t.added_keys), ("-", t.removed_keys), ("~", t.changed_keys)):
                for k in keys or ():
                    out.data(f"{sign} {t.table} {k}")
        for a in res.artifacts:
            for sign, keys in (("+", a.added_members), ("-", a.removed_members), ("~", a.changed_members)):
                for k in keys or ():
                    out.data(f"{sign} {a.artifact} {k}")
    out.end_data()  # the table and rows reach stdout whole before the summary on stderr
    if res.bytes_total:
        out.info(f"read {res.blobs_read} blob(s), {format_size(res.bytes_read)} of "
                 f"{format_size(res.bytes_total)} in both versions")
    return rc
