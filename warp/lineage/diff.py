"""``warp diff``: what changed between two versions, at a cost in proportion to the change.

Contract (docs/lineage.md, "warp diff"):

* **Published versions** (``WS/NAME``, ``--from V1 --to V2``): per table, rows added, removed
  and changed by key (changed: the key is in both and any column differs). A Parquet shard
  whose hash is in both versions holds the same rows in both and is never read; only the
  shards of one version that the other lacks are fetched (one GET each). Without a key column
  (``--key``, else the first of ``key``, ``path``, ``id``, ``sample_id``, ``name`` in both
  schemas) rows are compared whole: added and removed only. A table in one version only counts
  all its rows from the manifest, reading nothing unless the keys are asked for. ``--key``
  without ``--table`` compares the one table that has the column (UsageError when several or
  none do).
* **Artifacts** of a published version: members added, removed and changed by content. A
  member whose tar shard (blob) is in both versions at the same offset and length is unchanged
  without a read; the others are read by ranged GETs and compared by SHA-256.
* **Two local artifacts of the same kind** (warehouse versions, feature caches, Zarr arrays):
  shards (or levels) added, removed and changed by the hashes their manifests record, and the
  samples of the per-sample side table (``samples.parquet`` + ``sources.parquet``,
  ``records.parquet``) by key; payloads are never read. The directories are the versions:
  ``--from``/``--to`` are refused, as is a second "directory" that is a dataset id.

The result counts what was read (blobs, bytes) and what was skipped, so the cost is visible.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from warpdata.artifacts import kinds
from warpdata.artifacts.manifests import read_manifest
from warpdata.core import sidetables
from warpdata.core.arrowmem import arrow_reader
from warpdata.core.errors import DataError, MissingInputError, UsageError
from warpdata.core.names import FEATURE_CACHE, MANIFEST_NAME, TENSOR_WAREHOUSE, ZARR_ARRAY
from warpdata.features import manifest as fmanifest
from warpdata.registry import chunks
from warpdata.registry.manifest import validate_dataset_id
from warpdata.registry.store import Store
from warpdata.registry.tarpack import ArtifactIndex
from warpdata.warehouse import manifest as wmanifest

# lazy third-party imports: pyarrow (heavy) is imported inside the functions that use it, so
# importing this module does not load it (the row comparisons)

__all__ = ["ArtifactDiff", "DiffRequest", "DiffResult", "TableDiff", "diff", "diff_local", "diff_published"]

KEY_COLUMNS = ("key", "path", "id", "sample_id", "name")


@dataclass
class DiffRequest:
    target: str  # WS/NAME, or a local artifact directory
    from_version: str | None = None
    to_version: str | None = None  # default: latest
    other: str | None = None  # the second local artifact
    table: str | None = None
    key: str | None = None
    rows: bool = False  # list the keys, not only count them
    store_url: str | None = None


@dataclass
class TableDiff:
    table: str
    key: str | None  # None: rows compared whole
    status: str  # same | changed | added | removed
    added: int = 0
    removed: int = 0
    changed: int = 0
    schema_changed: bool = False
    shards_read: int = 0
    shards_skipped: int = 0
    added_keys: list[Any] | None = None
    removed_keys: list[Any] | None = None
    changed_keys: list[Any] | None = None


@dataclass
class ArtifactDiff:
    artifact: str
    status: str
    added: int = 0
    removed: int = 0
    changed: int = 0
    members_read: int = 0
    added_members: list[str] | None = None
    removed_members: list[str] | None = None
    changed_members: list[str] | None = None


@dataclass
class DiffResult:
    target: str
    from_version: str
    to_version: str
    kind: str
    tables: list[TableDiff] = field(default_factory=list)
    artifacts: list[ArtifactDiff] = field(default_factory=list)
    blobs_read: int = 0
    bytes_read: int = 0
    bytes_total: int = 0  # what reading both versions whole would cost

    @property
    def same(self) -> bool:
        return all(t.status == "same" for t in self.tables) and all(a.status == "same" for a in self.artifacts)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["same"] = self.same
        return d

    def summary(self) -> str:
        """One line: ``+A -R ~C rows`` over the tables, and the artifacts' members."""
        rows = [sum(getattr(t, k) for t in self.tables) for k in ("added", "removed", "changed")]
        mem = [sum(getattr(a, k) for a in self.artifacts) for k in ("added", "removed", "changed")]
        parts = [f"rows +{rows[0]} -{rows[1]} ~{rows[2]}"] if self.tables else []
        if self.artifacts:
            parts.append(f"members +{mem[0]} -{mem[1]} ~{mem[2]}")
        return ", ".join(parts) or "nothing to compare"


