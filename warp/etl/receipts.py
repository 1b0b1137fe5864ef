"""The receipts journal: one create-only receipt per finished shard (docs/formats/receipts.md).

A build directory (local) or build prefix (object store) holds
``receipts/<shard_id>.json``. The driver writes a shard's receipt once the
shard's bytes are in place, create-only (``O_EXCL``-style link locally,
``PUT If-None-Match: *`` on S3), so two drivers never disagree about a
finished shard. A receipt names the task it finished (``task_sha256``) and
the shard's content hash; a rerun after a crash reuses a shard only when
its receipt parses, names the same task and the shard's bytes still hash to
the receipted value. The manifest is written after every shard has a
receipt; the journal is removed before the version becomes visible.
"""

from __future__ import annotations

import os
import shutil
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from warpdata.core.atomic import create_exclusive
from warpdata.core.canonical import canonical_json
from warpdata.core.errors import InfrastructureError, InternalError, WarpError, os_failure
from warpdata.core.jsondoc import MAX_POINTER_BYTES, load_json
from warpdata.storage.errors import translate_storage_error
from warpdata.storage.locations import filesystem, parse_location

RECEIPT_VERSION = 1
DIR = "receipts"
# receipts read (on resume) or written (as shards finish) at once on object storage
RECEIPT_CONCURRENCY = 16
# receipts handed to the background writer and not yet written, at most; add() waits beyond
PENDING_RECEIPTS = 4 * RECEIPT_CONCURRENCY


def _infra(e: BaseException, what: str) -> InfrastructureError:
    return InfrastructureError(f"{what}: {e}", hint="the store is unreachable or refused the request; "
                               "rerun the same command once it is back: finished shards are reused")


def _client_errors() -> tuple[type[BaseException], ...]:
    """What a store client raises when the store refuses, is missing or does not answer: OSError
    (s3fs maps most of it) and botocore's own errors, which are not OSErrors. Anything else is a
    bug in warp and stays one (exit 70)."""
    try:  # botocore is heavy and only a remote journal's client loads it: looked up, not imported here
        from botocore.exceptions import BotoCoreError, ClientError
    except ImportError:
        return (OSError,)
    return (OSError, BotoCoreError, ClientError)


def _store_error(e: BaseException, action: str, url: str) -> WarpError:
    """A store client's exception (s3fs, botocore, aiohttp) as warp's typed error: credentials,
    permissions and a missing bucket or endpoint as the registry maps them (warp/storage/errors.py,
    exit 77/78), anything else as a temporary failure (exit 75), never the raw library exception."""
    typed = translate_storage_error(e, url, action)
    if isinstance(typed, WarpError):
        return typed
    return _infra(e, f"could not {action} {url}")


