"""Write one artifact member's raw bytes to stdout.

The member is located through the artifact's index and read with one ranged
GET (or from the cached shard): nothing is extracted or downloaded whole.
-v reports the store traffic on stderr (with --json as one JSON line there,
{"requests": {...}}: stdout holds the member's bytes). A binary member (one
that is not UTF-8 text) is not written to a terminal (exit 2): redirect it,
or pass --force.
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
    force: Annotated[bool, typer.Option("--force", help="Write a binary member even when stdout is a terminal.")] = False,
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
    if not force and out.stdout_is_tty() and _binary(data):
        from warpdata.core.errors import UsageError

        raise UsageError(f"{ref} is binary ({len(data)} bytes) and stdout is a terminal",
                         hint=f"redirect it (> {ref.rsplit('/', 1)[-1]}), pipe it, or pass --force")
    stdout = sys.stdout.buffer  # held by name: a failed write is reported as stdout's (warp/cli/app.py)
    sys.stdout.flush()
    stdout.write(data)
    stdout.flush()
    return 0


def _binary(data: bytes) -> bool:
    """Not text a terminal can show: a NUL byte, or not UTF-8."""
    if b"\0" in data:
        return True
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return True
    return False
