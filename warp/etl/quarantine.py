"""Validation bookkeeping: quarantined samples, summaries and thresholds.

Every pipeline that validates input (the tensor warehouse, the feature cache)
records its verdict per sample in a :class:`Quarantine`:

* ``accept(run, sample_id, empty=..., keep=...)`` for a valid sample
  (``empty``: it carries no labels/boxes/caption; ``keep=False``: a valid
  sample dropped by policy, e.g. ``skip_empty``);
* ``reject(run, sample_id, source, reason, message)`` for a quarantined one,
  with a reason code from :data:`REASONS` (pipelines register their own
  codes with :func:`register_reason`).

Each reason code belongs to one category, ``missing`` (the source is absent
or unreadable) or ``invalid`` (present but wrong). Summaries are kept per run
(a split, a source directory, a label file) and in aggregate, each with
``total``, ``non_empty``, ``empty``, ``missing``, ``invalid``, ``kept``,
``skipped`` and counts per reason; ``total = non_empty + empty + missing +
invalid``. A sample id may be rejected for one reason only: the first reason
recorded wins (later ones are counted under ``also`` in the record).

:class:`Thresholds` holds limits on ``invalid_fraction``, ``missing_fraction``
and ``empty_fraction`` (fractions of ``total``), each with an optional
``warn`` and ``fail`` level. :meth:`Quarantine.evaluate` checks the aggregate
and every run and returns a :class:`Verdict` (``ok``/``warn``/``fail``) with
the worst offenders (reason codes by count, with example samples);
:meth:`Verdict.raise_for_status` raises :class:`~warpdata.core.errors.DataError`
(exit 65) on ``fail`` unless ``allow_invalid``. Everything is JSON-able via
``to_dict``/``from_dict``; output is deterministic (sorted keys, records in
recording order).
"""

from __future__ import annotations

import contextlib
import contextvars
import math
import os
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from warpdata.core.atomic import atomic_file
from warpdata.core.errors import ConfigError, DataError

CATEGORIES = ("missing", "invalid")
METRICS = ("invalid_fraction", "missing_fraction", "empty_fraction")
STATUSES = ("ok", "warn", "fail")
EXAMPLES_PER_REASON = 3


@dataclass(frozen=True)
class Reason:
    code: str
    category: str  # "missing" | "invalid"
    help: str


REASONS: dict[str, Reason] = {}


def register_reason(code: str, category: str, help: str) -> Reason:
    """Register (or re-register identically) a reason code; returns it."""
    if category not in CATEGORIES:
        raise ValueError(f"reason {code!r}: category must be one of {CATEGORIES}, got {category!r}")
    r = Reason(code, category, help)
    old = REASONS.get(code)
    if old is not None and old != r:
        raise ValueError(f"reason code {code!r} is already registered as {old}")
    REASONS[code] = r
    return r


# Codes shared by every pipeline; pipelines add their own beside these.
for _code, _cat, _help in (
    ("missing-file", "missing", "the source file named by the labels does not exist"),
    ("unreadable", "missing", "the source file exists but cannot be read (permissions, I/O error)"),
    ("decode-error", "invalid", "the file is not a decodable image/media file"),
    ("truncated", "invalid", "the file ends early (truncated download or copy)"),
    ("bad-schema", "invalid", "the label record does not match the expected schema"),
    ("non-finite", "invalid", "a number in the labels is NaN or infinite"),
    ("box-out-of-bounds", "invalid", "a box lies outside the image beyond the tolerance"),
    ("box-degenerate", "invalid", "a box has zero or negative width or height"),
    ("unknown-class", "invalid", "a label names a class id that the category list lacks"),
    ("duplicate", "invalid", "the same sample appears more than once"),
    ("orphan-label", "invalid", "a label refers to an image that is not listed"),
    ("too-many-boxes", "invalid", "more boxes than max_boxes with overflow = \"reject\""),
    ("bad-size", "invalid", "the image size in the labels differs from the decoded image"),
    ("empty-content", "invalid", "the sample's payload (text, caption, media) is empty"),
    # confinement and size caps (docs/formats/twh1.md; README "warp etl", "warp ingest")
    ("path-outside-root", "invalid", "the path leaves the dataset root (absolute, '..' or a symlink leading out)"),
    ("not-regular-file", "invalid", "the entry is a directory link, FIFO, socket or device, not a regular file"),
    ("too-large", "invalid", "the file is larger than the size cap ([limits] for etl, --max-file-size for "
                             "ingest); it was not read"),
):
    register_reason(_code, _cat, _help)


