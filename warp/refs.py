"""Typed references into tar-shard artifacts: ``FileRef``, ``ImageRef``, ``AudioRef``.

Contract
--------
* A table column bound to an artifact (manifest ``bindings``) holds member
  paths; readers turn each value into a ref of the binding's ``ref_type``.
* A ref reads exactly its member's bytes: the artifact's member index
  (``warp-tar-index-1``, ``docs/formats/registry.md``) gives
  ``(shard hash, offset, length)``, and the bytes come from the shard's
  cached copy when the blob cache holds it, else from one ranged GET of
  ``[offset, offset + length)``. Archives are never extracted and shards are
  never downloaded whole for a ref (``warp warm`` does that on purpose).
* The index blob itself is small: it is fetched once, verified against its
  hash and cached (except in ``remote`` mode, which keeps nothing locally).
* ``local_path()`` materialises one member as a content-addressed blob in the
  cache (named by the member's SHA-256, so it is evicted and verified like
  every other blob) and returns its path.
* Decoders are optional: Pillow for images (simplejpeg for JPEG arrays),
  the standard ``wave`` module for PCM WAV, ``soundfile`` for other audio.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import threading
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from .errors import DataError, MissingInputError, UsageError

if TYPE_CHECKING:
    import numpy as np

    from .dataset import Dataset
    from .registry.manifest import Binding


class ArtifactReader:
    """Member reads for one artifact of a dataset version."""

    def __init__(self, ds: Dataset, name: str) -> None:
        self.ds = ds
        self.name = name
        self.meta = ds.manifest.artifacts[name]
        self._index = None
        self._mu = threading.Lock()
        self._fds: dict[str, int] = {}
        self._sizes = {s.hash: s.byte_size for s in self.meta.shards}
        self._refs = {s.hash: s for s in self.meta.shards}

    @property
    def index(self):
        from .registry.tarpack import ArtifactIndex

        if self._index is None:
            with self._mu:
                if self._index is None:
                    idx = self.meta.index
                    if idx is None:
                        raise DataError(f"artifact {self.name} of {self.ds.id} has no member index",
                                        hint="republish it with 'warp publish' (it writes the index)")
                    src = self.ds.remote.url_of(self.ds.blob_key(idx))
                    if self.ds.cache is not None:
                        data = Path(self.ds.fetch_blob(idx)).read_bytes()
                    else:
                        data = self.ds.remote.get(self.ds.blob_key(idx))
                        if data is None or hashlib.sha256(data).hexdigest() != idx.hash:
                            from .registry.errors import BlobCorruptedError

                            raise BlobCorruptedError(f"{src}: member index missing or not matching its hash",
                                                     hint="republish the dataset")
                    self._index = ArtifactIndex.from_bytes(data, source=src)
        return self._index

    def members(self) -> list[str]:
        return sorted(self.index.members)

    def locate(self, member: str) -> tuple[str, int, int]:
        try:
            return self.index.lookup(member)
        except KeyError:
            import difflib

            close = difflib.get_close_matches(member, list(self.index.members), n=1)
            raise MissingInputError(f"artifact {self.name} of {self.ds.id} has no member {member!r}",
                                    hint=f"did you mean {close[0]!r}?" if close else
                                    f"list members with 'warp inspect {self.ds.id}'") from None

    def _local_fd(self, shard_hash: str) -> int | None:
        fd = self._fds.get(shard_hash)
        if fd is not None:
            return fd
        if self.ds.cache is None:
            return None
        p = self.ds.cache.get(shard_hash)
        if p is None:
            return None
        with self._mu:
            if shard_hash not in self._fds:
                self._fds[shard_hash] = os.open(p, os.O_RDONLY)
            return self._fds[shard_hash]

    def read(self, member: str) -> bytes:
        """The member's bytes: a local pread of a cached shard, or one ranged GET."""
        shard, off, length = self.locate(member)
        fd = self._local_fd(shard)
        if fd is not None:
            data = os.pread(fd, length, off)
        else:
            if self.ds.mode == "local":
                raise MissingInputError(f"shard {shard[:12]} of artifact {self.name} ({self.ds.id}) is not in "
                                        "the cache (local mode)", hint=f"run 'warp warm {self.ds.id}' while online")
            data = self.ds.remote.read_range(self.ds.blob_key(self._refs[shard]), off, length, self._sizes.get(shard))
        if len(data) != length:
            raise DataError(f"member {member!r} of artifact {self.name}: read {len(data)} bytes, index says {length}",
                            hint="the shard is truncated; run 'warp cache verify' or republish")
        return data

    def read_many(self, members: Iterable[str], threads: int = 16) -> list[bytes]:
        """Several members at once (parallel ranged GETs; they release the GIL)."""
        ms = list(members)
        if len(ms) < 2:
            return [self.read(m) for m in ms]
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(max_workers=min(threads, len(ms))) as ex:
            return list(ex.map(self.read, ms))

    def local_path(self, member: str) -> Path:
        """A local file holding exactly the member's bytes (a content-addressed cache blob)."""
        cache = self.ds.cache
        if cache is None:
            raise UsageError("local_path() needs the blob cache; remote mode keeps nothing locally",
                             hint="open the dataset with mode='auto', or use read_bytes()/open()")
        shard, off, length = self.locate(member)
        pointer = cache.root / "members" / shard[:2] / f"{shard}-{off}-{length}"
        try:
            h = pointer.read_text().strip()
            p = cache.get(h)
            if p is not None:
                return p
        except (FileNotFoundError, ValueError):
            pass
        data = self.read(member)
        h = hashlib.sha256(data).hexdigest()
        p = cache.put_bytes(h, data)
        from .atomic import atomic_write_text

        atomic_write_text(pointer, h, fsync=False)
        return p

    def ref(self, member: str, ref_type: str = "file") -> FileRef:
        return REF_TYPES.get(ref_type, FileRef)(self, member)

    def close(self) -> None:
        with self._mu:
            for fd in self._fds.values():
                os.close(fd)
            self._fds.clear()

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.close()


