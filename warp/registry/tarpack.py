"""Deterministic tar shards of a directory, and their member index.

Spec: ``docs/formats/registry.md``. Contract:

* Members are the regular files under the source directory (symlinks to
  files are read through; empty directories are dropped), named by their
  POSIX path relative to it in Unicode NFC (:func:`nfc_members`: macOS and
  some tools give NFD), in bytewise UTF-8 order of that name. Two files whose
  names are equal in NFC cannot both be members (a DataError names them).
  :meth:`ArtifactIndex.lookup` normalises the name asked for the same way, so
  ``café`` typed in either form finds the member.
* Each member is one POSIX.1-2001 (pax) tar entry with fixed metadata:
  mtime 0, uid/gid 0, empty uname/gname, mode 0644, so the same files give
  byte-identical shards on any machine. A shard ends with two zero blocks.
* A new shard starts when adding the next member would pass
  ``target_size`` (a member larger than the target gets a shard of its own),
  and every member of at least ``alone_size`` gets a shard of
  its own (default 256 KiB). Shards are content-addressed, so a rebuilt artifact in which one
  large member changed re-uploads that member's shard (plus the shard of the
  small members around it, and the index), not the whole artifact; an
  identical rebuild gives identical shards and uploads nothing.
* Shards are named by the SHA-256 of their bytes (computed while writing).
* The index blob (format ``warp-tar-index-1``) is canonical JSON::

      {"format": "warp-tar-index-1",
       "shards": ["<sha256 of shard 0>", ...],
       "members": {"<member path>": [shard_number, data_offset, length], ...}}

  ``data_offset`` is where the member's bytes start inside its shard, so a
  reader fetches exactly ``[offset, offset + length)`` with one ranged GET.
"""

from __future__ import annotations

import functools
import hashlib
import io
import os
import tarfile
import unicodedata
from array import array
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from warpdata.core.atomic import TMP_PREFIX
from warpdata.core.canonical import canonical_json
from warpdata.core.errors import DataError, ManifestCorruptedError, MissingInputError
from warpdata.core.jsondoc import load_json
from warpdata.registry.manifest import HASH_RE, INDEX_FORMAT

__all__ = ["ArtifactIndex", "MemberScan", "PackResult", "PackedShard", "list_members", "member_name", "nfc_members",
           "pack_files", "scan_members"]

BLOCK = 512
DEFAULT_TARGET_SIZE = 256 << 20
# members this large get a tar shard of their own (docs/formats/registry.md): a changed member then
# re-uploads itself only; smaller ones (labels, tables, thumbnails) share shards to keep objects few
DEFAULT_ALONE_SIZE = 256 << 10


@dataclass(frozen=True)
class PackedShard:
    path: str  # local staging file
    hash: str
    byte_size: int
    member_count: int


@dataclass(frozen=True)
class PackResult:
    shards: list[PackedShard]
    index: bytes
    index_hash: str
    member_count: int
    payload_bytes: int


@dataclass(frozen=True)
class MemberScan:
    """What one walk of an artifact directory found.

    ``members``: ``(member name, local path, size)`` in member order.
    ``fingerprint``: SHA-256 hex over the root, every member name and its
    (size, mtime_ns, ctime_ns, inode), in member order: equal fingerprints mean
    no file was added, removed, renamed or written (a write moves ctime even
    when the size and mtime are kept). ``newest_change_ns``: the latest ctime
    seen (inode change time: every write moves it, and unlike mtime it cannot be
    set back), so a caller can tell whether a file changed so recently
    that a later write could leave the same timestamps (see ``publish``).
    """

    members: list[tuple[str, str, int]]
    fingerprint: str
    newest_change_ns: int
    skipped_dir_links: tuple[str, ...] = ()  # symlinks to directories left out (follow_symlinks=False)


