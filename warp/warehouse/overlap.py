"""The header pass overlapped with the build: shard tasks start while later images are still read.

Without it the ETL reads and hashes every image (the header pass), then plans, then builds: on
30,000 cold photos the pass is 8-11 s that no worker shares, whatever the worker count
(BENCHMARKS.md, "Session 8: the quiet reruns"). Here the pass streams its outcomes in label order
(:class:`~warpdata.warehouse.validate.ProbeStream`) into plan()'s own
:class:`~warpdata.warehouse.shards.ShardCutter`, and every shard's list of kept samples goes to
the executor's workers as soon as the cutter ends it, built into a folder of its
own (``<output root>/.warp-tmp-<pid>-overlap-<id>/``), while the pass goes on.

Why the output stays byte-identical and the version unchanged (docs/design.md §11, "The header
pass overlaps the build"):

* a shard's bytes depend only on its task (:func:`~warpdata.warehouse.shards.build_shard`: same
  task → same bytes), and the tasks are cut exactly as :func:`~warpdata.warehouse.shards.plan`
  cuts them, in label order, from the same samples;
* the one thing a task needs from the whole pass is ``samples_per_shard``, a function of the number
  of kept samples (:func:`~warpdata.warehouse.shards.samples_per_shard`, used as it is). It is
  taken from the number of label records, which bounds the kept count; once the pass is done the
  driver computes it again from the real count, and a speculative shard is adopted only when its
  task is the one :func:`plan` makes (same index, id, capacity, transform and the very same
  samples), else it is dropped and built again;
* the version (every image's hash, hence the whole pass) is computed as before, after the pass;
  adopted shards are moved into the version's build folder under its lock and receipted there,
  so a crash after that point resumes as before. Nothing is speculated on a rerun that may be up
  to date or resumable (a version or a build folder is already in the output root, and no
  ``--clear``): there the pass decides first, as before.
"""

from __future__ import annotations

import itertools
import os
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from warpdata.core import progress as _progress
from warpdata.core.atomic import temp_prefix
from warpdata.etl.workers import header_threads
from warpdata.warehouse import config as wconfig
from warpdata.warehouse.finalize import BUILD_PREFIX
from warpdata.warehouse.scan import Scan, load_labels, probe_params
from warpdata.warehouse.shards import (
    ShardCutter,
    ShardResult,
    ShardTask,
    build_shard,
    expected_shards,
    samples_per_shard,
)
from warpdata.warehouse.transform import TransformSpec
from warpdata.warehouse.validate import PROBE_BATCH, ProbeStream, ValidSample


def wanted(cfg: wconfig.WarehouseConfig, root: Path, clear: bool) -> bool:
    """Whether to overlap: asked for, and this build is not a rerun that may reuse what is there
    (a version of the output root, or a killed build's receipts), unless ``--clear``."""
    if not cfg.overlap:
        return False
    if clear or not root.is_dir():
        return True
    return not any(p.is_dir() and (p.name.startswith(BUILD_PREFIX) or (p.name.startswith("v") and "-" in p.name))
                   for p in root.iterdir())


def folder_for(root: Path) -> Path:
    """Where speculative shards are built: a temporary folder of this process in the output root
    (same filesystem as the build folder: adoption is a rename), removed by the caller."""
    return root / f"{temp_prefix()}overlap-{uuid.uuid4().hex[:12]}"


@dataclass
class Overlap:
    """What the overlapped pass built, and the counts that show it overlapped (``metrics.json``)."""

    folder: Path
    per_shard: int  # samples per shard taken from the label records' count
    images: int = 0  # label records: the images the header pass reads
    tasks: dict[int, ShardTask] = field(default_factory=dict)
    results: dict[int, ShardResult] = field(default_factory=dict)
    read_before_first: int | None = None  # images read when the first shard task went to the workers
    handed_during_pass: int = 0  # shard tasks handed over while the pass still had images to read
    adopted: int = 0
    build_s: float = 0.0  # from the first task handed over to the last speculative one finished

    def adopt(self, tasks: list[ShardTask]) -> dict[int, ShardResult]:
        """The speculative results whose task is ``tasks``'s own (by index), their shards moved to
        the tasks' paths; the others stay in the folder, which the caller removes."""
        out: dict[int, ShardResult] = {}
        for t in tasks:
            st, r = self.tasks.get(t.index), self.results.get(t.index)
            if st is None or r is None or t.upload is not None or not same_task(st, t):
                continue
            if r.samples:
                os.makedirs(os.path.dirname(t.path), exist_ok=True)
                try:
                    os.replace(st.path, t.path)
                except FileNotFoundError:  # no speculative file to adopt: plan()'s task builds it
                    continue
            out[t.index] = r
        self.adopted = len(out)
        return out

    def as_dict(self) -> dict[str, Any]:
        return {"images": self.images, "samples_per_shard": self.per_shard,
                "images_read_before_first_task": self.read_before_first,
                "tasks_handed_during_pass": self.handed_during_pass,
                "speculated": len(self.tasks), "adopted": self.adopted}


