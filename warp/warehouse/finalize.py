"""Phase 6 of ``warp etl`` for detection labels: the version's outputs and its one-step commit.

After the last shard, the side tables (``samples.parquet``, ``sources.parquet``, the
quarantine's summaries; docs/lineage.md), the sealed manifest (docs/formats/twh1.md,
"Manifest") and ``metrics.json`` are written into the build directory
``<root>/.warp-tmp-build-<hash12>/``, which is then renamed to ``<root>/vYYYYMMDD-<hash12>/`` in
one step (:func:`commit_version`): a killed ETL never leaves a visible version. An output on
object storage is uploaded instead, the manifest last (:func:`finish_in_store`;
docs/formats/receipts.md, "Object storage"). :func:`remove_leftovers` clears what killed builds
left. The pipeline that calls these is :mod:`warpdata.warehouse.etl`.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import os
import shutil
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from warpdata.core import sidetables
from warpdata.core.atomic import (
    TMP_PREFIX,
    atomic_file,
    atomic_write_bytes,
    build_lock,
    exchange,
    fsync_dir,
    remove_stale_temps,
    remove_unless_locked,
    temp_prefix,
)
from warpdata.core.canonical import canonical_json, seal
from warpdata.core.errors import DataError
from warpdata.etl import objectstore
from warpdata.etl.quarantine import Quarantine, Verdict
from warpdata.etl.receipts import Journal
from warpdata.formats import twh1
from warpdata.warehouse import config as wconfig
from warpdata.warehouse import labels as wlabels
from warpdata.warehouse import manifest as wmanifest
from warpdata.warehouse.shards import ShardResult, ShardTask

BUILD_PREFIX = f"{TMP_PREFIX}build-"


def verify_version(path: Path, version: str, workers: int) -> dict[str, Any] | None:
    """The manifest if ``path`` is a complete, checksum-verified build of ``version``."""
    try:
        doc = wmanifest.read(path)
    except DataError:
        return None
    if doc.get("version") != version:
        return None

    def ok(sh: dict) -> bool:
        p = path / sh["relative_path"]
        try:
            if p.stat().st_size != sh["size_bytes"]:
                return False
            with twh1.TWH1Shard(p) as s:
                s.verify(sh["checksum_sha256"])
            return True
        except (OSError, DataError):
            return False

    with ThreadPoolExecutor(max(1, workers)) as ex:
        if not all(ex.map(ok, doc["shards"])):
            return None
    if sidetables.problems(path, doc, str(path / wmanifest.MANIFEST_NAME), wmanifest.REBUILD_HINT):
        return None  # an edited side table: the version is rebuilt as a damaged one is
    return doc


def version_lock(root: Path, version: str) -> contextlib.AbstractContextManager[None]:
    """The exclusive ``flock`` that serialises concurrent ETLs of one version."""
    return build_lock(root / f"{BUILD_PREFIX}{version[:12]}.lock", f"version {version[:12]} in {root}")


def fresh_build_dir(root: Path, version: str, *, clear: bool, older_than: float,
                    spare: tuple[str, ...] = ()) -> Path:
    """The build directory of ``version`` (held under :func:`version_lock`): kept from a killed run
    unless ``clear`` (its receipts let the rerun resume), without the killed run's half-written files;
    other versions' leftovers are removed, but never a temporary named in ``spare`` (this run's own,
    e.g. the overlapped pass's folder: warp/warehouse/overlap.py)."""
    build_dir = root / f"{BUILD_PREFIX}{version[:12]}"
    remove_leftovers(root, keep=build_dir, older_than=older_than, spare=spare)
    if clear and build_dir.exists():
        shutil.rmtree(build_dir)
    build_dir.mkdir(parents=True, exist_ok=True)
    for leftover in build_dir.glob(f"{TMP_PREFIX}*"):  # half-written files of a killed run (we hold the lock)
        leftover.unlink()
    return build_dir


