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

import hashlib
import importlib.util
import math
import os

from warpdata.artifacts.inspect import Report
from warpdata.artifacts.kinds import validate
from warpdata.core.confined import confined
from warpdata.core.errors import DataError, MissingInputError
from warpdata.core.jsondoc import load_json
from warpdata.core.names import MANIFEST_NAME, ZARR_ARRAY
from warpdata.formats import crc as crc32c
from warpdata.formats import zarr_v3
from warpdata.storage import zarr_store
from warpdata.tiles.digests import level_digest, slab_digest
from warpdata.tiles.layout import layout_fields
from warpdata.tiles.ome import describe_group


def _read_json(path: str) -> dict | None:
    try:
        with open(path, "rb") as f:
            data = load_json(f.read(), path)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def sniff(target: str, head: bytes | None, is_dir: bool) -> bool:
    if is_dir:
        m = _read_json(os.path.join(target, MANIFEST_NAME))
        if m is not None:
            return m.get("kind") == ZARR_ARRAY
        # any zarr.json, even one that does not parse: inspect() then names what is wrong with it
        return os.path.isfile(os.path.join(target, zarr_v3.ZARR_JSON))
    return head is not None and os.path.basename(target) == zarr_v3.ZARR_JSON and b'"zarr_format"' in head


def _group_levels(root: str) -> tuple[list[str] | None, dict | None]:
    """(level paths, group document) from the root ``zarr.json`` when it is a group, else (None, None)."""
    store = zarr_store.Store(root)
    try:
        z = zarr_v3.read_metadata(store)
    except MissingInputError:
        return None, None
    if not isinstance(z, dict) or z.get("node_type") != "group":
        return None, None
    where = f"{root}/{zarr_v3.ZARR_JSON}"
    attrs = z.get("attributes")
    ms = None
    if isinstance(attrs, dict):
        block = attrs.get("ome") if isinstance(attrs.get("ome"), dict) else attrs.get("warp")
        if isinstance(block, dict) and isinstance(block.get("multiscales"), list) and block["multiscales"]:
            ms = block["multiscales"][0]
    if not isinstance(ms, dict):
        raise DataError(f"{where}: a Zarr group without multiscales metadata", hint="inspect one of its arrays",
                        path=where)
    datasets = ms.get("datasets")
    if not isinstance(datasets, list) or not datasets or len(datasets) > 64 or not all(
            isinstance(d, dict) and isinstance(d.get("path"), str) and d["path"] and "/" not in d["path"]
            and not d["path"].startswith(".") for d in datasets):
        raise DataError(f"{where}: multiscales datasets must be a non-empty list of {{path: name}}",
                        hint="the group metadata is damaged; rewrite the pyramid", path=where)
    return [d["path"] for d in datasets], z


def _levels(root: str, manifest: dict | None) -> tuple[list[str], dict | None]:
    """(level paths, group document), each level directory confined to ``root``: one that is a
    symlink leading out of the array, or no directory, is refused before anything in it is read
    (:func:`warpdata.core.confined.confined`; docs/formats/zarr-tiles.md)."""
    paths, group = _group_levels(root)
    where = f"{root}/{zarr_v3.ZARR_JSON}"
    if paths is None and manifest is not None and isinstance(manifest.get("levels"), list) and manifest["levels"]:
        paths = [lv.get("path", "") if isinstance(lv, dict) else "" for lv in manifest["levels"]]
        where = f"{root}/{MANIFEST_NAME}"
    if paths is None:
        return [""], None
    for p in paths:
        if p:
            confined(root, p, where, entry="level directory", directory=True,
                     hint="the array is damaged or hostile: rewrite it with 'warp etl'")
    return paths, group


def _zarr_python_check(doc: dict, where: str, group: bool) -> str | None:
    """What zarr-python's own metadata parser says about a zarr.json (None: it accepts it, or is not installed)."""
    try:
        if group:
            from zarr.core.group import GroupMetadata as Meta
        else:
            from zarr.core.metadata.v3 import ArrayV3Metadata as Meta
    except ImportError:
        return None
    try:
        Meta.from_dict(dict(doc))
    except Exception as e:  # zarr-python raises ValueError/TypeError/KeyError/... for what it refuses
        return f"{where}: zarr-python refuses this metadata ({type(e).__name__}: {str(e)[:160]})"
    return None


def _objects(store: zarr_store.Store) -> list[tuple[str, int]]:
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


def _manifest_at(root: str) -> tuple[dict | None, str | None]:
    """The zarr-array manifest at ``root`` when it passes its schema, and what is wrong with it otherwise."""
    manifest = _read_json(os.path.join(root, MANIFEST_NAME))
    if manifest is None or manifest.get("kind") != ZARR_ARRAY:
        return None, None
    try:
        validate(manifest, f"{root}/{MANIFEST_NAME}")
    except DataError as e:  # reported; the arrays are still described from zarr.json
        return None, e.message
    return manifest, None


