"""Reads of a store's keys by range, without listing: what the read API fetches through.

:class:`Remote` wraps a store root (local path, ``s3://``, ``memory://``) in a
pyarrow filesystem: S3 through pyarrow's native client built from the one
:class:`~warpdata.storage.locations.StorageConfig` (timeouts, retries with jittered
back-off), shared per configuration for a few minutes so credentials are resolved once.
Errors become the typed store errors of :mod:`warpdata.core.errors`.
"""

from __future__ import annotations

from typing import Any

from warpdata.core import envvars


class Remote:
    """Key reads against a store root, through pyarrow filesystems (ranged, no listing).

    Whole small objects (``latest.json``, manifests) on S3 are one GET through a botocore
    client: pyarrow sends a HEAD before every object it opens, which made opening a dataset
    cost four requests instead of two. The pyarrow filesystem is built on first use, so a
    command that reads only the manifest (``warp info``, ``warp schema``) never starts it.
    """

    def __init__(self, store_url: str | None = None) -> None:
        from warpdata.storage.locations import StorageConfig, parse_location

        self.loc = parse_location(store_url if store_url is not None else envvars.default_store())
        self.config = StorageConfig.from_env()
        self.root = self.loc.path.rstrip("/")
        self._fs: Any = None

    @property
    def fs(self):
        if self._fs is None:
            from pyarrow import fs as pafs
            from warpdata.storage.locations import filesystem

            if self.loc.protocol == "s3":
                self._fs = _pyarrow_s3(self.config)
            elif self.loc.protocol == "file":
                self._fs = pafs.LocalFileSystem()
            else:
                self._fs = pafs.PyFileSystem(pafs.FSSpecHandler(filesystem(self.loc, self.config)))
        return self._fs

    @property
    def url(self) -> str:
        return self.loc.url

    def path(self, key: str) -> str:
        return f"{self.root}/{key}"

    def url_of(self, key: str) -> str:
        return self.path(key) if self.loc.protocol == "file" else f"{self.loc.protocol}://{self.path(key).lstrip('/')}"

    def _wrap(self, e: Exception, key: str, action: str = "read") -> Exception:
        from warpdata.core.errors import StoreUnavailableError
        from warpdata.storage.errors import translate_storage_error

        t = translate_storage_error(e, self.url_of(key), action)
        if t is e and isinstance(e, OSError) and not isinstance(e, FileNotFoundError):
            return StoreUnavailableError(f"cannot {action} {self.url_of(key)}: {e}",
                                         hint="check the network and WARP_S3_ENDPOINT; 'warp doctor --only store'")
        return t

    def get(self, key: str) -> bytes | None:
        """The object's bytes, or None when it does not exist (on S3: one GET)."""
        if self.loc.protocol == "s3":
            client = _s3_client(self.config)
            if client is not None:
                return self._s3_get(client, key)
        if self.loc.protocol == "file":  # a plain read: `warp info` on a local store never imports pyarrow
            try:
                with open(self.path(key), "rb") as f:
                    return f.read()
            except (FileNotFoundError, NotADirectoryError):
                return None
            except OSError as e:
                raise self._wrap(e, key) from e
        try:
            with self.fs.open_input_stream(self.path(key)) as f:
                return f.read()
        except FileNotFoundError:
            return None
        except Exception as e:
            if _is_not_found(e):
                return None
            raise self._wrap(e, key) from e

    def _s3_get(self, client: Any, key: str) -> bytes | None:
        bucket, _, prefix = self.path(key).lstrip("/").partition("/")
        try:
            return client.get_object(Bucket=bucket, Key=prefix)["Body"].read()
        except Exception as e:
            err = getattr(e, "response", None) or {}
            code = str((err.get("Error") or {}).get("Code", ""))
            status = (err.get("ResponseMetadata") or {}).get("HTTPStatusCode")
            if code in ("NoSuchKey", "404", "NotFound") or status == 404:
                return None
            t = self._wrap(e, key)
            if t is e:
                from warpdata.core.errors import StoreUnavailableError

                t = StoreUnavailableError(f"cannot read {self.url_of(key)}: {e}",
                                          hint="check the network and WARP_S3_ENDPOINT; 'warp doctor --only store'")
            raise t from e

    def open(self, key: str, size: int | None = None):
        """A random-access file over the object (on S3: one HEAD, then ranged GETs)."""
        try:
            return self.fs.open_input_file(self.path(key))
        except Exception as e:
            if isinstance(e, FileNotFoundError) or _is_not_found(e):
                from warpdata.core.errors import BlobNotFoundError

                raise BlobNotFoundError(f"{self.url_of(key)} is missing from the store",
                                        hint="the version was published incompletely; republish it") from None
            raise self._wrap(e, key) from e

    def read_range(self, key: str, start: int, length: int, size: int | None = None) -> bytes:
        f = self.open(key, size)
        try:
            return f.read_at(length, start)
        except Exception as e:
            raise self._wrap(e, key) from e
        finally:
            f.close()

    def copy_to(self, key: str, dst, size: int | None = None, chunk: int = 8 << 20) -> None:
        """Stream the whole object into ``dst`` (a writable file object)."""
        f = self.open(key, size)
        try:
            buf = bytearray(chunk)
            view = memoryview(buf)
            while True:
                n = f.readinto(buf)
                if not n:
                    break
                dst.write(view[:n])
        except Exception as e:
            from warpdata.core.errors import WarpError

            if isinstance(e, WarpError):
                raise
            raise self._wrap(e, key) from e
        finally:
            f.close()


_S3_FS: dict[tuple, tuple[float, Any]] = {}
_S3_FS_TTL = 300.0  # seconds a filesystem (and the credentials resolved into it) is reused

_CRED_ENV = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE",
             "AWS_SHARED_CREDENTIALS_FILE", "AWS_CONFIG_FILE", "AWS_EC2_METADATA_DISABLED")


def _pyarrow_s3(config):
    """One pyarrow S3 filesystem per configuration and credential environment, reused for a few
    minutes: building one resolves credentials through botocore (~50 ms), which every
    ``Dataset`` open would otherwise pay again."""
    import os
    import time

    key = (config, tuple(os.environ.get(k) for k in _CRED_ENV))
    now = time.monotonic()
    hit = _S3_FS.get(key)
    if hit is not None and now - hit[0] < _S3_FS_TTL:
        return hit[1]
    fs = config.pyarrow_s3()
    if len(_S3_FS) >= 16:
        _S3_FS.clear()
    _S3_FS[key] = (now, fs)
    return fs


_S3_CLIENTS: dict[tuple, tuple[float, Any]] = {}


def _s3_client(config):
    """One botocore S3 client per configuration and credential environment, reused like
    :func:`_pyarrow_s3`; None without boto3 (reads then go through pyarrow, HEAD + GET).
    Per process: a forked DataLoader worker must not share its parent's connection pool."""
    import os
    import time

    key = (config, tuple(os.environ.get(k) for k in _CRED_ENV), os.getpid())
    now = time.monotonic()
    hit = _S3_CLIENTS.get(key)
    if hit is not None and now - hit[0] < _S3_FS_TTL:
        return hit[1]
    try:
        import boto3  # noqa: F401  (the [s3] extra)
    except ImportError:
        return None
    from warpdata.registry.store import boto3_client

    client = boto3_client(config)
    if len(_S3_CLIENTS) >= 16:
        _S3_CLIENTS.clear()
    _S3_CLIENTS[key] = (now, client)
    return client


def _is_not_found(e: Exception) -> bool:
    text = str(e)
    return "NoSuchKey" in text or "404" in text and "Not Found" in text or "Path does not exist" in text
