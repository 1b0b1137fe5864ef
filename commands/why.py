"""Show everything one sample came from, read from manifests and side tables only.

TARGET is a tensor-warehouse version directory, a feature cache (either also as
the s3:// URL `warp etl` wrote it to), a .tbl file, a Zarr array written by
`warp etl`, or a published dataset WS/NAME[@VERSION]. SAMPLE is an index
(0-based; all digits) or a key. The answer names the source file (its path
relative to the dataset root, or its store URL) and SHA-256, the label file and
its hash, the annotation of each box in it, the validation verdict, the
transform recipe and its hash, the encoder and its fingerprint (feature
caches), the shard and the offset inside it, the shard's receipt facts, and for a published row its shard, row group and the
blob hashes of its bound refs. A key that was quarantined answers with its
quarantine reason. Sample payloads are never read. What an artifact does not
record is listed under "not recorded".
"""

from __future__ import annotations

from typing import Annotated

import typer
from warpdata.cli.options import StoreOption

EXAMPLES = """
  warp why warehouse/v20261122-3f2a9c1e0b7d 17
  warp why warehouse/v20261122-3f2a9c1e0b7d images/img_00042.jpg --json
  warp why captions-cache d0/group_000/00002.jpg
  warp why s3://bucket/warehouse/v20261122-3f2a9c1e0b7d 17    # ranged reads of the side tables
  warp why vision/coco-mini 1234              # a published row: shard, row group, bound blobs
  warp why vision/coco-mini@3f2a9c1e0b7d photos/cat.jpg --table main
"""

# `warp why DS -1`: Click reads -1 as an option; warp/cli/app.py answers with this instead
NEGATIVE_ARGUMENT = ("sample indexes count from 0 (the first sample is 0, the last of N is N-1), so none is "
                     "negative; give an index from 0, or a key (one that starts with '-' goes after '--')")


def main(
    target: Annotated[str, typer.Argument(
        help="Warehouse version, feature cache, .tbl file, Zarr array, or WS/NAME[@VERSION].", metavar="TARGET")],
    sample: Annotated[str, typer.Argument(help="The sample's index (0-based) or key.", metavar="INDEX|KEY")],
    table: Annotated[str | None, typer.Option(
        "--table", metavar="T", help="Published datasets: the table (default: the one readers use).")] = None,
    store: StoreOption = None,
) -> int:
    from warpdata.cli import output as out
    from warpdata.lineage.why import WhyRequest, why

    res = why(WhyRequest(target, sample, store_url=store, table=table))
    if out.options().json:
        out.emit_json(res.to_dict())
        return 0
    out.data(f"{'sample:':<14}{res.index if res.index is not None else '-'}"
             + (f"  key {res.key}" if res.key is not None else ""))
    out.data(f"{'in:':<14}{res.target} ({res.kind})")
    if res.status != "kept":
        out.data(f"{'status:':<14}{res.status}")
    if res.label and res.annotation_ids is not None:
        res.label = {**res.label, "annotation_ids": res.annotation_ids}
    for title, section in (("source", res.source), ("label", res.label), ("validation", res.validation),
                           ("transform", res.transform), ("encoder", res.encoder), ("location", res.location),
                           ("receipt", res.receipt), ("row", res.row)):
        if section:
            _section(out, title, section)
    if res.producer:
        for p in res.producer:
            _section(out, "produced by", p)
    for m in res.missing:
        out.data(f"{'not recorded:':<14}{m}")
    return 0


def _section(out, title: str, section: dict) -> None:
    import json

    first = True
    for k, v in section.items():
        if v is None:
            continue
        if k == "refs":
            for ref in v:
                line = f"{ref['column']} -> {ref['artifact']}:{ref['member']}"
                if "blob_sha256" in ref:
                    line += f" blob {ref['blob_sha256']} [{ref['offset']}, +{ref['length']})"
                elif ref.get("dangling"):
                    line += " (dangling: no such member)"
                out.data(f"{title + ':' if first else '':<14}ref {line}")
                first = False
            continue
        text = v if isinstance(v, str | int | float) else json.dumps(v, sort_keys=True, separators=(",", ":"))
        out.data(f"{title + ':' if first else '':<14}{k} {text}")
        first = False
