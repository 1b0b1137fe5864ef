"""S3 stores: s3fs for blob traffic, one botocore client (storage/s3client.py) for HEADs, listings
and the ETag-conditional writes: ``PUT If-None-Match: *`` is create-only (412: already there),
``If-Match: <etag>`` the compare-and-swap of a pointer (docs/formats/registry.md)."""

from __future__ import annotations

import errno

from warpdata.storage.base import ObjectStore
from warpdata.storage.locations import Location, StorageConfig
from warpdata.storage.s3client import shared_client

# lazy third-party imports: botocore (the [s3] extra) is imported inside the calls that catch its
# errors

__all__ = ["S3ObjectStore"]

_CONFLICT_CODES = {"PreconditionFailed", "412", "ConditionalRequestConflict", "409"}


class S3ObjectStore(ObjectStore):
    """s3fs for blob traffic; a boto3 client for the ETag-conditional ``latest`` pointer."""

    def __init__(self, location: Location, config: StorageConfig) -> None:
        super().__init__(location, config)
        self.bucket, _, self.prefix = self.root.partition("/")
        self._client = None

    @property
    def client(self):
        if self._client is None:
            self._client = shared_client(self.config)
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
        return True

    def put_file_if_absent(self, key: str, local: str) -> bool:
        self.stats.request("PUT")
        try:
            self.fs.put_file(local, self.path(key), mode="create")
        except FileExistsError:
            return False
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
        self.stats.request("PUT")
        try:
            r = self.client.put_object(Bucket=self.bucket, Key=self.object_key(key), Body=data,
                                       ContentType="application/json", **cond)
        except ClientError as e:
            err = e.response.get("Error", {})
            status = str(e.response.get("ResponseMetadata", {}).get("HTTPStatusCode", ""))
            if err.get("Code") in _CONFLICT_CODES or status in ("412", "409"):
                return None
            if token is not None and err.get("Code") in ("NoSuchKey", "404"):
                return None
            raise
        self.fs.invalidate_cache(self.path(key))
        return r["ETag"]
