"""``warp order`` (docs/partitioning.md, "Digests"): the ground truth a job's digests are checked against.

A published table read over real ranks by ``Table.batches`` and a ``.tbl`` file read by
``TblLoader``: the command's set digest is ``combine_digests`` of the ranks' final
states, its order digest theirs, a rank's share is that rank's own digest, and
``--keys`` lists the order the ranks read, one index per line.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from warpdata.partition import combine_digests

ROWS = 53


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    from support.datasets import make_rows, publish

    root = tmp_path_factory.mktemp("ordercli")
    url = str(root / "store")
    publish(url, "ws/o", {"main": [make_rows(20, payload=1), make_rows(33, 20, payload=1)]}, root / "pub",
            row_group_size=7)
    return url


@pytest.fixture
def table(store, monkeypatch):
    import warpdata

    monkeypatch.setenv("WARP_STORE", store)
    for v in ("RANK", "WORLD_SIZE"):
        monkeypatch.delenv(v, raising=False)
    return warpdata.dataset("ws/o").table("main")


def _ranks(table, world, **kw):
    """Every rank's ids (in order) and final state after a whole epoch."""
    out = []
    for r in range(world):
        stream = table.batches(5, columns=["id"], rank=r, world_size=world, **kw)
        ids = [i for b in stream for i in b.column(0).to_pylist()]
        out.append((ids, stream.state_dict()))
    return out


def test_set_and_order_digest_equal_what_the_ranks_combine_to(cli, table):
    ranks = _ranks(table, 3, shuffle=True, seed=4, epoch=2)
    r = cli("--json", "order", "ws/o", "--seed", "4", "--epoch", "2", "--shuffle")
    assert r.code == 0, r.err
    assert r.err == ""
    doc = json.loads(r.out)
    assert doc["samples"] == ROWS and doc["kind"] == "table" and doc["mode"] == "exact" and doc["shuffle"]
    assert doc["set_digest"] == combine_digests([s for _, s in ranks])
    assert {s.order_digest for _, s in ranks} == {doc["order_digest"]}
    # the order digest names the seed and the epoch; the set digest does not depend on them
    other = json.loads(cli("--json", "order", "ws/o", "--seed", "4", "--epoch", "3", "--shuffle").out)
    assert other["order_digest"] != doc["order_digest"] and other["set_digest"] == doc["set_digest"]


def test_a_ranks_share_is_its_own_digest(cli, table):
    ranks = _ranks(table, 4, pad=True)
    r = cli("--json", "order", "ws/o", "--pad", "--world-size", "4", "--rank", "3")
    assert r.code == 0, r.err
    share = json.loads(r.out)["rank"]
    ids, state = ranks[3]
    assert share["samples"] + share["pad_samples"] == len(ids) == 14
    assert share["digest"] == state.consumed_digest and share["pad_digest"] == state.pad_digest
    human = cli("order", "ws/o", "--pad", "--world-size", "4", "--rank", "3")
    assert human.code == 0 and human.err == ""
    assert human.out.splitlines()[1] == f"set digest    {json.loads(r.out)['set_digest']}"
    assert f"rank 3/4   {share['samples']} samples from position 42, digest {share['digest']}" in human.out


def test_keys_stream_the_order_the_ranks_read(cli, table):
    ranks = _ranks(table, 2, shuffle=True, seed=9)
    r = cli("order", "ws/o", "--seed", "9", "--shuffle", "--keys")
    assert r.code == 0 and r.err == ""
    assert [int(x) for x in r.out.split()] == ranks[0][0] + ranks[1][0]
    one = cli("order", "ws/o", "--seed", "9", "--shuffle", "--keys", "--world-size", "2", "--rank", "1")
    assert [int(x) for x in one.out.split()] == ranks[1][0]


def test_drop_last_share_and_dropped_tail(cli, table):
    ranks = _ranks(table, 2, drop_last=True)
    r = cli("--json", "order", "ws/o", "--drop-last", "--batch-size", "5", "--world-size", "2", "--rank", "0")
    doc = json.loads(r.out)
    assert doc["rank"]["samples"] == len(ranks[0][0]) == 25 and doc["rank"]["dropped_samples"] == 3
    assert doc["set_digest"] == combine_digests([s for _, s in ranks])  # rank 0 holds the dropped tail


def test_a_tbl_file_by_path(cli, tmp_path):
    from warpdata.formats import tbl
    from warpdata.sampledata.photos import encode_jpeg, synthetic_photo
    from warpdata.tbl.loader import TblLoader

    p = tmp_path / "x.tbl"
    rng = np.random.default_rng(1)
    with tbl.TblWriter(p, fsync=False) as w:
        for _ in range(11):
            w.add(encode_jpeg(synthetic_photo(rng, 8, 8), 70))
    states = []
    for rank in range(2):
        loader = TblLoader(p, 3, shuffle=True, seed=2, rank=rank, world_size=2, threads=1)
        list(loader)
        states.append(loader.state_dict())
    doc = json.loads(cli("--json", "order", str(p), "--shuffle", "--seed", "2").out)
    assert doc["kind"] == "tbl" and doc["samples"] == 11
    assert doc["set_digest"] == combine_digests(states) and doc["order_digest"] == states[0]["order_digest"]


