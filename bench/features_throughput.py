"""Feature-cache read throughput: shard-aware sampler vs global permutation vs sequential.

One cache (256×256 uint8 pixels, 2,048 records, 16 shards of 128, ~25 MB
each), warm in the page cache, read through ``ShardCache`` with an LRU of 2
shards in two LRU modes:

* ``mmap``  (verify="fast"): a miss maps the shard; each record's CRC-32C
  is checked as it is read;
* ``load``  (verify="full"): a miss reads and hashes the whole shard (the
  design's "load a .pt shard into an LRU" design: a miss costs a full shard);

and three orders: sequential; warp's ShardAwareSampler (seeded shard
permutation, shuffle inside a one-shard window); torch's DistributedSampler
(one global permutation: what a plain DDP loader does). Then the same with a
DataLoader and 2 workers (BigBatchLoader vs DataLoader + DistributedSampler).
Slow modes run for a fixed time budget. Medians of 3 runs; prints a table.

    .venv/bin/python bench/features_throughput.py
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from features_data import OUT, pixel_cache

N, SHARD, BATCH = 2048, 128, 64
RUNS = 3
BUDGET_S = 6.0


def orders(cache) -> dict[str, np.ndarray]:
    from torch.utils.data import DistributedSampler
    from warpdata.partition.sampler import ShardAwareSampler

    ds = ShardAwareSampler(cache.shard_sizes, world_size=1, rank=0, batch_size=BATCH, window=SHARD, seed=0)
    glob = DistributedSampler(range(len(cache)), num_replicas=1, rank=0, shuffle=True, seed=0)
    return {"sequential": np.arange(len(cache)), "shard-aware": ds.epoch_indices(),
            "global permutation": np.fromiter(iter(glob), np.int64)}


def read_rate(path: Path, order: np.ndarray, verify: str) -> tuple[float, dict]:
    from warpdata.features.reader import ShardCache

    with ShardCache(path, max_resident=2, verify=verify) as c:
        out = c.allocate(BATCH)
        n = 0
        t0 = time.perf_counter()
        for s in range(0, len(order), BATCH):
            c.get_batch(order[s:s + BATCH], out=out)
            n += len(order[s:s + BATCH])
            if time.perf_counter() - t0 > BUDGET_S:
                break
        dt = time.perf_counter() - t0
        return n / dt, dict(c.stats)


def loader_rate(path: Path, kind: str, verify: str) -> float:
    from torch.utils.data import BatchSampler, DataLoader, DistributedSampler
    from warpdata.features.torch import BigBatchLoader, FeatureCacheDataset

    if kind == "shard-aware":
        it = BigBatchLoader(path, micro_batch_size=BATCH, num_workers=2, verify=verify, persistent_workers=False)
        it = (s.batch for s in it)
    else:
        ds = FeatureCacheDataset(path, verify=verify)
        bs = BatchSampler(DistributedSampler(ds, num_replicas=1, rank=0, shuffle=True, seed=0), BATCH, True)
        it = iter(DataLoader(ds, batch_size=None, sampler=bs, num_workers=2))
    n = 0
    t0 = time.perf_counter()
    for b in it:
        n += len(b["pixels"])
        if time.perf_counter() - t0 > BUDGET_S:
            break
    return n / (time.perf_counter() - t0)


def main() -> int:
    from warpdata.features.reader import ShardCache

    path = pixel_cache(N, SHARD)
    for f in sorted(path.glob("*.wfs")):  # warm the page cache once for every mode
        f.read_bytes()
    with ShardCache(path) as c:
        ords = orders(c)
        rec_bytes = c.manifest["record_size"]
    rows, results = [], {}
    for verify, label in (("fast", "mmap"), ("full", "load")):
        for name, order in ords.items():
            rates, stats = [], None
            for _ in range(RUNS):
                r, stats = read_rate(path, order, verify)
                rates.append(r)
            results[(label, name)] = statistics.median(rates)
            rows.append((f"1 process, LRU={label}", name, statistics.median(rates), stats["misses"],
                         stats["hits"] + stats["misses"]))
    for verify, label in (("fast", "mmap"), ("full", "load")):
        for name in ("shard-aware", "global permutation"):
            rate = statistics.median(loader_rate(path, name, verify) for _ in range(RUNS))
            results[(f"dl-{label}", name)] = rate
            rows.append((f"DataLoader 2 workers, LRU={label}", name, rate, None, None))
    print(f"\nfeature cache: {N} records x {rec_bytes} B, shards of {SHARD}, LRU of 2 shards, batch {BATCH}")
    print(f"{'setup':36} {'order':20} {'samples/s':>10} {'misses':>7} {'reads':>6}")
    for setup, name, rate, miss, reads in rows:
        print(f"{setup:36} {name:20} {rate:10.0f} {'' if miss is None else miss:>7} {'' if reads is None else reads:>6}")
    print("\nratios (medians of 3):")
    ratios = {}
    for label in ("mmap", "load", "dl-mmap", "dl-load"):
        sa, gp = results[(label, "shard-aware")], results[(label, "global permutation")]
        ratios[f"{label}: shard-aware / global permutation"] = sa / gp
        if (label, "sequential") in results:
            ratios[f"{label}: shard-aware / sequential"] = sa / results[(label, "sequential")]
    for k, v in ratios.items():
        print(f"  {k:45} {v:8.2f}x")
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "features_throughput.json").write_text(json.dumps(
        {"rows": rows, "ratios": ratios}, indent=1, default=float))
    from _figures import emit, figure  # the summary's figures (bench/summary.py)

    emit("features_throughput", [figure(k, v, "x", target=20 if "global" in k else 0.8, note=f"medians of {RUNS}")
                                 for k, v in ratios.items()])
    return 0


if __name__ == "__main__":
    sys.exit(main())
