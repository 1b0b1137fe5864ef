"""Publish a dataset version to the store: tables, raw artifacts, bindings.

Tables are Parquet files (CSV and JSONL are converted); artifact directories
are packed into deterministic tar shards with a member index; --from
publishes anything another warp command wrote (tensor warehouse, Zarr array,
feature cache, .tbl). Every blob is named by its SHA-256 and uploaded
create-only, then the version manifest, then `latest` moves by
compare-and-swap. Publishing unchanged content again uploads nothing and
prints the same version; a killed publish can simply be rerun.

Every value of a --bind column must name a member of the artifact (a path
relative to the artifact directory); otherwise nothing is published, the
first missing values are listed and the exit status is 65. --allow-dangling
publishes anyway and records the number of dangling values in the manifest's
metadata (dangling_refs).

Inside an --artifact directory, symlinks to files are read through; symlinked
directories are skipped (and named when that leaves bound values dangling or
the artifact empty) unless --follow-symlinks.

The store is WARP_STORE (default: a local directory under $XDG_DATA_HOME),
or --store. S3 credentials come from the usual AWS chain (AWS_PROFILE,
AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, instance roles); endpoint and
addressing from WARP_S3_ENDPOINT / WARP_S3_PATH_STYLE.
"""

from __future__ import annotations

from typing import Annotated

import typer
from warpdata.cli import output as out
from warpdata.cli.options import StoreOption

EXAMPLES = """
  warp publish vision/coco-mini --table main='data/*.parquet' --artifact images=photos/ \\
      --bind main.image=images:image
  warp publish vision/coco-mini --from warehouse/v20261122-3f2a9c1e0b7d --json
  warp publish text/captions --table main=captions.jsonl --dry-run
  WARP_STORE=s3://team-bucket/warp warp publish ws/name --table main=out/*.parquet --no-set-latest
  warp publish vision/coco-mini --from warehouse/v20261122-3f2a9c1e0b7d --card CARD.md
  warp publish vision/coco-mini --from warehouse/v20261122-3f2a9c1e0b7d --sign-key release.pem
"""


