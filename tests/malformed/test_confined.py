"""Manifest file names confined to the artifact (issue 36): a warehouse or feature-cache manifest that
names a shard or side file by an absolute path, ``..``, a special file (``/dev/zero``, a FIFO) or a
symlink out of the artifact is refused before the file is opened: a typed DataError naming the
manifest and the entry (exit 65; `warp inspect --verify` reports it as corruption, exit 1)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from warpdata.core.canonical import seal
from warpdata.core.confined import UnconfinedPathError, confined
from warpdata.core.errors import DataError


@pytest.fixture(scope="module")
def built_warehouse(tmp_path_factory) -> Path:
    from support.warehouses import coco_config
    from warpdata.cli.app import main
    from warpdata.sampledata.detection import generate

    d = tmp_path_factory.mktemp("confined") / "coco"
    generate(d, count=6, seed=5, min_side=64, max_side=96)
    cfg = coco_config(d, d.parent / "warehouse", labels="annotations.json")
    assert main(["-q", "etl", "--config", str(cfg)]) == 0
    return next((d.parent / "warehouse").glob("v*"))


@pytest.fixture
def warehouse(built_warehouse, tmp_path) -> Path:
    d = tmp_path / "wh"
    shutil.copytree(built_warehouse, d)
    return d


def _edit(d: Path, edit) -> None:
    m = d / "manifest.json"
    doc = json.loads(m.read_bytes())
    edit(doc)
    m.write_text(json.dumps(seal(doc)))


def test_helper(tmp_path):
    (tmp_path / "a").write_bytes(b"x")
    assert confined(tmp_path, "a", "m.json") == tmp_path / "a"
    assert confined(tmp_path, "missing", "m.json") == tmp_path / "missing"
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "out").symlink_to("/etc/hostname")
    (tmp_path / "sub").mkdir()
    for name, why in [("/dev/zero", "absolute"), ("../a", "'..'"), ("sub/../../a", "'..'"), ("fifo", "regular"),
                      ("out", "outside"), ("sub", "regular"), ("", "not a file name"), (3, "not a file name")]:
        with pytest.raises(UnconfinedPathError, match=why) as e:
            confined(tmp_path, name, "m.json", entry="shard path")
        assert e.value.exit_code == 65 and str(e.value).startswith("m.json: shard path")


SIDE_CASES = {
    "samples_dev_zero": lambda doc: doc["files"].update(samples="/dev/zero"),
    "sources_dotdot": lambda doc: doc["files"].update(sources="../../../etc/passwd"),
}


@pytest.mark.parametrize("case", sorted(SIDE_CASES))
def test_warehouse_side_file_names(cli, warehouse, case):
    from warpdata.warehouse import reader

    _edit(warehouse, SIDE_CASES[case])
    entry = "files.samples" if "samples" in case else "files.sources"
    r = cli("inspect", warehouse)
    assert r.code == 65, (r.code, r.err)
    assert "manifest.json" in r.err and entry in r.err
    r = cli("inspect", "--verify", warehouse)
    assert r.code == 1 and entry in r.out + r.err, (r.code, r.out, r.err)
    r = cli("why", warehouse, "0")
    assert r.code == 65 and entry in r.err, (r.code, r.err)
    with pytest.raises(DataError, match=entry):
        reader.open(warehouse)


def test_warehouse_shard_fifo(cli, warehouse):
    from warpdata.warehouse import reader

    shard = json.loads((warehouse / "manifest.json").read_bytes())["shards"][0]["relative_path"]
    (warehouse / shard).unlink()
    os.mkfifo(warehouse / shard)  # opening it would block the reader for ever
    r = cli("inspect", "--verify", warehouse)
    assert r.code == 1 and "not a regular file" in r.out + r.err, (r.code, r.out, r.err)
    r = cli("why", warehouse, "0")
    assert r.code == 65 and "not a regular file" in r.err, (r.code, r.err)
    with pytest.raises(DataError, match="not a regular file"):
        reader.open(warehouse)


def test_warehouse_shard_symlink_out(cli, warehouse, tmp_path):
    shard = json.loads((warehouse / "manifest.json").read_bytes())["shards"][0]["relative_path"]
    outside = tmp_path / "elsewhere.twh1"
    shutil.move(warehouse / shard, outside)
    (warehouse / shard).symlink_to(outside)
    r = cli("inspect", warehouse)
    assert r.code == 65 and "resolves outside the artifact" in r.err, (r.code, r.err)


def test_feature_cache_shard_fifo(cli, tmp_path):
    import importlib.util

    from warpdata.features import manifest as fmanifest

    root = Path(__file__).resolve().parents[2]
    spec = importlib.util.spec_from_file_location("features_golden", root / "tests/golden/features/make_golden.py")
    golden = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(golden)
    golden.make_sources(tmp_path)
    cache = Path(golden.build("pixels-multi", tmp_path, workers=1, executor="local"))
    shard = json.loads((cache / "manifest.json").read_bytes())["shards"][0]["path"]
    (cache / shard).unlink()
    os.mkfifo(cache / shard)
    with pytest.raises(DataError, match="not a regular file"):
        fmanifest.read(cache)
    r = cli("inspect", cache)
    assert r.code == 65 and "not a regular file" in r.err, (r.code, r.err)


@pytest.mark.parametrize("name", ["../../../etc/hostname", "/dev/zero"])
def test_warehouse_side_tables_names_are_confined(cli, warehouse, name):
    # issue 36: side_tables names a file to hash; one outside the version is refused, never read
    from warpdata.warehouse import reader

    _edit(warehouse, lambda doc: doc["side_tables"].update({name: {"sha256": "0" * 64, "size_bytes": 0}}))
    r = cli("inspect", warehouse)
    assert r.code == 65 and "side_tables entry" in r.err, (r.code, r.err)
    r = cli("inspect", "--verify", warehouse)
    assert r.code == 1 and "side_tables entry" in r.out + r.err, (r.code, r.out, r.err)
    r = cli("publish", "ws/x", "--from", warehouse, "--store", warehouse.parent / "store")
    assert r.code == 65 and "side_tables entry" in r.err, (r.code, r.err)
    with pytest.raises(UnconfinedPathError, match="side_tables entry"):
        reader.open(warehouse)


def test_warehouse_side_table_swapped_for_another_valid_one(cli, warehouse):
    # a well-formed samples.parquet of another build (same columns, other rows): no Parquet error to
    # catch it, only the manifest's SHA-256 (docs/formats/twh1.md, "Manifest")
    import pyarrow.parquet as pq

    t = pq.read_table(warehouse / "samples.parquet")
    pq.write_table(t.slice(1), warehouse / "samples.parquet")
    r = cli("why", warehouse, "0")
    assert r.code == 65 and "side table samples.parquet does not match" in r.err, (r.code, r.err)
    r = cli("inspect", "--verify", warehouse)
    assert r.code == 1 and "samples.parquet" in r.out + r.err


def test_zarr_level_directory_symlinked_out_is_refused(cli, tmp_path):
    # issue 36: a pyramid's level directory that is a symlink to another array outside the output
    # was followed by `warp inspect` (and --verify, --preview); it is refused, naming the level
    import numpy as np
    from warpdata.tiles.writer import TileWriter

    a = np.arange(2 * 16 * 16, dtype=np.uint16).reshape(2, 16, 16)
    inside, outside = tmp_path / "p.zarr", tmp_path / "elsewhere.zarr"
    for path in (inside, outside):
        with TileWriter(path, a.shape, a.dtype, (1, 8, 8), levels=2, backend="cpu", fsync=False) as w:
            w.write(a)
    assert cli("inspect", "--verify", inside).code == 0
    shutil.rmtree(inside / "1")
    (inside / "1").symlink_to(outside / "1", target_is_directory=True)
    for args in (["inspect", inside], ["inspect", "--verify", inside],
                 ["inspect", inside, "--preview", tmp_path / "x.png"]):
        r = cli(*args)
        assert r.code == 65 and "level directory '1'" in r.out + r.err and "outside" in r.out + r.err, \
            (args, r.code, r.out, r.err)
        assert not (tmp_path / "x.png").exists()
    (inside / "1").unlink()
    (inside / "1").write_bytes(b"")  # not a directory at all
    r = cli("inspect", inside)
    assert r.code == 65 and "level directory '1' is not a directory" in r.err, (r.code, r.err)
