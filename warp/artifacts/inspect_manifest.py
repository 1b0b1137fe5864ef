"""``warp inspect`` for any warp manifest whose kind has no richer inspector."""

from __future__ import annotations

import json
import os

from warpdata.artifacts.inspect import Report
from warpdata.artifacts.manifests import MANIFEST_NAME, read_manifest


def sniff(target: str, head: bytes | None, is_dir: bool) -> bool:
    if is_dir:
        return os.path.isfile(os.path.join(target, MANIFEST_NAME))
    if head is None:
        return False
    stripped = head.lstrip()
    if not stripped.startswith(b"{"):
        return False
    return b'"kind"' in head


def inspect(target: str, *, verify: bool = False, head: int = 0) -> Report:
    m = read_manifest(target)
    summary = {k: v for k, v in m.items() if isinstance(v, (str, int, float, bool)) or v is None}
    counts = {k: len(v) for k, v in m.items() if isinstance(v, (list, dict))}
    summary["sections"] = counts
    rows = [[k, json.dumps(v)[:80]] for k, v in sorted(summary.items()) if k != "sections"]
    rows += [[k, f"{n} entries"] for k, n in sorted(counts.items())]
    return Report(kind=str(m["kind"]), target=target, summary=summary,
                  tables=[("manifest", ["field", "value"], rows)])
