"""Open a published warp artifact (tensor warehouse, feature cache) in place, inside its cached tar shards.

``warp publish --from DIR`` packs an artifact directory into tar shards with a
member index (:mod:`warpdata.registry.tarpack`). Tar members are contiguous
byte ranges, so the readers that memory-map files (the warehouse's TWH1
shards, the feature cache's WFS1 shards) map each member straight out of the
cached tar shard: :func:`materialize` never copies a member, and the cache
holds every byte once.

* The dataset is resolved as usual (:func:`warpdata.read.dataset.dataset`:
  ``latest`` or ``version=``, ``store=``, cached manifest).
* The artifact is the one whose ``metadata.sources`` kind is ``kind`` (or the
  one named ``artifact=``); its member index (a small cached blob) says which
  tar shards hold ``manifest.json`` and the data files the manifest lists.
* Those tar shards are pinned, then taken from the blob cache or fetched
  into it whole through :meth:`~warpdata.read.dataset.Dataset.fetch_blob`, exactly
  as ``warp warm`` fetches them: the same content-addressed blobs, so a warmed
  dataset opens with zero data GETs and zero extra bytes, and an unwarmed one
  fetches each needed tar shard once (SHA-256 checked by the blob cache as it
  lands). Shards holding none of the needed members are not fetched. A shard
  stored as chunks (format 5, docs/formats/registry.md, "Chunked shards") is
  assembled from them into the same cached file, under the same hash.
* The result, :class:`PublishedArtifact`, maps each member to
  ``(cached tar path, offset, length)``; :meth:`Member.read` reads a small
  member (``manifest.json``) by range. The blobs stay pinned (never
  evicted) until :meth:`PublishedArtifact.close`, which readers call from
  their own ``close()``; the member map itself pickles, so DataLoader workers
  map the same cached files lazily while the opening process holds the pins.

Checksums: a downloaded tar shard is hashed by the blob cache. A cached one is
hashed again (once per process) unless ``trust_cached=True``, which readers
pass when they check every member's own SHA-256 against the producer manifest
on first touch anyway (TWH1 ``checksum_sha256``, WFS1 ``sha256``). The tar
shard holding ``manifest.json`` is always hashed: nothing else vouches for the
manifest's bytes in the cache.

A member that fails its reader's check (a bad cached copy) is not trusted
again: :meth:`PublishedArtifact.refetch` evicts its tar shard from the blob
cache and fetches it again, once; if the fresh copy fails the same check, the
reader raises :class:`~warpdata.core.errors.BlobCorruptedError` naming the
store object (:meth:`PublishedArtifact.store_object`). Same policy as ``warp
warm`` (docs/formats/registry.md, "Readers").
"""

from __future__ import annotations

import json
import os
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import Any

from warpdata.core.errors import DataError, MissingInputError, UsageError
from warpdata.core.jsondoc import load_json
from warpdata.core.names import MANIFEST_NAME
from warpdata.read.dataset import Dataset
from warpdata.registry.manifest import DATASET_ID_RE

__all__ = ["Member", "PublishedArtifact", "looks_like_dataset", "materialize"]


def looks_like_dataset(target: Any) -> bool:
    """True when ``target`` is not an existing path but a ``workspace/name`` id."""
    if not isinstance(target, str) or os.path.exists(target):
        return False
    return bool(DATASET_ID_RE.match(target))


@dataclass(frozen=True)
class Member:
    """Where one artifact file lies: ``length`` bytes at ``offset`` of the cached tar shard ``path``."""

    path: str
    offset: int
    length: int
    name: str  # "ws/name@version12/artifact/member", for messages

    def read(self) -> bytes:
        with open(self.path, "rb", buffering=0) as f:
            data = os.pread(f.fileno(), self.length, self.offset)
        if len(data) != self.length:
            raise DataError(f"{self.name}: cached tar shard {self.path} is short "
                            f"({len(data)} of {self.length} bytes at {self.offset})",
                            hint="run 'warp cache verify' and open the dataset again")
        return data


@dataclass
class PublishedArtifact:
    """A published artifact opened in place; pins its cached tar shards until :meth:`close`."""

    dataset: str
    version: str
    artifact: str
    members: dict[str, Member]
    blobs: list[str]  # the pinned tar-shard hashes
    fetched_bytes: int = 0
    _release: Callable[[], None] | None = field(default=None, repr=False)
    _refetch: Callable[[str], str] | None = field(default=None, repr=False)
    _objects: dict[str, str] = field(default_factory=dict, repr=False)  # tar shard hash -> store object URL
    refetched: set[str] = field(default_factory=set)  # tar shards already evicted and fetched again

    def store_object(self, rel: str) -> str:
        """The store object (URL) of the tar shard holding member ``rel``."""
        m = self.members[rel]
        for h, url in self._objects.items():
            if os.path.basename(m.path) == h:
                return url
        return m.path

    def refetch(self, rel: str) -> bool:
        """Evict the cached tar shard holding ``rel`` and fetch it again (once per shard).

        Returns False when that shard was already fetched again (the caller
        then raises its typed error naming :meth:`store_object`); on True the
        members of that shard point at the fresh copy.
        """
        if self._refetch is None:
            return False
        shard = os.path.basename(self.members[rel].path)
        if shard in self.refetched:
            return False
        self.refetched.add(shard)
        new = self._refetch(shard)
        for name, m in list(self.members.items()):
            if os.path.basename(m.path) == shard:
                self.members[name] = Member(new, m.offset, m.length, m.name)
        return True

    @property
    def label(self) -> str:
        """``ws/name@version12/artifact``: what messages and ``path`` attributes show."""
        return f"{self.dataset}@{self.version[:12]}/{self.artifact}"

    def close(self) -> None:
        if self._release is not None:
            self._release()
            self._release = None


