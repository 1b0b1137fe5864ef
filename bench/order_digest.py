"""What the resume-state digests cost the loaders (docs/partitioning.md, "Digests").

Each loader reads one epoch of a small local artifact while the loop saves a resume
state after *every* step (the worst case: a job checkpoints every few hundred steps),
alternating runs with the digests and runs with them switched off (this script replaces
each loader's ``digest_fields``, where every state's digest fields are made, by one
returning an empty tally's: a switch of the benchmark only, not of the library). The
ratio is epoch throughput with / without, median of the rounds, from one run; under load
it swings too much to resolve 2 %, so the script also times the digest code in place
(``digest_fields``, this thread's CPU time, less the timer's own cost measured at the
start): its share of the epoch's wall time, per saved state, and CPU seconds per million
samples (the figure that stays fair under load: the wall grows, the digests' CPU little). Three settings: a state saved every step and dropped (a
``Table.batches`` state computes its digests only when read: ``PendingState``), a state
saved every step with its digests read (``Tally.of``: what serialising it costs in
digests), and a state saved only at epoch end (one per epoch, as the recipe does). The
last state of every epoch is read in all three, as ``combine_digests`` reads it. The last
column times each whole ``state_dict()`` call (this thread's CPU: digests, fingerprints and
the other fields), the cost of a state saved every step.

    .venv/bin/python bench/order_digest.py [--rounds 3] [--only make_loader TblLoader]

Loaders: ``Table.batches`` (the read path of ``to_torch``, a 200,000-row local table,
batches of 256), ``make_loader`` (a 2,000-sample warehouse of 32×24 images, batches of
32, 0 workers), ``BigBatchLoader`` (a 4,000-record feature cache of 16×16 pixels, big
batches of 64, 0 workers), ``TblLoader`` (3,000 64×48 JPEGs decoded, batches of 32,
1 thread).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "bench" / "out" / "order"
sys.path.insert(0, str(ROOT / "tests"))


def build() -> dict:
    OUT.mkdir(parents=True, exist_ok=True)
    arts: dict = {}
    store = OUT / "store"
    if not (OUT / "table.ok").exists():
        import pyarrow as pa
        from support.datasets import publish

        parts = [pa.table({"id": np.arange(a, a + 50_000, dtype=np.int64),
                           "x": np.random.default_rng(a).random(50_000)}) for a in range(0, 200_000, 50_000)]
        publish(str(store), "bench/order", {"main": parts}, OUT / "pub", row_group_size=10_000)
        (OUT / "table.ok").write_text("ok")
    arts["store"] = str(store)
    tbl = OUT / "photos.tbl"
    if not tbl.exists():
        from warpdata.formats import tbl as tblfmt
        from warpdata.sampledata.photos import encode_jpeg, synthetic_photo

        rng = np.random.default_rng(0)
        with tblfmt.TblWriter(tbl, fsync=False) as w:
            for _ in range(3000):
                w.add(encode_jpeg(synthetic_photo(rng, 64, 48), 85))
    arts["tbl"] = tbl
    cache = OUT / "cache"
    if not cache.exists():
        from PIL import Image
        from warpdata.features.writer import CacheSpec, build_cache

        src = OUT / "captions"
        src.mkdir(exist_ok=True)
        for i in range(4000):
            Image.fromarray(np.full((16, 16, 3), i % 256, np.uint8)).save(src / f"{i:04d}.png")
            (src / f"{i:04d}.txt").write_text(f"sample {i}")
        build_cache(CacheSpec(source=str(src), output=str(cache), size=(16, 16), shard_size=256,
                              encoder="pool8-hash", caching_device="cpu", caching_batch_size=256))
    arts["features"] = cache
    wh_root = OUT / "wh"
    if not wh_root.exists():
        from warpdata.cli.app import main
        from warpdata.sampledata.detection import generate

        d = OUT / "coco"
        generate(d, count=2000, seed=5, min_side=32, max_side=48, broken=False)
        cfg = d / "t.toml"
        cfg.write_text('[source]\nformat = "coco"\n[transform]\ntarget_size = [32, 24]\nmax_boxes = 4\n'
                       f'[output]\nroot = "{wh_root}"\nshard_samples = 200\n')
        assert main(["-q", "etl", "--config", str(cfg)]) == 0
    arts["warehouse"] = next(wh_root.glob("v*"))
    return arts


def _patched():
    """The loaders' digest code: every resume state's digest fields come from one of these methods."""
    from warpdata.partition.plan import ShardPlan
    from warpdata.partition.sampler import ShardAwareSampler
    from warpdata.tbl.loader import TblLoader

    return ShardPlan, ShardAwareSampler, TblLoader


@contextmanager
def digests_off():
    """Every loader's digest fields replaced by those of an empty tally (this benchmark's switch)."""
    from warpdata.partition.digest import Tally

    classes = _patched()
    saved = tuple(c.digest_fields for c in classes)
    empty = Tally().fields()
    table = {"order_digest": "", "consumed_digest": empty["consumed_digest"], "consumed_samples": 0,
             "pad_digest": "", "pad_samples": 0, "dropped_digest": "", "dropped_samples": 0, "carried": ()}
    classes[0].digest_fields = lambda self, consumed, content, after=None: dict(table)
    classes[1].digest_fields = lambda self, consumed: dict(empty)
    classes[2].digest_fields = lambda self, batches_consumed: dict(empty)
    try:
        yield
    finally:
        for c, f in zip(classes, saved, strict=True):
            c.digest_fields = f


SPENT = [0.0, 0]  # CPU seconds inside the loaders' digest_fields() (the digests' whole cost) and calls
CLOCK = [0.0]  # CPU seconds one timed call of an empty function costs (the timer's own), subtracted


@contextmanager
def digests_timed():
    """Every loader's digest_fields timed (the runs with digests): its share of the epoch, measured in place."""
    classes = _patched()
    saved = tuple(c.digest_fields for c in classes)
    for c, f in zip(classes, saved, strict=True):
        c.digest_fields = _timed(f)
    try:
        yield
    finally:
        for c, f in zip(classes, saved, strict=True):
            c.digest_fields = f


