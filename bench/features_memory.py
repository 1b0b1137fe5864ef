"""Feature-cache memory over 10 epochs with 2 DataLoader workers (PSS / private / anonymous).

Reads the 2,048-record 256×256 pixel cache (16 shards of ~25 MB) for 10
epochs through ``BigBatchLoader`` (micro-batch 16 × 4 accumulation steps,
2 persistent workers, LRU of 2 shards per worker). Every 4 steps it samples,
for the main process and each worker: RSS, PSS and USS (private) from psutil
and ``Anonymous`` from /proc/PID/smaps_rollup. RSS of mmap readers grows with
the page cache by design (docs/design.md §4); PSS, private and anonymous memory
are the honest figures. Prints the growth of each process's per-epoch peak
from epoch 1 to epoch 10 and saves bench/out/features_memory.png.

    .venv/bin/python bench/features_memory.py
"""

from __future__ import annotations

import json
import sys
import time
import zlib
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from features_data import OUT, pixel_cache

EPOCHS = 10
SAMPLE_EVERY = 4


def anon_kib(pid: int) -> int:
    with open(f"/proc/{pid}/smaps_rollup") as f:
        for line in f:
            if line.startswith("Anonymous:"):
                return int(line.split()[1])
    return 0


def snapshot(procs) -> dict[str, dict[str, float]]:
    out = {}
    for name, p in procs.items():
        m = p.memory_full_info()
        out[name] = {"rss": m.rss / 2**20, "pss": m.pss / 2**20, "uss": m.uss / 2**20,
                     "anon": anon_kib(p.pid) / 1024}
    return out


def main() -> int:
    import psutil
    from warpdata.features.torch import BigBatchLoader

    path = pixel_cache(2048, 128)
    loader = BigBatchLoader(path, micro_batch_size=16, accumulation_steps=4, num_workers=2, seed=0,
                            persistent_workers=True)
    main_p = psutil.Process()
    series: list[dict] = []
    epoch_end: list[dict] = []
    t0 = time.perf_counter()
    procs = None
    step_no = 0
    for epoch in range(EPOCHS):
        loader.set_epoch(epoch)
        for step in loader:
            for mb in step.micro_batches:
                # a stand-in for the model that reads every byte and allocates nothing: torch
                # reductions allocate large temporaries whose heap churn would drown the loader's figure
                zlib.crc32(mb["pixels"].numpy())
            if procs is None:
                workers = sorted(main_p.children(), key=lambda c: c.pid)
                procs = {"main": main_p, **{f"worker{i}": w for i, w in enumerate(workers)}}
            step_no += 1
            if step_no % SAMPLE_EVERY == 0:
                series.append({"t": time.perf_counter() - t0, "epoch": epoch + step.index / len(loader),
                               **{k: v for k, v in snapshot(procs).items()}})
        epoch_end.append(snapshot(procs))
        print(f"epoch {epoch + 1}: " + ", ".join(f"{k} pss {v['pss']:.0f} MiB uss {v['uss']:.0f} MiB "
                                                  f"anon {v['anon']:.0f} MiB" for k, v in epoch_end[-1].items()),
              flush=True)
    wall = time.perf_counter() - t0
    shard_mb = max(s["bytes"] for s in loader.dataset.cache.shards) / 2**20
    print(f"\n{EPOCHS} epochs x {len(loader)} steps of {loader.big_batch_size} in {wall:.1f} s; "
          f"shard {shard_mb:.0f} MiB, LRU 2 shards per worker")
    # growth of the per-epoch peak (samples every 4 steps): a single end-of-epoch snapshot swings by
    # one in-flight batch buffer depending on timing
    def peak(proc: str, metric: str, epoch: int) -> float:
        return max(s[proc][metric] for s in series if int(s["epoch"]) == epoch)

    print(f"{'process':10} {'metric':6} {'epoch 1 peak':>13} {'epoch 10 peak':>14} {'growth':>8}")
    growth = {}
    for proc in epoch_end[0]:
        for metric in ("rss", "pss", "uss", "anon"):
            a, b = peak(proc, metric, 0), peak(proc, metric, EPOCHS - 1)
            g = (b - a) / a if a else 0.0
            growth[f"{proc}.{metric}"] = g
            print(f"{proc:10} {metric:6} {a:12.1f}M {b:13.1f}M {100 * g:7.1f}%")
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "features_memory.json").write_text(json.dumps({"series": series, "epoch_end": epoch_end,
                                                          "growth": growth}, indent=1))
    from _figures import emit, figure  # the summary's figures (bench/summary.py)

    emit("features_memory", [figure(f"{k} growth of the per-epoch peak, epoch 1 -> {EPOCHS}", 100 * v, "%",
                                    target=5, op="<=") for k, v in growth.items() if k.endswith(".pss")],
         plots=["features_memory.png"])
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2), sharex=True)
    for ax, metric, title in zip(axes, ("pss", "uss", "anon"),
                                 ("PSS", "private (USS)", "anonymous"), strict=True):
        for proc in epoch_end[0]:
            ax.plot([s["epoch"] for s in series], [s[proc][metric] for s in series], label=proc)
        ax.set_title(f"{title} per process")
        ax.set_xlabel("epoch")
        ax.set_ylabel("MiB")
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
    axes[0].legend()
    fig.suptitle(f"warp feature cache: {EPOCHS} epochs, 2 DataLoader workers, LRU of 2 x {shard_mb:.0f} MiB shards")
    fig.tight_layout()
    fig.savefig(OUT / "features_memory.png", dpi=110)
    print(f"plot: {OUT / 'features_memory.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
