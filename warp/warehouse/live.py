"""The live (dev-only) loader: decode the source on the fly with the ETL's code.

:class:`LiveDataset` reads the same TOML config as ``warp etl``, runs the
same label loading and header-pass validation (:func:`~.scan.scan`), and
transforms each sample with the same :class:`~.transform.Transformer` and
box code, so ``live[i]`` equals the warehouse sample with the same key byte
for byte (a test proves it). It is a fallback for development: it pays the
decode on every read, which is exactly what the warehouse exists to avoid.
Samples whose full decode fails raise :class:`~warpdata.core.errors.DataError`
(the ETL would have quarantined them).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
from warpdata.core.config import parse_toml
from warpdata.core.errors import DataError
from warpdata.warehouse import config as wconfig
from warpdata.warehouse.remote import read_source
from warpdata.warehouse.scan import scan
from warpdata.warehouse.transform import DecodeError, Transformer, TransformSpec, transform_boxes


class LiveDataset:
    def __init__(self, config_path: str | os.PathLike, *, input_override: str | None = None) -> None:
        data, source = parse_toml(config_path)
        self.config = wconfig.load(data, source, Path(config_path), input_override=input_override)
        c = self.config
        sc = scan(c, workers=1)
        self.samples = sc.kept(c.skip_empty)
        self.classes = sc.labels.classes
        self.spec = TransformSpec(c.width, c.height, c.resize_mode, c.dtype, c.pad_value, c.interpolation, c.decode)
        self._index = {s.key: i for i, s in enumerate(self.samples)}
        self._tr: Transformer | None = None

    def __len__(self) -> int:
        return len(self.samples)

    def index_of(self, key: str) -> int:
        return self._index[key]

    def __getitem__(self, i: int) -> dict[str, Any]:
        if self._tr is None:
            self._tr = Transformer(self.spec)
        s = self.samples[i]
        spec, mb = self.spec, self.config.max_boxes
        dt = {"u8": np.uint8, "f16": np.float16, "f32": np.float32}[spec.dtype]
        image = np.empty((3, spec.height, spec.width), dt)
        if s.url is not None and not (s.local and os.path.exists(s.local)):
            data = read_source(s.url, s.sha256)
        else:
            # a source on object storage: the header pass's spooled copy (warehouse/remote.py)
            with open(s.local or s.image, "rb") as f:
                data = f.read()
        try:
            g = self._tr(data, s.probe, image)
        except DecodeError as e:
            raise DataError(f"{s.key}: {e.message}", hint=f"the ETL quarantines this sample ({e.reason})",
                            path=s.image) from None
        boxes = np.zeros((mb, 4), np.float16 if spec.dtype == "f16" else np.float32)
        mask = np.zeros(mb, dt)
        classes = np.full(mb, -1, np.int32)
        b = transform_boxes(s.boxes, g, spec)
        boxes[:len(b)] = b
        mask[:len(b)] = 1
        classes[:len(b)] = s.classes
        return {"image": image, "boxes": boxes, "mask": mask, "classes": classes, "frame_id": s.frame_id,
                "key": s.key, "run_id": s.run_id}
