"""A published dataset's versions, oldest first, with dates and sizes (docs/lineage.md, "History").

The store keeps no parent links between versions: the history is every manifest stored under
``datasets/<ws>/<name>/versions/``, ordered by the ``created_at`` of its envelope (then by hash,
so equal stamps order the same everywhere). Costs one listing and one GET per version. Each
version's own bytes are those of the store objects no other version uses (what deleting it alone
would free); its shared bytes, those of the objects another version uses too.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Any

from warpdata.registry.store import Store

__all__ = ["VersionInfo", "versions"]


@dataclass(frozen=True)
class VersionInfo:
    version_hash: str
    created_at: str | None
    rows: int | None
    bytes: int | None
    tables: tuple[str, ...]
    artifacts: tuple[str, ...]
    latest: bool
    description: str | None = None
    has_card: bool = False
    # store objects (blobs, a chunked shard's chunks: docs/formats/registry.md, "Chunked shards"),
    # each counted once: those no other listed version uses, and those it shares with another
    own_bytes: int = 0
    shared_bytes: int = 0

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["tables"], d["artifacts"] = list(self.tables), list(self.artifacts)
        return d


def versions(store: Store, dataset_id: str) -> list[VersionInfo]:
    """Every stored version of ``dataset_id``, oldest first; :class:`DatasetNotFoundError` when none."""
    hashes = store.list_versions(dataset_id)
    ptr = store.read_latest(dataset_id)
    if not hashes and ptr is None:
        store.resolve_version(dataset_id)  # raises the store's own not-found error, with its hints
    if ptr is not None and ptr.version_hash not in hashes:
        hashes.append(ptr.version_hash)
    out = []
    stored: dict[str, dict[str, int]] = {}
    for h in hashes:
        m = store.get_manifest(dataset_id, h)
        stored[h] = {b.hash: b.byte_size for b in m.stored_blobs()}
        md = m.metadata
        created = md.get("created_at") if isinstance(md.get("created_at"), str) else None
        out.append(VersionInfo(h, created, m.stats.get("total_rows"), m.stats.get("total_bytes"),
                               tuple(sorted(m.tables)), tuple(sorted(m.artifacts)),
                               ptr is not None and ptr.version_hash == h,
                               md.get("description") if isinstance(md.get("description"), str) else None,
                               isinstance(md.get("card"), str)))
    users: dict[str, int] = {}
    for objs in stored.values():
        for b in objs:
            users[b] = users.get(b, 0) + 1
    out = [replace(v, own_bytes=sum(n for b, n in stored[v.version_hash].items() if users[b] == 1),
                   shared_bytes=sum(n for b, n in stored[v.version_hash].items() if users[b] > 1)) for v in out]
    return sorted(out, key=lambda v: (v.created_at or "", v.version_hash))
