"""Typed references into tar-shard artifacts: ``FileRef``, ``ImageRef``, ``AudioRef``.

Contract
--------
* A table column bound to an artifact (manifest ``bindings``) holds member
  paths; readers turn each value into a ref of the binding's ``ref_type``.
* A ref reads exactly its member's bytes: the artifact's member index
  (``warp-tar-index-1``, ``docs/formats/registry.md``) gives
  ``(shard hash, offset, length)``, and the bytes come from the shard's
  cached copy when the blob cache holds it, else from one ranged GET of
  ``[offset, offset + length)`` (no HEAD: one open handle per shard).
  Archives are never extracted. In ``auto``/``hybrid`` mode the first touch
  of an uncached shard starts a background download of the whole shard into
  the cache (hash-checked, under ``WARP_CACHE_SIZE_GB``); reads never wait
  for it and switch to the cached copy once it is there. ``remote`` mode
  never downloads a shard whole.
* The index blob itself is small: it is fetched once per node, verified
  against its hash and kept in the blob cache in every mode (``remote``
  included: it caches no data shard, but DataLoader workers share the index),
  and parsed once per process (a small memo by index hash).
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

from warpdata.core.atomic import atomic_write_text
from warpdata.core.errors import DataError, MissingInputError, UsageError, missing_dependency
from warpdata.registry.tarpack import ArtifactIndex
from warpdata.storage.blobcache import CacheTooSmallError

if TYPE_CHECKING:
    import numpy as np
    from warpdata.read.source import BlobSource
    from warpdata.registry.manifest import Binding


# remote reads of members: runs of members closer than this are read by one ranged GET
# (tar headers and padding sit between adjacent members), up to this many bytes a GET
COALESCE_GAP = 64 << 10
COALESCE_MAX = 16 << 20
FETCH_THREADS = 2  # background whole-shard fetches at once, per reader
# parsed member indexes by index hash (immutable content), shared by the readers of a process
_INDEXES: dict[str, Any] = {}
_INDEXES_MU = threading.Lock()


class ArtifactReader:
    """Member reads for one artifact of a dataset version.

    In ``auto``/``hybrid`` mode the first read touching a tar shard that is not
    cached starts a background download of the whole shard into the blob cache
    (hash-checked as it lands, under the cache cap); reads go on by ranged GETs
    until it arrives, then pread the cached copy. ``remote`` mode never keeps a
    shard: one ranged GET per member (adjacent members coalesced in
    :meth:`read_many`). Remote reads use one open handle per shard, so the
    object's size (known from the manifest) costs no request per member.
    """

    def __init__(self, ds: BlobSource, name: str) -> None:
        self.ds = ds
        self.name = name
        self.meta = ds.manifest.artifacts[name]
        self._index = None
        self._mu = threading.Lock()
        self._fds: dict[str, int] = {}
        self._handles: dict[str, Any] = {}  # shard -> open remote file (size known: no HEAD per read)
        self._touched: set[str] = set()  # shards whose cache state was looked at (and fetch started)
        self._fetching: set[str] = set()
        self._fetch_q: list[str] = []
        self._fetchers = 0
        self._fetch_stopped: BaseException | None = None
        self.background = ds.cache is not None and ds.mode in ("auto", "hybrid")
        self.stats = {"remote_reads": 0, "local_reads": 0, "shards_fetched": 0}
        self._sizes = {s.hash: s.byte_size for s in self.meta.shards}
        self._refs = {s.hash: s for s in self.meta.shards}

    @property
    def index(self):
        if self._index is None:
            with self._mu:
                if self._index is None:
                    idx = self.meta.index
                    if idx is None:
                        raise DataError(f"artifact {self.name} of {self.ds.id} has no member index",
                                        hint="republish it with 'warp publish' (it writes the index)")
                    parsed = _INDEXES.get(idx.hash)
                    if parsed is None:
                        src = self.ds.remote.url_of(self.ds.blob_key(idx))
                        parsed = ArtifactIndex.from_bytes(self.ds.fetch_meta(idx), source=src)
                        with _INDEXES_MU:
                            while len(_INDEXES) >= 8:
                                _INDEXES.pop(next(iter(_INDEXES)))
                            _INDEXES[idx.hash] = parsed
                    self._index = parsed
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

    # -- where a shard's bytes come from ------------------------------------------
    def _local_fd(self, shard_hash: str) -> int | None:
        fd = self._fds.get(shard_hash)
        if fd is not None:
            if os.fstat(fd).st_nlink:
                return fd
            self._forget_fd(shard_hash, fd)  # evicted from the cache under us: fetch it again
        if shard_hash in self._touched or self.ds.cache is None:
            return None
        with self._mu:
            if shard_hash in self._touched:
                return self._fds.get(shard_hash)
            self._touched.add(shard_hash)
        p = self.ds.cache.get(shard_hash)  # a corrupt copy is dropped here; the fetch below replaces it
        if p is not None:
            return self._open_fd(shard_hash, p)
        if self.background:
            self._start_fetch(shard_hash)
        return None

    def _open_fd(self, shard_hash: str, p: Path | str) -> int:
        fd = os.open(p, os.O_RDONLY)
        with self._mu:
            old = self._fds.get(shard_hash)
            if old is not None:
                os.close(fd)
                return old
            self._fds[shard_hash] = fd
            return fd

    def _forget_fd(self, shard_hash: str, fd: int) -> None:
        with self._mu:
            if self._fds.get(shard_hash) == fd:
                del self._fds[shard_hash]
                os.close(fd)
            self._touched.discard(shard_hash)

    def _start_fetch(self, shard_hash: str) -> None:
        with self._mu:
            if self._fetch_stopped is not None or shard_hash in self._fetching:
                return
            self._fetching.add(shard_hash)
            self._fetch_q.append(shard_hash)
            if self._fetchers >= FETCH_THREADS:
                return
            self._fetchers += 1
        # daemon threads: a half-done background fetch never holds up interpreter exit
        # (the cache writes through a temporary file, so a killed fetch leaves no blob)
        threading.Thread(target=self._fetch_loop, name="warp-shard-fetch", daemon=True).start()

    def _fetch_loop(self) -> None:
        while True:
            with self._mu:
                if not self._fetch_q or self._fetch_stopped is not None:
                    self._fetching.difference_update(self._fetch_q)  # stopped: what is queued never starts
                    self._fetch_q.clear()
                    self._fetchers -= 1
                    return
                h = self._fetch_q.pop(0)
            try:
                p = self.ds.fetch_blob(self._refs[h])  # hash-checked as it lands (BlobCache.fetch)
                self._open_fd(h, p)
                self.stats["shards_fetched"] += 1
            except CacheTooSmallError as e:  # the cap leaves no room: read the rest remotely
                with self._mu:
                    self._fetch_stopped = e
            except Exception as e:  # an optimisation only: reads go on by ranged GETs
                with self._mu:
                    self._fetch_stopped = e
            finally:
                with self._mu:
                    self._fetching.discard(h)

    def wait_fetches(self, timeout: float = 60.0) -> bool:
        """Wait until background shard fetches finished (tests, benchmarks); True if none is left."""
        import time

        end = time.monotonic() + timeout
        while time.monotonic() < end:
            with self._mu:
                if not self._fetching:
                    return True
            time.sleep(0.005)
        return False

    def _handle(self, shard: str):
        f = self._handles.get(shard)
        if f is None:
            ref = self._refs[shard]
            f = self.ds.open_remote(ref) if ref.chunks else \
                self.ds.remote.open(self.ds.blob_key(ref), self._sizes.get(shard))
            with self._mu:
                old = self._handles.setdefault(shard, f)
            if old is not f:
                f.close()
                f = old
        return f

    def _remote_read(self, shard: str, off: int, length: int) -> bytes:
        if self.ds.mode == "local":
            raise MissingInputError(f"shard {shard[:12]} of artifact {self.name} ({self.ds.id}) is not in "
                                    "the cache (local mode)", hint=f"run 'warp warm {self.ds.id}' while online")
        f = self._handle(shard)
        try:
            data = f.read_at(length, off)
        except Exception as e:
            raise self.ds.remote.typed_error(e, self.ds.blob_key(self._refs[shard])) from e
        self.stats["remote_reads"] += 1
        return data

    def _check(self, member: str, data: bytes, length: int) -> bytes:
        if len(data) != length:
            raise DataError(f"member {member!r} of artifact {self.name}: read {len(data)} bytes, index says {length}",
                            hint="the shard is truncated; run 'warp cache verify' or republish")
        return data

    def read(self, member: str) -> bytes:
        """The member's bytes: a local pread of a cached shard, or one ranged GET."""
        shard, off, length = self.locate(member)
        fd = self._local_fd(shard)
        if fd is not None:
            self.stats["local_reads"] += 1
            return self._check(member, os.pread(fd, length, off), length)
        return self._check(member, self._remote_read(shard, off, length), length)

    def read_many(self, members: Iterable[str], threads: int = 16) -> list[bytes]:
        """Several members at once: cached shards by pread, the rest by parallel ranged GETs.

        Members of one shard lying within ``COALESCE_GAP`` of each other are read
        by one GET of up to ``COALESCE_MAX`` bytes and sliced (the GETs release the GIL).
        """
        ms = list(members)
        if len(ms) < 2:
            return [self.read(m) for m in ms]
        out: list[bytes | None] = [None] * len(ms)
        remote: list[tuple[str, int, int, int]] = []  # (shard, offset, length, position)
        for i, m in enumerate(ms):
            shard, off, length = self.locate(m)
            fd = self._local_fd(shard)
            if fd is not None:
                self.stats["local_reads"] += 1
                out[i] = self._check(m, os.pread(fd, length, off), length)
            else:
                remote.append((shard, off, length, i))
        if remote:
            runs = _coalesce(remote)
            if len(runs) == 1:
                self._read_run(runs[0], ms, out)
            else:
                from concurrent.futures import ThreadPoolExecutor

                with ThreadPoolExecutor(max_workers=min(threads, len(runs))) as ex:
                    list(ex.map(lambda r: self._read_run(r, ms, out), runs))
        return out  # type: ignore[return-value]

    def _read_run(self, run: list[tuple[str, int, int, int]], ms: list[str], out: list) -> None:
        shard, start = run[0][0], run[0][1]
        end = max(o + n for _, o, n, _ in run)
        data = self._remote_read(shard, start, end - start)
        view = memoryview(data)
        for _, off, length, i in run:
            out[i] = self._check(ms[i], bytes(view[off - start:off - start + length]), length)

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
        atomic_write_text(pointer, h, fsync=False)
        return p

    def ref(self, member: str, ref_type: str = "file") -> FileRef:
        return REF_TYPES.get(ref_type, FileRef)(self, member)

    def close(self) -> None:
        with self._mu:
            self._fetching.difference_update(self._fetch_q)
            self._fetch_q.clear()
            for fd in self._fds.values():
                os.close(fd)
            self._fds.clear()
            for f in self._handles.values():
                with contextlib.suppress(Exception):
                    f.close()
            self._handles.clear()

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.close()


