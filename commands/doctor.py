"""Check the installation, optional backends, cache and store.

Each check prints PASS, WARN, FAIL or SKIP with what it found and the command
or setting that fixes it. Exit status 1 when any check FAILs.
"""

from __future__ import annotations

from typing import Annotated

import typer
from warpdata.cli import output as out

EXAMPLES = """
  warp doctor                      # human-readable report
  warp doctor --json | jq '.checks[] | select(.status == "FAIL")'
  warp doctor --only store         # only the store checks
  WARP_STORE=s3://bucket/warp warp doctor
"""


def main(
    only: Annotated[list[str] | None, typer.Option("--only", help="Run only checks in these groups (repeatable).")] = None,
) -> int:
    from warpdata.core.errors import UsageError
    from warpdata.doctor.registry import FAIL, WARN, all_checks, run_check

    everything = all_checks()
    groups = list(dict.fromkeys(c.group for c in everything))
    unknown = [g for g in only or [] if g not in groups]
    if unknown:
        raise UsageError(f"--only {unknown[0]!r} is not a check group", hint=f"groups: {', '.join(groups)}")
    checks = [c for c in everything if not only or c.group in only]
    results = []
    for c in checks:
        r = run_check(c)
        results.append((c, r))
        out.detail(f"{c.group}/{c.name}: {r.status}")
    failed = sum(r.status == FAIL for _, r in results)
    warned = sum(r.status == WARN for _, r in results)
    if out.options().json:
        out.emit_json({
            "ok": failed == 0,
            "failed": failed,
            "warnings": warned,
            "checks": [{"name": c.name, "group": c.group, "status": r.status, "detail": r.detail,
                        "remedy": r.remedy, **({"facts": r.facts} if r.facts else {})} for c, r in results],
        })
    else:
        rows = [[r.status, f"{c.group}/{c.name}", r.detail, r.remedy or ""] for c, r in results]
        out.table(None, ["status", "check", "found", "fix"], rows)
        out.info(f"{len(results)} checks: {failed} failed, {warned} warnings")
    return 1 if failed else 0
