"""The ``warp etl`` config for tensor warehouses: schema and typed view.

The TOML file (commented example: ``examples/transform.toml``) is checked
against :data:`SCHEMA` with :mod:`warpdata.core.config`, so a bad key or value is
reported as ``file:line: 'dotted.key' must be ...`` with a did-you-mean.
Relative paths are resolved against the config file's directory, so a
dataset and its config can move together (and keep their version).

Only the *cacheable* settings live here: everything in ``[source]``,
``[transform]`` and the validation tolerances enters the version key;
``[output]``, ``[build]`` (where and how fast) and ``[limits]`` do not.
``[build]`` and the ``[validation]`` thresholds are the schemas every ``warp etl`` pipeline
shares (``warpdata.etl.buildconfig``, docs/design.md §11).

``[limits]`` bounds what hostile or broken input can make warp allocate or
read, so declared sizes never drive memory: ``max_image_mb`` (256; a larger
image file is quarantined ``too-large`` before it is read),
``max_label_mb`` (1024; a larger label file is a data error),
``max_class_id`` (65535; a label naming a larger id is quarantined
``unknown-class``: class ids size the class table), ``max_label_boxes``
(10000 per sample; more is quarantined ``too-many-boxes`` before the boxes
are kept) and ``max_shard_mb`` (4096: the in-memory size of one shard being
built, ``shard_samples`` x (pixels + ``max_boxes`` x 24 bytes), and the
largest ``shard_size_mb``; a config over it is a config error) and
``max_pixels`` (89478485, Pillow's cap: an image whose header declares more
pixels is quarantined ``too-many-pixels`` before it is decoded; one whose
header declares more than its bytes can hold is ``impossible-header``). Every image
and label path must stay inside the dataset root after symlinks are
resolved (else ``path-outside-root``), and only regular files are opened.
Raise a limit in the config when the machine and the data warrant it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from warpdata.core.config import ConfigSource, Field, non_negative, positive, validate
from warpdata.core.errors import ConfigError
from warpdata.etl import buildconfig
from warpdata.etl.objectstore import is_url
from warpdata.etl.quarantine import Thresholds
from warpdata.etl.spool import mirror_root

FORMATS = ("coco", "yolo", "jsonl")
RESIZE_MODES = ("letterbox", "resize")
DTYPES = ("u8", "f16", "f32")
OVERFLOW = ("truncate", "reject")
INTERPOLATIONS = ("linear", "nearest", "area", "cubic")
DECODE_MODES = ("scaled", "full")  # warpdata.warehouse.transform.DECODE_MODES (tests check they agree)


def _size_check(v: Any) -> str | None:
    if isinstance(v, int):
        return None if 8 <= v <= 8192 else "must be between 8 and 8192"
    if isinstance(v, list) and len(v) == 2 and all(isinstance(x, int) and not isinstance(x, bool) for x in v):
        return None if all(8 <= x <= 8192 for x in v) else "must be between 8 and 8192"
    return "must be an integer or [width, height]"


SCHEMA: dict = {
    "source": {
        "format": Field(str, help="label format", choices=FORMATS),
        "path": Field(str, ".", "dataset root, relative to this config file"),
        "labels": Field((str, list), "", "coco: annotation JSON file(s); jsonl: .jsonl file(s); "
                        "yolo: label directory (default 'labels'); relative to path", item_type=str),
        "images": Field(str, "", "image directory relative to path (coco: 'images', yolo: 'images', jsonl: '')"),
        "classes": Field(list, [], "class names in id order (yolo/jsonl; coco reads its categories)",
                         item_type=str),
    },
    "transform": {
        "target_size": Field((int, list), 640, "output size: N or [width, height]", check=_size_check),
        "resize_mode": Field(str, "letterbox", "letterbox keeps the aspect ratio and pads; resize stretches",
                             choices=RESIZE_MODES),
        "dtype": Field(str, "u8", "stored image dtype: u8 (raw), f16/f32 (x/255)", choices=DTYPES),
        "max_boxes": Field(int, 100, "boxes per sample are padded to this", check=positive),
        "overflow": Field(str, "truncate", "more boxes than max_boxes: keep the first (truncate) or reject",
                          choices=OVERFLOW),
        "skip_empty": Field(bool, False, "leave samples without boxes out of the shards"),
        "pad_value": Field(int, 114, "letterbox padding value (0-255)",
                           check=lambda v: None if 0 <= v <= 255 else "must be 0-255"),
        "interpolation": Field(str, "linear", "resize interpolation", choices=INTERPOLATIONS),
        "decode": Field(str, "scaled", "JPEG decode: scaled (libjpeg-turbo's DCT scaling to the smallest 1/2, "
                        "1/4 or 1/8 that still covers the target, then resize; less CPU) or full (full size, "
                        "then resize)", choices=DECODE_MODES),
    },
    "validation": {
        "box_tolerance": Field(float, 1.0, "pixels a box may stick out of the image (it is then clipped)",
                               check=non_negative),
        "min_box_size": Field(float, 0.0, "boxes narrower or lower than this (pixels) are degenerate",
                              check=non_negative),
        **buildconfig.threshold_schema(),
    },
    "output": {
        "root": Field(str, "warehouse", "warehouse root; versions go to <root>/vYYYYMMDD-<hash12>/"),
        "shard_size_mb": Field(float, 192.0, "largest shard in MB (128-256 suits NVMe); shards end where the sample "
                               "keys say, about 2/3 of it on average, so an edit moves no later shard",
                               check=positive),
        "shard_samples": Field(int, 0, "samples per shard, exactly (cut by count); 0 derives the largest from "
                               "shard_size_mb and min_shards and cuts where the keys say",
                               check=non_negative),
        "min_shards": Field(int, 16, "smaller datasets get smaller shards so at least this many exist "
                            "(workers own whole shards: few shards would idle them)", check=positive),
    },
    "limits": {
        "max_image_mb": Field(float, 256.0, "image files larger than this (MB) are quarantined as too-large, unread",
                              check=positive),
        "max_label_mb": Field(float, 1024.0, "label files larger than this (MB) are refused (data error)",
                              check=positive),
        "max_class_id": Field(int, 65535, "largest class id a label may use (ids size the class table)",
                              check=lambda v: None if 0 <= v < 2**31 else "must be between 0 and 2147483647"),
        "max_label_boxes": Field(int, 10000, "samples with more boxes than this in their labels are quarantined",
                                 check=positive),
        "max_shard_mb": Field(float, 4096.0, "largest in-memory shard (MB) a build may allocate per worker",
                              check=positive),
        "max_pixels": Field(int, 89_478_485, "images whose header declares more pixels are quarantined "
                            "(too-many-pixels), undecoded", check=positive),
    },
    "build": buildconfig.build_schema(buildconfig.WAREHOUSE),
}


_DTYPE_BYTES = {"u8": 1, "f16": 2, "f32": 4}
BOX_BYTES = 24  # upper bound per padded box in a shard being built: 4 coordinates (f32), mask, class id


@dataclass(frozen=True)
class Limits:
    """Input-size limits (``[limits]``); defaults as documented in the module docstring."""

    max_image_bytes: int = 256_000_000
    max_label_bytes: int = 1_024_000_000
    max_class_id: int = 65535
    max_label_boxes: int = 10000
    max_shard_bytes: int = 4_096_000_000
    max_pixels: int = 89_478_485


@dataclass(frozen=True)
class WarehouseConfig:
    config_path: Path
    base_dir: Path
    format: str
    dataset_root_text: str  # as written in the config (the manifest's dataset_root)
    root: Path
    labels: tuple[str, ...]
    images: str
    classes: tuple[str, ...]
    width: int
    height: int
    resize_mode: str
    dtype: str
    max_boxes: int
    overflow: str
    skip_empty: bool
    pad_value: int
    interpolation: str
    box_tolerance: float
    min_box_size: float
    thresholds: Thresholds
    output_root: Path
    shard_size_mb: float
    shard_samples: int
    min_shards: int
    workers: int
    executor: str
    durable: bool
    resources: dict[str, float] | None = None  # [build] resources: what each task asks of a Dask/Ray cluster
    limits: Limits = Limits()
    # [source] path on object storage (s3://…): ``root`` is then its local mirror (warehouse/remote.py)
    remote_root: str | None = None
    decode: str = "scaled"  # [transform] decode: "scaled" | "full" (warehouse/transform.py)
    overlap: bool = True  # [build] overlap: the header pass overlapped with the build (warehouse/overlap.py)

    def transform_dict(self) -> dict[str, Any]:
        """The cacheable transform config (enters the version key and the manifest)."""
        return {"target_size": [self.width, self.height], "resize_mode": self.resize_mode,
                "dtype": self.dtype, "max_boxes": self.max_boxes, "overflow": self.overflow,
                "skip_empty": self.skip_empty, "pad_value": self.pad_value,
                "interpolation": self.interpolation, "decode": self.decode, "channels": 3, "color": "RGB",
                "normalize": "none (raw 0-255)" if self.dtype == "u8" else "x/255",
                "box_format": "xyxy-pixels", "exif_orientation": "applied"}

    def validation_dict(self) -> dict[str, Any]:
        return {"box_tolerance": self.box_tolerance, "min_box_size": self.min_box_size}


def load(config: dict[str, Any], source: ConfigSource, config_path: Path, *,
         input_override: str | None = None, output_override: str | None = None,
         workers_override: int | None = None) -> WarehouseConfig:
    """Validate a parsed TOML document and resolve paths."""
    buildconfig.check_build_keys(config, buildconfig.WAREHOUSE, source)
    v = validate(config, SCHEMA, source)
    s, t, val, o, b = v["source"], v["transform"], v["validation"], v["output"], v["build"]
    base = Path(config_path).resolve().parent
    if input_override == "-":
        raise ConfigError("a tensor warehouse cannot be built from stdin (--input -)",
                          hint="pass the dataset directory with --input DIR")
    root_text = input_override if input_override is not None else s["path"]
    remote_root = None
    if is_url(root_text):
        remote_root = root_text.rstrip("/")
        root = mirror_root(remote_root)
    else:
        root = (base / root_text).resolve() if input_override is None else Path(input_override).resolve()
    labels = s["labels"]
    if isinstance(labels, str):
        labels = [labels] if labels else []
    fmt = s["format"]
    if not labels:
        labels = {"coco": ["annotations.json"], "yolo": ["labels"], "jsonl": ["labels.jsonl"]}[fmt]
    images = s["images"] or {"coco": "images", "yolo": "images", "jsonl": ""}[fmt]
    size = t["target_size"]
    w, h = (size, size) if isinstance(size, int) else (size[0], size[1])
    thresholds = buildconfig.thresholds(val, source)
    lim = v["limits"]
    limits = Limits(max_image_bytes=int(lim["max_image_mb"] * 1e6), max_label_bytes=int(lim["max_label_mb"] * 1e6),
                    max_class_id=lim["max_class_id"], max_label_boxes=lim["max_label_boxes"],
                    max_shard_bytes=int(lim["max_shard_mb"] * 1e6), max_pixels=lim["max_pixels"])
    _check_shard_memory(source, w, h, t["dtype"], t["max_boxes"], o["shard_samples"], o["shard_size_mb"], limits)
    out_root = Path(output_override).resolve() if output_override else (base / o["root"]).resolve()
    return WarehouseConfig(
        config_path=Path(config_path), base_dir=base, format=fmt, dataset_root_text=root_text, root=root,
        labels=tuple(labels), images=images, classes=tuple(s["classes"]), width=w, height=h,
        resize_mode=t["resize_mode"], dtype=t["dtype"], max_boxes=t["max_boxes"], overflow=t["overflow"],
        skip_empty=t["skip_empty"], pad_value=t["pad_value"], interpolation=t["interpolation"],
        box_tolerance=float(val["box_tolerance"]), min_box_size=float(val["min_box_size"]),
        thresholds=thresholds, output_root=out_root, shard_size_mb=float(o["shard_size_mb"]),
        shard_samples=o["shard_samples"], min_shards=o["min_shards"], workers=workers_override or b["workers"], executor=b["executor"], durable=b["durable"],
        resources=None if b["resources"] is None else {k: float(n) for k, n in b["resources"].items()},
        limits=limits, remote_root=remote_root, decode=t["decode"],
        overlap=b["overlap"])


def _check_shard_memory(source: ConfigSource, w: int, h: int, dtype: str, max_boxes: int, shard_samples: int,
                        shard_size_mb: float, limits: Limits) -> None:
    """A shard is built in memory (``shard_samples`` preallocated samples): keep it under ``max_shard_mb``."""
    cap_mb = limits.max_shard_bytes / 1e6
    raise_it = f"raise [limits] max_shard_mb (now {cap_mb:g}) if the machine has the memory"
    one = 3 * w * h * _DTYPE_BYTES[dtype] + max_boxes * BOX_BYTES
    if one > limits.max_shard_bytes:
        raise ConfigError(f"{source.where('transform.max_boxes')}: one sample of {w}x{h} {dtype} with "
                          f"transform.max_boxes = {max_boxes} needs {one / 1e6:.6g} MB in memory, over the "
                          f"{cap_mb:g} MB shard limit", hint=f"lower transform.max_boxes, or {raise_it}",
                          file=source.path, key="transform.max_boxes")
    if shard_samples and shard_samples * one > limits.max_shard_bytes:
        raise ConfigError(f"{source.where('output.shard_samples')}: output.shard_samples = {shard_samples} makes "
                          f"a shard of {shard_samples * one / 1e6:.6g} MB in memory ({one} bytes a sample), over "
                          f"the {cap_mb:g} MB shard limit",
                          hint=f"use at most {limits.max_shard_bytes // one} samples per shard, or {raise_it}",
                          file=source.path, key="output.shard_samples")
    if shard_size_mb > cap_mb:
        raise ConfigError(f"{source.where('output.shard_size_mb')}: output.shard_size_mb = {shard_size_mb:g} is "
                          f"over the {cap_mb:g} MB shard limit", hint=f"lower it, or {raise_it}",
                          file=source.path, key="output.shard_size_mb")


