"""``warp inspect`` for Zarr v3 arrays and pyramids written by warp.

Contract: :func:`sniff` claims a directory holding a ``manifest.json`` of
kind ``zarr-array``, or a ``zarr.json`` (a Zarr v3 array or group), or a
``zarr.json`` file itself. :func:`inspect` summarises shape, dtype, chunk and
shard shapes, codec, levels, object count, stored bytes and ratio; ``--head
N`` lists the first N objects. With ``verify`` every object is read: shard
index CRC-32C, every zstd frame, every decoded size; and when the manifest
records the input's CRC-32C, the decoded array is re-checksummed in C order
and compared — any difference is a problem (exit 1).
"""

from __future__ import annotations

import json
import os

from warpdata.errors import DataError
from warpdata.formats import zarr_v3
from warpdata.inspectors import Report
from warpdata.manifests import MANIFEST_NAME


def _read_json(path: str) -> dict | None:
    try:
        with open(path, "rb") as f:
            data = json.loads(f.read())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def sniff(target: str, head: bytes | None, is_dir: bool) -> bool:
    if is_dir:
        m = _read_json(os.path.join(target, MANIFEST_NAME))
        if m is not None:
            return m.get("kind") == "zarr-array"
        z = _read_json(os.path.join(target, zarr_v3.ZARR_JSON))
        return z is not None and z.get("zarr_format") == 3
    return head is not None and os.path.basename(target) == zarr_v3.ZARR_JSON and b'"zarr_format"' in head


def _levels(root: str, manifest: dict | None) -> list[str]:
    if manifest is not None and manifest.get("levels"):
        return [lv.get("path", "") for lv in manifest["levels"]]
    z = _read_json(os.path.join(root, zarr_v3.ZARR_JSON)) or {}
    if z.get("node_type") == "group":
        ms = z.get("attributes", {}).get("ome", {}).get("multiscales", [])
        if ms:
            return [d["path"] for d in ms[0].get("datasets", [])]
        raise DataError(f"{root}: a Zarr group without multiscales metadata", hint="inspect one of its arrays")
    return [""]


def _objects(store: zarr_v3.Store) -> list[tuple[str, int]]:
    base = os.path.join(store.location.path, "c")
    found = []
    for dirpath, _dirs, files in os.walk(base):
        for name in files:
            if name.startswith("."):
                continue
            p = os.path.join(dirpath, name)
            found.append((os.path.relpath(p, store.location.path), os.path.getsize(p)))
    found.sort(key=lambda kv: [int(x) if x.isdigit() else -1 for x in kv[0].split("/")[1:]])
    return found


def inspect(target: str, *, verify: bool = False, head: int = 0) -> Report:
    from warpdata.formats import crc as crc32c

    root = os.path.dirname(target) if os.path.isfile(target) else target
    manifest = _read_json(os.path.join(root, MANIFEST_NAME))
    if manifest is not None and manifest.get("kind") != "zarr-array":
        manifest = None
    paths = _levels(root, manifest)
    store = zarr_v3.Store(root)
    rows, problems, level_rows = [], [], []
    total_raw = total_stored = total_objects = 0
    first = None
    for i, p in enumerate(paths):
        st = store.sub(p)
        layout = zarr_v3.read_layout(st)
        objs = _objects(st)
        stored = sum(n for _, n in objs)
        raw = layout.dtype.itemsize
        for s in layout.shape:
            raw *= s
        total_raw += raw
        total_stored += stored
        total_objects += len(objs)
        level_rows.append([p or ".", list(layout.shape), list(layout.chunks), list(layout.shards) if layout.shards else
                           "-", len(objs), f"{stored:,}", f"{raw / stored:.2f}" if stored else "-"])
        if first is None:
            first = (st, layout, objs)
        if verify:
            counts, probs = zarr_v3.verify_array(st)
            problems.extend(probs)
            if i == 0 and not probs and manifest is not None and manifest.get("input_crc32c"):
                crc = 0
                for block in zarr_v3.iter_row_blocks(st, layout):
                    crc = crc32c.extend(crc, block.reshape(-1).view("u1"))
                if f"{crc:08x}" != manifest["input_crc32c"]:
                    problems.append(f"{st.url}: decoded array CRC-32C {crc:08x} differs from the input's "
                                    f"{manifest['input_crc32c']} recorded in the manifest")
    st, layout, objs = first
    summary = {
        "format": "zarr-v3",
        "shape": list(layout.shape),
        "dtype": layout.dtype.name,
        "chunks": list(layout.chunks),
        "shards": list(layout.shards) if layout.shards else None,
        "fill_value": zarr_v3.fill_value_json(layout.fill_value, layout.dtype),
        "codec": {"name": "zstd", "level": layout.level},
        "levels": len(paths),
        "objects": total_objects,
        "raw_bytes": total_raw,
        "stored_bytes": total_stored,
        "ratio": round(total_raw / total_stored, 4) if total_stored else None,
    }
    if manifest is not None:
        summary.update({k: manifest[k] for k in ("backend", "input_crc32c", "downsample", "recipe_key") if k in manifest})
    if verify:
        summary["verified"] = not problems
    rows = [["shape", f"{summary['shape']} {summary['dtype']}"],
            ["chunks / shards", f"{summary['chunks']} / {summary['shards'] or 'unsharded'}"],
            ["codec", f"zstd level {layout.level}"], ["fill value", str(summary["fill_value"])],
            ["stored", f"{total_stored:,} bytes in {total_objects} objects (ratio {summary['ratio']})"]]
    tables = [("zarr array", ["field", "value"], rows),
              ("levels", ["path", "shape", "chunks", "shards", "objects", "bytes", "ratio"], level_rows)]
    if head:
        tables.append(("objects", ["key", "bytes"], [[k, f"{n:,}"] for k, n in objs[:head]]))
    return Report(kind="zarr-array", target=target, summary=summary, tables=tables, ok=not problems,
                  problems=problems)
