"""S3 stores: s3fs for blob traffic, one botocore client (storage/s3client.py) for HEADs, listings
and the ETag-conditional writes: ``PUT If-None-Match: *`` is create-only (412: already there),
``If-Match: <etag>`` the compare-and-swap of a pointer (docs/formats/registry.md).

Where S3 servers answer these differently (docs/s3-conformance.md, measured against Ceph's RADOS
Gateway 16.2 and moto): a 412 without AWS's ``<Condition>`` element (RGW; s3fs then raises
``OSError(EINVAL)``, not ``FileExistsError``) is still "already there"; a 409
``ConditionalRequestConflict`` (AWS, a conditional write racing another) is a lost race; RGW
compares ``If-Match`` with the bare ETag, so a quoted token it refuses is sent once more bare when
the object still has that ETag; RGW ignores ``If-None-Match`` on ``CompleteMultipartUpload``, so
a create-only completion first looks for the object (:func:`_complete_if_absent`)."""

from __future__ import annotations

import errno

from warpdata.storage.base import ObjectStore
from warpdata.storage.locations import Location, StorageConfig
from warpdata.storage.s3client import shared_client

# lazy third-party imports: botocore (the [s3] extra) is imported inside the calls that catch its
# errors

__all__ = ["S3ObjectStore"]

_CONFLICT_CODES = {"PreconditionFailed", "412", "ConditionalRequestConflict", "409"}


def _is_conflict(e: BaseException | None) -> bool:
    """Whether ``e`` (a botocore ClientError, or s3fs's OSError caused by one) is a failed
    precondition or a conditional-write conflict: 412 with or without AWS's Condition element, 409."""
    while e is not None:
        response = getattr(e, "response", None)
        if isinstance(response, dict):
            code = str(response.get("Error", {}).get("Code", ""))
            status = str(response.get("ResponseMetadata", {}).get("HTTPStatusCode", ""))
            return code in _CONFLICT_CODES or status in ("412", "409")
        e = e.__cause__
    return False


def _complete_if_absent(params, model, context, **kwargs):
    """botocore ``before-call`` hook of ``CompleteMultipartUpload``: a create-only completion
    (``If-None-Match: *``) of a key that exists answers 412 without completing. RGW 16.2 ignores
    the header and replaces the object; AWS honours it (this HEAD is then one more request per large
    blob). Not atomic: a completion racing another may still replace it, with the same bytes (blob
    keys name their content)."""
    headers = params.get("headers", {})
    client = context.get("warp_client")
    if headers.get("If-None-Match") != "*" or client is None:
        return None
    from botocore.exceptions import ClientError

    bucket, key = context.get("warp_target", (None, None))
    if bucket is None:
        return None
    try:
        client.head_object(Bucket=bucket, Key=key)
    except ClientError:
        return None  # not there (or not visible): complete it, the server decides
    from botocore.awsrequest import AWSResponse

    response = AWSResponse(params.get("url", ""), 412, {}, None)
    return response, {"Error": {"Code": "PreconditionFailed", "Message": "the object exists (checked before completing)",
                                "Condition": "If-None-Match"},
                      "ResponseMetadata": {"HTTPStatusCode": 412}}


def _remember_target(params, context, **kwargs):
    """``provide-client-params`` hook: keep the bucket and key for :func:`_complete_if_absent`."""
    context["warp_target"] = (params.get("Bucket"), params.get("Key"))


