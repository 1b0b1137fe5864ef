"""Shared helpers for the integration tests (not a test module)."""

from __future__ import annotations

from pathlib import Path


def coco_config(d: Path, out: Path | str, *, name: str = "t.toml", build: str = "", fail: float = 0.5,
                labels: str | None = None, shards: str = "shard_samples = 4", size: int = 64,
                max_boxes: int = 8) -> Path:
    """A warehouse ETL config over the COCO dataset in ``d``: ``size`` px (64), up to ``max_boxes``
    boxes (8), 4 samples per shard (``shards``: the [output] table's shard lines; "" for the
    layout's own cut), invalid/missing fractions failing above ``fail``; ``build``: the [build]
    table's lines."""
    p = d / name
    src = f'labels = "{labels}"\n' if labels else ""
    p.write_text(f"""
[source]
format = "coco"
path = "."
{src}
[transform]
target_size = {size}
max_boxes = {max_boxes}

[validation]
max_invalid_fraction = {{ warn = 0.0, fail = {fail} }}
max_missing_fraction = {{ warn = 0.0, fail = {fail} }}

[output]
root = "{out}"
{shards}

[build]
{build}
""")
    return p


def warehouse_config(d: Path, out: Path, workers: int) -> Path:
    return coco_config(d, out, name=f"t-{workers}.toml", build=f"workers = {workers}", labels="annotations.json")


def built_on_s3(cli, s3, coco_warehouse, tmp_path, monkeypatch) -> str:
    """The coco sample's warehouse built by `warp etl` straight into the moto bucket; its s3:// URL."""
    monkeypatch.setenv("WARP_CACHE_DIR", str(tmp_path / "cache"))
    root = coco_warehouse.parent.parent / "coco"
    cfg = coco_config(root, s3.url("wh"), name="s3.toml", labels="annotations.json")
    r = cli("-q", "etl", "--config", cfg)
    assert r.code == 0, r.err
    return r.out.strip().splitlines()[-1]


def etl_version(d: Path, out: Path, **config) -> str:
    """``warp -q etl`` (in-process) of :func:`coco_config` ``(d, out, name=f"t-{out.name}.toml",
    labels="annotations.json", **config)``; returns the version directory it built."""
    from warpdata.cli.app import main

    cfg = coco_config(d, out, name=f"t-{out.name}.toml", labels="annotations.json", **config)
    assert main(["-q", "etl", "--config", str(cfg)]) == 0
    return str(next(Path(out).glob("v*")))
