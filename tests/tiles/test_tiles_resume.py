"""Receipts and resume of the tiled Zarr ETL (docs/formats/receipts.md, "Tiled arrays").

Real processes: ``warp etl`` runs in a child process (its own session), is killed
with SIGKILL (the whole process group: a process pool's workers too) while it
builds, then rerun. No half array is ever visible under the output name, the
rerun rebuilds only the ranges without a valid receipt (``ranges_reused`` /
``ranges_built`` in ``--json``), and the result is byte-identical to an
uninterrupted run, read back bit-exact by zarr-python and tensorstore.
"""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

import numpy as np
import pytest
from support.processes import kill_when, spawn_etl

SHAPE = (96, 64, 80)


@pytest.fixture(scope="module")
def volume(tmp_path_factory) -> Path:
    from warpdata.sampledata.volume import photo_like_volume

    d = tmp_path_factory.mktemp("tiles-resume")
    np.save(d / "v.npy", photo_like_volume(SHAPE, "uint16", seed=11))
    return d


def config(d: Path, out: str | Path, name: str = "t.toml") -> Path:
    p = d / name
    # 24 ranges of 4 rows (one slab of every level: tiles of 1 row, levels cut dimension 0 by 2 and 4)
    p.write_text(f"""
[source]
path = "v.npy"
format = "npy"

[tiles]
chunks = [1, 32, 32]
shards = [1, 64, 64]
backend = "cpu"

[multiscale]
levels = 3

[output]
path = "{out}"

[build]
task_mb = 0.01
""")
    return p


NRANGES = 24