def scan_members(root: str | os.PathLike, files: Iterable[str] | None = None, *,
                 follow_symlinks: bool = False) -> MemberScan:
    """Walk ``root`` once (one ``stat`` per file): the members to pack and their fingerprint.

    ``files`` restricts packing to these paths relative to ``root`` (used when
    a warp manifest lists its files); otherwise every regular file is packed.
    Symlinks to files are read through; symlinks to directories are left out
    (and named in ``skipped_dir_links``) unless ``follow_symlinks``, which
    walks them as if they were directories (a cycle is a DataError).
    """
    base = Path(root)
    if not base.is_dir():
        raise MissingInputError(f"{base} is not a directory", hint="--artifact NAME=DIR needs a directory of files")
    # (name, path, size, mtime_ns, ctime_ns, inode); plain strings and tuples, not pathlib or
    # dicts: this walk is most of an unchanged re-publish
    rows: list[tuple[str, str, int, int, int, int]] = []
    skipped: list[str] = []
    if files is not None:
        for rel in files:
            name = Path(rel).as_posix()
            if name.startswith("/") or ".." in name.split("/"):
                raise DataError(f"{base}: member {rel!r} is not a path inside the directory",
                                hint="list files relative to the artifact directory")
            p = base / name
            if not p.is_file():
                raise MissingInputError(f"{p} is listed but missing", hint="rebuild the artifact that lists it")
            st = p.stat()
            rows.append((name, str(p), st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino))
    else:
        stack = [(str(base), "")]
        stat = os.stat
        ancestors: dict[str, tuple[tuple[int, int], ...]] = {"": ()}  # followed walks only
        while stack:
            d, rel = stack.pop()
            # stat names relative to an open directory fd (fstatat): no resolution of the whole
            # path per file, and no DirEntry stat cache to fill (~15 % of the walk)
            fd = os.open(d, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
            try:
                if follow_symlinks:
                    dst = os.fstat(fd)
                    ident = (dst.st_dev, dst.st_ino)
                    if ident in ancestors[rel]:
                        raise DataError(f"{base}: following symlinks loops at {rel.rstrip('/')!r}",
                                        hint="remove the symlink cycle, or publish without --follow-symlinks")
                    chain = (*ancestors.pop(rel), ident)
                here: list[str] = []
                with os.scandir(fd) as it:
                    for e in it:
                        n = e.name
                        if n.startswith(TMP_PREFIX):
                            continue  # leftovers of a killed writer are not content
                        if e.is_dir(follow_symlinks=False):
                            stack.append((f"{d}/{n}", f"{rel}{n}/"))
                        elif e.is_file():
                            here.append(n)
                        elif e.is_symlink() and e.is_dir():
                            if follow_symlinks:
                                stack.append((f"{d}/{n}", f"{rel}{n}/"))
                            else:
                                skipped.append(rel + n)
                        if follow_symlinks and stack and stack[-1][1] == f"{rel}{n}/":
                            ancestors[f"{rel}{n}/"] = chain
                for n in here:
                    st = stat(n, dir_fd=fd)
                    rows.append((rel + n, f"{d}/{n}", st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino))
            finally:
                os.close(fd)
    # member order is bytewise UTF-8 order; for ASCII (and any valid UTF-8) names that is
    # plain str order, which sorts without a key function
    rows.sort()
    names = "\0".join([r[0] for r in rows])
    if not names.isascii():
        rows.sort(key=lambda r: r[0].encode("utf-8", "surrogateescape"))
        names = "\0".join([r[0] for r in rows])
    if files is not None:  # a walk cannot meet a name twice; a list can
        for a, b in zip(rows, rows[1:], strict=False):
            if a[0] == b[0]:
                raise DataError(f"{base}: member {a[0]!r} listed twice", hint="list each file once")
    times = array("q", [t for r in rows for t in (r[3], r[4])])
    h = hashlib.sha256(f"warp-member-scan-1\0{os.path.abspath(base)}\0{len(rows)}\0".encode(
        "utf-8", "surrogateescape"))
    h.update(names.encode("utf-8", "surrogateescape"))
    h.update(array("Q", [v for r in rows for v in (r[2], r[5])]))
    h.update(times)
    return MemberScan([r[:3] for r in rows], h.hexdigest(), max(times[1::2], default=0),
                      tuple(sorted(skipped)))


def list_members(root: str | os.PathLike, files: Iterable[str] | None = None) -> list[tuple[str, str, int]]:
    """``(member name, local path, size)`` for every file to pack, in member order (see :func:`scan_members`)."""
    return scan_members(root, files).members


def _header(name: str, size: int) -> bytes:
    ti = tarfile.TarInfo(name)
    ti.size = size
    ti.mtime = 0
    ti.mode = 0o644
    ti.uid = ti.gid = 0
    ti.uname = ti.gname = ""
    ti.type = tarfile.REGTYPE
    return ti.tobuf(tarfile.PAX_FORMAT, "utf-8", "surrogateescape")


class _ShardWriter:
    def __init__(self, out_dir: Path, number: int) -> None:
        self.tmp = out_dir / f"{TMP_PREFIX}shard-{number:05d}.tar"
        self.f = open(self.tmp, "wb")  # noqa: SIM115 - closed in finish()
        self.h = hashlib.sha256()
        self.offset = 0
        self.count = 0

    def write(self, data: bytes | memoryview) -> None:
        self.f.write(data)
        self.h.update(data)
        self.offset += len(data)

    def finish(self, out_dir: Path) -> PackedShard:
        self.write(b"\0" * (2 * BLOCK))
        self.f.close()
        digest = self.h.hexdigest()
        final = out_dir / f"{digest}.tar"
        os.replace(self.tmp, final)
        return PackedShard(str(final), digest, self.offset, self.count)


def member_name(name: str) -> str:
    """The form member names are published and looked up in: Unicode NFC (docs/formats/registry.md)."""
    return unicodedata.normalize("NFC", name)


def nfc_members(members: Sequence[tuple[str, str, int]]) -> list[tuple[str, str, int]]:
    """``members`` named in NFC, in bytewise order of that name; two names equal in NFC are a DataError."""
    seen: dict[str, tuple[str, str]] = {}
    out = []
    for name, path, size in members:
        n = member_name(name)
        if n in seen:
            raise DataError(f"{seen[n][1]} and {path}: the member names {seen[n][0]!r} and {name!r} are the same "
                            "name in Unicode NFC, so a reader could not tell them apart",
                            hint="rename one of the two files", first=seen[n][1], second=path)
        seen[n] = (name, path)
        out.append((n, path, size))
    if any(n != name for (n, _, _), (name, _, _) in zip(out, members, strict=True)):
        out.sort(key=lambda m: m[0].encode("utf-8", "surrogateescape"))
    return out


def pack_files(members: Sequence[tuple[str, str, int]], out_dir: str | os.PathLike,
               target_size: int = DEFAULT_TARGET_SIZE, alone_size: int = DEFAULT_ALONE_SIZE) -> PackResult:
    """Write ``members`` (from :func:`list_members`) as tar shards into ``out_dir``, named in NFC."""
    members = nfc_members(members)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    shards: list[PackedShard] = []
    index: dict[str, list[int]] = {}
    w: _ShardWriter | None = None
    buf = bytearray(1 << 20)
    view = memoryview(buf)
    payload = 0
    for name, path, _size in members:
        with open(path, "rb", buffering=0) as src:
            size = os.fstat(src.fileno()).st_size
            header = _header(name, size)
            entry = len(header) + size + (-size % BLOCK)
            alone = size >= alone_size
            if w is not None and w.count and (alone or w.offset + entry + 2 * BLOCK > target_size):
                shards.append(w.finish(out))
                w = None
            if w is None:
                w = _ShardWriter(out, len(shards))
            w.write(header)
            start = w.offset
            while n := src.readinto(buf):
                w.write(view[:n])
            if w.offset - start != size:
                raise DataError(f"{path} changed size while being packed ({size} -> {w.offset - start} bytes)",
                                hint="do not modify the directory while publishing it")
            w.write(b"\0" * (-size % BLOCK))
            w.count += 1
            index[name] = [len(shards), start, size]
            payload += size
            if alone:
                shards.append(w.finish(out))
                w = None
    if w is not None:
        shards.append(w.finish(out))
    doc = {"format": INDEX_FORMAT, "shards": [s.hash for s in shards], "members": index}
    data = canonical_json(doc)
    return PackResult(shards, data, hashlib.sha256(data).hexdigest(), len(index), payload)


@dataclass(frozen=True)
class ArtifactIndex:
    """A parsed member index: ``lookup(member) -> (shard_hash, offset, length)``."""

    shards: tuple[str, ...]
    members: dict[str, tuple[int, int, int]]

    @classmethod
    def from_bytes(cls, data: bytes, source: str = "index") -> ArtifactIndex:
        try:
            doc = load_json(data, source)
            if doc.get("format") != INDEX_FORMAT:
                raise ValueError(f"format is {doc.get('format')!r}, expected {INDEX_FORMAT!r}")
            shards = tuple(doc["shards"])
            if not all(isinstance(s, str) and HASH_RE.match(s) for s in shards):
                raise ValueError("shard hashes are not SHA-256 hex")
            members = {}
            for k, v in doc["members"].items():
                si, off, ln = (int(x) for x in v)
                if not (0 <= si < len(shards)) or off < 0 or ln < 0:
                    raise ValueError(f"member {k!r} has an out-of-range entry {v}")
                members[k] = (si, off, ln)
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise ManifestCorruptedError(f"{source}: not a valid {INDEX_FORMAT} member index: {e}",
                                         hint="run 'warp cache gc' and retry; republish if the stored index is bad") from None
        return cls(shards, members)

    def lookup(self, member: str) -> tuple[str, int, int]:
        """Where ``member`` is; the name in any Unicode normalization (NFC, as published, or NFD)."""
        hit = self.members.get(member)
        if hit is None and isinstance(member, str):
            key = member_name(member)
            hit = self.members.get(key)
            if hit is None:  # an index published before names were NFC: match it in NFC too
                hit = self.members.get(self._nfc_keys.get(key, ""))
        if hit is None:
            raise KeyError(member)
        si, off, ln = hit
        return self.shards[si], off, ln

    @functools.cached_property
    def _nfc_keys(self) -> dict[str, str]:
        return {member_name(k): k for k in self.members if member_name(k) != k}

    def __len__(self) -> int:
        return len(self.members)

    def __contains__(self, member: object) -> bool:
        if not isinstance(member, str):
            return False
        try:
            self.lookup(member)
        except KeyError:
            return False
        return True


def read_member_from_tar(tar_bytes: bytes, member: str) -> bytes:
    """Read a member with the standard library (cross-check for tests and tools)."""
    with tarfile.open(fileobj=io.BytesIO(tar_bytes), mode="r:") as t:
        f = t.extractfile(member)
        if f is None:
            raise KeyError(member)
        return f.read()
