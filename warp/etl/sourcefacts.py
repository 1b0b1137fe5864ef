"""Source facts: what an ETL learnt of each object of a source on object storage, kept for the next run.

Every pipeline whose source may be an ``s3://`` folder or object (the warehouse's images, the feature
cache's media and captions, a tiled array's input) lists the source once, then reads only the
objects whose listing facts (size and ETag, the modification time where a store has no ETag) are
not the ones recorded when it last read them. What it learnt of an object's bytes (its content
hash, and whatever the pipeline derives from them) is recorded with those listing facts in
``$WARP_CACHE_DIR/etl-source-facts/`` (canonical JSON, ``facts_version`` 1), one file per source URL
and pipeline. docs/formats/receipts.md ("Sources on object storage") states the contract.

A fact is a dict holding at least ``size`` and ``tag``; :func:`unchanged` says whether the listing
still says so. Reading the record never fails a run: a missing, damaged or foreign file is no facts.
"""

from __future__ import annotations

import hashlib
import posixpath
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from warpdata.core import envvars
from warpdata.core.atomic import atomic_write_bytes
from warpdata.core.canonical import canonical_json
from warpdata.core.errors import InfrastructureError
from warpdata.core.jsondoc import load_json
from warpdata.etl.objectstore import _is_infra, credentials_error
from warpdata.storage.locations import filesystem, parse_location

FACTS_VERSION = 1

Facts = dict[str, dict[str, Any]]


def facts_path(url: str, pipeline: str = "") -> Path:
    """Where the facts of ``url`` are kept. The warehouse's (``pipeline=""``) keep the name they
    have always had; every other pipeline's are ``<pipeline>-<hash>.json``, so two pipelines reading
    one URL never read each other's facts."""
    h = hashlib.sha256(url.rstrip("/").encode()).hexdigest()[:16]
    return Path(envvars.default_cache_dir()) / "etl-source-facts" / (f"{pipeline}-{h}.json" if pipeline else f"{h}.json")


def load_facts(url: str, pipeline: str = "") -> Facts:
    """``{key: fact}`` recorded by earlier runs over ``url`` (empty when none or unreadable)."""
    p = facts_path(url, pipeline)
    try:
        doc = load_json(p.read_bytes(), str(p))
    except (OSError, ValueError):
        return {}
    if not isinstance(doc, dict) or doc.get("facts_version") != FACTS_VERSION or doc.get("url") != url.rstrip("/"):
        return {}
    facts = doc.get("objects")
    return {k: v for k, v in facts.items() if isinstance(v, dict)} if isinstance(facts, dict) else {}


def save_facts(url: str, facts: Facts, pipeline: str = "") -> None:
    p = facts_path(url, pipeline)
    p.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(p, canonical_json({"facts_version": FACTS_VERSION, "url": url.rstrip("/"),
                                          "objects": facts}))


def listed_tag(info: dict[str, Any]) -> str | None:
    """An object's tag from a listing entry: its ETag, else its modification time."""
    tag = (info.get("ETag") or info.get("etag") or info.get("LastModified") or info.get("Last-Modified")
           or info.get("mtime"))
    return str(tag) if tag else None


@dataclass
class Listed:
    """One object as a listing (or, from an HTTP host, a HEAD) gives it."""

    size: int
    tag: str | None


def unchanged(fact: Any, listed: Listed | None) -> bool:
    """Whether ``fact`` is still true: the object is listed with the recorded size and tag (an
    object without a tag is never taken as unchanged)."""
    return (listed is not None and listed.tag is not None and isinstance(fact, dict)
            and fact.get("tag") == listed.tag and fact.get("size") == listed.size)


def listing_facts(size: int, tag: str | None, **learnt: Any) -> dict[str, Any]:
    """A fact: the listing's size and tag, and what was learnt of the bytes."""
    return {"size": int(size), "tag": tag, **learnt}


def _store_errors() -> tuple[type[BaseException], ...]:
    """What a store client raises for a failed request: the OS's and the socket's errors, and
    botocore's own (s3fs raises them untranslated for credentials and some refusals)."""
    try:
        from botocore.exceptions import BotoCoreError, ClientError
    except ImportError:  # pragma: no cover - s3fs depends on botocore
        return (OSError, TimeoutError)
    return (OSError, TimeoutError, BotoCoreError, ClientError)


def read_call(url: str, fn, *args, **kwargs):
    """``fn(*args, **kwargs)``, a read of the source at ``url``: an unreachable store or one that
    refuses the request is an :class:`InfrastructureError` (exit 75), missing credentials an
    AuthenticationError (exit 78); ``FileNotFoundError`` and everything that is not a store
    client's error pass through untouched."""
    try:
        return fn(*args, **kwargs)
    except FileNotFoundError:
        raise
    except _store_errors() as e:
        cred = credentials_error(e, url)
        if cred is not None:
            raise cred from None
        if _is_infra(e):
            raise InfrastructureError(f"could not read {url}: {type(e).__name__}: {e}",
                                      hint="the object store is unreachable or refused the request (check "
                                           "WARP_S3_ENDPOINT and credentials); rerun the same command") from None
        raise


def list_object(url: str) -> Listed | None:
    """One object's listing facts, None when there is no such object. On S3, one LIST request for
    the object's key as a prefix (no HEAD, no GET); a store that cannot list by prefix (an HTTP
    host, others) answers one metadata request (a HEAD)."""
    loc = parse_location(url)
    fs = filesystem(loc)
    path = loc.path.rstrip("/")
    if loc.protocol in ("s3", "s3a"):
        parent, name = posixpath.split(path)
        fs.invalidate_cache(parent)
        try:
            found = read_call(url, fs.find, parent, prefix=name, detail=True)
        except FileNotFoundError:
            return None
        info = found.get(path)
        if info is None or info.get("type") == "directory":
            return None
        return Listed(int(info.get("size") or 0), listed_tag(info))
    try:
        info = read_call(url, fs.info, path)
    except FileNotFoundError:
        return None
    return Listed(int(info.get("size") or 0), listed_tag(info))
