"""List the datasets published in a store, from their manifests only.

Shows each dataset's latest version, its tables, rows and bytes. Nothing but
the `latest` pointers and manifests is read (no shard listing). A dataset
published only with --no-set-latest has no latest version: its version hashes
are listed instead, for `warp stream NAME --version HASH`. Datasets registered in
place (`warp register`) come first, marked "registered": reads find them before
the store (--store lists that store alone).

`warp ls WS/NAME --versions` lists every version of one dataset, oldest first,
with its date, rows and size (one GET per version), its own bytes (store objects
no other version uses) and the bytes it shares with other versions; the latest is marked. A
dataset registered in place has one version, the files as last registered
(registering again replaces it): it is listed first, marked "registered".
"""

from __future__ import annotations

from typing import Annotated

import typer
from warpdata.cli import output as out
from warpdata.cli.options import StoreOption

EXAMPLES = """
  warp ls                 # every workspace
  warp ls vision/         # one workspace
  WARP_STORE=s3://bucket/warp warp ls --json
  WARP_STORE=https://data.example.org/warp warp ls vision/coco-mini   # HTTP stores: by name only
  warp ls vision/coco-mini --versions    # every version: date, rows, size, own and shared bytes
"""


def main(
    workspace: Annotated[str | None, typer.Argument(
        help="WORKSPACE/ (default: every workspace), or one dataset WORKSPACE/NAME.")] = None,
    store: StoreOption = None,
    versions: Annotated[bool, typer.Option(
        "--versions", help="List every version of the dataset WORKSPACE/NAME, oldest first, with dates and sizes.")] = False,
) -> int:
    from warpdata.core import envvars
    from warpdata.core.errors import MissingInputError
    from warpdata.registry.store import Store
    from warpdata.storage.locations import missing_store_folder

    st = Store(store)
    ws = workspace.strip("/") if workspace else None
    reg = _registrations(ws) if store is None else []
    missing = missing_store_folder(st.location)
    if missing and (store is not None or envvars.get("WARP_STORE")):
        raise MissingInputError(missing[0], hint=missing[1], store=st.url)
    if versions:
        return _versions(st, ws, reg, store_missing=bool(missing))
    if missing:  # the default store of a fresh install: nothing published yet
        if out.options().json:
            out.emit_json({"store": st.url, "datasets": reg})
        elif reg:
            _render(reg)
        else:
            out.info(f"no datasets: nothing has been published to the default store {st.url} yet "
                     "(set WARP_STORE or pass --store to read another one)")
        return 0
    only = None
    if ws and "/" in ws:  # `warp ls ws/name`: that one dataset
        only = ws
        ws = ws.split("/", 1)[0]
    if only is not None and st.read_only:  # an HTTP store cannot be listed: read the one pointer
        ptr = st.read_latest(only)
        listing = [(only, ptr)] if ptr is not None else []
        if ptr is None and not reg:
            raise MissingInputError(f"dataset {only} is not in store {st.url} (no latest pointer)",
                                    hint="check the spelling of workspace/name and the store URL", store=st.url)
    else:
        listing = list(st.iter_latest(ws or None))
    if only is not None:
        listing = [(d, p) for d, p in listing if d == only]
    if ws and not listing and not reg:
        import difflib

        known = st.list_datasets()
        names = [d for d in known if d.startswith(ws + "/")] if only else sorted({d.split("/")[0] for d in known})
        close = difflib.get_close_matches(only or ws, names, n=3)
        what = f"dataset {only}" if only else f"workspace {ws}/"
        raise MissingInputError(f"{what} is not in store {st.url}",
                                hint=(f"did you mean {', '.join(close)}?" if close else
                                      f"{'datasets' if only else 'workspaces'}: {', '.join(names[:8]) or 'none'}"),
                                store=st.url)
    rows = list(reg)
    for did, ptr in listing:
        if ptr is None:
            rows.append({"dataset": did, "version": None, "versions": st.list_versions(did),
                         "tables": [], "rows": None, "bytes": None})
            continue
        m = st.get_manifest(did, ptr.version_hash)
        rows.append({"dataset": did, "version": ptr.version_hash, "updated_at": ptr.updated_at,
                     "tables": sorted(m.tables), "artifacts": sorted(m.artifacts),
                     "rows": m.stats.get("total_rows"), "bytes": m.stats.get("total_bytes")})
    if out.options().json:
        out.emit_json({"store": st.url, "datasets": rows})
        return 0
    _render(rows)
    unpointed = [r for r in rows if r["version"] is None and r["versions"]]
    if unpointed:
        r = unpointed[0]
        out.info(f"{len(unpointed)} dataset(s) have versions but no latest pointer; read one with "
                 f"'warp stream {r['dataset']} --version {r['versions'][0][:12]}'")
    if not rows:
        out.info(f"no datasets in {st.url}" + (f" under {ws}/" if ws else ""))
    return 0


