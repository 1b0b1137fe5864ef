"""Stream a published table's rows to stdout for pipelines, without pulling it.

Formats: jsonl (one JSON object per row; binary values as base64), csv, or
arrow (an Arrow IPC stream, for `pyarrow.ipc.open_stream(sys.stdin.buffer)`).
--filter runs a DuckDB SQL expression with projection and predicate pushdown;
--shard RANK/WORLD (or auto: RANK, WORLD_SIZE) streams one rank's share:
exactly, by default, so the ranks' outputs together hold every row once (their
row counts may differ by one), as the library's loaders do by default
(docs/partitioning.md). --pad makes every rank stream the same number of rows
by repeating rows from the start of the table, like PyTorch's
DistributedSampler (pad=True in the library); every rank says on stderr how many
of the rows it streamed were repeats (with --json as one JSON line on stderr,
{"pad": {...}}). --limit N reads only the row groups its N rows are in, then
stops: nothing else of the table is fetched.

--format arrow is binary: it is refused when stdout is a terminal (exit 2);
redirect it to a file or a pipe, or pass --force.

-v ends with a line about the store traffic (requests by kind, bytes received,
retries of throttled requests); with --json that report is one JSON line on
stderr ({"requests": {...}}), since stdout holds the rows.
"""

from __future__ import annotations

from typing import Annotated, Literal

import typer
from warpdata.cli.options import StoreOption

EXAMPLES = """
  warp stream vision/coco-mini --columns id,label --limit 5
  warp stream vision/coco-mini --filter "label = 'cat'" --format csv > cats.csv
  warp stream vision/coco-mini --format arrow --shard 0/8 | python train.py
"""


def main(
    name: Annotated[str, typer.Argument(help="Published dataset, WORKSPACE/NAME.")],
    table: Annotated[str | None, typer.Option(
        "--table", help="Table to stream (default: the only table, else main).")] = None,
    fmt: Annotated[Literal["jsonl", "csv", "arrow"], typer.Option("--format", help="jsonl, csv or arrow (IPC stream).")] = "jsonl",
    columns: Annotated[str | None, typer.Option("--columns", help="Comma-separated columns (default: all).")] = None,
    filter_: Annotated[str | None, typer.Option("--filter", metavar="SQL", help="Keep rows matching this DuckDB SQL expression.")] = None,
    shard: Annotated[str | None, typer.Option("--shard", metavar="RANK/WORLD", help="Stream one rank's share: RANK/WORLD or auto.")] = None,
    pad: Annotated[bool, typer.Option(
        "--pad", help="With --shard: equal row counts on every rank by repeating rows (default: exact, no repeats).")] = False,
    limit: Annotated[int | None, typer.Option("--limit", min=0, help="Stop after N rows.")] = None,
    force: Annotated[bool, typer.Option(
        "--force", help="Write --format arrow (binary) even when stdout is a terminal.")] = False,
    batch_size: Annotated[int, typer.Option("--batch-size", min=1, help="Rows per Arrow batch.")] = 65536,
    version: Annotated[str | None, typer.Option("--version", help="A version hash (default: latest).")] = None,
    mode: Annotated[str | None, typer.Option("--mode", metavar="auto|remote|hybrid|local", help="Read mode (default: WARP_MODE or auto).")] = None,
    store: StoreOption = None,
) -> int:
    from warpdata.cli import output as out
    from warpdata.core.errors import UsageError
    from warpdata.read.dataset import dataset

    if fmt == "arrow" and not force and out.stdout_is_tty():
        raise UsageError("--format arrow writes binary Arrow IPC, and stdout is a terminal",
                         hint="redirect it (> rows.arrow, | python train.py), use --format jsonl or csv, "
                              "or pass --force")
    if pad and shard is None:
        raise UsageError("--pad only applies with --shard", hint="e.g. warp stream NAME --shard 0/8 --pad")
    if pad and filter_:
        raise UsageError("--pad cannot be combined with --filter (a filtered stream splits whole files "
                         "between ranks and never repeats rows)", hint="drop --pad, or filter downstream")
    ds = dataset(name, mode=mode, version=version, store=store)
    try:
        return _stream(ds, table, fmt, columns, filter_, shard, pad, limit, batch_size)
    finally:
        out.report_requests(ds.stats.to_dict())