def tree(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def etl(cli, cfg: Path, *args) -> dict:
    r = cli("etl", "--config", cfg, "--json", *args)
    assert r.code == 0, r.err
    return r.json()


@pytest.fixture(scope="module")
def reference(volume) -> dict[str, bytes]:
    """An uninterrupted run (local executor, one compression thread)."""
    from warpdata.cli.app import main

    dest = volume / "ref.zarr"
    assert main(["etl", "--config", str(config(volume, dest, "ref.toml")), "-j", "1", "-q"]) == 0
    return tree(dest)


def reads_back(path: str | Path, volume: Path) -> None:
    """zarr-python and tensorstore read every level; level 0 is the input."""
    import tensorstore as ts
    import zarr

    vol = np.load(volume / "v.npy")
    np.testing.assert_array_equal(zarr.open_array(str(Path(path) / "0"), mode="r")[...], vol)
    t = ts.open({"driver": "zarr3", "kvstore": {"driver": "file", "path": str(Path(path) / "0")}}).result()
    np.testing.assert_array_equal(t.read().result(), vol)
    lvl2 = zarr.open_array(str(Path(path) / "2"), mode="r")[...]
    t2 = ts.open({"driver": "zarr3", "kvstore": {"driver": "file", "path": str(Path(path) / "2")}}).result()
    np.testing.assert_array_equal(t2.read().result(), lvl2)


def local_receipts(parent: Path) -> list[Path]:
    return sorted(parent.glob(".warp-tmp-build-*/receipts/range-*.json"))


def kill_local(volume: Path, out: Path, receipts: int, *args: str, delay: float = 0.0) -> int | None:
    """Run until ``receipts`` receipts exist (+ ``delay``), kill; the receipts left, or None when the run
    finished first. Nothing but a complete array is ever under the output name."""
    cfg = config(volume, out, f"{out.name}.toml")
    proc = spawn_etl(cfg, *args)
    kill_when(proc, lambda: len(local_receipts(out.parent)) >= receipts, delay)
    if out.exists():
        assert (out / "manifest.json").exists() and (out / "zarr.json").exists()  # complete, never half
        return None
    return len(local_receipts(out.parent))


def rerun_matches(cli, volume, reference, out: Path, done: int, *args: str) -> dict:
    res = etl(cli, config(volume, out, f"{out.name}.toml"), *args)
    assert res["status"] == "built"
    assert (res["ranges"], res["ranges_reused"], res["ranges_built"]) == (NRANGES, done, NRANGES - done)
    assert tree(out) == reference
    assert not list(out.parent.glob(".warp-tmp-build-*"))  # the build directory and its lock are gone
    return res


def test_an_uninterrupted_run_counts_its_ranges_and_a_rerun_is_up_to_date(cli, volume, reference, tmp_path):
    out = tmp_path / "o.zarr"
    res = etl(cli, config(volume, out), "-j", "2")
    assert (res["ranges"], res["ranges_reused"], res["ranges_built"]) == (NRANGES, 0, NRANGES)
    assert tree(out) == reference
    res = etl(cli, config(volume, out), "-j", "2")
    assert res["status"] == "up-to-date" and "ranges_built" not in res


def test_the_manifest_covers_every_object_through_the_hash_chain(volume, reference):
    """Each level's sha256 is over its slab digests, each over its objects' SHA-256s; zarr.json hashed too."""
    import hashlib

    from warpdata.tiles.digests import level_digest, slab_digest

    m = json.loads(reference["manifest.json"])
    assert set(m["metadata_sha256"]) == {"zarr.json", "0/zarr.json", "1/zarr.json", "2/zarr.json"}
    for key, digest in m["metadata_sha256"].items():
        assert hashlib.sha256(reference[key]).hexdigest() == digest
    for lv in m["levels"]:
        rows, grid = lv["shape"][0], [-(-s // c) for s, c in zip(lv["shape"][1:], lv["shards"][1:], strict=True)]
        slabs = []
        for z in range(rows):  # one tile row per slab; objects in the grid's C order
            keys = [f"{lv['path']}/c/{z}/{y}/{x}" for y in range(grid[0]) for x in range(grid[1])]
            slabs.append(slab_digest((k.split("/", 1)[1], hashlib.sha256(reference[k]).hexdigest()) for k in keys))
        assert level_digest(slabs) == lv["sha256"]


@pytest.mark.parametrize(("receipts", "args"), [(1, ("-j", "1")), (5, ("-j", "1")),
                                                (3, ("-j", "2", "--executor", "process"))],
                         ids=["local-1", "local-5", "process-3"])
def test_kill_driver_then_rerun_builds_only_unreceipted_ranges(cli, volume, reference, tmp_path, receipts, args):
    out = tmp_path / "o.zarr"
    for _attempt in range(5):
        done = kill_local(volume, out, receipts, *args)
        if done is not None:
            break
        shutil.rmtree(out)  # finished between two polls: try again
    else:
        pytest.skip("the build finished before it could be killed, 5 times")
    assert receipts <= done <= NRANGES
    rerun_matches(cli, volume, reference, out, done, *args)
    reads_back(out, volume)


def test_a_run_killed_on_one_executor_resumes_on_another(cli, volume, reference, tmp_path):
    """The range plan never follows the executor or the worker count: receipts of a local run
    killed at -j 1 are reused by a process pool at -j 2. With the default task size this small
    array is cut by the minimum range count alone (once it was one range for a local run and two
    for two workers)."""
    for j, ex in (("1", ()), ("2", ("--executor", "process")), ("3", ("--executor", "process"))):
        whole = tmp_path / f"plan-{j}-{len(ex)}"
        whole.mkdir()
        c = config(volume, whole / "o.zarr", f"plan-{j}-{len(ex)}.toml")
        c.write_text(c.read_text().replace("task_mb = 0.01", "task_mb = 64"))
        assert etl(cli, c, "-j", j, *ex)["ranges"] == 12, (j, ex)  # one plan for every executor and -j
    out = tmp_path / "o.zarr"
    cfg = config(volume, out, "big-tasks.toml")
    cfg.write_text(cfg.read_text().replace("task_mb = 0.01", "task_mb = 64"))
    for _attempt in range(5):
        proc = spawn_etl(cfg, "-j", "1")
        kill_when(proc, lambda: len(local_receipts(tmp_path)) >= 3)
        done = None if out.exists() else len(local_receipts(tmp_path))
        if done is not None:
            break
        shutil.rmtree(out)
    else:
        pytest.skip("the build finished before it could be killed, 5 times")
    res = etl(cli, cfg, "-j", "2", "--executor", "process")
    assert res["ranges"] == 12 and res["ranges_reused"] == done >= 3 and res["ranges_built"] == 12 - done
    assert tree(out) == reference


@pytest.mark.parametrize("args", [(), ("--executor", "process", "-j", "2")], ids=["local", "process"])
def test_a_failure_that_is_not_the_datas_keeps_the_receipts(cli, volume, reference, tmp_path, monkeypatch, args):
    """An unreachable store (or Ctrl-C, or a lost worker) stops the run like a kill -9 does: what
    is receipted stays and the rerun resumes from it. Only bad data or config start afresh."""
    from warpdata.core.errors import InfrastructureError
    from warpdata.etl import receipts

    real = receipts.Journal.record
    calls = []

    def record(self, *a, **k):
        calls.append(a[0])
        if len(calls) == 5:
            raise InfrastructureError("the store stopped answering", hint="rerun")
        return real(self, *a, **k)

    out = tmp_path / "o.zarr"
    cfg = config(volume, out)
    monkeypatch.setattr(receipts.Journal, "record", record)
    r = cli("etl", "--config", cfg, "--json", *args)
    assert r.code == 75, r.err
    assert not out.exists()  # no half array under the output name
    monkeypatch.setattr(receipts.Journal, "record", real)
    rerun_matches(cli, volume, reference, out, 4, *args)


def test_the_build_directory_is_a_sibling_of_the_output():
    from warpdata.tiles.build import build_base

    # a top-level output's build directory is its sibling under /, not inside it
    assert build_base("file", "/tiles", "0123456789abcdef", "/tiles") == "/.warp-tmp-build-0123456789ab-tiles"
    assert build_base("s3", "b/x/v.zarr", "0123456789abcdef", "s3://b/x/v.zarr") == \
        "b/x/.warp-tmp-build-0123456789ab-v.zarr"


def test_a_bucket_root_output_is_refused(cli, volume, s3):
    cfg = config(volume, f"s3://{s3.bucket}", "root.toml")
    s3.reset_counts()
    r = cli("etl", "--config", cfg)
    assert r.code == 78, r.err
    assert "bucket's root" in r.err and f"s3://{s3.bucket}/volume.zarr" in r.err
    assert s3.count("PUT") == 0


def test_a_receipt_is_trusted_only_when_its_objects_still_hash_to_it(cli, volume, reference, tmp_path):
    """A chunk object changed under its receipt, or a receipt naming another task: that range is rebuilt."""
    out = tmp_path / "o.zarr"
    done = kill_local(volume, out, 6, "-j", "1")
    if done is None:
        pytest.skip("the build finished before it could be killed")
    build = next(tmp_path.glob(".warp-tmp-build-*-o.zarr"))
    assert done >= 6 and not (build / "manifest.json").exists()
    # range 0 holds rows 0-3: level 1 slab 0 (rows 0-1 of level 0) is its object 1/c/0/0/0
    victim = build / "1" / "c" / "0" / "0" / "0"
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0xFF
    victim.write_bytes(bytes(data))
    r1 = build / "receipts" / "range-00001.json"
    doc = json.loads(r1.read_text())
    doc["task_sha256"] = "0" * 64
    r1.write_text(json.dumps(doc))
    res = etl(cli, config(volume, out, "o.zarr.toml"), "-j", "1")
    assert (res["ranges_reused"], res["ranges_built"]) == (done - 2, NRANGES - done + 2)
    assert tree(out) == reference
    reads_back(out, volume)


def test_a_changed_input_invalidates_the_journal(cli, volume, reference, tmp_path):
    """The receipts bind the input's fingerprint: a rerun on another input builds every range afresh."""
    d = tmp_path / "in"
    d.mkdir()
    shutil.copy(volume / "v.npy", d / "v.npy")
    out = tmp_path / "o.zarr"
    cfg = config(d, out)
    proc = spawn_etl(cfg, "-j", "1")
    kill_when(proc, lambda: len(local_receipts(tmp_path)) >= 4)
    if out.exists():
        pytest.skip("the build finished before it could be killed")
    vol = np.load(d / "v.npy")
    vol[0, 0, 0] ^= 1
    np.save(d / "v.npy", vol)
    res = etl(cli, cfg, "-j", "1")
    assert (res["ranges_reused"], res["ranges_built"]) == (0, NRANGES)
    assert tree(out) != reference
    assert len(list(tmp_path.glob(".warp-tmp-build-*"))) == 0  # the stale build went with the new one's commit
    import zarr

    np.testing.assert_array_equal(zarr.open_array(str(out / "0"), mode="r")[...], vol)


@pytest.mark.slow
@pytest.mark.parametrize("trial", range(10))
def test_kill_driver_at_random_points(cli, volume, reference, tmp_path, trial):
    """Killed after a random number of receipts plus a random delay (sometimes mid-commit or after it):
    never a half array, and the rerun completes it byte-identically."""
    rng = random.Random(trial)
    args = ("-j", "1") if trial % 2 == 0 else ("-j", "2", "--executor", "process")
    out = tmp_path / "o.zarr"
    done = kill_local(volume, out, rng.randrange(0, NRANGES + 1), *args, delay=rng.random() * 0.05)
    if done is None:  # killed after the commit: the output is whole and a rerun is up to date
        assert tree(out) == reference
        assert etl(cli, config(volume, out, "o.zarr.toml"), *args)["status"] == "up-to-date"
        return
    rerun_matches(cli, volume, reference, out, done, *args)


# -- output on object storage -------------------------------------------------

def _s3_tree(s3, prefix: str) -> dict[str, bytes]:
    out = {}
    for page in s3.client.get_paginator("list_objects_v2").paginate(Bucket=s3.bucket, Prefix=prefix + "/"):
        for o in page.get("Contents", []):
            out[o["Key"][len(prefix) + 1:]] = s3.client.get_object(Bucket=s3.bucket, Key=o["Key"])["Body"].read()
    return out


def _s3_receipts(s3) -> list[str]:
    r = s3.client.list_objects_v2(Bucket=s3.bucket, Prefix=".warp-tmp-build-")
    return [o["Key"] for o in r.get("Contents", []) if "/receipts/range-" in o["Key"]]


def test_s3_kill_then_resume_from_the_store_alone(cli, volume, reference, tmp_path, s3):
    """The journal lives beside the s3:// output: a killed driver's rerun reuses the receipted ranges
    (checking each object's SHA-256), rebuilds a range whose object changed, and the array at the prefix
    is the local reference's, read back by zarr-python and tensorstore."""
    url = s3.url("o.zarr")
    cfg = config(volume, url, "s3.toml")
    proc = spawn_etl(cfg, "-j", "1")
    kill_when(proc, lambda: len(_s3_receipts(s3)) >= 4)
    got = _s3_tree(s3, "o.zarr")
    if "manifest.json" in got:
        pytest.skip("the build finished before it could be killed")
    assert "zarr.json" not in got  # nothing a Zarr reader opens: no half array is visible
    done = len(_s3_receipts(s3))
    # a changed object under a receipt (range 0's level-0 object): that range is rebuilt
    s3.client.put_object(Bucket=s3.bucket, Key="o.zarr/0/c/0/0/0", Body=b"not the chunk")
    s3.reset_counts()
    res = etl(cli, cfg, "-j", "1")
    assert (res["ranges_reused"], res["ranges_built"]) == (done - 1, NRANGES - done + 1)
    # the journal listed once, each receipt read once (one GET), the rebuilt ranges receipted once
    # each (warp/etl/driver.py; docs/design.md §11 counts these requests)
    rep = res["receipts"]
    assert (rep["listed"], rep["read"], rep["dropped"], rep["written"]) == (1, done, 1, NRANGES - done + 1)
    assert len([q for q in s3.requests("GET") if "/receipts/range-" in q["key"]]) == done
    assert len([q for q in s3.requests("PUT") if "/receipts/range-" in q["key"]]) == NRANGES - done + 1
    got = _s3_tree(s3, "o.zarr")
    assert got == reference
    assert _s3_receipts(s3) == []
    assert s3.client.list_objects_v2(Bucket=s3.bucket, Prefix=".warp-tmp-build-").get("KeyCount") == 0
    local = tmp_path / "copy.zarr"
    for k, v in got.items():
        (local / k).parent.mkdir(parents=True, exist_ok=True)
        (local / k).write_bytes(v)
    reads_back(local, volume)
    # a third run finds the finished array of this recipe and input: up to date, as a local output is
    s3.reset_counts()
    r = cli("etl", "--config", cfg, "-j", "1", "--json")
    assert r.code == 0, r.err
    assert r.json()["status"] == "up-to-date"
    assert s3.count("PUT") == 0 and s3.count("DELETE") == 0
    assert _s3_tree(s3, "o.zarr") == reference
    # another input (same shape, other values) at the same prefix is not this array: --clear or nothing
    other = tmp_path / "other.npy"
    np.save(other, np.load(volume / "v.npy")[::-1].copy())
    r = cli("etl", "--config", cfg, "-j", "1", "--input", other)
    assert r.code == 78 and "already exists" in r.err


def test_s3_prefix_of_another_build_needs_clear(cli, volume, tmp_path, s3):
    """Objects at the prefix that no journal of this build names are not resumed: --clear or nothing."""
    s3.client.put_object(Bucket=s3.bucket, Key="o.zarr/stray", Body=b"x")
    cfg = config(volume, s3.url("o.zarr"), "s3b.toml")
    r = cli("etl", "--config", cfg, "-j", "1")
    assert r.code == 78 and "already exists" in r.err
    res = etl(cli, cfg, "-j", "1", "--clear")
    assert (res["ranges_reused"], res["ranges_built"]) == (0, NRANGES)
    assert "stray" not in _s3_tree(s3, "o.zarr")


def test_inspect_verify_checks_the_content_hashes(cli, volume, reference, tmp_path):
    """`warp inspect --verify` rehashes every object against the manifest's level digests."""
    out = tmp_path / "o.zarr"
    for k, v in reference.items():
        (out / k).parent.mkdir(parents=True, exist_ok=True)
        (out / k).write_bytes(v)
    r = cli("inspect", "--verify", out)
    assert r.code == 0 and "3 level(s) hashed" in r.out, r.out + r.err
    m = json.loads(reference["manifest.json"])
    m["levels"][1]["sha256"] = "0" * 64
    (out / "manifest.json").write_text(json.dumps(m))
    r = cli("inspect", "--verify", out)
    assert r.code != 0 and "level sha256" in r.out + r.err


def test_s3_rerun_of_a_finished_array_is_up_to_date(cli, volume, reference, s3):
    """The same successful command again: up to date, nothing written (it was exit 78 "already exists")."""
    cfg = config(volume, s3.url("u.zarr"), "s3u.toml")
    first = etl(cli, cfg, "-j", "2")
    assert first["ranges_built"] == NRANGES
    s3.reset_counts()
    r = cli("etl", "--config", cfg, "-j", "2", "--json")
    assert r.code == 0, r.err
    assert r.json()["status"] == "up-to-date" and r.json()["path"] == s3.url("u.zarr")
    assert s3.count("PUT") == 0 and s3.count("DELETE") == 0
    assert _s3_tree(s3, "u.zarr") == reference