def _registrations(ws: str | None) -> list[dict]:
    """Rows of the datasets registered in place under ``ws`` (a workspace or one WS/NAME)."""
    from warpdata.core.errors import DataError
    from warpdata.registry.register import load, registered_ids, registry_path

    rows = []
    for did in registered_ids():
        if ws and not (did == ws or did.startswith(ws + "/")):
            continue
        try:
            doc = load(did)
        except DataError as e:
            out.warn(e.message)
            continue
        if doc is None:
            continue
        files = [f for t in doc["tables"].values() for f in t["files"]]
        rows.append({"dataset": did, "version": doc["version_hash"], "registered": str(registry_path(did)),
                     "tables": sorted(doc["tables"]), "artifacts": sorted(doc["artifacts"]),
                     "rows": sum(f["row_count"] for f in files),
                     "bytes": sum(f["byte_size"] for f in files) + sum(
                         e[1] for a in doc["artifacts"].values() for e in a["members"].values())})
    return rows


def _render(rows: list[dict]) -> None:
    from warpdata.core.sizes import format_size

    out.table(None, ["dataset", "version", "tables", "rows", "size"],
              [[r["dataset"], (r["version"][:12] + (" (registered)" if r.get("registered") else ""))
                if r["version"] else _no_latest(r["versions"]),
                ",".join(r["tables"]), r["rows"], format_size(r["bytes"]) if r["bytes"] is not None else ""]
               for r in rows])


def _no_latest(versions: list[str]) -> str:
    if not versions:
        return "(no versions)"
    more = f" (+{len(versions) - 3} more, see --json)" if len(versions) > 3 else ""
    return "(no latest) " + " ".join(v[:12] for v in versions[:3]) + more


def _versions(st, dataset: str | None, reg: list[dict], *, store_missing: bool) -> int:
    """``--versions``: the store's versions of ``dataset``, oldest first; a registration in place
    (``reg``) is one more row, first: it holds one version, the files as last registered."""
    from warpdata.core.errors import DatasetNotFoundError, UsageError
    from warpdata.core.sizes import format_size
    from warpdata.lineage.history import versions
    from warpdata.registry.register import load

    if not dataset or "/" not in dataset:
        raise UsageError("--versions lists the versions of one dataset: give WORKSPACE/NAME",
                         hint="e.g. 'warp ls vision/coco-mini --versions'")
    mine = next((r for r in reg if r["dataset"] == dataset), None)
    if mine is None:
        hist = versions(st, dataset)
    else:
        try:  # a registration may shadow a published name (--shadow): its versions are listed too
            hist = [] if store_missing else versions(st, dataset)
        except DatasetNotFoundError:
            hist = []
        doc = load(dataset) or {}
        mine = {"version_hash": mine["version"], "registered_at": doc.get("metadata", {}).get("registered_at"),
                "rows": mine["rows"], "bytes": mine["bytes"], "tables": mine["tables"],
                "artifacts": mine["artifacts"], "path": mine["registered"]}
    if out.options().json:
        doc_out = {"store": st.url, "dataset": dataset, "versions": [v.to_dict() for v in hist]}
        if mine is not None:
            doc_out["registered"] = mine
        out.emit_json(doc_out)
        return 0
    rows = [[v.version_hash[:12], v.created_at or "", v.rows,
             format_size(v.bytes) if v.bytes is not None else "", format_size(v.own_bytes),
             format_size(v.shared_bytes), "*" if v.latest else ""] for v in hist]
    if mine is not None:
        rows.insert(0, [mine["version_hash"][:12] + " (registered)", mine["registered_at"] or "", mine["rows"],
                        format_size(mine["bytes"]), "", "", "reads"])
    out.table(None, ["version", "created", "rows", "size", "own", "shared", "latest"], rows)
    if mine is not None:
        out.end_data()
        published = (f"; the store's {len(hist)} published version(s) follow it, read with --store or "
                     f"after 'warp unregister {dataset}'") if hist else ""
        out.info(f"{dataset} is registered in place ({mine['path']}): a registration holds one version, the "
                 f"files as last registered, and reads use it; registering again replaces it{published}")
    return 0