class FileRef:
    """A member of an artifact: ``open()``, ``read_bytes()``, ``local_path()``."""

    __slots__ = ("member", "reader")

    def __init__(self, reader: ArtifactReader, member: str) -> None:
        self.reader = reader
        self.member = member

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.reader.ds.id}:{self.reader.name}/{self.member})"

    def __eq__(self, other: object) -> bool:
        return (type(other) is type(self) and other.member == self.member  # type: ignore[attr-defined]
                and other.reader.name == self.reader.name and other.reader.ds.version == self.reader.ds.version)  # type: ignore[attr-defined]

    def __hash__(self) -> int:
        return hash((self.reader.ds.version, self.reader.name, self.member))

    @property
    def artifact(self) -> str:
        return self.reader.name

    @property
    def size(self) -> int:
        return self.reader.locate(self.member)[2]

    def read_bytes(self) -> bytes:
        return self.reader.read(self.member)

    def open(self) -> IO[bytes]:
        return io.BytesIO(self.read_bytes())

    def local_path(self) -> Path:
        return self.reader.local_path(self.member)


class ImageRef(FileRef):
    """An image member: ``as_pil()``, ``as_numpy()`` (H×W×C uint8)."""

    __slots__ = ()

    def as_pil(self):
        try:
            from PIL import Image
        except ImportError:
            from .errors import missing_dependency

            raise missing_dependency("ImageRef.as_pil()", "pillow") from None
        data = self.read_bytes()
        try:
            img = Image.open(io.BytesIO(data))
            img.load()
        except Exception as e:
            raise DataError(f"{self!r}: not a decodable image: {e}", hint="check the member's bytes with 'warp cat'") from None
        return img

    def as_numpy(self) -> np.ndarray:
        import numpy as np

        data = self.read_bytes()
        if data[:3] == b"\xff\xd8\xff":
            with contextlib.suppress(ImportError, ValueError):  # Pillow below gives the better error
                import simplejpeg

                return simplejpeg.decode_jpeg(data, colorspace="RGB")
        return np.asarray(self.as_pil())


class AudioRef(FileRef):
    """An audio member: ``as_array()`` (float32, frames × channels for multi-channel), ``sample_rate``."""

    __slots__ = ()

    def _decode(self) -> tuple[Any, int]:
        import numpy as np

        data = self.read_bytes()
        if data[:4] == b"RIFF" and data[8:12] == b"WAVE":
            import wave

            try:
                with wave.open(io.BytesIO(data)) as w:
                    ch, width, rate, n = w.getnchannels(), w.getsampwidth(), w.getframerate(), w.getnframes()
                    raw = w.readframes(n)
            except (wave.Error, EOFError) as e:
                raise DataError(f"{self!r}: not a readable WAV file: {e}", hint="check it with 'warp cat'") from None
            if width == 1:
                a = (np.frombuffer(raw, np.uint8).astype(np.float32) - 128.0) / 128.0
            elif width == 2:
                a = np.frombuffer(raw, "<i2").astype(np.float32) / 32768.0
            elif width == 3:
                b = np.frombuffer(raw, np.uint8).reshape(-1, 3)
                v = (b[:, 0].astype(np.int32) | (b[:, 1].astype(np.int32) << 8) | (b[:, 2].astype(np.int32) << 16))
                a = (np.where(v >= 1 << 23, v - (1 << 24), v)).astype(np.float32) / float(1 << 23)
            else:
                a = np.frombuffer(raw, "<i4").astype(np.float32) / float(1 << 31)
            return (a.reshape(-1, ch) if ch > 1 else a), rate
        try:
            import soundfile
        except ImportError:
            from .errors import missing_dependency

            raise missing_dependency(f"decoding {self.member} (not PCM WAV)", "soundfile") from None
        arr, rate = soundfile.read(io.BytesIO(data), dtype="float32")
        return arr, int(rate)

    def as_array(self) -> np.ndarray:
        return self._decode()[0]

    @property
    def sample_rate(self) -> int:
        data = self.read_bytes()
        if data[:4] == b"RIFF" and data[8:12] == b"WAVE":
            import wave

            try:
                with wave.open(io.BytesIO(data)) as w:
                    return w.getframerate()
            except (wave.Error, EOFError) as e:
                raise DataError(f"{self!r}: not a readable WAV file: {e}") from None
        return self._decode()[1]


REF_TYPES: dict[str, type[FileRef]] = {"file": FileRef, "image": ImageRef, "audio": AudioRef, "video": FileRef}


def ref_factory(ds: Dataset, binding: Binding) -> Callable[[str], FileRef]:
    """member path -> typed ref, sharing one reader (and its index) per binding."""
    reader = ArtifactReader(ds, binding.artifact)
    cls = REF_TYPES.get(binding.ref_type, FileRef)
    return lambda member: cls(reader, member)