def reason(code: str) -> Reason:
    try:
        return REASONS[code]
    except KeyError:
        raise ValueError(f"unknown quarantine reason code {code!r}; register it with "
                         "warpdata.etl.quarantine.register_reason") from None


@dataclass(frozen=True)
class QuarantineRecord:
    run: str
    sample_id: str
    source: str
    reason: str
    message: str

    def to_dict(self) -> dict[str, str]:
        return {"run": self.run, "sample_id": self.sample_id, "source": self.source,
                "reason": self.reason, "message": self.message}


@dataclass
class RunSummary:
    """Counts for one run (or the aggregate)."""

    total: int = 0
    non_empty: int = 0
    empty: int = 0
    missing: int = 0
    invalid: int = 0
    kept: int = 0
    skipped: int = 0
    by_reason: dict[str, int] = field(default_factory=dict)

    def fraction(self, metric: str) -> float:
        num = {"invalid_fraction": self.invalid, "missing_fraction": self.missing,
               "empty_fraction": self.empty}[metric]
        return num / self.total if self.total else 0.0

    def add(self, other: RunSummary) -> None:
        for k in ("total", "non_empty", "empty", "missing", "invalid", "kept", "skipped"):
            setattr(self, k, getattr(self, k) + getattr(other, k))
        for k, v in other.by_reason.items():
            self.by_reason[k] = self.by_reason.get(k, 0) + v

    def to_dict(self) -> dict[str, Any]:
        return {"total": self.total, "non_empty": self.non_empty, "empty": self.empty,
                "missing": self.missing, "invalid": self.invalid, "kept": self.kept,
                "skipped": self.skipped, "by_reason": dict(sorted(self.by_reason.items()))}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> RunSummary:
        return cls(**{k: int(d.get(k, 0)) for k in ("total", "non_empty", "empty", "missing",
                                                      "invalid", "kept", "skipped")},
                   by_reason={str(k): int(v) for k, v in d.get("by_reason", {}).items()})


@dataclass(frozen=True)
class Threshold:
    """Limit on one fraction: above ``warn`` warns, above ``fail`` fails (None: no limit)."""

    warn: float | None = None
    fail: float | None = None

    def __post_init__(self) -> None:
        for name in ("warn", "fail"):
            v = getattr(self, name)
            if v is not None and not (isinstance(v, (int, float)) and math.isfinite(v) and 0 <= v <= 1):
                raise ConfigError(f"threshold {name}={v!r} must be a fraction between 0 and 1",
                                  hint="e.g. warn = 0.01, fail = 0.05")
        if self.warn is not None and self.fail is not None and self.warn > self.fail:
            raise ConfigError(f"threshold warn={self.warn} is above fail={self.fail}",
                              hint="warn must be <= fail")

    def status(self, value: float) -> str:
        if self.fail is not None and value > self.fail:
            return "fail"
        if self.warn is not None and value > self.warn:
            return "warn"
        return "ok"

    def to_dict(self) -> dict[str, float | None]:
        return {"warn": self.warn, "fail": self.fail}


