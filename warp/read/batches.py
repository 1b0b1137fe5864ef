"""Record batches from a table's Parquet shards: the read path behind ``Table.batches()``.

:class:`BatchStream` walks the row groups a :class:`~warpdata.partition.plan.ShardPlan`
gives this rank and DataLoader worker and cuts exact-size batches. Shards open through
:class:`_ShardFiles` (the blob cache when a shard is there, ranged reads otherwise); the next
shards are prefetched into the cache in the background and the next row groups are read
ahead on threads, across shard boundaries, within a stated number of bytes in flight (their
ranged GETs and decoding release the GIL). A remote shard the stream reads whole is one GET,
footer included; otherwise its footer (from the manifest when it carries the shard's page
index: docs/formats/registry.md, "Page index in the manifest"; else one ranged GET), then its
column chunks as coalesced ranged GETs (:func:`warpdata.storage.remote.plan_ranges`), or for
part of a row group the pages holding the rows. Each row group's row count is checked against
the manifest, each footer against the manifest's footer length.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from warpdata.core import envvars
from warpdata.core.arrowmem import arrow_reader
from warpdata.core.errors import BlobCorruptedError, DataError, ManifestCorruptedError, UsageError
from warpdata.formats import parquet_index
from warpdata.formats import parquet_pages as pp
from warpdata.partition.plan import ResumeState, ShardPlan
from warpdata.partition.world import parse_shard, resolve_world, worker_info
from warpdata.read.pieces import PieceCache
from warpdata.registry.parquet_stats import parse_footer
from warpdata.storage.blobcache import CacheTooSmallError, normalize_hash

if TYPE_CHECKING:
    import pyarrow as pa
    from warpdata.read.source import BlobSource, TableSource
    from warpdata.registry.manifest import ShardRef


log = logging.getLogger(__name__)

PREFETCH_DEPTH = {"auto": 2, "hybrid": 8, "remote": 0, "local": 0}
DEFAULT_BATCH = 65536
# Stream read-ahead (:class:`_RowGroupBatcher`): reads of consecutive row groups of one shard, up
# to CHUNK_BYTES each (estimated from the manifest's shard size and row counts), run ahead of the
# consumer across shard boundaries on ROWGROUP_THREADS threads (their ranged GETs and decoding
# release the GIL): at most ROWGROUP_AHEAD reads and READAHEAD_BYTES of them in flight (always one).
# A read of a whole shard of at most WHOLE_SHARD_BYTES, every column, is one ranged GET of the
# whole object (footer included) decoded from memory: no footer request before it.
ROWGROUP_AHEAD = 3
ROWGROUP_THREADS = 2
CHUNK_BYTES = 16 << 20
READAHEAD_BYTES = 64 << 20
WHOLE_SHARD_BYTES = 16 << 20
# Pages read for part of a row group (_ShardFiles.read_rows) are coalesced spending at most this
# share of their bytes on gaps (plan_ranges' default spends 4 %: a rank's share would pay it)
PAGE_WASTE = 0.005


class _ShardFiles:
    """Open ParquetFile per shard (footer read once), preferring cached copies."""

    def __init__(self, ds: BlobSource, shards: Sequence[ShardRef]) -> None:
        self.ds = ds
        self.shards = shards
        self._open: dict[int, Any] = {}
        self._local: dict[int, bool] = {}
        self._src: dict[int, Any] = {}  # the RangeFile under a remotely opened shard
        self._opening: dict[int, threading.Lock] = {}
        self._mu = threading.Lock()
        self._keeper: Any = None  # the thread putting shards read whole into the blob cache
        self._queued = 0  # bytes handed to it, not written yet
        self._footers: dict[int, bytes] = {}  # the footer bytes of remotely opened shards (page reads)
        self._paged: dict[int, Any] = {}  # shard -> (decoded footer, leaf columns by top-level name)
        self._index: dict[int, Any] = {}  # shard -> its PageIndex from the manifest (formats/parquet_index.py)
        self._ranged: set[int] = set()  # remote shards whose data was read by ranges (never fetched whole after)
        self.wait_for: Callable[[int], None] = lambda unit: None  # the prefetcher finishing a shard it fetches

    def get(self, i: int):
        with self._mu:
            pf = self._open.get(i)
            # a shard first opened remotely switches to its cached copy once prefetch finished it
            if pf is not None and (self._local[i] or self.ds.cache is None or not self.ds.cache.has(self.shards[i].hash)):
                return pf
            lock = self._opening.setdefault(i, threading.Lock())
        with lock:  # the opener and the row-group reader threads open a shard once (one HEAD, one footer GET)
            with self._mu:
                pf = self._open.get(i)
                if pf is not None and (self._local[i] or self.ds.cache is None
                                       or not self.ds.cache.has(self.shards[i].hash)):
                    return pf
            return self._open_shard(i)

    def _open_shard(self, i: int):
        import pyarrow.parquet as pq

        s = self.shards[i]
        self.wait_for(i)  # a shard the prefetcher is downloading is read from the cache, never twice
        local = self.ds.cached_path(s)
        src = __import__("pyarrow").memory_map(local, "r") if local else self.ds.open_blob(s)
        index = None if local else page_index_of(self.ds, s)
        if local:
            footer = None
        elif index is not None:  # the manifest carries it: no request
            footer = (_parse_recorded_footer(self.ds, s, index.footer), index.footer)
        else:
            footer = _read_footer(self.ds, s, src, self.ds.cache)
        md = footer[0] if footer else None
        try:
            # remote: no pre_buffer, read_groups() prefetches the column chunks a read needs as
            # coalesced ranges in parallel (pyarrow's own pre-buffering would serialise them through
            # the one lock of the Python file it wraps the RangeFile in)
            pf = pq.ParquetFile(src, pre_buffer=False, metadata=md)
        except Exception as e:
            raise DataError(f"{self.ds.remote.url_of(self.ds.blob_key(s))}: not a readable Parquet shard: {e}",
                            hint="the store copy is damaged; republish the dataset") from None
        with self._mu:
            self._open[i] = pf
            self._local[i] = bool(local)
            self._src[i] = None if local else src
            if footer:
                self._footers[i] = footer[1]
            if index is not None:
                self._index[i] = index
        return pf

    def read_groups(self, i: int, groups: Sequence[int], columns: Sequence[str] | None, whole: bool = False):
        """Row groups ``groups`` of shard ``i`` as one table; a remote shard's column chunks are fetched
        first as a few coalesced ranged GETs in parallel, then decoded from memory.

        ``whole``: the caller reads every row group and column of the shard; a remote shard of at
        most :data:`WHOLE_SHARD_BYTES` not opened yet is then fetched by one GET (footer included)."""
        if whole:
            pf = self._whole(i)
            if pf is not None:
                return pf.read_row_groups(list(groups), columns=columns, use_threads=True)
        pf = self.get(i)
        with self._mu:
            src = self._src.get(i) if self._open.get(i) is pf else None
        if src is None or not hasattr(src, "prefetched"):
            return pf.read_row_groups(list(groups), columns=columns, use_threads=True)
        # Decoded on this thread: arrow's pool threads must never hold the Python file. A task
        # closure that drops the last reference to it on a pool thread after the interpreter began
        # to exit cannot take the GIL, and the process aborts ("terminate called without an active
        # exception"). The readers' own threads (_RowGroupBatcher) decode calls in parallel.
        with self._mu:
            self._ranged.add(i)
        with src.prefetched(chunk_ranges(pf.metadata, groups, columns)):
            return pf.read_row_groups(list(groups), columns=columns, use_threads=False)

    def whole_candidate(self, i: int) -> bool:
        """Whether shard ``i`` can be read whole by one GET (:meth:`_whole`): it has a recorded
        footer length, is at most :data:`WHOLE_SHARD_BYTES`, and is neither local nor cached. The
        planner asks this, so a shard it plans as read whole is one that :meth:`_whole` reads
        (and, in auto mode, keeps): the prefetcher skips exactly those."""
        s = self.shards[i]
        size = (s.stats or {}).get("footer_size")
        return bool(size) and 12 <= size + 4 <= s.byte_size <= WHOLE_SHARD_BYTES and self.ds.mode != "local" \
            and self.ds.cached_path(s) is None

    def _whole(self, i: int):
        """A ParquetFile over the whole remote shard ``i``, fetched once, or None (cached already,
        open already, too large, or no recorded footer length: the usual path).

        It is one ranged GET held in memory, checked against its content hash (a mismatch is
        fetched once more, then BlobCorruptedError; docs/formats/registry.md, "Readers"); with a
        blob cache (auto, hybrid) the same bytes then go into it on a background thread, so the
        shard is downloaded once (the prefetcher skips shards read whole). The footer is checked
        against the manifest's ``footer_size`` as :func:`_read_footer` does; decoding from Arrow
        memory holds no Python file, so it runs on Arrow's threads."""
        s = self.shards[i]
        size = (s.stats or {}).get("footer_size")
        with self._mu:
            # open is not fetched: a shard opened from the manifest's page index cost no request, so
            # only one whose bytes were read by ranges already is left to its ranges
            if i in self._ranged or (i in self._open and i not in self._index):
                return None
        if not self.whole_candidate(i):
            return None
        import pyarrow.parquet as pq

        key = self.ds.blob_key(s)
        data = _verified_get(self.ds, s)
        if self.ds.cache is not None:
            self._keep(s, data)
        md = _parse_recorded_footer(self.ds, s, data[len(data) - size:])
        try:
            return pq.ParquetFile(arrow_reader(data), metadata=md)  # Arrow's memory: warp/core/arrowmem.py
        except Exception as e:
            raise DataError(f"{self.ds.remote.url_of(key)}: not a readable Parquet shard: {e}",
                            hint="the store copy is damaged; republish the dataset") from None

    def _keep(self, s: ShardRef, data: bytes) -> None:
        """Put a whole shard read from the store into the blob cache, on one background thread
        (hashed again as it lands; a full cache keeps nothing and reads on). At most
        :data:`READAHEAD_BYTES` wait to be written: past that a shard is not cached (a disk
        slower than the store never makes the stream hold more)."""
        with self._mu:
            if self._queued and self._queued + len(data) > READAHEAD_BYTES:
                log.debug(f"shard {s.hash[:12]} not cached: {self._queued} bytes still to write")
                return
            self._queued += len(data)
            if self._keeper is None:
                from concurrent.futures import ThreadPoolExecutor

                self._keeper = ThreadPoolExecutor(1, thread_name_prefix="warp-cache-put")
            keeper = self._keeper

        def put() -> None:
            try:
                self.ds.cache.put_bytes(s.hash, data)
            except CacheTooSmallError as e:
                log.debug(f"shard {s.hash[:12]} not cached: {e.message}")
            except Exception as e:  # caching is an optimisation: the stream has its rows already
                log.warning(f"shard {s.hash[:12]} not cached: {e}")
            finally:
                with self._mu:
                    self._queued -= len(data)

        keeper.submit(put)

    def close(self) -> None:
        """Wait for the background cache writes (at most the read-ahead's bytes): after a stream,
        the cache holds every shard it read whole."""
        with self._mu:
            keeper, self._keeper = self._keeper, None
        if keeper is not None:
            keeper.shutdown(wait=True)

    def read_rows(self, i: int, g: int, lo: int, hi: int, columns: Sequence[str] | None):
        """Rows ``[lo, hi)`` of row group ``g`` of shard ``i`` fetched by pages, or None where that
        is not possible (a local or cached shard, no page index, columns whose leaves break pages
        at different rows): the caller then reads the whole row group.

        The shard's offset index for those columns is one coalesced ranged GET, the pages holding
        the rows (and each column's dictionary page) another; they are decoded as a file of their
        own (:func:`warpdata.formats.parquet_pages.slice_file`; docs/partitioning.md, "Reads
        aligned with storage")."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        pf = self.get(i)
        with self._mu:
            src = self._src.get(i) if self._open.get(i) is pf else None
            raw = self._footers.get(i)
        if src is None or raw is None or not hasattr(src, "prefetch"):
            return None
        with self._mu:
            self._ranged.add(i)
        fmd, leaves_of = self._page_layout(i, raw, pf)
        names = list(leaves_of) if columns is None else list(columns)
        leaves = [leaf for n in names for leaf in leaves_of.get(n, ())]
        if not leaves or len(leaves) != sum(len(leaves_of.get(n, ())) for n in names):
            return None
        where = self.ds.remote.url_of(self.ds.blob_key(self.shards[i]))
        pieces = PieceCache(self.ds.cache, self.shards[i].hash) if self.ds.cache is not None else None

        def fetch(ranges: list[tuple[int, int]]) -> dict[tuple[int, int], bytes]:
            if not ranges:
                return {}
            # the rows of one rank: bytes it does not need cost more than a request saved
            with src.prefetched(ranges, PAGE_WASTE):
                return {r: src.read_at(r[1], r[0]) for r in set(ranges)}

        # readers on this machine sharing the cache take turns on a row group: the second finds the
        # pages, dictionaries and offset indexes the first fetched (docs/partitioning.md)
        turn = pieces.cache.lock(f"pieces {self.shards[i].hash} {g}") if pieces else contextlib.nullcontext()
        try:
            with turn:
                chunks = self._chunk_pages(i, g, fmd, leaves, pieces, fetch)
                if chunks is None:
                    return None
                spans = {leaf: cp.covering(lo, hi) for leaf, cp in chunks.items()}
                groups: dict[tuple[int, int], list[str]] = {}  # rows covered -> the columns whose pages cover them
                for n in names:
                    got = {spans[leaf][2:] for leaf in leaves_of[n]}
                    if len(got) != 1:
                        return None  # a nested column whose leaves break pages at different rows
                    groups.setdefault(got.pop(), []).append(n)
                # from the piece cache what it has (docs/partitioning.md, "The cache carries epochs"), the
                # rest in one coalesced fetch
                want: list[tuple[int, int]] = []
                plans = {}
                for leaf, cp in chunks.items():
                    k, m = spans[leaf][:2]
                    offsets = [p.offset for p in cp.pages]
                    ends = [p.offset + p.size for p in cp.pages]
                    dict_bytes = None
                    if cp.dict_range is not None:
                        dict_bytes = pieces.named(g, leaf, "dict") if pieces else None
                        if dict_bytes is None or len(dict_bytes) != cp.dict_range[1]:
                            dict_bytes = None
                            want.append(cp.dict_range)
                    have, missing = pieces.lookup(g, leaf, offsets, ends, k, m) if pieces else ({}, [(k, m)])
                    want.extend((offsets[a], ends[b - 1] - offsets[a]) for a, b in missing)
                    plans[leaf] = (offsets, ends, dict_bytes, have, missing)
                fetched = fetch(want)
                data: dict[tuple[int, int], bytes] = {}
                for leaf, cp in chunks.items():
                    k, m = spans[leaf][:2]
                    offsets, ends, dict_bytes, have, missing = plans[leaf]
                    if cp.dict_range is not None:
                        if dict_bytes is None:
                            dict_bytes = fetched[cp.dict_range]
                            if pieces:
                                pieces.keep_named(g, leaf, "dict", dict_bytes)
                        data[cp.dict_range] = dict_bytes
                    for a, b in missing:
                        run = fetched[(offsets[a], ends[b - 1] - offsets[a])]
                        if pieces:
                            pieces.keep_pages(g, leaf, offsets, ends, (a, b), run, have)
                        else:
                            have.update((p, run[offsets[p] - offsets[a]:ends[p] - offsets[a]]) for p in range(a, b))
                    data[cp.byte_range(k, m)] = b"".join(have[p] for p in range(k, m))
            # decoded once the turn is over: the pages are this reader's now
            out: dict[str, Any] = {}
            for (first, _end), cols in groups.items():
                sel = {leaf: (chunks[leaf], *spans[leaf][:2]) for n in cols for leaf in leaves_of[n]}
                mini, first, end = pp.slice_file(raw, g, sel, data)
                # in Arrow's memory: no Arrow thread may hold the last reference to Python bytes at exit
                tab = pq.ParquetFile(arrow_reader(mini)).read(columns=cols, use_threads=False)
                if tab.num_rows != end - first:
                    raise pp.ParquetPagesError(f"pages of rows {first}..{end} decode to {tab.num_rows} rows")
                for n in cols:
                    out[n] = tab.column(n).slice(lo - first, hi - lo)
        except pp.ParquetPagesError as e:
            raise DataError(f"{where}: row group {g}: {e.message}",
                            hint="the store copy is damaged; republish the dataset") from None
        whole = pf.schema_arrow  # the schema (and its metadata) a read of whole row groups gives
        return pa.Table.from_arrays([out[n] for n in names],
                                    schema=pa.schema([whole.field(n) for n in names], metadata=whole.metadata))

    def _chunk_pages(self, i: int, g: int, fmd: dict, leaves: list[int], pieces, fetch):
        """Leaf -> :class:`~warpdata.formats.parquet_pages.ChunkPages` of row group ``g`` of shard ``i``:
        from the manifest's page index when it has one (no request), else from the columns' offset
        indexes (the piece cache's, the rest one coalesced fetch). None: a column has no offset index."""
        with self._mu:
            index = self._index.get(i)
        if index is not None:
            chunks = {leaf: index.chunk(fmd, g, leaf) for leaf in leaves}
            return None if any(c is None for c in chunks.values()) else chunks
        ois = [pp.offset_index(fmd, g, leaf) for leaf in leaves]
        if any(r is None for r in ois):
            return None
        oi_of: dict[int, bytes] = {}
        for leaf, r in zip(leaves, ois, strict=True):
            got = pieces.named(g, leaf, "oi") if pieces else None
            if got is not None and len(got) == r[1]:
                oi_of[leaf] = got
        need = [(leaf, r) for leaf, r in zip(leaves, ois, strict=True) if leaf not in oi_of]
        got_oi = fetch([r for _, r in need])
        for leaf, r in need:
            oi_of[leaf] = got_oi[r]
            if pieces:
                pieces.keep_named(g, leaf, "oi", got_oi[r])
        return {leaf: pp.pages_for_rows(fmd, g, leaf, oi_of[leaf]) for leaf in leaves}

    def _page_layout(self, i: int, raw: bytes, pf) -> tuple[dict, dict[str, list[int]]]:
        """The decoded footer of shard ``i`` and its leaf columns by top-level column name."""
        with self._mu:
            got = self._paged.get(i)
        if got is None:
            leaves: dict[str, list[int]] = {}
            sch = pf.metadata.schema
            for j in range(len(sch)):
                leaves.setdefault(sch.column(j).path.split(".")[0], []).append(j)
            got = (pp.footer_of(raw), leaves)
            with self._mu:
                self._paged[i] = got
        return got

    def row_groups(self, i: int) -> list[int]:
        """Rows per row group: from the manifest's shard statistics when it has them (format 2;
        docs/formats/registry.md), so planning reads opens no shard; else from the footer."""
        s = self.shards[i]
        rgs = (s.stats or {}).get("row_groups")
        if rgs and all(isinstance(r.get("row_count"), int) for r in rgs):
            counts = [r["row_count"] for r in rgs]
            if sum(counts) == s.row_count:
                return counts
        md = self.get(i).metadata
        return [md.row_group(g).num_rows for g in range(md.num_row_groups)]


def chunk_ranges(md: Any, groups: Sequence[int], columns: Sequence[str] | None) -> list[tuple[int, int]]:
    """(offset, length) of the column chunks of ``groups`` holding ``columns`` (None: all), from the footer."""
    names = None if columns is None else set(columns)
    out = []
    for g in groups:
        rg = md.row_group(g)
        for c in range(rg.num_columns):
            cc = rg.column(c)
            if names is not None and cc.path_in_schema.split(".")[0] not in names:
                continue
            start = cc.data_page_offset
            if cc.has_dictionary_page and cc.dictionary_page_offset is not None \
                    and 0 < cc.dictionary_page_offset < start:
                start = cc.dictionary_page_offset
            out.append((start, cc.total_compressed_size))
    return out


def _verified_get(ds: BlobSource, s: ShardRef) -> bytes:
    """The whole blob ``s`` by one ranged GET, its SHA-256 checked against its content address
    (hashlib releases the GIL); fetched once more on a mismatch, then BlobCorruptedError."""
    import hashlib

    key, want = ds.blob_key(s), normalize_hash(s.hash)
    for attempt in (1, 2):
        data = ds.remote.read_range(key, 0, s.byte_size, s.byte_size)
        got = hashlib.sha256(data).hexdigest()
        if got == want:
            return data
        log.debug(f"{ds.remote.url_of(key)}: hashes to {got}, not {want} (attempt {attempt})")
    source = ds.remote.url_of(key)
    raise BlobCorruptedError(f"{source}: downloaded bytes hash to {got}, expected {want} (fetched twice)",
                             hint="the store copy is damaged or was replaced; republish the dataset",
                             expected=want, got=got, source=source)


def page_index_of(ds: BlobSource, s: ShardRef):
    """The shard's :class:`~warpdata.formats.parquet_index.PageIndex` from the manifest's
    ``stats.page_index``, or None (not recorded); ManifestCorruptedError when it does not decode or
    its footer is not the manifest's ``footer_size`` long (docs/formats/registry.md, "Page index in
    the manifest")."""
    text = (s.stats or {}).get("page_index")
    if not text:
        return None
    where = f"{ds.remote.url_of(ds.blob_key(s))}: the manifest's page index"
    try:
        index = parquet_index.decode(text, where)
    except pp.ParquetPagesError as e:
        msg = e.message if e.message.startswith(where) else f"{where}: {e.message}"
        raise ManifestCorruptedError(msg, hint="the manifest's shard statistics are wrong; republish the dataset") from None
    if len(index.footer) != (s.stats or {}).get("footer_size"):
        raise ManifestCorruptedError(f"{where} holds a footer of {len(index.footer)} bytes, footer_size says "
                                     f"{(s.stats or {}).get('footer_size')}",
                                     hint="the manifest's shard statistics are wrong; republish the dataset")
    return index


def _read_footer(ds: BlobSource, s: ShardRef, src: Any, cache: Any = None):
    """``(metadata, footer bytes)`` of the shard by one ranged GET of exactly its recorded length, or None;
    kept as a piece of the blob cache (``cache``), so the next epoch opens the shard without a request.

    Without the length (format-1 manifests) pyarrow reads the file's last 64 KiB
    on the chance that the footer fits; with it, no byte beyond the footer moves.
    """
    size = (s.stats or {}).get("footer_size")
    if not size or size > s.byte_size:
        return None
    pieces = PieceCache(cache, s.hash) if cache is not None else None
    with cache.lock(f"pieces {s.hash} footer") if pieces else contextlib.nullcontext():
        data = pieces.named(None, None, "footer") if pieces else None
        if data is None or len(data) != size:
            try:
                data = src.read_at(size, s.byte_size - size)
            except Exception as e:
                raise ds.remote.typed_error(e, ds.blob_key(s)) from e
            if pieces:
                pieces.keep_named(None, None, "footer", data)
    return _parse_recorded_footer(ds, s, data), data


def _parse_recorded_footer(ds: BlobSource, s: ShardRef, data: bytes):
    """The footer metadata from the shard's last ``footer_size`` bytes (the manifest's length);
    ManifestCorruptedError when they are not a footer of that length."""
    size = len(data)
    try:
        return parse_footer(data)
    except (ValueError, OSError) as e:
        raise ManifestCorruptedError(
            f"{ds.remote.url_of(ds.blob_key(s))}: the manifest's footer_size {size} does not match the shard ({e})",
            hint="the manifest's shard statistics are wrong; republish the dataset") from None


class _Prefetcher:
    """Downloads upcoming shards into the blob cache on one background thread.

    At most ``depth`` shards ahead of the reader's position; nothing starts
    before the reader asks for its first shard, so the first batch never waits.
    Blobs of the window are pinned so a gc or another reader cannot evict them.
    """

    def __init__(self, ds: BlobSource, shards: Sequence[ShardRef], order: list[int], depth: int,
                 skip: Callable[[int], bool] | None = None) -> None:
        self.ds, self.shards, self.order, self.depth = ds, shards, order, depth
        self.skip = skip or (lambda unit: False)  # shards the reader itself puts into the cache
        self.pos = 0
        self.cv = threading.Condition()
        self.stop = False
        self.error: BaseException | None = None
        self.done: set[int] = set()
        self.current: int | None = None  # the shard being downloaded now
        self.pinned: list[str] = []
        self.thread = threading.Thread(target=self._run, name="warp-prefetch", daemon=True)
        self.thread.start()

    def advance(self, pos: int) -> None:
        with self.cv:
            self.pos = pos
            self.cv.notify_all()

    def _run(self) -> None:
        cache = self.ds.cache
        for k, i in enumerate(self.order):
            with self.cv:
                while not self.stop and k > self.pos + self.depth:
                    self.cv.wait(0.5)
                if self.stop:
                    return
                if k <= self.pos:
                    continue  # the reader is already on it, by ranged reads
            if self.skip(i):
                continue
            s = self.shards[i]
            with self.cv:
                if k <= self.pos:  # the reader got there first: it reads it, this thread does not
                    continue
                self.current = i
            try:
                cache.pin([s.hash])
                self.pinned.append(s.hash)
                if not cache.has(s.hash):
                    self.ds.fetch_blob(s)
                self.done.add(i)
            except CacheTooSmallError as e:
                self.error = e
                log.warning(f"prefetch stopped: {e.message}; reading remotely")
                return
            except Exception as e:  # prefetch is an optimisation: the reader falls back to ranged reads
                self.error = e
                return
            finally:
                with self.cv:
                    self.current = None
                    self.cv.notify_all()

    def wait_for(self, unit: int) -> None:
        """Return once shard ``unit`` is not being downloaded by this thread: a reader opening it
        then finds it in the cache instead of fetching its bytes a second time by ranges."""
        with self.cv:
            while self.current == unit:
                self.cv.wait(0.5)

    def close(self) -> None:
        with self.cv:
            self.stop = True
            self.cv.notify_all()
        self.thread.join(timeout=60)
        if self.pinned:
            self.ds.cache.unpin(self.pinned)
            self.pinned = []


def _worker_info() -> tuple[int, int]:
    """(id, count) of the PyTorch DataLoader worker running us; (0, 1) in the main process."""
    return worker_info()


def _parse_shard(shard: Any) -> tuple[int, int]:
    """(rank, world_size) of a ``shard=`` value (``Query.batches``): None, (rank, world), 'r/w' or 'auto'."""
    rank, world = parse_shard("shard", shard)
    w = resolve_world(rank, world, worker=(0, 1))  # 'auto': torch.distributed, then RANK / WORLD_SIZE
    return w.rank, w.world_size


def _prefetch_depth(prefetch: Any, mode: str) -> int:
    if prefetch in (None, "auto"):
        env = envvars.number("WARP_PREFETCH")  # bounded: a bad value is a ConfigError naming it
        prefetch = "auto" if env is None else env
    if prefetch == "auto":
        return PREFETCH_DEPTH[mode]
    if prefetch in (False, "off", "0", 0):
        return 0
    try:
        return max(0, int(prefetch))
    except (TypeError, ValueError):
        raise UsageError(f"prefetch={prefetch!r} is not auto, off or a number of shards",
                         hint="e.g. prefetch='auto', prefetch=4 or prefetch='off'") from None


@dataclass
class BatchStream:
    """An iterable of RecordBatches for one (rank, worker), with resume state."""

    table: TableSource
    plan: ShardPlan
    batch_ids: list[int]
    columns: list[str] | None
    limit: int | None
    depth: int
    num_workers: int = 1
    yielded: int = 0
    rows: int = 0
    _files: _ShardFiles | None = field(default=None, repr=False)

    def __len__(self) -> int:
        return len(self.batch_ids)

    def state_dict(self, batches_consumed: int | None = None, num_workers: int | None = None) -> ResumeState:
        """Resume state after ``batches_consumed`` (default: what this stream yielded)."""
        n = self.yielded if batches_consumed is None else batches_consumed
        return self.plan.state_after(n, num_workers or self.num_workers, manifest=self.table.ds.version,
                                     table=self.table.name)

    def __iter__(self) -> Iterator[pa.RecordBatch]:
        import pyarrow as pa

        ds, shards = self.table.ds, self.table.shards
        files = self._files = _ShardFiles(ds, shards)
        order: list[int] = []
        # with a limit, only the shards its rows come from: nothing past them is opened or prefetched
        planned = 0
        for j in self.batch_ids:
            if self.limit is not None and planned >= self.limit - self.rows:
                break
            for s in self.plan.batch_slices(j):
                if self.limit is not None and planned >= self.limit - self.rows:
                    break
                if not order or order[-1] != s.unit:
                    order.append(s.unit)
                planned += s.stop - s.start
        # Opening a remote shard costs round trips (size, footer): open the next few on
        # threads while this one is read, as pyarrow.dataset's fragment readahead does.
        # Not for limited reads (head): they must not fetch footers they never use.
        opener = _ShardOpener(files, order) if self.limit is None and ds.mode != "local" and len(order) > 1 else None
        cols = self.columns
        cur: tuple[int, int] | None = None  # (shard, row group) of the table held in `cur_tab`
        cur_tab, cur_first = None, 0  # ... which holds its rows from `cur_first` on
        bounds: dict[int, list[int]] = {}

        def bounds_of(unit: int) -> list[int]:
            # the planner's threads (opener, prefetcher) ask too: a list is published only whole
            b = bounds.get(unit)
            if b is None:
                built = [0]
                for n in files.row_groups(unit):
                    built.append(built[-1] + n)
                b = bounds.setdefault(unit, built)
            return b

        # Unlimited reads decode the next few row groups of a shard in one call, so
        # pyarrow decodes them in parallel (one row group at a time keeps one core busy).
        groups = _RowGroupBatcher(files, self._row_group_keys(bounds_of), cols, bounds_of,
                                  all_columns=cols is None or set(cols) >= set(self.table.schema_names())) \
            if self.limit is None else None
        if opener and groups:
            opener.skip = groups.reads_whole  # such a shard is one GET: no footer to fetch first
        # Only shards the stream reads in full (every row, every column) are downloaded whole ahead
        # of it, never one it reads by one GET itself or in part by pages: each byte moves once.
        pre = _Prefetcher(ds, shards, order, self.depth,
                          skip=lambda u: groups.reads_whole(u) or not groups.needs_all(u)) \
            if groups and self.depth and ds.cache is not None and ds.mode != "local" else None
        if pre:
            files.wait_for = pre.wait_for
        pos = 0
        try:
            for j in self.batch_ids:
                parts = []
                # a limited read stops taking rows (and so fetching row groups) at the limit
                want = None if self.limit is None else self.limit - self.rows
                if want is not None and want <= 0:
                    return
                got = 0
                for s in self.plan.batch_slices(j):
                    if want is not None and got >= want:
                        break
                    if order[pos] != s.unit:
                        pos = order.index(s.unit, pos)
                        if pre:
                            pre.advance(pos)
                    if opener:
                        opener.advance(pos)
                    b = bounds_of(s.unit)
                    start = s.start
                    stop = s.stop if want is None else min(s.stop, s.start + want - got)
                    while start < stop:
                        g = _bisect_right(b, start) - 1
                        lo, hi = start - b[g], min(stop, b[g + 1]) - b[g]  # rows of group g this slice needs
                        if cur != (s.unit, g) and groups:
                            cur_tab, cur_first = groups.take((s.unit, g))
                            cur = (s.unit, g)
                        if cur != (s.unit, g) or not cur_first <= lo < hi <= cur_first + cur_tab.num_rows:
                            # a limited read (or a span the plan did not foresee): these rows by pages,
                            # else the whole row group
                            cur_tab, cur_first = files.read_rows(s.unit, g, lo, hi, cols), lo
                            if cur_tab is None:
                                cur_tab, cur_first = files.read_groups(s.unit, [g], cols), 0
                                _check_rows(files, s.unit, [g], cur_tab.num_rows, b[g + 1] - b[g])
                            else:
                                _check_rows(files, s.unit, [g], cur_tab.num_rows, hi - lo)
                            cur = (s.unit, g)
                        take = hi - lo
                        parts.append(cur_tab.slice(lo - cur_first, take))
                        start += take
                        got += take
                tab = parts[0] if len(parts) == 1 else pa.concat_tables(parts)
                for batch in _one_batch(tab):
                    if self.limit is not None and self.rows + batch.num_rows > self.limit:
                        batch = batch.slice(0, self.limit - self.rows)
                    self.rows += batch.num_rows
                    self.yielded += 1
                    if batch.num_rows:
                        yield batch
                    if self.limit is not None and self.rows >= self.limit:
                        return
        finally:
            if groups:
                groups.close()
            if opener:
                opener.close()
            if pre:
                pre.close()
            files.close()


    def _row_group_keys(self, bounds_of) -> Iterator[tuple[int, int, int, int]]:
        """``(shard, row group, lo, hi)`` for the row groups this stream reads, in order, without
        repeats in a row: ``[lo, hi)`` are the rows of the group it needs there (a gap left by a
        resumed epoch inside them is read with them)."""
        last = None
        for j in self.batch_ids:
            for s in self.plan.batch_slices(j):
                b = bounds_of(s.unit)
                start = s.start
                while start < s.stop:
                    g = _bisect_right(b, start) - 1
                    stop = min(s.stop, b[g + 1])
                    lo, hi = start - b[g], stop - b[g]
                    if last is not None and last[:2] == (s.unit, g):
                        last = (s.unit, g, min(last[2], lo), max(last[3], hi))
                    else:
                        if last is not None:
                            yield last
                        last = (s.unit, g, lo, hi)
                    start = stop
        if last is not None:
            yield last


class _RowGroupBatcher:
    """Reads the row groups the stream will use, in stream order, ahead of the consumer on
    background threads, across shard boundaries.

    A read is consecutive row groups of one shard, up to ``chunk_bytes`` (estimated from the
    manifest: the shard's bytes over its rows; always one row group), or the whole shard when the
    stream reads all of it (:meth:`_ShardFiles.read_groups` then fetches it by one GET). At most
    ``ahead`` reads and ``budget`` estimated bytes are in flight (always one), so the next
    shard's ranged GETs and decoding (pyarrow, GIL released) overlap the consumer's work on the
    current batch. Each row group is handed out as a slice of the table read for it (zero-copy).
    Memory: the reads in flight plus the one being consumed.
    """

    def __init__(self, files: _ShardFiles, keys: Iterator[tuple[int, int]], columns, bounds_of,
                 ahead: int | None = None, threads: int | None = None, all_columns: bool = False,
                 chunk_bytes: int | None = None, budget: int | None = None) -> None:
        ahead = ROWGROUP_AHEAD if ahead is None else ahead
        threads = ROWGROUP_THREADS if threads is None else threads
        self._files, self._cols, self._bounds_of, self._ahead = files, columns, bounds_of, ahead
        self._chunk_bytes = CHUNK_BYTES if chunk_bytes is None else chunk_bytes
        self._budget = READAHEAD_BYTES if budget is None else budget
        self._all_columns = all_columns
        self._chunks = self._chunked(keys)
        self._pending: list[tuple[list[tuple[int, int]], bool, int]] = []  # planned, not submitted
        self._seen: set[int] = set()
        self._whole: set[int] = set()
        self._all_rows: set[int] = set()  # shards planned so far with no partial row group
        self._last_unit: int | None = None  # the shard of the read planned last
        self._plan_mu = threading.RLock()  # planning advances one generator: the prefetcher asks too
        self._plan_error: BaseException | None = None
        self._inflight: list[tuple[list[tuple[int, int]], bool, int, Any]] = []  # (keys, whole, bytes, future)
        self._ready: dict[tuple[int, int], Any] = {}
        self._pool = None
        if ahead:
            from concurrent.futures import ThreadPoolExecutor

            self._pool = ThreadPoolExecutor(max(1, min(threads, ahead)), thread_name_prefix="warp-rowgroups")

    def _estimate(self, unit: int, rows: int) -> int:
        s = self._files.shards[unit]
        total = sum(self._files.row_groups(unit)) or 1
        return max(1, (s.byte_size or 0) * rows // total)

    def _runs(self, keys: Iterator[tuple[int, int, int, int]]) -> Iterator[list[tuple[int, int, int, int]]]:
        """Consecutive keys of one shard."""
        run: list[tuple[int, int, int, int]] = []
        for k in keys:
            if run and k[0] != run[0][0]:
                yield run
                run = []
            run.append(k)
        if run:
            yield run

    def _chunked(self, keys: Iterator[tuple[int, int, int, int]]) -> Iterator[tuple[list[tuple[int, int]], Any, int]]:
        """(keys, how, estimated bytes) of each read, in stream order (planned lazily: a shard's
        row counts may need its footer). ``how``: True, the whole shard by one GET; False, whole
        row groups; ``(lo, hi)``, rows of one row group by pages (:meth:`_ShardFiles.read_rows`),
        when the stream needs only part of it."""
        for run in self._runs(keys):
            unit = run[0][0]
            b = self._bounds_of(unit)
            n_groups = len(b) - 1
            full = [lo == 0 and hi == b[g + 1] - b[g] for _, g, lo, hi in run]
            whole = (self._all_columns and len(run) == n_groups and all(full)
                     and sorted(g for _, g, _, _ in run) == list(range(n_groups))
                     and self._estimate(unit, b[-1]) <= WHOLE_SHARD_BYTES
                     and self._files.whole_candidate(unit))
            if whole:
                yield [k[:2] for k in run], True, self._estimate(unit, b[-1])
                continue
            chunk: list[tuple[int, int]] = []
            est = 0
            for (_, g, lo, hi), is_full in zip(run, full, strict=True):
                if not is_full:
                    if chunk:
                        yield chunk, False, est
                        chunk, est = [], 0
                    yield [(unit, g)], (lo, hi), self._estimate(unit, hi - lo)
                    continue
                e = self._estimate(unit, b[g + 1] - b[g])
                if chunk and est + e > self._chunk_bytes:
                    yield chunk, False, est
                    chunk, est = [], 0
                chunk.append((unit, g))
                est += e
            if chunk:
                yield chunk, False, est

    def needs_all(self, unit: int) -> bool:
        """Whether the stream reads every row of every row group of shard ``unit`` with every
        column (only such a shard is worth downloading whole into the cache ahead of the reader)."""
        return self._planned(unit, whole_run=True) and unit in self._all_rows and self._all_columns

    def _planned(self, unit: int, whole_run: bool = False) -> bool:
        """Plan until shard ``unit`` is seen (``whole_run``: and every read of its run, which ends
        where another shard's starts); False when planning fails (asked from the prefetcher's and
        opener's threads: the error is left to the consumer's)."""
        with self._plan_mu:
            try:
                while (unit not in self._seen or whole_run and self._last_unit == unit) and self._plan_next():
                    pass
            except Exception:
                return False
            return True

    def _plan_next(self) -> bool:
        with self._plan_mu:
            if self._plan_error is not None:  # planning failed (a footer that would not load): the
                raise self._plan_error         # consumer's thread gets the error, every time it plans
            try:
                c = next(self._chunks, None)
            except BaseException as e:
                self._plan_error = e
                raise
            if c is None:
                self._last_unit = None
                return False
            self._pending.append(c)
            unit = self._last_unit = c[0][0][0]
            if unit not in self._seen:
                self._seen.add(unit)
                self._all_rows.add(unit)
            if not isinstance(c[1], bool):  # part of a row group
                self._all_rows.discard(unit)
            if c[1] is True:
                self._whole.add(unit)
            return True

    def reads_whole(self, unit: int) -> bool:
        """Whether shard ``unit`` is read whole (by one GET, no footer request first)."""
        return self._planned(unit) and unit in self._whole

    def _load(self, chunk: list[tuple[int, int]], how: Any):
        """The table of a planned read and the first row of its first row group it starts at."""
        unit, g = chunk[0]
        if not isinstance(how, bool):
            tab = self._files.read_rows(unit, g, how[0], how[1], self._cols)
            if tab is not None:
                return tab, how[0]
            how = False
        return self._files.read_groups(unit, [g for _, g in chunk], self._cols, whole=how), 0

    def _fill(self) -> None:
        from concurrent.futures import Future

        while len(self._inflight) < max(1, self._ahead) and (self._pending or self._plan_next()):
            with self._plan_mu:
                c, how, est = self._pending[0]
                if self._inflight and sum(x[2] for x in self._inflight) + est > self._budget:
                    return
                self._pending.pop(0)
            if self._pool is not None:
                fut = self._pool.submit(self._load, c, how)
            else:
                fut = Future()
                fut.set_result(None)  # loaded when taken
            self._inflight.append((c, how, est, fut))

    def take(self, key: tuple[int, int]):
        """``(table, first row)``: the rows read for row group ``key`` from its ``first`` row on."""
        got = self._ready.pop(key, None)
        if got is not None:
            return got
        self._ready.clear()
        while True:
            self._fill()
            if not self._inflight:  # past the planned keys: read it alone
                return self._files.read_groups(key[0], [key[1]], self._cols), 0
            chunk, how, _est, fut = self._inflight.pop(0)
            if key not in chunk:  # the consumer skipped ahead: follow it
                fut.cancel()
                continue
            got = fut.result()
            tab, first = got if got is not None else self._load(chunk, how)
            self._fill()  # the next reads start before this table is handed out
            b = self._bounds_of(key[0])
            if not isinstance(how, bool) and tab.num_rows != b[key[1] + 1] - b[key[1]]:  # read by pages
                _check_rows(self._files, key[0], [key[1]], tab.num_rows, how[1] - how[0])
                return tab, first
            _check_rows(self._files, key[0], [g for _, g in chunk], tab.num_rows,
                        sum(b[g + 1] - b[g] for _, g in chunk))
            at = 0
            for _, g in chunk:
                n = b[g + 1] - b[g]
                self._ready[(key[0], g)] = (tab.slice(at, n), 0)
                at += n
            return self._ready.pop(key)

    def close(self) -> None:
        """Cancel the reads not started and wait for those in flight (each bounded by the request
        policy's deadline, docs/formats/registry.md): a closed stream sends nothing more to the store, and
        its request counts are final when close returns."""
        if self._pool is not None:
            for *_, fut in self._inflight:
                fut.cancel()
            self._pool.shutdown(wait=True, cancel_futures=True)
        self._inflight.clear()
        self._ready.clear()


def _check_rows(files: _ShardFiles, unit: int, groups: list[int], got: int, want: int) -> None:
    """Row groups read must hold the rows planned from the manifest's statistics."""
    if got != want:
        ds, s = files.ds, files.shards[unit]
        raise DataError(f"{ds.remote.url_of(ds.blob_key(s))}: row groups {groups} hold {got} rows, "
                        f"the manifest says {want}",
                        hint="the manifest's shard statistics are wrong; republish the dataset")


class _ShardOpener:
    """Opens the shards after the reader's position on background threads (footers only)."""

    def __init__(self, files: _ShardFiles, order: list[int], ahead: int = 3) -> None:
        from concurrent.futures import ThreadPoolExecutor

        self._files, self._order, self._ahead = files, order, ahead
        self._next = 1  # index in order of the next shard to open
        self.skip: Callable[[int], bool] = lambda unit: False  # shards never to open (read without footer)
        self._pool = ThreadPoolExecutor(ahead, thread_name_prefix="warp-open")

    def _open(self, unit: int) -> None:
        import contextlib

        with contextlib.suppress(Exception):  # the reader opens it again and reports the error itself
            if not self.skip(unit):  # asked here: planning a shard may need another's footer
                self._files.get(unit)

    def advance(self, pos: int) -> None:
        while self._next < len(self._order) and self._next <= pos + self._ahead:
            self._pool.submit(self._open, self._order[self._next])
            self._next += 1

    def close(self) -> None:
        """Cancel the footers not started; wait for those in flight (see _RowGroupBatcher.close)."""
        self._pool.shutdown(wait=True, cancel_futures=True)


def _bisect_right(a: list[int], x: int) -> int:
    import bisect

    return bisect.bisect_right(a, x)


def _one_batch(tab):
    """A table slice as exactly one RecordBatch (zero-copy when it is one chunk)."""
    batches = tab.to_batches()
    if len(batches) == 1:
        return batches
    if not batches:
        import pyarrow as pa

        return [pa.RecordBatch.from_pylist([], schema=tab.schema)]
    return tab.combine_chunks().to_batches()[:1] or batches
