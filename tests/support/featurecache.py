"""The feature-cache ETL config the kit and object-storage tests share: two caption folders (the
second repeated 3 times, with a caption prefix), 32 px, shards of 5 records."""

from __future__ import annotations

from pathlib import Path


def write_config(sources: Path, out: Path | str, build: str = "", name: str = "fc.toml") -> Path:
    p = sources / name
    p.write_text(f"""
[[directory]]
path = "a/media"

[[directory]]
path = "b/media"
num_repeats = 3
caption_prefix = "photo: "

[source]
format = "captions"

[transform]
resolution = 32

[encoder]
name = ""

[cache]
shard_size = 5

[validation]
max_invalid_fraction = {{ warn = 0.9, fail = 0.9 }}
max_missing_fraction = {{ warn = 0.9, fail = 0.9 }}

[output]
path = "{out}"

[build]
{build}
""")
    return p
