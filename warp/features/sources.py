"""A feature-cache source folder on object storage (``[source] path = "s3://bucket/prefix"``, or a
``[[directory]]`` path): scanned from one listing and the source facts, its media copied only when
a build needs them.

:meth:`RemoteFolder.scan` gives the :class:`~warpdata.features.scan.ScanResult` that
:func:`~warpdata.features.scan.scan` gives for a local copy of the folder (the same items, digests,
rejections and counts, so the same fingerprint), from:

* one listing of the folder (one LIST request per 1,000 objects): each object's size and ETag;
* the source facts an earlier run recorded (warp/etl/sourcefacts.py): a caption object whose size
  and ETag are unchanged gives its recorded bytes, and a media object whose size and ETag are
  unchanged, beside a caption whose are too, gives its recorded digest, without a GET;
* one GET for every other object: a caption (its bytes are recorded, up to
  :data:`MAX_RECORDED_CAPTION`), a media file (streamed into this run's mirror while it is hashed,
  so a build does not read it again).

:meth:`RemoteFolder.materialize` then copies into the mirror the media a build decodes that the
scan did not read: an up-to-date rerun (the fingerprint matches) calls it not at all.
docs/features-config.md ("Sources on object storage") states the contract.
"""

from __future__ import annotations

import base64
import os
import posixpath
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import xxhash
from warpdata.core.errors import DataError, MissingInputError, Rejected
from warpdata.etl import sourcefacts
from warpdata.features.scan import (
    MAX_CAPTION_BYTES,
    VIDEO_EXTS,
    MediaItem,
    ScanResult,
    media_entry,
    video_decoder,
)
from warpdata.storage.locations import filesystem, parse_location

FACTS = "features"  # the pipeline's name among the source facts
MAX_RECORDED_CAPTION = 64 << 10  # a longer caption is read again on every run (its bytes are not recorded)
GETS = 8  # objects read concurrently when media are copied for a build
CHUNK = 8 << 20
_MIRROR = "\0mirror\0"  # a recorded probe message names the run's mirror by this (each run has its own)


