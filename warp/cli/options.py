"""Options that several commands share, declared once (pip's ``cmdoptions``).

Use them as the annotation of a command parameter::

    def main(dataset: str, store: StoreOption = None) -> int: ...
"""

from __future__ import annotations

from typing import Annotated

import typer

StoreOption = Annotated[str | None, typer.Option(
    "--store", metavar="URL",
    help="Store URL or path: a folder, s3://bucket/prefix, memory://name or https://host/prefix "
         "(read-only) (default: WARP_STORE).")]