def diff(req: DiffRequest) -> DiffResult:
    if req.other is not None:
        for given in (req.target, req.other):
            _refuse_published_as_dir(given, req)
        picked = [f"{flag} {v}" for flag, v in (("--from", req.from_version), ("--to", req.to_version)) if v]
        if picked:  # two directories are the two versions: a version flag would be silently ignored
            raise UsageError(f"{' and '.join(picked)}: versions are picked for a published dataset; "
                             f"{req.target} and {req.other} are themselves the two versions compared",
                             hint=f"drop {' and '.join(f.split()[0] for f in picked)} "
                                  f"(warp diff {req.target} {req.other}), or compare a published dataset's "
                                  "versions: warp diff WS/NAME --from V1 --to V2")
        return diff_local(Path(req.target), Path(req.other), req)
    p = Path(req.target)
    if p.exists():
        raise UsageError(f"{req.target} is a local artifact: give the other version to compare it with",
                         hint=f"warp diff {req.target} OTHER_DIR (or WS/NAME --from V1 for a published dataset)")
    if req.from_version is None:
        raise UsageError(f"warp diff {req.target}: --from V1 is required for a published dataset",
                         hint=f"list versions with 'warp ls {req.target} --versions'")
    return diff_published(req)


def _refuse_published_as_dir(given: str, req: DiffRequest) -> None:
    """UsageError when ``given`` (one of two directories) is no local path but reads as WS/NAME:
    a published dataset is compared with one of its own versions, by --from."""
    if Path(given).exists():
        return
    name = given.partition("@")[0]
    try:
        validate_dataset_id(name)
    except UsageError:
        return  # neither a directory nor a dataset id: the local comparison says what is missing
    raise UsageError(f"{given} is not a local directory; a published dataset is compared with one of its own "
                     "versions, given by --from (and --to), not with a directory",
                     hint=f"warp diff {name} --from V1 [--to V2] (list them with 'warp ls {name} --versions'); "
                          "two local artifacts: warp diff DIR DIR2", dataset=name)


# -- rows -------------------------------------------------------------------------------------

def _hashable(v: Any) -> Any:
    """A key value as a dict key: a list or struct value (unhashable) as its canonical JSON."""
    return json.dumps(v, sort_keys=True, default=repr) if isinstance(v, (list, dict)) else v


def _row_digests(table, key: str | None) -> tuple[dict[Any, str] | None, Counter]:
    """key -> row digest (with a key), or a multiset of row digests (without)."""
    rows = table.to_pylist()
    digests = [hashlib.sha256(json.dumps(r, sort_keys=True, default=repr).encode()).hexdigest() for r in rows]
    if key is None:
        return None, Counter(digests)
    keys = [_hashable(r[key]) for r in rows]
    by_key = dict(zip(keys, digests, strict=True))
    if len(by_key) != len(rows):
        dup = next(k for k, n in Counter(keys).items() if n > 1)
        raise UsageError(f"column {key!r} does not identify rows: {dup!r} appears {len(rows) - len(by_key) + 1}+ times",
                         hint=f"give a unique column with --key (without it the first of {', '.join(KEY_COLUMNS)} "
                              "is used; rows are compared whole only when a table has none of them)")
    return by_key, Counter()


def _compare_rows(a_tables: list, b_tables: list, key: str | None, td: TableDiff, rows: bool) -> None:
    import pyarrow as pa

    def concat(ts):
        ts = [t for t in ts if t.num_rows]
        if not ts:
            return None
        return pa.concat_tables(ts, promote_options="permissive") if len(ts) > 1 else ts[0]

    a, b = concat(a_tables), concat(b_tables)
    ka, ca = _row_digests(a, key) if a is not None else ({} if key else None, Counter())
    kb, cb = _row_digests(b, key) if b is not None else ({} if key else None, Counter())
    if key is not None:
        added = sorted((k for k in kb if k not in ka), key=repr)
        removed = sorted((k for k in ka if k not in kb), key=repr)
        changed = sorted((k for k in ka if k in kb and ka[k] != kb[k]), key=repr)
        td.added, td.removed, td.changed = len(added), len(removed), len(changed)
        if rows:
            td.added_keys, td.removed_keys, td.changed_keys = added, removed, changed
    else:
        td.added = sum((cb - ca).values())
        td.removed = sum((ca - cb).values())


