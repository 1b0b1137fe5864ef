"""Deterministic sample data for demos, tests and benchmarks.

``python -m warpdata.sampledata KIND OUT [--count N] [--seed S]`` writes one
kind of sample dataset; ``GENERATORS`` maps kinds to ``module:function``
(each ``generate(out: Path, count: int, seed: int) -> dict`` returns a short
description of what it wrote). Same seed and count → byte-identical files.
"""

from __future__ import annotations

GENERATORS: dict[str, str] = {
    "captions": "warpdata.sampledata.captions:generate",
    "detection": "warpdata.sampledata.detection:generate",
    "wds": "warpdata.sampledata.wds:generate",
    "volume": "warpdata.sampledata.volume:generate",
    "photos": "warpdata.sampledata.photoset:generate",
}