def test_usage_and_missing_target_errors(cli, table, tmp_path):
    r = cli("order", "ws/o", "--rank", "1")
    assert r.code == 2 and r.out == "" and "--rank and --world-size go together" in r.err
    r = cli("order", "ws/o", "--world-size", "2", "--rank", "2")
    assert r.code == 2 and "rank 2 is not in 0..1" in r.err
    r = cli("order", "ws/o", "--pad", "--drop-last")
    assert r.code == 2 and "opposite things" in r.err
    r = cli("order", str(tmp_path))
    assert r.code == 66 and f"{tmp_path}: not a .tbl file" in r.err


def _restarted(table, tmp_path):
    """A run of 2 ranks stopped after 2 batches each, resumed at 3 ranks to the end: state files."""
    old = []
    for r in range(2):
        stream = table.batches(5, columns=["id"], rank=r, world_size=2, shuffle=True, seed=1)
        for k, _b in enumerate(stream):
            if k == 1:
                break
        old.append(stream.state_dict(2))
    files, mid = [], []
    for r in range(3):
        stream = table.batches(5, columns=["id"], rank=r, world_size=3, resume=old)
        mid.append(stream.state_dict(1))
        for _b in stream:
            pass
        f = tmp_path / f"rank{r}.json"
        f.write_text(stream.state_dict().to_json())
        files.append(f)
    return files, mid


def test_doctor_passes_the_states_of_a_restarted_epoch(cli, table, tmp_path):
    files, _mid = _restarted(table, tmp_path)
    args = [a for f in files for a in ("--states", f)]
    r = cli("doctor", "ws/o", *args)
    assert r.code == 0, r.out + r.err
    assert "PASS" in r.out and "states/exactly-once" in r.out and "53 of 53 samples yielded once" in r.out
    assert "4 checks: 0 failed" in r.err
    doc = json.loads(cli("--json", "doctor", "ws/o", *args).out)
    assert doc["ok"] and [c["name"] for c in doc["checks"]] == ["states", "version", "order", "exactly-once"]


def test_doctor_fails_a_lost_batch_and_a_missing_rank(cli, table, tmp_path):
    files, mid = _restarted(table, tmp_path)
    lost = tmp_path / "lost.json"
    lost.write_text(mid[1].to_json())  # rank 1 saved after its first batch: the rest of it is not counted
    r = cli("--json", "doctor", "ws/o", "--states", files[0], "--states", lost, "--states", files[2])
    assert r.code == 1
    doc = json.loads(r.out)
    bad = [c for c in doc["checks"] if c["status"] == "FAIL"]
    assert [c["name"] for c in bad] == ["exactly-once"] and "is not the epoch's set digest" in bad[0]["detail"]
    r = cli("doctor", "ws/o", "--states", files[0], "--states", files[2])
    assert r.code == 1 and "missing [1]" in r.out
    r = cli("doctor", "--states", files[0])
    assert r.code == 2 and "--states needs the dataset" in r.err


@pytest.mark.parametrize("body", [b"{", b"[1, 2]", b"\xff\xfe"])
def test_a_damaged_manifest_in_a_directory_is_a_data_error(cli, tmp_path, body):
    # review finding: `warp order DIR` parsed DIR/manifest.json unguarded: exit 70 on bad JSON
    (tmp_path / "manifest.json").write_bytes(body)
    r = cli("order", tmp_path)
    assert r.code == 65 and str(tmp_path / "manifest.json") in r.err and "hint:" in r.err, r.err
    assert r.out == "" and "internal error" not in r.err


def test_doctor_states_that_are_a_directory_or_not_states_are_typed_errors(cli, table, tmp_path):
    # review finding: a list holding a non-JSON string exited 70; a directory said "cannot write";
    # a number in the list was reported as "NoneType is not a warp resume state"
    r = cli("doctor", "ws/o", "--states", tmp_path)
    assert r.code == 66 and f"{tmp_path}: a directory, not a state file" in r.err and "cannot write" not in r.err
    strings = tmp_path / "strings.json"
    strings.write_text('["abc"]')
    r = cli("doctor", "ws/o", "--states", strings)
    assert r.code == 66 and f"{strings}: a state in the list is a string that is not JSON" in r.err, r.err
    numbers = tmp_path / "numbers.json"
    numbers.write_text("[1]")
    r = cli("doctor", "ws/o", "--states", numbers)
    assert r.code == 1 and "int is not a warp resume state" in r.out, r.out


def test_a_negative_seed_for_a_shuffled_tbl_is_a_usage_error(cli, tmp_path):
    # review finding: numpy's "expected non-negative integer" surfaced as an internal error (exit 70)
    from warpdata.formats import tbl

    p = tmp_path / "x.tbl"
    with tbl.TblWriter(p, fsync=False) as w:
        for i in range(3):
            w.add(bytes([i]) * 8)
    r = cli("order", str(p), "--shuffle", "--seed", "-1")
    assert r.code == 2 and "--seed -1: a shuffled tbl loader takes a seed >= 0" in r.err, r.err
    assert cli("order", str(p), "--seed", "-1").code == 0  # unshuffled, the seed is not used