def manifest_doc(cfg: wconfig.WarehouseConfig, recipe: dict[str, Any], version: str, code_version: str,
                 q: Quarantine, verdict: Verdict, classes: list[str], results: list[ShardResult],
                 files: dict[str, str], where: Path) -> dict[str, Any]:
    """The sealed manifest of a build, validated against ``manifest.schema.json``."""
    shards = []
    first = 0
    for r in results:
        if not r.samples:
            continue
        shards.append({"id": r.shard_id, "relative_path": r.file_name, "shard_version": twh1.SHARD_VERSION,
                       "samples": r.samples, "width": cfg.width, "height": cfg.height, "channels": 3,
                       "max_boxes": cfg.max_boxes, "dtype": twh1.MANIFEST_DTYPE[cfg.dtype],
                       "endianness": "Little", "checksum_sha256": r.sha256, "size_bytes": r.size_bytes,
                       "first_sample": first})
        first += r.samples
    doc = {
        "kind": wmanifest.KIND, "format": "TWH1", "manifest_version": wmanifest.MANIFEST_VERSION,
        "dataset_root": cfg.dataset_root_text, "source_format": cfg.format,
        "transform": cfg.transform_dict(), "version": version,
        "version_recipe": canonical_json(recipe).decode("utf-8"), "code_version": code_version,
        "default_dtype": twh1.MANIFEST_DTYPE[cfg.dtype], "default_shard_version": twh1.SHARD_VERSION,
        "thresholds": cfg.thresholds.to_dict(),
        "summary": {**q.summary(), "verdict": verdict.to_dict()}, "shards": shards,
        "classes": classes, "num_samples": first, "box_format": "xyxy-pixels", "files": files,
        # every side table but metrics.json (timings: not sealed) by SHA-256 and size; readers check
        # the one they read (docs/formats/twh1.md, "Manifest")
        sidetables.FIELD: sidetables.record(where, [n for k, n in files.items() if k != "metrics"]),
    }
    # sealed: no timestamp or timing inside, so the same inputs give the same manifest bytes
    # wherever and whenever they are built (docs/formats/twh1.md, "Manifest")
    doc = seal(doc)
    wmanifest.validate_manifest(doc, str(where / wmanifest.MANIFEST_NAME))
    return doc


def commit_version(build_dir: Path, root: Path, version: str, doc: dict[str, Any], results: list[ShardResult],
                   *, durable: bool, workers: int) -> Path:
    """Write the manifest into ``build_dir`` and rename it to ``<root>/vYYYYMMDD-<hash12>/`` in one
    step, replacing an older copy of the same version; returns the version directory."""
    if durable:
        fsync_files([build_dir / r.file_name for r in results if r.samples and r.reused], workers)
    atomic_write_bytes(build_dir / wmanifest.MANIFEST_NAME, canonical_json(doc), fsync=durable)
    fsync_dir(build_dir)
    date = _dt.datetime.now(_dt.UTC).strftime("%Y%m%d")
    final = root / wmanifest.version_dir_name(version, date)
    old = None
    if final.exists():
        # --clear or a corrupt copy from today: trade places in one step (no instant without a
        # version directory); the build directory's name then holds the old tree
        if exchange(build_dir, final):
            old = build_dir
        else:  # the two-rename fallback of warpdata.core.atomic (docs/formats/twh1.md)
            old = root / f"{temp_prefix()}old-{final.name}"
            os.replace(final, old)
            os.replace(build_dir, final)
    else:
        os.replace(build_dir, final)
    fsync_dir(root)
    for stale in wmanifest.find_versions(root, version):
        if stale != final:  # --clear or a corrupt copy from another day
            shutil.rmtree(stale, ignore_errors=True)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
    return final


