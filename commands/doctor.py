"""Check the installation, backends, cache and store, or one dataset, and say how to fix what fails.

Each check prints PASS, WARN, FAIL or SKIP with what it found and the command
or setting that fixes it. Exit status 1 when any check FAILs.

With WS/NAME, checks that dataset instead: it resolves (registered in place, or
the store's latest pointer), its manifest verifies (fetched again, schema and
hash), the first --rows rows of a table stream, and --refs members named by a
bound column read back. It reports rows/s, refs/s, requests per 1,000 rows and
bytes fetched, and names the slowest part (throttling, request latency or
bytes). The default --mode remote measures the store itself, not the cache.

With --states FILE (repeatable; each a JSON state or a list of them), checks the
final resume states of every rank of a training run against ``warp order``: one
run, the artifact's content, the order digest, and that the combined digest is
the epoch's set digest (every sample yielded exactly once over all restarts).
TARGET may then also be a local artifact path (a .tbl file, a warehouse or
feature-cache directory).
"""

from __future__ import annotations

from typing import Annotated

import typer
from warpdata.cli import output as out
from warpdata.cli.options import StoreOption

EXAMPLES = """
  warp doctor                      # human-readable report
  warp doctor --json | jq '.checks[] | select(.status == "FAIL")'
  warp doctor --only store         # only the store checks
  WARP_STORE=s3://bucket/warp warp doctor
  warp doctor vision/coco-mini     # can this dataset be read from here, and what is slow?
  warp doctor vision/coco-mini --rows 50000 --refs 100 --json | jq .metrics
  warp doctor vision/coco-mini --states states/epoch3.json   # did every rank read every sample once?
"""


def render(results, title: str | None = None) -> tuple[int, int]:
    """The PASS/WARN/FAIL/SKIP table of ``(group, name, CheckResult)`` rows; (failed, warned)."""
    from warpdata.checks.registry import FAIL, WARN

    failed = sum(r.status == FAIL for _, _, r in results)
    warned = sum(r.status == WARN for _, _, r in results)
    rows = [[r.status, f"{g}/{n}", r.detail, r.remedy or ""] for g, n, r in results]
    if any(row[3] for row in rows):
        out.table(title, ["status", "check", "found", "fix"], rows)
    else:  # nothing to fix: no empty column pushed past the widest finding
        out.table(title, ["status", "check", "found"], [row[:3] for row in rows])
    return failed, warned


def main(
    dataset: Annotated[str | None, typer.Argument(
        help="Check one dataset, WORKSPACE/NAME, instead of the installation.", metavar="[WS/NAME]")] = None,
    only: Annotated[list[str] | None, typer.Option("--only", help="Run only checks in these groups (repeatable).")] = None,
    table: Annotated[str | None, typer.Option("--table", help="WS/NAME: table to stream (default: the only table, else main).")] = None,
    rows: Annotated[int, typer.Option("--rows", min=1, help="WS/NAME: rows to stream.")] = 10_000,
    refs: Annotated[int, typer.Option("--refs", min=0, help="WS/NAME: members to read through a bound column.")] = 32,
    mode: Annotated[str, typer.Option("--mode", metavar="auto|remote|hybrid|local",
                                      help="WS/NAME: read mode (remote measures the store, not the cache).")] = "remote",
    version: Annotated[str | None, typer.Option("--version", help="WS/NAME: a version hash (default: latest).")] = None,
    states: Annotated[list[str] | None, typer.Option(
        "--states", metavar="FILE",
        help="WS/NAME or artifact path: check these saved final resume states (JSON; repeatable) against "
             "'warp order'.")] = None,
    store: StoreOption = None,
) -> int:
    from warpdata.core.errors import UsageError

    if states:
        if dataset is None:
            raise UsageError("--states needs the dataset or artifact the states were saved for",
                             hint="warp doctor WS/NAME --states rank0.json --states rank1.json")
        return _states(dataset, states, version, store)

    if dataset is not None:
        if only:
            raise UsageError("--only selects system checks; it does not apply with WS/NAME",
                             hint=f"warp doctor {dataset}  (or: warp doctor --only store)")
        return _dataset(dataset, table, rows, refs, mode, version, store)
    from warpdata.checks.registry import all_checks, run_check

    everything = all_checks()
    groups = list(dict.fromkeys(c.group for c in everything))
    unknown = [g for g in only or [] if g not in groups]
    if unknown:
        raise UsageError(f"--only {unknown[0]!r} is not a check group", hint=f"groups: {', '.join(groups)}")
    checks = [c for c in everything if not only or c.group in only]
    results = []
    for c in checks:
        r = run_check(c)
        results.append((c.group, c.name, r))
        out.detail(f"{c.group}/{c.name}: {r.status}")
    if out.options().json:
        from warpdata.checks.registry import FAIL, WARN

        failed = sum(r.status == FAIL for _, _, r in results)
        out.emit_json({
            "ok": failed == 0,
            "failed": failed,
            "warnings": sum(r.status == WARN for _, _, r in results),
            "checks": [{"name": n, "group": g, "status": r.status, "detail": r.detail,
                        "remedy": r.remedy, **({"facts": r.facts} if r.facts else {})} for g, n, r in results],
        })
    else:
        failed, warned = render(results)
        out.info(f"{len(results)} checks: {failed} failed, {warned} warnings")
    return 1 if failed else 0


def _states(target: str, files: list[str], version: str | None, store: str | None) -> int:
    from warpdata.checks.registry import FAIL
    from warpdata.doctor.states import check_states

    results = check_states(target, files, version=version, store=store)
    failed = sum(r.status == FAIL for _, r in results)
    if out.options().json:
        out.emit_json({"ok": failed == 0, "failed": failed, "target": target,
                       "checks": [{"name": n, "group": "states", "status": r.status, "detail": r.detail,
                                   "remedy": r.remedy, **({"facts": r.facts} if r.facts else {})}
                                  for n, r in results]})
    else:
        failed, warned = render([("states", n, r) for n, r in results])
        out.info(f"{len(results)} checks: {failed} failed, {warned} warnings")
    return 1 if failed else 0


def _dataset(name: str, table: str | None, rows: int, refs: int, mode: str, version: str | None,
             store: str | None) -> int:
    from warpdata.core.sizes import format_size
    from warpdata.doctor.dataset import check_dataset

    report = check_dataset(name, table=table, rows=rows, refs=refs, mode=mode, version=version, store=store)
    if out.options().json:
        out.emit_json(report.to_dict())
        return 1 if report.failed else 0
    failed, warned = render([("dataset", n, r) for n, r in report.checks])
    m = report.metrics()
    parts = []
    if "rows_per_s" in m:
        parts.append(f"{m['rows_per_s']:,.0f} rows/s, {m['requests_per_1k_rows']} requests per 1k rows")
    if "refs_per_s" in m:
        parts.append(f"{m['refs_per_s']:,.0f} refs/s")
    parts.append(f"{m['requests']} request(s), {format_size(m['bytes_fetched'])} fetched")
    if m["retries"]:
        parts.append(f"{m['retries']} retried ({m['throttled']} throttled)")
    out.info(f"{name}: {'; '.join(parts)}")
    out.info(f"{len(report.checks)} checks: {failed} failed, {warned} warnings")
    return 1 if failed else 0
