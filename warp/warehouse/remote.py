"""A warehouse source on object storage: ``[source] path = "s3://bucket/prefix"`` (any fsspec URL),
or a static HTTP(S) host (``https://host/dataset``: never listed; each labelled image is sized by a
HEAD in the header pass, :class:`HttpFiles`).

docs/formats/receipts.md ("Sources on object storage") describes the
contract; in short:

* The label files (small) are copied into a local mirror of the source,
  ``$WARP_CACHE_DIR/etl-source/<hash of the URL>/run-<id>/`` (one per run), and parsed there as a
  local dataset would be. The image folder is *listed* once (one LIST per
  1,000 objects): missing images and images over ``[limits] max_image_mb``
  are decided from the listing, before any GET; YOLO, which pairs labels
  with images by listing the folder, gets empty placeholders there.
* The header pass runs on the executor's workers, in batches of records:
  a worker reads each image with **one** GET, hashes it (the hash feeds the
  version key), probes its header, and spools the bytes to
  ``<mirror>/.spool/<sha256>``. The build then reads the spool: the same
  bytes, no second GET. A build worker that cannot see the spool (another
  machine) GETs the object again and checks it against the hash.
* The mirror, spool included, is removed once the version is built.
"""

from __future__ import annotations

import hashlib
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from warpdata.core.errors import (
    BlobNotFoundError,
    ConfigError,
    DataError,
    InfrastructureError,
    MissingInputError,
)
from warpdata.etl import sourcefacts
from warpdata.etl.objectstore import _is_infra, credentials_error
from warpdata.etl.spool import claim, sweep
from warpdata.storage.base import open_object_store
from warpdata.storage.locations import HTTP_PROTOCOLS, parse_location
from warpdata.warehouse.config import Limits
from warpdata.warehouse.images import ImageProbe, ProbeError, probe
from warpdata.warehouse.labels import LabelRecord
from warpdata.warehouse.validate import ProbeOutcome, check_probed

SPOOL = ".spool"


class HttpFiles:
    """The reads a warehouse source needs from a static HTTP(S) host, by key under the request
    policy (:class:`~warpdata.storage.remote.Remote`): whole objects and label files. A host
    cannot be listed: the images are the ones the labels name, each sized by a HEAD."""

    def __init__(self, url: str) -> None:
        self.remote = open_object_store(url).remote

    def size(self, path: str) -> int | None:
        """The object's size (one HEAD), None when the host has no such object."""
        try:
            return self.remote.size(path.lstrip("/"))
        except BlobNotFoundError:
            return None

    def cat_file(self, path: str, size: int | None = None) -> bytes:
        key = path.lstrip("/")
        if size is None:
            size = self.size(key)
            if size is None:
                raise FileNotFoundError(self.remote.url_of(key))
        try:
            return self.remote.read_range(key, 0, size, size) if size else b""
        except BlobNotFoundError:
            raise FileNotFoundError(self.remote.url_of(key)) from None

    def get_file(self, path: str, local: str) -> None:
        data = self.cat_file(path)
        with open(local, "wb") as f:
            f.write(data)


def is_http(url: str) -> bool:
    return parse_location(url).protocol in HTTP_PROTOCOLS


def _fs(url: str):
    """The source's filesystem and its root path (an :class:`HttpFiles` and ``""`` over HTTP)."""
    if is_http(url):
        return HttpFiles(url.rstrip("/")), ""
    objects = open_object_store(url)
    return objects.fs, objects.root


def _get(fs, path: str, size: int | None = None) -> bytes:
    """The whole object in one GET: s3fs asks for the size first (a HEAD) when it may split the
    read into concurrent ranges, unless its listing cache has it; one stream never does. From an
    HTTP host, by the size its HEAD gave (``size``)."""
    if isinstance(fs, HttpFiles):
        return fs.cat_file(path, size)
    if getattr(fs, "protocol", None) in ("s3", ("s3", "s3a")) or "s3" in tuple(getattr(fs, "protocol", ()) or ()):
        return fs.cat_file(path, max_concurrency=1)
    return fs.cat_file(path)


