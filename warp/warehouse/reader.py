"""The training-side reader: zero-copy samples and batched copies from TWH1 shards.

``warpdata.warehouse.open(path)`` reads and schema-checks the manifest,
refuses a warehouse whose validation verdict is ``fail`` (built with
``--allow-invalid``) unless ``allow_invalid=True``, and returns a
:class:`Warehouse`. Shards are memory-mapped lazily, on first touch, and
their SHA-256 is checked then (``verify="fast"``, the default: TWH1 has no
per-sample checksum, so a shard is the smallest unit checked), all at once when
the warehouse is opened (``verify="full"`` or :meth:`Warehouse.verify`) or never
(``"off"``) — the one ``verify=`` vocabulary of :mod:`warpdata.core.verify`
(the first release's ``"lazy"``, ``"all"`` and ``"none"`` map onto it with a
DeprecationWarning); each
shard's open + verify time is logged (logger ``warpdata.warehouse``) and kept
in :attr:`Warehouse.shard_load_s`.

* ``wh[i]`` → :class:`Sample` of read-only numpy views into the map (image
  CHW, boxes/mask/classes padded to ``max_boxes``, frame id) plus the key
  and run id strings — no copy.
* ``wh.batch(indices, out=)`` copies a batch into preallocated arrays
  (:meth:`Warehouse.alloc_batch`), one ``np.copyto`` per sample: batched
  copies beat per-item ``__getitem__`` + collate by 2–4× (docs/design.md §4).
* ``wh.sampler(...)`` is a :class:`~warpdata.partition.sampler.ShardAwareSampler`
  over the shard sizes.

``open("ws/name")`` (a published dataset instead of a path; ``version=``,
``store=``) opens the published warehouse in place
(:mod:`warpdata.read.materialize`): the tar shards holding its manifest
and TWH1 shards are taken from the blob cache (or fetched into it whole, as
``warp warm`` does), and each TWH1 shard is memory-mapped at its offset inside
its cached tar shard, so the cache holds every byte once. Each shard's
SHA-256 is still checked against the manifest on first touch. The tar shards
stay pinned until :meth:`Warehouse.close`; ``path`` then names the dataset
(``ws/name@version/artifact``), not a directory.

A pickled :class:`Warehouse` carries only the path (or the members'
locations) and the manifest; maps are reopened lazily in the receiving
process (DataLoader workers never copy shard data). Per-sample metadata stays
in numpy arrays inside the maps.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from warpdata.core.errors import (
    BlobCorruptedError,
    DataError,
    DatasetNotFoundError,
    MissingInputError,
    UsageError,
)
from warpdata.core.names import MANIFEST_NAME
from warpdata.core.verify import LEVELS, verify_level
from warpdata.formats import twh1
from warpdata.partition.sampler import ShardAwareSampler
from warpdata.read.materialize import looks_like_dataset, materialize
from warpdata.warehouse import manifest as wmanifest

log = logging.getLogger("warpdata.warehouse")
VERIFY_MODES = LEVELS  # ("off", "fast", "full")
OLD_VERIFY = {"lazy": "fast", "all": "full", "none": "off"}


@dataclass(frozen=True)
class Sample:
    image: np.ndarray  # (C, H, W)
    boxes: np.ndarray  # (max_boxes, 4) xyxy pixels
    mask: np.ndarray  # (max_boxes,)
    classes: np.ndarray  # (max_boxes,) int32, -1 = padding
    frame_id: int
    key: str
    run_id: str
    index: int

    @property
    def num_boxes(self) -> int:
        return int(np.count_nonzero(self.mask))


class Warehouse:
    def __init__(self, path: str | os.PathLike, *, allow_invalid: bool = False, verify: str = "fast") -> None:
        verify = verify_level(verify, "warehouse", OLD_VERIFY)
        p = Path(path)
        self.path = p if p.is_dir() else p.parent
        # relative path -> (file, offset, length) of a shard inside a cached tar; None = files under path
        self._members: dict[str, tuple[str, int, int]] | None = None
        self._setup(wmanifest.read(self.path), allow_invalid, verify)

    def _setup(self, manifest: dict[str, Any], allow_invalid: bool, verify: str) -> None:
        self.manifest = manifest
        verdict = self.manifest["summary"]["verdict"]
        if verdict["status"] == "fail" and not allow_invalid:
            problems = "; ".join(f"{c['scope']} {c['metric']}={c['value']:.4f} > {c['fail']}"
                                 for c in verdict["checks"] if c["status"] == "fail")
            raise DataError(f"{self.path}: this warehouse failed its validation thresholds ({problems}) "
                            "and was built with --allow-invalid",
                            hint="pass allow_invalid=True (or --allow-invalid) to train on it anyway",
                            path=str(self.path))
        self.verify_mode = verify
        shards = self.manifest["shards"]
        self.shard_sizes = np.array([s["samples"] for s in shards], np.int64)
        self.offsets = np.concatenate([[0], np.cumsum(self.shard_sizes)]).astype(np.int64)
        self.transform = self.manifest["transform"]
        self.width, self.height = self.transform["target_size"]
        self.max_boxes = int(self.transform["max_boxes"])
        self.dtype = self.transform["dtype"]
        self.classes = self.manifest["classes"]
        self.shard_load_s: dict[int, float] = {}
        self._shards: dict[int, twh1.TWH1Shard] = {}
        self._lock = threading.Lock()
        self.published: Any = None  # a warpdata.read.materialize.PublishedArtifact when opened by name
        if verify == "full":
            self.verify()

    @classmethod
    def from_published(cls, name: str, *, version: str | None = None, store: str | None = None,
                       mode: str | None = None, artifact: str | None = None, allow_invalid: bool = False,
                       verify: str = "fast", cache: Any = None) -> Warehouse:
        """Open the tensor warehouse published as dataset ``name`` (see the module docstring)."""
        verify = verify_level(verify, "warehouse", OLD_VERIFY)
        docs: list[dict[str, Any]] = []

        def shard_files(doc: dict[str, Any]) -> list[str]:
            where = f"{name}: manifest.json"
            hint = f"republish the warehouse ('warp etl', then 'warp publish {name} --from DIR')"
            if doc.get("manifest_version") == 1 or "content_sha256" not in doc:
                wmanifest.check_seal(doc, where, hint)
            wmanifest.validate_manifest(doc, where)
            wmanifest.check_seal(doc, where, hint)
            docs.append(doc)
            return [s["relative_path"] for s in doc["shards"]]

        try:
            # the reader checks each shard's SHA-256 itself unless verify="off": no second hash of cached blobs
            m = materialize(name, wmanifest.KIND, shard_files, version=version, store=store, mode=mode,
                            artifact=artifact, cache=cache, trust_cached=verify != "off")
        except DatasetNotFoundError as e:
            raise MissingInputError(f"{name} is not a local directory, and {e.message}",
                                    hint="pass a warehouse version directory written by 'warp etl', or the "
                                         "name of a dataset published with 'warp publish NAME --from DIR'") from None
        wh = cls.__new__(cls)
        wh.path = Path(m.label)
        wh._members = {rel: (x.path, x.offset, x.length) for rel, x in m.members.items() if rel != MANIFEST_NAME}
        try:
            wh._setup(docs[0], allow_invalid, verify)
        except BaseException:
            m.close()
            raise
        wh.published = m
        return wh

    def _shard_file(self, rel: str) -> twh1.TWH1Shard:
        """Map shard ``rel``: a file under :attr:`path`, or its bytes inside a cached tar shard."""
        if self._members is None:
            return twh1.TWH1Shard(self.path / rel)
        file, offset, length = self._members[rel]
        return twh1.TWH1Shard(file, offset=offset, length=length, name=f"{self.path}/{rel}")

    # pickling: path + settings only; maps reopen in the receiving process
    def __getstate__(self) -> dict[str, Any]:
        st = dict(self.__dict__)
        st["_shards"] = {}
        st["shard_load_s"] = {}
        st["published"] = None  # the pins belong to the opening process, which outlives its workers
        st.pop("_lock")
        return st

    def __setstate__(self, st: dict[str, Any]) -> None:
        self.__dict__.update(st)
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return int(self.offsets[-1])

    @property
    def num_shards(self) -> int:
        return len(self.shard_sizes)

    def shard(self, i: int) -> twh1.TWH1Shard:
        s = self._shards.get(i)
        if s is not None:
            return s
        with self._lock:
            s = self._shards.get(i)
            if s is None:
                s = self._open_shard(i)
                self._shards[i] = s
        return s

    def _open_shard(self, i: int) -> twh1.TWH1Shard:
        meta = self.manifest["shards"][i]
        t0 = time.perf_counter()
        s = self._checked(i, verify=self.verify_mode != "off")
        h = s.header
        dt = time.perf_counter() - t0
        self.shard_load_s[i] = dt
        log.info("opened shard %s (%d samples, %.1f MB) in %.1f ms%s", meta["relative_path"], h.samples,
                 meta["size_bytes"] / 1e6, dt * 1000, " incl. sha256" if self.verify_mode != "off" else "")
        return s

    def _check_one(self, i: int, verify: bool) -> twh1.TWH1Shard:
        meta = self.manifest["shards"][i]
        s = self._shard_file(meta["relative_path"])
        try:
            h = s.header
            want = (meta["samples"], meta["width"], meta["height"], meta["channels"], meta["max_boxes"])
            got = (h.samples, h.width, h.height, h.channels, h.max_boxes)
            if want != got or twh1.MANIFEST_DTYPE[h.dtype] != meta["dtype"]:
                raise DataError(f"{s.name}: header (samples, width, height, channels, max_boxes) = {got}, "
                                f"dtype {h.dtype} disagrees with the manifest's {want}, {meta['dtype']}",
                                hint="the shard does not belong to this manifest; " + wmanifest.REBUILD_HINT)
            if verify:
                s.verify(meta["checksum_sha256"])
        except BaseException:
            s.close()
            raise
        return s

    def _checked(self, i: int, verify: bool) -> twh1.TWH1Shard:
        """Shard ``i`` mapped, its header (and SHA-256 when ``verify``) checked against the manifest.

        A published shard failing a check is a bad cached copy until shown
        otherwise: its tar shard is evicted and fetched again, once
        (docs/formats/registry.md, "Readers"); if the fresh copy fails too the
        error names the store object.
        """
        try:
            return self._check_one(i, verify)
        except DataError as e:
            if self.published is None:
                raise
            first = e
        rel = self.manifest["shards"][i]["relative_path"]
        pub = self.published
        if pub.refetch(rel):
            self._members = {r: (x.path, x.offset, x.length) for r, x in pub.members.items() if r != MANIFEST_NAME}
            try:
                return self._check_one(i, verify)
            except DataError as e:
                first = e
        obj = pub.store_object(rel)
        raise BlobCorruptedError(f"{self.path}/{rel}: fails its check in a freshly fetched copy of store "
                                 f"object {obj} ({first.message})",
                                 hint="the published bytes are wrong: republish the warehouse "
                                      "('warp etl', then 'warp publish NAME --from DIR')",
                                 store_object=obj, member=rel) from None

    def verify(self) -> list[str]:
        """Check every shard's SHA-256 against the manifest; returns the checksums."""
        out = []
        for i, meta in enumerate(self.manifest["shards"]):
            s = self._shards.get(i)
            if s is None:
                s = self._checked(i, verify=True)
            out.append(s.verify(meta["checksum_sha256"]))
            self._shards.setdefault(i, s)
        return out

    def locate(self, index: int) -> tuple[int, int]:
        n = len(self)
        if index < 0:
            index += n
        if not 0 <= index < n:
            raise IndexError(f"sample {index} out of range ({n} samples in {self.path})")
        sh = int(np.searchsorted(self.offsets, index, side="right") - 1)
        return sh, index - int(self.offsets[sh])

    def __getitem__(self, index: int) -> Sample:
        sh, j = self.locate(int(index))
        s = self.shard(sh)
        return Sample(s.images[j], s.boxes[j], s.mask[j], s.classes[j], int(s.frame_ids[j]), s.key(j),
                      s.run_id(j), int(index))

    def key(self, index: int) -> str:
        sh, j = self.locate(int(index))
        return self.shard(sh).key(j)

    def keys(self) -> list[str]:
        out: list[str] = []
        for i in range(self.num_shards):
            out.extend(self.shard(i).keys())
        return out

    def alloc_batch(self, size: int) -> dict[str, np.ndarray]:
        """Preallocated arrays for :meth:`batch` (reuse them across steps)."""
        s0 = self.shard(0)
        c, h, w = s0.images.shape[1:]
        return {"image": np.empty((size, c, h, w), s0.images.dtype),
                "boxes": np.empty((size, self.max_boxes, 4), s0.boxes.dtype),
                "mask": np.empty((size, self.max_boxes), s0.mask.dtype),
                "classes": np.empty((size, self.max_boxes), np.int32),
                "frame_id": np.empty(size, np.int64), "index": np.empty(size, np.int64)}

    def batch(self, indices, out: dict[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
        """Copy samples ``indices`` into ``out`` (allocated if None); returns views of length len(indices)."""
        idx = np.asarray(indices, np.int64).reshape(-1)
        n = len(idx)
        if out is None:
            out = self.alloc_batch(n)
        elif len(out["image"]) < n:
            raise ValueError(f"batch buffer holds {len(out['image'])} samples, {n} requested")
        total = len(self)
        if n and (idx.min() < -total or idx.max() >= total):
            raise IndexError(f"batch index out of range ({total} samples in {self.path})")
        idx = np.where(idx < 0, idx + total, idx)
        shard_of = np.searchsorted(self.offsets, idx, side="right") - 1
        local = idx - self.offsets[shard_of]
        img, box, msk, cls, fid = out["image"], out["boxes"], out["mask"], out["classes"], out["frame_id"]
        for k in range(n):
            s = self.shard(int(shard_of[k]))
            j = int(local[k])
            np.copyto(img[k], s.images[j])
            box[k] = s.boxes[j]
            msk[k] = s.mask[j]
            cls[k] = s.classes[j]
            fid[k] = s.frame_ids[j]
        out["index"][:n] = idx
        return {k: v[:n] for k, v in out.items()}

    def sampler(self, **kwargs: Any):
        """A :class:`~warpdata.partition.sampler.ShardAwareSampler` over this warehouse's shards."""
        return ShardAwareSampler(self.shard_sizes.tolist(), **kwargs)

    def close(self) -> None:
        for s in self._shards.values():
            s.close()
        self._shards.clear()
        if self.published is not None:
            self.published.close()  # unpin the cached blobs

    def __enter__(self) -> Warehouse:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return (f"Warehouse({str(self.path)!r}, samples={len(self)}, shards={self.num_shards}, "
                f"size={self.width}x{self.height}, dtype={self.dtype})")


def open(path: str | os.PathLike, *, allow_invalid: bool = False, verify: str = "fast",
         version: str | None = None, store: str | None = None, mode: str | None = None,
         artifact: str | None = None) -> Warehouse:
    """Open a warehouse version directory (or its manifest.json), or a published dataset by name
    (``"vision/coco"``).

    ``version=``/``store=`` pick the published version and store (default: latest in WARP_STORE);
    ``verify``: ``"fast"`` (each shard's SHA-256 on first touch), ``"full"`` (every shard's when
    opened) or ``"off"``.
    """
    if looks_like_dataset(path):
        return Warehouse.from_published(str(path), version=version, store=store, mode=mode, artifact=artifact,
                                        allow_invalid=allow_invalid, verify=verify)
    if version is not None or store is not None or artifact is not None:
        raise UsageError(f"version=, store= and artifact= apply to published datasets; {path} is a local path",
                         hint="pass the dataset name (workspace/name) to open a published warehouse")
    return Warehouse(path, allow_invalid=allow_invalid, verify=verify)
