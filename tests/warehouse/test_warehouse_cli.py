"""warp inspect on warehouses and TWH1 shards; python -m warpdata.sampledata detection; the demo flow."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from warpdata.sampledata.detection import generate

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def wh(tmp_path_factory):
    from warpdata.cli.app import main

    d = tmp_path_factory.mktemp("cli") / "coco"
    generate(d, count=12, seed=2, min_side=64, max_side=120)
    assert main(["-q", "etl", "--config", str(d / "transform.toml")]) == 0
    return next((d.parent / "warehouse").glob("v*"))


def test_inspect_warehouse_json(cli, wh):
    r = cli("inspect", wh, "--json")
    assert r.code == 0, r.err
    d = r.json()
    assert d["kind"] == "tensor-warehouse" and d["samples"] == 8 and len(d["version"]) == 64
    assert d["validation"]["aggregate"]["total"] == 12
    assert d["transform"]["target_size"] == [320, 320]


def test_inspect_warehouse_human_with_verify_and_head(cli, wh):
    r = cli("inspect", wh, "--verify", "--head", "2")
    assert r.code == 0, r.err
    assert "quarantine reasons" in r.out and "missing-file" in r.out and "ok" in r.out
    assert "images/img_00000.jpg" in r.out


def test_inspect_shard(cli, wh):
    shard = next(wh.glob("*.twh1"))
    r = cli("inspect", shard, "--json", "--verify")
    assert r.code == 0
    d = r.json()
    assert d["kind"] == "twh1-shard" and d["header"]["width"] == 320 and d["verified"] is True


def test_inspect_verify_finds_corruption(cli, wh, tmp_path):
    import shutil

    copy = tmp_path / wh.name
    shutil.copytree(wh, copy)
    shard = next(copy.glob("*.twh1"))
    raw = bytearray(shard.read_bytes())
    raw[4096 + 50] ^= 1  # a pixel: only the checksum can tell
    shard.write_bytes(bytes(raw))
    r = cli("inspect", copy, "--verify")
    assert r.code == 1 and "CORRUPT" in r.out and "SHA-256 mismatch" in r.err
    r = cli("inspect", shard, "--verify")
    assert r.code == 1
    assert cli("inspect", copy).code == 0  # without --verify nothing is read


def test_inspect_manifest_file_and_sniffing(cli, wh):
    r = cli("inspect", wh / "manifest.json", "--json")
    assert r.code == 0 and r.json()["kind"] == "tensor-warehouse"


def test_sampledata_cli_writes_configs_that_build_the_demo_layout(tmp_path):
    out = tmp_path / "demo-out" / "coco"
    r = subprocess.run([sys.executable, "-m", "warpdata.sampledata", "detection", str(out), "--count", "16"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    info = json.loads(r.stdout)
    assert set(info["broken"]) == {"missing", "truncated", "corrupt-scan", "out-of-bounds", "exif-rotated"}
    for cfg in info["configs"]:
        r = subprocess.run([sys.executable, "-m", "warpdata", "etl", "-q", "--config", str(out / cfg)],
                           capture_output=True, text=True, timeout=120, cwd=tmp_path)
        assert r.returncode == 0, r.stderr
        p = Path(r.stdout.strip())
        assert p.parent == tmp_path / "demo-out" / "warehouse" and p.name.startswith("v")


def test_sampledata_is_deterministic(tmp_path):
    generate(tmp_path / "a", count=9, seed=4, min_side=40, max_side=60)
    generate(tmp_path / "b", count=9, seed=4, min_side=40, max_side=60)
    files = sorted(p.relative_to(tmp_path / "a") for p in (tmp_path / "a").rglob("*") if p.is_file())
    assert files
    for f in files:
        assert (tmp_path / "a" / f).read_bytes() == (tmp_path / "b" / f).read_bytes(), f


def test_example_config_is_valid_and_documents_every_key():
    import tomllib

    from warpdata.core.config import ConfigSource, describe
    from warpdata.warehouse import config as wconfig

    path = ROOT / "examples" / "transform.toml"
    text = path.read_text()
    cfg = wconfig.load(tomllib.loads(text), ConfigSource(str(path), text), path)
    assert cfg.format == "coco" and cfg.dtype == "u8" and cfg.width == 640
    for key, *_ in describe(wconfig.SCHEMA):
        leaf = key.rsplit(".", 1)[-1]
        if key.startswith("validation.max_") and leaf in ("warn", "fail"):
            leaf = key.split(".")[1]
        assert f"{leaf} =" in text, f"examples/transform.toml does not show {key}"
