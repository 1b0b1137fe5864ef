"""Phases 2-3 of ``warp etl`` for detection labels: load the labels, then read, hash and probe
every image (the header pass).

:func:`scan` is what the build (:mod:`warpdata.warehouse.etl`) and the live loader
(:mod:`warpdata.warehouse.live`) start from, so both see the same samples, rejected for the same
reasons (docs/formats/twh1.md). A source on object storage is probed through
:mod:`warpdata.warehouse.remote`; a shared filesystem's on an external cluster's workers
(docs/design.md §11).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Any

from warpdata.core import progress as _progress
from warpdata.etl import cut
from warpdata.etl.executors import LocalRunner
from warpdata.etl.quarantine import Quarantine
from warpdata.etl.workers import header_threads
from warpdata.warehouse import config as wconfig
from warpdata.warehouse import labels as wlabels
from warpdata.warehouse import remote
from warpdata.warehouse.validate import (
    PROBE_BATCH,
    LocalProbeBatch,
    ProbeOutcome,
    ValidSample,
    probe_all,
    probe_local_batch,
)


@dataclass
class Scan:
    """Labels loaded, every image probed: what the build (and the live loader) start from."""

    labels: wlabels.LabelSet
    quarantine: Quarantine  # label and probe rejections only
    valid: list[ValidSample]
    sources: list[tuple[str, str, int]]
    truncated_boxes: int
    phases: dict[str, float]
    header_pass: str = "driver"  # where images were read and hashed: "driver" or "workers"

    def add(self, o: ProbeOutcome) -> ValidSample | None:
        """Take one outcome of the header pass, in label order; the sample when it is valid."""
        if o.source_hash:
            self.sources.append(o.source_hash)
        if o.reject:
            self.quarantine.reject(*o.reject)
        elif o.sample is not None:
            self.valid.append(o.sample)
            self.truncated_boxes += o.truncated_boxes
            return o.sample
        return None

    def kept(self, skip_empty: bool) -> list[ValidSample]:
        return [s for s in self.valid if not (skip_empty and s.empty)]


def scan(cfg: wconfig.WarehouseConfig, workers: int = 1, runner: Any = None) -> Scan:
    """Phases 2-3: load labels, then read, hash and probe every image.

    A source on object storage (``cfg.remote_root``) is probed on ``runner``'s
    workers (one GET per image, the bytes spooled for the build:
    warehouse/remote.py); without a runner, on a local thread pool.
    """
    phases: dict[str, float] = {}
    t = time.perf_counter()
    listing = None
    if cfg.remote_root:
        _root, listing = remote.prepare(cfg.root, cfg.remote_root, cfg.labels, cfg.images, cfg.format)
    ls, q = load_labels(cfg)
    phases["labels"] = time.perf_counter() - t
    t = time.perf_counter()
    params = probe_params(cfg)
    if cfg.remote_root:
        outcomes = _probe_remote(cfg, ls.records, listing, params, workers, runner)
    elif runner is not None:
        outcomes = _probe_on_runner(cfg, ls.records, params, runner)
    else:
        outcomes = probe_all(ls.records, workers=header_threads(workers), limits=cfg.limits, **params)
    sc = Scan(ls, q, [], [], 0, phases, "workers" if runner is not None else "driver")
    for o in outcomes:
        sc.add(o)
    phases["probe"] = time.perf_counter() - t
    return sc


def load_labels(cfg: wconfig.WarehouseConfig) -> tuple[wlabels.LabelSet, Quarantine]:
    """Phase 2: the label records, and a quarantine holding the labels' own rejections."""
    ls = wlabels.load(cfg.format, cfg.root, cfg.labels, cfg.images, cfg.classes, cfg.min_box_size, cfg.limits)
    q = Quarantine()
    for rej in ls.rejects:
        q.reject(*rej)
    return ls, q


def probe_params(cfg: wconfig.WarehouseConfig) -> dict[str, Any]:
    """The box checks of the header pass (warehouse/validate.py)."""
    return dict(tolerance=cfg.box_tolerance, min_box=cfg.min_box_size, max_boxes=cfg.max_boxes,
                overflow=cfg.overflow)


REMOTE_PROBE_BATCH = 64


def _probe_remote(cfg: wconfig.WarehouseConfig, records: list, listing: Any, params: dict[str, Any],
                  workers: int, runner: Any) -> list:
    """The header pass of a source on object storage. An object whose listed size and ETag are
    those an earlier run recorded is not read again: its recorded hash and header give the same
    outcome (docs/formats/receipts.md, "Sources on object storage"), so an up-to-date rerun costs
    LIST requests, not a GET per image."""
    sizes, tags = listing.sizes, listing.tags
    known = remote.known_facts(remote.load_facts(cfg.remote_root), listing)
    batches = []
    for i, part in enumerate(cut(records, REMOTE_PROBE_BATCH)):
        rels = [os.path.relpath(r.image, cfg.root).replace(os.sep, "/") for r in part]
        batches.append(remote.ProbeBatch(i, cfg.remote_root, str(cfg.root), list(part),
                                         {k: sizes[k] for k in rels if k in sizes}, params, cfg.limits,
                                         {k: tags[k] for k in rels if k in tags},
                                         {k: known[k] for k in rels if k in known}, listing.listed))
    learnt: dict[str, dict[str, Any]] = {}
    if runner is not None:
        out = _probe_batches(runner, remote.probe_batch, batches, len(records), learnt)
    else:
        own = LocalRunner(max(1, min(workers, len(batches) or 1)))
        try:
            out = _probe_batches(own, remote.probe_batch, batches, len(records), learnt)
        finally:
            own.close()
    if learnt or len(known) != len(remote.load_facts(cfg.remote_root)):
        # what is true of the listed objects now, for the next run (the facts of objects gone dropped)
        remote.save_facts(cfg.remote_root, {**known, **learnt})
    return out


def _probe_batches(runner: Any, fn: Any, batches: list, total: int,
                   learnt: dict[str, Any] | None = None) -> list:
    """The header pass's outcomes, in record order, from ``fn`` over ``batches`` on ``runner``
    (each batch returns ``(index, outcomes)``, or ``(index, outcomes, facts learnt)`` merged into
    ``learnt``; they finish in any order)."""
    parts = {}
    with _progress.progress("reading images", total=total, unit="img") as bar:
        for res in runner.imap_unordered(fn, batches):
            parts[res[0]] = res[1]
            if learnt is not None and len(res) > 2:
                learnt.update(res[2])
            bar.advance(len(res[1]))
    return [o for i in range(len(batches)) for o in parts[i]]


def _probe_on_runner(cfg: wconfig.WarehouseConfig, records: list, params: dict[str, Any], runner: Any) -> list:
    """The header pass of a source on a shared filesystem, on an external cluster's workers: at
    scale the driver would otherwise read and hash every image itself (docs/design.md §11)."""
    batches = [LocalProbeBatch(i, list(part), params, cfg.limits) for i, part in enumerate(cut(records, PROBE_BATCH))]
    return _probe_batches(runner, probe_local_batch, batches, len(records))

