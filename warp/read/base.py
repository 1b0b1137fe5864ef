"""What every opened dataset version shares: :class:`DatasetBase`.

A published version (:class:`~warpdata.read.dataset.Dataset`) and a dataset registered in place
(:class:`~warpdata.read.registered.RegisteredDataset`) both stand on this class: the facts
(:meth:`~DatasetBase.info`), the parts (tables, artifacts, the default table), and the table,
embedding and artifact names checked against the manifest. Each subclass says where its blobs
come from (the :class:`~warpdata.read.source.BlobSource` methods) and how a DataLoader worker
opens the same version again (:meth:`~DatasetBase.reopen`).

Opening a version reads its manifest and nothing else, and imports no reader of its parts: the
table reader (:mod:`warpdata.read.table`: partition plans, the batch reader, the SQL gate), the
artifact member reader (:mod:`warpdata.read.refs`, with the tar index) and the embedding index
(:mod:`warpdata.registry.embeddings`) are imported by :meth:`~DatasetBase.table`,
``artifact()`` (and a table's bound columns, ``Table.batch_dicts``) and :meth:`~DatasetBase.embeddings`
on first use. These are the read API's only warp imports inside functions, on purpose: they keep
``warpdata.dataset(...)`` and ``warp info`` at the open cost of issue 22 (with them at the top an open
imported 19 more modules and took about 40 % more CPU), and ``warp schema`` off the member reader and
its tar index (about 5 % of its CPU); pinned by tests/read/test_open_imports.py. None is a cycle: no
reader imports a dataset module.

The class sits below both, so
``read.dataset`` (whose :func:`~warpdata.read.dataset.dataset` finds a registered dataset
first) imports ``read.registered`` and neither imports the other back (CONTRIBUTING.md
"Floors").
"""

from __future__ import annotations

import abc
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from warpdata.core.errors import MissingInputError

if TYPE_CHECKING:
    from warpdata.read.table import Table
    from warpdata.registry.embeddings import EmbeddingIndex
    from warpdata.registry.manifest import Manifest
    from warpdata.storage.blobcache import BlobCache
    from warpdata.storage.remote import Remote

MODES = ("auto", "remote", "hybrid", "local")


class DatasetBase(abc.ABC):
    """One opened version of a dataset; subclasses set the attributes below in ``__init__``."""

    id: str
    version: str
    mode: str
    verify: str
    manifest: Manifest
    remote: Remote
    cache: BlobCache | None
    meta_cache: BlobCache | None
    offline_fallback: bool

    @abc.abstractmethod
    def reopen(self) -> tuple[Callable[..., DatasetBase], tuple[Any, ...]]:
        """``(function, args)``: picklable, ``function(*args)`` opens this same version again in
        another process (a DataLoader worker), without pickling anything opened here."""


    @property
    def stats(self):
        """Requests sent to the store and bytes received so far (:class:`~warpdata.storage.remote.RequestStats`)."""
        return self.remote.stats

    # -- facts -------------------------------------------------------------------
    def info(self) -> dict:
        """What the manifest says about this version, as JSON-able facts (no request beyond
        the two that opened the dataset): tables with rows, shards, bytes and column counts;
        artifacts; bindings; totals; and the publisher's metadata envelope."""
        m = self.manifest
        try:
            default = self.default_table
        except MissingInputError:
            default = None
        tables = []
        for name in self.tables:
            t = m.tables[name]
            fields = (t.schema or {}).get("fields")
            tables.append({"name": name, "rows": t.row_count, "shards": len(t.shards), "bytes": t.byte_size,
                           "columns": len(fields) if fields is not None else None, "default": name == default})
        artifacts = [{"name": a, "kind": m.artifacts[a].kind, "shards": len(m.artifacts[a].shards),
                      "members": m.artifacts[a].member_count, "bytes": m.artifacts[a].byte_size}
                     for a in self.artifacts]
        envelope = {k: v for k, v in m.metadata.items() if k in ("created_at", "warp_version", "description")}
        return {"dataset": self.id, "version": self.version, "store": self.remote.url,
                "format_version": m.content()["format_version"],
                "rows": m.stats.get("total_rows"), "bytes": m.stats.get("total_bytes"),
                "tables": tables, "artifacts": artifacts, "bindings": [b.to_dict() for b in m.bindings],
                **envelope}

    # -- parts -----------------------------------------------------------------
    @property
    def tables(self) -> list[str]:
        return sorted(self.manifest.tables)

    @property
    def artifacts(self) -> list[str]:
        return sorted(self.manifest.artifacts)

    @property
    def default_table(self) -> str:
        """The table a command reads when none is named.

        The only table; else ``main``; else the table the publisher declared
        (``metadata.default_table``: ``warp publish --from`` names a tensor
        warehouse's ``samples`` or a feature cache's ``records``). Otherwise
        there is no safe guess: :class:`MissingInputError` lists the tables.
        """
        names = self.tables
        if len(names) == 1:
            return names[0]
        if "main" in names:
            return "main"
        declared = self.manifest.metadata.get("default_table")
        if isinstance(declared, str) and declared in names:
            return declared
        if not names:
            raise MissingInputError(f"{self.id} has no tables (artifacts: {', '.join(self.artifacts) or 'none'})",
                                    hint=f"read its artifacts with dataset({self.id!r}).artifact(NAME)")
        raise MissingInputError(f"{self.id} has {len(names)} tables and none is called 'main': "
                                f"name one ({', '.join(names)})",
                                hint=f"pass --table NAME (CLI) or .table(NAME), e.g. {names[0]!r}")

    def table_name(self, name: str | None = None) -> str:
        """``name`` checked against the manifest (MissingInputError with the close match); without
        a name, :attr:`default_table`. What :meth:`table` opens, without reading anything."""
        if name is None:
            name = self.default_table
        if name not in self.manifest.tables:
            import difflib  # stdlib, the error path only

            close = difflib.get_close_matches(name, self.tables, n=1)
            raise MissingInputError(f"{self.id} has no table {name!r} (tables: {', '.join(self.tables) or 'none'})",
                                    hint=f"did you mean {close[0]!r}?" if close else "see 'warp inspect " + self.id + "'")
        return name

    def table(self, name: str | None = None) -> Table:
        """Table ``name``; without a name, :attr:`default_table`."""
        # a part's reader, on first use (module docstring)
        from warpdata.read.table import Table

        return Table(self, self.table_name(name))

    def artifact_name(self, name: str) -> str:
        """``name`` when the manifest has that artifact; MissingInputError listing them otherwise."""
        if name not in self.manifest.artifacts:
            raise MissingInputError(f"{self.id} has no artifact {name!r} (artifacts: {', '.join(self.artifacts) or 'none'})",
                                    hint=f"see 'warp inspect {self.id}'")
        return name

    def embeddings(self, name: str) -> EmbeddingIndex:
        """Cosine search (ANN when the version has an index) over embedding ``name`` (see :mod:`warpdata.registry.embeddings`)."""
        # a part's reader, on first use (module docstring)
        from warpdata.registry.embeddings import open_index

        return open_index(self, name)