def finish_in_store(store: str, vdir: str, build_dir: Path, doc: dict[str, Any], results: list[ShardResult],
                    journal: Journal, root: Path) -> tuple[str, dict[str, int], float]:
    """The shards are in the store already: upload the rest, the manifest last, then ``latest``,
    then drop the store's receipts and the local staging copy. Returns the version's URL, the
    upload counts and the seconds the upload took."""
    atomic_write_bytes(build_dir / wmanifest.MANIFEST_NAME, canonical_json(doc))
    local = root / vdir
    if local.exists():
        shutil.rmtree(local)
    os.replace(build_dir, local)
    t_up = time.perf_counter()
    dest, counts = objectstore.upload_version(local, store)
    built = sum(1 for r in results if r.samples and not r.reused)
    counts = {"uploaded": counts["uploaded"] + built, "reused": counts["reused"] - built}
    journal.remove()
    shutil.rmtree(local, ignore_errors=True)
    return dest, counts, time.perf_counter() - t_up


# per-sample side tables are cut in row groups of this many rows, so `warp why` reads one row group
# (found from the footer's statistics) instead of a million rows (docs/lineage.md)
LOOKUP_ROW_GROUP = 16384


def write_parquet(path: Path, columns: dict[str, Any], row_group_size: int | None = None) -> None:
    import pyarrow as pa  # heavy: only the build's last phase writes Parquet
    import pyarrow.parquet as pq

    table = columns if isinstance(columns, pa.Table) else pa.table(columns)
    with atomic_file(path, fsync=False) as f:
        pq.write_table(table, f, compression="zstd", row_group_size=row_group_size)


def export_samples(d: Path, tasks: list[ShardTask], results: list[ShardResult], dataset_root: Path) -> str:
    """``samples.parquet``: one row per written sample, in reader order (``wh[sample]``).

    Rows follow the shards' commit order (each task's samples minus its
    full-decode failures), so the bytes depend only on the plan and the
    failures, never on the worker count or scheduling.
    """
    import pyarrow as pa  # heavy: only the build's last phase writes Parquet

    failed = {r.index: {f[1] for f in r.failures} for r in results}
    written = {r.index for r in results if r.samples}
    cols: dict[str, list] = {c: [] for c in ("key", "shard_id", "shard_index", "n_boxes", "class_ids",
                                             "frame_id", "run_id", "source_path", "label_source",
                                             "annotation_ids")}
    # the driver's per-sample work bounds a cluster's rate (docs/design.md §11): plain string and
    # list operations here, no Path object per sample
    prefix = os.path.join(str(dataset_root), "")

    def source_path(image: str) -> str:
        if image.startswith(prefix) and os.path.normpath(image) == image:
            return image[len(prefix):].replace(os.sep, "/")
        return wlabels.rel_path(dataset_root, Path(image))

    for t in tasks:
        if t.index not in written:
            continue
        i = 0
        for s in t.samples:
            if s.key in failed.get(t.index, ()):
                continue
            cols["key"].append(s.key)
            cols["shard_id"].append(t.shard_id)
            cols["shard_index"].append(i)
            cols["n_boxes"].append(len(s.boxes))
            cols["class_ids"].append(s.classes.tolist() if hasattr(s.classes, "tolist") else [int(c) for c in s.classes])
            cols["frame_id"].append(int(s.frame_id))
            cols["run_id"].append(s.run_id)
            cols["source_path"].append(source_path(s.image))
            cols["label_source"].append(s.source)
            cols["annotation_ids"].append(s.ann_ids)
            i += 1
    n = len(cols["key"])
    table = pa.table({
        "sample": pa.array(range(n), pa.int64()),
        "key": pa.array(cols["key"], pa.string()),
        "shard_id": pa.array(cols["shard_id"], pa.string()),
        "shard_index": pa.array(cols["shard_index"], pa.int32()),
        "n_boxes": pa.array(cols["n_boxes"], pa.int32()),
        "class_ids": pa.array(cols["class_ids"], pa.list_(pa.int32())),
        "frame_id": pa.array(cols["frame_id"], pa.int64()),
        "run_id": pa.array(cols["run_id"], pa.string()),
        "source_path": pa.array(cols["source_path"], pa.string()),
        "label_source": pa.array(cols["label_source"], pa.string()),
        "annotation_ids": pa.array(cols["annotation_ids"], pa.list_(pa.string())),
    })
    write_parquet(d / "samples.parquet", table, LOOKUP_ROW_GROUP)
    return "samples.parquet"


