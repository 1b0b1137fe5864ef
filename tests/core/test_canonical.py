"""Canonical JSON: one byte string per value, independent of key order; no NaN."""

from __future__ import annotations

import hashlib
import json
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st
from warpdata.core.canonical import (
    CanonicalJSONError,
    canonical_json,
    identity,
    sha256_file,
    sha256_hex,
)

scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text()
values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
                      max_leaves=30)


def _shuffled(v, rnd):
    """The same value with every dict's insertion order permuted."""
    if isinstance(v, dict):
        items = list(v.items())
        rnd.shuffle(items)
        return {k: _shuffled(x, rnd) for k, x in items}
    if isinstance(v, list):
        return [_shuffled(x, rnd) for x in v]
    return v


@given(values, st.randoms(use_true_random=False))
def test_key_order_does_not_change_bytes(v, rnd):
    assert canonical_json(_shuffled(v, rnd)) == canonical_json(v)
    assert identity(_shuffled(v, rnd)) == identity(v)


@given(values)
def test_round_trips_and_is_a_fixed_point(v):
    b = canonical_json(v)
    assert canonical_json(json.loads(b)) == b
    assert canonical_json(v) == b  # deterministic
    assert identity(v) == hashlib.sha256(b).hexdigest()


@given(st.dictionaries(st.text(), st.integers(), min_size=1))
def test_layout_sorted_keys_no_whitespace_utf8(d):
    b = canonical_json(d)
    assert b.decode("utf-8") == "{" + ",".join(f"{json.dumps(k, ensure_ascii=False)}:{d[k]}" for k in sorted(d)) + "}"


def test_exact_bytes():
    assert canonical_json({"b": [1, 2.5, None, True], "a": "é"}) == '{"a":"é","b":[1,2.5,null,true]}'.encode()
    assert identity({}) == hashlib.sha256(b"{}").hexdigest()


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf, {"x": [1, {"y": math.nan}]}])
def test_nan_and_infinity_rejected_with_path(bad):
    with pytest.raises(CanonicalJSONError) as e:
        canonical_json(bad)
    assert isinstance(e.value, ValueError)
    if isinstance(bad, dict):
        assert "$.x[1].y" in str(e.value)


@pytest.mark.parametrize("bad", [{1: "int key"}, {"s": {1, 2}}, b"bytes", object()])
def test_non_json_types_rejected(bad):
    with pytest.raises(CanonicalJSONError):
        canonical_json(bad)


def test_tuples_encode_as_lists():
    assert canonical_json((1, (2,))) == canonical_json([1, [2]])


def test_sha256_helpers(tmp_path):
    data = bytes(range(256)) * 5000  # > one read chunk
    p = tmp_path / "f"
    p.write_bytes(data)
    assert sha256_file(p, chunk=4096) == sha256_hex(data) == hashlib.sha256(data).hexdigest()
