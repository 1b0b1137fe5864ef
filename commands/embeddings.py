"""Compute, list and describe embeddings of a published dataset.

  add WS/NAME --column COL --encoder ENC   embed every row of COL (an image-bound
                                           column is read through its artifact) and
                                           publish a new version with table emb_<name>
                                           (row, id, content_sha256, vector), an exact
                                           cosine index and, with FAISS installed and
                                           10,000 rows or more, an IVF-Flat ANN index
  list WS/NAME                             the embeddings of the current version
  info WS/NAME EMBEDDING                   dimension, count, encoder, source column, index

`add` publishes: the new version is the dataset's latest, and an earlier
version's vectors are reused for every row whose id and content are unchanged
(same encoder identity), so a new dataset version re-encodes only what changed
(--no-reuse encodes everything).

Encoders are plugins found like the feature cache's: a built-in name
(color-hist for images, hash-text for text; both weight-free), a
package.module:function, or a warpdata.encoders entry point; --option KEY=VALUE
passes options to it (examples/openclip_encoder.py wraps OpenCLIP). Search from
Python: warpdata.dataset("ws/name").embeddings("NAME").search(row_id_or_vector, k).
"""

from __future__ import annotations

from typing import Annotated

import typer
from warpdata.cli import output as out
from warpdata.cli.options import StoreOption

EXAMPLES = """
  warp embeddings add vision/pets --column image --encoder color-hist
  warp embeddings add text/captions --column caption --encoder hash-text --name words --option dim=512
  PYTHONPATH=examples warp embeddings add vision/pets --column image --name clip --encoder openclip_encoder:make_encoder --option model=ViT-B-32 --device cuda
  warp embeddings add vision/pets --column image --encoder color-hist --index exact --no-reuse
  warp embeddings list vision/pets
  warp embeddings list vision/pets --json
  warp embeddings info vision/pets color_hist
  warp embeddings info vision/pets color_hist --json
"""


def _options(pairs: list[str] | None) -> dict:
    import json

    from warpdata.core.errors import UsageError

    opts: dict = {}
    for p in pairs or []:
        key, sep, raw = p.partition("=")
        if not sep or not key.strip():
            raise UsageError(f"--option {p!r} is not KEY=VALUE", hint="e.g. --option dim=512 --option model=ViT-B-32")
        try:
            opts[key.strip()] = json.loads(raw)  # numbers, true/false, null, JSON lists
        except ValueError:
            opts[key.strip()] = raw
    return opts


def main(
    action: Annotated[str, typer.Argument(help="add, list or info.", metavar="ACTION")],
    dataset: Annotated[str, typer.Argument(help="Dataset id, workspace/name.", metavar="WS/NAME")],
    embedding: Annotated[str | None, typer.Argument(help="info: the embedding's name.", metavar="[EMBEDDING]")] = None,
    column: Annotated[str | None, typer.Option("--column", metavar="COLUMN", help="add: the column to embed.")] = None,
    encoder: Annotated[str | None, typer.Option("--encoder", metavar="NAME",
                                                help="add: color-hist, hash-text, module:function or an entry point.")] = None,
    name: Annotated[str | None, typer.Option("--name", metavar="NAME", help="add: the embedding's name (default: from the encoder).")] = None,
    table: Annotated[str | None, typer.Option("--table", metavar="TABLE", help="add: the table (default: the dataset's default).")] = None,
    option: Annotated[list[str] | None, typer.Option(
        "--option", metavar="KEY=VALUE", help="add: an encoder option (repeatable; VALUE as JSON, else text).")] = None,
    device: Annotated[str, typer.Option("--device", metavar="DEVICE", help="add: the encoder's device (cpu, cuda, ...).")] = "cpu",
    index: Annotated[str, typer.Option(
        "--index", metavar="KIND",
        help="add: auto (ivf-flat with FAISS and >= 10,000 rows, else exact), exact or ivf-flat.")] = "auto",
    reuse: Annotated[bool, typer.Option(
        "--reuse/--no-reuse", help="add: reuse vectors of rows unchanged since an earlier version.")] = True,
    store: StoreOption = None,
) -> int:
    from warpdata.core.errors import UsageError

    if action not in ("add", "list", "info"):
        raise UsageError(f"unknown action {action!r}", hint="use add, list or info")
    import warpdata
    from warpdata.registry import embeddings as emb
    if action == "add":
        from warpdata.publishing.embeddings_add import add

        if not column or not encoder:
            raise UsageError("embeddings add needs --column and --encoder", hint="e.g. --column image --encoder color-hist")
        res = add(dataset, column=column, encoder=encoder, name=name, table=table, store=store,
                      options=_options(option), device=device, index=index, reuse=reuse)
        if out.options().json:
            out.emit_json(res.to_dict())
        else:
            src = f" from {res.reused_from[:12]}" if res.reused_from else ""
            idx = f"ivf-flat (nlist {res.ann['nlist']}, nprobe {res.ann['nprobe']})" if res.ann else res.index
            out.info(f"embedded {res.rows} rows ({res.dim}-D) as {res.name}: encoded {res.encoded}, "
                     f"reused {res.reused}{src}; index {idx}; {dataset}@{res.version_hash[:12]}, "
                     f"uploaded {res.blobs_uploaded} of {res.blobs_total} new blobs")
            out.data(res.version_hash)
        return 0
    ds = warpdata.dataset(dataset, store=store)
    if action == "list":
        found = emb.list_embeddings(ds)
        if out.options().json:
            out.emit_json({"dataset": dataset, "embeddings": found})
        else:
            out.table(None, ["name", "dim", "count", "encoder", "source", "index"],
                      [[n, str(m["dim"]), str(m["count"]), m["encoder"].get("name", "?"), f"{m['table']}.{m['column']}",
                        f"ivf-flat nprobe={m['ann']['nprobe']}" if m.get("ann") else "exact"]
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