def _timed(fn):
    clock = time.thread_time  # this thread's CPU: a wait for the GIL the loader's threads hold is not counted

    def run(*a, **k):
        t0 = clock()
        try:
            return fn(*a, **k)
        finally:
            SPENT[0] += clock() - t0 - CLOCK[0]
            SPENT[1] += 1
    return run


def calibrate() -> float:
    """The CPU time a timed call of an empty function adds (the median of 7 runs of 20,000 calls)."""
    empty = _timed(lambda: None)
    runs = []
    for _ in range(7):
        SPENT[0], CLOCK[0] = 0.0, 0.0
        for _ in range(20_000):
            empty()
        runs.append(SPENT[0] / 20_000)
    SPENT[0], SPENT[1] = 0.0, 0
    return statistics.median(runs)


STATES = [0.0, 0]  # CPU seconds inside the loaders' whole state_dict() calls (digests, fingerprints, the rest) and calls


def state_of(make):
    """The state ``make()`` returns, its CPU time (this thread's, less the timer's own) added to :data:`STATES`."""
    t0 = time.thread_time()
    try:
        return make()
    finally:
        STATES[0] += time.thread_time() - t0 - CLOCK[0]
        STATES[1] += 1


SAVED = [0]  # states saved in the epoch
SETTINGS = {"every step": (True, False), "every step, read": (True, True), "epoch end": (False, False)}


def saved(state, read: bool) -> None:
    """A state the loop keeps: its digests read (the recipe's combine_digests, a checkpoint's to_json) or not."""
    SAVED[0] += 1
    if read:
        from warpdata.partition.digest import Tally

        Tally.of(state)


def epoch_table(arts, every: bool, read: bool = False) -> int:
    import warpdata

    t = warpdata.dataset("bench/order", store=arts["store"], mode="remote").table("main")
    stream = t.batches(256, rank=0, world_size=1, shuffle=True, seed=1, prefetch="off")
    n = 0
    for k, b in enumerate(stream):
        n += b.num_rows
        if every:
            saved(state_of(lambda: stream.state_dict(k + 1)), read)  # noqa: B023 (called at once)
    saved(state_of(stream.state_dict), True)
    return n