class _Totals:
    """What ``inspect`` adds up over the levels, and what ``--verify`` checked and found."""

    def __init__(self) -> None:
        self.raw = self.stored = self.objects = 0
        self.level_rows: list[list] = []
        self.layouts: list = []
        self.problems: list[str] = []
        self.checked = {"levels": 0, "objects": 0, "chunks": 0, "chunk_crcs": 0, "index_crcs": 0, "metadata": 0,
                        "content_hashes": 0}
        self.input_crc: str | None = None


def inspect(target: str, *, verify: bool = False, head: int = 0) -> Report:
    root = os.path.dirname(target) if os.path.isfile(target) else target
    manifest, schema_problem = _manifest_at(root)
    paths, group = _levels(root, manifest)
    store = zarr_store.Store(root)
    t = _Totals()
    if schema_problem:
        t.problems.append(schema_problem)
    if verify:
        _verify_group(root, manifest, paths, group, t)
    first = None
    for i, p in enumerate(paths):
        st = store.sub(p)
        layout = zarr_v3.read_layout(st)
        objs = _objects(st)
        stored, raw = sum(n for _, n in objs), layout.dtype.itemsize * math.prod(layout.shape)
        t.layouts.append(layout)
        t.raw, t.stored, t.objects = t.raw + raw, t.stored + stored, t.objects + len(objs)
        t.level_rows.append([p or ".", list(layout.shape), list(layout.chunks), list(layout.shards) if layout.shards
                             else "-", len(objs), f"{stored:,}", f"{raw / stored:.2f}" if stored else "-"])
        first = first or (layout, objs)
        if verify and st.local:  # a grid far past the files present is refused before any is read
            zarr_v3.check_objects_present(st, layout, len(objs))
        if verify:
            _verify_level(i, st, layout, objs, manifest, t)
    layout, objs = first
    summary = {**layout_fields(layout.shape, layout.dtype, layout.chunks, layout.shards, layout.fill_value,
                               layout.level, layout.checksum),
               "levels": len(paths), "objects": t.objects, "raw_bytes": t.raw, "stored_bytes": t.stored,
               "ratio": round(t.raw / t.stored, 4) if t.stored else None}
    if group is not None:
        summary["ome_zarr"] = describe_group(group)
    if manifest is not None:
        summary.update({k: manifest[k] for k in ("backend", "input_crc32c", "downsample", "recipe_key") if k in manifest})
    tables = [("zarr array", ["field", "value"], _array_rows(summary, layout, t)),
              ("levels", ["path", "shape", "chunks", "shards", "objects", "bytes", "ratio"], t.level_rows)]
    if verify:
        summary["verified"] = not t.problems
        summary["verification"] = dict(t.checked, input_crc32c=t.input_crc, passed=not t.problems)
        tables.append(("verification", ["check", "result"], _verification_rows(t.checked, t.layouts, t.input_crc,
                                                                             manifest, group, t.problems)))
    if head:
        tables.append(("objects", ["key", "bytes"], [[k, f"{n:,}"] for k, n in objs[:head]]))
    return Report(kind=ZARR_ARRAY, target=target, summary=summary, tables=tables, ok=not t.problems,
                  problems=t.problems)


def _array_rows(summary: dict, layout, t: _Totals) -> list[list[str]]:
    rows = [["shape", f"{summary['shape']} {summary['dtype']}"],
            ["chunks / shards", f"{summary['chunks']} / {summary['shards'] or 'unsharded'}"],
            ["codec", f"zstd level {layout.level}" + (", CRC-32C per chunk" if layout.checksum else
                                                       ", no per-chunk checksum (written before warp added one)")],
            ["fill value", str(summary["fill_value"])],
            ["stored", f"{t.stored:,} bytes in {t.objects} objects (ratio {summary['ratio']})"]]
    if "ome_zarr" in summary:
        rows.append(["OME-Zarr", summary["ome_zarr"]["text"]])
    return rows


def _verify_group(root: str, manifest: dict | None, paths: list[str], group: dict | None, t: _Totals) -> None:
    """``--verify``: the group's metadata by zarr-python, and the manifest's levels against it."""
    if group is not None:
        t.checked["metadata"] += 1
        problem = _zarr_python_check(group, f"{root}/{zarr_v3.ZARR_JSON}", group=True)
        if problem:
            t.problems.append(problem)
    if manifest is not None and isinstance(manifest.get("levels"), list):
        listed = [lv.get("path", "") if isinstance(lv, dict) else None for lv in manifest["levels"]]
        if listed != paths:
            t.problems.append(f"{root}/{MANIFEST_NAME}: lists levels {listed} but the metadata has {paths}")


