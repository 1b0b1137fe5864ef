"""Resume states are checked when used (issue 36 item 2; docs/partitioning.md, "Resume": what is checked).

An edited, damaged or hand-written state is refused before anything is read from it: its fields'
types and ranges first (nothing allocated from a claimed ``world`` or interval list), then its
consumed set, counts and digests against one another and the plan of the data it names. Each
refusal is a ``ResumeStateError`` (a ``DataError``, exit 65) naming the field.
"""

from __future__ import annotations

import json

import pytest
from warpdata.core.errors import ConfigError, DataError
from warpdata.partition.keys import Digest
from warpdata.partition.plan import ResumeState, ShardPlan
from warpdata.partition.sampler import ShardAwareSampler
from warpdata.partition.states import MAX_STATE_BYTES, MAX_WORLD, ResumeStateError
from warpdata.partition.world import ResumeMismatchError

ROWS, BS = 10_000, 1000


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    from support.datasets import make_rows, publish

    root = tmp_path_factory.mktemp("resumechecks")
    url = str(root / "store")
    publish(url, "ws/r", {"main": [make_rows(ROWS, payload=1)]}, root / "pub", row_group_size=1000)
    return url


@pytest.fixture
def table(store, monkeypatch):
    import warpdata

    monkeypatch.setenv("WARP_STORE", store)
    for v in ("RANK", "WORLD_SIZE"):
        monkeypatch.delenv(v, raising=False)
    return warpdata.dataset("ws/r").table("main")


def _ids(stream):
    return [i for b in stream for i in b.column(0).to_pylist()]


@pytest.fixture
def saved(table):
    """The JSON of a state saved after 4 of 10 batches."""
    s = table.batches(BS, columns=["id"], rank=0, world_size=1)
    it = iter(s)
    for _ in range(4):
        next(it)
    return json.loads(s.state_dict().to_json())


def _resume(table, doc):
    return _ids(table.batches(BS, columns=["id"], resume=ResumeState.from_json(json.dumps(doc))))


def _flip(hexdigest: str) -> str:
    return hexdigest[:-1] + ("1" if hexdigest[-1] != "1" else "2")  # lanes stay below P


def test_an_unchanged_state_resumes_the_rest(table, saved):
    assert _resume(table, saved) == list(range(4000, ROWS))


@pytest.mark.parametrize(("edit", "field"), [
    (lambda d: {**d, "consumed": [[0, 10]]}, "consumed_samples"),  # widened: skipped 6,000 rows silently
    (lambda d: {**d, "consumed": []}, "consumed_samples"),  # emptied: read 4,000 rows twice
    (lambda d: {**d, "consumed": [[0, 3], [4, 5]]}, "consumed_digest"),  # as many rows, others
    (lambda d: {**d, "consumed_digest": _flip(d["consumed_digest"])}, "consumed_digest"),
    (lambda d: {**d, "consumed_samples": 3000}, "consumed_samples"),
    (lambda d: {**d, "seed": 5}, "order_digest"),
    (lambda d: {**d, "order_digest": _flip(d["order_digest"])}, "order_digest"),
    (lambda d: {**d, "content": "x/main"}, "content"),
    (lambda d: {**d, "pad_samples": 3, "pad_digest": "0" * 31 + "1"}, "pad_samples"),
    (lambda d: {**d, "carried": ["0" * 31 + "1", 5, "", 0]}, "consumed_samples"),  # counted in consumed
])
def test_an_edited_table_state_is_refused_naming_the_field(table, saved, edit, field):
    with pytest.raises(ResumeStateError) as e:
        _resume(table, edit(saved))
    assert e.value.exit_code == 65 and e.value.details["field"] == field and field in e.value.message
    assert isinstance(e.value, DataError) and isinstance(e.value, ResumeMismatchError)


