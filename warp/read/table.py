"""One table of a dataset version (:class:`Table`) and SQL filters over it (:class:`Query`).

A table reads its Parquet shards by ranged reads only: ``schema()`` and ``head(n)`` fetch
footers and the row groups they need; ``filter(sql)`` runs in DuckDB behind the SQL gate
(:mod:`warpdata.core.sqlgate`) with projection and predicate pushdown.
"""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

from warpdata.core.errors import MissingInputError, UsageError, missing_dependency
from warpdata.core.sqlgate import (
    QueryLimits,
    check_filter,
    check_query,
    connect,
    guarded,
    lock,
    where_sql,
)
from warpdata.partition.plan import ResumeState, ShardPlan
from warpdata.partition.split import mode_of
from warpdata.partition.world import (
    UNSET,
    ResumeMismatchError,
    parse_shard,
    renamed,
    resolve_world,
    split_policy,
)
from warpdata.read.batches import (
    DEFAULT_BATCH,
    BatchStream,
    _parse_shard,
    _prefetch_depth,
    _ShardFiles,
    _worker_info,
)
from warpdata.read.torch import TorchLoader
from warpdata.registry.parquet_stats import shard_stats
from warpdata.registry.predicate import Predicate

if TYPE_CHECKING:
    import pyarrow as pa
    from warpdata.read.source import BlobSource, WarmResult
    from warpdata.registry.manifest import ShardRef

# pyarrow, duckdb, pandas and polars are heavy: each is imported in the method that uses it, so
# opening a table and reading its schema from the manifest loads none of them
# (tests/read/test_open_imports.py)


#: rows :meth:`Table.to_pandas` / :meth:`Table.to_polars` load without ``allow_large=True``
MAX_IN_MEMORY_ROWS = 1_000_000