class FileRef:
    """A member of an artifact: ``open()``, ``read_bytes()``, ``local_path()``."""

    __slots__ = ("_data", "member", "reader")

    def __init__(self, reader: ArtifactReader, member: str, data: bytes | None = None) -> None:
        self.reader = reader
        self.member = member
        self._data = data  # bytes read ahead with the batch (batch_dicts(read_refs=True))

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
        return self._data if self._data is not None else self.reader.read(self.member)

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
    """An audio member: ``as_array(sample_rate=None)`` (float32 in [-1, 1), frames × channels for
    multi-channel), ``sample_rate``.

    PCM WAV decodes with the standard library's ``wave``; any other format needs the optional
    ``soundfile`` package (a typed DependencyError with the pip line otherwise).
    ``as_array(sample_rate=R)`` resamples to R Hz when the member's rate differs (band-limited,
    by the FFT: the spectrum is cut or zero-padded to the new length, as
    ``scipy.signal.resample`` does); at the member's own rate the samples are returned as decoded.
    """

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
            raise missing_dependency(f"decoding {self.member} (not PCM WAV)", "soundfile", extra="audio") from None
        try:
            arr, rate = soundfile.read(io.BytesIO(data), dtype="float32")
        except RuntimeError as e:  # soundfile.LibsndfileError
            raise DataError(f"{self!r}: not a readable audio file: {e}", hint="check it with 'warp cat'") from None
        return arr, int(rate)

    def as_array(self, sample_rate: int | None = None) -> np.ndarray:
        """The samples as float32 (frames, or frames × channels); resampled to ``sample_rate`` Hz
        when given and different from the member's own rate."""
        if sample_rate is not None and (isinstance(sample_rate, bool) or not isinstance(sample_rate, int)
                                        or sample_rate <= 0):
            raise UsageError(f"sample_rate={sample_rate!r} is not a positive number of Hz",
                             hint="e.g. as_array(sample_rate=16000), or leave it out for the member's own rate")
        arr, rate = self._decode()
        if sample_rate is None or sample_rate == rate:
            return arr
        return _resample(arr, rate, sample_rate)

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


