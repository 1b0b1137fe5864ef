"""``warp order`` in memory bounded independently of the sample count a manifest claims (issue 36 item 2).

A table and an unweighted warehouse or feature cache are ordered as their runs (``RunOrder``):
the set digest, order digest, a rank's share and ``--keys`` equal what the materialised array
gives, and a warehouse manifest claiming 4×10^8 samples (its content hash resealed) is ordered under
a 1 GiB address-space limit (it needed a 3 GiB array: exit 70 MemoryError). Counts, never timings.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from warpdata.partition.digest import EpochOrder
from warpdata.partition.keys import RunOrder
from warpdata.partition.sampler import ShardAwareSampler


@pytest.mark.parametrize("mode", ["exact", "pad", "drop"])
@pytest.mark.parametrize("shuffle", [False, True])
def test_a_run_order_reads_as_the_array_it_stands_for(mode, shuffle):
    s = ShardAwareSampler([7, 0, 13, 4, 9, 1], seed=3, shuffle=shuffle, rank=0, world_size=1)
    runs, array = s.sequence_runs(2), s.sequence(2)
    assert len(runs) == len(array) and runs.tolist() == array.tolist()
    assert np.array_equal(np.asarray(runs), array) and runs[5] == array[5]
    assert runs[3:17].tolist() == array[3:17].tolist()
    pos = np.array([0, 33, 12, 1, 20], np.int64)
    assert runs[pos].tolist() == array[pos].tolist()
    with pytest.raises(IndexError):
        runs[np.array([34])]
    a = EpochOrder("warehouse", "c", mode, 3, 2, shuffle, array)
    b = EpochOrder("warehouse", "c", mode, 3, 2, shuffle, runs)
    assert a.set_digest() == b.set_digest() and a.order_digest() == b.order_digest()
    for world, bs in ((1, 1), (3, 2), (5, 1), (4, 3)):
        if mode == "drop" and len(array) < world * bs:
            continue
        for rank in range(world):
            assert a.share(rank, world, bs) == b.share(rank, world, bs), (rank, world, bs)
            got = [x for c in b.keys(rank, world, bs) for x in c.tolist()]
            assert got == [x for c in a.keys(rank, world, bs) for x in c.tolist()]


def test_weighted_records_keep_their_array():
    s = ShardAwareSampler([3, 2], repeats=[1, 2, 1, 3, 1], rank=0, world_size=1)
    assert s.sequence_runs() is None


def test_pad_repeats_wrap_in_a_run_order():
    runs = RunOrder([10, 0], [3, 2])  # the order 10 11 12 0 1
    order = EpochOrder("table", "c", "pad", 0, 0, False, runs)
    array = EpochOrder("table", "c", "pad", 0, 0, False, np.asarray(runs))
    for world in (2, 3, 4, 5, 8):
        for rank in range(world):
            assert order.share(rank, world) == array.share(rank, world)


@pytest.fixture(scope="module")
def claimed_warehouse(tmp_path_factory):
    """A warehouse of 40 samples whose manifest claims 4×10^8 (content hash resealed)."""
    from warpdata.cli.app import main
    from warpdata.core.canonical import seal
    from warpdata.sampledata.detection import generate

    root = tmp_path_factory.mktemp("claimed")
    d = root / "coco"
    generate(d, count=40, seed=5, min_side=16, max_side=24, broken=False)
    (d / "t.toml").write_text('[source]\nformat = "coco"\n[transform]\ntarget_size = [8, 8]\nmax_boxes = 2\n'
                              '[output]\nroot = "../wh"\nshard_samples = 16\n')
    assert main(["-q", "etl", "--config", str(d / "t.toml")]) == 0
    v = next((root / "wh").glob("v*"))
    m = json.loads((v / "manifest.json").read_text())
    for s in m["shards"]:
        s["samples"] = 400_000_000 // len(m["shards"])
    (v / "manifest.json").write_text(json.dumps(seal(m)))
    return v, 400_000_000 // len(m["shards"]) * len(m["shards"])


def _bounded(args: list[str]) -> tuple[int, str, str, int]:
    """``warp ARGS`` in a subprocess under a 1 GiB address-space limit: exit code, stdout, stderr, peak RSS (KiB)."""
    # the peak of this process's own memory (VmHWM): ru_maxrss after exec keeps the forking parent's peak
    code = ("import resource, sys\n"
            "resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))\n"
            "from warpdata.cli.app import main\n"
            f"rc = main({args!r})\n"
            "sys.stdout.flush()\n"
            "hwm = [ln for ln in open('/proc/self/status') if ln.startswith('VmHWM:')]\n"
            "print('RSS', hwm[0].split()[1] if hwm else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, "
            "file=sys.stderr)\n"
            "sys.exit(rc)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=dict(os.environ))
    return r.returncode, r.stdout, r.stderr, int(r.stderr.rsplit("RSS ", 1)[1].split()[0])


def test_order_of_a_manifest_claiming_4e8_samples_stays_small(claimed_warehouse):
    v, n = claimed_warehouse
    code, out, err, rss = _bounded(["--json", "order", str(v), "--pad", "--world-size", "3", "--rank", "2"])
    assert code == 0, err
    doc = json.loads(out)
    assert doc["samples"] == n and doc["rank"]["samples"] + doc["rank"]["pad_samples"] == -(-n // 3)
    assert rss < 400 * 1024, rss  # the array of every sample was 3 GiB


def test_pad_with_drop_last_is_refused_in_the_cli_words(cli, claimed_warehouse):
    v, _ = claimed_warehouse
    r = cli("order", v, "--pad", "--drop-last")
    assert r.code == 2 and r.out == "", r.err
    assert "--pad and --drop-last ask for opposite things" in r.err and "hint:" in r.err
    assert "drop_last=True" not in r.err and "pad=True" not in r.err