class Journal:
    """The receipts under ``base`` (a local directory or an fsspec URL)."""

    def __init__(self, base: str) -> None:
        # shard ids whose receipt :meth:`load_all` found damaged or foreign and deleted: the
        # pipeline deletes their shards' objects too before rebuilding them (rule 2 of
        # docs/formats/receipts.md)
        self.damaged: set[str] = set()
        # requests to the journal (docs/design.md §11 counts them): listings, receipts read, written
        self.listings = self.reads = self.writes = 0
        self._count_lock = threading.Lock()
        self.loc = parse_location(base).join(DIR)
        self.local = self.loc.protocol == "file"
        self.fs = None if self.local else filesystem(self.loc)
        if self.local:
            os.makedirs(self.loc.path, exist_ok=True)

    def path(self, shard_id: str) -> str:
        return f"{self.loc.path}/{shard_id}.json"

    def load(self, shard_id: str) -> dict[str, Any] | None:
        """The receipt of ``shard_id``, or None when there is none or it does not parse."""
        p = self.path(shard_id)
        with self._count_lock:
            self.reads += 1
        try:
            if self.local:
                with open(p, "rb") as f:
                    raw = f.read()
            else:
                raw = self.fs.cat_file(p)
        except FileNotFoundError:
            return None
        except OSError as e:
            if self.local:
                return None
            raise _store_error(e, "read the receipt", f"{self.loc.protocol}://{p}") from None
        except _client_errors() as e:  # botocore's own errors are not OSErrors
            raise _store_error(e, "read the receipt", f"{self.loc.protocol}://{p}") from None
        try:
            doc = load_json(raw, str(p), max_bytes=MAX_POINTER_BYTES)
        except ValueError:
            return None
        if not isinstance(doc, dict) or doc.get("receipt") != RECEIPT_VERSION or doc.get("shard_id") != shard_id:
            return None
        return doc

    def load_all(self) -> dict[str, dict[str, Any]]:
        """Every parseable receipt, by shard id (one listing, then one read per receipt)."""
        self.listings += 1
        try:
            if self.local:
                names = [n for n in os.listdir(self.loc.path) if n.endswith(".json")]
            else:
                self.fs.invalidate_cache(self.loc.path)
                names = [p.rsplit("/", 1)[-1] for p in self.fs.ls(self.loc.path, detail=False) if p.endswith(".json")]
        except FileNotFoundError:
            return {}
        except OSError as e:
            if self.local:
                return {}
            raise _store_error(e, "list the receipts under", self.loc.url) from None
        except _client_errors() as e:  # botocore's own errors are not OSErrors
            raise _store_error(e, "list the receipts under", self.loc.url) from None
        sids = [n[:-5] for n in sorted(names)]
        # one listing, then the receipts read RECEIPT_CONCURRENCY at a time: a resume of 10,000
        # shards waits for ~10,000 / 16 round trips to the store, not 10,000
        if self.local or len(sids) < 2:
            docs = [self.load(sid) for sid in sids]
        else:
            with ThreadPoolExecutor(RECEIPT_CONCURRENCY, thread_name_prefix="warp-receipts") as ex:
                docs = list(ex.map(self.load, sids))
        out = {}
        for sid, doc in zip(sids, docs, strict=True):
            if doc is not None:
                out[sid] = doc
            else:  # does not parse, or names another shard: deleted, so the rebuilt shard's receipt can be created
                self.forget(sid)
                self.damaged.add(sid)
        return out

    def writer(self) -> ReceiptWriter:
        """Receipts written off the driver's loop, :data:`RECEIPT_CONCURRENCY` at a time."""
        return ReceiptWriter(self)

    def record(self, shard_id: str, task_sha256: str, sha256: str | None, size_bytes: int,
               result: dict[str, Any]) -> dict[str, Any]:
        """Write the receipt of a finished shard, create-only; returns it.

        If a receipt is already there (another driver finished the same
        task) it must name the same content hash: the bytes of a task never
        depend on who built it. A different hash is a bug, not a race.
        """
        doc = {"receipt": RECEIPT_VERSION, "shard_id": shard_id, "task_sha256": task_sha256,
               "sha256": sha256, "size_bytes": size_bytes, "result": result}
        data = canonical_json(doc)
        p = self.path(shard_id)
        with self._count_lock:
            self.writes += 1
        created = self._create(p, data)
        if not created and self.load(shard_id) is None:
            # a damaged receipt appeared since the listing (rule 2): it goes, this one is created
            self.forget(shard_id)
            created = self._create(p, data)
        if not created:
            prev = self.load(shard_id)
            if prev is None or (prev.get("task_sha256"), prev.get("sha256")) != (task_sha256, sha256):
                raise InternalError(f"receipt {p} already exists with different content "
                                    f"(task {prev and prev.get('task_sha256')}, sha256 {prev and prev.get('sha256')}; "
                                    f"this build: {task_sha256}, {sha256})",
                                    hint="a shard's bytes must depend only on its task; please report this")
            return prev
        return doc

    def _create(self, p: str, data: bytes) -> bool:
        if self.local:
            return create_exclusive(p, data)
        try:
            self.fs.pipe_file(p, data, mode="create")
            return True
        except FileExistsError:
            return False
        except _client_errors() as e:
            if "PreconditionFailed" in str(e) or "412" in str(e):
                return False
            raise _store_error(e, "write the receipt", f"{self.loc.protocol}://{p}") from None

    def forget(self, shard_id: str) -> None:
        """Drop a receipt that failed verification (its shard is rebuilt). A store that refuses or
        does not answer is warp's typed error (exit 75/77/78), never the client library's."""
        p = self.path(shard_id)
        try:
            if self.local:
                os.unlink(p)
            else:
                self.fs.rm_file(p)
        except FileNotFoundError:
            pass
        except _client_errors() as e:
            if self.local:
                raise os_failure(e, p) from None
            raise _store_error(e, "delete the receipt", f"{self.loc.protocol}://{p}") from None

    def remove(self) -> None:
        """Remove the whole journal (once the manifest is written)."""
        if self.local:
            shutil.rmtree(self.loc.path, ignore_errors=True)
            return
        try:
            self.fs.rm(self.loc.path, recursive=True)
        except FileNotFoundError:
            pass
        except _client_errors() as e:
            raise _store_error(e, "delete the receipts under", self.loc.url) from None


class ReceiptWriter:
    """Writes receipts in the background while the driver goes on collecting results.

    :meth:`add` returns at once; :meth:`close` waits for every receipt and raises the first
    failure. Order stays the journal's: a shard's receipt is added once its bytes are in place,
    and the manifest is written only after :meth:`close` (rule 3 of docs/formats/receipts.md).
    On a local journal the receipt is written at once (a create is cheaper than a hand-off).
    """

    def __init__(self, journal: Journal) -> None:
        self.journal = journal
        self.pool = None if journal.local else ThreadPoolExecutor(RECEIPT_CONCURRENCY,
                                                                  thread_name_prefix="warp-receipts")
        self.pending: list[Any] = []

    def add(self, shard_id: str, task_sha256: str, sha256: str | None, size_bytes: int,
            result: dict[str, Any]) -> None:
        if self.pool is None:
            self.journal.record(shard_id, task_sha256, sha256, size_bytes, result)
            return
        self.pending.append(self.pool.submit(self.journal.record, shard_id, task_sha256, sha256, size_bytes,
                                             result))
        if len(self.pending) >= PENDING_RECEIPTS:
            # bound what waits in memory (a store slower than the tasks would otherwise queue every
            # receipt of the run here); surface failures early
            from concurrent.futures import FIRST_COMPLETED, wait

            done, _ = wait(self.pending, return_when=FIRST_COMPLETED)
            for f in done:
                f.result()
            self.pending = [f for f in self.pending if not f.done()]

    def close(self) -> None:
        if self.pool is None:
            return
        try:
            for f in self.pending:
                f.result()
        finally:
            self.pool.shutdown(wait=True, cancel_futures=True)
            self.pending = []

    def __enter__(self) -> ReceiptWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        if exc[0] is None:
            self.close()
        elif self.pool is not None:  # the run failed: what was sent may land, nothing new starts
            self.pool.shutdown(wait=True, cancel_futures=True)
