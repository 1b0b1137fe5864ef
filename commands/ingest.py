"""Publish a raw folder or file list as a dataset in one command.

LAYOUT is one of:

  imagefolder DIR WS/NAME    DIR/<label>/<image>: labels from the parent folder
  csv TABLE WS/NAME          a CSV, JSONL or Parquet table whose --file-column(s)
                             name files under --root
  paired A B WS/NAME         two folders matched by relative path without suffix

Every file is checked first: its path must stay inside its folder after
symlinks are resolved, it must be a regular, non-empty file under
--max-file-size, and an image must have a readable header, not be cut
short, declare at most --max-pixels pixels (a decompression bomb) and no more
than its bytes can hold. imagefolder row ids are the path relative to DIR
(cat/0.jpg and dog/0.jpg are two rows); --id stem keeps the bare stem. Bad files are left out and listed, with their reason, in a
`quarantine` table. The accepted rows become the `main` table, their files an
artifact bound to it (main.image=images:image), published exactly as
`warp publish` would publish the same table and files: ingesting unchanged
data again uploads nothing and prints the same version.
"""

from __future__ import annotations

from typing import Annotated

import typer
from warpdata.cli import output as out
from warpdata.cli.options import StoreOption

EXAMPLES = """
  warp ingest imagefolder photos/ vision/pets
  warp ingest imagefolder scans/ med/seg --pair masks/ --id path
  warp ingest csv labels.csv vision/pets --file-column image --root photos/
  warp ingest paired images/ masks/ med/seg --names image,mask --json
"""

LAYOUTS = {"imagefolder": 1, "csv": 1, "paired": 2}


