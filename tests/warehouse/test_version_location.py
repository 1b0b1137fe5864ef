"""A warehouse version is its content's, not its location's: the same label and image bytes from a
folder (named by the config's relative path or by ``--input``), from S3 and from a static HTTP host
build one version, with the same shards; the manifest still names where each copy was built from."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from support.httpserve import StaticServer
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


def test_the_same_images_from_a_folder_s3_and_http_are_one_version(tmp_path, s3):
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
    with StaticServer(d) as host:
        builds["http"] = _etl(cfg, env, "--input", host.url, "--output", str(tmp_path / "d"))
        http_url = host.url
        images = [e for e in host.log if e["path"].startswith("/images/")]
    listed = {f"/images/{p.name}" for p in (d / "images").iterdir()}
    # a host is never listed: one HEAD per labelled image (404 for a missing one), one GET per image there
    heads = [e["path"] for e in images if e["method"] == "HEAD"]
    gets = [e["path"] for e in images if e["method"] == "GET"]
    assert len(heads) == len(set(heads)) and set(gets) <= set(heads) and set(gets) == listed & set(heads)
    assert len(gets) == len(set(gets))
    versions = {k: b["fingerprint"] for k, b in builds.items()}
    assert len(set(versions.values())) == 1, versions
    ref = _files(builds["config path"]["path"])
    assert ref and all(_files(b["path"]) == ref for b in builds.values())
    roots = {json.loads((Path(b["path"]) / "manifest.json").read_text())["dataset_root"] for b in builds.values()}
    assert roots == {".", str(copy), s3.url("src"), http_url}  # provenance, outside the version
    # built to S3 from the folder: up to date when built again from S3
    first = _etl(cfg, env, "--output", s3.url("wh"))
    again = _etl(cfg, env, "--input", s3.url("src"), "--output", s3.url("wh"))
    assert first["fingerprint"] == again["fingerprint"] == versions["s3"]
    assert again["shards_built"] == 0 and again["shards_reused"] == first["shards"]
    cache = tmp_path / "cache"  # no spool or staging left by any of them: only the S3 source's facts
    assert sorted(p.relative_to(cache).parts[0] for p in cache.iterdir()) == ["etl-source-facts"]


def test_a_yolo_source_on_an_http_host_is_refused_naming_why(tmp_path):
    cfg = tmp_path / "yolo.toml"
    cfg.write_text('[source]\nformat = "yolo"\npath = "."\nclasses = ["a"]\n\n[transform]\ntarget_size = 32\n\n'
                   f'[output]\nroot = "{tmp_path / "wh"}"\n')
    with StaticServer(tmp_path) as host:
        r = subprocess.run([sys.executable, "-m", "warpdata", "etl", "--config", str(cfg), "--input", host.url],
                           capture_output=True, text=True, timeout=300,
                           env={**os.environ, "WARP_CACHE_DIR": str(tmp_path / "cache")})
        assert host.requests == 0
    assert r.returncode == 78, r.stderr
    assert "a YOLO dataset cannot be read from an HTTP host" in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "cache").exists() or not list((tmp_path / "cache").rglob("run-*"))
