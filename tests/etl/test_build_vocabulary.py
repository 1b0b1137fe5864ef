"""One vocabulary for the three ``warp etl`` pipelines (warp/etl/buildconfig.py, docs/design.md §11):
one ``[build]`` schema (its common keys read by every pipeline, a key of another pipeline refused
naming the key, the file and who reads it), one threshold schema, and the build identity under one
name, ``fingerprint``, in every ``--json`` document."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
from support.featurecache import write_config
from support.warehouses import coco_config
from warpdata.sampledata import captions
from warpdata.sampledata.detection import generate

HEX64 = re.compile(r"^[0-9a-f]{64}$")


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("vocab")
    generate(root / "coco", count=8, seed=5, min_side=48, max_side=80)
    captions.generate(root / "cap" / "a", count=12, seed=1)
    captions.generate(root / "cap" / "b", count=10, seed=2)
    (root / "tiles").mkdir()
    np.arange(16 * 24, dtype="<u2").tofile(root / "tiles" / "in.raw")
    return {"coco": root / "coco", "cap": root / "cap", "tiles": root / "tiles"}


def _tiles_config(d: Path, out: Path, build: str = "") -> Path:
    p = d / "tiles.toml"
    p.write_text(f'[source]\nformat = "raw"\npath = "in.raw"\nshape = [16, 24]\ndtype = "u16"\n'
                 f'[output]\npath = "{out}"\n[tiles]\nchunks = [8, 8]\n[build]\n{build}\n')
    return p


def _configs(inputs: dict[str, Path], tmp_path: Path, build: str) -> dict[str, Path]:
    return {"warehouse": coco_config(inputs["coco"], tmp_path / "wh", build=build, name=f"{tmp_path.name}.toml"),
            "feature cache": write_config(inputs["cap"], tmp_path / "fc", build=build, name=f"{tmp_path.name}.toml"),
            "tiles": _tiles_config(inputs["tiles"], tmp_path / "t.zarr", build)}


@pytest.mark.parametrize(("pipeline", "key", "owner"), [
    ("warehouse", "task_mb = 8", "tiled array"),
    ("warehouse", "decode_threads = 2", "feature cache"),
    ("feature cache", "durable = false", "tensor warehouse"),
    ("tiles", "durable = false", "tensor warehouse"),
    ("tiles", "decode_threads = 2", "feature cache"),
])
def test_another_pipelines_build_key_is_refused_naming_it_the_file_and_who_reads_it(
        cli, inputs, tmp_path, pipeline, key, owner):
    cfg = _configs(inputs, tmp_path, key)[pipeline]
    r = cli("etl", "--config", cfg)
    name = key.split(" ")[0]
    assert r.code == 78, r.err
    assert f"unknown key 'build.{name}'" in r.err and str(cfg) in r.err
    assert f"'{name}' is a {owner} setting" in r.err
    assert r.out == ""


@pytest.mark.parametrize("pipeline", ["warehouse", "feature cache", "tiles"])
def test_a_misspelt_build_key_is_refused_with_a_suggestion(cli, inputs, tmp_path, pipeline):
    cfg = _configs(inputs, tmp_path, "wokers = 2")[pipeline]
    r = cli("etl", "--config", cfg)
    assert r.code == 78 and "unknown key 'build.wokers'" in r.err and "did you mean 'workers'?" in r.err
    assert str(cfg) in r.err


@pytest.mark.parametrize("pipeline", ["warehouse", "feature cache", "tiles"])
def test_the_common_build_keys_and_one_fingerprint_in_every_pipeline(cli, inputs, tmp_path, pipeline):
    cfg = _configs(inputs, tmp_path, 'executor = "local"\nworkers = 2\nresources = { CPU = 1 }')[pipeline]
    r = cli("etl", "--config", cfg, "--json")
    assert r.code == 0, r.err
    first = r.json()
    assert first["status"] == "built" and HEX64.match(first["fingerprint"]), first
    again = cli("etl", "--config", cfg, "--json")
    assert again.code == 0, again.err
    assert again.json()["status"] == "up-to-date" and again.json()["fingerprint"] == first["fingerprint"]


def test_one_threshold_schema_reads_an_integer_as_a_number():
    from warpdata.core.config import ConfigSource
    from warpdata.etl import buildconfig
    from warpdata.features.etl import SCHEMA as FEATURES
    from warpdata.warehouse.config import SCHEMA as WAREHOUSE

    want = buildconfig.threshold_schema()
    for schema in (FEATURES, WAREHOUSE):
        assert {k: schema["validation"][k] for k in want} == want
    from warpdata.core.config import validate

    got = validate({"max_invalid_fraction": {"fail": 0}}, want, ConfigSource("t.toml", ""))
    t = buildconfig.thresholds(got, ConfigSource("t.toml", ""))
    assert t.max_invalid_fraction.fail == 0.0 and isinstance(t.max_invalid_fraction.fail, float)
    assert (t.max_missing_fraction.warn, t.max_missing_fraction.fail) == (0.0, 0.05)


def test_the_fingerprint_is_read_from_every_manifest_under_its_older_names():
    from warpdata.etl.buildconfig import fingerprint_of

    assert fingerprint_of({"fingerprint": "a" * 64}) == "a" * 64  # feature cache
    assert fingerprint_of({"version": "b" * 64, "kind": "tensor-warehouse"}) == "b" * 64  # warehouse
    tiles = fingerprint_of({"recipe_key": "c" * 64, "input_crc32c": "0000002a"})
    assert HEX64.match(tiles) and tiles != fingerprint_of({"recipe_key": "c" * 64, "input_crc32c": "0000002b"})
    assert fingerprint_of({"kind": "zarr-array"}) is None


@pytest.mark.parametrize("pipeline", ["warehouse", "feature cache"])
@pytest.mark.parametrize(("line", "shown"), [
    ("max_invalid_fraction = { warn = 0.1 }", "warn = 0.1 is above fail = 0.05"),  # fail: its default
    ("max_empty_fraction = { warn = 0.9, fail = 0.2 }", "warn = 0.9 is above fail = 0.2"),
])
def test_a_warn_above_its_fail_names_the_threshold_its_line_and_the_file(cli, inputs, tmp_path, pipeline, line,
                                                                          shown):
    cfg = _configs(inputs, tmp_path, "")[pipeline]
    text = re.sub(r"(\[validation\]\n)(max_\w+ = .*\n)*", lambda m: m.group(1) + line + "\n", cfg.read_text())
    cfg.write_text(text)
    lineno = text.splitlines().index(line) + 1
    key = line.split(" ")[0]
    r = cli("etl", "--config", cfg)
    assert r.code == 78 and r.out == ""
    assert f"error: {cfg}:{lineno}: 'validation.{key}': {shown}" in r.err, r.err
    assert "Traceback" not in r.err


@pytest.mark.parametrize("pipeline", ["warehouse", "feature cache", "tiles"])
@pytest.mark.parametrize("port", [0, 99999])
def test_a_dask_address_with_an_impossible_port_is_refused_before_connecting(cli, inputs, tmp_path, pipeline,
                                                                             port):
    cfg = _configs(inputs, tmp_path, f'executor = "dask://127.0.0.1:{port}"')[pipeline]
    r = cli("etl", "--config", cfg)
    assert r.code == 78 and r.out == ""
    assert f"{cfg}:" in r.err and f"'build.executor' names port {port}" in r.err, r.err
