"""An ETL build whose source and output are both on a real S3 server (Ceph's RADOS Gateway,
tests/support/ceph.py): the same version as a local build of the same files. Run with
``make s3-conformance``; skipped elsewhere."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from support.warehouses import coco_config
from warpdata.sampledata.detection import generate

pytestmark = pytest.mark.rgw


def test_etl_from_s3_to_s3_builds_what_a_local_build_does(cli, rgw, tmp_path, monkeypatch):
    d = tmp_path / "coco"
    generate(d, count=16, seed=5, min_side=64, max_side=150)
    ref = subprocess.run([sys.executable, "-m", "warpdata", "etl", "--config",
                          str(coco_config(d, tmp_path / "ref", name="ref.toml", fail=0.3)), "--json", "-j", "1"],
                         capture_output=True, text=True, timeout=600)
    assert ref.returncode == 0, ref.stderr
    ref_dir = Path(json.loads(ref.stdout)["path"])
    reference = {p.name: p.read_bytes() for p in sorted(ref_dir.iterdir()) if p.name != "metrics.json"}
    for p in sorted(d.rglob("*")):
        rel = p.relative_to(d).as_posix()
        if p.is_file() and (rel == "annotations.json" or rel.startswith("images/")):
            rgw.client.put_object(Bucket=rgw.bucket, Key=f"src/{rel}", Body=p.read_bytes())
    monkeypatch.setenv("WARP_CACHE_DIR", str(tmp_path / "cache"))
    cfg = coco_config(d, tmp_path / "unused", fail=0.3)
    out = rgw.url("wh")
    r = cli("etl", "--config", cfg, "--json", "--input", rgw.url("src"), "--output", out, "-j", "1")
    assert r.code == 0, r.err
    res = r.json()
    vdir = res["path"].rsplit("/", 1)[-1]
    assert res["path"] == f"{out}/{vdir}" and res["upload"]["uploaded"] == len(reference) + 1
    got = {name: rgw.client.get_object(Bucket=rgw.bucket, Key=f"wh/{vdir}/{name}")["Body"].read() for name in reference}
    # the same shards, byte for byte; the manifest differs where it names the input (and the hashes
    # over it)
    assert {k: v for k, v in got.items() if k != "manifest.json"} == \
        {k: v for k, v in reference.items() if k != "manifest.json"}
    m, m_ref = json.loads(got["manifest.json"]), json.loads(reference["manifest.json"])
    differ = sorted(k for k in m.keys() | m_ref.keys() if m.get(k) != m_ref.get(k))
    assert set(differ) <= {"dataset_root", "version_recipe", "version", "content_sha256"}, differ
    assert str(m["dataset_root"]).startswith("s3://") and rgw.bucket in str(m["dataset_root"])
    assert rgw.client.get_object(Bucket=rgw.bucket, Key="wh/latest")["Body"].read() == (vdir + "\n").encode()
    again = cli("etl", "--config", cfg, "--json", "--input", rgw.url("src"), "--output", out)
    assert again.code == 0, again.err
    assert again.json()["status"] == "up-to-date" and again.json()["upload"]["uploaded"] == 0