@dataclass(frozen=True)
class Thresholds:
    """Limits per metric; ``max_<metric>`` in config terms."""

    max_invalid_fraction: Threshold = Threshold(warn=0.0, fail=0.05)
    max_missing_fraction: Threshold = Threshold(warn=0.0, fail=0.05)
    max_empty_fraction: Threshold = Threshold()

    def items(self) -> list[tuple[str, Threshold]]:
        return [("invalid_fraction", self.max_invalid_fraction),
                ("missing_fraction", self.max_missing_fraction),
                ("empty_fraction", self.max_empty_fraction)]

    def to_dict(self) -> dict[str, dict[str, float | None]]:
        return {f"max_{m}": t.to_dict() for m, t in self.items()}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Thresholds:
        """From ``{"max_invalid_fraction": {"warn": .., "fail": ..}, ...}`` (missing keys: defaults)."""
        known = {f"max_{m}" for m in METRICS}
        unknown = set(d) - known
        if unknown:
            raise ConfigError(f"unknown threshold(s): {', '.join(sorted(unknown))}",
                              hint="known: " + ", ".join(sorted(known)))
        kwargs = {}
        for k, v in d.items():
            if isinstance(v, Threshold):
                kwargs[k] = v
            elif isinstance(v, Mapping):
                extra = set(v) - {"warn", "fail"}
                if extra:
                    raise ConfigError(f"threshold {k}: unknown key(s) {', '.join(sorted(extra))}",
                                      hint="a threshold has only 'warn' and 'fail'")
                kwargs[k] = Threshold(warn=v.get("warn"), fail=v.get("fail"))
            else:
                raise ConfigError(f"threshold {k} must be a table with warn/fail, got {v!r}")
        return cls(**kwargs)


@dataclass
class Check:
    scope: str  # "aggregate" or "run:<name>"
    metric: str
    value: float
    warn: float | None
    fail: float | None
    status: str

    def to_dict(self) -> dict[str, Any]:
        return {"scope": self.scope, "metric": self.metric, "value": self.value,
                "warn": self.warn, "fail": self.fail, "status": self.status}


def describe_check(c: Check | Mapping[str, Any]) -> str:
    """The one wording of a threshold check, for every pipeline's messages, logs and manifests:
    ``aggregate: invalid_fraction = 0.1667 exceeds fail limit 0.05``. Takes a :class:`Check` or
    its ``to_dict()`` (a manifest's verdict)."""
    d = c.to_dict() if isinstance(c, Check) else c
    limit = d["fail"] if d["status"] == "fail" else d["warn"]
    return f"{d['scope']}: {d['metric']} = {d['value']:.4f} exceeds {d['status']} limit {limit}"


@dataclass
class Verdict:
    status: str  # ok | warn | fail
    checks: list[Check]
    worst_offenders: list[dict[str, Any]]  # [{reason, category, count, examples:[...]}]
    allowed: bool = False  # fail overridden by allow_invalid

    def to_dict(self) -> dict[str, Any]:
        return {"status": self.status, "allowed": self.allowed,
                "checks": [c.to_dict() for c in self.checks],
                "worst_offenders": self.worst_offenders}

    def problems(self) -> list[str]:
        """One line per check that is not ok (:func:`describe_check`)."""
        return [describe_check(c) for c in self.checks if c.status != "ok"]

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Verdict:
        """A verdict as a manifest stores it (``to_dict()``)."""
        return cls(d["status"], [Check(**c) for c in d.get("checks", [])], list(d.get("worst_offenders", [])),
                   bool(d.get("allowed", False)))

    def offenders_text(self, limit: int = 5) -> str:
        parts = []
        for o in self.worst_offenders[:limit]:
            ex = ", ".join(e["sample_id"] for e in o["examples"])
            parts.append(f"{o['reason']} x{o['count']} (e.g. {ex})")
        return "; ".join(parts)

    def raise_for_status(self, *, allow_invalid: bool = False, what: str = "input") -> None:
        if self.status != "fail":
            return
        if allow_invalid:
            self.allowed = True
            return
        worst = self.offenders_text()
        raise DataError(f"{what} failed validation: " + "; ".join(self.problems())
                        + (f". Worst offenders: {worst}" if worst else ""),
                        hint="fix or remove the listed samples, raise the thresholds, "
                             "or pass --allow-invalid to build anyway",
                        verdict=self.to_dict())