def epoch_warehouse(arts, every: bool, read: bool = False) -> int:
    from warpdata.warehouse.torch import make_loader

    dl = make_loader(arts["warehouse"], batch_size=32, num_workers=0, seed=1, rank=0, world_size=1)
    n = 0
    for b in dl:
        n += len(b["index"])
        if every:
            saved(state_of(lambda: dl.sampler.state_dict(consumed=n)), read)  # noqa: B023 (called at once)
    saved(state_of(lambda: dl.sampler.state_dict(consumed=n)), True)
    return n


def epoch_features(arts, every: bool, read: bool = False) -> int:
    from warpdata.features.torch import BigBatchLoader

    loader = BigBatchLoader(arts["features"], micro_batch_size=16, accumulation_steps=4, num_workers=0, rank=0,
                            world_size=1, seed=1)
    n = 0
    for step in loader:
        n += len(step)
        if every:
            saved(state_of(loader.state_dict), read)
    saved(state_of(loader.state_dict), True)
    return n


def epoch_tbl(arts, every: bool, read: bool = False) -> int:
    from warpdata.tbl.loader import TblLoader

    loader = TblLoader(arts["tbl"], 32, shuffle=True, seed=1, threads=1, rank=0, world_size=1)
    n = 0
    for k, b in enumerate(loader):
        n += len(b)
        if every:
            saved(state_of(lambda: loader.state_dict(k + 1)), read)  # noqa: B023 (called at once)
    saved(state_of(loader.state_dict), True)
    return n


LOADERS = {"Table.batches": epoch_table, "make_loader": epoch_warehouse, "BigBatchLoader": epoch_features,
           "TblLoader": epoch_tbl}


def timed(fn, arts, setting: str, off: bool) -> tuple[float, float, float, float, float]:
    """(samples/s, share of the epoch's wall time spent computing digests, µs per saved state, CPU seconds
    of digests per million samples, CPU µs per whole state_dict() call)."""
    SPENT[0], SPENT[1], SAVED[0], STATES[0], STATES[1] = 0.0, 0, 0, 0.0, 0
    every, read = SETTINGS[setting]
    with digests_off() if off else digests_timed():
        t0 = time.perf_counter()
        n = fn(arts, every, read)
        wall = time.perf_counter() - t0
    return (n / wall, SPENT[0] / wall, 1e6 * SPENT[0] / max(1, SAVED[0]), 1e6 * SPENT[0] / n,
            1e6 * STATES[0] / max(1, STATES[1]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--only", nargs="*", choices=list(LOADERS), help="these loaders only")
    a = ap.parse_args()
    arts = build()
    CLOCK[0] = calibrate()
    print(f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}; the timer's own cost, subtracted: "
          f"{1e6 * CLOCK[0]:.2f} µs a call")
    print(f"| loader | states saved | samples/s with digests | without | ratio (median of {a.rounds}) |"
          " per-round ratios | time in digests (median) | µs per saved state (median) |"
          " CPU-s of digests per 1 M samples (median) | CPU µs per whole state_dict() (median) |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name, fn in LOADERS.items():
        if a.only and name not in a.only:
            continue
        fn(arts, True, True)  # warm: page cache, imports, first-touch verification
        for setting in SETTINGS:
            on, off, share, per, cpu, whole = [], [], [], [], [], []
            for r in range(a.rounds):  # alternate, the first run of a round swapping each round
                for digest in ((True, False) if r % 2 == 0 else (False, True)):
                    rate, spent, each, per_m, state = timed(fn, arts, setting, off=not digest)
                    (on if digest else off).append(rate)
                    if digest:
                        share.append(spent)
                        per.append(each)
                        cpu.append(per_m)
                        whole.append(state)
            ratios = [x / y for x, y in zip(on, off, strict=True)]
            print(f"| {name} | {setting} | {statistics.median(on):,.0f} | "
                  f"{statistics.median(off):,.0f} | {statistics.median(ratios):.3f} | "
                  f"{', '.join(f'{x:.3f}' for x in ratios)} | {100 * statistics.median(share):.2f} % | "
                  f"{statistics.median(per):,.1f} | {statistics.median(cpu):.3f} | "
                  f"{statistics.median(whole):,.1f} |", flush=True)
    print(f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