class RemoteFolder:
    """One source folder on object storage, mirrored for one run at ``mirror`` (local paths of its
    items: ``mirror/<key>``, where a build reads them)."""

    def __init__(self, url: str, mirror: Path) -> None:
        self.url = url.rstrip("/")
        self.mirror = Path(mirror)
        loc = parse_location(self.url)
        self.fs = filesystem(loc)
        self.base = loc.path.rstrip("/")
        self.fetched: set[str] = set()  # keys whose bytes are in the mirror already
        self.captions: dict[str, bytes] = {}  # each usable media key's caption bytes (its digest covers them)
        self.facts: dict[str, dict[str, Any]] = {}  # this run's source facts, as the scan saved them

    # -- the scan -------------------------------------------------------------------------------
    def _list(self) -> dict[str, sourcefacts.Listed]:
        prefix = self.base + "/"
        self.fs.invalidate_cache(self.base)
        try:
            found = sourcefacts.read_call(self.url, self.fs.find, self.base, detail=True)
        except FileNotFoundError:
            found = {}
        out: dict[str, sourcefacts.Listed] = {}
        for p, info in found.items():
            if info.get("type") == "directory" or not p.startswith(prefix):
                continue
            rel = p[len(prefix):]
            if not rel or ".." in rel.split("/"):
                continue  # a key that would land outside the mirror
            out[rel] = sourcefacts.Listed(int(info.get("size") or 0), sourcefacts.listed_tag(info))
        if not out:
            raise MissingInputError(f"source {self.url} does not exist or holds no objects",
                                    hint="check [source] path / [[directory]] path (an s3://bucket/prefix/ URL)")
        return out

    def _get(self, rel: str) -> bytes:
        return sourcefacts.read_call(f"{self.url}/{rel}", self.fs.cat_file, f"{self.base}/{rel}")

    def _stream_hash(self, rel: str, size: int, h: xxhash.xxh3_128) -> None:
        """The media object ``rel`` into the mirror (a temporary name, then its own) while ``h`` hashes
        it: one GET (a large object: ranged GETs of :data:`CHUNK`)."""
        dst = self.mirror / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        tmp = dst.with_name(f".{dst.name}.part")

        def copy() -> None:
            if size <= CHUNK:
                data = self.fs.cat_file(f"{self.base}/{rel}")
                h.update(data)
                tmp.write_bytes(data)
                return
            with self.fs.open(f"{self.base}/{rel}", "rb", block_size=CHUNK) as src, open(tmp, "wb") as out:
                while chunk := src.read(CHUNK):
                    h.update(chunk)
                    out.write(chunk)

        try:
            sourcefacts.read_call(f"{self.url}/{rel}", copy)
            os.replace(tmp, dst)
        finally:
            tmp.unlink(missing_ok=True)
        self.fetched.add(rel)

    def scan(self, quarantine: Any, *, caption_prefix: str = "", caption_ext: str = ".txt",
             key_prefix: str = "") -> ScanResult:
        """What :func:`warpdata.features.scan.scan` gives for a copy of the folder (same rules, in
        the same order), reading only the objects whose listing facts are not recorded."""
        listing = self._list()
        recorded = sourcefacts.load_facts(self.url, FACTS)
        facts: dict[str, dict[str, Any]] = {}
        caption_ext = caption_ext.lower()
        media: list[str] = []
        captions: set[str] = set()
        files_seen = 0
        for rel in sorted(listing):
            if any(part.startswith(".") for part in rel.split("/")):
                continue  # hidden files and folders, as a local scan skips them
            files_seen += 1
            if posixpath.splitext(rel)[1].lower() == caption_ext:
                captions.add(rel)
            else:
                media.append(rel)
        items: list[MediaItem] = []
        used: set[str] = set()
        can_video = video_decoder()
        for rel0 in media:
            path = os.fspath(self.mirror / rel0)
            got = media_entry(rel0, path, key_prefix, captions, caption_ext, can_video, quarantine, used)
            if got is None:
                continue
            rel, run, cap_rel0, cap_rel = got
            cap_path = os.fspath(self.mirror / cap_rel0)
            cap_listed = listing[cap_rel0]
            if cap_listed.size > MAX_CAPTION_BYTES:
                quarantine.reject(run, rel, cap_path, "too-large",
                                  f"{cap_rel}: is {cap_listed.size} bytes, over the {MAX_CAPTION_BYTES >> 20} MiB "
                                  "caption limit")
                continue
            raw = self._caption(cap_rel0, cap_listed, recorded, facts)
            if raw is None:
                quarantine.reject(run, rel, cap_path, "unreadable", f"{cap_rel}: disappeared during the scan")
                continue
            if len(raw) > MAX_CAPTION_BYTES:
                quarantine.reject(run, rel, cap_path, "too-large", f"{cap_rel}: over the caption limit")
                continue
            try:
                text = raw.decode("utf-8-sig").strip()
            except UnicodeDecodeError as e:
                quarantine.reject(run, rel, cap_path, "bad-caption",
                                  f"{cap_rel}: not UTF-8 ({e.reason} at byte {e.start})")
                continue
            if not text:
                quarantine.reject(run, rel, cap_path, "empty-caption", f"{cap_rel}: caption is empty")
                continue
            digest = self._digest(rel0, listing[rel0], cap_listed, raw, recorded, facts)
            if digest is None:
                quarantine.reject(run, rel, path, "unreadable", f"{rel}: disappeared during the scan")
                continue
            self.captions[rel0] = raw
            items.append(MediaItem(rel, path, caption_prefix + text, run, digest, posixpath.splitext(rel0)[1].lower() in VIDEO_EXTS))
        # what is true of the listed objects now, for the next run (the facts of objects gone dropped)
        if facts != recorded:
            sourcefacts.save_facts(self.url, facts, FACTS)
        self.facts = facts
        return ScanResult(items, len(captions - used), files_seen)

    def _caption(self, rel: str, listed: sourcefacts.Listed, recorded: dict, facts: dict) -> bytes | None:
        fact = recorded.get(rel)
        if sourcefacts.unchanged(fact, listed) and isinstance(fact.get("raw"), str):
            facts[rel] = fact
            return base64.b64decode(fact["raw"])
        try:
            raw = self._get(rel)
        except FileNotFoundError:
            return None
        if listed.tag is not None and len(raw) == listed.size and len(raw) <= MAX_RECORDED_CAPTION:
            facts[rel] = sourcefacts.listing_facts(listed.size, listed.tag, raw=base64.b64encode(raw).decode("ascii"))
        return raw

    def _digest(self, rel: str, listed: sourcefacts.Listed, cap: sourcefacts.Listed, raw: bytes,
                recorded: dict, facts: dict) -> str | None:
        """The item's digest (xxh3-128 over the media bytes, ``\\0caption\\0`` and the caption bytes, as
        the local scan's): recorded, or computed as the media object streams into the mirror."""
        fact = recorded.get(rel)
        if sourcefacts.unchanged(fact, listed) and isinstance(fact.get("digest"), str) \
                and fact.get("caption") == [cap.size, cap.tag]:
            facts[rel] = fact
            return str(fact["digest"])
        h = xxhash.xxh3_128()
        try:
            self._stream_hash(rel, listed.size, h)
        except FileNotFoundError:
            return None
        h.update(b"\0caption\0")
        h.update(raw)
        digest = h.hexdigest()
        if listed.tag is not None and cap.tag is not None:
            facts[rel] = sourcefacts.listing_facts(listed.size, listed.tag, caption=[cap.size, cap.tag], digest=digest)
        return digest

    # -- the header pass ------------------------------------------------------------------------
    def _rel(self, it: MediaItem) -> str | None:
        root = os.fspath(self.mirror) + os.sep
        return os.path.relpath(it.path, self.mirror).replace(os.sep, "/") if it.path.startswith(root) else None

    def _probe_env(self, max_pixels: int) -> list[Any]:
        # what else a header verdict depends on: the pixel cap, whether videos can be opened here
        return [max_pixels, video_decoder()]

    def known_probes(self, items: list[MediaItem], max_pixels: int) -> dict[int, Rejected | None]:
        """The header-pass verdicts (a failure, or None: it passes) recorded for items of this folder
        whose media object's listing facts are unchanged since it was probed, by item index: the
        verdict depends only on the bytes, so the object is not copied to be probed again."""
        out: dict[int, Rejected | None] = {}
        env = self._probe_env(max_pixels)
        mirror = os.fspath(self.mirror)
        for i, it in enumerate(items):
            rel = self._rel(it)
            got = (self.facts.get(rel) or {}).get("probe") if rel is not None else None
            if not isinstance(got, dict) or got.get("env") != env:
                continue
            bad = got.get("failure")
            if bad is None:
                out[i] = None
            elif isinstance(bad, list) and len(bad) == 2 and all(isinstance(x, str) for x in bad):
                out[i] = Rejected(bad[0], bad[1].replace(_MIRROR, mirror))
        return out

    def record_probes(self, items: list[MediaItem], verdicts: dict[int, Rejected | None], max_pixels: int) -> None:
        """Record with each probed media object's source facts its header verdict (``verdicts``: by
        item index), for :meth:`known_probes` of a later run."""
        env = self._probe_env(max_pixels)
        mirror = os.fspath(self.mirror)
        changed = False
        for i, f in verdicts.items():
            rel = self._rel(items[i])
            fact = self.facts.get(rel) if rel is not None else None
            if fact is None:
                continue  # no listing facts (no ETag): probed on every run
            fact["probe"] = {"env": env, "failure": None if f is None else [f.reason, f.message.replace(mirror, _MIRROR)]}
            changed = True
        if changed:
            sourcefacts.save_facts(self.url, self.facts, FACTS)

    # -- the build's copy -----------------------------------------------------------------------
    def materialize(self, items: list[MediaItem]) -> int:
        """Copy into the mirror every media file of ``items`` under this folder that the scan did not
        read (a build decodes them), each checked against the digest the scan gave its item (a
        :class:`DataError` when the object changed since the listing); returns how many were read."""
        root = os.fspath(self.mirror) + os.sep
        todo = {os.path.relpath(it.path, self.mirror).replace(os.sep, "/"): it for it in items
                if it.path.startswith(root)}
        todo = {rel: it for rel, it in sorted(todo.items()) if rel not in self.fetched}

        def one(rel: str) -> None:
            dst = self.mirror / rel
            dst.parent.mkdir(parents=True, exist_ok=True)
            url = f"{self.url}/{rel}"
            try:
                sourcefacts.read_call(url, self.fs.get_file, f"{self.base}/{rel}", os.fspath(dst))
            except FileNotFoundError:
                raise MissingInputError(f"{url} disappeared while the ETL ran",
                                        hint="rerun 'warp etl' once the source is no longer being written",
                                        path=url) from None
            h = xxhash.xxh3_128()
            with open(dst, "rb") as f:
                while chunk := f.read(CHUNK):
                    h.update(chunk)
            h.update(b"\0caption\0")
            h.update(self.captions.get(rel, b""))
            if h.hexdigest() != todo[rel].digest:
                raise DataError(f"{url}: changed while the ETL ran (its content differs from what the scan "
                                "recorded)", hint="rerun 'warp etl' once the source is no longer being written",
                                path=url)

        if todo:
            with ThreadPoolExecutor(min(GETS, len(todo)), thread_name_prefix="warp-fc-source") as pool:
                list(pool.map(one, todo))
        self.fetched.update(todo)
        return len(todo)
