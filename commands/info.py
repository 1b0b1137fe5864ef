"""Show what a published dataset holds, from its manifest alone.

Prints the resolved version, the totals, each table (rows, shards, bytes,
columns; the default table marked), each artifact and the bindings between
columns and artifacts. Nothing but the `latest` pointer and the manifest is
read: two requests on S3, none when the version is pinned and cached.
`warp schema` lists a table's columns; `warp head` shows its first rows.
"""

from __future__ import annotations

from typing import Annotated

import typer
from warpdata.cli.options import StoreOption

EXAMPLES = """
  warp info vision/coco-mini
  warp info vision/coco-mini --json | jq '.tables[] | {name, rows}'
  warp info vision/coco-mini --version 3f2a9c1e0b7d
"""


def main(
    name: Annotated[str, typer.Argument(help="Published dataset, WORKSPACE/NAME.")],
    version: Annotated[str | None, typer.Option("--version", help="A version hash (default: latest).")] = None,
    mode: Annotated[str | None, typer.Option("--mode", metavar="auto|remote|hybrid|local", help="Read mode (default: WARP_MODE or auto).")] = None,
    store: StoreOption = None,
) -> int:
    from warpdata.cli import output as out
    from warpdata.read.dataset import dataset
    from warpdata.storage.blobcache import format_size

    doc = dataset(name, mode=mode, version=version, store=store).info()
    if out.options().json:
        out.emit_json(doc)
        return 0

    def size(n: int | None) -> str:
        return "" if n is None else format_size(n)

    facts = [("dataset", doc["dataset"]), ("version", doc["version"]), ("store", doc["store"]),
             ("rows", doc["rows"]), ("size", size(doc["bytes"]))]
    facts += [(k.replace("_", " "), doc[k]) for k in ("created_at", "warp_version", "description") if doc.get(k) is not None]
    for k, v in facts:
        out.data(f"{k + ':':<14}{v}")
    out.data()
    out.table(None, ["table", "rows", "shards", "size", "columns"],
              [[t["name"] + (" (default)" if t["default"] and len(doc["tables"]) > 1 else ""), t["rows"],
                t["shards"], size(t["bytes"]), t["columns"]] for t in doc["tables"]])
    if doc["artifacts"]:
        out.data()
        out.table(None, ["artifact", "kind", "members", "shards", "size"],
                  [[a["name"], a["kind"], a["members"], a["shards"], size(a["bytes"])] for a in doc["artifacts"]])
    if doc["bindings"]:
        out.data()
        out.table(None, ["table", "column", "artifact", "ref type"],
                  [[b["table"], b["column"], b["artifact"], b["ref_type"]] for b in doc["bindings"]])
    return 0
