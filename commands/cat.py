"""Write one artifact member's raw bytes to stdout.

The member is located through the artifact's index and read with one ranged
GET (or from the cached shard): nothing is extracted or downloaded whole.
-v reports the store traffic on stderr (with --json as one JSON line there,
{"requests": {...}}: stdout holds the member's bytes).
"""

from __future__ import annotations

from typing import Annotated

import typer
from warpdata.cli.options import StoreOption

EXAMPLES = """
  warp cat vision/coco-mini --artifact media --ref img/0001.jpg > 0001.jpg
  warp cat vision/coco-mini --artifact media --ref labels.json | jq .
"""


def main(
    name: Annotated[str, typer.Argument(help="Published dataset, WORKSPACE/NAME.")],
    artifact: Annotated[str, typer.Option("--artifact", help="Artifact name (see 'warp inspect ws/name').")],
    ref: Annotated[str, typer.Option("--ref", metavar="MEMBER", help="Member path inside the artifact.")],
    version: Annotated[str | None, typer.Option("--version", help="A version hash (default: latest).")] = None,
    mode: Annotated[str | None, typer.Option("--mode", metavar="auto|remote|hybrid|local", help="Read mode (default: WARP_MODE or auto).")] = None,
    store: StoreOption = None,
) -> int:
    import sys

    from warpdata.cli import output as out
    from warpdata.read.dataset import dataset

    ds = dataset(name, mode=mode, version=version, store=store)
    try:
        data = ds.artifact(artifact).read(ref)
    finally:
        out.report_requests(ds.stats.to_dict())
    stdout = sys.stdout.buffer  # held by name: a failed write is reported as stdout's (warp/cli/app.py)
    sys.stdout.flush()
    stdout.write(data)
    stdout.flush()
    return 0
