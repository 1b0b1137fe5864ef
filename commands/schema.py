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

    t = dataset(name, mode=mode, version=version, store=store).table(table)
    sch = t.schema()
    bound = t.bindings
    fields = []
    for f in sch:
        d = {"name": f.name, "type": str(f.type), "nullable": bool(f.nullable)}
        b = bound.get(f.name)
        if b is not None:
            d["artifact"], d["ref_type"] = b.artifact, b.ref_type
        fields.append(d)
    if out.options().json:
        out.emit_json({"dataset": t.ds.id, "version": t.ds.version, "table": t.name, "rows": t.num_rows,
                       "source": t.schema_source, "fields": fields})
        return 0
    out.table(None, ["column", "type", "nullable", "bound to"],
              [[f["name"], f["type"], "yes" if f["nullable"] else "no",
                f"{f['artifact']} ({f['ref_type']})" if "artifact" in f else ""] for f in fields])
    out.detail(f"{t.ds.id}@{t.ds.version[:12]} table {t.name}: {len(fields)} columns, {t.num_rows} rows "
               f"(schema from the {t.schema_source})")
    return 0