def main(
    dataset: Annotated[str, typer.Argument(help="Dataset id, workspace/name.", metavar="WS/NAME")],
    table: Annotated[list[str] | None, typer.Option(
        "--table", metavar="NAME=GLOB", help="Table NAME from Parquet (or CSV/JSONL) files; repeatable.")] = None,
    artifact: Annotated[list[str] | None, typer.Option(
        "--artifact", metavar="NAME=DIR", help="Pack DIR's files into tar shards as artifact NAME; repeatable.")] = None,
    bind: Annotated[list[str] | None, typer.Option(
        "--bind", metavar="TABLE.COLUMN=ARTIFACT:TYPE",
        help="Column values are member paths in ARTIFACT, read as TYPE (image, audio, video, file); repeatable.")] = None,
    allow_dangling: Annotated[bool, typer.Option(
        "--allow-dangling", help="Publish even if --bind values name no member; the count goes in the manifest.")] = False,
    follow_symlinks: Annotated[bool, typer.Option(
        "--follow-symlinks", help="Walk symlinked directories inside --artifact directories (symlinked files are always read).")] = False,
    from_: Annotated[list[str] | None, typer.Option(
        "--from", metavar="PATH", help="Publish a warp artifact (directory with manifest.json, .tbl, or the s3:// URL of a feature cache built there); repeatable.")] = None,
    set_latest: Annotated[bool, typer.Option(
        "--set-latest/--no-set-latest", help="Move the dataset's latest pointer to this version.")] = True,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Print the plan (blobs to upload, bytes, version); change nothing.")] = False,
    store: StoreOption = None,
    shard_size: Annotated[str, typer.Option(
        "--shard-size", metavar="SIZE", help="Target size of artifact tar shards, with a unit (e.g. 256MiB); a bare number is refused.")] = "256MiB",
    workers: Annotated[int, typer.Option("--workers", min=1, help="Parallel hashing and uploads.")] = 8,
    rehash: Annotated[bool, typer.Option("--rehash", help="Ignore the stat cache: hash and pack every input again.")] = False,
    keep_layout: Annotated[bool, typer.Option(
        "--keep-layout", help="Publish Parquet files byte for byte. By default a file without a page index is "
                              "rewritten with one (pages of 512 rows, same rows and codec), so readers of part "
                              "of a row group fetch only its pages (docs/partitioning.md).")] = False,
    link_cache: Annotated[bool, typer.Option(
        "--link-cache", help="Hard-link the published files into the local blob cache, so this machine reads "
                             "the dataset from them instead of downloading it (remote stores).")] = False,
    description: Annotated[str | None, typer.Option("--description", help="Free text kept in the non-hashed metadata.")] = None,
    card: Annotated[str | None, typer.Option(
        "--card", metavar="FILE", help="A Markdown dataset card (see 'warp card') kept with the version in the non-hashed metadata.")] = None,
    sign_key: Annotated[list[str] | None, typer.Option(
        "--sign-key", metavar="KEY", help="Sign the version with this PEM Ed25519 private key (openssl genpkey -algorithm "
                                          "ed25519); readers with WARP_TRUSTED_KEYS accept only signed versions; repeatable.")] = None,
) -> int:
    from warpdata.core.errors import UsageError
    from warpdata.core.sizes import format_size, parse_size_option
    from warpdata.publishing.publish import PublishRequest, parse_binding, parse_named, publish

    req = PublishRequest(dataset_id=dataset, set_latest=set_latest, dry_run=dry_run, store_url=store,
                         workers=workers, rehash=rehash, link_cache=link_cache, description=description,
                         allow_dangling=allow_dangling, follow_symlinks=follow_symlinks,
                         layout="as-is" if keep_layout else "paged", sign_keys=list(sign_key or []))
    req.shard_size = parse_size_option(shard_size, "--shard-size", "256MiB")
    for spec in table or []:
        name, pattern = parse_named(spec, "--table")
        req.tables.setdefault(name, []).append(pattern)
    for spec in artifact or []:
        name, directory = parse_named(spec, "--artifact")
        if name in req.artifacts:
            raise UsageError(f"--artifact {name} given twice", hint="give each artifact a distinct name")
        req.artifacts[name] = directory
    req.bindings = [parse_binding(b) for b in bind or []]
    req.from_paths = list(from_ or [])
    if card is not None:
        from pathlib import Path

        from warpdata.core.errors import DataError, MissingInputError

        try:
            req.card = Path(card).read_text("utf-8")
        except FileNotFoundError:
            raise MissingInputError(f"--card {card}: no such file", hint="write one with 'warp card WS/NAME --out FILE'") from None
        except UnicodeDecodeError:
            raise DataError(f"--card {card}: not UTF-8 text", hint="a card is a Markdown file") from None
        except IsADirectoryError:  # a read: not the OS taxonomy's "cannot write"
            raise UsageError(f"--card {card}: it is a directory", hint="give the card's Markdown file") from None
        from warpdata.lineage.card import card_dataset

        named = card_dataset(req.card)
        if named is not None and named != dataset:
            out.warn(f"--card {card} is headed {named}, not {dataset}: another dataset's card? It is stored with "
                     f"{dataset} as written, and a version's stored card is never rewritten")

    with out.progress("uploading", unit="B") as bar:
        result = publish(req, on_upload=bar.advance)

    if result.card_stored is False:
        out.warn(f"--card: version {result.version_hash[:12]} was already published, and a stored manifest is never "
                 "rewritten: the card stored with it (if any) stays; 'warp card' regenerates around it")
    if result.signatures_stored is False:
        out.warn(f"--sign-key: version {result.version_hash[:12]} was already published, and a stored manifest is never "
                 "rewritten: it keeps the signatures it has (delete it, and latest.json if it names it, to sign it)")
    for binding, n in sorted(result.dangling_refs.items()):
        out.warn(f"--allow-dangling: {n} value(s) of {binding} name no member; reads of them will fail")
    from warpdata.registry.register import load as registration

    reg = registration(result.dataset_id) if not result.dry_run else None
    if reg is not None:  # reads by name find a registration first (docs/lineage.md, "Registered datasets")
        out.warn(f"{result.dataset_id} is also registered in place on this machine (version "
                 f"{reg['version_hash'][:12]}): reads of {result.dataset_id} here serve that registration, not "
                 f"this publish; 'warp unregister {result.dataset_id}' to read the published version, or read "
                 "with --store")
    if out.options().json:
        out.emit_json({k: v for k, v in result.to_dict().items() if v is not None or k == "latest"})
        return 0
    to_send = [b for b in result.blobs if b.upload]
    if result.dry_run:
        out.info(f"plan for {result.dataset_id} in {result.store} (dry run, nothing written):")
        out.table(None, ["blob", "role", "size", "action"],
                  [[b.hash[:12], b.role, format_size(b.byte_size), "upload" if b.upload else "present"]
                   for b in result.blobs])
        out.info(f"{len(to_send)} of {len(result.blobs)} blobs to upload, "
                 f"{format_size(sum(b.byte_size for b in to_send))} of {format_size(result.bytes_total)}"
                 + ("; version already published" if result.already_published else ""))
        out.data(result.version_hash)
        return 0
    state = "already published, nothing uploaded" if result.already_published else \
        f"uploaded {result.blobs_uploaded} of {len(result.blobs)} blobs ({format_size(result.bytes_uploaded)})"
    latest = "latest -> this version" if result.latest == result.version_hash else \
        f"latest unchanged ({(result.latest or 'none')[:12]})"
    out.info(f"published {result.dataset_id}@{result.version_hash[:12]} to {result.store}: {state}; "
             f"{latest} [{result.seconds:.2f}s]")
    out.data(result.version_hash)
    return 0
