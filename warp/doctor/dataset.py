"""``warp doctor ws/name``: can this dataset be read from here, and what is slow?

Four checks, each a :class:`~warpdata.checks.registry.CheckResult` like the system checks:

``resolve``    the dataset resolves (registered in place, or the store's ``latest`` pointer)
``manifest``   its manifest verifies: fetched again (not from any cache) and checked against
               the schema and its version hash; a registered dataset's table files against
               their registered hashes
``stream``     the first ``rows`` rows of a table stream (prefetch off: what is measured is the
               read path, not background downloads)
``refs``       ``refs`` members named by the first bound column read back (SKIP without a
               binding)

Each phase's time, requests, retries and bytes are measured on the dataset's own request
counter (:class:`~warpdata.storage.remote.RequestStats`), giving rows/s, refs/s, requests per
1,000 rows and bytes fetched; :func:`slowest` names the phase that took longest and why
(throttling, per-request latency, or bytes). A failed phase FAILs its check and SKIPs the
ones that need it. Nothing here prints.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from warpdata.checks.registry import FAIL, PASS, SKIP, WARN, CheckResult
from warpdata.core.errors import DatasetNotFoundError
from warpdata.core.sizes import format_size
from warpdata.read.dataset import dataset
from warpdata.registry.manifest import Manifest
from warpdata.registry.store import Store

DEFAULT_ROWS = 10_000
DEFAULT_REFS = 32
SLOW_REQUEST_S = 0.2  # a mean request latency above this is called out


@dataclass
class Phase:
    name: str
    seconds: float = 0.0
    requests: int = 0
    bytes: int = 0
    retries: int = 0
    throttled: int = 0
    backoff_seconds: float = 0.0
    items: int = 0  # rows or refs

    def to_dict(self) -> dict[str, Any]:
        return {k: (round(v, 4) if isinstance(v, float) else v) for k, v in self.__dict__.items()}


@dataclass
class DatasetReport:
    dataset: str
    checks: list[tuple[str, CheckResult]] = field(default_factory=list)
    phases: list[Phase] = field(default_factory=list)
    version: str | None = None
    store: str | None = None
    mode: str | None = None
    table: str | None = None

    @property
    def failed(self) -> int:
        return sum(r.status == FAIL for _, r in self.checks)

    @property
    def warnings(self) -> int:
        return sum(r.status == WARN for _, r in self.checks)

    def metrics(self) -> dict[str, Any]:
        by = {p.name: p for p in self.phases}
        out: dict[str, Any] = {
            "requests": sum(p.requests for p in self.phases), "bytes_fetched": sum(p.bytes for p in self.phases),
            "retries": sum(p.retries for p in self.phases), "throttled": sum(p.throttled for p in self.phases),
        }
        s = by.get("stream")
        if s is not None and s.items:
            out["rows"] = s.items
            out["rows_per_s"] = round(s.items / s.seconds, 1) if s.seconds > 0 else None
            out["requests_per_1k_rows"] = round(1000 * s.requests / s.items, 2)
        r = by.get("refs")
        if r is not None and r.items:
            out["refs"] = r.items
            out["refs_per_s"] = round(r.items / r.seconds, 1) if r.seconds > 0 else None
            out["requests_per_ref"] = round(r.requests / r.items, 2)
        return out

    def to_dict(self) -> dict[str, Any]:
        return {"dataset": self.dataset, "version": self.version, "store": self.store, "mode": self.mode,
                "table": self.table, "ok": self.failed == 0, "failed": self.failed, "warnings": self.warnings,
                "checks": [{"name": n, "group": "dataset", "status": r.status, "detail": r.detail, "remedy": r.remedy,
                            **({"facts": r.facts} if r.facts else {})} for n, r in self.checks],
                "phases": [p.to_dict() for p in self.phases], "metrics": self.metrics(),
                "slowest": slowest(self.phases)}


class _Meter:
    """Times one phase and takes its share of the dataset's request counter."""

    def __init__(self, report: DatasetReport, name: str, stats) -> None:
        self.report, self.phase, self.stats = report, Phase(name), stats

    def __enter__(self) -> Phase:
        self.before = self.stats.snapshot() if self.stats is not None else None
        self.t0 = time.perf_counter()
        return self.phase

    def __exit__(self, *exc: object) -> None:
        p = self.phase
        p.seconds = time.perf_counter() - self.t0
        if self.before is not None:
            d = self.stats.since(self.before)
            p.requests, p.bytes, p.retries = d["requests"], d["bytes"], d["retries"]
            p.throttled, p.backoff_seconds = d["throttled"], d["backoff_seconds"]
        self.report.phases.append(p)


