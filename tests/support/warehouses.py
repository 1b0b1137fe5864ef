"""Shared helpers for the integration tests (not a test module)."""

from __future__ import annotations

from pathlib import Path


def warehouse_config(d: Path, out: Path, workers: int) -> Path:
    p = d / f"t-{workers}.toml"
    p.write_text(f"""
[source]
format = "coco"
path = "."
labels = "annotations.json"

[transform]
target_size = 64
max_boxes = 8

[validation]
max_invalid_fraction = {{ warn = 0.0, fail = 0.5 }}
max_missing_fraction = {{ warn = 0.0, fail = 0.5 }}

[output]
root = "{out}"
shard_samples = 4

[build]
workers = {workers}
""")
    return p
