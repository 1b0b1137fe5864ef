"""Print an epoch's sample count, set digest and order digest: what a training job's digests must equal.

TARGET is a published WS/NAME (a table, tensor warehouse or feature cache) or a
local artifact path (a .tbl file, a warehouse or feature-cache version
directory). The epoch is ordered exactly as the artifact's loader orders it
(docs/partitioning.md), from manifests and indexes only: no sample is read.

The set digest is what ``warpdata.partition.combine_digests`` over the final
resume states of every rank equals when every sample of the epoch was yielded
exactly once (the pad repeats and the dropped tail are accounted for in the
states). The order digest depends on the data, seed, epoch, shuffle and split
mode, never on the world size or the workers. With --world-size and --rank, the
share that rank reads in a fresh epoch. --keys prints the epoch's sample indices
in order, one per line (streamed): a sample's key is the artifact's content
name and that index.
"""

from __future__ import annotations

from typing import Annotated

import typer
from warpdata.cli.options import StoreOption

EXAMPLES = """
  warp order vision/coco-mini --seed 7 --epoch 3
  warp order vision/coco-mini --seed 7 --epoch 3 --pad --world-size 8 --rank 0 --json
  warp order ./cache/v20260101-0123456789ab --drop-last --batch-size 256 --world-size 4 --rank 1
  warp order photos.tbl --shuffle --seed 1 --keys | head
"""


def main(
    target: Annotated[str, typer.Argument(
        help="Published dataset WORKSPACE/NAME, or a .tbl file / warehouse / feature-cache directory.",
        metavar="TARGET")],
    seed: Annotated[int, typer.Option("--seed", help="The loader's seed.")] = 0,
    epoch: Annotated[int, typer.Option("--epoch", min=0, help="The epoch.")] = 0,
    drop_last: Annotated[bool, typer.Option("--drop-last", help="Full batches only (the loaders' drop_last=True).")] = False,
    pad: Annotated[bool, typer.Option("--pad", help="Repeat samples so every rank has as many (pad=True).")] = False,
    shuffle: Annotated[bool | None, typer.Option(
        "--shuffle/--no-shuffle",
        help="Shuffle as the loader does (default: the loader's own: tables and .tbl no, warehouse and "
             "feature cache yes).")] = None,
    world_size: Annotated[int | None, typer.Option("--world-size", min=1, help="Number of ranks (with --rank).")] = None,
    rank: Annotated[int | None, typer.Option("--rank", min=0, help="Show this rank's share of a fresh epoch.")] = None,
    batch_size: Annotated[int, typer.Option(
        "--batch-size", min=1, help="Batch size (drop_last keeps full batches: the share depends on it).")] = 1,
    keys: Annotated[bool, typer.Option("--keys", help="Print the sample indices in order (of --rank's share with it).")] = False,
    table: Annotated[str | None, typer.Option(
        "--table", help="WS/NAME: order this table (Table.batches); default: a published warehouse or feature cache "
                        "as its loader reads it, else the only table, else main.")] = None,
    version: Annotated[str | None, typer.Option("--version", help="WS/NAME: a version hash (default: latest).")] = None,
    store: StoreOption = None,
) -> int:
    from warpdata.cli import output as out
    from warpdata.core.errors import UsageError
    from warpdata.read.order import epoch_order

    if drop_last and pad:  # said in the CLI's words, not the library's keywords
        raise UsageError("--pad and --drop-last ask for opposite things (repeat samples to fill the uneven tail, "
                         "or drop it)",
                         hint=f"pass one of them: warp order {target} --pad (every rank as many samples) or "
                              "--drop-last (full batches only)")
    if (rank is None) != (world_size is None):
        raise UsageError("--rank and --world-size go together",
                         hint=f"warp order {target} --world-size 8 --rank 0")
    order = epoch_order(target, seed=seed, epoch=epoch, drop_last=drop_last, pad=pad, shuffle=shuffle,
                        table=table, version=version, store=store)
    if keys:
        if out.options().json:
            raise UsageError("--keys prints one index per line; it does not combine with --json",
                             hint=f"warp order {target} --keys > keys.txt")
        for chunk in order.keys(rank, world_size or 1, batch_size):
            out.data("\n".join(map(str, chunk.tolist())))
        return 0
    share = order.share(rank, world_size, batch_size) if rank is not None else None
    doc = {"target": target, "kind": order.kind, "content": order.content, "seed": order.seed,
           "epoch": order.epoch, "mode": order.mode, "shuffle": order.shuffle, "samples": order.samples,
           "set_digest": order.set_digest(), "order_digest": order.order_digest()}
    if share is not None:
        doc["rank"] = {"rank": share.rank, "world_size": share.world_size, "start": share.start,
                       "samples": share.samples, "digest": share.digest, "pad_samples": share.pad_samples,
                       "pad_digest": share.pad_digest, "dropped_samples": share.dropped_samples,
                       "batch_size": batch_size}
    if out.options().json:
        out.emit_json(doc)
        return 0
    out.data(f"samples       {order.samples}")
    out.data(f"set digest    {doc['set_digest']}")
    out.data(f"order digest  {doc['order_digest']}")
    if share is not None:
        line = (f"rank {share.rank}/{share.world_size}   {share.samples} samples from position {share.start}, "
                f"digest {share.digest}")
        if share.pad_samples:
            line += f", {share.pad_samples} pad repeat(s) digest {share.pad_digest}"
        out.data(line)
        if share.dropped_samples:
            out.info(f"drop_last: {share.dropped_samples} sample(s) at the end of the order are read by no rank")
    out.detail(f"{order.kind} {target}: content {order.content}, seed {order.seed}, epoch {order.epoch}, "
               f"{order.mode}, {'shuffled' if order.shuffle else 'not shuffled'}")
    return 0