def _verify_level(i: int, st: zarr_store.Store, layout, objs: list[tuple[str, int]], manifest: dict | None,
                  t: _Totals) -> None:
    """``--verify`` of level ``i``: its metadata, every object and chunk, its content hash, and (level 0)
    the decoded array's CRC-32C against the input's recorded in the manifest."""
    t.checked["metadata"] += 1
    problem = _zarr_python_check(zarr_v3.read_metadata(st), f"{st.url}/{zarr_v3.ZARR_JSON}", group=False)
    if problem:
        t.problems.append(problem)
    counts, probs = zarr_v3.verify_array(st)
    t.problems.extend(probs)
    t.checked["levels"] += 1
    for k in ("objects", "chunks", "chunk_crcs", "index_crcs"):
        t.checked[k] += counts[k]
    lv_doc = manifest["levels"][i] if manifest is not None and i < len(manifest.get("levels") or []) else {}
    if isinstance(lv_doc, dict) and lv_doc.get("sha256"):
        t.checked["content_hashes"] += 1
        got = _level_content_sha256(st, layout, objs)
        if got != lv_doc["sha256"]:
            t.problems.append(f"{st.url}: the objects hash to {got} but the manifest's level sha256 is "
                              f"{lv_doc['sha256']} (docs/formats/zarr-tiles.md, \"Content hashes\")")
    if i == 0 and not probs and manifest is not None and manifest.get("input_crc32c"):
        _check_manifest_layout(manifest, layout, st.url, t.problems)
        crc = 0
        for block in zarr_v3.iter_row_blocks(st, layout):
            crc = crc32c.extend(crc, block.reshape(-1).view("u1"))
        t.input_crc = f"{crc:08x}"
        if t.input_crc != manifest["input_crc32c"]:
            t.problems.append(f"{st.url}: decoded array CRC-32C {crc:08x} differs from the input's "
                              f"{manifest['input_crc32c']} recorded in the manifest")


def _level_content_sha256(st: zarr_store.Store, layout, objs: list[tuple[str, int]]) -> str:
    """A level's content digest from its objects: per slab (one index of the slowest dimension of size > 1)
    the digest of ``<key> <sha256>`` lines in C order, then the digest of the slab digests."""
    first = next((d for d, n in enumerate(layout.shape) if n > 1), 0)
    slabs: dict[int, list[tuple[tuple[int, ...], str]]] = {}
    for key, _n in objs:
        idx = tuple(int(x) for x in key.split("/")[1:])
        slabs.setdefault(idx[first] if idx else 0, []).append((idx, key))
    digests = []
    for s in sorted(slabs):
        members = sorted(slabs[s])
        digests.append(slab_digest((key, hashlib.sha256(st.get(key)).hexdigest()) for _i, key in members))
    return level_digest(digests)


def _check_manifest_layout(manifest: dict, layout, where: str, problems: list[str]) -> None:
    """The manifest's record of level 0 (shape, dtype, chunks, shards) must match its zarr.json."""
    want = {"shape": list(layout.shape), "dtype": layout.dtype.name, "chunks": list(layout.chunks),
            "shards": list(layout.shards) if layout.shards else None}
    for k, v in want.items():
        if k in manifest and manifest[k] != v:
            problems.append(f"{where}: zarr.json has {k} {v} but the manifest records {manifest[k]}")


def _verification_rows(checked: dict, layouts: list, input_crc: str | None, manifest: dict | None,
                       group: dict | None, problems: list[str]) -> list[list[str]]:
    parsers = "warp's strict parser and zarr-python's metadata parser" if _has_zarr() else "warp's strict parser (zarr-python is not installed)"
    all_crc = all(lay.checksum for lay in layouts)
    rows = [
        ["levels", f"{checked['levels']} of {len(layouts)} read"],
        ["objects", f"{checked['objects']} read, every one"],
        ["chunks", f"{checked['chunks']} decoded (zstd frame, decoded size)"],
        ["chunk checksums", f"{checked['chunk_crcs']} CRC-32C matched" if all_crc else
         f"{checked['chunk_crcs']} CRC-32C matched; levels written without per-chunk checksums were checked "
         "by decoding only"],
        ["shard index checksums", f"{checked['index_crcs']} CRC-32C matched"],
        ["content hashes", f"{checked['content_hashes']} level(s) hashed, SHA-256 of every object, against the manifest"
         if checked["content_hashes"] else "not checked (a manifest written before warp recorded them)"],
        ["metadata", f"{checked['metadata']} zarr.json checked by {parsers}"
         + (" (group + levels)" if group is not None else "")],
    ]
    if input_crc is not None and manifest is not None:
        rows.append(["input checksum", f"level 0 decodes to CRC-32C {input_crc}, the manifest's input_crc32c"
                     if input_crc == manifest.get("input_crc32c") else f"level 0 decodes to {input_crc}, MISMATCH"])
    else:
        rows.append(["input checksum", "not checked (no manifest with input_crc32c, or level 0 failed)"])
    rows.append(["result", "PASSED" if not problems else f"FAILED: {len(problems)} problem(s)"])
    return rows


def _has_zarr() -> bool:
    return importlib.util.find_spec("zarr") is not None
