"""Real artifacts the lineage tests share: a tensor warehouse built by `warp etl` from the
synthetic COCO set (with quarantined samples), and a feature cache built from the golden sources."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def coco_warehouse(tmp_path_factory) -> Path:
    """(dataset dir, warehouse version dir): 12 images, 8 kept, 4 quarantined, 64 px."""
    from support.warehouses import coco_config
    from warpdata.cli.app import main
    from warpdata.sampledata.detection import generate

    d = tmp_path_factory.mktemp("lineage") / "coco"
    generate(d, count=12, seed=2, min_side=64, max_side=120)
    cfg = coco_config(d, d.parent / "warehouse", labels="annotations.json")
    assert main(["-q", "etl", "--config", str(cfg)]) == 0
    return next((d.parent / "warehouse").glob("v*"))


@pytest.fixture(scope="session")
def feature_cache(tmp_path_factory) -> Path:
    spec = importlib.util.spec_from_file_location("features_golden", ROOT / "tests/golden/features/make_golden.py")
    golden = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(golden)
    root = tmp_path_factory.mktemp("lineage-fc")
    golden.make_sources(root)
    return Path(golden.build("pixels-multi", root, workers=1, executor="local"))