def export_summaries(d: Path, q: Quarantine, sources: list[tuple[str, str, int]]) -> dict[str, str]:
    files = q.write_parquet(d)
    write_parquet(d / "sources.parquet", {"key": [s[0] for s in sources], "sha256": [s[1] for s in sources],
                                           "size": [s[2] for s in sources]}, LOOKUP_ROW_GROUP)
    return {**files, "sources": "sources.parquet", "metrics": "metrics.json"}


def remove_leftovers(root: Path, *, keep: Path | None = None, older_than: float | None = None,
                     spare: tuple[str, ...] = ()) -> list[str]:
    """Remove what killed ETLs left in output root ``root``; returns the removed paths.

    * build directories ``.warp-tmp-build-<hash12>/`` of other versions whose
      lock no running ETL holds (the current version's is kept: a rerun resumes
      from its receipts);
    * ``.warp-tmp-*`` files and directories (old trees of an interrupted
      replace, half-written shards) changed before ``older_than`` whose writer
      is gone. A temporary of this very process is told by its time alone, and a file's time
      is the filesystem's clock (coarse, and on some mounts another machine's), which may run
      behind ``older_than``: this run's own temporaries in use are named in ``spare``.

    Called at the start of every build; a library hook for ``warp cache gc``.
    """
    removed: list[str] = []
    if not root.is_dir():
        return removed
    for d in root.glob(f"{BUILD_PREFIX}*"):
        if not d.is_dir() or d.is_symlink() or d == keep:
            continue
        if remove_unless_locked(d, root / f"{d.name}.lock"):  # kept while an ETL of that version runs
            removed.append(str(d))
    others = [p for p in root.glob(f"{TMP_PREFIX}*") if not p.name.startswith(BUILD_PREFIX)]
    if others:
        removed += remove_stale_temps([root], older_than=older_than, exclude=(BUILD_PREFIX, *spare))
    return removed


def fsync_path(p: str | Path) -> None:
    fd = os.open(p, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_files(paths: list[Path], workers: int) -> None:
    with ThreadPoolExecutor(max(1, workers)) as ex:
        list(ex.map(fsync_path, paths))


def build_metrics(results: list[ShardResult], phases: dict[str, float], workers: int,
                  cfg: wconfig.WarehouseConfig, written: int, truncated_boxes: int, q: Quarantine, wall: float) -> dict[str, Any]:
    """``metrics.json``: timings, rates and counts of one build (outputs, not version inputs)."""
    cpu: dict[str, float] = {}
    for r in results:
        for k, v in r.timings.items():
            cpu[k] = cpu.get(k, 0.0) + v
    build_s = phases.get("build", 0.0)
    nbytes = sum(r.size_bytes for r in results)
    built = [r for r in results if not r.reused]
    n_built = sum(r.samples for r in built)
    return {
        "workers": workers, "executor": cfg.executor, "phases_s": {k: round(v, 4) for k, v in phases.items()},
        "cpu_s": {k: round(v, 4) for k, v in sorted(cpu.items())},
        "cpu_ms_per_sample": {k: round(1000 * v / n_built, 4) for k, v in sorted(cpu.items())} if n_built else {},
        "samples_written": written, "samples_built": n_built, "shards": len([r for r in results if r.samples]),
        "shards_reused": len(results) - len(built), "bytes_written": nbytes,
        "build_samples_per_s": round(n_built / build_s, 2) if build_s and n_built else None,
        "build_mb_per_s": round(sum(r.size_bytes for r in built) / 1e6 / build_s, 2) if build_s and built else None,
        "durable": cfg.durable, "skip_reasons": q.aggregate().by_reason, "skipped_empty": q.aggregate().skipped,
        "truncated_boxes": truncated_boxes, "wall_s": round(wall, 4),
        # how the built shards reached the disk: O_DIRECT (no page-cache copy) or buffered
        "direct_io_fraction": round(sum(r.direct_bytes for r in built) / max(1, sum(r.size_bytes for r in built)), 4),
    }
