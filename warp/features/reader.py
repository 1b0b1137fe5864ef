"""Read a feature cache with bounded memory: an LRU of memory-mapped shards.

Contract: :class:`ShardCache` opens a cache directory (its ``manifest.json``
must say ``"kind": "feature-cache"``) and serves records by global index
(shard order, as written). At most ``max_resident`` shards (default 2) are
mapped at once; touching another evicts the least recently used. Resident
memory is therefore bounded by ``max_resident × shard bytes`` per process,
whatever the epoch length, and an evicted shard's pages belong to the page
cache, not to the process. Records are returned as *copies* (``get``,
``get_batch``), so evicting a shard never invalidates what a caller holds.

``verify`` decides what is checked (the one vocabulary of
:mod:`warpdata.core.verify`; docs/partitioning.md):

* ``"fast"`` (default): each record's CRC-32C as it is read (≈1 µs per
  16 KiB record);
* ``"full"``: the whole shard's SHA-256 against the manifest when the shard
  enters the LRU (a full read: the cost of an LRU miss becomes the cost of
  reading the shard, which is what makes shard-aware sampling essential);
* ``"off"``.

The first release's names ``"record"``, ``"shard"`` and ``"none"`` still work,
with a DeprecationWarning.

``ShardCache("ws/name")`` (a published dataset instead of a path; ``version=``,
``store=``) opens the published cache in place
(:mod:`warpdata.read.materialize`): the tar shards holding its manifest
and WFS1 shards come from the blob cache (or are fetched into it whole, as
``warp warm`` does) and each WFS1 shard is mapped at its offset inside its
cached tar shard, so the cache holds every byte once. The tar shards stay
pinned until :meth:`ShardCache.close`; ``path`` then names the dataset
(``ws/name@version/artifact``), not a directory.

``ShardCache("s3://bucket/prefix")`` (any fsspec URL) opens a cache that ``warp etl`` built on
object storage (docs/features-config.md, "Output on object storage"): ``latest`` and the manifest
are two GETs, then each shard, on first use, is fetched by ranged GETs under the store's request
policy (a deadline per attempt, retries) into the content-addressed
blob cache (:mod:`warpdata.storage.blobcache`) under the SHA-256 the manifest names, hashed as it
lands, and mapped from there. DataLoader workers of one node share the fetched copies.

Every shard's header is checked against the manifest's field table and
record count when it is mapped. A handle pickles to its path and settings
only (DataLoader workers reopen lazily; nothing mapped crosses processes).
"""

from __future__ import annotations

import hashlib
import os
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from warpdata.core.errors import DataError, MissingInputError, UsageError
from warpdata.core.verify import LEVELS, verify_level
from warpdata.features import manifest as fmanifest
from warpdata.features.manifest import KIND
from warpdata.features.remote import is_url, open_version, stream_object
from warpdata.formats.featshard import FeatureShardChecksumError, FeatureShardReader, FieldSpec
from warpdata.read.materialize import looks_like_dataset, materialize
from warpdata.read.refetch import retry_after_refetch
from warpdata.storage.blobcache import BlobCache
from warpdata.storage.remote import Remote

VERIFY_MODES = LEVELS  # ("off", "fast", "full")
OLD_VERIFY = {"record": "fast", "shard": "full", "none": "off"}


def caption_text(caption: np.ndarray, length: int | np.integer) -> str:
    """The stored caption of one record (``caption`` and ``caption_len`` fields)."""
    return bytes(np.asarray(caption)[: int(length)]).decode("utf-8")


