"""Compute, list and describe embeddings of a published dataset.

  add WS/NAME --column COL --encoder ENC   embed every row of COL (an image-bound
                                           column is read through its artifact) and
                                           publish a new version with table emb_<name>
                                           (row, id, vector) and an exact cosine index
  list WS/NAME                             the embeddings of the current version
  info WS/NAME EMBEDDING                   dimension, count, encoder, source column

Encoders are plugins found like the feature cache's: a built-in name
(color-hist for images, hash-text for text; both weight-free), a
package.module:function, or a warpdata.encoders entry point. Search from Python:
warpdata.dataset("ws/name").embeddings("NAME").search(row_or_vector, k).
"""

from __future__ import annotations

from typing import Annotated

import typer
from warpdata.cli import output as out
from warpdata.cli.options import StoreOption

EXAMPLES = """
  warp embeddings add vision/pets --column image --encoder color-hist
  warp embeddings add text/captions --column caption --encoder hash-text --name words
  warp embeddings list vision/pets
  warp embeddings info vision/pets color_hist --json
"""


def main(
    action: Annotated[str, typer.Argument(help="add, list or info.", metavar="ACTION")],
    dataset: Annotated[str, typer.Argument(help="Dataset id, workspace/name.", metavar="WS/NAME")],
    embedding: Annotated[str | None, typer.Argument(help="info: the embedding's name.", metavar="[EMBEDDING]")] = None,
    column: Annotated[str | None, typer.Option("--column", metavar="COLUMN", help="add: the column to embed.")] = None,
    encoder: Annotated[str | None, typer.Option("--encoder", metavar="NAME",
                                                help="add: color-hist, hash-text, module:function or an entry point.")] = None,
    name: Annotated[str | None, typer.Option("--name", metavar="NAME", help="add: the embedding's name (default: from the encoder).")] = None,
    table: Annotated[str | None, typer.Option("--table", metavar="TABLE", help="add: the table (default: the dataset's default).")] = None,
    store: StoreOption = None,
) -> int:
    from warpdata.core.errors import UsageError

    if action not in ("add", "list", "info"):
        raise UsageError(f"unknown action {action!r}", hint="use add, list or info")
    import warpdata
    from warpdata.registry import embeddings as emb
    if action == "add":
        if not column or not encoder:
            raise UsageError("embeddings add needs --column and --encoder", hint="e.g. --column image --encoder color-hist")
        res = emb.add(dataset, column=column, encoder=encoder, name=name, table=table, store=store)
        if out.options().json:
            out.emit_json(res.to_dict())
        else:
            out.info(f"embedded {res.rows} rows ({res.dim}-D) as {res.name}: {dataset}@{res.version_hash[:12]}, "
                     f"uploaded {res.blobs_uploaded} of {res.blobs_total} new blobs")
            out.data(res.version_hash)
        return 0
    ds = warpdata.dataset(dataset, store=store)
    if action == "list":
        found = emb.list_embeddings(ds)
        if out.options().json:
            out.emit_json({"dataset": dataset, "embeddings": found})
        else:
            out.table(None, ["name", "dim", "count", "encoder", "source"],
                      [[n, str(m["dim"]), str(m["count"]), m["encoder"].get("name", "?"), f"{m['table']}.{m['column']}"]
                       for n, m in found.items()])
        return 0
    if not embedding:
        raise UsageError("embeddings info needs the embedding's name", hint=f"see 'warp embeddings list {dataset}'")
    doc = emb.info(ds, embedding)
    if out.options().json:
        out.emit_json(doc)
    else:
        for k, v in doc.items():
            out.data(f"{k}: {v}")
    return 0