def _pick_key(key: str | None, cols_a: list[str], cols_b: list[str], where: str) -> str | None:
    if key is not None:
        if key not in cols_a or key not in cols_b:
            raise UsageError(f"{where}: --key {key!r} is not a column of both versions",
                             hint=f"columns: {', '.join(sorted(set(cols_a) & set(cols_b)))}")
        return key
    return next((c for c in KEY_COLUMNS if c in cols_a and c in cols_b), None)


# -- published versions -----------------------------------------------------------------------------

class _Reader:
    """Reads blobs of one store, counting requests and bytes."""

    def __init__(self, store, chunked: dict | None = None) -> None:
        self.store = store
        self.chunked = chunked or {}  # shard hash -> ShardRef of shards stored as chunks
        self.blobs = 0
        self.bytes = 0

    def parquet(self, blob: str):
        import pyarrow.parquet as pq

        data = self.store.get_blob(blob)
        self.blobs += 1
        self.bytes += len(data)
        return pq.read_table(arrow_reader(data))

    def blob(self, blob: str) -> bytes:
        data = self.store.get_blob(blob)
        self.blobs += 1
        self.bytes += len(data)
        return data

    def member(self, blob: str, offset: int, length: int) -> bytes:
        ref = self.chunked.get(blob)
        data = self.store.read_range(blob, offset, length) if ref is None else \
            chunks.read_range(self.store, ref, offset, length)
        self.blobs += 1
        self.bytes += len(data)
        return data


def diff_published(req: DiffRequest) -> DiffResult:
    st = Store(req.store_url)
    name = req.target
    va = st.resolve_version(name, req.from_version)
    vb = st.resolve_version(name, req.to_version)
    ma, mb = st.get_manifest(name, va), st.get_manifest(name, vb)
    res = DiffResult(name, va, vb, "dataset")
    rd = _Reader(st, chunks.chunked_refs((ma, mb)))
    names = sorted(set(ma.tables) | set(mb.tables))
    if req.table is not None:
        if req.table not in names:
            raise MissingInputError(f"{name}: no table {req.table!r} in either version",
                                    hint=f"tables: {', '.join(names) or 'none'}")
        names = [req.table]
    elif req.key is not None:  # --key alone: the one table that has the column, as if named by --table
        names = [_table_of_key(name, req.key, ma, mb, names)]
    for tn in names:
        ta, tb = ma.tables.get(tn), mb.tables.get(tn)
        res.bytes_total += (ta.byte_size if ta else 0) + (tb.byte_size if tb else 0)
        res.tables.append(_diff_table(tn, ta, tb, req, rd))
    if req.table is None and req.key is None:
        for an in sorted(set(ma.artifacts) | set(mb.artifacts)):
            aa, ab = ma.artifacts.get(an), mb.artifacts.get(an)
            res.bytes_total += (aa.byte_size if aa else 0) + (ab.byte_size if ab else 0)
            res.artifacts.append(_diff_artifact(an, aa, ab, req, rd))
    res.blobs_read, res.bytes_read = rd.blobs, rd.bytes
    return res


def _table_of_key(name: str, key: str, ma, mb, names: list[str]) -> str:
    """The table ``--key`` names without ``--table``: the one whose columns hold ``key`` (in both
    versions, else in either); UsageError when none or several do."""
    if len(names) == 1:
        return names[0]  # the one table: _pick_key says what is wrong with the key, if anything

    def has(tn: str, test) -> bool:
        return test(key in t.columns for t in (ma.tables.get(tn), mb.tables.get(tn)) if t is not None)

    found = [tn for tn in names if has(tn, all)] or [tn for tn in names if has(tn, any)]
    if len(found) == 1:
        return found[0]
    if found:
        raise UsageError(f"{name}: --key {key!r} is a column of {len(found)} tables ({', '.join(found)}): "
                         "say which with --table", hint=f"e.g. --table {found[0]} --key {key}",
                         tables=found)

    def cols(tn: str) -> str:
        t = mb.tables.get(tn) or ma.tables.get(tn)
        shown = list(t.columns)[:8]
        return f"{tn} ({', '.join(shown)}{', ...' if len(t.columns) > 8 else ''})"

    raise UsageError(f"{name}: --key {key!r} is not a column of any table",
                     hint="tables and their columns: " + "; ".join(cols(tn) for tn in names))


