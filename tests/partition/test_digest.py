"""The sample-key digest (warp/partition/keys.py, tally.py, digest.py; docs/partitioning.md "Digests") and its helpers."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from warpdata.partition.digest import (
    FEW_RUNS,
    Digest,
    Ledger,
    P,
    RunPrefix,
    SampleKeys,
    Tally,
    combine_digests,
    runs_of,
    sample_keys,
)
from warpdata.partition.plan import ShardPlan
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


def test_lanes_are_powers_of_g_and_runs_have_a_closed_form():
    """docs/partitioning.md "Digest": lane x sums g_x^index mod 2^61 - 1; a run sums in closed form."""
    p = P
    ga, gb = KEYS.g
    for i in (0, 1, 1023, 1024, 2**20 + 5, 2**40 + 17, 10**15):
        assert KEYS.digest([i]) == Digest(pow(ga, i, p), pow(gb, i, p))
    # a trillion-row run: the geometric series, never row by row
    lo, hi = 10**12, 2 * 10**12 + 3
    want = Digest((pow(ga, hi, p) - pow(ga, lo, p)) * pow(ga - 1, p - 2, p) % p,
                  (pow(gb, hi, p) - pow(gb, lo, p)) * pow(gb - 1, p - 2, p) % p)
    assert KEYS.digest_range(lo, hi) == want
    assert KEYS.digest_runs(np.array([lo, 5, 9]), np.array([hi - lo, 0, 3])) == want + KEYS.digest([9, 10, 11])
    starts, lengths = np.array([4000, 0, 70_000]), np.array([2500, 1, 1])
    seq = np.concatenate([np.arange(s, s + n) for s, n in zip(starts, lengths, strict=True)])
    prefix = RunPrefix(KEYS, starts.tolist(), lengths.tolist())
    for a, b in ((0, 0), (0, 1), (3, 2501), (2500, 2502), (0, len(seq)), (1, 2500)):
        assert prefix.digest(a, b) == KEYS.digest(seq[a:b])


@pytest.mark.parametrize("top", [1, 2000, 2**16, 2**16 + 1, 300_000, 2**32, 2**32 + 1, 2**45])
def test_vectorised_powers_from_flat_tables_are_the_lanes(top):
    """powers() looks exponents below 2^16 up in one flat table, below 2^32 in two (one product), and
    beyond 10 bits at a time: every way gives g^e mod 2^61 - 1."""
    keys = SampleKeys(f"flat-{top}")
    e = np.unique(np.concatenate([np.random.default_rng(top % 997).integers(0, top, 300), [0, top - 1]]))
    for lane in (0, 1):
        got = keys.powers(lane, e.astype(np.uint64)).tolist()
        assert got == [pow(keys.g[lane], int(x), P) for x in e], lane
    assert keys.digest(e) == Digest(sum(pow(keys.g[0], int(x), P) for x in e) % P,
                                    sum(pow(keys.g[1], int(x), P) for x in e) % P)


def test_run_prefixes_summed_in_python_and_in_numpy_agree_with_the_keys():
    """An order of at most FEW_RUNS runs has its prefixes summed in Python, a longer one in numpy: both
    give the digest of the keys, at run boundaries, inside runs, one by one and as arrays."""
    rng = np.random.default_rng(7)
    for runs in (1, 5, FEW_RUNS, FEW_RUNS + 1, 700):
        lengths = rng.integers(0, 40, runs)
        starts = rng.permutation(runs) * 64 + 2**20
        seq = np.concatenate([np.arange(s, s + n) for s, n in zip(starts, lengths, strict=True)])
        prefix = RunPrefix(KEYS, starts.tolist(), lengths.tolist())
        assert (prefix._lanes is None) == (runs > FEW_RUNS)
        pos = np.unique(np.concatenate([[0, len(seq)], np.cumsum(lengths), rng.integers(0, len(seq) + 1, 40)]))
        got_a, got_b = prefix.at_array(pos)
        for k, x in enumerate(pos.tolist()):
            want = KEYS.digest(seq[:x])
            assert Digest(*prefix.at(x)) == want == Digest(int(got_a[k]), int(got_b[k])), (runs, x)


def test_generators_are_derived_as_documented():
    """docs/partitioning.md "Digest": g = 2 + (bytes 0-7 / 8-15 of SHA-256, little-endian) mod (P - 3)."""
    h = hashlib.sha256(b"warp-sample-key/2\0" + b"content-a").digest()
    want = tuple(2 + int.from_bytes(h[k:k + 8], "little") % (P - 3) for k in (0, 8))
    assert KEYS.g == want and sample_keys("content-a").g == want


def test_a_lane_outside_the_field_is_not_a_digest():
    assert Digest.from_hex(f"{P - 1:016x}{0:016x}") == Digest(P - 1, 0)
    with pytest.raises(ResumeMismatchError, match="not a warp sample digest"):
        Digest.from_hex(f"{P:016x}{0:016x}")  # 2^61 - 1 is no residue: a lane is always below it


def test_prefix_tallies_match_a_rehash_at_every_count_and_start_again_backwards():
    rem = Remainder(6000, [(100, 300)])  # 5,800 items left
    seq = np.random.default_rng(3).permutation(6000)
    items = np.random.default_rng(4).permutation(6100)  # items past 5,800 are pad repeats
    ledger = Ledger(KEYS, rem, seq.__getitem__)
    for count in (0, 1, 1023, 1024, 1025, 3000, 4096, 4097, 6100, 700, 6100):  # crosses chunks, then goes back
        c, n, p, q = ledger.tally_prefix(items, count)
        part = items[:count]
        own, pad = part[part < rem.size], part[part >= rem.size]
        assert (n, q) == (len(own), len(pad))
        assert c == KEYS.digest(seq[rem.positions(own)]) and p == KEYS.digest(seq[rem.positions(pad)])
    ordered = np.arange(6100)  # a first chunk of own items only (4 columns), then one with the pad repeats
    for keys in (seq, seq + 2**20):  # indices below 2^16 (both lanes in one lookup), and above
        for count in (4095, 4096, 5800, 5801, 6100):
            c, n, p, q = Ledger(KEYS, rem, keys.__getitem__).tally_prefix(ordered, count)
            assert (n, q) == (min(count, 5800), max(0, count - 5800))
            assert c + p == KEYS.digest(keys[rem.positions(ordered[:count])])


@pytest.mark.parametrize(("policy", "workers", "done"), [("exact", 1, ()), ("exact", 3, ((50, 700), (900, 901))),
                                                         ("pad", 2, ((0, 333),)), ("drop", 4, ())])
def test_table_plan_states_equal_the_rows_they_read(policy, workers, done):
    """A table's tally (closed form over its intervals) equals hashing the rows its batches read."""
    plan = ShardPlan([300, 0, 250, 450, 17], rank=1, world=3, batch_size=16, policy=policy, seed=2, shuffle=True,
                     done_rows=done)
    content = "m/t"
    keys = SampleKeys(content)
    order = plan.yield_order(workers)
    offsets = np.concatenate([[0], np.cumsum(plan.unit_rows)])
    for n in range(len(order) + 1):
        consumed = [(j, j + 1) for j in order[:n]]
        t = plan.tally(consumed, content)
        rows = [offsets[s.unit] + r for j in order[:n] for s in plan.batch_slices(j) for r in range(s.start, s.stop)]
        assert t.consumed_samples + t.pad_samples == len(rows)
        assert t.consumed + t.pad == keys.digest(rows)