def _stream(ds, table, fmt, columns, filter_, shard, pad, limit, batch_size) -> int:
    import base64
    import json
    import sys

    from warpdata.core.errors import UsageError
    from warpdata.partition.world import parse_shard

    t = ds.table(table)
    cols = [c.strip() for c in columns.split(",") if c.strip()] if columns is not None else None
    if cols == []:
        raise UsageError(f"--columns {columns!r} names no column", hint="e.g. --columns id,label; leave it out for all")
    if cols:
        t = t.select(cols)
    rank, world = parse_shard("--shard", shard)  # no --shard: the whole table, even under torchrun
    if filter_:
        if shard == "auto":  # --shard auto: this process's rank and world (torchrun's, or RANK/WORLD_SIZE)
            from warpdata.partition.world import resolve_world

            w = resolve_world()
            rank, world = w.rank, w.world_size
        # the filter may test any column (a select() view would hide the others); --columns projects
        batches = ds.table(table).filter(filter_).select(cols).batches(batch_size, limit=limit, rank=rank,
                                                                       world_size=world)
    else:
        stream = t.batches(batch_size, limit=limit, rank=rank, world_size=world, pad=pad)
        batches = _report_pad(stream.plan, limit, iter(stream)) if pad else iter(stream)
    stdout = sys.stdout.buffer
    sys.stdout.flush()
    if fmt == "arrow":
        import pyarrow as pa

        first = next(batches, None)
        schema = first.schema if first is not None else t.schema()
        with pa.ipc.new_stream(stdout, schema) as w:
            if first is not None:
                w.write_batch(first)
            for b in batches:
                w.write_batch(b)
        stdout.flush()
        return 0
    if fmt == "csv":
        import pyarrow.csv as pacsv

        header = True
        for b in batches:
            pacsv.write_csv(b, stdout, write_options=pacsv.WriteOptions(include_header=header))
            header = False
        stdout.flush()
        return 0

    def default(v):
        if isinstance(v, (bytes, bytearray)):
            return base64.b64encode(v).decode("ascii")
        return str(v)

    for b in batches:
        lines = [json.dumps(row, default=default, ensure_ascii=False, separators=(",", ":")) for row in b.to_pylist()]
        stdout.write(("\n".join(lines) + "\n").encode("utf-8"))
    stdout.flush()
    return 0


def _report_pad(p, limit, batches):
    """Yield ``batches``, then say how many of the rows streamed were repeats (docs/partitioning.md).

    A rank's repeats are the tail of its share (positions past the end of the table wrap to
    its start), so of the first n rows streamed, max(0, n - fresh) are repeats.
    """
    from warpdata.cli import output as out

    repeats = max(0, min(p.rows_per_rank, (p.rank + 1) * p.rows_per_rank - p.total_rows))
    fresh = p.rows_per_rank - repeats
    streamed = 0
    for b in batches:
        streamed += b.num_rows
        yield b
    repeated = max(0, streamed - fresh)
    facts = {"rank": p.rank, "world": p.world, "rows": streamed, "repeated": repeated,
             "repeated_all_ranks": p.pad_rows, "table_rows": p.total_rows}
    if repeated:
        line = (f"--pad: rank {p.rank}/{p.world} streamed {streamed} rows, {repeated} of them repeated from the "
                f"start of the table so every rank gets the same count ({p.pad_rows} repeats over all ranks, "
                f"{p.total_rows} rows in the table)")
    else:
        line = (f"--pad: rank {p.rank}/{p.world} streamed {streamed} rows, none of them repeats "
                f"({p.pad_rows} repeats over all ranks{', cut off by --limit' if repeats else ''}, "
                f"{p.total_rows} rows in the table)")
    out.report("pad", facts, line)
