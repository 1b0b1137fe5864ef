"""Store garbage collection: delete the blobs no version manifest references (docs/formats/registry.md,
"Garbage collection").

:func:`collect` is ``warp gc``. **Mark**: the union of :func:`referenced_hashes` over every version
manifest of every dataset in the store (one LIST of ``datasets/``, one GET per manifest). **Sweep**:
every ``blobs/sha256/<h[:2]>/<h>`` object outside that set whose last-modified time is at least
``grace`` seconds old is deleted; younger ones (an upload in progress, an aborted publish a rerun
will finish) are kept and counted. ``drop`` names versions (``WS/NAME@VERSION``) whose manifests are
deleted once the others are marked, so the blobs only they used go in the same run; the version ``latest.json`` names is
never dropped (:class:`~warpdata.core.errors.UsageError`, exit 2).

Nothing is deleted on incomplete marking: a manifest that cannot be read or does not validate stops
the run before its first deletion (:class:`~warpdata.core.errors.ManifestCorruptedError` naming the
key, exit 65). A read-only (HTTP) store refuses at once
(:class:`~warpdata.core.errors.ReadOnlyStoreError`, exit 78).

**The race with a publish.** A publish checks which blobs the store has, uploads the others, then
writes its manifest. A sweep between the check and the manifest could delete a blob the publish
found present and skipped. The protocol that closes it:

* gc writes the marker :data:`MARKER_KEY` (``started``, host, pid) before it deletes anything, lists
  the manifests again just before its first deletion (a manifest written while it marked protects
  its blobs), and records ``finished`` in the marker when done;
* a publish notes the time its existence check began, and after writing its manifest reads the
  marker (one GET, normally a 404). When a sweep is unfinished, or finished later than
  :data:`CLOCK_MARGIN_S` before the check began, it waits for the sweep to end
  (:func:`wait_for_sweep`, at most ``WAIT_S``; then
  :class:`~warpdata.core.errors.InfrastructureError`, exit 75, naming the marker), checks every blob
  of its version again and uploads the missing ones (:func:`after_manifest`) before moving
  ``latest``. A sweep whose process is gone (same host) is not waited for; after a timeout the
  blobs deleted so far are uploaded again and ``latest`` stays where it was.

One sweep runs at a time: a second ``warp gc`` finding an unfinished marker refuses
(:class:`~warpdata.core.errors.LockTimeoutError`, exit 75), unless that sweep is abandoned (its
process is gone on this host, or it started more than :data:`ABANDONED_AFTER_S` ago).

Library code: nothing here prints; ``commands/gc.py`` renders :class:`GcResult`.
"""

from __future__ import annotations

import os
import re
import socket
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from warpdata.core.canonical import canonical_json
from warpdata.core.errors import (
    DataError,
    InfrastructureError,
    LockTimeoutError,
    ManifestCorruptedError,
    ReadOnlyStoreError,
    UsageError,
)
from warpdata.core.jsondoc import load_json
from warpdata.registry.manifest import Manifest, blob_key, validate_dataset_id
from warpdata.registry.store import Store

__all__ = ["ABANDONED_AFTER_S", "CLOCK_MARGIN_S", "DEFAULT_GRACE_S", "MARKER_KEY", "WAIT_S", "GcResult",
           "SweepMarker", "after_manifest", "collect", "parse_drop", "parse_grace", "read_marker",
           "referenced_hashes", "wait_for_sweep"]

MARKER_KEY = "gc/sweep.json"
MARKER_KIND = "warp-gc-sweep"
DEFAULT_GRACE_S = 24 * 3600.0
# how far apart the clocks of a gc host and a publishing host may be: a sweep that finished up to
# this long before a publish's existence check began (by the two clocks) still counts as overlapping
CLOCK_MARGIN_S = 300.0
# an unfinished sweep this old is taken to be dead: the next 'warp gc' takes its marker over
ABANDONED_AFTER_S = 6 * 3600.0
# how long a publish waits for an overlapping sweep to finish before it gives up (exit 75)
WAIT_S = 600.0

