"""Shards cut where the keys say (warp/etl/cutter.py; docs/formats/twh1.md, "Layout across versions")."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from warpdata.etl.cutter import KeyCutter, cut_by_keys, expected_runs, key_hash

KEYS = [f"images/img_{i:05d}.jpg" for i in range(3000)]


def runs_of(keys: list[str], per: int, fixed: bool = False) -> list[tuple[str, ...]]:
    return [tuple(r) for r in cut_by_keys(keys, per, fixed, key=str)]


def test_key_hash_is_63_bits_of_sha256_little_endian():
    import hashlib

    assert key_hash("a") == int.from_bytes(hashlib.sha256(b"a").digest()[:8], "little") >> 1 < 1 << 63


@pytest.mark.parametrize("per", [8, 32, 128, 512])
def test_runs_cover_every_key_in_order_and_never_pass_the_cap(per):
    runs = runs_of(KEYS, per)
    assert [k for r in runs for k in r] == KEYS
    assert max(map(len, runs)) <= per
    # about 2w + 1 a run (w = per // 3), the first and last runs aside
    mean = sum(map(len, runs[1:-1])) / len(runs[1:-1])
    assert 0.45 * per < mean <= per and abs(len(runs) - expected_runs(len(KEYS), per, False)) < len(runs) // 2


def test_fixed_and_small_caps_cut_by_count():
    assert list(map(len, runs_of(KEYS[:20], 8, fixed=True))) == [8, 8, 4]
    assert list(map(len, runs_of(KEYS[:10], 4))) == [4, 4, 2]


@settings(max_examples=60, deadline=None)
@given(st.sampled_from([8, 16, 64]), st.integers(0, 2999), st.sampled_from(["remove", "insert"]))
def test_an_edit_in_the_middle_changes_at_most_three_runs(per, i, how):
    before = runs_of(KEYS, per)
    keys = KEYS[:i] + KEYS[i + 1:] if how == "remove" else KEYS[:i] + ["images/new.jpg"] + KEYS[i:]
    after = runs_of(keys, per)
    new = [r for r in after if r not in set(before)]
    assert len(new) <= 3
    # the runs after the changed ones are the old ones, in order
    last = max((j for j, r in enumerate(after) if r in new), default=-1)
    if last + 1 < len(after):
        assert after[last + 1:] == before[len(before) - (len(after) - last - 1):]


@settings(max_examples=40, deadline=None)
@given(st.sampled_from([8, 32, 100]), st.lists(st.integers(1, 300), min_size=1, max_size=20))
def test_pushed_in_any_pieces_the_runs_are_the_same(per, pieces):
    """What the overlapped pass sees (samples arriving as the header pass delivers them) cuts as
    plan() does with the whole list."""
    keys = KEYS[:sum(pieces)]
    c = KeyCutter(per, False, key=str)
    got = []
    pos = 0
    for n in pieces:
        for k in keys[pos:pos + n]:
            got += [tuple(r) for r in c.push(k)]
        pos += n
    got += [tuple(r) for r in c.finish()]
    assert got == runs_of(keys, per)