@pytest.mark.parametrize(("edit", "field"), [
    (lambda d: {**d, "world": 1_000_000_000}, "world"),
    (lambda d: {**d, "world": 1e30}, "world"),
    (lambda d: {**d, "world": -1}, "world"),
    (lambda d: {**d, "rank": 3}, "rank"),
    (lambda d: {**d, "seed": "abc"}, "seed"),
    (lambda d: {**d, "seed": 1 << 70}, "seed"),
    (lambda d: {**d, "epoch": -1}, "epoch"),
    (lambda d: {**d, "epoch": True}, "epoch"),
    (lambda d: {**d, "batch_size": 0}, "batch_size"),
    (lambda d: {**d, "policy": "x"}, "policy"),
    (lambda d: {**d, "shuffle": "yes"}, "shuffle"),
    (lambda d: {**d, "consumed": [[5, 3]]}, "consumed"),
    (lambda d: {**d, "consumed": [[0, 11]]}, "consumed"),  # past num_batches
    (lambda d: {**d, "consumed": [[2, 4], [0, 1]]}, "consumed"),  # unsorted
    (lambda d: {**d, "consumed": [[0, 1]] * 70_000}, "consumed"),  # longer than MAX_INTERVALS
    (lambda d: {**d, "consumed": "0-4"}, "consumed"),
    (lambda d: {**d, "done_rows": [[0, 10**12]]}, "done"),  # beyond the table's rows
    (lambda d: {**d, "consumed_digest": "zz" * 16}, "consumed_digest"),
    (lambda d: {**d, "consumed_digest": "f" * 32}, "consumed_digest"),  # lanes at or above P
    (lambda d: {**d, "consumed_samples": -4}, "consumed_samples"),
    (lambda d: {**d, "surprise": 1}, "surprise"),
    (lambda d: {k: v for k, v in d.items() if k != "world"}, "world"),
    (lambda d: {**d, "v": 2}, "v"),
])
def test_a_malformed_table_state_is_refused_before_a_plan_is_made(table, saved, edit, field):
    with pytest.raises(ResumeStateError) as e:
        _resume(table, edit(saved))
    assert e.value.exit_code == 65 and e.value.details["field"] == field, e.value.message


@pytest.mark.parametrize(("text", "field"), [
    ("[" * 200_000 + "]" * 200_000, "nesting"),  # was a RecursionError
    ('{"a": ' * 20 + "1" + "}" * 20, "nesting"),
    ("{", "json"),
    ("[1, 2]", "state"),
    (" " * (MAX_STATE_BYTES + 1), "size"),
])
def test_a_state_document_is_bounded_before_it_is_parsed(text, field):
    with pytest.raises(ResumeStateError) as e:
        ResumeState.from_json(text)
    assert e.value.exit_code == 65 and e.value.details["field"] == field


def _run(unit_rows, world, policy, bs, take, **kw):
    """The states of every rank of a run after ``take`` batches of each."""
    return [ShardPlan(unit_rows, rank=r, world=world, batch_size=bs, policy=policy, **kw).state_after(take)
            for r in range(world)]


def test_pad_and_drop_counts_are_recomputed():
    rows = [40, 0, 33, 71, 10]
    pad = _run(rows, 3, "pad", 4, 13)[2]  # rank 2's last batches are pad repeats
    assert pad.pad_samples > 0
    ShardPlan.resume(rows, ResumeState.from_json(pad.to_json()))  # as saved: accepted
    doc = json.loads(pad.to_json())
    with pytest.raises(ResumeStateError, match="pad_samples"):
        ShardPlan.resume(rows, ResumeState.from_json(json.dumps({**doc, "pad_samples": 0, "pad_digest": ""})))
    drop = _run(rows, 2, "drop", 8, 3)[0]
    assert drop.dropped_samples > 0
    doc = json.loads(drop.to_json())
    with pytest.raises(ResumeStateError, match="dropped_samples"):
        ShardPlan.resume(rows, ResumeState.from_json(json.dumps({**doc, "dropped_samples": 1})))


def test_what_a_resumed_run_carries_is_recomputed_from_its_done_rows():
    rows = [40, 0, 33, 71, 9]
    merged = ShardPlan.merge_states(rows, _run(rows, 3, "exact", 4, 2))
    assert merged.done_rows and merged.carried[1] == sum(b - a for a, b in merged.done_rows)
    plans = [ShardPlan.resume(rows, merged, rank=r, world=2) for r in range(2)]
    states = [json.loads(p.state_after(1).to_json()) for p in plans]
    assert states[0]["carried"] and not states[1]["carried"]
    ShardPlan.resume(rows, ResumeState.from_json(json.dumps(states[0])))
    # carried and consumed_digest moved together (they agree with each other): done_rows give another carried
    c, one = states[0]["carried"], Digest(1, 0)
    wrong = {**states[0], "carried": [(Digest.from_hex(c[0]) + one).hex(), *c[1:]],
             "consumed_digest": (Digest.from_hex(states[0]["consumed_digest"]) + one).hex()}
    with pytest.raises(ResumeStateError, match="carried") as e:
        ShardPlan.resume(rows, ResumeState.from_json(json.dumps(wrong)))
    assert e.value.details["field"] == "carried"
    # a rank that is not 0 claiming what the old run consumed
    claims = ShardPlan(rows, rank=1, world=2, batch_size=4, done_rows=merged.done_rows, carried=merged.carried)
    with pytest.raises(ResumeStateError, match="only rank 0 carries"):
        ShardPlan.resume(rows, ResumeState.from_json(claims.state_after(1).to_json()))
    # a merged (elastic) state: what it carries is the digest of its done rows
    doc = json.loads(merged.to_json())
    ShardPlan.resume(rows, ResumeState.from_json(json.dumps(doc)), rank=0, world=2)
    for edit in ({"done_rows": [[0, 3]]}, {"carried": [doc["carried"][0], doc["carried"][1] + 1, "", 0]}):
        with pytest.raises(ResumeStateError, match="carried"):
            ShardPlan.resume(rows, ResumeState.from_json(json.dumps({**doc, **edit})), rank=0, world=2)


