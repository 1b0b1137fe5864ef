"""Tensor-warehouse read throughput: warp's reader vs memcpy and peer readers.

The same transformed data (photo-like corpus, letterbox 640, uint8 CHW +
boxes) is written by warp etl and by each peer's writer (LitData optimize,
MosaicML MDSWriter, WebDataset ShardWriter; bench/warehouse_etl.py), then,
with warm page cache:

* memcpy       — np.copyto of a batch-sized block in RAM (the bandwidth bound);
* warp batch   — ``Warehouse.batch(random indices, out=reused buffer)``;
* warp loader  — ``warpdata.warehouse.torch.make_loader`` (shard-aware sampler),
                 torch DataLoader with 2 workers, batches of 32;
* litdata / mds / wds — each peer's own dataset class in a torch DataLoader
                 with 2 workers and batches of 32 (their documented path).

Loaders are timed over one full epoch after a warm-up epoch; medians of
``--runs``. Every system runs in its own process.

    python bench/warehouse_reader.py [--n 320] [--runs 3] [--json]
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _warehouse_common as common

SYSTEMS = ("memcpy", "warp-batch", "warp-loader", "litdata", "mds", "wds")
PEER_MODULES = {"litdata": "litdata", "mds": "streaming", "wds": "webdataset"}
MAX_BOXES = 16
WRITER = {"warp-batch": "warp", "warp-loader": "warp", "litdata": "litdata", "mds": "mds", "wds": "wds"}


def _epoch(loader) -> tuple[int, float]:
    t0 = time.perf_counter()
    n = 0
    for b in loader:
        img = b["image"] if isinstance(b, dict) else b[0]
        n += len(img)
    return n, time.perf_counter() - t0


def _stack(batch: list[dict]) -> dict:
    """Stack samples, padding boxes to MAX_BOXES like the warehouse does.

    Peers store variable-length boxes, and torch's default_collate fails on
    their numpy-backed storage in workers, so every peer gets this collate.
    """
    import numpy as np
    import torch

    boxes = np.zeros((len(batch), MAX_BOXES, 4), np.float32)
    for i, b in enumerate(batch):
        bx = np.asarray(b["boxes"], np.float32).reshape(-1, 4)[:MAX_BOXES]
        boxes[i, :len(bx)] = bx
    return {"image": torch.from_numpy(np.stack([b["image"] for b in batch])), "boxes": torch.from_numpy(boxes)}


def _stack_tuples(samples: list[tuple]) -> dict:
    return _stack([{"image": s[0], "boxes": s[1]} for s in samples])


def child(system: str, data: Path, batch: int, workers: int, seconds: float) -> dict:
    import numpy as np

    if system == "memcpy":
        # the same copies warp-batch does (random 1.2 MB samples into a reused batch buffer),
        # but from an array already in process memory: the bandwidth bound
        rng = np.random.default_rng(0)
        src = rng.integers(0, 256, size=(256, 3, 640, 640), dtype=np.uint8)
        dst = np.empty((batch, 3, 640, 640), np.uint8)
        t0, n = time.perf_counter(), 0
        while time.perf_counter() - t0 < seconds:
            for k, i in enumerate(rng.integers(0, len(src), batch)):
                np.copyto(dst[k], src[i])
            n += batch
        dt = time.perf_counter() - t0
        return {"samples_per_s": n / dt, "gb_per_s": n * dst[0].nbytes / dt / 1e9}
    if system == "warp-batch":
        import warpdata.warehouse as wh

        w = wh.open(next(data.glob("wh/v*")), verify="off")
        buf = w.alloc_batch(batch)
        rng = np.random.default_rng(0)
        w.batch(np.arange(len(w)), out=w.alloc_batch(len(w)))  # map every shard once
        per = buf["image"][0].nbytes + buf["boxes"][0].nbytes + buf["mask"][0].nbytes + buf["classes"][0].nbytes
        t0, n = time.perf_counter(), 0
        while time.perf_counter() - t0 < seconds:
            w.batch(rng.integers(0, len(w), batch), out=buf)
            n += batch
        dt = time.perf_counter() - t0
        return {"samples_per_s": n / dt, "gb_per_s": n * per / dt / 1e9}
    import torch

    torch.set_num_threads(1)
    if system == "warp-loader":
        from warpdata.warehouse.torch import make_loader

        loader = make_loader(next(data.glob("wh/v*")), batch_size=batch, num_workers=workers, verify="off")
    elif system == "litdata":
        from litdata import StreamingDataLoader, StreamingDataset

        loader = StreamingDataLoader(StreamingDataset(str(data / "litdata"), shuffle=True), batch_size=batch,
                                     num_workers=workers, collate_fn=_stack)
    elif system == "mds":
        from streaming import StreamingDataset
        from torch.utils.data import DataLoader

        ds = StreamingDataset(local=str(data / "mds"), batch_size=batch, shuffle=True)
        loader = DataLoader(ds, batch_size=batch, num_workers=workers, persistent_workers=True, collate_fn=_stack)
    else:
        import webdataset as wds
        from torch.utils.data import DataLoader

        urls = sorted(str(p) for p in data.glob("wds-*.tar"))
        ds = wds.WebDataset(urls, shardshuffle=len(urls), empty_check=False).shuffle(256).decode().to_tuple(
            "image.npy", "boxes.npy").batched(batch, collation_fn=_stack_tuples)
        loader = DataLoader(ds, batch_size=None, num_workers=workers, persistent_workers=True)
    _epoch(loader)  # warm-up: worker start, page cache, maps
    n, dt = _epoch(loader)
    return {"samples_per_s": n / dt, "samples": n}


def prepare(n: int, workers: int, systems: list[str]) -> Path:
    from warehouse_etl import child as write

    corpus = common.corpus(n)
    data = common.OUT / f"warehouse-reader-{n}"
    data.mkdir(parents=True, exist_ok=True)
    for writer in sorted({WRITER[s] for s in systems if s in WRITER}):
        marker = data / f".{writer}-done"
        if marker.exists():
            continue
        tmp = common.OUT / f"warehouse-reader-tmp-{writer}"
        r = common.run_child(Path(__file__).parent / "warehouse_etl.py",
                             ["--child", writer, "--corpus", str(corpus), "--out", str(tmp), "--workers", str(workers)])
        if "error" in r:
            continue
        for p in tmp.iterdir():
            dest = data / p.name
            if dest.exists():
                shutil.rmtree(dest) if dest.is_dir() else dest.unlink()
            shutil.move(str(p), dest)
        marker.touch()
    del write
    return data


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=320)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--seconds", type=float, default=2.0)
    p.add_argument("--systems", default=",".join(SYSTEMS))
    p.add_argument("--json", action="store_true")
    p.add_argument("--child", help=argparse.SUPPRESS)
    p.add_argument("--data", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.child:
        print(json.dumps(child(a.child, Path(a.data), a.batch, a.workers, a.seconds)))
        return 0
    systems = [s for s in a.systems.split(",") if s]
    versions = {s: common.peer_available(PEER_MODULES[s]) for s in systems if s in PEER_MODULES}
    data = prepare(a.n, a.workers, [s for s in systems if versions.get(s, "x")])
    results: dict[str, list[dict]] = {s: [] for s in systems}
    for _ in range(a.runs):
        for s in systems:
            if s in versions and versions[s] is None:
                continue
            results[s].append(common.run_child(Path(__file__), [
                "--child", s, "--data", str(data), "--batch", str(a.batch), "--workers", str(a.workers),
                "--seconds", str(a.seconds)]))
    rates, gbs, errors = {}, {}, {}
    for s, rs in results.items():
        ok = [r for r in rs if "samples_per_s" in r]
        rates[s] = common.median([r["samples_per_s"] for r in ok]) if ok else None
        gbs[s] = common.median([r["gb_per_s"] for r in ok]) if ok and "gb_per_s" in ok[0] else None
        if rs and not ok:
            errors[s] = rs[-1].get("error")
    doc = {"n": a.n, "batch": a.batch, "workers": a.workers, "runs": a.runs, "samples_per_s": rates,
           "gb_per_s": gbs, "versions": versions, "errors": errors}
    from _figures import emit, figure  # the summary's figures (bench/summary.py)

    figs = []
    if gbs.get("warp-batch") and gbs.get("memcpy"):
        figs.append(figure("batched random reads, % of memcpy", 100 * gbs["warp-batch"] / gbs["memcpy"], "%", target=50))
    peers = [r for s, r in rates.items() if r and s not in ("warp-loader", "warp-batch", "memcpy")]
    if rates.get("warp-loader") and peers:
        figs.append(figure(f"DataLoader {a.workers} workers / best peer reader", rates["warp-loader"] / max(peers), "x",
                           target=1, note=f"{rates['warp-loader']:.0f} samples/s"))
    emit("warehouse_reader", figs)
    if a.json:
        print(json.dumps(doc, indent=2))
        return 0
    print(f"tensor-warehouse read: {a.n} samples (640x640 u8 + boxes), batch {a.batch}, "
          f"{a.workers} DataLoader workers, warm cache, median of {a.runs}")
    print(f"{'system':<13}{'samples/s':>11}{'GB/s':>8}{'vs memcpy':>11}{'warp-loader / system':>22}  note")
    for s in systems:
        r = rates.get(s)
        if r is None:
            why = "not installed" if s in versions and versions[s] is None else errors.get(s, "")
            print(f"{s:<13}{'-':>11}{'':>8}{'':>11}{'':>22}  {why}")
            continue
        g = gbs.get(s)
        vs = f"{100 * g / gbs['memcpy']:.0f}%" if g and gbs.get("memcpy") else ""
        ratio = f"{rates['warp-loader'] / r:.2f}x" if rates.get("warp-loader") and s not in ("warp-loader", "memcpy", "warp-batch") else ""
        print(f"{s:<13}{r:>11.0f}{(f'{g:.2f}' if g else ''):>8}{vs:>11}{ratio:>22}  {versions.get(s) or ''}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