class Quarantine:
    """Records per-sample validation outcomes for one or more runs."""

    def __init__(self) -> None:
        self._runs: dict[str, RunSummary] = {}
        self._records: list[QuarantineRecord] = []
        self._rejected: dict[tuple[str, str], int] = {}  # (run, sample_id) -> record index
        self._also: dict[int, list[str]] = {}
        self._examples: dict[str, list[dict[str, str]]] = {}

    def _run(self, run: str) -> RunSummary:
        s = self._runs.get(run)
        if s is None:
            s = self._runs[run] = RunSummary()
        return s

    def accept(self, run: str, sample_id: str, *, empty: bool = False, keep: bool = True) -> None:
        s = self._run(run)
        s.total += 1
        if empty:
            s.empty += 1
        else:
            s.non_empty += 1
        if keep:
            s.kept += 1
        else:
            s.skipped += 1

    def reject(self, run: str, sample_id: str, source: str, code: str, message: str) -> bool:
        """Quarantine a sample; returns False if it was already rejected (counted once)."""
        source = _named_source(source)
        r = reason(code)
        key = (run, sample_id)
        if key in self._rejected:
            self._also.setdefault(self._rejected[key], []).append(code)
            return False
        s = self._run(run)
        s.total += 1
        if r.category == "missing":
            s.missing += 1
        else:
            s.invalid += 1
        s.by_reason[code] = s.by_reason.get(code, 0) + 1
        self._rejected[key] = len(self._records)
        self._records.append(QuarantineRecord(run, sample_id, source, code, message))
        ex = self._examples.setdefault(code, [])
        if len(ex) < EXAMPLES_PER_REASON:
            ex.append({"run": run, "sample_id": sample_id, "source": source, "message": message})
        return True

    def is_rejected(self, run: str, sample_id: str) -> bool:
        return (run, sample_id) in self._rejected

    def merge(self, other: Quarantine) -> None:
        """Fold another recorder in (e.g. from a worker process)."""
        for run, s in other._runs.items():
            self._run(run).add(s)
        for i, rec in enumerate(other._records):
            key = (rec.run, rec.sample_id)
            if key in self._rejected:
                continue
            self._rejected[key] = len(self._records)
            self._records.append(rec)
            if i in other._also:
                self._also[self._rejected[key]] = list(other._also[i])
            ex = self._examples.setdefault(rec.reason, [])
            if len(ex) < EXAMPLES_PER_REASON:
                ex.append({"run": rec.run, "sample_id": rec.sample_id, "source": rec.source,
                           "message": rec.message})

    @property
    def records(self) -> list[QuarantineRecord]:
        return list(self._records)

    def runs(self) -> dict[str, RunSummary]:
        return dict(sorted(self._runs.items()))

    def aggregate(self) -> RunSummary:
        agg = RunSummary()
        for s in self._runs.values():
            agg.add(s)
        return agg

    def summary(self) -> dict[str, Any]:
        """``{"runs": {name: counts}, "aggregate": counts}``."""
        return {"runs": {k: v.to_dict() for k, v in self.runs().items()},
                "aggregate": self.aggregate().to_dict()}

    def record_dicts(self) -> list[dict[str, Any]]:
        out = []
        for i, rec in enumerate(self._records):
            d = rec.to_dict()
            if i in self._also:
                d["also"] = list(self._also[i])
            out.append(d)
        return out

    def evaluate(self, thresholds: Thresholds) -> Verdict:
        scopes: list[tuple[str, RunSummary]] = [("aggregate", self.aggregate())]
        if len(self._runs) > 1:
            scopes += [(f"run:{k}", v) for k, v in self.runs().items()]
        return evaluate_summaries(scopes, thresholds, self._examples)

    def to_dict(self) -> dict[str, Any]:
        return {**self.summary(), "records": self.record_dicts()}

    def write_parquet(self, directory: str | os.PathLike) -> dict[str, str]:
        """The queryable export beside an artifact: ``summary.parquet`` (one row for the aggregate,
        one per run: the counts), ``reasons.parquet`` (scope, run, reason, count) and
        ``quarantine.parquet`` (one row per quarantined sample: run, sample_id, source, reason,
        message, in recording order). Deterministic bytes; returns ``{name: file name}``."""
        from pathlib import Path

        d = Path(directory)
        runs = self.runs()
        scopes = [("aggregate", "", self.aggregate())] + [("run", k, v) for k, v in runs.items()]
        cols = ["total", "non_empty", "empty", "missing", "invalid", "kept", "skipped"]
        _write_parquet(d / "summary.parquet", {"scope": [s[0] for s in scopes], "run": [s[1] for s in scopes],
                                               **{c: [getattr(s[2], c) for s in scopes] for c in cols}})
        reasons = [(scope, run, code, n) for scope, run, s in scopes for code, n in sorted(s.by_reason.items())]
        _write_parquet(d / "reasons.parquet", {"scope": [r[0] for r in reasons], "run": [r[1] for r in reasons],
                                               "reason": [r[2] for r in reasons], "count": [r[3] for r in reasons]})
        recs = self.record_dicts()
        _write_parquet(d / "quarantine.parquet", {k: [r[k] for r in recs] for k in
                                                  ("run", "sample_id", "source", "reason", "message")})
        return {"summary": "summary.parquet", "reasons": "reasons.parquet", "quarantine": "quarantine.parquet"}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Quarantine:
        q = cls()
        for run, s in d.get("runs", {}).items():
            q._runs[run] = RunSummary.from_dict(s)
        for rd in d.get("records", []):
            rec = QuarantineRecord(rd["run"], rd["sample_id"], rd["source"], rd["reason"], rd["message"])
            q._rejected[(rec.run, rec.sample_id)] = len(q._records)
            if rd.get("also"):
                q._also[len(q._records)] = list(rd["also"])
            q._records.append(rec)
            ex = q._examples.setdefault(rec.reason, [])
            if len(ex) < EXAMPLES_PER_REASON:
                ex.append({"run": rec.run, "sample_id": rec.sample_id, "source": rec.source,
                           "message": rec.message})
        return q