@pytest.mark.parametrize(("policy", "rank", "consumed"), [("exact", 1, ()), ("exact", 0, ((1, 3),)), ("pad", 2, ()),
                                                          ("pad", 0, ()), ("drop", 0, ((0, 1), (4, 6)))])
def test_table_states_from_running_lanes_equal_the_closed_form(policy, rank, consumed):
    """state_after's states read their tally from running lanes advanced batch by batch; it equals the
    interval tally."""
    plan = ShardPlan([300, 0, 250, 450, 17], rank=rank, world=3, batch_size=16, policy=policy, seed=2, shuffle=True,
                     consumed=consumed)
    other = ShardPlan([300, 0, 250, 450, 17], rank=rank, world=3, batch_size=16, policy=policy, seed=2,
                      shuffle=True, consumed=consumed)
    for workers in (1, 3, 2):
        for n in (*range(len(plan.yield_order(workers)) + 2), 4, 0):
            state = plan.state_after(n, workers, manifest="m", table="t")
            want = other.tally(state.consumed, "m/t")
            assert (state.consumed_digest, state.consumed_samples) == (want.consumed.hex(), want.consumed_samples)
            assert (state.pad_digest, state.dropped_digest) == (want.fields().get("pad_digest", ""),
                                                                 want.fields().get("dropped_digest", ""))


