"""``warp inspect`` for feature caches (directories) and single WFS1 shards.

Recognises a directory whose ``manifest.json`` has ``"kind": "feature-cache"``
(or that manifest file itself) and any file starting with the ``WFS1`` magic.
A cache report gives the fingerprint and what it covers, record and shard
counts, fields with dtypes and shapes, quarantine counts per reason and the
verdict; ``--head N`` lists the first N records (key, caption, sizes).
``--verify`` checks every shard's SHA-256 against the manifest, every
record's CRC-32C and every side file (``records.parquet``, ``keys.txt``, the quarantine's
files) against the SHA-256 and size the manifest records in ``side_tables``.
"""

from __future__ import annotations

import os
from typing import Any

from warpdata.artifacts.inspect import Report
from warpdata.artifacts.manifests import MANIFEST_NAME, read_manifest
from warpdata.core import sidetables
from warpdata.core.errors import DataError
from warpdata.features.manifest import KIND, REBUILD_HINT, sniff  # noqa: F401 (the inspector's sniff, kept light there)
from warpdata.features.manifest import read as read_checked
from warpdata.features.reader import ShardCache, caption_text
from warpdata.formats.featshard import FeatureShardReader


def inspect(target: str, *, verify: bool = False, head: int = 0) -> Report:
    if os.path.isfile(target) and not target.endswith(".json"):
        return _inspect_shard(target, verify=verify, head=head)
    root = target if os.path.isdir(target) else os.path.dirname(target) or "."
    return _inspect_cache(root, verify=verify, head=head)


def _inspect_cache(root: str, *, verify: bool, head: int) -> Report:
    m = read_manifest(root)
    try:
        read_checked(root)
    except DataError as e:
        if not verify:
            raise
        # --verify reports a manifest that fails its schema or content hash as corruption (exit 1)
        return Report(kind=KIND, target=root, summary={"fingerprint": m.get("fingerprint"), "verified": False},
                      tables=[], ok=False, problems=[e.message])
    enc = (m.get("fingerprint_inputs") or {}).get("encoder")
    agg = (m.get("quarantine") or {}).get("aggregate", {})
    shards = m.get("shards", [])
    summary: dict[str, Any] = {
        "fingerprint": m.get("fingerprint"),
        "format": m.get("format"),
        "records": m.get("records"),
        "shards": len(shards),
        "shard_size": m.get("shard_size"),
        "record_size": m.get("record_size"),
        "bytes": sum(int(s.get("bytes", 0)) for s in shards),
        "target_size": m.get("target_size"),
        "encoder": enc,
        "fields": {f["name"]: {"dtype": f["dtype"], "shape": f["shape"]} for f in m.get("fields", [])},
        "quarantine": agg,
        "verdict": (m.get("verdict") or {}).get("status"),
        "captions_truncated": m.get("captions_truncated", 0),
    }
    tables = [
        ("fields", ["name", "dtype", "shape"],
         [[f["name"], f["dtype"], "x".join(map(str, f["shape"])) or "scalar"] for f in m.get("fields", [])]),
        ("cache", ["field", "value"],
         [["fingerprint", m.get("fingerprint")], ["records", m.get("records")],
          ["shards", f"{len(shards)} x {m.get('shard_size')} records, {summary['bytes']} bytes"],
          ["target size", "x".join(map(str, m.get("target_size", [])))],
          ["encoder", (enc or {}).get("config_name") or "none (pixels)"],
          ["verdict", summary["verdict"]]]),
    ]
    if m.get("sources"):  # [[directory]] builds (docs/features-config.md)
        summary["sources"] = m["sources"]
        summary["samples_per_epoch"] = sum(s["records"] * s["num_repeats"] for s in m["sources"])
        tables.append(("sources", ["name", "records", "first record", "num_repeats", "caption prefix"],
                       [[s["name"], s["records"], s["first_record"], s["num_repeats"], s["caption_prefix"]]
                        for s in m["sources"]]))
    tables += [
        ("quarantine", ["reason", "count"],
         [[k, v] for k, v in sorted(agg.get("by_reason", {}).items())]
         + [["(total / kept)", f"{agg.get('total', 0)} / {agg.get('kept', 0)}"]]),
    ]
    problems: list[str] = []
    ok = True
    with ShardCache(root, verify="fast") as cache:
        if head:
            keys: list[str] = []
            kp = os.path.join(root, "keys.txt")
            if os.path.isfile(kp):
                with open(kp, encoding="utf-8") as f:
                    for line in f:
                        if len(keys) >= head:
                            break
                        keys.append(line.rstrip("\n"))
            rows = []
            for i in range(min(head, len(cache))):
                r = cache.get(i, ["caption", "caption_len", "size", "orig_size"])
                rows.append([i, keys[i] if i < len(keys) else "", caption_text(r["caption"], r["caption_len"])[:60],
                             "x".join(map(str, r["size"])), "x".join(map(str, r["orig_size"]))])
            tables.append(("records", ["index", "key", "caption", "size", "orig_size"], rows))
        if verify:
            problems = cache.verify_all()
            # the side files `warp why` answers from, against the manifest's side_tables
            # (docs/formats/feature-shard.md, "Cache manifest"); none to check in an older cache
            problems += sidetables.problems(root, m, os.path.join(root, MANIFEST_NAME), REBUILD_HINT)
            ok = not problems
            summary["verified"] = ok
    return Report(kind=KIND, target=root, summary=summary, tables=tables, ok=ok, problems=problems)


def _inspect_shard(path: str, *, verify: bool, head: int) -> Report:
    problems: list[str] = []
    with FeatureShardReader(path) as r:
        summary = {"format": "WFS1", "records": len(r), "record_size": r.layout.record_size,
                   "data_offset": r.header.data_offset, "record_crc": r.has_record_crc, "meta": r.meta,
                   "fields": {f.name: {"dtype": f.to_dict()["dtype"], "shape": list(f.shape), "offset": off}
                              for f, off in zip(r.layout.fields, r.layout.offsets, strict=True)}}
        tables = [("fields", ["name", "dtype", "shape", "offset"],
                   [[f.name, f.to_dict()["dtype"], "x".join(map(str, f.shape)) or "scalar", off]
                    for f, off in zip(r.layout.fields, r.layout.offsets, strict=True)])]
        if verify:
            try:
                r.verify()
            except DataError as e:
                problems.append(str(e))
            summary["verified"] = not problems
    return Report(kind="feature-shard", target=path, summary=summary, tables=tables, ok=not problems,
                  problems=problems)