def _pick_artifact(ds, kind: str, artifact: str | None) -> str:
    if artifact is not None:
        if artifact not in ds.manifest.artifacts:
            raise MissingInputError(f"{ds.id} has no artifact {artifact!r} "
                                    f"(artifacts: {', '.join(ds.artifacts) or 'none'})",
                                    hint=f"see 'warp inspect {ds.id}'")
        return artifact
    sources = ds.manifest.metadata.get("sources") or []
    named = [s.get("artifact") for s in sources if isinstance(s, dict) and s.get("kind") == kind]
    named = [a for a in named if a in ds.manifest.artifacts]
    if len(named) > 1:
        raise UsageError(f"{ds.id} holds {len(named)} {kind} artifacts ({', '.join(named)})",
                         hint="pick one with artifact=NAME")
    if named:
        return named[0]
    if kind in ds.manifest.artifacts:
        return kind
    raise MissingInputError(f"{ds.id}@{ds.version[:12]} holds no {kind} artifact "
                            f"(artifacts: {', '.join(ds.artifacts) or 'none'})",
                            hint=f"publish one with 'warp publish {ds.id} --from DIR' (DIR written by 'warp etl')")


def materialize(target: str, kind: str, files: Callable[[dict[str, Any]], list[str]], *,
                version: str | None = None, store: str | None = None, mode: str | None = None,
                artifact: str | None = None, cache=None, trust_cached: bool = False) -> PublishedArtifact:
    """Resolve published dataset ``target`` and open its ``kind`` artifact in place in the blob cache.

    ``files(manifest_doc)`` names the data files the reader needs (paths
    relative to the artifact root); ``manifest.json`` always comes along.
    """
    ds = Dataset(target, mode=mode, version=version, store=store, cache=cache)
    if ds.cache is None:
        raise UsageError(f"opening {kind} {target} needs the blob cache; mode='remote' keeps nothing locally",
                         hint="use mode='auto' (the default) or 'local'")
    bc = ds.cache
    aname = _pick_artifact(ds, kind, artifact)
    reader = ds.artifact(aname)
    label = f"{ds.id}@{ds.version[:12]}/{aname}"
    pinned: list[str] = []
    paths: dict[str, str] = {}
    fetched = 0

    refs = dict(reader._refs)

    def refetch(shard: str) -> str:
        nonlocal fetched
        bc.evict(shard)
        p = ds.fetch_blob(refs[shard])  # hash-checked as it lands; a bad store copy raises BlobCorruptedError
        fetched += refs[shard].byte_size
        paths[shard] = str(p)
        return str(p)

    def locate(rel: str, verify: bool = not trust_cached) -> Member:
        nonlocal fetched
        shard, off, length = reader.locate(rel)
        if shard not in paths:
            ref = reader._refs[shard]
            bc.pin([shard])  # before the fetch: no other process may evict it between fetch and use
            pinned.append(shard)
            p = bc.get(shard, verify=verify)
            if p is None:
                p = ds.fetch_blob(ref)  # what 'warp warm' does: the whole tar shard, hash-checked
                fetched += ref.byte_size
            paths[shard] = str(p)
        return Member(paths[shard], off, length, f"{label}/{rel}")

    try:
        members = {MANIFEST_NAME: locate(MANIFEST_NAME, verify=True)}
        raw = members[MANIFEST_NAME].read()
        try:
            doc = load_json(raw, f"manifest.json of artifact {aname} in {ds.id}", hint="republish the artifact")
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise DataError(f"manifest.json of artifact {aname} in {ds.id}: not valid JSON: {e}",
                            hint="republish the artifact") from None
        if not isinstance(doc, dict) or doc.get("kind") != kind:
            raise DataError(f"artifact {aname} of {ds.id} is a {doc.get('kind') if isinstance(doc, dict) else '?'!r}, "
                            f"not a {kind}", hint="pick the right artifact with artifact=NAME")
        for rel in files(doc):
            if rel.startswith("/") or ".." in PurePosixPath(rel).parts:
                raise DataError(f"manifest.json of {ds.id}/{aname} names {rel!r} outside the artifact",
                                hint="republish the artifact")
            members[rel] = locate(rel)
    except BaseException:
        bc.unpin(pinned)
        raise
    finally:
        reader.close()
    sizes = {p: os.stat(p).st_size for p in paths.values()}
    for m in members.values():
        size = sizes[m.path]
        if m.offset + m.length > size:  # a map past the end of a file would crash the reader (SIGBUS)
            bc.unpin(pinned)
            raise DataError(f"{m.name}: index says bytes {m.offset}..{m.offset + m.length} but the cached "
                            f"tar shard {m.path} has {size}", hint="run 'warp cache verify' and open it again")
    objects = {h: ds.remote.url_of(ds.blob_key(refs[h])) for h in refs}
    out = PublishedArtifact(ds.id, ds.version, aname, members, pinned, fetched, _refetch=refetch, _objects=objects)
    out._release = weakref.finalize(out, bc.unpin, pinned)  # runs once: on close() or garbage collection
    return out