class S3ObjectStore(ObjectStore):
    """s3fs for blob traffic; a boto3 client for the ETag-conditional ``latest`` pointer."""

    def __init__(self, location: Location, config: StorageConfig) -> None:
        super().__init__(location, config)
        self.bucket, _, self.prefix = self.root.partition("/")
        self._client = None

    @property
    def client(self):
        if self._client is None:
            client = shared_client(self.config)
            events = client.meta.events
            events.register("provide-client-params.s3.CompleteMultipartUpload", _remember_target,
                            unique_id="warp-complete-target")
            events.register("before-call.s3.CompleteMultipartUpload", _complete_if_absent,
                            unique_id="warp-complete-if-absent")
            events.register("before-parameter-build.s3.CompleteMultipartUpload",
                            lambda params, context, **kw: context.update(warp_client=client),
                            unique_id="warp-complete-client")
            self._client = client
        return self._client

    def object_key(self, key: str) -> str:
        """The S3 object key of store key ``key`` (the store's prefix before it)."""
        return f"{self.prefix}/{key}" if self.prefix else key

    # s3fs answers exists/size (and whole-object cat_file, which sizes first)
    # from its listings cache; another process may have written since that
    # listing, so point lookups drop the cached entry first.
    def exists(self, key: str) -> bool:
        """One HEAD of the object (s3fs's exists() LISTs the key as a "directory" after a 404)."""
        from botocore.exceptions import ClientError

        self.stats.request("HEAD")
        try:
            self.client.head_object(Bucket=self.bucket, Key=self.object_key(key))
        except ClientError as e:
            status = str(e.response.get("ResponseMetadata", {}).get("HTTPStatusCode", ""))
            if status == "404" or e.response.get("Error", {}).get("Code") in ("NoSuchKey", "404", "NotFound"):
                return False
            raise
        return True

    def list_keys(self, prefix: str, max_pages: int) -> set[str] | None:
        """Every key under ``prefix`` (relative to the store root), or None past ``max_pages`` LIST pages."""
        out: set[str] = set()
        token = None
        base = self.object_key(prefix)
        strip = len(self.object_key(""))
        for _ in range(max_pages):
            kw = {"Bucket": self.bucket, "Prefix": base, "MaxKeys": 1000}
            if token:
                kw["ContinuationToken"] = token
            self.stats.request("LIST")
            r = self.client.list_objects_v2(**kw)
            out.update(o["Key"][strip:] for o in r.get("Contents", ()))
            if not r.get("IsTruncated"):
                return out
            token = r.get("NextContinuationToken")
        return None

    def list_objects(self, prefix: str) -> list[tuple[str, int, float]]:
        """``(key, size, LastModified)`` of every object under ``prefix``: one LIST request a page of
        1,000 keys."""
        out = []
        token = None
        base = self.object_key(prefix)
        strip = len(self.object_key(""))
        while True:
            kw = {"Bucket": self.bucket, "Prefix": base, "MaxKeys": 1000}
            if token:
                kw["ContinuationToken"] = token
            self.stats.request("LIST")
            r = self.client.list_objects_v2(**kw)
            out.extend((o["Key"][strip:], int(o["Size"]), o["LastModified"].timestamp())
                       for o in r.get("Contents", ()))
            if not r.get("IsTruncated"):
                return sorted(out)
            token = r.get("NextContinuationToken")

    def get(self, key: str) -> bytes:
        self.fs.invalidate_cache(self.path(key))
        return super().get(key)

    def size(self, key: str) -> int:
        self.fs.invalidate_cache(self.path(key))
        return super().size(key)

    def get_range(self, key: str, start: int, end: int) -> bytes:
        # S3 answers a range that starts at or past the end with 416 (s3fs: OSError EINVAL);
        # the other backends, like a file's read(), return what is there: nothing
        try:
            return super().get_range(key, start, end)
        except OSError as e:
            if e.errno == errno.EINVAL and start >= self.size(key):
                return b""
            raise

    def put_if_absent(self, key: str, data: bytes) -> bool:
        self.stats.request("PUT")
        try:
            self.fs.pipe_file(self.path(key), bytes(data), mode="create")
        except FileExistsError:
            return False
        except OSError as e:
            if _is_conflict(e):  # a 412 without the Condition element s3fs looks for (RGW)
                return False
            raise
        return True

    def put_file_if_absent(self, key: str, local: str) -> bool:
        self.stats.request("PUT")
        try:
            self.fs.put_file(local, self.path(key), mode="create")
        except FileExistsError:
            return False
        except OSError as e:
            if _is_conflict(e):
                return False
            raise
        return True

    def delete(self, key: str) -> None:
        self.stats.request("DELETE")
        self.client.delete_object(Bucket=self.bucket, Key=self.object_key(key))
        self.fs.invalidate_cache(self.path(key))

    def read_versioned(self, key: str) -> tuple[bytes, str] | None:
        from botocore.exceptions import ClientError

        self.stats.request("GET")
        try:
            r = self.client.get_object(Bucket=self.bucket, Key=self.object_key(key))
        except ClientError as e:
            if e.response.get("Error", {}).get("Code") in ("NoSuchKey", "404"):
                return None
            raise
        return r["Body"].read(), r["ETag"]

    def write_if(self, key: str, data: bytes, token: str | None) -> str | None:
        from botocore.exceptions import ClientError

        cond = {"IfMatch": token} if token is not None else {"IfNoneMatch": "*"}
        try:
            r = self._put_if(key, data, cond)
            if r is None and token is not None and token.startswith('"') and self._etag(key) == token:
                # refused, yet the object still has that ETag: a server that compares If-Match with
                # the bare ETag (RGW 16.2); once more, bare (still conditional: a mover since wins)
                r = self._put_if(key, data, {"IfMatch": token.strip('"')})
        except ClientError as e:
            if token is not None and e.response.get("Error", {}).get("Code") in ("NoSuchKey", "404"):
                return None
            raise
        if r is None:
            return None
        self.fs.invalidate_cache(self.path(key))
        return r["ETag"]

    def _put_if(self, key: str, data: bytes, cond: dict[str, str]):
        """One conditional PUT: its response, or None when a precondition failed or conflicted."""
        from botocore.exceptions import ClientError

        self.stats.request("PUT")
        try:
            return self.client.put_object(Bucket=self.bucket, Key=self.object_key(key), Body=data,
                                          ContentType="application/json", **cond)
        except ClientError as e:
            if _is_conflict(e):
                return None
            raise

    def _etag(self, key: str) -> str | None:
        from botocore.exceptions import ClientError

        self.stats.request("HEAD")
        try:
            return self.client.head_object(Bucket=self.bucket, Key=self.object_key(key))["ETag"]
        except ClientError:
            return None