def _diff_table(tn: str, ta, tb, req: DiffRequest, rd: _Reader) -> TableDiff:
    if ta is None or tb is None:
        present = ta or tb
        td = TableDiff(tn, None, "added" if ta is None else "removed")
        n = present.row_count
        if ta is None:
            td.added = n
        else:
            td.removed = n
        if req.rows:
            key = _pick_key(req.key, present.columns, present.columns, tn)
            td.key = key
            if key is not None:
                keys = sorted((k for s in present.shards for k in rd.parquet(s.hash).column(key).to_pylist()), key=repr)
                td.shards_read = len(present.shards)
                if ta is None:
                    td.added_keys = keys
                else:
                    td.removed_keys = keys
        return td
    key = _pick_key(req.key, ta.columns, tb.columns, tn)
    td = TableDiff(tn, key, "same", schema_changed=ta.schema != tb.schema)
    ha, hb = [s.hash for s in ta.shards], [s.hash for s in tb.shards]
    common = set(ha) & set(hb)
    only_a = list(dict.fromkeys(h for h in ha if h not in common))
    only_b = list(dict.fromkeys(h for h in hb if h not in common))
    td.shards_skipped = sum(h in common for h in ha) + sum(h in common for h in hb)
    if Counter(ha) != Counter(hb) or only_a or only_b:
        _compare_rows([rd.parquet(h) for h in only_a], [rd.parquet(h) for h in only_b], key, td, req.rows)
        td.shards_read = len(only_a) + len(only_b)
    if td.added or td.removed or td.changed or td.schema_changed:
        td.status = "changed"
    return td


def _diff_artifact(an: str, aa, ab, req: DiffRequest, rd: _Reader) -> ArtifactDiff:
    if aa is None or ab is None:
        present = aa or ab
        ad = ArtifactDiff(an, "added" if aa is None else "removed")
        n = present.member_count or 0
        if aa is None:
            ad.added = n
        else:
            ad.removed = n
        return ad
    ad = ArtifactDiff(an, "same")
    if aa.index is not None and ab.index is not None and aa.index.hash == ab.index.hash:
        return ad  # the same index lists the same shards, offsets and lengths: the same members
    if aa.index is None or ab.index is None:
        ad.status = "changed"
        return ad
    ia = ArtifactIndex.from_bytes(rd.blob(aa.index.hash), source=f"index of {an} (from)")
    ib = ArtifactIndex.from_bytes(rd.blob(ab.index.hash), source=f"index of {an} (to)")
    added = sorted(m for m in ib.members if m not in ia.members)
    removed = sorted(m for m in ia.members if m not in ib.members)
    changed = []
    for m in sorted(set(ia.members) & set(ib.members)):
        la, lb = ia.lookup(m), ib.lookup(m)
        if la == lb:
            continue  # same blob (content-addressed), same place: same bytes
        if la[2] != lb[2]:
            changed.append(m)
            continue
        ca, cb = rd.chunked.get(la[0]), rd.chunked.get(lb[0])
        if ca is not None and cb is not None and ca.member_count == cb.member_count == 1:
            # each is the one member of its tar shard, whose bytes follow from the member's name and
            # bytes (docs/formats/registry.md): two shard hashes, two contents, nothing to read
            changed.append(m)
            continue
        ad.members_read += 2
        if hashlib.sha256(rd.member(*la)).digest() != hashlib.sha256(rd.member(*lb)).digest():
            changed.append(m)
    ad.added, ad.removed, ad.changed = len(added), len(removed), len(changed)
    if req.rows:
        ad.added_members, ad.removed_members, ad.changed_members = added, removed, changed
    if added or removed or changed:
        ad.status = "changed"
    return ad


# -- local artifacts ----------------------------------------------------------------------------------

def _local(d: Path) -> dict[str, Any]:
    if not (d / MANIFEST_NAME).is_file():
        raise MissingInputError(f"{d}: no {MANIFEST_NAME}", hint="give two directories written by 'warp etl'")
    doc = read_manifest(d)
    kind = doc.get("kind")
    if kind == TENSOR_WAREHOUSE:
        return wmanifest.read(d)
    if kind == FEATURE_CACHE:
        return fmanifest.read(d)
    if kind == ZARR_ARRAY:
        return kinds.validate(doc, str(d / MANIFEST_NAME))
    raise UsageError(f"{d}: warp diff compares tensor warehouses, feature caches and Zarr arrays, not {kind!r}",
                     hint="publish the artifacts and diff the published versions (WS/NAME --from V1)")