def _failure(e: Exception) -> CheckResult:
    return CheckResult(FAIL, getattr(e, "message", None) or f"{type(e).__name__}: {e}",
                       getattr(e, "hint", None) or "rerun with --debug for a traceback",
                       facts={"error": getattr(e, "code", type(e).__name__),
                              **({"exit_code": int(e.exit_code)} if hasattr(e, "exit_code") else {})})


def _traffic(p: Phase) -> str:
    if not p.requests:
        return "no requests (local files or cache)"
    text = f"{p.requests} request(s), {format_size(p.bytes)}"
    if p.retries:
        text += f", {p.retries} retried ({p.throttled} throttled, {p.backoff_seconds:.2f}s backing off)"
    return text


def check_dataset(name: str, *, table: str | None = None, rows: int = DEFAULT_ROWS, refs: int = DEFAULT_REFS,
                  mode: str | None = "remote", version: str | None = None, store: str | None = None) -> DatasetReport:
    """Run the four checks (module docstring) against ``name``."""
    import pyarrow.parquet  # noqa: F401  (imported before the clocks start: they measure reads, not imports)

    report = DatasetReport(name)
    ds = None
    with _Meter(report, "resolve", None) as ph:
        try:
            ds = dataset(name, mode=mode, version=version, store=store)
        except Exception as e:
            report.checks.append(("resolve", _failure(e)))
    if ds is None:
        for n in ("manifest", "stream", "refs"):
            report.checks.append((n, CheckResult(SKIP, "not run: the dataset did not resolve",
                                                 "fix the 'resolve' check first")))
        return report
    stats = ds.stats
    opened = stats.to_dict()
    ph.requests, ph.bytes, ph.retries = opened["requests"], opened["bytes"], opened["retries"]
    ph.throttled, ph.backoff_seconds = opened["throttled"], opened["backoff_seconds"]
    report.version, report.store, report.mode = ds.version, ds.remote.url, ds.mode
    registered = bool(getattr(ds, "registered", False))
    where = f"registered in place ({ds.remote.url.removeprefix('registered:')})" if registered else \
        f"from store {ds.remote.url}"
    report.checks.append(("resolve", CheckResult(
        PASS, f"{ds.id} -> version {ds.version[:12]}, {where}, in {ph.seconds * 1000:.0f} ms; {_traffic(ph)}",
        facts={"version": ds.version, "store": ds.remote.url, "mode": ds.mode, "registered": registered})))

    detail = None
    with _Meter(report, "manifest", stats) as ph:
        try:
            detail = _verify_manifest(ds, registered)
        except Exception as e:
            res = _failure(e)
    if detail is not None:
        res = CheckResult(PASS, f"{detail}; in {ph.seconds * 1000:.0f} ms, {_traffic(ph)}")
    report.checks.append(("manifest", res))
    if res.status == FAIL:
        for n in ("stream", "refs"):
            report.checks.append((n, CheckResult(SKIP, "not run: the manifest did not verify",
                                                 "fix the 'manifest' check first")))
        return report

    try:
        t = ds.table(table)
    except Exception as e:
        report.checks.append(("stream", _failure(e)))
        report.checks.append(("refs", CheckResult(SKIP, "not run: no table to read", "fix the 'stream' check first")))
        return report
    report.table = t.name
    members: list[str] = []
    bound = next(iter(sorted(t.bindings.items())), None)
    with _Meter(report, "stream", stats) as ph:
        first = None
        try:
            started = time.perf_counter()
            for b in t.batches(batch_size=max(1, min(rows, 8192)), limit=rows, prefetch="off"):
                if first is None:
                    first = time.perf_counter() - started
                ph.items += b.num_rows
                if bound is not None and len(members) < refs:
                    col = b.column(bound[0]).to_pylist() if bound[0] in b.schema.names else []
                    members += [m for m in col if m is not None][:refs - len(members)]
            cols = len(t.schema_names())
            stream_res: CheckResult | None = None
        except Exception as e:
            stream_res = _failure(e)
    if stream_res is None:
        rate = ph.items / ph.seconds if ph.seconds > 0 else 0.0
        per_k = 1000 * ph.requests / ph.items if ph.items else 0.0
        status = PASS if ph.items else WARN
        stream_res = CheckResult(
            status, f"{ph.items} row(s) of {t.name} ({cols} columns) in {ph.seconds:.2f}s: {rate:,.0f} rows/s "
                    f"(first batch {1000 * (first or 0):.0f} ms), {per_k:.1f} requests per 1k rows; {_traffic(ph)}",
            None if ph.items else f"table {t.name} is empty",
            facts={"rows": ph.items, "rows_per_s": round(rate, 1), "requests_per_1k_rows": round(per_k, 2),
                   "first_batch_ms": round(1000 * (first or 0), 1)})
    report.checks.append(("stream", stream_res))

    if bound is None:
        report.checks.append(("refs", CheckResult(SKIP, f"table {t.name} has no column bound to an artifact")))
    elif stream_res.status == FAIL:
        report.checks.append(("refs", CheckResult(SKIP, "not run: the table did not stream",
                                                  "fix the 'stream' check first")))
    elif not members:
        report.checks.append(("refs", CheckResult(WARN, f"column {bound[0]} holds no member in the rows read",
                                                  "check the column's values")))
    else:
        report.checks.append(("refs", _read_refs(report, ds, stats, t.name, bound, members)))

    why = slowest(report.phases)
    retried = sum(p.retries for p in report.phases)
    report.checks.append(("slowest", CheckResult(
        WARN if retried else PASS, why or "nothing measured",
        f"the store throttled or failed {retried} request(s), retried with back-off: read with fewer "
        "concurrent readers, or raise WARP_RETRY_BUDGET if reads fail" if retried else None,
        facts={"phases": {p.name: round(p.seconds, 4) for p in report.phases}})))
    return report