class Table:
    """A table of a dataset version: Parquet shards read by ranges."""

    def __init__(self, ds: BlobSource, name: str, columns: list[str] | None = None) -> None:
        self.ds = ds
        self.name = name
        self.meta = ds.manifest.tables[name]
        self.shards = list(self.meta.shards)
        self.columns = columns

    def __repr__(self) -> str:
        return f"Table({self.ds.id!r}, {self.name!r}, rows={self.num_rows})"

    @property
    def num_rows(self) -> int:
        return sum(self._row_counts())

    @property
    def bindings(self) -> dict:
        return self.ds.manifest.bindings_for(self.name)

    def _row_counts(self) -> list[int]:
        counts = [s.row_count for s in self.shards]
        if any(c is None for c in counts):
            files = _ShardFiles(self.ds, self.shards)
            counts = [c if c is not None else files.get(i).metadata.num_rows for i, c in enumerate(counts)]
        return counts  # type: ignore[return-value]

    # -- metadata --------------------------------------------------------------
    def schema(self) -> pa.Schema:
        """The Arrow schema: from the manifest (format 4, no request), else from the first
        shard's footer (a ranged read, no data)."""
        sch = self.full_schema()
        if self.columns:
            sch = __import__("pyarrow").schema([sch.field(c) for c in self.columns])
        return sch

    def full_schema(self) -> pa.Schema:
        """Every column's Arrow schema, ignoring :meth:`select` (see :meth:`schema`)."""
        sch = self.meta.arrow_schema(f"{self.ds.id}@{self.ds.version[:12]} table {self.name}")
        if sch is not None:
            return sch
        if not self.shards:
            raise MissingInputError(f"table {self.name} of {self.ds.id} has no shards")
        return _ShardFiles(self.ds, self.shards[:1]).get(0).schema_arrow

    @property
    def schema_source(self) -> str:
        """Where :meth:`schema` comes from: ``"manifest"`` (format 4) or ``"footer"`` (older)."""
        return "manifest" if (self.meta.schema or {}).get("arrow") is not None else "footer"

    def _check_columns(self, columns: Sequence[str] | None) -> list[str] | None:
        if columns is None:
            return self.columns
        cols = [c.strip() for c in (columns.split(",") if isinstance(columns, str) else columns) if c.strip()]
        names = self.visible_names()
        bad = [c for c in cols if c not in names]
        if bad:
            close = difflib.get_close_matches(bad[0], names, n=1)
            raise UsageError(f"table {self.name} of {self.ds.id} has no column {bad[0]!r} "
                             f"(columns: {', '.join(names)})", hint=f"did you mean {close[0]!r}?" if close else None)
        return cols

    def visible_names(self) -> list[str]:
        """The columns this table exposes: a :meth:`select` view's, else every column. Reads,
        filters and queries of a view see these and no others."""
        return list(self.columns) if self.columns else self.schema_names()

    def schema_names(self) -> list[str]:
        if self.meta.schema:
            return [f["name"] for f in self.meta.schema["fields"]]
        return list(self.full_schema().names)

    def select(self, columns: Sequence[str] | str) -> Table:
        return Table(self.ds, self.name, self._check_columns(columns))

    # -- reading ---------------------------------------------------------------
    def head(self, n: int = 5) -> pa.Table:
        """The first ``n`` rows, reading only the row groups that hold them."""
        import pyarrow as pa

        got = list(self.batches(batch_size=max(1, min(n, DEFAULT_BATCH)), limit=n, prefetch="off",
                                rank=0, world_size=1)) if n else []
        if not got:
            return self.schema().empty_table()
        return pa.Table.from_batches(got)

    def batches(self, batch_size: int = DEFAULT_BATCH, columns: Sequence[str] | None = None,
                shard: Any = UNSET, limit: int | None = None, prefetch: Any = "auto", *,
                rank: int | None = None, world_size: int | None = None, drop_last: bool | None = None,
                pad: bool | None = None, shuffle: bool | None = None, seed: int | None = None,
                epoch: int | None = None,
                resume: ResumeState | str | bytes | Sequence[ResumeState | str | bytes] | None = None,
                worker: tuple[int, int] | None = None, policy: Any = UNSET) -> BatchStream:
        """Arrow RecordBatches of ``batch_size`` rows for this rank and DataLoader worker.

        Partitioning is the one vocabulary of every warp loader (docs/partitioning.md):
        ``rank`` / ``world_size`` default to torch.distributed's, then RANK /
        WORLD_SIZE, else 0 / 1 (the whole table); pass ``rank=0, world_size=1``
        to read everything under torchrun. The library default (``drop_last=False,
        pad=False``) reads every row exactly once over all ranks; ranks may
        differ by one row and one batch. ``pad=True`` gives every rank as many
        rows by repeating rows from the start (``stream.plan.pad_rows`` of them,
        fewer than ``world_size``), as DDP's equal step counts need;
        ``drop_last=True`` yields only full batches, the same number per rank,
        skipping the tail. ``warp stream --shard`` is exact unless ``--pad``.
        ``resume``: a :class:`ResumeState` (or its JSON) from ``state_dict()``
        resumes that rank; the list of every rank's states resumes the rest of
        the epoch at any world size (each row still read once over both runs).
        The split settings then come from the states; any of ``seed``, ``epoch``,
        ``shuffle``, ``drop_last`` / ``pad`` given must match them (else
        :class:`~warpdata.partition.world.ResumeMismatchError`). ``shard=`` (``(rank,
        world)``, ``"r/w"``, ``"auto"``, None) and ``policy=`` (``"exact"``,
        ``"pad"``, ``"drop"``) are the deprecated names of these keywords.
        """
        where = "Table.batches"
        if shard is not UNSET:
            rank, world_size = renamed(where, "shard", shard, "rank= and world_size=", (rank, world_size),
                                       (None, None), lambda v: parse_shard(where, v))
        if policy is not UNSET:
            drop_last, pad = renamed(where, "policy", policy, "drop_last= / pad=", (drop_last, pad), (None, None),
                                     lambda v: split_policy(where, "policy", v))
        mode = mode_of(bool(drop_last), bool(pad), where)
        cols = self._check_columns(columns)
        if limit is not None and limit < 0:
            raise UsageError(f"limit must be >= 0, not {limit}")
        wid, nw = worker if worker is not None else _worker_info()
        counts = self._row_counts()
        if resume is not None:
            given = {"seed": seed, "epoch": epoch, "shuffle": shuffle,
                     "policy": None if drop_last is None and pad is None else mode}
            plan = self._resume_plan(counts, resume, rank, world_size, given)
        else:
            w = resolve_world(rank, world_size, worker=(wid, nw))
            plan = ShardPlan(counts, rank=w.rank, world=w.world_size, batch_size=batch_size, policy=mode,
                             seed=seed or 0, epoch=epoch or 0, shuffle=bool(shuffle))
        ids = plan.worker_batches(wid, nw) if plan.remaining() else []
        return BatchStream(self, plan, ids, cols, limit, _prefetch_depth(prefetch, self.ds.mode), num_workers=nw)

    def _resume_plan(self, counts: list[int], resume: Any, rank: int | None, world_size: int | None,
                     given: dict[str, Any]) -> ShardPlan:
        """The plan resuming from one rank's state, or from every rank's states at any world size.

        ``given``: the split settings the caller passed (None: not passed), which the states must have."""
        many = isinstance(resume, (list, tuple))
        states = [ResumeState.from_json(r) if isinstance(r, (str, bytes)) else
                  ResumeState.from_dict(r, "Table.batches resume") if isinstance(r, dict) else r
                  for r in (resume if many else [resume])]
        manifest, table = self.ds.version, self.name
        for st in states:
            for k, v in given.items():
                if v is not None and getattr(st, k) != v:
                    what = {"policy": "split mode"}.get(k, k)
                    raise ResumeMismatchError(
                        f"Table.batches: the resume state is for {what} {getattr(st, k)!r}, this call asks for {v!r}",
                        hint="resume with the seed, epoch, shuffle and drop_last / pad of the run that saved the "
                             "state (or leave them out: they come from the state)")
        one = states[0] if len(states) == 1 else None
        if one is not None and not one.elastic:
            if rank is None and world_size is None:
                return ShardPlan.resume(counts, one, manifest=manifest, table=table)
            w = resolve_world(rank, world_size, worker=(0, 1))
            if (w.rank, w.world_size) == (one.rank, one.world) or (one.world != 1 and not many):
                return ShardPlan.resume(counts, one, manifest=manifest, table=table, rank=w.rank,
                                        world=w.world_size)
        merged = ShardPlan.merge_states(counts, states, manifest=manifest, table=table)
        w = resolve_world(rank, world_size, worker=(0, 1))
        return ShardPlan.resume(counts, merged, manifest=manifest, table=table, rank=w.rank, world=w.world_size)

    def batch_dicts(self, batch_size: int = DEFAULT_BATCH, columns: Sequence[str] | None = None,
                    read_refs: bool = False, **kw: Any) -> Iterator[dict[str, list]]:
        """dict-of-lists batches; columns bound to an artifact hold typed refs.

        ``read_refs``: read every ref's bytes with its batch, in parallel (cached
        shards by pread, the rest by coalesced ranged GETs), so ``read_bytes()``
        and the decoders cost no request.
        """
        # the artifact member reader, on first use (read.base's docstring)
        from warpdata.read.refs import make_refs

        bound = {c: make_refs(self.ds, b, read_refs) for c, b in self.bindings.items()}
        for batch in self.batches(batch_size, columns, **kw):
            d = batch.to_pydict()
            for c, make in bound.items():
                if c in d:
                    d[c] = make(d[c])
            yield d

    def to_arrow(self, limit: int | None = None) -> pa.Table:
        import pyarrow as pa

        return pa.Table.from_batches(list(self.batches(limit=limit, rank=0, world_size=1)), schema=self.schema())

    # -- conveniences (opt-in, guarded: Arrow batches are the primary interface) -----------
    def _guard_size(self, what: str, limit: int | None, allow_large: bool) -> None:
        if limit is not None and limit < 0:
            raise UsageError(f"limit must be >= 0, not {limit}")
        rows = self.num_rows if limit is None else min(limit, self.num_rows)
        if rows > MAX_IN_MEMORY_ROWS and not allow_large:
            raise UsageError(
                f"{what} would load {rows:,} rows of {self.ds.id}/{self.name} into memory "
                f"(more than {MAX_IN_MEMORY_ROWS:,})",
                hint="pass allow_large=True to load them anyway, limit=N for the first N rows, "
                     "or stream them with .batches() / .rows()")

    def to_pandas(self, limit: int | None = None, allow_large: bool = False):
        """The table (or its first ``limit`` rows) as a pandas DataFrame.

        Refuses more than :data:`MAX_IN_MEMORY_ROWS` rows (a UsageError naming the count) unless
        ``allow_large=True``; the count comes from the manifest, so nothing is read first."""
        self._guard_size("to_pandas()", limit, allow_large)
        try:
            import pandas  # noqa: F401
        except ImportError:
            raise missing_dependency("Table.to_pandas()", "pandas", extra="pandas") from None
        return self.to_arrow(limit=limit).to_pandas()

    def to_polars(self, limit: int | None = None, allow_large: bool = False):
        """The table (or its first ``limit`` rows) as a polars DataFrame; same guard as
        :meth:`to_pandas`. Needs the optional ``polars`` package."""
        self._guard_size("to_polars()", limit, allow_large)
        try:
            import polars
        except ImportError:
            raise missing_dependency("Table.to_polars()", "polars", extra="polars") from None
        return polars.from_arrow(self.to_arrow(limit=limit))

    def rows(self, limit: int | None = None, columns: Sequence[str] | None = None,
             batch_size: int = 1024, read_refs: bool = False, **kw: Any) -> Iterator[dict[str, Any]]:
        """One dict per row, streamed batch by batch (never the whole table in memory);
        columns bound to an artifact hold typed refs, as in :meth:`batch_dicts`. The whole
        table unless ``rank=`` / ``world_size=`` ask for one rank's share (docs/partitioning.md)."""
        if not {"rank", "world_size", "shard"} & set(kw):
            kw.update(rank=0, world_size=1)
        for d in self.batch_dicts(batch_size, columns, read_refs=read_refs, limit=limit, **kw):
            names = list(d)
            for vals in zip(*(d[c] for c in names), strict=True):
                yield dict(zip(names, vals, strict=True))

    def query(self, sql: str, *, timeout: float | None = None) -> pa.Table:
        """Run a read-only DuckDB ``SELECT`` over this table, named by its table name
        (``"SELECT label, count(*) FROM main GROUP BY label"``); returns an Arrow table.

        The SQL is checked by :func:`warpdata.core.sqlgate.check_query` (one SELECT, no other
        table, file or table function, no extension, only pure, aggregate and window
        functions) and runs on a locked connection that holds this table and nothing else.
        DuckDB pushes the query's columns and filters down into the shard scan, so only the
        row groups and columns it needs are fetched. A :meth:`select` view exposes only its
        columns. The connection is bounded (docs/sql.md): ``timeout`` seconds (default
        ``WARP_SQL_TIMEOUT``, 300; 0 for none), ``WARP_SQL_MEMORY`` and ``WARP_SQL_THREADS``;
        going past a limit is a :class:`~warpdata.core.sqlgate.QueryLimitError`.
        """
        import duckdb

        limits = QueryLimits.from_env()
        if timeout is not None:
            if not timeout >= 0:
                raise UsageError(f"Table.query: timeout must be >= 0 seconds, not {timeout!r}",
                                 hint="0 runs without a time limit")
            limits = dataclasses.replace(limits, timeout_s=float(timeout))
        check_query(sql, self.name)
        dset = Query(self, "true", None)._arrow_dataset(None, picked=self.shards)
        con = connect(limits)
        try:
            if dset is None:
                dset = self.full_schema().empty_table()
            if self.columns:
                con.register("warp_all_columns", dset)
                cols = ", ".join(_quote_ident(c) for c in self.columns)
                con.execute(f"CREATE VIEW {_quote_ident(self.name)} AS SELECT {cols} FROM warp_all_columns")
            else:
                con.register(self.name, dset)
            lock(con)  # no file, network or extension access beyond the registered shards
            try:
                with guarded(con, f"query on {self.ds.id}/{self.name}", limits):
                    return con.sql(sql).to_arrow_table()
            except duckdb.Error as e:
                raise UsageError(f"query on {self.ds.id}/{self.name} failed: {e}",
                                 hint=f"the table is {self.name!r}, its columns "
                                      f"{', '.join(self.columns or self.schema_names())}") from None
        finally:
            con.close()

    def filter(self, expr: str) -> Query:
        """Rows matching SQL boolean ``expr`` (DuckDB dialect), with pushdown.

        ``expr`` is one expression over the table's columns: comparisons, AND/OR/NOT,
        IN, BETWEEN, LIKE, IS NULL, CASE, casts and pure functions
        (:data:`warpdata.core.sqlgate.ALLOWED_FUNCTIONS`); anything else (a second
        statement, a subquery, UNION, file-reading functions) is a UsageError.
        """
        return Query(self, expr, self.columns)

    def to_torch(self, batch_size: int = 1024, columns: Sequence[str] | None = None, *,
                 num_workers: int = 0, rank: int | None = None, world_size: int | None = None,
                 drop_last: bool | None = None, pad: bool | None = None, seed: int | None = None,
                 read_refs: bool = False, **kw: Any) -> TorchLoader:
        """A PyTorch DataLoader over this table (IterableDataset, one worker per run of batches).

        ``rank``, ``world_size``, ``drop_last``, ``pad``, ``seed`` and the rest
        of ``kw`` (``shuffle``, ``epoch``, ``resume``, ``prefetch``, ``limit``)
        are those of :meth:`batches`, resolved once here (torch.distributed,
        then RANK / WORLD_SIZE) and handed to the workers. The library default
        reads every row exactly once; ranks may then differ by one batch, so
        DDP training wants ``pad=True`` or ``drop_last=True`` (equal batch
        counts on every rank). ``read_refs``: columns bound to an artifact come
        as lists of the members' bytes, read with their batch in parallel
        (cached shards by pread, the rest by coalesced ranged GETs), instead of
        lists of member paths. ``shard=`` / ``policy=`` are deprecated names.
        """
        where = "Table.to_torch"
        if "shard" in kw:
            rank, world_size = renamed(where, "shard", kw.pop("shard"), "rank= and world_size=", (rank, world_size),
                                       (None, None), lambda v: parse_shard(where, v))
        if "policy" in kw:
            drop_last, pad = renamed(where, "policy", kw.pop("policy"), "drop_last= / pad=", (drop_last, pad),
                                     (None, None), lambda v: split_policy(where, "policy", v))
        res = kw.get("resume")
        first = (res[0] if len(res) == 1 else None) if isinstance(res, (list, tuple)) else res
        if isinstance(first, (str, bytes)):
            first = ResumeState.from_json(first)
        if first is not None and not first.elastic and rank is None and world_size is None:
            rw: tuple[int | None, int | None] = (None, None)  # one rank's state: that rank, that world
        else:
            w = resolve_world(rank, world_size, worker=(0, 1))
            rw = (w.rank, w.world_size)
        kw.update({k: v for k, v in (("drop_last", drop_last), ("pad", pad), ("seed", seed)) if v is not None})
        loader = TorchLoader(self, batch_size, self._check_columns(columns), num_workers, rw, kw)
        loader.read_refs = read_refs
        return loader

    def warm(self, shards: slice | None = None, max_bytes: int | str | None = None) -> WarmResult:
        return self.ds.warm(tables=[self.name], shards=shards, max_bytes=max_bytes, artifacts=False)


