"""List the datasets published in a store, from their manifests only.

Shows each dataset's latest version, its tables, rows and bytes. Nothing but
the `latest` pointers and manifests is read (no shard listing).
"""

from __future__ import annotations

from typing import Annotated

import typer
from warpdata import output as out

EXAMPLES = """
  warp ls                 # every workspace
  warp ls vision/         # one workspace
  WARP_STORE=s3://bucket/warp warp ls --json
"""


def main(
    workspace: Annotated[str | None, typer.Argument(help="WORKSPACE/ (default: every workspace).")] = None,
    store: Annotated[str | None, typer.Option("--store", help="Store URL (default: WARP_STORE).")] = None,
) -> int:
    from warpdata.blobcache import format_size
    from warpdata.registry.store import Store

    st = Store(store)
    ws = workspace.strip("/") if workspace else None
    rows = []
    for did, ptr in st.iter_latest(ws or None):
        if ptr is None:
            rows.append({"dataset": did, "version": None, "tables": [], "rows": None, "bytes": None})
            continue
        m = st.get_manifest(did, ptr.version_hash)
        rows.append({"dataset": did, "version": ptr.version_hash, "updated_at": ptr.updated_at,
                     "tables": sorted(m.tables), "artifacts": sorted(m.artifacts),
                     "rows": m.stats.get("total_rows"), "bytes": m.stats.get("total_bytes")})
    if out.options().json:
        out.emit_json({"store": st.url, "datasets": rows})
        return 0
    out.table(None, ["dataset", "version", "tables", "rows", "size"],
              [[r["dataset"], (r["version"] or "(no latest)")[:12], ",".join(r["tables"]),
                r["rows"], format_size(r["bytes"]) if r["bytes"] is not None else ""] for r in rows])
    if not rows:
        out.info(f"no datasets in {st.url}" + (f" under {ws}/" if ws else ""))
    return 0