def _read_refs(report: DatasetReport, ds, stats, table: str, bound, members: list[str]) -> CheckResult:
    """The 'refs' check: read ``members`` through the artifact bound to ``bound``'s column, timed."""
    column, binding = bound
    with _Meter(report, "refs", stats) as ph:
        try:
            reader = ds.artifact(binding.artifact)
            for m in members:
                reader.read(m)
                ph.items += 1
            refs_res = None
        except Exception as e:
            refs_res = _failure(e)
    if refs_res is None:
        rate = ph.items / ph.seconds if ph.seconds > 0 else 0.0
        refs_res = CheckResult(PASS, f"{ph.items} member(s) of {binding.artifact} via {table}.{column} in "
                                     f"{ph.seconds:.2f}s: {rate:,.0f} refs/s; {_traffic(ph)}",
                               facts={"refs": ph.items, "refs_per_s": round(rate, 1)})
    return refs_res


def _verify_manifest(ds, registered: bool) -> str:
    m = ds.manifest
    if registered:
        for t in m.tables.values():
            for s in t.shards:
                ds.cached_path(s)  # stamp, or a full hash when the file moved
        what = "table files match their registered hashes"
    else:
        key = Store.manifest_key(ds.id, ds.version)
        raw = ds.remote.get(key)
        if raw is None:
            raise DatasetNotFoundError(f"{ds.remote.url_of(key)} is missing from the store",
                                       hint="the version was published incompletely; republish it")
        Manifest.from_bytes(raw, source=ds.remote.url_of(key), expected_hash=ds.version)
        what = f"manifest {ds.version[:12]} verifies (schema, hash)"
    return (f"{what}: {len(m.tables)} table(s), {len(m.artifacts)} artifact(s), "
            f"{m.stats.get('total_rows', 0)} rows, {format_size(m.stats.get('total_bytes', 0))}")


def slowest(phases: list[Phase]) -> str | None:
    """The phase that took longest, and why: throttling, request latency or bytes."""
    timed = [p for p in phases if p.seconds > 0]
    if not timed:
        return None
    total = sum(p.seconds for p in timed)
    p = max(timed, key=lambda x: x.seconds)
    head = f"slowest: {p.name}, {p.seconds:.2f}s of {total:.2f}s"
    if p.backoff_seconds and p.backoff_seconds >= 0.25 * p.seconds:
        return f"{head}: the store throttled it ({p.throttled} throttled answer(s), {p.backoff_seconds:.2f}s backing off)"
    if p.requests:
        per = (p.seconds - p.backoff_seconds) / p.requests
        rate = p.bytes / p.seconds if p.seconds > 0 else 0
        if per >= SLOW_REQUEST_S:
            return f"{head}: store latency, {p.requests} request(s) at {per * 1000:.0f} ms each"
        return (f"{head}: {p.requests} request(s) at {per * 1000:.0f} ms each, {format_size(p.bytes)} "
                f"at {format_size(rate)}/s")
    return f"{head}: local work (no requests)"
