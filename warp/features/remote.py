"""A feature cache on object storage: ``[output] path = "s3://bucket/prefix"`` (any fsspec URL).

Layout (docs/features-config.md, "Output on object storage"; the warehouse's contract,
docs/formats/receipts.md, "Object storage")::

    <url>/v<YYYYMMDD>-<fingerprint12>/     one version: the cache's files; manifest.json is written last
    <url>/latest                           the name of the newest complete version and a newline
    <url>/.warp-tmp-build-<fingerprint12>/ while a version is built: receipts/part-NNNNN.json, and the
                                           parts that met a late decode failure (re-cut into shards)

The build stages locally (:func:`warpdata.etl.objectstore.staging_root`), a worker uploads each
finished part itself, create-only, and the driver receipts it in the store, so a driver killed at
any point resumes from the store alone. A version without ``manifest.json`` is absent for readers.

:func:`open_version` is the reader's side: the URL of a version (or of the prefix holding
``latest``) and its checked manifest, in two GETs. The shards then come into the content-addressed
blob cache by the SHA-256 the manifest names (:class:`warpdata.features.reader.ShardCache`).
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from warpdata.core.atomic import TMP_PREFIX
from warpdata.core.errors import DataError, MissingInputError
from warpdata.core.names import MANIFEST_NAME
from warpdata.etl import objectstore
from warpdata.features import manifest as fmanifest
from warpdata.storage.base import open_object_store
from warpdata.storage.blobcache import BlobCache
from warpdata.storage.remote import Remote

VERSION_RE = re.compile(r"^v\d{8}-[0-9a-f]{12}$")
BUILD_PREFIX = f"{TMP_PREFIX}build-"  # as the local build directory's


def is_url(text: Any) -> bool:
    return isinstance(text, str) and objectstore.is_url(text)


def version_name(fingerprint: str, date: str) -> str:
    return f"v{date}-{fingerprint[:12]}"


@dataclass
class StoreTarget:
    """Where one version of a cache goes in the store."""

    url: str  # the cache's prefix, no trailing slash
    vdir: str  # v<YYYYMMDD>-<fingerprint12>
    fingerprint: str

    @property
    def version_url(self) -> str:
        return f"{self.url}/{self.vdir}"

    @property
    def build_url(self) -> str:
        return f"{self.url}/{BUILD_PREFIX}{self.fingerprint[:12]}"

    def shard_url(self, name: str) -> str:
        return f"{self.version_url}/{name}"

    def part_url(self, name: str) -> str:
        return f"{self.build_url}/{name}"


def _fs(url: str):
    objects = open_object_store(url)
    return objects.fs, objects.location


def put_overwrite(local: str, url: str) -> None:
    """Upload a file that a rerun may legitimately change (a re-cut shard before the manifest
    names it, ``metrics.json``): a plain PUT."""
    fs, loc = _fs(url)
    objectstore._call(url, fs.put_file, local, loc.path)


def copy_object(src: str, dst: str) -> None:
    """Copy object ``src`` to ``dst`` inside one store, server-side (no byte passes through here):
    a shard the previous version holds, reused by a new one."""
    fs, loc = _fs(src)
    objectstore._call(dst, fs.copy, loc.path, _fs(dst)[1].path)


def get_file(url: str, local: str) -> bool:
    """Download ``url`` to ``local``; False when it is absent."""
    fs, loc = _fs(url)
    try:
        objectstore._call(url, fs.get_file, loc.path, local)
    except FileNotFoundError:
        return False
    return True


def remove(url: str, names: list[str] | None = None) -> None:
    """Delete objects ``names`` under ``url`` (all of it when None); absent ones are fine."""
    fs, loc = _fs(url)
    with contextlib.suppress(FileNotFoundError):
        if names is None:
            objectstore._call(url, fs.rm, loc.path, recursive=True)
        elif names:
            objectstore._call(url, fs.rm, [f"{loc.path}/{n}" for n in names])


def open_version(url: str) -> tuple[str, dict[str, Any], Any]:
    """``(version URL, checked manifest, Remote over the version)`` of the cache at ``url``.

    ``url`` is a version (it holds ``manifest.json``) or the prefix a build wrote (its ``latest``
    names the version). Two GETs either way: ``latest``, then the manifest (a version URL:
    ``latest`` is absent there, its manifest is read directly).
    """
    base = url.rstrip("/")
    top = Remote(base)
    raw = top.get("latest")
    if raw is not None:
        name = raw.decode("utf-8", "replace").strip()
        if not VERSION_RE.match(name):
            raise DataError(f"{base}/latest names {name[:80]!r}, not a version directory (v<YYYYMMDD>-<hash12>)",
                            hint="the pointer was damaged or written by something else; rebuild with 'warp etl' "
                                 "or open the version's URL directly", path=f"{base}/latest")
        vurl = f"{base}/{name}"
        remote = Remote(vurl)
        doc = remote.get(MANIFEST_NAME)
        if doc is None:
            raise MissingInputError(f"{base}/latest names {name}, which has no manifest.json",
                                    hint="the version was removed; rebuild it with 'warp etl'", path=vurl)
    else:
        vurl, remote = base, top
        doc = remote.get(MANIFEST_NAME)
        if doc is None:
            raise MissingInputError(f"{base} holds neither a feature cache (manifest.json) nor a latest pointer",
                                    hint="point at the [output] path a 'warp etl' build wrote, or at one of its "
                                         "v<YYYYMMDD>-<hash12> versions; a version still being built is not "
                                         "visible until its manifest is written", path=base)
    m = fmanifest.parse(doc, f"{vurl}/manifest.json",
                        hint="rebuild the cache with 'warp etl' (a version in the store is never edited in place)")
    return vurl, m, remote


def stream_object(remote: Any, key: str, dst: Any, expect: int) -> None:
    """Object ``key`` of ``remote`` (a :class:`warpdata.storage.remote.Remote`) into ``dst`` by the
    store's streamed read (:meth:`~warpdata.storage.remote.Remote.stream_to`): ranged GETs under the
    request policy (deadline, body cap, retries, counters), no HEAD.

    ``expect`` (the manifest's byte count) is what the object must hold: a longer or a shorter
    object is a :class:`DataError`, so a lying manifest or store never sizes a buffer.
    """
    remote.stream_to(key, dst, expect,
                     hint="the object was replaced or the manifest is wrong: rebuild the cache with 'warp etl'")


_MEMBER_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$")


def stage_version(url: str, dest: Any) -> dict[str, int]:
    """The cache at ``url`` as a directory ``dest`` for ``warp publish --from`` (a new directory).

    The shards come from the content-addressed blob cache, by the SHA-256 the manifest names, and
    are hard-linked into ``dest``: a cache this machine has trained from is not downloaded again,
    and one it has not is fetched once (ranged GETs of 8 MiB under the request policy, hashed as it lands) into the
    cache where training finds it. The version's other files (``manifest.json``, ``keys.txt``,
    ``records.parquet``, the quarantine tables; not ``metrics.json``) are small: one listing, then
    one GET each. Returns ``{"shards_fetched", "shards_cached", "files"}``.
    """
    vurl, m, remote = open_version(url)
    out = Path(dest)
    out.mkdir(parents=True)
    cache = BlobCache()
    counts = {"shards_fetched": 0, "shards_cached": 0, "files": 0}
    shard_names = set()
    for e in m["shards"]:
        rel, h = str(e["path"]), str(e["sha256"])
        shard_names.add(rel)
        had = cache.get(h) is not None
        with cache.pinned([h]):
            p = cache.fetch(h, lambda f, rel=rel, n=int(e["bytes"]): stream_object(remote, rel, f, n),
                            source=remote.url_of(rel))
            try:
                os.link(p, out / rel)
            except OSError:  # the cache on another filesystem
                shutil.copyfile(p, out / rel)
        counts["shards_cached" if had else "shards_fetched"] += 1
    for name in sorted(objectstore.list_sizes(vurl)):
        if name in shard_names or name == "metrics.json":
            continue
        if not _MEMBER_RE.match(name):
            raise DataError(f"{vurl}/{name}: not a file name a feature cache writes",
                            hint="publish only versions written by 'warp etl'", path=f"{vurl}/{name}")
        data = remote.get(name)
        if data is None:  # removed since the listing
            continue
        if name == MANIFEST_NAME and fmanifest.parse(data, f"{vurl}/{name}") != m:
            raise DataError(f"{vurl}/{name} changed while it was being published", hint="rerun the publish",
                            path=f"{vurl}/{name}")
        with contextlib.suppress(FileExistsError), open(out / name, "xb") as f:
            f.write(data)
        counts["files"] += 1
    return counts
