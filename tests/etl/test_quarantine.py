"""Quarantine bookkeeping, summaries and thresholds."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st
from warpdata.core.errors import ConfigError, DataError, ExitCode
from warpdata.etl.quarantine import REASONS, Quarantine, Threshold, Thresholds, register_reason


def _q() -> Quarantine:
    q = Quarantine()
    q.accept("train", "a")
    q.accept("train", "b", empty=True)
    q.accept("train", "c", empty=True, keep=False)
    q.reject("train", "d", "img/d.jpg", "missing-file", "img/d.jpg does not exist")
    q.reject("val", "e", "img/e.jpg", "truncated", "img/e.jpg ends at byte 100")
    q.reject("val", "f", "img/f.jpg", "truncated", "img/f.jpg ends at byte 7")
    q.reject("val", "g", "labels.json", "box-out-of-bounds", "box 2 ends at x=900 > 640")
    q.accept("val", "h")
    return q


def test_counts_per_run_and_aggregate():
    s = _q().summary()
    assert s["runs"]["train"] == {"total": 4, "non_empty": 1, "empty": 2, "missing": 1, "invalid": 0,
                                  "kept": 2, "skipped": 1, "by_reason": {"missing-file": 1}}
    agg = s["aggregate"]
    assert agg["total"] == 8 == agg["non_empty"] + agg["empty"] + agg["missing"] + agg["invalid"]
    assert agg["by_reason"] == {"box-out-of-bounds": 1, "missing-file": 1, "truncated": 2}
    assert agg["invalid"] == 3 and agg["missing"] == 1


def test_a_sample_is_rejected_once_first_reason_wins():
    q = Quarantine()
    assert q.reject("r", "x", "x.jpg", "decode-error", "bad")
    assert not q.reject("r", "x", "x.jpg", "box-degenerate", "also bad")
    assert q.summary()["aggregate"]["total"] == 1
    assert q.record_dicts() == [{"run": "r", "sample_id": "x", "source": "x.jpg", "reason": "decode-error",
                                 "message": "bad", "also": ["box-degenerate"]}]
    assert q.is_rejected("r", "x") and not q.is_rejected("r", "y")


def test_unknown_reason_and_bad_registration():
    with pytest.raises(ValueError, match="unknown quarantine reason"):
        Quarantine().reject("r", "x", "x", "no-such-reason", "m")
    with pytest.raises(ValueError):
        register_reason("weird", "strange", "x")
    register_reason("caption-too-long", "invalid", "caption longer than max tokens")
    register_reason("caption-too-long", "invalid", "caption longer than max tokens")  # idempotent
    with pytest.raises(ValueError, match="already registered"):
        register_reason("caption-too-long", "missing", "other")
    assert REASONS["caption-too-long"].category == "invalid"


def test_thresholds_ok_warn_fail_and_worst_offenders():
    q = _q()
    ok = q.evaluate(Thresholds(max_invalid_fraction=Threshold(0.8, 0.9),
                               max_missing_fraction=Threshold(0.5, 0.9)))
    assert ok.status == "ok"
    ok.raise_for_status()
    warn = q.evaluate(Thresholds(max_invalid_fraction=Threshold(0.1, 0.9),
                              max_missing_fraction=Threshold(None, 0.9)))
    assert warn.status == "warn"
    warn.raise_for_status()
    fail = q.evaluate(Thresholds(max_invalid_fraction=Threshold(None, 0.3),
                              max_missing_fraction=Threshold(None, 0.9)))
    assert fail.status == "fail"
    # per-run checks: val has 3/4 invalid, train 0/4
    scopes = {(c.scope, c.metric): c for c in fail.checks}
    assert scopes[("run:val", "invalid_fraction")].value == 0.75
    assert scopes[("run:val", "invalid_fraction")].status == "fail"
    assert scopes[("run:train", "invalid_fraction")].status == "ok"
    assert [o["reason"] for o in fail.worst_offenders] == ["truncated", "box-out-of-bounds", "missing-file"]
    assert fail.worst_offenders[0]["examples"][0]["sample_id"] == "e"
    with pytest.raises(DataError) as ei:
        fail.raise_for_status(what="coco")
    assert ei.value.exit_code == ExitCode.DATA == 65
    assert "truncated x2" in ei.value.message and "e, f" in ei.value.message
    assert "--allow-invalid" in ei.value.hint
    fail.raise_for_status(allow_invalid=True)
    assert fail.allowed
    json.dumps(fail.to_dict())


def test_empty_fraction_threshold():
    q = _q()
    v = q.evaluate(Thresholds(max_invalid_fraction=Threshold(), max_missing_fraction=Threshold(),
                              max_empty_fraction=Threshold(warn=0.1, fail=0.2)))
    assert v.status == "fail"
    assert {c.metric for c in v.checks if c.status == "fail"} == {"empty_fraction"}


def test_threshold_config_round_trip_and_errors():
    t = Thresholds.from_dict({"max_invalid_fraction": {"warn": 0.01, "fail": 0.1}})
    assert t.max_invalid_fraction == Threshold(0.01, 0.1)
    assert Thresholds.from_dict(t.to_dict()) == t
    with pytest.raises(ConfigError, match="unknown threshold"):
        Thresholds.from_dict({"max_bogus": {"warn": 0.1}})
    with pytest.raises(ConfigError):
        Thresholds.from_dict({"max_invalid_fraction": {"warn": 0.5, "fail": 0.1}})
    with pytest.raises(ConfigError):
        Thresholds.from_dict({"max_invalid_fraction": {"warn": 1.5}})
    with pytest.raises(ConfigError):
        Thresholds.from_dict({"max_invalid_fraction": {"wrn": 0.5}})


def test_empty_run_is_ok():
    v = Quarantine().evaluate(Thresholds())
    assert v.status == "ok" and v.worst_offenders == []


codes = st.sampled_from(["missing-file", "truncated", "decode-error", "box-degenerate"])
events = st.lists(st.tuples(st.sampled_from(["a", "b"]), st.integers(0, 30),
                            st.one_of(st.none(), codes), st.booleans(), st.booleans()), max_size=60)


@given(events)
def test_merge_and_json_round_trip_preserve_everything(evs):
    whole, left, right = Quarantine(), Quarantine(), Quarantine()
    seen = set()
    for i, (run, sid, code, empty, keep) in enumerate(evs):
        part = left if i % 2 else right
        if code is None:
            whole.accept(run, f"s{sid}-{i}", empty=empty, keep=keep)
            part.accept(run, f"s{sid}-{i}", empty=empty, keep=keep)
        elif (run, sid) not in seen:
            seen.add((run, sid))
            whole.reject(run, f"s{sid}", f"{sid}.jpg", code, "m")
            part.reject(run, f"s{sid}", f"{sid}.jpg", code, "m")
    merged = Quarantine()
    merged.merge(right)
    merged.merge(left)
    assert merged.summary() == whole.summary()
    back = Quarantine.from_dict(json.loads(json.dumps(whole.to_dict())))
    assert back.summary() == whole.summary()
    assert back.record_dicts() == whole.record_dicts()
    agg = whole.summary()["aggregate"]
    assert agg["total"] == agg["non_empty"] + agg["empty"] + agg["missing"] + agg["invalid"]
    assert agg["kept"] + agg["skipped"] == agg["non_empty"] + agg["empty"]


def test_every_pipeline_registers_shared_reason_codes_identically():
    """Importing the warehouse, feature and ingest pipelines into one process in any order works: a code
    they share ("too-large") is registered with one text (two texts raised ValueError at import)."""
    import itertools
    import subprocess
    import sys

    mods = ["warpdata.warehouse.labels", "warpdata.features.scan", "warpdata.publishing.ingest"]
    for order in itertools.permutations(mods):
        code = "; ".join(f"import {m}" for m in order)
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, (order, r.stderr[-500:])
