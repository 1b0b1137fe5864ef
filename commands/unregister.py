"""Remove a dataset registered with `warp register`; its files are left alone.

Reads of WS/NAME then resolve from the store again (WARP_STORE). Exit 66 when
the dataset is not registered.
"""

from __future__ import annotations

from typing import Annotated

import typer
from warpdata.cli import output as out

EXAMPLES = """
  warp unregister vision/local-coco
  warp unregister vision/local-coco --json
"""


def main(
    dataset: Annotated[str, typer.Argument(help="Registered dataset id, workspace/name.", metavar="WS/NAME")],
) -> int:
    from warpdata.registry.register import unregister

    path = unregister(dataset)
    if out.options().json:
        out.emit_json({"dataset_id": dataset, "removed": True, "path": path})
    else:
        out.info(f"unregistered {dataset} (removed {path}); its files were left in place")
    return 0
