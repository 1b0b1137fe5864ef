"""The tiled Zarr ETL on the ETL kit (docs/formats/zarr-tiles.md, "On an executor").

The local executor streams through one process's TileWriter (1 or 2 compression
threads); process pools and a Dask cluster (2 worker processes on 127.0.0.1, one
per module) run range tasks, each a pure function of its input rows. Every
object, ``zarr.json`` and the manifest are byte-identical across them, for one
level and for a pyramid whose levels cut dimension 0 differently.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from support.clusters import dask_cluster


@pytest.fixture(scope="module")
def cluster():
    with dask_cluster() as c:
        yield c


@pytest.fixture(scope="module")
def volume(tmp_path_factory) -> Path:
    from warpdata.sampledata.volume import photo_like_volume

    d = tmp_path_factory.mktemp("tiles-kit")
    vol = photo_like_volume((37, 50, 70), "uint16", seed=7)  # odd sizes: edge tiles, odd pyramid rows
    (d / "v.raw").write_bytes(vol.tobytes())
    np.save(d / "v.npy", vol)
    return d


CASES = {
    "one-level": ("v.raw", 'format = "raw"\nshape = [37, 50, 70]\ndtype = "u16"', "chunks = [4, 16, 16]", 1),
    "pyramid": ("v.npy", 'format = "npy"', 'chunks = [3, 16, 32]\nshards = [3, 32, 64]', 3),
}


def config(d: Path, case: str, out: Path, build: str = "", name: str | None = None) -> Path:
    src, source, tiles, levels = CASES[case]
    p = d / (name or f"{case}.toml")
    p.write_text(f"""
[source]
path = "{src}"
{source}

[tiles]
{tiles}
backend = "cpu"

[multiscale]
levels = {levels}

[output]
path = "{out}"

[build]
task_mb = 0.01
{build}
""")
    return p


def tree(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def etl(cli, cfg: Path, *args) -> dict:
    r = cli("etl", "--config", cfg, "--json", *args)
    assert r.code == 0, r.err
    return r.json()


@pytest.fixture(scope="module")
def reference(volume) -> dict[str, dict[str, bytes]]:
    """Each case through the single-process streaming writer with one compression thread."""
    from warpdata.cli.app import main

    out = {}
    for case in CASES:
        dest = volume / f"ref-{case}.zarr"
        assert main(["etl", "--config", str(config(volume, case, dest, name=f"ref-{case}.toml")), "-j", "1",
                     "--executor", "local", "-q"]) == 0
        out[case] = tree(dest)
    return out


def test_the_reference_reads_back(volume, reference):
    import zarr

    vol = np.load(volume / "v.npy")
    arr = zarr.open_array(str(volume / "ref-one-level.zarr"), mode="r")
    np.testing.assert_array_equal(arr[...], vol)
    lvl1 = zarr.open_array(str(volume / "ref-pyramid.zarr" / "1"), mode="r")
    assert lvl1.shape == (19, 25, 35)
    m = json.loads(reference["pyramid"]["manifest.json"])
    assert [lv["path"] for lv in m["levels"]] == ["0", "1", "2"]


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("args", [["-j", "2"], ["-j", "2", "--executor", "process"]], ids=["threads-2", "process-2"])
def test_local_executors_give_the_reference_bytes(cli, volume, reference, tmp_path, case, args):
    res = etl(cli, config(volume, case, tmp_path / "o.zarr"), *args)
    assert res["executor"] == args[-1] if "--executor" in args else res["executor"] == "local"
    assert tree(tmp_path / "o.zarr") == reference[case]


@pytest.mark.parametrize("case", list(CASES))
def test_dask_cluster_gives_the_reference_bytes(cli, volume, reference, tmp_path, cluster, case):
    res = etl(cli, config(volume, case, tmp_path / "o.zarr"), "--executor", f"dask://{cluster.address}")
    assert res["cluster"]["executor"] == "dask" and res["cluster"]["workers"] == 2
    assert tree(tmp_path / "o.zarr") == reference[case]


@pytest.mark.slow
def test_ray_gives_the_reference_bytes(cli, volume, reference, tmp_path):
    pytest.importorskip("ray", reason="ray is not installed here (the ray extra)")
    res = etl(cli, config(volume, "pyramid", tmp_path / "o.zarr"), "--executor", "ray", "-j", "2")
    assert res["cluster"]["executor"] == "ray"
    assert tree(tmp_path / "o.zarr") == reference["pyramid"]


def test_range_plan_keeps_every_level_whole(volume):
    """Every task holds whole slabs of every level: level l's rows [a/2^l, b/2^l) start on its tile."""
    from warpdata.tiles.build import plan_ranges
    from warpdata.tiles.writer import TileWriter

    w = TileWriter(volume / "plan.zarr", (37, 50, 70), "uint16", (3, 16, 32), shards=(3, 32, 64), levels=3,
                   backend="cpu", threads=1)
    try:
        ranges = plan_ranges(w, task_bytes=1)
        assert ranges[0][0] == 0 and ranges[-1][1] == 37 and len(ranges) > 3
        assert all(b == c for (_, b), (c, _) in zip(ranges, ranges[1:], strict=False))
        # tiles along dimension 0: 3 at every level (min(3, size)); rows per level row: 1, 2, 4
        assert all(a % 12 == 0 for a, _ in ranges)
    finally:
        w.abort()
    assert not (volume / "plan.zarr").exists()


