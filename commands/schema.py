"""List a published table's columns: name, Arrow type, nullability, binding.

The schema comes from the manifest, which records each table's exact Arrow
schema since manifest format 4: no shard is touched (two requests on S3). For
a version published by an older warp it is read from the first shard's
footer: one ranged read more. Columns bound to an artifact show the artifact
and the ref type their values are read as (see `warp cat`).
"""

from __future__ import annotations

from typing import Annotated

import typer
from warpdata.cli.options import StoreOption

EXAMPLES = """
  warp schema vision/coco-mini
  warp schema vision/coco-mini --table captions --json
"""


def main(
    name: Annotated[str, typer.Argument(help="Published dataset, WORKSPACE/NAME.")],
    table: Annotated[str | None, typer.Option(
        "--table", help="Table to describe (default: the only table, else main).")] = None,
    version: Annotated[str | None, typer.Option("--version", help="A version hash (default: latest).")] = None,
    mode: Annotated[str | None, typer.Option("--mode", metavar="auto|remote|hybrid|local", help="Read mode (default: WARP_MODE or auto).")] = None,
    store: StoreOption = None,
) -> int:
    from warpdata.cli import output as out
    from warpdata.read.dataset import dataset

    ds = dataset(name, mode=mode, version=version, store=store)
    tname = ds.table_name(table)
    meta = ds.manifest.tables[tname]
    if (meta.schema or {}).get("arrow") is not None and all(s.row_count is not None for s in meta.shards):
        # format 4: the manifest's fields are the publisher's str() of the recorded Arrow schema's
        # fields (docs/formats/registry.md, "Arrow schemas"), so text needs neither pyarrow nor a read
        fields = [{"name": f["name"], "type": f["type"], "nullable": bool(f["nullable"])}
                  for f in meta.schema["fields"]]
        rows, source = sum(s.row_count for s in meta.shards), "manifest"
    else:
        t = ds.table(tname)
        fields = [{"name": f.name, "type": str(f.type), "nullable": bool(f.nullable)} for f in t.schema()]
        rows, source = t.num_rows, t.schema_source
    bound = ds.manifest.bindings_for(tname)
    for d in fields:
        b = bound.get(d["name"])
        if b is not None:
            d["artifact"], d["ref_type"] = b.artifact, b.ref_type
    if out.options().json:
        out.emit_json({"dataset": ds.id, "version": ds.version, "table": tname, "rows": rows,
                       "source": source, "fields": fields})
        return 0
    out.table(None, ["column", "type", "nullable", "bound to"],
              [[f["name"], f["type"], "yes" if f["nullable"] else "no",
                f"{f['artifact']} ({f['ref_type']})" if "artifact" in f else ""] for f in fields])
    out.detail(f"{ds.id}@{ds.version[:12]} table {tname}: {len(fields)} columns, {rows} rows "
               f"(schema from the {source})")
    return 0