def _infra(e: BaseException, url: str):
    cred = credentials_error(e, url)
    if cred is not None:
        return cred
    if not _is_infra(e):
        return None
    return InfrastructureError(f"could not read {url}: {type(e).__name__}: {e}",
                               hint="the object store is unreachable or refused the request (check "
                                    "WARP_S3_ENDPOINT and credentials); rerun the same command")


@dataclass
class Listing:
    """The image folder of a source on object storage, from one listing: ``{key: size}`` and
    ``{key: tag}`` (the object's ETag, else its modification time), keys relative to the source
    root as labels name them."""

    sizes: dict[str, int]
    tags: dict[str, str]
    listed: bool = True  # False from an HTTP host: sizes are learnt by HEAD in the header pass


def prepare(root: Path, url: str, labels: tuple[str, ...], images: str, fmt: str) -> tuple[Path, Listing]:
    """Mirror the label files of the source at ``url`` into ``root`` (from :func:`mirror_root`);
    list its image folder. Returns the mirror root and the :class:`Listing`."""
    url = url.rstrip("/")
    fs, base = _fs(url)
    http = isinstance(fs, HttpFiles)
    if http and fmt == "yolo":
        raise ConfigError(f"source {url}: a YOLO dataset cannot be read from an HTTP host",
                          hint="YOLO pairs labels with images by listing folders, and an HTTP host cannot be "
                               "listed; use COCO or JSONL labels, or the s3:// bucket or folder behind the host")
    sweep(root.parent.parent)
    claim(root)
    try:
        for lf in labels:
            src = f"{base}/{lf.strip('/')}"
            dst = root / lf
            if fmt == "yolo":
                try:
                    found = fs.find(src)
                except FileNotFoundError:
                    found = []
                if not found:
                    raise MissingInputError(f"label directory {url}/{lf} does not exist or is empty",
                                            hint="check [source] labels")
                for p in found:
                    rel = p[len(src):].lstrip("/")
                    (dst / rel).parent.mkdir(parents=True, exist_ok=True)
                    fs.get_file(p, os.fspath(dst / rel))
            else:
                try:
                    dst.parent.mkdir(parents=True, exist_ok=True)
                    fs.get_file(src, os.fspath(dst))
                except FileNotFoundError:
                    raise MissingInputError(f"label file {url}/{lf} does not exist",
                                            hint="check [source] labels") from None
        img = f"{base}/{images.strip('/')}" if images else base
        try:
            listing = {} if http else fs.find(img, detail=True)
        except FileNotFoundError:
            listing = {}
        sizes: dict[str, int] = {}
        tags: dict[str, str] = {}
        prefix = base + "/"
        for p, info in listing.items():
            if info.get("type") == "directory" or not p.startswith(prefix):
                continue
            sizes[p[len(prefix):]] = int(info.get("size") or 0)
            tag = sourcefacts.listed_tag(info)
            if tag:
                tags[p[len(prefix):]] = tag
    except (MissingInputError, DataError):
        raise
    except Exception as e:
        err = _infra(e, url)
        if err is not None:
            raise err from None
        raise
    if images:
        (root / images).mkdir(parents=True, exist_ok=True)
    if fmt == "yolo":  # YOLO pairs labels with images by listing the folder
        for key in sizes:
            p = root / key
            p.parent.mkdir(parents=True, exist_ok=True)
            p.touch()
    (root / SPOOL).mkdir(exist_ok=True)
    return root, Listing(sizes, tags, listed=not http)


# -- what the header pass learnt of each object, kept for the next run (warp/etl/sourcefacts.py) --

FACTS_VERSION = sourcefacts.FACTS_VERSION


def facts_path(url: str) -> Path:
    return sourcefacts.facts_path(url)


def load_facts(url: str) -> dict[str, dict[str, Any]]:
    """``{key: fact}`` recorded by earlier runs over ``url`` (empty when none or unreadable)."""
    return sourcefacts.load_facts(url)


