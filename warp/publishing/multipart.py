"""Multipart uploads of large blobs to S3 (docs/formats/receipts.md, "Publishing large blobs").

``warp publish`` sends a blob of :data:`MULTIPART_MIN` bytes or more in parts of
:func:`part_size`, :func:`upload_concurrency` at once, create-only at completion, resuming
the parts an interrupted publish left (:func:`_put_multipart`). Part of the publishing wing
(:mod:`warpdata.publishing.publish`).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from warpdata.core import envvars
from warpdata.core.errors import missing_dependency
from warpdata.registry.store import Store, blob_key
from warpdata.storage.s3 import S3ObjectStore

# lazy third-party imports: botocore (the [s3] extra) is imported inside the functions that use
# it, so importing this module does not load it: only S3 uploads need it

MULTIPART_MIN = 64 << 20  # blobs this large go up in parts, several at once
PART_SIZE = 16 << 20  # S3 takes 5 MiB to 5 GiB per part and at most 10,000 parts
MAX_PARTS = 10_000


def upload_concurrency() -> int:
    """``WARP_UPLOAD_CONCURRENCY``: parts of one large blob in flight at once (default 8); ConfigError
    when malformed or out of its bound (:mod:`warpdata.core.envvars`)."""
    n = envvars.number("WARP_UPLOAD_CONCURRENCY")
    return 8 if n is None else int(n)


def _s3_backend(store: Store):
    b = store.objects
    return b if isinstance(b, S3ObjectStore) else None


def part_size(size: int) -> int:
    return max(PART_SIZE, -(-size // MAX_PARTS))


def _put_multipart(store: Store, hash_hex: str, path: str, size: int, concurrency: int,
                   on_part: Callable[[int], None] | None = None) -> bool:
    """Create-only multipart upload of one blob, ``concurrency`` parts at a time.

    An upload of the same key left unfinished by a killed publish is
    resumed: its parts whose size and MD5 (the part's ETag) match this
    file's are kept, only the others are sent. The object appears only at
    ``CompleteMultipartUpload`` (``If-None-Match: *``: a blob another
    publisher finished first is kept; blobs are content-addressed, so it
    holds the same bytes). Returns False when the blob was there already.
    """
    import hashlib

    try:
        from botocore.exceptions import ClientError
    except ImportError:
        raise missing_dependency("S3 multipart uploads", "botocore", "s3") from None

    b = _s3_backend(store)
    client, bucket, key = b.client, b.bucket, b.object_key(blob_key(hash_hex))
    psize = part_size(size)
    n = -(-size // psize)
    upload_id, have = None, {}
    for u in client.list_multipart_uploads(Bucket=bucket, Prefix=key).get("Uploads", []):
        if u["Key"] == key:
            upload_id = u["UploadId"]
            pager = client.get_paginator("list_parts")
            for page in pager.paginate(Bucket=bucket, Key=key, UploadId=upload_id):
                for part in page.get("Parts", []):
                    have[part["PartNumber"]] = (part["ETag"], part["Size"])
            break
    if upload_id is None:
        upload_id = client.create_multipart_upload(Bucket=bucket, Key=key)["UploadId"]
    fd = os.open(path, os.O_RDONLY)
    try:
        def send(i: int) -> dict[str, Any]:
            off = (i - 1) * psize
            chunk = os.pread(fd, min(psize, size - off), off)
            etag = f'"{hashlib.md5(chunk, usedforsecurity=False).hexdigest()}"'
            if have.get(i) != (etag, len(chunk)):
                etag = client.upload_part(Bucket=bucket, Key=key, UploadId=upload_id, PartNumber=i,
                                          Body=chunk)["ETag"]
            if on_part:
                on_part(len(chunk))
            return {"PartNumber": i, "ETag": etag}

        with ThreadPoolExecutor(max(1, min(concurrency, n)), thread_name_prefix="warp-part") as ex:
            parts = list(ex.map(send, range(1, n + 1)))
    finally:
        os.close(fd)
    try:
        client.complete_multipart_upload(Bucket=bucket, Key=key, UploadId=upload_id,
                                         MultipartUpload={"Parts": parts}, IfNoneMatch="*")
    except ClientError as e:
        if str(e.response.get("Error", {}).get("Code")) in ("PreconditionFailed", "412", "ConditionalRequestConflict"):
            client.abort_multipart_upload(Bucket=bucket, Key=key, UploadId=upload_id)
            return False
        raise
    return True