class ShardCache:
    """Random access to a feature cache through an LRU of at most ``max_resident`` mapped shards."""

    def __init__(self, path: str | os.PathLike, *, max_resident: int = 2, verify: str = "fast",
                 version: str | None = None, store: str | None = None, mode: str | None = None,
                 artifact: str | None = None) -> None:
        if max_resident < 1:
            raise ValueError(f"max_resident must be >= 1, got {max_resident}")
        verify = verify_level(verify, "ShardCache", OLD_VERIFY)
        self.published: Any = None
        self._remote_url: str | None = None  # a cache built on object storage: its version's URL
        if is_url(path):
            if version is not None or store is not None or artifact is not None:
                raise UsageError(f"version=, store= and artifact= apply to published datasets; {path} is a URL",
                                 hint="open the version's own URL (<url>/v<YYYYMMDD>-<hash12>) instead")
            self._remote_url, m, self._remote_obj = open_version(str(path))
            self.path = Path(self._remote_url)
            self._members = None
        elif looks_like_dataset(path):
            docs: list[dict[str, Any]] = []

            def shard_files(doc: dict[str, Any]) -> list[str]:
                fmanifest.check(doc, f"{path}: manifest.json",
                                hint=f"rebuild the cache with 'warp etl --clear' and publish it again "
                                     f"('warp publish {path} --from DIR')")
                docs.append(doc)
                return [str(s["path"]) for s in doc["shards"]]

            # verify="full" re-hashes every shard when it is mapped: no need to hash cached blobs twice
            pub = materialize(str(path), KIND, shard_files, version=version, store=store, mode=mode,
                              artifact=artifact, trust_cached=verify == "full")
            self.published = pub
            self.path = Path(pub.label)
            # relative path -> (cached tar shard, offset, length): pickles, so workers map the same bytes
            self._members: dict[str, tuple[str, int, int]] | None = {
                rel: (x.path, x.offset, x.length) for rel, x in pub.members.items()}
            m = docs[0]
        elif version is not None or store is not None or artifact is not None:
            raise UsageError(f"version=, store= and artifact= apply to published datasets; {path} is a local path",
                             hint="pass the dataset name (workspace/name) to open a published feature cache")
        else:
            self.path = Path(path)
            self._members = None
            m = fmanifest.read(self.path)
        self.max_resident = max_resident
        self.verify = verify
        if m.get("kind") != KIND:
            raise DataError(f"{self.path}: manifest kind is {m.get('kind')!r}, not {KIND!r}",
                            hint="point at a directory written by `warp etl` with [source] format = \"captions\"")
        self.manifest = m
        try:
            self.fields = tuple(FieldSpec(f["name"], f["dtype"], tuple(f["shape"])) for f in m["fields"])
            self.shards: list[dict[str, Any]] = list(m["shards"])
            sizes = [int(s["records"]) for s in self.shards]
        except (KeyError, TypeError, ValueError) as e:
            raise DataError(f"{self.path}: manifest is malformed ({e})",
                            hint="rebuild the cache with warp etl --clear") from None
        self.shard_sizes = np.asarray(sizes, np.int64)
        self.offsets = np.concatenate([[0], np.cumsum(self.shard_sizes)]).astype(np.int64)
        self._lru: OrderedDict[int, FeatureShardReader] = OrderedDict()
        self.stats = {"hits": 0, "misses": 0, "evictions": 0, "max_resident": 0}
        self._blobs: Any = None  # the blob cache remote shards are fetched into (this process's)
        self._pinned: set[str] = set()
        if self._remote_url is None:
            self._remote_obj = None
        else:
            self._by_path = {str(e["path"]): e for e in self.shards}

    def __getstate__(self) -> dict[str, Any]:
        d = self.__dict__.copy()
        d["_lru"] = OrderedDict()
        d["published"] = None  # the opening process keeps the blobs pinned
        d["stats"] = {k: 0 for k in self.stats}
        d["_blobs"], d["_pinned"] = None, set()  # a DataLoader worker fetches (or finds) shards itself
        if d.get("_remote_obj") is not None:
            d["_remote_obj"] = None
        return d

    @property
    def fingerprint(self) -> str:
        return str(self.manifest.get("fingerprint"))

    @property
    def num_shards(self) -> int:
        return len(self.shards)

    def __len__(self) -> int:
        return int(self.offsets[-1])

    @property
    def sources(self) -> list[dict[str, Any]]:
        """The manifest's ``sources`` (``[[directory]]`` builds), else ``[]``."""
        return list(self.manifest.get("sources", ()))

    def record_repeats(self) -> np.ndarray | None:
        """Per record, how many times a sampler yields it per epoch (its directory's ``num_repeats``).

        None for a cache built from one ``[source] path`` (every record once). The counts come
        from the sealed manifest (docs/formats/feature-shard.md, "Sources"); records are stored once.
        """
        if not self.sources:
            return None
        rep = np.ones(len(self), np.int64)
        for src in self.sources:
            rep[src["first_record"]:src["first_record"] + src["records"]] = src["num_repeats"]
        return rep

    def field_names(self) -> list[str]:
        return [f.name for f in self.fields]

    def locate(self, index: int) -> tuple[int, int]:
        n = len(self)
        if not -n <= index < n:
            raise IndexError(f"{self.path}: record {index} out of range (cache has {n})")
        if index < 0:
            index += n
        s = int(np.searchsorted(self.offsets, index, side="right")) - 1
        return s, index - int(self.offsets[s])

    def resident(self) -> list[int]:
        """Shard ids currently mapped, least recently used first."""
        return list(self._lru)

    def shard(self, s: int) -> FeatureShardReader:
        r = self._lru.get(s)
        if r is not None:
            self._lru.move_to_end(s)
            self.stats["hits"] += 1
            return r
        self.stats["misses"] += 1
        while len(self._lru) >= self.max_resident:
            _, old = self._lru.popitem(last=False)
            old.close()
            self.stats["evictions"] += 1
        r = self._open(s)
        self._lru[s] = r
        self.stats["max_resident"] = max(self.stats["max_resident"], len(self._lru))
        return r

    def _where(self, rel: str) -> tuple[str, int, int | None]:
        """(file, offset, length) of shard ``rel``: a file under :attr:`path`, bytes of a cached tar shard,
        or the blob-cache copy of a shard in the object store."""
        if self._remote_url is not None:
            return self._fetch(rel), 0, None
        if self._members is None:
            return str(self.path / rel), 0, None
        return self._members[rel]

    def _label(self, rel: str) -> str:
        return f"{self._remote_url}/{rel}" if self._remote_url is not None else str(self.path / rel)

    def _fetch(self, rel: str) -> str:
        """Shard ``rel`` of a cache in the object store, by its manifest SHA-256, from the blob cache.

        Streamed by ranged GETs under the store's request policy
        (:func:`warpdata.features.remote.stream_object`); the bytes are hashed as they land (a
        mismatch is :class:`~warpdata.core.errors.BlobCorruptedError` and nothing is kept); the
        manifest's byte count is checked against what arrives, never used to allocate. Processes of
        one node (DataLoader workers) fetch a shard once between them (the cache's per-blob lock); this process pins what it fetched until
        :meth:`close`.
        """
        entry = self._by_path[rel]
        if self._blobs is None:
            self._blobs = BlobCache()
        if self._remote_obj is None:
            self._remote_obj = Remote(self._remote_url)
        remote, h = self._remote_obj, str(entry["sha256"])
        p = self._blobs.fetch(h, lambda f: stream_object(remote, rel, f, int(entry["bytes"])),
                              source=remote.url_of(rel))
        if h not in self._pinned:
            self._blobs.pin([h])
            self._pinned.add(h)
        return str(p)

    @property
    def remote_stats(self) -> dict[str, Any] | None:
        """Requests this process sent to the object store and bytes received (a cache built there)."""
        return None if self._remote_obj is None else self._remote_obj.stats.to_dict()

    def _reader(self, rel: str) -> FeatureShardReader:
        file, offset, length = self._where(rel)
        return FeatureShardReader(file, offset=offset, length=length,
                                  name=None if self._members is None and self._remote_url is None
                                  else self._label(rel))

    def _sha256(self, rel: str) -> str:
        """SHA-256 of shard ``rel``'s bytes (the whole file, or its range inside the tar shard)."""
        file, offset, length = self._where(rel)
        h = hashlib.sha256()
        buf = bytearray(1 << 20)
        view = memoryview(buf)
        with open(file, "rb", buffering=0) as f:
            f.seek(offset)
            left = os.fstat(f.fileno()).st_size - offset if length is None else length
            while left > 0:
                n = f.readinto(view[:min(len(buf), left)])
                if not n:
                    break
                h.update(view[:n])
                left -= n
        return h.hexdigest()

    def _open(self, s: int) -> FeatureShardReader:
        try:
            return self._open_once(s)
        except DataError as e:
            if self.published is None:
                raise
            return self._after_refetch(s, e, lambda: self._open_once(s))

    def _after_refetch(self, s: int, first: DataError, again):
        """A published shard failed a check: evict its tar shard, fetch it again once, retry ``again``
        (:func:`warpdata.read.refetch.retry_after_refetch`: a second failure names the store object)."""
        pub = self.published

        def refetched() -> None:
            self._members = {r: (x.path, x.offset, x.length) for r, x in pub.members.items()}
            old = self._lru.pop(s, None)
            if old is not None:
                old.close()

        return retry_after_refetch(pub, self.shards[s]["path"], first, again, label=str(self.path),
                                   hint="the published bytes are wrong: rebuild the cache ('warp etl --clear') "
                                        "and publish it again", refetched=refetched)

    def _open_once(self, s: int) -> FeatureShardReader:
        entry = self.shards[s]
        p = self._label(entry["path"])
        hint = ("rebuild the cache (warp etl --clear)" if self._members is None else
                "the cached copy is damaged; it is fetched again once")
        if self._members is None and self._remote_url is None and not os.path.isfile(p):
            raise MissingInputError(f"{p}: shard {s} of the feature cache is missing",
                                    hint="rebuild the cache (warp etl; a missing shard triggers a rebuild)",
                                    path=str(p), shard=s)
        if self.verify == "full" and self._remote_url is None:  # a fetched blob was hashed as it landed
            got = self._sha256(entry["path"])
            if got != entry.get("sha256"):
                raise FeatureShardChecksumError(
                    f"{p}: SHA-256 {got} does not match the manifest's {entry.get('sha256')}",
                    hint="the shard is corrupt or was replaced; " + hint, path=str(p), shard=s)
        r = self._reader(entry["path"])
        if r.fields != self.fields or len(r) != entry["records"]:
            r.close()
            raise DataError(f"{p}: fields or record count differ from the manifest "
                            f"({len(r)} records vs {entry['records']})",
                            hint="the cache is inconsistent; " + hint, path=str(p), shard=s)
        return r

    def _record(self, index: int):
        s, pos = self.locate(index)
        r = self.shard(s)
        if self.verify == "fast":
            try:
                r.verify_record(pos)
            except DataError as e:
                if self.published is None:
                    raise

                def again():
                    r2 = self._open_once(s)
                    self._lru[s] = r2
                    r2.verify_record(pos)
                    return r2
                r = self._after_refetch(s, e, again)
        return r.records[pos]

    def get(self, index: int, fields: Sequence[str] | None = None) -> dict[str, np.ndarray]:
        """One record as a dict of field copies."""
        rec = self._record(index)
        return {n: np.array(rec[n]) for n in (fields or self.field_names())}

    def __getitem__(self, index: int) -> dict[str, np.ndarray]:
        return self.get(index)

    def allocate(self, n: int, fields: Sequence[str] | None = None) -> dict[str, np.ndarray]:
        """Output buffers for ``get_batch`` of up to ``n`` records (reuse them across calls)."""
        spec = {f.name: f for f in self.fields}
        return {name: np.empty((n, *spec[name].shape), np.dtype(spec[name].dtype))
                for name in (fields or self.field_names())}

    def get_batch(self, indices: Iterable[int], out: dict[str, np.ndarray] | None = None,
                  fields: Sequence[str] | None = None) -> dict[str, np.ndarray]:
        """Records ``indices`` (in that order) copied into ``out`` (allocated if None)."""
        idx = [int(i) for i in indices]
        names = list(fields or (out.keys() if out else self.field_names()))
        if out is None:
            out = self.allocate(len(idx), names)
        elif any(len(out[n]) < len(idx) for n in names):
            raise ValueError(f"output buffers hold fewer than {len(idx)} records")
        for j, i in enumerate(idx):
            rec = self._record(i)
            for n in names:
                out[n][j] = rec[n]
        return {n: out[n][:len(idx)] for n in names}

    def verify_all(self) -> list[str]:
        """Check every shard's SHA-256 and every record's CRC; return problems found."""
        problems = []
        for s, entry in enumerate(self.shards):
            try:
                got = self._sha256(entry["path"])
                if got != entry.get("sha256"):
                    problems.append(f"{entry['path']}: SHA-256 {got[:16]}... differs from the manifest")
                with self._reader(entry["path"]) as r:
                    if r.fields != self.fields or len(r) != entry["records"]:
                        problems.append(f"{entry['path']}: fields or record count differ from the manifest")
                        continue
                    r.verify()
            except (DataError, OSError) as e:
                problems.append(f"{entry['path']} (shard {s}): {e}")
        return problems

    def close(self) -> None:
        while self._lru:
            _, r = self._lru.popitem()
            r.close()
        if self.published is not None:
            self.published.close()  # unpin the cached blobs
        if self._pinned and self._blobs is not None:
            self._blobs.unpin(sorted(self._pinned))
            self._pinned.clear()

    def __enter__(self) -> ShardCache:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