def same_task(a: ShardTask, b: ShardTask) -> bool:
    """``a`` builds the bytes ``b`` would: everything but the folder is the same, the samples the
    very same objects."""
    return (a.index, a.shard_id, os.path.basename(a.path), a.spec, a.max_boxes, a.capacity) == \
        (b.index, b.shard_id, os.path.basename(b.path), b.spec, b.max_boxes, b.capacity) and \
        len(a.samples) == len(b.samples) and all(x is y for x, y in zip(a.samples, b.samples, strict=True))


class _Planned:
    """The shard tasks as the pass cuts them, with the number expected (a Dask runner sizes its
    batches from it; warp/etl/runners.py)."""

    def __init__(self, it: Iterator[ShardTask], expected: int) -> None:
        self.it, self.expected = it, expected

    def __len__(self) -> int:
        return self.expected

    def __iter__(self) -> Iterator[ShardTask]:
        return self.it


# while a cluster starts (seconds), the pass reads on and cuts tasks for it, up to this many images
# and never more than half of them (the first tasks must still overlap the rest of the pass)
STARTING_IMAGES = 8192


def scan_building(cfg: wconfig.WarehouseConfig, workers: int, get_runner: Callable[[], Any], folder: Path,
                  spec: TransformSpec, ready: Callable[[], bool] = lambda: True) -> tuple[Scan, Overlap]:
    """Phases 2-3 (:func:`~warpdata.warehouse.scan.scan` of a local source) with the shards of
    every full list of kept samples built on ``get_runner()``'s workers while the pass reads on.
    ``get_runner`` is called once the pass has started; until ``ready()`` (a cluster starting)
    the pass reads on and cuts tasks, up to :data:`STARTING_IMAGES`."""
    phases: dict[str, float] = {}
    t = time.perf_counter()
    ls, q = load_labels(cfg)
    phases["labels"] = time.perf_counter() - t
    t = time.perf_counter()
    records = list(ls.records)
    per = samples_per_shard(cfg, len(records))
    ov = Overlap(folder, per, len(records))
    sc = Scan(ls, q, [], [], 0, phases, "driver")
    threads = header_threads(workers)
    stream = ProbeStream(records, workers=threads, limits=cfg.limits, batch=min(PROBE_BATCH, per),
                         ahead=2 * threads, **probe_params(cfg))
    t_first: list[float] = []

    def hand(i: int, samples: list[ValidSample]) -> ShardTask:
        sid = f"shard-{i:05d}"
        task = ShardTask(i, sid, str(folder / f"{sid}.twh1"), spec, cfg.max_boxes, per, samples)
        ov.tasks[i] = task
        return task

    def taken(tasks: Iterator[ShardTask]) -> Iterator[ShardTask]:
        """The tasks as the runner takes them, counted then."""
        for task in tasks:
            if ov.read_before_first is None:
                ov.read_before_first = stream.read
                t_first.append(time.perf_counter())
            if stream.read < len(records):
                ov.handed_during_pass += 1
            yield task

    def cut() -> Iterator[ShardTask]:
        cutter = ShardCutter(per, bool(cfg.shard_samples))  # plan()'s own cut, pushed as samples arrive
        kept = i = 0
        for o in stream:
            s = sc.add(o)
            if s is None or (cfg.skip_empty and s.empty):
                continue
            kept += 1
            for run in cutter.push(s):
                yield hand(i, run)
                i += 1
        phases["probe"] = time.perf_counter() - t
        if samples_per_shard(cfg, kept) == per:  # else no speculative task is plan()'s
            for run in cutter.finish():
                yield hand(i, run)
                i += 1

    try:
        gen = cut()
        early: list[ShardTask] = []
        while not ready() and (len(early) + 1) * per <= min(STARTING_IMAGES, len(records) // 2):
            task = next(gen, None)
            if task is None:
                break
            early.append(task)
        runner = get_runner()
        planned = taken(itertools.chain(early, gen))
        with _progress.progress("reading images, building shards", total=len(records), unit="img") as bar:
            expected = expected_shards(len(records), per, bool(cfg.shard_samples))
            for r in runner.imap_unordered(build_shard, _Planned(planned, expected)):
                ov.results[r.index] = r
                bar.advance(r.samples + len(r.failures))
        gen.close()
    finally:
        stream.close()
    phases.setdefault("probe", time.perf_counter() - t)
    if t_first:
        ov.build_s = time.perf_counter() - t_first[0]
    return sc, ov