_MANIFEST_KEY = re.compile(r"^datasets/([^/]+)/([^/]+)/versions/([0-9a-f]{64})\.json$")
_BLOB_KEY = re.compile(r"^blobs/sha256/([0-9a-f]{2})/([0-9a-f]{64})$")
_GRACE = re.compile(r"^\s*(\d+(?:\.\d*)?)\s*([smhd])\s*$")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def referenced_hashes(manifest: Manifest) -> set[str]:
    """Every blob hash ``manifest`` needs from the store: each table shard, artifact shard (or, for a
    chunked shard, each of its chunks: the shard's own hash is then no store object) and artifact
    index (:meth:`~warpdata.registry.manifest.Manifest.stored_blobs`). These are the blobs a reader,
    ``warp warm`` and ``inspect --verify`` fetch; embeddings are tables and artifacts of the version
    like any other (warp/registry/embeddings.py)."""
    return {b.hash for b in manifest.stored_blobs()}


def parse_grace(spec: str) -> float:
    """Seconds of ``--grace``: a number with a unit, ``s``, ``m``, ``h`` or ``d`` (``24h``, ``90m``);
    ``0`` alone is accepted. Anything else is a :class:`UsageError` (exit 2)."""
    if spec.strip() == "0":
        return 0.0
    m = _GRACE.match(spec)
    if not m:
        raise UsageError(f"--grace {spec!r} is not a duration with a unit",
                         hint="e.g. --grace 24h, --grace 30m, --grace 7d, or --grace 0 to delete every "
                              "unreferenced blob")
    return float(m.group(1)) * _UNITS[m.group(2)]


def parse_drop(spec: str) -> tuple[str, str]:
    """``(dataset_id, version)`` of a ``--drop WS/NAME@VERSION``."""
    did, sep, version = spec.partition("@")
    if not sep or not version or "/" not in did:
        raise UsageError(f"--drop {spec!r} is not WS/NAME@VERSION",
                         hint="name a version by its hash or a unique prefix of 6+ hex digits, e.g. "
                              "--drop vision/coco@3fa9c2e1b7d0; 'warp ls WS/NAME --versions' lists them")
    return validate_dataset_id(did), version


# -- the marker ------------------------------------------------------------------

@dataclass(frozen=True)
class SweepMarker:
    """What ``gc/sweep.json`` says: who swept, from when (epoch seconds, the gc host's clock) to when."""

    sweep_id: str
    host: str
    pid: int
    started: float
    finished: float | None
    token: str  # compare-and-swap token of the marker object

    @property
    def running(self) -> bool:
        return self.finished is None

    def overlaps(self, since: float) -> bool:
        """Whether this sweep may have deleted blobs after ``since`` (a publish's clock), allowing
        :data:`CLOCK_MARGIN_S` of skew between the two hosts."""
        return self.finished is None or self.finished >= since - CLOCK_MARGIN_S

    def abandoned(self, now: float) -> bool:
        """Unfinished and dead: its process is gone on this host, or it started too long ago."""
        if not self.running:
            return False
        if now - self.started > ABANDONED_AFTER_S:
            return True
        if self.host == socket.gethostname():
            try:
                os.kill(self.pid, 0)
            except ProcessLookupError:
                return True
            except PermissionError:
                return False
        return False

    def describe(self) -> str:
        return f"sweep {self.sweep_id} by pid {self.pid} on {self.host}, started {_iso(self.started)}"


