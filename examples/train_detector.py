"""Train a tiny detector for a few steps from a tensor warehouse (or, for dev, live).

    python examples/train_detector.py --tensor-warehouse demo-out/warehouse/v20261122-3f2a9c1e0b7d
    python examples/train_detector.py --live-loader --config demo-out/coco/transform.toml

With ``--tensor-warehouse`` the loader memory-maps TWH1 shards and never
decodes (``warpdata.warehouse.torch.make_loader``: shard-aware sampler, one
shard set per DataLoader worker, equal batches per rank). ``--live-loader``
is the dev-only fallback: it decodes the source images on the fly with the
ETL's own transform code (``warpdata.warehouse.live.LiveDataset``), so both
paths feed identical tensors; it refuses to run without being asked.

The model is deliberately small (a few convolutions predicting, per image,
a box-count and a coarse objectness grid): the point is the data path.
Shard load times are logged at INFO (``-v``).
"""

from __future__ import annotations

import argparse
import logging
import sys
import time

import numpy as np
import torch
from torch import nn


class TinyDetector(nn.Module):
    def __init__(self, grid: int = 8) -> None:
        super().__init__()
        self.grid = grid
        self.body = nn.Sequential(
            nn.Conv2d(3, 16, 5, stride=4, padding=2), nn.ReLU(),
            nn.Conv2d(16, 32, 3, stride=2, padding=1), nn.ReLU(),
            nn.AdaptiveAvgPool2d(grid), nn.Conv2d(32, 1, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x).squeeze(1)  # (B, grid, grid) objectness logits


def objectness_targets(boxes: torch.Tensor, mask: torch.Tensor, width: int, height: int, grid: int) -> torch.Tensor:
    """1 where a box centre falls in a grid cell."""
    b = boxes.float()
    cx = ((b[..., 0] + b[..., 2]) / 2 / width * grid).clamp(0, grid - 1).long()
    cy = ((b[..., 1] + b[..., 3]) / 2 / height * grid).clamp(0, grid - 1).long()
    t = torch.zeros(boxes.shape[0], grid, grid)
    valid = mask.bool()
    bi = torch.arange(boxes.shape[0]).unsqueeze(1).expand_as(cx)
    t[bi[valid], cy[valid], cx[valid]] = 1.0
    return t


def to_input(image: torch.Tensor) -> torch.Tensor:
    # u8 warehouses store raw 0-255; f16/f32 already hold x/255
    return image.float() / 255.0 if image.dtype == torch.uint8 else image.float()


def live_batches(config: str, batch_size: int, seed: int):
    from warpdata.core.errors import DataError
    from warpdata.warehouse.live import LiveDataset

    ds = LiveDataset(config)
    rng = np.random.default_rng(seed)
    while True:
        order = rng.permutation(len(ds))
        for s in range(0, len(order) - batch_size + 1, batch_size):
            items = []
            for i in order[s:s + batch_size]:
                try:
                    items.append(ds[int(i)])
                except DataError as e:  # the ETL would have quarantined it
                    print(f"warning: skipping {e.message}", file=sys.stderr)
            if not items:
                continue
            yield {k: torch.from_numpy(np.stack([it[k] for it in items])) for k in ("image", "boxes", "mask")}


def warehouse_batches(path: str, batch_size: int, workers: int, seed: int, allow_invalid: bool):
    from warpdata.warehouse.torch import make_loader

    loader = make_loader(path, batch_size=batch_size, num_workers=workers, seed=seed, allow_invalid=allow_invalid)
    epoch = 0
    while True:
        loader.sampler.set_epoch(epoch)
        yield from loader
        epoch += 1


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--tensor-warehouse", metavar="PATH", help="a warehouse version directory from 'warp etl'")
    src.add_argument("--live-loader", action="store_true", help="dev only: decode the source on the fly")
    p.add_argument("--config", help="the transform.toml (needed with --live-loader)")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--allow-invalid", action="store_true", help="train even if validation thresholds failed")
    p.add_argument("-v", "--verbose", action="store_true")
    a = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO if a.verbose else logging.WARNING, format="%(name)s: %(message)s")
    torch.manual_seed(a.seed)
    if a.live_loader:
        if not a.config:
            p.error("--live-loader needs --config transform.toml")
        print("warning: --live-loader decodes every image on every step (dev fallback)", file=sys.stderr)
        batches = live_batches(a.config, a.batch_size, a.seed)
    else:
        batches = warehouse_batches(a.tensor_warehouse, a.batch_size, a.workers, a.seed, a.allow_invalid)
    model = TinyDetector()
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    loss_fn = nn.BCEWithLogitsLoss()
    t0 = time.perf_counter()
    seen = 0
    first = last = None
    for step in range(a.steps):
        b = next(batches)
        x = to_input(b["image"])
        h, w = x.shape[-2:]
        y = objectness_targets(b["boxes"], b["mask"], w, h, model.grid)
        loss = loss_fn(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        seen += x.shape[0]
        first = loss.item() if first is None else first
        last = loss.item()
        if step % 5 == 0 or step == a.steps - 1:
            print(f"step {step:4d}  loss {last:.4f}", file=sys.stderr)
    dt = time.perf_counter() - t0
    print(f"trained {a.steps} steps, {seen} samples in {dt:.2f}s ({seen / dt:.0f} samples/s); "
          f"loss {first:.4f} -> {last:.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