def main(
    layout: Annotated[str, typer.Argument(help="imagefolder, csv or paired.", metavar="LAYOUT")],
    args: Annotated[list[str], typer.Argument(help="The input folder(s) or table, then the dataset id WS/NAME.",
                                              metavar="INPUT... WS/NAME")],
    id_: Annotated[str, typer.Option("--id", metavar="stem|path|hash",
                                     help="imagefolder: row ids from the relative path (default), file stem or content SHA-256.")] = "path",
    pair: Annotated[str | None, typer.Option("--pair", metavar="DIR",
                                             help="imagefolder: a folder of masks with the same stems, bound as main.mask.")] = None,
    file_column: Annotated[list[str] | None, typer.Option(
        "--file-column", metavar="COLUMN", help="csv: a column of file paths (relative to --root); repeatable.")] = None,
    root: Annotated[str | None, typer.Option("--root", metavar="DIR", help="csv: the folder the file paths are under.")] = None,
    ref_type: Annotated[str, typer.Option("--type", metavar="image|audio|video|file",
                                          help="csv, paired: what the files are; only images are decoded.")] = "image",
    names: Annotated[str | None, typer.Option("--names", metavar="A,B",
                                              help="paired: column/artifact names (default: the folder names).")] = None,
    max_file_size: Annotated[str, typer.Option("--max-file-size", metavar="SIZE",
                                               help="Quarantine files larger than this, with a unit (e.g. 256MiB); "
                                                    "a bare number is refused.")] = "256MiB",
    max_pixels: Annotated[str, typer.Option(
        "--max-pixels", metavar="N",
        help="Quarantine images whose header declares more pixels: a count, or with K, M or G in powers of "
             "1000 (e.g. 50M) (default: Pillow's cap, 89478485).")] = "89478485",
    keep: Annotated[str | None, typer.Option("--keep", metavar="DIR",
                                             help="Keep the written main/quarantine Parquet files in DIR.")] = None,
    set_latest: Annotated[bool, typer.Option(
        "--set-latest/--no-set-latest", help="Move the dataset's latest pointer to this version.")] = True,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Check and plan; upload nothing.")] = False,
    store: StoreOption = None,
    shard_size: Annotated[str, typer.Option(
        "--shard-size", metavar="SIZE", help="Target size of artifact tar shards, with a unit (e.g. 256MiB); "
                                             "a bare number is refused.")] = "256MiB",
    workers: Annotated[int, typer.Option("--workers", min=1, help="Parallel file checks, hashing and uploads.")] = 8,
    description: Annotated[str | None, typer.Option("--description", help="Free text kept in the non-hashed metadata.")] = None,
) -> int:
    from warpdata.core.errors import UsageError
    from warpdata.core.sizes import format_size, parse_count_option, parse_size_option
    from warpdata.publishing.ingest import (
        IngestOptions,
        ingest_imagefolder,
        ingest_paired,
        ingest_table,
    )

    if layout not in LAYOUTS:
        raise UsageError(f"unknown layout {layout!r}", hint="use imagefolder, csv or paired")
    want = LAYOUTS[layout] + 1
    if len(args) != want:
        shape = {"imagefolder": "DIR WS/NAME", "csv": "TABLE WS/NAME", "paired": "A B WS/NAME"}[layout]
        raise UsageError(f"ingest {layout} takes {shape} ({want} arguments), got {len(args)}",
                         hint=f"e.g. warp ingest {layout} {shape}")
    *inputs, dataset = args

    opts = IngestOptions(dataset, store_url=store, set_latest=set_latest, dry_run=dry_run,
                         shard_size=parse_size_option(shard_size, "--shard-size", "256MiB"), workers=workers,
                         max_bytes=parse_size_option(max_file_size, "--max-file-size", "256MiB"),
                         max_pixels=parse_count_option(max_pixels, "--max-pixels", "50M"), keep_dir=keep,
                         description=description)
    with out.progress("checking files", unit="files") as files_bar, out.progress("uploading", unit="B") as up_bar:
        if layout == "imagefolder":
            result = ingest_imagefolder(inputs[0], opts, id_mode=id_, pair=pair,
                                        on_file=files_bar.advance, on_upload=up_bar.advance)
        elif layout == "csv":
            if not root:
                raise UsageError("ingest csv needs --root DIR", hint="the folder the file paths are relative to")
            result = ingest_table(inputs[0], opts, file_columns=list(file_column or []), root=root,
                                  ref_type=ref_type, on_file=files_bar.advance, on_upload=up_bar.advance)
        else:
            pair_names = None
            if names:
                parts = [n.strip() for n in names.split(",")]
                if len(parts) != 2:
                    raise UsageError(f"--names {names!r} is not A,B", hint="e.g. --names image,mask")
                pair_names = (parts[0], parts[1])
            if ref_type not in ("image", "file", "audio", "video"):
                raise UsageError(f"--type {ref_type!r} is not one of image, audio, video, file", hint="e.g. --type file")
            result = ingest_paired(inputs[0], inputs[1], opts, names=pair_names, image=ref_type == "image",
                                   on_file=files_bar.advance, on_upload=up_bar.advance)

    pub = result.publish
    if out.options().json:
        out.emit_json(result.to_dict())
        return 0
    if result.quarantined:
        reasons = ", ".join(f"{k} {v}" for k, v in sorted(result.reasons.items(), key=lambda kv: -kv[1]))
        out.warn(f"{result.quarantined} file(s) quarantined ({reasons}); see the quarantine table"
                 + (f", e.g. {result.examples[0]['path']}: {result.examples[0]['message']}" if result.examples else ""))
    if pub.dry_run:
        to_send = [b for b in pub.blobs if b.upload]
        out.info(f"plan for {pub.dataset_id}: {result.rows} rows; {len(to_send)} of {len(pub.blobs)} blobs to upload, "
                 f"{format_size(sum(b.byte_size for b in to_send))} (dry run, nothing written)")
        out.data(pub.version_hash)
        return 0
    state = "already published, nothing uploaded" if pub.already_published else \
        f"uploaded {pub.blobs_uploaded} of {len(pub.blobs)} blobs ({format_size(pub.bytes_uploaded)})"
    out.info(f"ingested {result.rows} rows into {pub.dataset_id}@{pub.version_hash[:12]} ({pub.store}): {state}")
    out.data(pub.version_hash)
    return 0