@pytest.mark.parametrize("lists", [True, False])
@pytest.mark.parametrize("workers", [1, 2, 3])
@pytest.mark.parametrize("reads", ["every", "every third", "jumps", "backwards"])
def test_table_running_lanes_in_and_across_row_groups_equal_the_rows_read(workers, reads, lists, monkeypatch):
    """A table state read after each batch, every third, after jumps past ADVANCE, or going back: the running
    lanes (every batch's lanes made at once; or, for a rank of more than BATCH_LISTS batches, a batch inside
    a row group in closed form from its worker's last one, batches across row groups and the short last one
    from the prefixes) give the digest of the rows its batches read."""
    from warpdata.partition import plan as plans
    from warpdata.partition.plan import ADVANCE

    if not lists:
        monkeypatch.setattr(plans, "BATCH_LISTS", 0)

    units = [700, 3, 0, 1200, 64, 511]
    plan = ShardPlan(units, rank=1, world=2, batch_size=8, seed=4, shuffle=True, consumed=((2, 5),))
    keys = SampleKeys("m/t")
    order = plan.yield_order(workers)
    total = len(order)
    assert total > 2 * ADVANCE
    ns = {"every": range(total + 1), "every third": range(0, total + 1, 3),
          "jumps": [1, 2, ADVANCE + 5, ADVANCE + 6, total], "backwards": [total, 40, 41, 3, total - 1]}[reads]
    offsets = np.concatenate([[0], np.cumsum(units)])
    before = [offsets[s.unit] + r for j in range(2, 5) for s in plan.batch_slices(j) for r in range(s.start, s.stop)]
    for n in ns:
        state = plan.state_after(n, workers, manifest="m", table="t")
        rows = before + [offsets[s.unit] + r for j in order[:n] for s in plan.batch_slices(j)
                         for r in range(s.start, s.stop)]
        assert (state.consumed_digest, state.consumed_samples) == (keys.digest(rows).hex(), len(rows)), n


def test_digest_modules_are_split_along_their_seams():
    """No module of warp/partition passes 800 lines nor any function 100 (#27), and
    warpdata.partition.digest still exports every name the loaders, doctor, bench and tests import
    from it, each the same object as in the module that defines it."""
    import ast
    from pathlib import Path

    import warpdata.partition
    from warpdata.partition import digest, keys, tally

    folder = Path(warpdata.partition.__file__).parent
    long = {p.name: n for p in folder.glob("*.py") if (n := len(p.read_text().splitlines())) >= 800}
    assert not long, long
    big = {f"{p.name}:{f.name}": f.end_lineno - f.lineno + 1 for p in folder.glob("*.py")
           for f in ast.walk(ast.parse(p.read_text())) if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
           and f.end_lineno - f.lineno + 1 > 100}
    assert not big, big
    used = {"FEW_RUNS", "P", "Digest", "EpochKeys", "EpochOrder", "Ledger", "RunPrefix", "SampleKeys", "Tally",
            "carry", "check_same_epoch", "combine_digests", "content_of_manifest", "digest_report", "merge_runs",
            "order_digest", "runs_of", "sample_keys", "set_digest"}
    assert used <= set(digest.__all__)
    assert all(hasattr(digest, n) for n in digest.__all__)
    assert digest.Tally is tally.Tally and digest.Digest is keys.Digest and digest.sample_keys is keys.sample_keys
    assert warpdata.partition.combine_digests is digest.combine_digests