def _iso(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def read_marker(store: Store) -> SweepMarker | None:
    """The sweep marker of ``store`` (one GET), or None when no gc ever ran there."""
    got = store.call(store.objects.read_versioned, store.url_of(MARKER_KEY), "read", MARKER_KEY)
    if got is None:
        return None
    data, token = got
    where = store.url_of(MARKER_KEY)
    try:
        doc = load_json(data, where, error=DataError)
        if doc.get("kind") != MARKER_KIND:
            raise ValueError("kind")
        fin = doc.get("finished")
        return SweepMarker(str(doc["id"]), str(doc["host"]), int(doc["pid"]), float(doc["started"]),
                           None if fin is None else float(fin), token)
    except (ValueError, KeyError, TypeError, AttributeError):
        raise DataError(f"{where} is not a warp gc sweep marker",
                        hint="when no 'warp gc' is running on this store, delete that object; publishes "
                             "and gc read it to stay out of each other's way (docs/formats/registry.md)") from None


def _marker_bytes(sweep_id: str, started: float, finished: float | None, deleted: int | None) -> bytes:
    doc: dict[str, Any] = {"kind": MARKER_KIND, "id": sweep_id, "host": socket.gethostname(), "pid": os.getpid(),
                           "started": started, "started_at": _iso(started), "finished": finished,
                           "finished_at": None if finished is None else _iso(finished)}
    if deleted is not None:
        doc["deleted"] = deleted
    return canonical_json(doc)


def _begin(store: Store) -> tuple[str, float, str]:
    """Write an unfinished marker (compare-and-swap over the last one): (sweep id, start, token)."""
    current = read_marker(store)
    now = time.time()
    if current is not None and current.running and not current.abandoned(now):
        raise LockTimeoutError(f"another warp gc is sweeping {store.url}: {current.describe()} "
                               f"({store.url_of(MARKER_KEY)})",
                               hint="wait for it to finish and run 'warp gc' again; a sweep whose process is "
                                    f"gone is taken over at once on its host, anywhere after "
                                    f"{ABANDONED_AFTER_S / 3600:g} h")
    sweep_id = uuid.uuid4().hex[:16]
    token = store.swap_object(MARKER_KEY, _marker_bytes(sweep_id, now, None, None),
                              current.token if current else None)
    if token is None:
        raise LockTimeoutError(f"another warp gc started sweeping {store.url} at the same time "
                               f"({store.url_of(MARKER_KEY)})", hint="run 'warp gc' again when it has finished")
    return sweep_id, now, token


def _finish(store: Store, sweep_id: str, started: float, token: str, deleted: int) -> None:
    """Record the end of the sweep (only over our own marker: a gc that took it over finishes its own)."""
    store.swap_object(MARKER_KEY, _marker_bytes(sweep_id, started, time.time(), deleted), token)


def wait_for_sweep(store: Store, marker: SweepMarker, *, timeout: float = WAIT_S, poll: float = 1.0,
                   sleep: Callable[[float], None] = time.sleep) -> SweepMarker:
    """Wait until ``marker``'s sweep has finished or is known dead (its process gone on this host: a
    dead sweep deletes nothing more), re-reading the marker every ``poll`` seconds; the last marker
    read. A sweep still running after ``timeout`` seconds is an InfrastructureError (exit 75)."""
    deadline = time.monotonic() + timeout
    current: SweepMarker | None = marker
    while current is not None and current.running and not current.abandoned(time.time()):
        if time.monotonic() >= deadline:
            raise InfrastructureError(
                f"a warp gc is still sweeping {store.url} after {timeout:g} s: {current.describe()} "
                f"({store.url_of(MARKER_KEY)}); latest was not moved",
                hint="publish again when it has finished (the blobs are checked again then); if that gc "
                     "died, run 'warp gc' to take its sweep over (at once on its host, anywhere after "
                     f"{ABANDONED_AFTER_S / 3600:g} h)")
        sleep(poll)
        current = read_marker(store)
    return current if current is not None else marker


def after_manifest(store: Store, since: float, hashes: Iterable[str], reupload: Callable[[list[str]], None], *,
                   timeout: float = WAIT_S, sleep: Callable[[float], None] = time.sleep) -> int:
    """A publish's step after writing its manifest, before moving ``latest``: when a sweep may have
    overlapped the publish since ``since`` (epoch seconds, just before its existence check), wait for
    it, check ``hashes`` again and ``reupload`` the missing ones; how many there were. One GET of the
    marker when no sweep overlapped. When the wait times out, the blobs deleted so far are uploaded
    again before the InfrastructureError (exit 75) goes up."""
    marker = read_marker(store)
    if marker is None or not marker.overlaps(since):
        return 0
    hashes = list(hashes)
    try:
        wait_for_sweep(store, marker, timeout=timeout, sleep=sleep)
    except InfrastructureError:
        gone = store.missing_blobs(hashes)
        if gone:
            reupload(gone)
        raise
    gone = store.missing_blobs(hashes)
    if gone:
        reupload(gone)
    return len(gone)


# -- the collector ------------------------------------------------------------------

@dataclass
class GcResult:
    """What a run found and did (``dry_run``: what it would delete; nothing was)."""

    store: str
    dry_run: bool
    grace_s: float
    datasets: int = 0
    versions_kept: int = 0
    versions_dropped: list[str] = field(default_factory=list)  # "ws/name@hash"
    blobs_listed: int = 0
    bytes_listed: int = 0
    blobs_referenced: int = 0  # listed blobs some version needs
    blobs_missing: int = 0  # blobs some version needs that the store lacks ('warp inspect --verify' names them)
    blobs_deleted: int = 0
    bytes_deleted: int = 0
    blobs_young: int = 0  # unreferenced, kept: younger than the grace
    bytes_young: int = 0
    other_objects: int = 0  # under blobs/ but not named as a blob: never deleted
    manifests_read: int = 0
    deleted: list[str] = field(default_factory=list)  # blob hashes deleted (or, dry run, to delete)
    requests: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"store": self.store, "dry_run": self.dry_run, "grace_seconds": self.grace_s,
                "datasets": self.datasets, "versions_kept": self.versions_kept,
                "versions_dropped": list(self.versions_dropped), "manifests_read": self.manifests_read,
                "blobs_listed": self.blobs_listed, "bytes_listed": self.bytes_listed,
                "blobs_referenced": self.blobs_referenced, "blobs_missing": self.blobs_missing,
                "blobs_to_delete" if self.dry_run else "blobs_deleted": self.blobs_deleted,
                "bytes_to_delete" if self.dry_run else "bytes_deleted": self.bytes_deleted,
                "blobs_kept_young": self.blobs_young, "bytes_kept_young": self.bytes_young,
                "other_objects": self.other_objects, "requests": self.requests}


