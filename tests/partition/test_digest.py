"""The sample-key digest (warp/partition/digest.py, docs/partitioning.md "Digests") and its helpers."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from warpdata.partition.digest import Digest, Ledger, SampleKeys, Tally, combine_digests, runs_of
from warpdata.partition.split import Remainder, subtract_intervals
from warpdata.partition.world import ResumeMismatchError

KEYS = SampleKeys("content-a")


@given(st.lists(st.integers(0, 10**12), min_size=1, max_size=200), st.randoms())
def test_order_independent_and_every_change_shows(keys, rnd):
    d = KEYS.digest(keys)
    shuffled = list(keys)
    rnd.shuffle(shuffled)
    assert KEYS.digest(shuffled) == d
    assert KEYS.digest(keys + [keys[0]]) != d  # a repeat adds; XOR would cancel a double
    assert KEYS.digest(keys[1:]) != d  # a missing sample
    assert KEYS.digest(keys + keys) != d
    assert KEYS.digest(keys[:-1] + [keys[-1] + 1]) != d  # a sample swapped for its neighbour


def test_sums_split_and_name_the_content():
    a = np.arange(100_000, dtype=np.int64)
    assert KEYS.digest(a) == KEYS.digest(a[:40_000]) + KEYS.digest(a[40_000:]) == KEYS.digest_range(0, 100_000)
    assert KEYS.digest(a) - KEYS.digest(a[:10]) == KEYS.digest(a[10:])
    assert SampleKeys("content-b").digest(a) != KEYS.digest(a)
    assert Digest.from_hex(KEYS.digest(a).hex()) == KEYS.digest(a)
    with pytest.raises(ResumeMismatchError):
        Digest.from_hex("xyz")


def test_runs_and_intervals():
    starts, lengths = runs_of(np.array([5, 6, 7, 0, 9, 10]))
    assert starts.tolist() == [5, 0, 9] and lengths.tolist() == [3, 1, 2]
    assert subtract_intervals([(0, 10), (20, 30)], [(3, 5), (8, 22)]) == ((0, 3), (5, 8), (22, 30))
    rem = Remainder(10, [(2, 4), (7, 8)])
    items = np.arange(0, 9)  # items 7, 8 wrap (pad) onto the first available positions
    assert rem.positions(items).tolist() == rem.array(0, 9).tolist() == [0, 1, 4, 5, 6, 8, 9, 0, 1]


def test_ledger_separates_pad_repeats_and_grows_incrementally():
    rem = Remainder(10, [(0, 3)])  # 7 items left: positions 3..9
    seq = np.arange(100, 110)
    ledger = Ledger(KEYS, rem, seq.__getitem__)
    c, n, p, q = ledger.tally([(0, 4)])
    assert (n, q) == (4, 0) and c == KEYS.digest([103, 104, 105, 106])
    c, n, p, q = ledger.tally([(0, 9)])  # items 7, 8 are pad repeats of positions 3, 4
    assert (n, q) == (7, 2) and c == KEYS.digest(seq[3:]) and p == KEYS.digest([103, 104])
    again = Ledger(KEYS, rem, seq.__getitem__).tally_prefix(np.array([8, 0, 6, 2]), 4)
    assert again[1:] == (3, KEYS.digest([104]), 1)  # item 8 repeats item 1: position 4


def test_combine_refuses_states_of_different_runs():
    t1 = Tally(content="x", order_digest="o1", consumed=KEYS.digest([1]), consumed_samples=1).fields()
    t2 = Tally(content="x", order_digest="o2", consumed=KEYS.digest([2]), consumed_samples=1).fields()
    with pytest.raises(ResumeMismatchError, match="different runs"):
        combine_digests([t1, t2])
    assert combine_digests([t1, {**t2, "order_digest": "o1"}]) == KEYS.digest([1, 2]).hex()
    with pytest.raises(ResumeMismatchError, match="carries no digests"):
        combine_digests([{"epoch": 0}])