def _members(doc: dict[str, Any]) -> dict[str, str]:
    """What a manifest records by hash: shard name -> SHA-256 (levels for a Zarr array)."""
    kind = doc["kind"]
    if kind == TENSOR_WAREHOUSE:
        return {s["relative_path"]: s["checksum_sha256"] for s in doc["shards"]}
    if kind == FEATURE_CACHE:
        return {s["path"]: s["sha256"] for s in doc["shards"]}
    return {f"level {i} ({lv['path'] or '/'})": lv.get("sha256") or "" for i, lv in enumerate(doc["levels"])}


def diff_local(a: Path, b: Path, req: DiffRequest) -> DiffResult:

    da, db = _local(a), _local(b)
    if da["kind"] != db["kind"]:
        raise UsageError(f"{a} is a {da['kind']} and {b} a {db['kind']}: only artifacts of one kind compare",
                         hint="give two versions of the same artifact")
    kind = da["kind"]
    ident = {TENSOR_WAREHOUSE: "version", FEATURE_CACHE: "fingerprint", ZARR_ARRAY: "recipe_key"}[kind]
    res = DiffResult(str(a), str(da.get(ident, a)), str(db.get(ident, b)), kind)
    ma, mb = _members(da), _members(db)
    ad = ArtifactDiff("shards" if kind != ZARR_ARRAY else "levels", "same")
    added = sorted(m for m in mb if m not in ma)
    removed = sorted(m for m in ma if m not in mb)
    changed = sorted(m for m in ma if m in mb and ma[m] != mb[m])
    ad.added, ad.removed, ad.changed = len(added), len(removed), len(changed)
    if req.rows:
        ad.added_members, ad.removed_members, ad.changed_members = added, removed, changed
    ad.status = "changed" if added or removed or changed else "same"
    res.artifacts.append(ad)
    side = {TENSOR_WAREHOUSE: "samples.parquet", FEATURE_CACHE: "records.parquet"}.get(kind)
    if side and (a / side).is_file() and (b / side).is_file():
        drop = ["sample", "record", "shard_id", "shard", "shard_index"]  # positions, not content
        ta, tb = _side_table(a / side, doc=da), _side_table(b / side, doc=db)
        ta = ta.drop_columns([c for c in drop if c in ta.column_names])
        tb = tb.drop_columns([c for c in drop if c in tb.column_names])
        if kind == TENSOR_WAREHOUSE:  # a sample changes when its source file does
            ta, tb = _with_source_hash(a, ta, da), _with_source_hash(b, tb, db)
        key = _pick_key(req.key, ta.column_names, tb.column_names, side)
        td = TableDiff(side.removesuffix(".parquet"), key, "same", schema_changed=ta.schema != tb.schema,
                       shards_read=2)
        _compare_rows([ta], [tb], key, td, req.rows)
        if td.added or td.removed or td.changed or td.schema_changed:
            td.status = "changed"
        res.tables.append(td)
    return res


def _side_table(path: Path, columns: list[str] | None = None, *, doc: dict[str, Any]):
    """A local side table read whole, first checked against the SHA-256 its manifest ``doc`` records
    in ``side_tables`` (docs/formats/twh1.md, "Manifest"; none in an older manifest); a damaged one
    is a DataError naming it, not a crash."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    where = str(path.parent / MANIFEST_NAME)
    want = sidetables.expected(doc, path.name, where, "rebuild the artifact with 'warp etl'")
    if want is not None:
        sidetables.check_file(path, path.name, want, where, "rebuild the artifact with 'warp etl'")
    try:
        return pq.read_table(path, columns=columns)
    except pa.ArrowException as e:
        raise DataError(f"{path}: not a readable Parquet file ({str(e).splitlines()[0]})",
                        hint="rebuild the artifact with 'warp etl'", path=str(path)) from None


def _with_source_hash(d: Path, t, doc: dict[str, Any]):

    src = d / "sources.parquet"
    if not src.is_file() or "key" not in t.column_names:
        return t
    import pyarrow as pa

    s = _side_table(src, ["key", "sha256"], doc=doc)
    sha = dict(zip(s.column("key").to_pylist(), s.column("sha256").to_pylist(), strict=True))
    return t.append_column("source_sha256", pa.array([sha.get(k) for k in t.column("key").to_pylist()], pa.string()))
