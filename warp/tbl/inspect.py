"""``warp inspect`` for .tbl files: header, counts, compression, sizes, extensions.

Contract: :func:`sniff` recognises a TBL file by its magic ``TBL`` (any
version byte, so a wrong version is reported as such rather than "unknown");
:func:`inspect` opens it with :class:`~warpdata.formats.tbl.TblReader`
(which validates header, index CRC and every index entry) and summarises
it; with ``verify`` every payload checksum and every metadata CRC is checked,
each corrupt sample becomes a problem (``warp inspect --verify`` then exits 1),
and a "verified" table says what was checked and whether it passed.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
from warpdata.artifacts.inspect import Report
from warpdata.formats.tbl import (
    F_INDEX_CRC32,
    F_META_CRC32,
    F_PAYLOAD_CRC32,
    FORMATS,
    TblReader,
    entry_codec,
)

# dimension histogram buckets by the longer side
_BUCKETS = (0, 1, 64, 128, 256, 512, 1024, 2048, 4096, 65536)


def sniff(target: str, head: bytes | None, is_dir: bool) -> bool:
    return head is not None and head[:3] == b"TBL"


def inspect(target: str, *, verify: bool = False, head: int = 0) -> Report:
    with TblReader(target, verify=False) as r:
        h = r.header
        idx = r.index
        n = len(r)
        flags, counts = np.unique(idx["flags"], return_counts=True)
        codec_counts: Counter[str] = Counter()
        for f, c in zip(flags.tolist(), counts.tolist(), strict=True):
            codec_counts[entry_codec(f)] += c
        codec_counts = dict(codec_counts)
        fmt_counts = {FORMATS.get(int(k), f"format-{int(k)}"): int(v)
                      for k, v in zip(*np.unique(idx["format"], return_counts=True), strict=True)}
        longer = np.maximum(idx["width"], idx["height"]).astype(np.int64)
        hist = np.histogram(longer, bins=_BUCKETS)[0] if n else np.zeros(len(_BUCKETS) - 1, np.int64)
        stored = int(idx["size"].sum()) if n else 0
        raw = int(idx["usize"].sum()) if n else 0
        summary = {
            "version": 2,
            "samples": n,
            "file_bytes": r.file_size,
            "payload_bytes": stored,
            "uncompressed_bytes": raw,
            "compression": codec_counts,
            "formats": fmt_counts,
            "metadata_bytes": h.metadata_size,
            "flags": h.flags,
            "extensions": h.extensions,
            "turboloader_compatible": not (h.flags & (1 << 5)),
        }
        tables = [("header", ["field", "value"], [
            ["samples", f"{n:,}"], ["file bytes", f"{r.file_size:,}"],
            ["payload bytes", f"{stored:,} ({raw:,} uncompressed)"],
            ["metadata bytes", f"{h.metadata_size:,}"], ["flags", f"{h.flags:#x}"],
            ["extensions", ", ".join(h.extensions) or "none (plain TurboLoader file)"],
            ["compression", ", ".join(f"{k} {v:,}" for k, v in sorted(codec_counts.items())) or "-"],
            ["formats", ", ".join(f"{k} {v:,}" for k, v in sorted(fmt_counts.items())) or "-"],
            ["opens in TurboLoader", "yes" if summary["turboloader_compatible"] else "no (ZSTD entries)"],
        ])]
        rows = []
        for lo, hi, c in zip(_BUCKETS[:-1], _BUCKETS[1:], hist.tolist(), strict=True):
            if c:
                rows.append(["unknown" if lo == 0 else f"{lo}-{hi - 1}", c])
        summary["longer_side_histogram"] = {r_[0]: r_[1] for r_ in rows}
        tables.append(("longer side (px)", ["range", "samples"], rows))
        if head:
            sample_rows = []
            for i in range(min(head, n)):
                info = r.info(i)
                key = None
                try:
                    key = r.key(i)
                except Exception:  # a broken metadata block must not hide the index rows
                    key = "(unreadable metadata)"
                sample_rows.append([i, key or "", info.format, info.width, info.height, info.size,
                                    info.compression])
            tables.append(("samples", ["index", "key", "format", "width", "height", "bytes", "compression"],
                           sample_rows))
        problems: list[str] = []
        if verify:
            found = r.verify_all()
            problems = [p.message for p in found]
            summary["corrupt_samples"] = [{"index": p.index, "offset": p.offset, "check": p.check,
                                           "stored": p.stored, "computed": p.computed} for p in found]
            summary["verified"] = not found
            checks = _verification(r, found)
            summary["verification"] = {c["part"]: c for c in checks}
            rows_v = [[c["part"], c["checked"], "ok" if c["ok"] else f"FAILED ({c['failures']})"] for c in checks]
            rows_v.append(["result", f"{len(found)} problem(s)" if found else "every check passed",
                           "ok" if not found else "FAILED"])
            tables.append(("verified", ["part", "checked", "result"], rows_v))
    return Report(kind="tbl", target=target, summary=summary, tables=tables, ok=not problems,
                  problems=problems)


def _verification(r: TblReader, found) -> list[dict]:
    """What ``verify_all`` checked, part by part, with the number of failures of each."""
    h, n = r.header, len(r)
    by_check = Counter(p.check for p in found)
    out = [{"part": "header", "checked": "magic, version, CRC-32 of the 64 header bytes", "failures": 0}]
    if h.flags & F_INDEX_CRC32:
        out.append({"part": "index", "checked": f"CRC-32 of {n:,} entries; offsets, sizes, overlaps",
                    "failures": 0})
    else:
        out.append({"part": "index", "checked": f"{n:,} entries: offsets, sizes, overlaps (no index CRC "
                    "in this file)", "failures": 0})
    if h.flags & F_PAYLOAD_CRC32:
        what = f"{n:,} payload CRC-32 trailers and CRC-16s after decompression"
    else:
        what = f"{n:,} payload CRC-16s (TurboLoader's, after decompression)"
    out.append({"part": "payloads", "checked": what,
                "failures": by_check["payload-crc32"] + by_check["crc16"] + by_check["decompress"]})
    if not h.metadata_size:
        out.append({"part": "metadata", "checked": "none in this file", "failures": 0})
    elif h.flags & F_META_CRC32:
        out.append({"part": "metadata", "checked": f"section CRC-32 and {h.meta_blocks:,} block CRC-32s",
                    "failures": by_check["metadata-section-crc32"] + by_check["metadata-crc32"]
                    + by_check["metadata"]})
    else:
        out.append({"part": "metadata", "checked": "block structure and JSON parse (no metadata CRCs in "
                    "this file)", "failures": by_check["metadata"] + by_check["metadata-json"]})
    for c in out:
        c["ok"] = not c["failures"]
    return out