def test_crc32c_combine_matches_one_pass():
    import os

    from warpdata.formats import crc
    from warpdata.tiles.digests import crc32c_combine

    parts = [os.urandom(n) for n in (0, 1, 7, 4096, 100_003)]
    acc = 0
    for p in parts:
        acc = crc32c_combine(acc, crc.extend(0, p), len(p))
    assert acc == crc.extend(0, b"".join(parts))


def test_stdin_cannot_go_to_workers(cli, volume, tmp_path):
    r = cli("etl", "--config", config(volume, "one-level", tmp_path / "o.zarr"), "--input", "-",
            "--executor", "process")
    assert r.code == 78 and "stdin" in r.err
    assert not (tmp_path / "o.zarr").exists()


@pytest.mark.parametrize("bad", ["abc", "0"])
def test_warp_workers_is_parsed_in_one_place(cli, volume, tmp_path, monkeypatch, bad):
    monkeypatch.setenv("WARP_WORKERS", bad)
    r = cli("etl", "--config", config(volume, "one-level", tmp_path / "o.zarr"), "--executor", "process")
    assert r.code == 78 and "WARP_WORKERS" in r.err


def test_bad_executor_key_names_itself(cli, volume, tmp_path):
    r = cli("etl", "--config", config(volume, "one-level", tmp_path / "o.zarr", 'executor = "spark"', "bad.toml"))
    assert r.code == 78 and "build.executor" in r.err


def test_a_missing_dask_extra_names_the_pip_line(volume, tmp_path):
    cfg = config(volume, "one-level", tmp_path / "o.zarr", name="nodask.toml")
    code = ("import sys; sys.modules['distributed'] = None; from warpdata.cli.app import main; "
            f"sys.exit(main(['etl', '--config', {str(cfg)!r}, '--executor', 'dask']))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 78, r.stderr
    assert "pip install 'dask" in r.stderr and not (tmp_path / "o.zarr").exists()


def test_s3_input_and_output_on_a_process_pool(cli, volume, reference, tmp_path, s3, monkeypatch):
    """Workers read their own byte ranges of an s3:// input and put their objects into the s3:// output;
    the driver puts zarr.json and the manifest last. The objects are the local reference's."""
    size = (volume / "v.npy").stat().st_size
    s3.client.put_object(Bucket=s3.bucket, Key="in/v.npy", Body=(volume / "v.npy").read_bytes())
    s3.reset_counts()
    cfg = config(volume, "pyramid", tmp_path / "unused", name="s3.toml")
    out = s3.url("out.zarr")
    env = {**s3.env}
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    # a process of its own: a process pool's forkserver keeps the environment it started with
    import os

    r = subprocess.run([sys.executable, "-m", "warpdata", "etl", "--config", str(cfg), "--json", "--input",
                        s3.url("in/v.npy"), "--output", out, "--executor", "process", "-j", "2"],
                       capture_output=True, text=True, timeout=300, env={**os.environ, **env})
    assert r.returncode == 0, r.stderr[-3000:]
    keys = sorted(o["Key"] for o in s3.client.list_objects_v2(Bucket=s3.bucket, Prefix="out.zarr/")["Contents"])
    got = {k[len("out.zarr/"):]: s3.client.get_object(Bucket=s3.bucket, Key=k)["Body"].read() for k in keys}
    ref = dict(reference["pyramid"])
    ref_m, got_m = json.loads(ref.pop("manifest.json")), json.loads(got.pop("manifest.json"))
    assert got == ref
    assert got_m == ref_m
    # the input is read about once: each task its own rows, the driver the .npy header
    read = 0
    for q in s3.requests("GET", "in/v.npy"):
        lo, hi = q["range"].split("=", 1)[1].split("-")
        read += min(int(hi), size - 1) - int(lo) + 1
    assert size <= read <= size + (64 << 10), (read, size)
    puts = [q["key"] for q in s3.requests("PUT", "out.zarr/")]
    assert puts[-1] == "out.zarr/manifest.json" and puts[-2] == "out.zarr/zarr.json"
