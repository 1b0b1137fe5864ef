"""Open a published warp artifact (tensor warehouse, feature cache) as a local directory.

``warp publish --from DIR`` packs an artifact directory into tar shards with a
member index. Readers that memory-map files (the warehouse's TWH1 shards, the
feature cache's WFS1 shards) need real files, so :func:`materialize` turns a
published dataset back into a directory without extracting any archive:

* the dataset is resolved as usual (:func:`warpdata.dataset.dataset`:
  ``latest`` or ``version=``, ``store=``, cached manifest);
* the artifact is the one whose ``metadata.sources`` kind is ``kind`` (or
  the one named ``artifact=``); its ``manifest.json`` member comes through
  :meth:`~warpdata.refs.ArtifactReader.local_path` (one ranged read, then a
  content-addressed cache blob);
* every data file the manifest lists becomes a cache blob named by the
  SHA-256 of its bytes: they stream from the member's byte range of the tar
  shard (a local ``pread`` when the shard is cached, else ranged GETs in
  8 MiB pieces) through a hashing temporary file, one member at a time (no
  archive is ever extracted), and :meth:`~warpdata.blobcache.BlobCache.fetch`
  re-checks the hash as the blob is added. A pointer
  ``members/<shard>-<offset>-<length>`` (the scheme of
  :meth:`~warpdata.refs.ArtifactReader.local_path`) remembers the hash, so a
  second open finds every blob locally and issues no data GETs. The readers
  then check the format's own checksums (TWH1 SHA-256, WFS1 CRC/SHA-256);
* a *view* directory under ``<cache>/views/`` holds symlinks with the
  artifact's relative paths to those blobs; its name is a hash of the
  mapping, so it is written once (temp dir + rename) and shared by later
  opens and processes;
* the blobs stay pinned (never evicted) until :meth:`Materialized.close`,
  which readers call from their own ``close()``.

Cached blobs are not re-hashed here when the reader verifies its own
checksums anyway (``trust_cached=True``); downloads are always hashed.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from warpdata.errors import DataError, MissingInputError, UsageError

__all__ = ["Materialized", "looks_like_dataset", "materialize"]

CHUNK = 8 << 20


def looks_like_dataset(target: Any) -> bool:
    """True when ``target`` is not an existing path but a ``workspace/name`` id."""
    if not isinstance(target, str) or os.path.exists(target):
        return False
    from warpdata.registry.manifest import DATASET_ID_RE

    return bool(DATASET_ID_RE.match(target))


@dataclass
class Materialized:
    """A local view of a published artifact; pins its blobs until :meth:`close`."""

    path: Path
    dataset: str
    version: str
    artifact: str
    blobs: list[str]
    fetched_bytes: int = 0
    _release: Callable[[], None] | None = field(default=None, repr=False)

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


def _copy_member(reader, member: str, f) -> int:
    """Stream one member's bytes (a byte range of a tar shard) into ``f``; returns the length."""
    shard, off, length = reader.locate(member)
    fd = reader._local_fd(shard)
    if fd is not None:
        pos = 0
        while pos < length:
            data = os.pread(fd, min(CHUNK, length - pos), off + pos)
            if not data:
                raise DataError(f"member {member!r} of artifact {reader.name}: cached shard {shard[:12]} is short",
                                hint="run 'warp cache verify'")
            f.write(data)
            pos += len(data)
        return length
    ds = reader.ds
    if ds.mode == "local":
        raise MissingInputError(f"shard {shard[:12]} of {ds.id} is not in the cache (local mode)",
                                hint=f"run 'warp warm {ds.id}' while online")
    key = ds.blob_key(reader._refs[shard])
    src = ds.remote.open(key, reader._sizes.get(shard))
    try:
        pos = 0
        while pos < length:
            n = min(CHUNK, length - pos)
            try:
                data = src.read_at(n, off + pos)
            except Exception as e:
                raise ds.remote._wrap(e, key) from e
            if len(data) != n:
                raise DataError(f"member {member!r} of {ds.id}: short read at {off + pos} of {key}",
                                hint="the shard is truncated in the store; republish the dataset")
            f.write(data)
            pos += n
    finally:
        src.close()
    return length


