"""``warp publish --from PATH``: turn anything a warp command wrote into dataset parts.

Commands hand work to each other only through manifests on disk
(:mod:`warpdata.artifacts.manifests`). This module reads them *generically*, so a new
producer publishes without changes here:

* a directory holding ``manifest.json`` with a ``"kind"`` (tensor warehouse,
  Zarr array, feature cache, ...): every regular file under it, the manifest
  included, becomes a member of one tar-shard artifact named after the kind;
* a ``.tbl`` file (magic ``TBL\\x02``) or any single file with a JSON
  ``"kind"``: that file alone becomes the artifact's one member.

Beside the artifact come tables:

* ``files``: one row per member (``path``, ``byte_size``) whose ``path``
  column is bound to the artifact as ``file`` refs, so readers can list and
  open members through the normal table API;
* one table per top-level ``*.parquet`` file of an artifact directory, named
  after its stem (a tensor warehouse gives ``samples``, ``sources``,
  ``summary``, ``reasons``, ``quarantine``; a feature cache ``records``), so
  ``warp stream ws/name --table samples --filter ...`` queries them remotely.

When the version has no ``main`` table, ``metadata.default_table`` names the
per-sample table (``samples``, else ``records``) that readers use when no
table is named (:attr:`warpdata.read.dataset.Dataset.default_table`).

A table name already taken (by ``--table`` or an earlier ``--from``) gets the
artifact name as prefix (``<artifact>_files``). ``metadata.sources`` records each source's kind and the
scalar identity fields of its manifest (``version``, ``version_key``...),
never its local path (invariant I1).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from warpdata.artifacts.manifests import MANIFEST_NAME, read_manifest
from warpdata.core import sidetables
from warpdata.core.errors import DataError, MissingInputError
from warpdata.core.jsondoc import load_json
from warpdata.registry.manifest import NAME_RE
from warpdata.registry.tarpack import list_members

# lazy third-party imports: pyarrow (heavy) is imported by write_listing alone

__all__ = ["FromSource", "check_symlinks", "describe_source"]

TBL_MAGIC = b"TBL\x02"
# per-sample tables written beside a manifest, in order of preference as the dataset's default table
PRIMARY_TABLES = ("samples", "records")
_IDENTITY_KEYS = ("version", "version_key", "version_hash", "format", "format_version", "recipe_hash",
                  "samples", "num_samples", "count", "shape", "dtype")


@dataclass
class FromSource:
    """What one ``--from PATH`` contributes: an artifact root and its member list."""

    kind: str
    artifact_root: str
    members: list[str]  # relative to artifact_root
    source_facts: dict[str, Any] = field(default_factory=dict)
    tables: dict[str, str] = field(default_factory=dict)  # table name (file stem) -> top-level .parquet path


def _identity(doc: dict[str, Any]) -> dict[str, Any]:
    facts = {"kind": doc.get("kind")}
    for k in _IDENTITY_KEYS:
        v = doc.get(k)
        if isinstance(v, (str, int, float, bool)) or (isinstance(v, list) and all(isinstance(x, int) for x in v)):
            facts[k] = v
    return facts


def check_symlinks(root: str | os.PathLike, *, follow_symlinks: bool = False, dir_links_skipped: bool = False) -> int:
    """Refuse symlinks under ``root`` that lead out of it (or nowhere); returns how many links were seen.

    Members are read through symlinks (``docs/formats/registry.md``), so a link
    to ``/etc/passwd`` or ``~/.ssh`` would publish that file. Unless
    ``follow_symlinks`` is set, such a link raises :class:`DataError` naming it.
    Links that stay inside ``root`` are fine. Only symlinks are resolved: the
    walk reads directory entry types, no per-file stat. ``dir_links_skipped``:
    the caller leaves directory links out (``warp publish --artifact``), so only
    file links are checked.
    """
    base = os.path.realpath(root)
    prefix = base.rstrip("/") + "/"
    links = 0
    stack = [os.fspath(root)]
    while stack:
        d = stack.pop()
        with os.scandir(d) as it:
            for e in it:
                if e.is_symlink():
                    links += 1
                    if follow_symlinks or (dir_links_skipped and e.is_dir()):
                        continue
                    real = os.path.realpath(e.path)
                    if real != base and not real.startswith(prefix):
                        raise DataError(f"{e.path} is a symlink to {real}, outside {root}: publishing it would "
                                        "copy a file from elsewhere", path=e.path,
                                        hint="copy the file into the folder, remove the link, or pass "
                                             "follow_symlinks=True (warp publish --follow-symlinks) if it is meant")
                    if not os.path.exists(e.path):
                        raise DataError(f"{e.path} is a broken symlink", path=e.path, hint="remove or fix the link")
                elif e.is_dir(follow_symlinks=False):
                    stack.append(e.path)
    return links


def describe_source(path: str | os.PathLike, *, follow_symlinks: bool = False) -> FromSource:
    """Recognise ``path`` and say which files to publish (see :func:`check_symlinks`)."""
    p = Path(path)
    if not p.exists():
        raise MissingInputError(f"{p} does not exist", hint="--from takes a directory or file written by a warp command")
    if p.is_dir():
        if not (p / MANIFEST_NAME).is_file():
            raise MissingInputError(f"{p} has no {MANIFEST_NAME}: not an artifact written by warp",
                                    hint="point --from at a tensor warehouse, Zarr array or feature cache directory, "
                                         "or use --artifact NAME=DIR for a plain directory")
        doc = read_manifest(p)
        kind = str(doc["kind"])
        check_symlinks(p, follow_symlinks=follow_symlinks)
        # side tables recorded by SHA-256 in the manifest (docs/formats/twh1.md, "Manifest") become
        # tables of the dataset: an edited one is refused here, not published
        sidetables.check_all(p, doc, str(p / MANIFEST_NAME), "rebuild the artifact with the command that wrote it "
                             "('warp etl'), then publish it again")

        # metrics.json records how a build ran (timings, a timestamp), not what it holds: publishing it
        # would make every identical rebuild a new version (docs/formats/registry.md)
        members = [m[0] for m in list_members(p) if m[0] != "metrics.json"]
        tables = {}
        for m in sorted(members):
            if "/" not in m and m.endswith(".parquet") and m != "files.parquet":
                tables[table_name(m[: -len(".parquet")])] = str(p / m)
        return FromSource(kind, str(p), members, _identity(doc), tables)
    with open(p, "rb") as f:
        head = f.read(4096)
    if head[:4] == TBL_MAGIC:
        return FromSource("tbl", str(p.parent), [p.name], {"kind": "tbl", "file_size": p.stat().st_size})
    if head.lstrip().startswith(b"{"):
        try:
            doc = load_json(p.read_bytes(), str(p))
        except (UnicodeDecodeError, json.JSONDecodeError):
            doc = None
        if isinstance(doc, dict) and "kind" in doc:
            return FromSource(str(doc["kind"]), str(p.parent), [p.name], _identity(doc))
    raise DataError(f"{p}: not a warp artifact (no TBL magic, no manifest 'kind')",
                    hint="--from understands .tbl files and directories with a manifest.json; "
                         "use --table/--artifact for other data")


def table_name(stem: str) -> str:
    """A manifest-safe table name for a file stem."""
    name = "".join(c if c.isalnum() or c in "_.-" else "_" for c in stem) or "table"
    return name if NAME_RE.match(name) else "t_" + name


def artifact_name(kind: str, taken: set[str]) -> str:
    """A manifest-safe artifact name for ``kind`` not in ``taken``."""
    base = "".join(c if c.isalnum() or c in "_.-" else "_" for c in kind) or "artifact"
    if not NAME_RE.match(base):
        base = "a_" + base
    name, n = base, 2
    while name in taken:
        name, n = f"{base}-{n}", n + 1
    return name


def write_listing(members: list[tuple[str, int]], out_path: str | os.PathLike) -> None:
    """The ``files`` table as one deterministic Parquet file."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.table({"path": pa.array([m[0] for m in members], pa.string()),
                      "byte_size": pa.array([m[1] for m in members], pa.int64())})
    pq.write_table(table, out_path, compression="zstd", write_statistics=True)
