"""Verdict wording comes from one place (warp/etl/quarantine.py): messages, logs and manifests agree."""

from __future__ import annotations

import pytest
from warpdata.core.errors import DataError
from warpdata.etl.quarantine import (
    Quarantine,
    Threshold,
    Thresholds,
    Verdict,
    describe_check,
)


def _quarantine() -> Quarantine:
    q = Quarantine()
    for i in range(8):
        q.accept("a", f"ok{i}")
    q.reject("a", "bad0", "/x/bad0.jpg", "decode-error", "bad0: cannot decode image")
    q.reject("b", "gone", "/x/gone.jpg", "missing-file", "gone: missing")
    return q


def test_one_wording_for_checks_problems_and_manifest_dicts():
    v = _quarantine().evaluate(Thresholds(max_invalid_fraction=Threshold(warn=0.0, fail=0.5)))
    bad = [c for c in v.checks if c.status != "ok"]
    assert bad and v.problems() == [describe_check(c) for c in bad] == [describe_check(c.to_dict()) for c in bad]
    assert v.problems()[0] == "aggregate: invalid_fraction = 0.1000 exceeds warn limit 0.0"
    again = Verdict.from_dict(v.to_dict())
    assert again.to_dict() == v.to_dict() and again.problems() == v.problems()


def test_the_error_carries_the_same_lines():
    v = _quarantine().evaluate(Thresholds(max_missing_fraction=Threshold(fail=0.05)))
    with pytest.raises(DataError) as ei:
        v.raise_for_status(what="src")
    assert all(p in ei.value.message for p in v.problems()) and "missing-file x1" in ei.value.message


def test_the_feature_cache_manifest_says_it_the_same_way(tmp_path):
    from warpdata.features.writer import CacheSpec, build_cache
    from warpdata.sampledata import captions

    src = captions.generate(tmp_path / "cap", count=6, seed=1)
    res = build_cache(CacheSpec(source=src["path"], output=str(tmp_path / "c"), size=(16, 16),
                                thresholds=Thresholds(max_invalid_fraction=Threshold(warn=0.0, fail=0.9),
                                                      max_missing_fraction=Threshold(warn=0.0, fail=0.9))))
    problems = res.manifest["verdict"]["problems"]
    assert res.manifest["verdict"]["status"] == "warn" and problems
    assert all(" exceeds warn limit 0.0" in p for p in problems)
