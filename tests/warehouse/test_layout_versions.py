"""Shard layout across versions (issue 39, item 3; docs/formats/twh1.md, "Layout across versions").

The next version of a dataset (a few samples relabelled, replaced, appended) cuts its shards at the
same samples: a shard that holds no edited sample keeps its bytes, an edited one keeps its samples in
their slots, and appended samples go after the last sample of the version before.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from warpdata.sampledata.detection import edit, generate


def _config(src: Path, out: Path) -> Path:
    from support.warehouses import coco_config

    return coco_config(src, out, name=f"t-{out.name}.toml", labels="annotations.json", shards="min_shards = 4")


def _etl(cli, cfg: Path) -> dict:
    r = cli("-q", "etl", "--config", str(cfg), "--json")
    assert r.code == 0, r.err
    return r.json()


def _layout(path: str) -> list[tuple[list[str], str]]:
    import pyarrow.parquet as pq

    doc = json.loads((Path(path) / "manifest.json").read_text())
    rows = pq.read_table(Path(path) / "samples.parquet", columns=["key", "shard_id"]).to_pylist()
    keys: dict[str, list[str]] = {}
    for r in rows:
        keys.setdefault(r["shard_id"], []).append(r["key"])
    return [(keys[s["id"]], s["checksum_sha256"]) for s in doc["shards"]]


@pytest.fixture(scope="module")
def coco(tmp_path_factory):
    d = tmp_path_factory.mktemp("layout") / "coco"
    generate(d, count=40, seed=5, min_side=64, max_side=120, broken=False)
    return d


def test_samples_per_shard_does_not_move_with_a_few_more_samples(coco, tmp_path):
    import tomllib

    from warpdata.core.config import ConfigSource
    from warpdata.warehouse import config as wconfig
    from warpdata.warehouse.shards import samples_per_shard

    def load(text: str, path: Path):
        return wconfig.load(tomllib.loads(text), ConfigSource(str(path), text), path)

    path = _config(coco, tmp_path / "wh")
    cfg = load(path.read_text(), path)
    # 2,000 photos, then 3 % more: the same shard size (before, 125 and then 129 samples a shard)
    cfg16 = load(path.read_text().replace("min_shards = 4", "min_shards = 16"), path)
    assert samples_per_shard(cfg16, 2000) == samples_per_shard(cfg16, 2020) == samples_per_shard(cfg16, 2032) == 64
    assert samples_per_shard(cfg, 40) == samples_per_shard(cfg, 42) == 8
    # never fewer shards than the cap without rounding made (min_shards, where n allows)
    assert all(-(-n // samples_per_shard(cfg16, n)) >= -(-n // -(-n // 16)) for n in range(1, 5000, 7))


def test_an_edited_version_keeps_its_shards_and_appends_after_them(cli, coco, tmp_path):
    v1 = _etl(cli, _config(coco, tmp_path / "a"))
    before = _layout(v1["path"])
    changed = edit(coco, relabel=1, replace=1, append=2, seed=3)
    v2 = _etl(cli, _config(coco, tmp_path / "b"))
    after = _layout(v2["path"])
    assert v2["version"] != v1["version"]
    # cut where the keys say (at most 8 a shard), not every 8: the appended samples can only move
    # the last cut, whose window ran past the last sample
    assert max(len(k) for k, _ in before + after) <= 8 and len(before) > 5
    edited = set(changed["relabelled"]) | set(changed["replaced"])
    for (k1, sum1), (k2, sum2) in zip(before[:-1], after, strict=False):
        assert k1 == k2  # every sample in its slot
        assert (sum1 == sum2) == (not edited & set(k1))  # untouched shards keep their bytes
    tail = [k for keys, _ in after[len(before) - 1:] for k in keys]
    assert tail == before[-1][0] + changed["appended"]


def test_a_sample_removed_from_the_middle_moves_no_later_shard(cli, tmp_path):
    """A label deleted from the middle: the shard that held it changes (and at most one beside
    it), every other shard keeps its samples and its bytes, the later ones included."""
    src = tmp_path / "coco"
    generate(src, count=120, seed=8, min_side=64, max_side=120, broken=False)
    cfg = _config(src, tmp_path / "wh")
    before = _layout(_etl(cli, cfg)["path"])
    doc = json.loads((src / "annotations.json").read_text())
    gone = doc["images"][len(doc["images"]) // 3]
    doc["images"] = [im for im in doc["images"] if im["id"] != gone["id"]]
    doc["annotations"] = [a for a in doc["annotations"] if a["image_id"] != gone["id"]]
    (src / "annotations.json").write_text(json.dumps(doc))
    after = _layout(_etl(cli, cfg)["path"])
    assert len(before) >= 6 and max(len(k) for k, _ in before) <= 32
    kept = set(map(lambda x: (tuple(x[0]), x[1]), before))
    new = [x for x in after if (tuple(x[0]), x[1]) not in kept]
    assert 1 <= len(new) <= 2  # the shard that held it, and at most one neighbour
    assert len(after) - len(new) >= len(before) - 3
    # the shards after the changed ones are the old ones, in order
    last = max(i for i, x in enumerate(after) if (tuple(x[0]), x[1]) not in kept)
    assert after[last + 1:] == before[len(before) - (len(after) - last - 1):]
