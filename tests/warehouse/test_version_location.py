"""A warehouse version is its content's, not its location's: the same label and image bytes from a
folder (named by the config's relative path or by ``--input``) and from S3 build one version, with
the same shards; the manifest still names where each copy was built from."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from support.warehouses import coco_config
from warpdata.sampledata.detection import generate

pytestmark = pytest.mark.s3


def _etl(cfg: Path, env: dict[str, str], *args: str) -> dict:
    r = subprocess.run([sys.executable, "-m", "warpdata", "etl", "--config", str(cfg), "--json", "-j", "1", *args],
                       capture_output=True, text=True, timeout=300, env={**os.environ, **env})
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def _files(path: str) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(Path(path).iterdir()) if p.name not in ("metrics.json",
                                                                                          "manifest.json")}


def test_the_same_images_from_a_folder_and_from_s3_are_one_version(tmp_path, s3):
    d = tmp_path / "coco"
    generate(d, count=12, seed=7, min_side=64, max_side=120)
    for p in sorted(d.rglob("*")):
        if p.is_file():
            s3.client.put_object(Bucket=s3.bucket, Key=f"src/{p.relative_to(d).as_posix()}", Body=p.read_bytes())
    env = {**s3.env, "WARP_CACHE_DIR": str(tmp_path / "cache")}
    cfg = coco_config(d, tmp_path / "unused")
    copy = tmp_path / "elsewhere" / "coco"  # the same bytes in another folder
    copy.parent.mkdir()
    subprocess.run(["cp", "-a", str(d), str(copy)], check=True)

    builds = {"config path": _etl(cfg, env, "--output", str(tmp_path / "a")),
              "--input folder": _etl(cfg, env, "--input", str(copy), "--output", str(tmp_path / "b")),
              "s3": _etl(cfg, env, "--input", s3.url("src"), "--output", str(tmp_path / "c"))}
    versions = {k: b["fingerprint"] for k, b in builds.items()}
    assert len(set(versions.values())) == 1, versions
    ref = _files(builds["config path"]["path"])
    assert ref and all(_files(b["path"]) == ref for b in builds.values())
    roots = {json.loads((Path(b["path"]) / "manifest.json").read_text())["dataset_root"] for b in builds.values()}
    assert roots == {".", str(copy), s3.url("src")}  # provenance, outside the version
    # built to S3 from the folder: up to date when built again from S3
    first = _etl(cfg, env, "--output", s3.url("wh"))
    again = _etl(cfg, env, "--input", s3.url("src"), "--output", s3.url("wh"))
    assert first["fingerprint"] == again["fingerprint"] == versions["s3"]
    assert again["shards_built"] == 0 and again["shards_reused"] == first["shards"]
