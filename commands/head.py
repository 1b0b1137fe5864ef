"""Show the first rows of a published table.

Reads only what the rows need: the manifest, then the first shard's footer
and the row group holding them (one ranged read each), never a whole shard.
Long strings and binary values are shortened in the table; --json prints
them whole (binary as base64) in one document. For more rows, or for a pipe,
use `warp stream NAME --limit N`.
"""

from __future__ import annotations

from typing import Annotated

import typer
from warpdata.cli.options import StoreOption

EXAMPLES = """
  warp head vision/coco-mini
  warp head vision/coco-mini -n 20 --columns id,label
  warp head vision/coco-mini --table captions --json | jq '.rows[0]'
"""


def main(
    name: Annotated[str, typer.Argument(help="Published dataset, WORKSPACE/NAME.")],
    n: Annotated[int, typer.Option("-n", "--rows", min=0, max=10000, help="How many rows (at most 10000).")] = 5,
    table: Annotated[str | None, typer.Option(
        "--table", help="Table to read (default: the only table, else main).")] = None,
    columns: Annotated[str | None, typer.Option("--columns", help="Comma-separated columns (default: all).")] = None,
    version: Annotated[str | None, typer.Option("--version", help="A version hash (default: latest).")] = None,
    mode: Annotated[str | None, typer.Option("--mode", metavar="auto|remote|hybrid|local", help="Read mode (default: WARP_MODE or auto).")] = None,
    store: StoreOption = None,
) -> int:
    import base64

    from warpdata.cli import output as out
    from warpdata.core.errors import UsageError
    from warpdata.read.dataset import dataset

    t = dataset(name, mode=mode, version=version, store=store).table(table)
    if columns is not None:
        cols = [c.strip() for c in columns.split(",") if c.strip()]
        if not cols:
            raise UsageError(f"--columns {columns!r} names no column", hint="e.g. --columns id,label; leave it out for all")
        t = t.select(cols)
    rows = t.head(n).to_pylist()
    names = t.schema().names
    if out.options().json:
        def plain(v):
            if isinstance(v, (bytes, bytearray)):
                return base64.b64encode(v).decode("ascii")
            if isinstance(v, dict):
                return {k: plain(x) for k, x in v.items()}
            if isinstance(v, list):
                return [plain(x) for x in v]
            return v if v is None or isinstance(v, (str, int, float, bool)) else str(v)

        out.emit_json({"dataset": t.ds.id, "version": t.ds.version, "table": t.name, "columns": names,
                       "rows": [{k: plain(v) for k, v in r.items()} for r in rows]})
        return 0

    def short(v) -> str:
        if isinstance(v, (bytes, bytearray)):
            return f"<{len(v)} bytes>"
        s = "" if v is None else str(v)
        return s if len(s) <= 60 else s[:57] + "..."

    out.table(None, names, [[short(r[c]) for c in names] for r in rows])
    out.detail(f"{len(rows)} of {t.num_rows} rows of {t.ds.id}@{t.ds.version[:12]} table {t.name}")
    return 0