def _member_blob(reader, member: str, trust_cached: bool) -> tuple[str, Path, int]:
    """(sha256, cache path, bytes downloaded) of one member, materialised as a content-addressed blob."""
    from warpdata.atomic import TMP_PREFIX, atomic_write_text

    bc = reader.ds.cache
    shard, off, length = reader.locate(member)
    pointer = bc.root / "members" / shard[:2] / f"{shard}-{off}-{length}"
    try:
        h = pointer.read_text().strip()
        p = bc.get(h, verify=not trust_cached)
        if p is not None:
            return h, p, 0
    except (FileNotFoundError, ValueError):
        pass
    pointer.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=TMP_PREFIX, dir=pointer.parent)
    try:
        with os.fdopen(fd, "wb") as raw:
            hf = _Hashing(raw)
            _copy_member(reader, member, hf)
        h = hf.h.hexdigest()

        def copy(f) -> None:
            with open(tmp, "rb") as src:
                while chunk := src.read(CHUNK):
                    f.write(chunk)

        p = bc.fetch(h, copy, size=length, source=f"{reader.ds.id}:{reader.name}/{member}")
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
    atomic_write_text(pointer, h, fsync=False)
    return h, Path(p), length


class _Hashing:
    def __init__(self, raw) -> None:
        self.raw, self.h = raw, hashlib.sha256()

    def write(self, b) -> int:
        self.h.update(b)
        return self.raw.write(b)


def materialize(target: str, kind: str, files: Callable[[dict[str, Any]], list[str]], *,
                version: str | None = None, store: str | None = None, mode: str | None = None,
                artifact: str | None = None, cache=None, trust_cached: bool = False) -> Materialized:
    """Resolve published dataset ``target`` and lay out its ``kind`` artifact as a local directory.

    ``files(manifest_doc)`` names the data files to materialise (paths
    relative to the artifact root); ``manifest.json`` always comes along.
    """
    from warpdata.dataset import Dataset

    ds = Dataset(target, mode=mode, version=version, store=store, cache=cache)
    if ds.cache is None:
        raise UsageError(f"opening {kind} {target} needs the blob cache; mode='remote' keeps nothing locally",
                         hint="use mode='auto' (the default) or 'local'")
    bc = ds.cache
    aname = _pick_artifact(ds, kind, artifact)
    reader = ds.artifact(aname)
    pinned: list[str] = []
    try:
        mh, mpath, fetched = _member_blob(reader, "manifest.json", trust_cached=False)
        bc.pin([mh])
        pinned.append(mh)
        try:
            doc = json.loads(Path(mpath).read_bytes())
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise DataError(f"manifest.json of artifact {aname} in {ds.id}: not valid JSON: {e}",
                            hint="republish the artifact") from None
        if not isinstance(doc, dict) or doc.get("kind") != kind:
            raise DataError(f"artifact {aname} of {ds.id} is a {doc.get('kind') if isinstance(doc, dict) else '?'!r}, "
                            f"not a {kind}", hint="pick the right artifact with artifact=NAME")
        links: dict[str, Path] = {"manifest.json": Path(mpath)}
        for rel in files(doc):
            if rel.startswith("/") or ".." in Path(rel).parts:
                raise DataError(f"manifest.json of {ds.id}/{aname} names {rel!r} outside the artifact",
                                hint="republish the artifact")
            h, p, n = _member_blob(reader, rel, trust_cached)
            bc.pin([h])
            pinned.append(h)
            links[rel] = p
            fetched += n
    except BaseException:
        bc.unpin(pinned)
        raise
    finally:
        reader.close()
    view = _view(bc.root, ds.id, ds.version, aname, links)
    m = Materialized(view, ds.id, ds.version, aname, pinned, fetched)
    m._release = weakref.finalize(m, bc.unpin, pinned)  # runs once: on close() or garbage collection
    return m


def _view(root: Path, dataset: str, version: str, aname: str, links: dict[str, Path]) -> Path:
    """A directory of symlinks ``rel -> blob``, named by a hash of the mapping; built once."""
    spec = json.dumps(sorted((k, str(v)) for k, v in links.items())).encode()
    name = f"{version[:16]}-{aname}-{hashlib.sha256(spec).hexdigest()[:16]}"
    base = Path(root) / "views" / dataset.replace("/", "--")
    target = base / name
    if target.is_dir() and all((target / rel).resolve() == Path(p).resolve() for rel, p in links.items()):
        return target
    base.mkdir(parents=True, exist_ok=True)
    from warpdata.atomic import TMP_PREFIX

    tmp = Path(tempfile.mkdtemp(prefix=TMP_PREFIX, suffix="-" + name, dir=base))
    for rel, p in links.items():
        dst = tmp / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        os.symlink(os.path.abspath(p), dst)
    try:
        os.rename(tmp, target)
    except OSError:
        # another process made the same view (same name = same links), or a stale one is in the way
        import shutil

        if target.is_dir() and all((target / rel).resolve() == Path(p).resolve() for rel, p in links.items()):
            shutil.rmtree(tmp, ignore_errors=True)
            return target
        old = base / f"{TMP_PREFIX}old-{os.getpid()}-{name}"
        with contextlib.suppress(FileNotFoundError):
            os.rename(target, old)
        os.rename(tmp, target)
        shutil.rmtree(old, ignore_errors=True)
    return target
