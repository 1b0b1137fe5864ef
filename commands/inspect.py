"""Describe a warp artifact: what it is, its shape, sizes and checksums.

The kind is detected from magic bytes or the manifest's "kind": any warp
manifest or directory holding one, .tbl files, TWH1 shards and tensor
warehouses, Zarr arrays, feature caches and published datasets (ws/name).
With --verify every checksum is checked and corruption exits with status 1.
"""

from __future__ import annotations

from typing import Annotated

import typer
from warpdata.cli import output as out
from warpdata.core.errors import MissingInputError, NegativeResult

EXAMPLES = """
  warp inspect data/train.tbl
  warp inspect --verify data/train.tbl        # exit 1 if any sample is corrupt
  warp inspect warehouse/v20261122-3f2a9c1e0b7d --json
  warp inspect ws/coco-mini --head 5
  warp inspect warehouse/v20261122-3f2a9c1e0b7d --preview grid.png   # boxes and class names drawn
  warp inspect warehouse/v20261122-3f2a9c1e0b7d/metrics.json --preview - | display
  warp inspect ws/coco-mini --plan --world 64 --workers 2   # what each rank will fetch in an epoch
"""


def main(
    target: Annotated[str, typer.Argument(help="A file, directory or published dataset name (ws/name).")],
    verify: Annotated[bool, typer.Option("--verify", help="Check every checksum; exit 1 on corruption.")] = False,
    head: Annotated[int, typer.Option("--head", min=0, help="Also show the first N rows/samples where that applies.")] = 0,
    preview: Annotated[str | None, typer.Option(
        "--preview", metavar="PNG", help="Draw the artifact instead (sample grid with boxes, contact sheet, Zarr slices, "
                                         "ETL metrics chart) into PNG, '-' for stdout; --head N sets the sample count.")] = None,
    plan: Annotated[bool, typer.Option(
        "--plan", help="For a published dataset: what each rank will fetch in a cold epoch (requests, bytes, "
                       "objects), before a job is launched (docs/partitioning.md).")] = False,
    world: Annotated[int, typer.Option("--world", min=1, help="With --plan: the number of ranks.")] = 1,
    workers: Annotated[int, typer.Option("--workers", min=0, help="With --plan: DataLoader workers per rank.")] = 0,
    batch_size: Annotated[int, typer.Option("--batch-size", min=1, help="With --plan: rows per batch.")] = 8192,
    columns: Annotated[str | None, typer.Option("--columns", help="With --plan: the columns read (comma-separated).")] = None,
    table: Annotated[str | None, typer.Option("--table", help="With --plan: the table (default: the dataset's default).")] = None,
) -> int:
    import os
    import re

    if preview is not None:
        return _preview(target, preview, head or 16)
    if plan:
        return _plan(target, world, workers, batch_size, columns, table)

    from warpdata.artifacts.inspect import find_inspector

    try:
        mod = find_inspector(target)
    except (PermissionError, IsADirectoryError) as e:
        raise MissingInputError(f"{target}: cannot be read: {e.strerror}",
                                hint="check the file's permissions") from None
    if mod is None:
        if not os.path.exists(target) and re.fullmatch(r"[\w.-]+/[\w.-]+(@[\w.-]+)?", target) \
                and not target.startswith("."):
            raise MissingInputError(f"{target} is neither a path nor a published dataset",
                                    hint="check the path, or run 'warp doctor' to check the store")
        if not os.path.exists(target):
            raise MissingInputError(f"{target} does not exist", hint="give a path to a warp artifact or ws/name")
        from warpdata.core.errors import DataError

        raise DataError(f"{target}: not a warp artifact (unknown magic bytes and no manifest)",
                        hint="warp inspect understands .tbl, TWH1 shards, Zarr arrays, and directories with a manifest.json")
    report = mod.inspect(target, verify=verify, head=head)
    if out.options().json:
        out.emit_json(report.to_dict())
    else:
        out.data(f"{report.kind}: {report.target}")
        for title, cols, rows in report.tables:
            out.table(title, cols, rows)
        for p in report.problems:
            out.warn(p)
    if verify and not report.ok:
        if out.options().json:  # the report (ok: false, problems) is the one JSON document
            out.error(f"{target}: verification found {len(report.problems)} problem(s)")
            return 1
        raise NegativeResult(f"{target}: verification found {len(report.problems)} problem(s)",
                             hint="rebuild or re-download the artifact")
    return 0


def _preview(target: str, dest: str, n: int) -> int:
    import sys

    from warpdata.artifacts.preview import render, to_png
    from warpdata.core.atomic import atomic_write_bytes

    pic = render(target, n)
    png = to_png(pic)
    if dest == "-":
        sys.stdout.flush()
        sys.stdout.buffer.write(png)
        sys.stdout.buffer.flush()
        return 0
    atomic_write_bytes(dest, png, fsync=False)
    if out.options().json:
        out.emit_json({"kind": pic.kind, "target": target, "preview": dest, "width": pic.image.width,
                       "height": pic.image.height, "tiles": len(pic.tiles)})
    else:
        out.info(f"{pic.kind} preview: {pic.image.width}x{pic.image.height}, {len(pic.tiles)} tile(s)")
        out.data(dest)
    return 0


def _plan(target: str, world: int, workers: int, batch_size: int, columns: str | None, table: str | None) -> int:
    from warpdata.core.sizes import format_size
    from warpdata.read.dataset import dataset
    from warpdata.read.fetchplan import epoch_plan

    ds = dataset(target, mode="remote")  # a cold epoch: priced as every node without a cache meets it
    t = ds.table(table) if table else ds.table()
    p = epoch_plan(t, world, workers, batch_size, columns.split(",") if columns else None)
    if out.options().json:
        out.emit_json(p.to_dict())
        return 0
    ranks: dict[int, list] = {}
    for r in p.readers:
        row = ranks.setdefault(r.rank, [r.rank, 0, set(), 0, 0])
        row[1] += r.rows
        row[2] |= r.objects
        row[3] += r.requests
        row[4] += r.bytes
    out.data(f"plan: {p.dataset}@{p.version[:12]} table {p.table}, {world} rank(s) x "
             f"{max(1, workers)} reader(s), batches of {batch_size}")
    out.table("per rank, one epoch", ["rank", "rows", "objects", "requests", "bytes"],
              [[k, rows, len(objs), req, format_size(b)] for k, rows, objs, req, b in ranks.values()])
    ratio = p.bytes / max(1, p.columns_bytes)
    out.data(f"total: {p.requests} requests, {format_size(p.bytes)} for {format_size(p.columns_bytes)} of columns "
             f"({ratio:.3f}x): " + ", ".join(f"{k} {format_size(v)}" for k, v in p.bytes_by_kind().items()))
    if p.planning:
        out.info(f"planning read {p.planning.get('requests', 0)} request(s), "
                 f"{format_size(p.planning.get('bytes', 0))} (footers and page indexes)")
    return 0