def save_facts(url: str, facts: dict[str, dict[str, Any]]) -> None:
    sourcefacts.save_facts(url, facts)


def known_facts(facts: dict[str, dict[str, Any]], listing: Listing) -> dict[str, dict[str, Any]]:
    """The recorded facts still true: the object's listed size and tag are the recorded ones."""
    out = {}
    for key, fact in facts.items():
        listed = sourcefacts.Listed(listing.sizes[key], listing.tags.get(key)) if key in listing.sizes else None
        if sourcefacts.unchanged(fact, listed) and isinstance(fact.get("sha256"), str) and \
                (isinstance(fact.get("probe"), list) or isinstance(fact.get("error"), list)):
            out[key] = fact
    return out


def _fact(size: int, tag: str, digest: str, pr: ImageProbe | ProbeError, max_pixels: int) -> dict[str, Any]:
    # the probe's verdict depends on the pixel cap too: a fact is reused only under the same cap
    fact: dict[str, Any] = {"size": size, "tag": tag, "sha256": digest, "max_pixels": max_pixels}
    if isinstance(pr, ProbeError):
        fact["error"] = [pr.reason, pr.message]
    else:
        fact["probe"] = [pr.kind, pr.width, pr.height, pr.orientation]
    return fact


def _from_fact(fact: dict[str, Any]) -> ImageProbe | ProbeError:
    if "probe" in fact:
        kind, w, h, orientation = fact["probe"]
        return ImageProbe(str(kind), int(w), int(h), int(orientation))
    reason, message = fact["error"]
    return ProbeError(str(reason), str(message))


@dataclass
class ProbeBatch:
    """Records to probe on one worker: a pure, picklable task."""

    index: int
    url: str  # the source root URL
    mirror: str  # the local mirror root (the records' root); the spool is under it
    records: list[LabelRecord]
    sizes: dict[str, int]  # listed size of each record's object (absent = missing)
    params: dict[str, Any]
    limits: Limits
    # the listed tag (ETag) of each record's object, and what an earlier run learnt of the objects
    # whose size and tag are unchanged: those are not read again (docs/formats/receipts.md)
    tags: dict[str, str] = field(default_factory=dict)
    known: dict[str, dict[str, Any]] = field(default_factory=dict)
    listed: bool = True  # False: an HTTP host, whose objects are sized here by HEAD (absent: missing)


PREFETCH = 8  # GETs in flight per probe batch: hides the store's latency, bounds memory to 8 images


def probe_batch(batch: ProbeBatch) -> tuple[int, list[ProbeOutcome], dict[str, dict[str, Any]]]:
    """One GET per image: hash, probe, spool the bytes for the build; no GET for an object whose
    facts are known (``batch.known``). Returns the outcomes and the facts learnt.

    Up to :data:`PREFETCH` GETs of the batch run ahead of the probing on a small thread pool (the
    HTTP clients release the GIL while they wait); the records are still handled in order.
    """
    fs, base = _fs(batch.url)
    spool = os.path.join(batch.mirror, SPOOL)
    out: list[ProbeOutcome] = []
    learnt: dict[str, dict[str, Any]] = {}
    todo: list[tuple[LabelRecord, str, str | None, str]] = []
    for rec in batch.records:
        rel = os.path.relpath(rec.image, batch.mirror).replace(os.sep, "/")
        todo.append((rec, rel, None if rel.startswith("../") else rel, f"{batch.url}/{rel}"))

    def fetch(item) -> bytes | BaseException | None:
        rec, rel, _, _ = item
        size = batch.sizes.get(rel)
        if size is None or rel.startswith("../") or size > batch.limits.max_image_bytes or rel in batch.known:
            return None
        try:
            return _get(fs, f"{base}/{rel}", size)
        except BaseException as e:  # handed to the record's turn below
            return e

    with ThreadPoolExecutor(PREFETCH, thread_name_prefix="warp-probe-get") as pool:
        if not batch.listed:  # an HTTP host: what a listing gives, by one HEAD per image (404: missing)
            rels = sorted({rel for _, rel, _, _ in todo if not rel.startswith("../")})
            batch.sizes = {rel: n for rel, n in zip(rels, pool.map(lambda r: fs.size(f"{base}/{r}"), rels),
                                                    strict=True) if n is not None}
        pending = [pool.submit(fetch, t) for t in todo[:PREFETCH]]
        for i, (rec, rel, _, obj_url) in enumerate(todo):
            got = pending[i].result()
            pending[i] = None  # the bytes go once this record is done
            if i + PREFETCH < len(todo):
                pending.append(pool.submit(fetch, todo[i + PREFETCH]))
            out.append(_probe_one(batch, rec, rel, obj_url, got, spool, learnt))
    return batch.index, out, learnt


