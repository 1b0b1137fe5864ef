"""Write a Markdown dataset card from a published version's manifest and data.

The card lists the tables (schema, rows, column statistics), the artifacts and
bindings, the quarantine counts by reason, the sources with their hashes, the
version history with a `warp diff` summary per version, and a preview picture
(`warp inspect --preview`), drawn beside the card when --out is given.

Generated sections sit between `<!-- warp:card:begin NAME -->` and
`<!-- warp:card:end NAME -->` lines. Regenerating a card (--out FILE that
exists, or the card stored with the version by `warp publish --card`) replaces
only what is between the markers: text written outside them is kept as is.

Without --out the card goes to stdout.
"""

from __future__ import annotations

from typing import Annotated

import typer
from warpdata.cli.options import StoreOption

EXAMPLES = """
  warp card vision/coco-mini --out CARD.md        # writes CARD.md and CARD.preview.png beside it
  warp card vision/coco-mini@3f2a9c1e0b7d > card.md
  warp publish vision/coco-mini --from warehouse/v20261122-3f2a9c1e0b7d --card CARD.md
"""


def main(
    dataset: Annotated[str, typer.Argument(help="Published dataset, WS/NAME[@VERSION].", metavar="WS/NAME")],
    out_file: Annotated[str | None, typer.Option(
        "--out", metavar="FILE", help="Write the card to FILE, keeping its text outside the markers.")] = None,
    no_history: Annotated[bool, typer.Option(
        "--no-history", help="Leave out the version history (it diffs each version against the one before).")] = False,
    store: StoreOption = None,
) -> int:
    from pathlib import Path

    from warpdata.cli import output as out
    from warpdata.core.atomic import atomic_write_bytes
    from warpdata.core.errors import DataError, UsageError, WarpError
    from warpdata.lineage.card import CardRequest, generate

    req = CardRequest(dataset, store_url=store, history=not no_history)
    target = Path(out_file) if out_file else None
    if target is not None:
        if target.is_dir():  # refused before the preview is drawn beside it
            raise UsageError(f"--out {target}: it is a directory", hint=f"give a file name, e.g. {target / 'CARD.md'}")
        if target.is_file():
            try:
                req.existing = target.read_text("utf-8")
            except UnicodeDecodeError:
                raise DataError(f"--out {target}: not UTF-8 text, so not a card to regenerate",
                                hint="give a Markdown file, or a new file name") from None
        picture = target.with_name(target.stem + ".preview.png")
        try:
            from warpdata.artifacts.preview import published, to_png

            name, _, version = dataset.partition("@")
            atomic_write_bytes(picture, to_png(published(name, store=store, version=version or None)))
            req.preview = picture.name
        except WarpError as e:
            req.preview_error = e.message
    card = generate(req)
    if out.options().json:
        if target is not None:
            atomic_write_bytes(target, card.markdown.encode("utf-8"))
        out.emit_json({"dataset": card.dataset, "version": card.version_hash, "out": out_file,
                       "preview": req.preview, "kept_from": card.kept_from, "sections": card.sections,
                       "markdown": card.markdown})
        return 0
    if target is None:
        out.data(card.markdown.rstrip("\n"))
        return 0
    atomic_write_bytes(target, card.markdown.encode("utf-8"))
    kept = {"file": f"; text outside the markers of {target} kept", "stored": "; around the card stored with the version"}
    out.info(f"wrote {target} for {card.dataset}@{card.version_hash[:12]}"
             + (f" with {req.preview}" if req.preview else "") + kept.get(card.kept_from or "", ""))
    return 0