def _resample(a: np.ndarray, rate: int, new_rate: int) -> np.ndarray:
    """``a`` (frames, or frames × channels) at ``rate`` Hz, resampled to ``new_rate`` Hz by the FFT:
    the real spectrum is truncated (downsampling: everything above the new Nyquist is dropped,
    so nothing aliases) or zero-padded (upsampling), then transformed back at the new length."""
    import numpy as np

    n = a.shape[0]
    m = int(round(n * new_rate / rate))
    if n == 0 or m == 0:
        return np.zeros((m, *a.shape[1:]), np.float32)
    spec = np.fft.rfft(a.astype(np.float64), axis=0)
    k = min(spec.shape[0], m // 2 + 1)
    out_spec = np.zeros((m // 2 + 1, *a.shape[1:]), np.complex128)
    out_spec[:k] = spec[:k]
    if k == m // 2 + 1 and m % 2 == 0 and m < n:
        out_spec[k - 1] = out_spec[k - 1].real  # the new Nyquist bin of an even length is real
    return (np.fft.irfft(out_spec, n=m, axis=0) * (m / n)).astype(np.float32)


def _coalesce(reads: list[tuple[str, int, int, int]]) -> list[list[tuple[str, int, int, int]]]:
    """Group (shard, offset, length, position) reads into runs one ranged GET can serve."""
    runs: list[list[tuple[str, int, int, int]]] = []
    end = 0
    for r in sorted(reads):
        if runs:
            last = runs[-1]
            if r[0] == last[0][0] and r[1] - end <= COALESCE_GAP and max(end, r[1] + r[2]) - last[0][1] <= COALESCE_MAX:
                last.append(r)
                end = max(end, r[1] + r[2])
                continue
        runs.append([r])
        end = r[1] + r[2]
    return runs


REF_TYPES: dict[str, type[FileRef]] = {"file": FileRef, "image": ImageRef, "audio": AudioRef, "video": FileRef}


def make_refs(ds: BlobSource, binding: Binding, read: bool = False) -> Callable[[list], list]:
    """A column's member paths -> typed refs (None stays None), sharing one reader per binding.

    ``read``: fetch every ref's bytes now, in parallel (:meth:`ArtifactReader.read_many`:
    cached shards by pread, the rest by coalesced ranged GETs on threads).
    """
    reader = ds.artifact(binding.artifact)  # a tar-shard reader, or a registered directory's
    cls = REF_TYPES.get(binding.ref_type, FileRef)

    def make(values: list) -> list:
        if not read:
            return [None if v is None else cls(reader, v) for v in values]
        present = [v for v in values if v is not None]
        data = iter(reader.read_many(present))
        return [None if v is None else cls(reader, v, next(data)) for v in values]

    return make