def _probe_one(batch: ProbeBatch, rec: LabelRecord, rel: str, obj_url: str, got, spool: str,
               learnt: dict[str, dict[str, Any]]) -> ProbeOutcome:
    key = rec.key
    size = batch.sizes.get(rel)
    if size is None or rel.startswith("../"):
        # the same record as a local source's, so the quarantine tables match byte for byte
        return ProbeOutcome(None, (rec.run, key, rec.source, "missing-file", f"{key}: image file does not exist"),
                            (key, "missing", 0))
    if size > batch.limits.max_image_bytes:
        return ProbeOutcome(None, (rec.run, key, rec.source, "too-large",
                                   f"{key}: is {size} bytes, over the {batch.limits.max_image_bytes / 1e6:g} MB limit "
                                   "(raise it in [limits] of the config)"), None)
    fact = batch.known.get(rel)
    if fact is not None and fact.get("max_pixels") == batch.limits.max_pixels:  # unchanged since it was read: its recorded facts, no GET
        return check_probed(rec, fact["sha256"], size, _from_fact(fact), (0, 0, 0), url=obj_url, local=None,
                            **batch.params)
    if isinstance(got, FileNotFoundError):
        return ProbeOutcome(None, (rec.run, key, rec.source, "missing-file",
                                   f"{key}: image object {obj_url} disappeared during the header pass"),
                            (key, "missing", 0))
    if isinstance(got, BaseException):
        err = _infra(got, obj_url)
        if err is not None:
            raise err from None
        raise got
    data = got
    digest = hashlib.sha256(data).hexdigest()
    try:
        pr: ImageProbe | ProbeError = probe(data, batch.limits.max_pixels)
    except ProbeError as e:
        pr = e
    tag = batch.tags.get(rel)
    if tag is not None:
        learnt[rel] = _fact(len(data), tag, digest, pr, batch.limits.max_pixels)
    if not os.path.isdir(spool):
        # a worker on another machine: the driver's spool is not there, and none is made here (it
        # would outlive the run on a machine no rerun sweeps); the build GETs the object again
        return check_probed(rec, digest, len(data), pr, (0, 0, 0), url=obj_url, local=None, **batch.params)
    local = os.path.join(spool, digest)
    if not os.path.exists(local):
        tmp = f"{local}.{os.getpid()}.{threading.get_ident()}.tmp"
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, local)
    st = os.stat(local)
    return check_probed(rec, digest, len(data), pr, (st.st_size, st.st_mtime_ns, st.st_ino), url=obj_url,
                        local=local, **batch.params)


def read_source(url: str, sha256: str) -> bytes:
    """The object at ``url`` (a build worker without the spool), checked against the header pass's hash."""
    if is_http(url):
        parent, _, name = url.rpartition("/")
        fs, path = _fs(parent)[0], name
    else:
        fs, path = _fs(url)
    try:
        data = _get(fs, path)
    except Exception as e:
        err = _infra(e, url)
        if err is not None:
            raise err from None
        raise DataError(f"{url}: could not be read during the build: {e}",
                        hint="the source changed while the ETL ran; rerun 'warp etl'", path=url) from None
    if hashlib.sha256(data).hexdigest() != sha256:
        raise DataError(f"{url}: changed while the ETL ran (content hash differs from the header pass)",
                        hint="rerun 'warp etl' once the dataset is no longer being written", path=url)
    return data