def _write_parquet(path: Any, columns: dict[str, Any]) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    with atomic_file(path, fsync=False) as f:
        pq.write_table(pa.table(columns), f, compression="zstd")


def evaluate_summaries(scopes: Iterable[tuple[str, RunSummary]], thresholds: Thresholds,
                       examples: Mapping[str, list[dict[str, str]]] | None = None) -> Verdict:
    """Check each (scope, summary) against ``thresholds``; the worst status wins."""
    checks: list[Check] = []
    scopes = list(scopes)
    for scope, s in scopes:
        for metric, t in thresholds.items():
            v = s.fraction(metric)
            checks.append(Check(scope, metric, round(v, 6), t.warn, t.fail, t.status(v)))
    status = max((c.status for c in checks), key=STATUSES.index, default="ok")
    agg = scopes[0][1] if scopes else RunSummary()
    offenders = [{"reason": code, "category": REASONS[code].category if code in REASONS else "invalid",
                  "count": n, "examples": list((examples or {}).get(code, []))}
                 for code, n in sorted(agg.by_reason.items(), key=lambda kv: (-kv[1], kv[0]))]
    return Verdict(status=status, checks=checks, worst_offenders=offenders)


# local copies of object-store sources -> their URLs (warp/etl/spool.py): a quarantine record
# names the object a user can look at, never a run's temporary copy of it
_SOURCE_NAMES: contextvars.ContextVar[tuple[tuple[str, str], ...]] = contextvars.ContextVar("warp_source_names",
                                                                                         default=())


@contextlib.contextmanager
def sources_named(mapping: dict[str, str]) -> Iterator[None]:
    """While it is open, a rejected sample whose source lies under a key of ``mapping`` (a local
    folder) is recorded under the matching value (its URL) instead."""
    token = _SOURCE_NAMES.set(tuple((k.rstrip("/") + "/", v.rstrip("/") + "/") for k, v in mapping.items()))
    try:
        yield
    finally:
        _SOURCE_NAMES.reset(token)


def _named_source(source: str) -> str:
    text = os.fspath(source) if isinstance(source, os.PathLike) else source
    for local, url in _SOURCE_NAMES.get():
        if isinstance(text, str) and text.startswith(local):
            return url + text[len(local):]
    return source