def _manifest_keys(store: Store) -> dict[str, tuple[str, str]]:
    """Key -> (dataset id, version hash) of every version manifest in the store (LISTs only)."""
    out = {}
    for key, _size, _mtime in store.list_objects("datasets/"):
        m = _MANIFEST_KEY.match(key)
        if m:
            out[key] = (f"{m.group(1)}/{m.group(2)}", m.group(3))
    return out


def _mark(store: Store, keys: Sequence[str], named: dict[str, tuple[str, str]], workers: int) -> set[str]:
    """The hashes the manifests at ``keys`` reference; any unreadable one stops gc (nothing deleted)."""

    def one(key: str) -> set[str]:
        did, vh = named[key]
        got = store.call(store.objects.read_versioned, store.url_of(key), "read", key)  # S3: one GET
        if got is None:
            raise InfrastructureError(f"{store.url_of(key)} was listed, then deleted while warp gc read the "
                                      "manifests; nothing was deleted",
                                      hint="something else is deleting versions in this store; run 'warp gc' "
                                           "again when it is done")
        data = got[0]
        try:
            m = Manifest.from_bytes(data, source=store.url_of(key), expected_hash=vh)
            if m.dataset_id != did:
                raise ManifestCorruptedError(f"{store.url_of(key)}: stored under {did}, names dataset {m.dataset_id}")
        except (DataError, UsageError) as e:  # corrupt, a machine-local path, a bad dataset id inside
            raise ManifestCorruptedError(
                f"warp gc deleted nothing: a manifest it must read to know which blobs are in use is "
                f"unreadable: {e.message}",
                hint=f"restore {key} from a backup, or drop that version ('warp gc --drop {did}@{vh[:12]}'); "
                     "gc never deletes on an incomplete marking", key=key) from None
        return referenced_hashes(m)

    refs: set[str] = set()
    if not keys:
        return refs
    with ThreadPoolExecutor(max_workers=max(1, min(workers, len(keys)))) as ex:
        for got in ex.map(one, keys):
            refs |= got
    return refs