def test_a_list_of_states_with_one_edited_is_refused(table):
    states = []
    for r in range(3):
        s = table.batches(BS // 4, columns=["id"], rank=r, world_size=3)
        it = iter(s)
        for _ in range(2):
            next(it)
        states.append(json.loads(s.state_dict().to_json()))
    ok = [ResumeState.from_json(json.dumps(d)) for d in states]
    got = [_ids(table.batches(BS // 4, columns=["id"], resume=ok, rank=r, world_size=2)) for r in range(2)]
    assert len(got[0]) + len(got[1]) == ROWS - 3 * 2 * (BS // 4)
    states[1]["consumed"] = [[0, 5]]
    with pytest.raises(ResumeStateError, match="consumed_samples"):
        table.batches(BS // 4, columns=["id"], resume=[ResumeState.from_json(json.dumps(d)) for d in states],
                      rank=0, world_size=2)


def test_a_state_of_the_next_epoch_carries_no_digests_and_consumed_nothing():
    rows = [40, 0, 33]
    state = ShardPlan(rows, batch_size=4).state_after(3, manifest="m", table="t")
    nxt = state.next_epoch()
    assert nxt.consumed_digest == "" and ShardPlan.resume(rows, nxt).remaining() == list(range(19))
    doc = json.loads(nxt.to_json())
    with pytest.raises(ResumeStateError, match="consumed_digest"):
        ShardPlan.resume(rows, ResumeState.from_json(json.dumps({**doc, "consumed": [[0, 3]]})))


# -- the dict states: make_loader's sampler (and BigBatchLoader's), TblLoader ---------------------

def _sampler(**kw):
    return ShardAwareSampler([1000] * 10, seed=3, batch_size=100, num_workers=2, **kw)


@pytest.fixture
def sampler_state():
    s = _sampler()
    it = iter(s)
    for _ in range(4000):
        next(it)
    return json.loads(json.dumps(s.state_dict()))


def test_an_unchanged_sampler_state_resumes_the_rest(sampler_state):
    s = _sampler()
    s.load_state_dict(sampler_state)
    assert len(list(s)) == 6000


@pytest.mark.parametrize(("edit", "field"), [
    (lambda d: {**d, "consumed": 10_000}, "consumed_samples"),  # widened: would skip 6,000
    (lambda d: {**d, "consumed": 10**6}, "consumed"),  # more than the rank has
    (lambda d: {**d, "consumed": 0}, "consumed_samples"),  # emptied: would read 4,000 twice
    (lambda d: {**d, "consumed": 3000}, "consumed_samples"),
    (lambda d: {**d, "consumed_digest": _flip(d["consumed_digest"])}, "consumed_digest"),
    (lambda d: {**d, "consumed_samples": 3999}, "consumed_samples"),
    (lambda d: {**d, "world_size": 1_000_000_000}, "world_size"),
    (lambda d: {**d, "world_size": 1e30}, "world_size"),
    (lambda d: {**d, "seed": "abc"}, "seed"),
    (lambda d: {**d, "num_workers": 10**9}, "num_workers"),
    (lambda d: {**d, "done": [[5, 3]]}, "done"),
    (lambda d: {**d, "mode": "x"}, "mode"),
    (lambda d: {**d, "carried": ["0" * 31 + "1", 5, "", 0]}, "consumed_samples"),
])
def test_an_edited_sampler_state_is_refused_naming_the_field(sampler_state, edit, field):
    s = _sampler()
    with pytest.raises((ResumeStateError, ConfigError)) as e:
        s.load_state_dict(edit(sampler_state))
    if field == "consumed":  # the range of consumed keeps its ConfigError (exit 78), as before
        assert "consumed=1000000 is not in [0, 10000]" in e.value.message and e.value.exit_code == 78
        return
    assert e.value.exit_code == 65 and e.value.details["field"] == field, e.value.message


def test_a_sampler_list_from_another_world_with_one_edited_is_refused():
    states = []
    for r in range(3):
        s = ShardAwareSampler([100] * 9, rank=r, world_size=3, seed=1, batch_size=10)
        it = iter(s)
        for _ in range(120):
            next(it)
        states.append(json.loads(json.dumps(s.state_dict())))
    fresh = ShardAwareSampler([100] * 9, rank=0, world_size=2, seed=1, batch_size=10)
    fresh.load_state_dict(states)
    assert len(list(fresh)) == (900 - 360) // 2
    states[2]["consumed"] = 0
    with pytest.raises(ResumeStateError, match="consumed_samples"):
        ShardAwareSampler([100] * 9, rank=0, world_size=2, seed=1, batch_size=10).load_state_dict(states)
    with pytest.raises(ResumeStateError, match="state"):
        ShardAwareSampler([100] * 9, rank=0, world_size=2, seed=1, batch_size=10).load_state_dict(["x"])


@pytest.fixture(scope="module")
def tbl_file(tmp_path_factory):
    from warpdata.formats import tbl

    p = tmp_path_factory.mktemp("tblresume") / "x.tbl"
    with tbl.TblWriter(p, fsync=False) as w:
        for i in range(1000):
            w.add(bytes([i % 256]) * 16)
    return p


def _tbl(path, **kw):
    from warpdata.tbl.loader import TblLoader

    return TblLoader(path, 10, shuffle=True, seed=2, threads=1, rank=0, world_size=1, verify="off", **kw)


@pytest.mark.parametrize(("edit", "field"), [
    (lambda d: {**d, "consumed": 100}, "consumed_samples"),  # widened: would skip 600 samples
    (lambda d: {**d, "consumed": 0}, "consumed_samples"),  # emptied: would read 400 twice
    (lambda d: {**d, "consumed": 10**6}, "consumed"),
    (lambda d: {**d, "consumed_digest": _flip(d["consumed_digest"])}, "consumed_digest"),
    (lambda d: {**d, "world_size": 1_000_000_000}, "world_size"),  # grew past 22 GB and was killed
    (lambda d: {**d, "world_size": 1e30}, "world_size"),
    (lambda d: {**d, "rank": "0"}, "rank"),
    (lambda d: {**d, "done": [[0, 2000]]}, "done"),
])
def test_an_edited_tbl_state_is_refused_naming_the_field(tbl_file, edit, field):
    state = json.loads(json.dumps(_tbl(tbl_file).state_dict(40)))
    assert sum(len(b) for b in _tbl(tbl_file, resume=state).batch_indices()) == 600
    with pytest.raises(ResumeStateError) as e:
        _tbl(tbl_file, resume=edit(state))
    assert e.value.exit_code == 65 and e.value.details["field"] == field, e.value.message


def test_the_documented_caps():
    assert MAX_WORLD == 1 << 20 and MAX_STATE_BYTES == 16 << 20
    with pytest.raises(ResumeStateError, match="world_size"):
        ShardAwareSampler([10]).load_state_dict({**ShardAwareSampler([10]).state_dict(), "world_size": MAX_WORLD + 1})


def test_a_table_state_passed_as_a_parsed_dict_resumes(table, saved):
    """`resume=json.loads(state.to_json())` (what a checkpoint loader hands back) was an AttributeError."""
    whole = _ids(table.batches(BS, columns=["id"], rank=0, world_size=1))
    assert _ids(table.batches(BS, columns=["id"], resume=saved)) == _resume(table, saved)
    assert sorted(_ids(table.batches(BS, columns=["id"], resume=saved)) + whole[:4 * BS]) == sorted(whole)


@pytest.mark.parametrize("state", [[1, 2], "x", 7])
def test_a_tbl_state_that_is_not_an_object_is_refused(tbl_file, state):
    from warpdata.partition.states import ResumeStateError

    with pytest.raises(ResumeStateError, match="JSON object"):
        _tbl(tbl_file).load_state_dict(state)