class Query:
    """A filtered view of a table, executed by DuckDB over the shard URLs."""

    def __init__(self, table: Table, expr: str, columns: list[str] | None) -> None:
        self.table, self.expr, self.columns = table, expr, columns

    def select(self, columns: Sequence[str] | str) -> Query:
        return Query(self.table, self.expr, self.table._check_columns(columns))

    def _picked(self, shard: Any) -> list[ShardRef]:
        """This rank's and DataLoader worker's shards (whole files, round-robin)."""
        rank, world = _parse_shard(shard)
        wid, nw = _worker_info()
        picked = [s for i, s in enumerate(self.table.shards) if i % world == rank]
        return [s for i, s in enumerate(picked) if i % nw == wid]

    def _pruned_reader(self, shard: Any, columns: list[str] | None):
        """A RecordBatchReader over the row groups the filter may match, or None if none can.

        Format-2 manifests record each shard's column min/max (and per row group):
        a shard or row group whose statistics rule the filter out is never opened,
        so it costs no request at all. The rest are opened with one exact footer
        read and read by row group with only the columns the query uses; DuckDB
        then applies the filter to those rows. ``columns``: the query's output
        columns (None: all; [] for ``count(*)``).
        """
        import pyarrow as pa

        ds = self.table.ds
        names = self.table.schema_names()
        pred = Predicate.parse(self.expr, names)
        plan: list[tuple[ShardRef, list[int] | None]] = []
        for s in self._picked(shard):
            st = s.stats or {}
            if pred is not None and not pred.may_match(st.get("columns"), s.row_count):
                continue
            rgs = None
            if pred is not None and "row_groups" in st:
                rgs = [g for g, rg in enumerate(st["row_groups"]) if pred.may_match(rg["columns"], rg["row_count"])]
                if not rgs:
                    continue
            plan.append((s, rgs))
        if not plan:
            return None
        if pred is None or pred.referenced is None or columns is None:
            needed = None
        else:
            wanted = set(columns) | pred.referenced
            needed = [n for n in names if n in wanted] or names[:1]  # count(*) of a constant filter: one column
        files = _ShardFiles(ds, [s for s, _ in plan])
        first = files.get(0).schema_arrow
        schema = first if needed is None else pa.schema([first.field(n) for n in needed])

        def row_groups(k: int, rgs: list[int] | None, pf) -> list[int]:
            if rgs is not None:
                return rgs
            md = pf.metadata  # no row-group stats in the manifest: the footer's, same rules
            st = shard_stats(md, max_row_groups=None) if pred is not None else None
            if st is None:
                return list(range(md.num_row_groups))
            return [g for g, rg in enumerate(st["row_groups"]) if pred.may_match(rg["columns"], rg["row_count"])]

        def gen() -> Iterator[pa.RecordBatch]:
            for k, (_s, rgs) in enumerate(plan):
                pf = files.get(k)
                todo = row_groups(k, rgs, pf)
                # up to 4 row groups per call: pyarrow coalesces their ranges and decodes in parallel
                for j in range(0, len(todo), 4):
                    tab = files.read_groups(k, todo[j:j + 4], needed)
                    yield from tab.select(schema.names).to_batches()

        return pa.RecordBatchReader.from_batches(schema, gen())

    def _arrow_dataset(self, shard: Any, picked: list[ShardRef] | None = None):
        """A pyarrow dataset over this rank's shards: cached copies locally, the rest by ranged reads.

        DuckDB scans it with projection and filter pushdown into pyarrow's
        scanner, which prunes row groups by their statistics, so only the
        matching row groups' column chunks are fetched.
        """
        import pyarrow.dataset as pads
        from pyarrow import fs as pafs

        ds = self.table.ds
        if picked is None:
            picked = self._picked(shard)
        local, remote = [], []
        for s in picked:
            p = ds.cached_path(s)
            if p is None and ds.mode == "local":
                raise MissingInputError(f"shard {s.hash[:12]} of {ds.id} is not in the cache (local mode)",
                                        hint=f"run 'warp warm {ds.id}' while online")
            if p is not None:
                local.append(p)
            else:
                remote.append(ds.remote.path(ds.blob_key(s)))
        schema = self.table.full_schema()
        parts = []
        if local:
            parts.append(pads.dataset(local, schema=schema, format="parquet", filesystem=pafs.LocalFileSystem()))
        if remote:
            fmt = pads.ParquetFileFormat(default_fragment_scan_options=pads.ParquetFragmentScanOptions(pre_buffer=True))
            parts.append(pads.dataset(remote, schema=schema, format=fmt, filesystem=ds.remote.fs))
        if not parts:
            return None
        return parts[0] if len(parts) == 1 else pads.dataset(parts)

    def sql(self, limit: int | None = None, what: str | None = None) -> str:
        check_filter(self.expr, self.table.visible_names())  # one expression over the view's columns, or UsageError
        cols = what or (", ".join(_quote_ident(c) for c in self.columns) if self.columns else "*")
        sql = f"SELECT {cols} FROM warp_table WHERE {where_sql(self.expr)}"
        if limit is not None:
            sql += f" LIMIT {int(limit)}"
        return sql

    def _run(self, sql: str, shard: Any, columns: list[str] | None = None):
        import duckdb

        # HTTP stores: always through our ranged reader (pyarrow's scanner would run our Python
        # file on its own threads; see batches._ShardFiles.read_groups)
        if any(s.stats is not None for s in self.table.shards) or getattr(self.table.ds.remote, "read_only", False):
            dset = self._pruned_reader(shard, columns)
        else:  # format-1 manifest: no statistics to prune with; pyarrow's scanner reads every footer
            dset = self._arrow_dataset(shard)
        if dset is None:
            return None, None
        con = connect()
        con.register("warp_table", dset)
        lock(con)  # no file, network or extension access beyond the registered shards
        try:
            with guarded(con, self._what()):
                return con, con.sql(sql)
        except duckdb.Error as e:
            con.close()
            raise self._failed(e) from None

    def _failed(self, e: Exception) -> UsageError:
        """DuckDB's error ``e`` running this filter, as the UsageError naming the columns."""
        return UsageError(f"filter {self.expr!r} on {self.table.ds.id}/{self.table.name}: {e}",
                          hint=f"write a DuckDB SQL boolean expression over the columns "
                               f"{', '.join(self.table.schema_names())}")

    def _what(self) -> str:
        short = self.expr if len(self.expr) <= 200 else self.expr[:197] + "..."
        return f"filter {short!r} on {self.table.ds.id}/{self.table.name}"

    def batches(self, batch_size: int = DEFAULT_BATCH, shard: Any = UNSET, limit: int | None = None, *,
                rank: int | None = None, world_size: int | None = None) -> Iterator[pa.RecordBatch]:
        """Matching rows as RecordBatches; with ``rank`` / ``world_size`` (docs/partitioning.md) each
        rank scans whole shard files round-robin (a filter's per-rank row counts are data dependent,
        so batch counts may differ). Without them, every matching row. ``shard=`` (``(rank, world)``,
        ``"r/w"``, ``"auto"``) is the deprecated name of these keywords. Each fetch runs under
        the time limit (docs/sql.md), not the whole stream, which goes at the reader's pace."""
        import duckdb

        where = "Query.batches"
        if shard is not UNSET:
            rank, world_size = renamed(where, "shard", shard, "rank= and world_size=", (rank, world_size),
                                       (None, None), lambda v: parse_shard(where, v))
            if shard == "auto":  # this process's rank and world (torch.distributed, then RANK/WORLD_SIZE)
                w = resolve_world()
                rank, world_size = w.rank, w.world_size
        if (rank is None) != (world_size is None):
            raise UsageError(f"{where}: give rank= and world_size= together",
                             hint="rank=0, world_size=1 reads every matching row")
        con, rel = self._run(self.sql(limit), None if rank is None else (rank, world_size), self.columns)
        if rel is None:
            return
        limits = QueryLimits.from_env()
        try:
            try:
                # a relation streams (DuckDB 2.x: to_arrow_reader; 1.x: fetch_arrow_reader)
                with guarded(con, self._what(), limits):
                    reader = iter(rel.to_arrow_reader(batch_size) if hasattr(rel, "to_arrow_reader")
                                  else rel.fetch_arrow_reader(batch_size))
                while True:
                    with guarded(con, self._what(), limits):
                        b = next(reader, None)
                    if b is None:
                        break
                    if b.num_rows:
                        yield b
            except duckdb.Error as e:
                raise self._failed(e) from None
        finally:
            con.close()

    def to_arrow(self, limit: int | None = None) -> pa.Table:
        import pyarrow as pa

        got = list(self.batches(limit=limit))
        if not got:
            sch = self.table.schema()
            if self.columns:
                sch = pa.schema([sch.field(c) for c in self.columns])
            return sch.empty_table()
        return pa.Table.from_batches(got)

    def count(self) -> int:
        con, rel = self._run(self.sql(what="count(*)"), None, [])
        if rel is None:
            return 0
        try:
            with guarded(con, self._what()):
                return int(rel.fetchall()[0][0])
        finally:
            con.close()


def _quote_ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'