def _resolve_drops(store: Store, drops: Sequence[str]) -> list[tuple[str, str]]:
    """(dataset id, full version hash) of each ``--drop``; refuses the version latest names."""
    out: list[tuple[str, str]] = []
    for spec in drops:
        did, version = parse_drop(spec)
        if version == "latest":
            raise UsageError(f"--drop {spec}: the latest version of {did} cannot be dropped",
                             hint="publish another version (or move latest) first")
        vh = store.resolve_version(did, version)
        if not store.has_manifest(did, vh):
            store.get_manifest_bytes(did, vh)  # the typed "no such version" error (exit 66)
        ptr = store.read_latest(did)
        if ptr is not None and ptr.version_hash == vh:
            raise UsageError(f"--drop {spec}: {did}@{vh[:12]} is the version latest.json points at; it is not "
                             "dropped", hint=f"publish a newer version of {did} first, then drop this one")
        if (did, vh) not in out:
            out.append((did, vh))
    return out


def collect(store: Store | str | None = None, *, drop: Sequence[str] = (), grace: float = DEFAULT_GRACE_S,
            dry_run: bool = False, workers: int = 16, now: float | None = None,
            before_sweep: Callable[[], None] | None = None) -> GcResult:
    """Run one garbage collection of ``store`` (see the module docstring); returns what it did.

    ``grace``: seconds an unreferenced blob is kept after its last modification. ``dry_run``: read
    and report, write and delete nothing (no marker either). ``now``: the clock the grace is measured
    against (default: this host's). ``before_sweep`` is called after marking, before the manifests
    are listed again and the first blob is deleted (tests interleave a publish there)."""
    store = store if isinstance(store, Store) else Store(store)
    if grace < 0:
        raise UsageError(f"grace {grace:g} s is negative", hint="give 0 or more, e.g. --grace 24h")
    if store.read_only:  # an HTTP store can be neither listed nor swept
        raise ReadOnlyStoreError(f"cannot garbage-collect {store.url}: a store served over HTTP(S) is read-only "
                                 "and cannot be listed",
                                 hint="run 'warp gc --store' on the s3:// bucket or folder the web host serves")
    dropped = _resolve_drops(store, drop)
    result = GcResult(store.url, dry_run, grace, versions_dropped=[f"{d}@{v}" for d, v in dropped])
    sweep_id, started, token = _begin(store) if not dry_run else ("", 0.0, "")
    deleted = 0
    try:
        drop_keys = {store.manifest_key(d, v) for d, v in dropped}
        named = {k: v for k, v in _manifest_keys(store).items() if k not in drop_keys}
        refs = _mark(store, sorted(named), named, workers)
        if not dry_run:  # only once marking is complete: a refusal above leaves every version in place
            for key in sorted(drop_keys):
                store.delete_object(key)
        listed = store.list_objects("blobs/")
        if before_sweep is not None:
            before_sweep()
        # a manifest written while we marked (a publish that found its blobs present) protects them
        again = {k: v for k, v in _manifest_keys(store).items() if k not in drop_keys and k not in named}
        refs |= _mark(store, sorted(again), again, workers)
        named.update(again)
        result.manifests_read = len(named)
        result.versions_kept = len(named)
        result.datasets = len({d for d, _ in named.values()} | {d for d, _ in dropped})
        clock = time.time() if now is None else now
        doomed: list[tuple[str, int]] = []
        present: set[str] = set()
        for key, size, mtime in listed:
            m = _BLOB_KEY.match(key)
            if not m or m.group(2)[:2] != m.group(1):
                result.other_objects += 1
                continue
            result.blobs_listed += 1
            result.bytes_listed += size
            h = m.group(2)
            if h in refs:
                present.add(h)
                continue
            if clock - mtime < grace:
                result.blobs_young += 1
                result.bytes_young += size
                continue
            doomed.append((h, size))
        result.blobs_referenced = len(present)
        result.blobs_missing = len(refs - present)
        for h, size in doomed:
            if not dry_run:
                store.delete_object(blob_key(h))
                deleted += 1
            result.blobs_deleted += 1
            result.bytes_deleted += size
            result.deleted.append(h)
    finally:
        if not dry_run:
            _finish(store, sweep_id, started, token, deleted)
    result.requests = store.stats.to_dict()
    return result
