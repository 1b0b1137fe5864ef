"""``warp inspect`` for tensor warehouses and single TWH1 shards.

Contract: :func:`sniff` recognises a TWH1 file by its magic, and a directory
(or manifest.json) whose manifest has ``"kind": "tensor-warehouse"``.
:func:`inspect` reports the shard header (a shard) or the manifest summary,
validation counts per run, reasons and shard table (a warehouse). With
``verify`` every shard's SHA-256 is recomputed and compared with the stored
trailer and the manifest, and every side table against the SHA-256 and size the manifest
records (``side_tables``; none in a manifest written before it existed); each mismatch or
structural error becomes a problem (``warp inspect --verify`` then exits 1). ``head`` lists the first
samples (key, boxes, classes, frame id).
"""

from __future__ import annotations

import os

from warpdata.artifacts.inspect import Report
from warpdata.core import sidetables
from warpdata.core.errors import DataError
from warpdata.core.jsondoc import load_json
from warpdata.core.names import TENSOR_WAREHOUSE
from warpdata.formats import twh1
from warpdata.warehouse import manifest as wmanifest


def sniff(target: str, head: bytes | None, is_dir: bool) -> bool:
    if head is not None and head[:4] == twh1.MAGIC:
        return True
    path = os.path.join(target, wmanifest.MANIFEST_NAME) if is_dir else target
    if not os.path.isfile(path) or (not is_dir and not (head or b"").lstrip().startswith(b"{")):
        return False
    try:
        with open(path, "rb") as f:
            doc = load_json(f.read(), path)
    except (OSError, ValueError):
        return False
    return isinstance(doc, dict) and doc.get("kind") == wmanifest.KIND


def _samples_table(shard: twh1.TWH1Shard, n: int, base: int = 0) -> tuple[str, list[str], list[list]]:
    rows = []
    for i in range(min(n, len(shard))):
        k = shard.num_boxes(i)
        rows.append([base + i, shard.key(i), k, shard.classes[i, :k].tolist(),
                     [[round(float(v), 1) for v in b] for b in shard.boxes[i, :min(k, 3)]], int(shard.frame_ids[i]),
                     shard.run_id(i)])
    return ("samples", ["index", "key", "boxes", "classes", "first boxes (xyxy)", "frame_id", "run_id"], rows)


def _inspect_shard(target: str, verify: bool, head: int) -> Report:
    with twh1.TWH1Shard(target) as s:
        h = s.header
        summary = {"format": "TWH1", "header": h.to_dict(), "samples": h.samples,
                   "file_bytes": os.path.getsize(target), "checksum_sha256": s.stored_checksum(),
                   "boxes": int((s.mask != 0).sum())}
        tables = [("header", ["field", "value"], [[k, v] for k, v in h.to_dict().items()]
                   + [["checksum_sha256", s.stored_checksum()]])]
        problems = []
        if verify:
            try:
                s.verify()
                summary["verified"] = True
            except DataError as e:
                problems.append(e.message)
                summary["verified"] = False
        if head:
            tables.append(_samples_table(s, head))
        return Report("twh1-shard", target, summary, tables, ok=not problems, problems=problems)


def _inspect_warehouse(target: str, verify: bool, head: int) -> Report:
    base = target if os.path.isdir(target) else os.path.dirname(target) or "."
    try:
        doc = wmanifest.read(base)
    except DataError as e:
        if not verify or e.details.get("path") is None:
            raise
        # --verify reports a manifest failing its schema, content hash or path rules as corruption (exit 1)
        return Report(TENSOR_WAREHOUSE, target, {"verified": False}, [], ok=False, problems=[e.message])
    agg = doc["summary"]["aggregate"]
    verdict = doc["summary"]["verdict"]
    t = doc["transform"]
    summary = {"version": doc["version"], "dataset_root": doc["dataset_root"], "source_format": doc.get("source_format"),
               "samples": doc["num_samples"], "shards": len(doc["shards"]),
               "bytes": sum(s["size_bytes"] for s in doc["shards"]), "transform": t, "classes": doc["classes"],
               "validation": {"aggregate": agg, "verdict": verdict["status"], "allowed": verdict["allowed"]},
               "code_version": doc["code_version"]}
    rows = [["version", doc["version"]], ["dataset_root", doc["dataset_root"]],
            ["samples", doc["num_samples"]], ["shards", len(doc["shards"])],
            ["size", f"{t['target_size'][0]}x{t['target_size'][1]} {t['resize_mode']} {t['dtype']}, "
                     f"max_boxes {t['max_boxes']}, {t.get('decode', 'full')} decode"],
            ["classes", ", ".join(f"{c['id']}:{c['name']}" for c in doc["classes"])],
            ["validation", f"{verdict['status']}" + (" (overridden by --allow-invalid)" if verdict["allowed"] else "")],
            ["code_version", doc["code_version"]]]
    runs = doc["summary"]["runs"]
    val_rows = [[name, c["total"], c["non_empty"], c["empty"], c["missing"], c["invalid"], c["kept"], c["skipped"]]
                for name, c in [("(all)", agg)] + sorted(runs.items())]
    reason_rows = [[r, n] for r, n in sorted(agg["by_reason"].items(), key=lambda kv: -kv[1])]
    problems: list[str] = []
    shard_rows = []
    for sh in doc["shards"]:
        status = ""
        if verify:
            try:
                with twh1.TWH1Shard(os.path.join(base, sh["relative_path"])) as s:
                    s.verify(sh["checksum_sha256"])
                status = "ok"
            except DataError as e:
                status = "CORRUPT"
                problems.append(e.message)
        shard_rows.append([sh["id"], sh["relative_path"], sh["samples"], f"{sh['size_bytes']:,}",
                           sh["checksum_sha256"][:16] + "…", status])
    tables = [("warehouse", ["field", "value"], rows),
              ("validation", ["run", "total", "non_empty", "empty", "missing", "invalid", "kept", "skipped"], val_rows)]
    if reason_rows:
        tables.append(("quarantine reasons", ["reason", "count"], reason_rows))
    tables.append(("shards", ["id", "file", "samples", "bytes", "sha256", "verify" if verify else ""], shard_rows))
    if verify:
        # the side tables `warp why` answers from, against the SHA-256 the manifest records
        # (docs/formats/twh1.md, "Manifest"); a manifest from before side_tables has none to check
        where = os.path.join(base, wmanifest.MANIFEST_NAME)
        side = sidetables.problems(base, doc, where, wmanifest.REBUILD_HINT)
        problems += side
        recorded = doc.get(sidetables.FIELD)
        tables.append(("side tables", ["file", "bytes", "sha256", "verify"],
                       [[n, f"{e['size_bytes']:,}", e["sha256"][:16] + "…",
                         "CORRUPT" if any(f"side table {n} " in p for p in side) else "ok"]
                        for n, e in sorted((recorded or {}).items())]
                       or [["(not recorded: built before side_tables existed)", "", "", "unchecked"]]))
        summary["verified"] = not problems
    if head and doc["shards"]:
        with twh1.TWH1Shard(os.path.join(base, doc["shards"][0]["relative_path"])) as s:
            tables.append(_samples_table(s, head))
    return Report(TENSOR_WAREHOUSE, target, summary, tables, ok=not problems, problems=problems)


def inspect(target: str, *, verify: bool = False, head: int = 0) -> Report:
    magic = b""
    if os.path.isfile(target):
        with open(target, "rb") as f:
            magic = f.read(4)
    if magic == twh1.MAGIC:
        return _inspect_shard(target, verify, head)
    return _inspect_warehouse(target, verify, head)
