"""Register local files as a dataset, read in place: nothing is copied into a store.

Tables are Parquet files (a comma-separated list or globs per --table; repeatable);
artifact directories are read member by member where they are; --bind works as in
`warp publish`: every value of a bound column must name a member (a path relative to
the artifact directory) unless --allow-dangling. Every file is hashed (SHA-256) and
its absolute path, hash and stamp (size, mtime, inode, ctime) go into a registration
under $WARP_CACHE_DIR/registered/WS/NAME.json. Registering again hashes only the files
whose stamps moved, and replaces the registration. A name the store publishes is
refused unless --shadow: reads of it would switch to the local files.

warpdata.dataset("ws/name"), `warp stream`, `cat`, `inspect` and `doctor` find a
registered dataset before the store (unless --store names one). A file changed
since it was registered is hashed again when read; if its bytes differ the read
fails (exit 65) naming the file and asking to register again. `warp unregister`
removes the registration and leaves the files alone. `warp ls` lists registrations,
marked as such; `warp inspect WS/NAME --verify` hashes every registered file.
"""

from __future__ import annotations

from typing import Annotated

import typer
from warpdata.cli import output as out

EXAMPLES = """
  warp register vision/local-coco --table main=data/part-0.parquet,data/part-1.parquet \\
      --artifact images=photos/ --bind main.image=images:image
  warp register text/notes --table main='notes/*.parquet' --json
  warp stream vision/local-coco --limit 5          # reads the files in place
  warp unregister vision/local-coco
"""


def main(
    dataset: Annotated[str, typer.Argument(help="Dataset id, workspace/name.", metavar="WS/NAME")],
    table: Annotated[list[str] | None, typer.Option(
        "--table", metavar="NAME=FILES", help="Table NAME from Parquet files (comma-separated paths or globs); repeatable.")] = None,
    artifact: Annotated[list[str] | None, typer.Option(
        "--artifact", metavar="NAME=DIR", help="Artifact NAME: the files under DIR, read in place; repeatable.")] = None,
    bind: Annotated[list[str] | None, typer.Option(
        "--bind", metavar="TABLE.COLUMN=ARTIFACT:TYPE",
        help="Column values are member paths in ARTIFACT, read as TYPE (image, audio, video, file); repeatable.")] = None,
    allow_dangling: Annotated[bool, typer.Option(
        "--allow-dangling", help="Register even if --bind values name no member; the count is recorded.")] = False,
    follow_symlinks: Annotated[bool, typer.Option(
        "--follow-symlinks", help="Walk symlinked directories inside --artifact directories.")] = False,
    workers: Annotated[int, typer.Option("--workers", min=1, help="Files hashed in parallel.")] = 8,
    description: Annotated[str | None, typer.Option("--description", help="Free text kept with the registration.")] = None,
    shadow: Annotated[bool, typer.Option(
        "--shadow", help="Register even if the store publishes WS/NAME; reads then use the local files.")] = False,
) -> int:
    from warpdata.core.errors import UsageError
    from warpdata.core.sizes import format_size
    from warpdata.publishing.publish import parse_binding, parse_named
    from warpdata.publishing.register_files import RegisterRequest, register

    req = RegisterRequest(dataset_id=dataset, allow_dangling=allow_dangling, follow_symlinks=follow_symlinks,
                          description=description, workers=workers, shadow=shadow)
    for spec in table or []:
        name, files = parse_named(spec, "--table")
        req.tables.setdefault(name, []).append(files)
    for spec in artifact or []:
        name, directory = parse_named(spec, "--artifact")
        if name in req.artifacts:
            raise UsageError(f"--artifact {name} given twice", hint="give each artifact a distinct name")
        req.artifacts[name] = directory
    req.bindings = [parse_binding(b) for b in bind or []]
    res = register(req)
    for binding, n in sorted(res.dangling_refs.items()):
        out.warn(f"--allow-dangling: {n} value(s) of {binding} name no member; reads of them will fail")
    if res.store_unchecked:
        out.warn(f"could not check whether the store publishes {res.dataset_id} ({res.store_unchecked}); if it "
                 "does, reads of that name now use these local files")
    if res.shadows:
        out.warn(f"--shadow: reads of {res.dataset_id} now use these local files, not the version published in "
                 f"{res.shadows} ('warp unregister {res.dataset_id}' restores it)")
    if out.options().json:
        out.emit_json(res.to_dict())
        return 0
    parts = [f"{t} ({v['files']} file(s), {v['rows']} rows)" for t, v in res.tables.items()] + \
        [f"{a} ({v['members']} files under {v['root']})" for a, v in res.artifacts.items()]
    what = "replaced " + res.replaced[:12] if res.replaced else "registered"
    out.info(f"{what}: {res.dataset_id}@{res.version_hash[:12]} in place: {', '.join(parts)}; hashed "
             f"{res.hashed_files} of {res.files} file(s) ({format_size(res.hashed_bytes)}) "
             f"[{res.seconds:.2f}s]; registration {res.path}")
    out.data(res.version_hash)
    return 0
