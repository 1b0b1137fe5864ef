"""Tiled zstd Zarr v3 writes: warp's CPU backend vs zarr-python vs tensorstore, same run.

    .venv/bin/python bench/tiles_write.py            # 1 GiB u16 volume, ~2-4 minutes here
    .venv/bin/python bench/tiles_write.py --gib 0.25 --runs 2   # quicker
    .venv/bin/python bench/tiles_write.py --checksum-cost       # + warp without chunk CRC-32C
    .venv/bin/python bench/tiles_write.py --dir /var/tmp        # to a disk directory instead of tmpfs
    .venv/bin/python bench/tiles_write.py --stages --gib 0.25   # warp's CPU seconds per stage only

All three write the same u16 volumes (``--volume``): the photo-like one
(smooth structure + noise, ``warpdata.sampledata.volume``, ~2x at zstd 1) and a
noisier one (~1.7x), from memory into the same layout: chunks 64³, shards
64×512×512 (``sharding_indexed``, crc32c index at the end), zstd level 1
without checksum. warp ends every chunk with its CRC-32C (the ``crc32c``
codec, its default), and so does tensorstore here (``--ts-codecs same``, the
default: equal work); ``--ts-codecs index-only`` gives tensorstore its usual
spec instead. zarr-python keeps its defaults. ``--checksum-cost`` adds a warp
run without the chunk CRC to the same round-robin, to measure what the
checksum costs. The ceiling is measured in the same run (before
and after the writers, the faster kept): one thread compressing the
already-tiled volume with zstd level 1, times the cores available (the
design's "physical limit"; zstd is ~88 % of the work). Beside it: the same
compression on every core at once (what the cores really give together), and
warp's CPU per thread role (compression workers, I/O, collector, main) against
zstd alone over the same tiles, a profile that holds under load (CPU seconds,
not wall time).

Reported per writer: best wall time (docs/design.md §9) and
the median of ``--runs``, as GB/s, plus GB per CPU-second (process CPU time,
all threads, median run) — the fairest figure on a shared machine — and the
compression ratio of what it stored. Writers run round-robin so drifting
load from other processes hits each alike; the load average is printed. Output goes to a
tmpfs (``/dev/shm``) by default so the disk's noise stays out of it; ``--dir
/some/disk/dir`` measures the realistic case, where writing the files is part
of the job (warp writes big shards with O_DIRECT there, warp/core/directio.py).
Each writer keeps its default durability: warp fsyncs every object and
tensorstore's file driver syncs its writes (``file_io_sync``), zarr-python
does not sync. Every output is read back and compared with the input once.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time

import numpy as np

CHUNKS = (64, 64, 64)
SHARDS = (64, 512, 512)


def cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def measure(fn, runs: int):
    walls, cpus = [], []
    for _ in range(runs):
        c0, t0 = time.process_time(), time.perf_counter()
        fn()
        walls.append(time.perf_counter() - t0)
        cpus.append(time.process_time() - c0)
    return walls, cpus


def zstd_ceiling(a: np.ndarray, runs: int) -> dict:
    """zstd level 1 over the already-tiled volume: one thread two ways (the faster is the ceiling),
    and every core at once.

    ``bytes``: ``ZstdCompressor.compress`` (a new bytes object per chunk, what
    zarr-python's numcodecs does too); ``prealloc``: libzstd's ZSTD_compress2
    into one reused buffer (zstandard's cffi binding), which skips the
    allocation and page faults of each result — the fastest zstd-1 this
    machine does, so the strictest ceiling. Both give identical frames.
    ``all cores``: ``prealloc`` in one thread per core at once, each over its
    share of the tiles (cffi releases the GIL): what the cores really do
    together, with their shared caches, memory bandwidth and the host's
    scheduling of virtual CPUs, where the ceiling assumes one thread's rate
    times the cores. Its first two values are GB/s of wall time and per CPU-second.
    """
    import zstandard
    from warpdata.formats.tiling import lift_transpose

    tiles = lift_transpose(a, CHUNKS).reshape(-1, int(np.prod(CHUNKS)))
    c = zstandard.ZstdCompressor(level=1, write_checksum=False)
    out: dict = {}

    def via_bytes():
        return sum(len(c.compress(t)) for t in tiles)

    fns = {"bytes": via_bytes}
    try:
        from zstandard import _cffi
    except ImportError:
        _cffi = None
    if _cffi is not None:
        ffi, lib = _cffi.ffi, _cffi.lib
        cap = lib.ZSTD_compressBound(tiles[0].nbytes)

        def compress_share(share) -> int:
            cctx = ffi.gc(lib.ZSTD_createCCtx(), lib.ZSTD_freeCCtx)
            lib.ZSTD_CCtx_setParameter(cctx, lib.ZSTD_c_compressionLevel, 1)
            dst = np.zeros(cap, np.uint8)
            dptr = ffi.from_buffer(dst)
            total = 0
            for t in share:
                n = lib.ZSTD_compress2(cctx, dptr, cap, ffi.from_buffer(t), t.nbytes)
                if lib.ZSTD_isError(n):
                    raise SystemExit("zstd failed")
                total += n
            return total

        fns["prealloc"] = lambda: compress_share(tiles)
        n_cores = cores()
        if n_cores > 1:
            def all_cores():
                sizes = [0] * n_cores

                def one(i: int) -> None:
                    sizes[i] = compress_share(tiles[i::n_cores])

                threads = [threading.Thread(target=one, args=(i,)) for i in range(n_cores)]
                for th in threads:
                    th.start()
                for th in threads:
                    th.join()
                return sum(sizes)

            fns["all cores"] = all_cores
    for name, fn in fns.items():
        best, best_cpu, stored = float("inf"), float("inf"), 0
        for _ in range(runs):
            c0, t0 = time.process_time(), time.perf_counter()
            stored = fn()
            best = min(best, time.perf_counter() - t0)
            best_cpu = min(best_cpu, time.process_time() - c0)
        out[name] = (a.nbytes / best / 1e9, a.nbytes / best_cpu / 1e9, a.nbytes / stored)
    return out


def sha256_rate(a: np.ndarray, runs: int) -> float:
    """One thread's SHA-256 over the volume's compressed chunks, GB of frames per second (best of runs).

    warp's format names every stored object by its SHA-256 (docs/formats/zarr-tiles.md,
    "Content hashes"), so hashing the frames is part of its job and of its ceiling; the
    peers here hash nothing."""
    import hashlib

    import zstandard
    from warpdata.formats.tiling import lift_transpose

    c = zstandard.ZstdCompressor(level=1, write_checksum=False)
    frames = [c.compress(t) for t in lift_transpose(a, CHUNKS).reshape(-1, int(np.prod(CHUNKS)))]
    total = sum(len(f) for f in frames)
    best = float("inf")
    for _ in range(runs):
        t0 = time.perf_counter()
        h = hashlib.sha256()
        for f in frames:
            h.update(f)
        best = min(best, time.perf_counter() - t0)
    return total / best / 1e9


class ThreadRoles:
    """CPU seconds (user + system) per thread role of this process while it runs, from
    ``/proc/self/task/<tid>/stat`` sampled every 20 ms (Linux; elsewhere it records nothing).

    A role is a thread's name without its pool index (``warp-tiles-cpu``: the compression
    workers, ``warp-tiles-io``: SHA-256 and the file writes, ``warp-tiles-collect``: the input's
    CRC-32C and shard assembly, ``MainThread``). A thread's last < 20 ms before it exits can be
    missed: the report shows process CPU minus the roles' sum as "unattributed"."""

    ROLES = ("warp-tiles-cpu", "warp-tiles-io", "warp-tiles-collect", "MainThread")

    def __init__(self) -> None:
        self.cpu: dict[str, float] = {}
        self._tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
        self._stop = threading.Event()

    def _snap(self) -> dict[int, float]:
        out = {}
        try:
            tids = os.listdir("/proc/self/task")
        except OSError:
            return out
        for tid in tids:
            try:
                with open(f"/proc/self/task/{tid}/stat") as f:
                    st = f.read()
            except OSError:
                continue
            fields = st[st.rindex(")") + 2:].split()
            out[int(tid)] = (int(fields[11]) + int(fields[12])) / self._tick
        return out

    def __enter__(self) -> ThreadRoles:
        self._base = self._snap()
        self._last: dict[int, float] = {}
        self._names: dict[int, str] = {}
        self._thread = threading.Thread(target=self._poll, name="bench-roles", daemon=True)
        self._thread.start()
        return self

    def _sample(self) -> None:
        for th in threading.enumerate():
            if th.native_id is not None:
                self._names[th.native_id] = th.name.rsplit("_", 1)[0]
        self._last.update(self._snap())

    def _poll(self) -> None:
        while True:
            self._sample()
            if self._stop.wait(0.02):
                break

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self._sample()
        for tid, t in self._last.items():
            role = self._names.get(tid, "other")
            if role == "bench-roles":
                continue
            role = role if role in self.ROLES else "other"
            self.cpu[role] = self.cpu.get(role, 0.0) + t - self._base.get(tid, 0.0)


class StageTimers:
    """CPU seconds per stage of warp's CPU writer, each stage timed with ``time.thread_time`` in the
    thread that runs it (``--stages``): a profile that holds under load, unlike wall time.

    While it is entered it wraps, and on exit puts back, the functions each stage runs in:

    * compression workers (``kernels/cpu.py``): the whole task, the tile gather (``_tile_source``),
      zstd (``ZSTD_compress2``, called through the cffi binding), the chunk CRC-32C;
    * the collector (``warp/tiles/writer.py``): its loop, the input's CRC-32C, shard assembly;
    * the I/O threads: the whole object (``_put_object``: SHA-256 + put) and the put itself
      (write, fsync, rename: ``storage/zarr_store.py``).

    The wrappers cost ~1-2 µs per call (two clock reads), against ~1-3 ms of zstd per 512 KiB
    chunk; the writer is otherwise the real one, with its real backend, threads and files.
    """

    def __init__(self) -> None:
        self.cpu: dict[str, float] = {}
        self._lock = threading.Lock()
        self._undo: list[tuple[object, str, object]] = []

    def _add(self, key: str, dt: float) -> None:
        with self._lock:
            self.cpu[key] = self.cpu.get(key, 0.0) + dt

    def _timed(self, fn, key: str):
        clock, add = time.thread_time, self._add

        def timed(*args, **kwargs):
            t0 = clock()
            try:
                return fn(*args, **kwargs)
            finally:
                add(key, clock() - t0)

        return timed

    def _patch(self, owner: object, name: str, value: object) -> None:
        self._undo.append((owner, name, owner.__dict__[name] if isinstance(owner, type) else getattr(owner, name)))
        setattr(owner, name, value)

    def __enter__(self) -> StageTimers:
        from types import SimpleNamespace

        from warpdata.formats import crc, zarr_v3
        from warpdata.kernels import cpu
        from warpdata.storage import zarr_store
        from warpdata.tiles import writer

        if cpu._zc is None:
            raise SystemExit("--stages needs zstandard's cffi binding (the CPU backend's direct path)")
        zc = cpu._zc
        lib = SimpleNamespace(**{n: getattr(zc.lib, n) for n in dir(zc.lib) if n.startswith("ZSTD_")})
        lib.ZSTD_compress2 = self._timed(zc.lib.ZSTD_compress2, "workers: zstd")
        native = crc.native_extend()
        self._patch(cpu, "_zc", SimpleNamespace(ffi=zc.ffi, lib=lib))
        self._patch(cpu, "crc32c", SimpleNamespace(
            extend=crc.extend,
            native_extend=lambda: None if native is None else self._timed(native, "workers: chunk CRC-32C")))
        self._patch(cpu.CpuBackend, "_compress_direct",
                    self._timed(cpu.CpuBackend._compress_direct, "workers: task (all of it)"))
        self._patch(cpu.CpuBackend, "_tile_source", self._timed(cpu.CpuBackend._tile_source, "workers: tile gather"))
        self._patch(writer, "crc32c", SimpleNamespace(extend=self._timed(crc.extend, "collector: input CRC-32C")))
        self._patch(zarr_v3, "shard_parts", self._timed(zarr_v3.shard_parts, "collector: shard assembly"))
        self._patch(writer.TileWriter, "_collect_loop",
                    self._timed(writer.TileWriter._collect_loop, "collector: loop (all of it)"))
        self._patch(writer.TileWriter, "_put_object",
                    self._timed(writer.TileWriter._put_object, "io: object (all of it)"))
        self._patch(zarr_store.Store, "put", self._timed(zarr_store.Store.put, "io: put (write, fsync, rename)"))
        return self

    def __exit__(self, *exc) -> None:
        while self._undo:
            owner, name, value = self._undo.pop()
            setattr(owner, name, value)

    def stages(self) -> dict[str, float]:
        """The stages, each once: the "all of it" totals less their timed parts."""
        c = dict(self.cpu)
        g = c.get
        out = {
            "workers: zstd": g("workers: zstd", 0.0),
            "workers: tile gather": g("workers: tile gather", 0.0),
            "workers: chunk CRC-32C": g("workers: chunk CRC-32C", 0.0),
            "workers: Python per task and chunk": g("workers: task (all of it)", 0.0) - g("workers: zstd", 0.0)
            - g("workers: tile gather", 0.0) - g("workers: chunk CRC-32C", 0.0),
            "io: SHA-256 of each object": g("io: object (all of it)", 0.0) - g("io: put (write, fsync, rename)", 0.0),
            "io: put (write, fsync, rename)": g("io: put (write, fsync, rename)", 0.0),
            "collector: input CRC-32C": g("collector: input CRC-32C", 0.0),
            "collector: shard assembly": g("collector: shard assembly", 0.0),
            "collector: the rest (hand-offs, keys, canary)": g("collector: loop (all of it)", 0.0)
            - g("collector: input CRC-32C", 0.0) - g("collector: shard assembly", 0.0),
        }
        return out


def stage_profile(a: np.ndarray, runs: int, where: str, chunks=CHUNKS, shards=SHARDS) -> dict:
    """warp's CPU writer over ``a`` ``runs`` times under :class:`StageTimers`: per stage the median
    CPU seconds, plus ``process`` (the process's CPU, median) and ``other`` (process CPU outside
    the timed stages: the main thread, thread start-up, page faults of fresh buffers)."""
    from warpdata.tiles.writer import TileWriter

    base = tempfile.mkdtemp(prefix="warp-bench-stages-", dir=where)
    samples: list[dict[str, float]] = []
    try:
        for i in range(runs):
            path = os.path.join(base, f"{i}.zarr")
            with StageTimers() as st:
                c0 = time.process_time()
                with TileWriter(path, a.shape, a.dtype, chunks, shards=shards, level=1, backend="cpu") as w:
                    w.write_array(a)
                cpu = time.process_time() - c0
            row = st.stages()
            row["process"] = cpu
            row["other"] = cpu - sum(v for k, v in row.items() if k != "process")
            samples.append(row)
            shutil.rmtree(path, ignore_errors=True)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    return {k: statistics.median(r[k] for r in samples) for k in samples[0]}


def print_stages(label: str, prof: dict, zstd_alone: float, nbytes: int) -> None:
    """The stage table: CPU-s, share of warp's CPU, and each stage against zstd alone over the same tiles."""
    total = prof["process"]
    print(f"\n[{label}] warp CPU writer per stage, median of runs ({nbytes / 2**30:.2f} GiB; zstd alone over the "
          f"same tiles {zstd_alone:.3f} CPU-s; load average {os.getloadavg()[0]:.2f})")
    print(f"{'stage':48} {'CPU-s':>7} {'% warp':>7} {'x zstd alone':>12}")
    for k, v in prof.items():
        if k != "process":
            print(f"{k:48} {v:7.3f} {100 * v / total:6.1f}% {v / zstd_alone:12.3f}")
    print(f"{'warp, the whole process':48} {total:7.3f} {100.0:6.1f}% {total / zstd_alone:12.3f}")


def du(path: str) -> int:
    return sum(os.path.getsize(os.path.join(r, f)) for r, _, fs in os.walk(path) for f in fs
               if f not in ("zarr.json", "manifest.json"))


def warp_writer(a: np.ndarray, path: str, backend: str = "cpu", checksum: bool = True):
    from warpdata.kernels import get_backend
    from warpdata.tiles.writer import TileWriter

    get_backend(backend).close()  # import the backend outside the timing, as the peers' imports are

    def run():
        # warp's default durability (every object fsync'd), as tensorstore's file driver syncs by default
        with TileWriter(path, a.shape, a.dtype, CHUNKS, shards=SHARDS, level=1, backend=backend,
                        checksum=checksum) as w:
            w.write_array(a)

    return run


def zarr_writer(a: np.ndarray, path: str):
    import zarr
    from zarr.codecs import ZstdCodec

    def run():
        z = zarr.create_array(store=path, shape=a.shape, dtype=a.dtype, chunks=CHUNKS, shards=SHARDS,
                              compressors=ZstdCodec(level=1, checksum=False), fill_value=0, zarr_format=3)
        z[...] = a

    return run


def tensorstore_writer(a: np.ndarray, path: str, chunk_crc: bool = True):
    """tensorstore writing the same layout; ``chunk_crc`` gives it warp's codecs exactly (each chunk
    ends with its CRC-32C: ``bytes`` -> ``zstd`` -> ``crc32c`` inside the shard), else only the
    shard index is checksummed (tensorstore's usual spec, less work than warp does)."""
    import tensorstore as ts

    inner = [{"name": "bytes", "configuration": {"endian": "little"}},
             {"name": "zstd", "configuration": {"level": 1, "checksum": False}}]
    if chunk_crc:
        inner.append({"name": "crc32c"})
    spec = {
        "driver": "zarr3",
        "kvstore": {"driver": "file", "path": path},
        "metadata": {
            "shape": list(a.shape), "data_type": "uint16", "fill_value": 0,
            "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": list(SHARDS)}},
            "codecs": [{"name": "sharding_indexed", "configuration": {
                "chunk_shape": list(CHUNKS),
                "codecs": inner,
                "index_codecs": [{"name": "bytes", "configuration": {"endian": "little"}}, {"name": "crc32c"}],
                "index_location": "end"}}],
        },
        "create": True,
        "delete_existing": True,
    }

    def run():
        t = ts.open(spec).result()
        t.write(a).result()

    return run


def noisy_volume(shape, seed: int = 1) -> np.ndarray:
    """The photo-like volume with 6 more bits of sensor noise: ~1.7x at zstd 1 instead of ~2.2x,
    so zstd costs more per byte and the writer's own overhead weighs less."""
    from warpdata.sampledata.volume import photo_like_volume

    a = photo_like_volume(shape, "uint16", seed=seed)
    rng = np.random.default_rng(seed)
    for r0 in range(0, shape[0], 64):  # in slabs: no second full-size temporary
        blk = a[r0:r0 + 64]
        np.add(blk, rng.integers(0, 64, size=blk.shape, dtype=np.uint16), out=blk)
    return a


def check(path: str, a: np.ndarray) -> None:
    import zarr

    z = zarr.open_array(path, mode="r")
    if not np.array_equal(z[...], a):
        raise SystemExit(f"{path}: read-back differs from the input")


def run_volume(a: np.ndarray, label: str, a_) -> tuple[list, float, float, tuple, tuple]:
    """The round-robin of every writer over one volume: (rows, ceiling, format ceiling, zstd on every
    core at once, load0, load1)."""
    n = cores()
    load0 = os.getloadavg()
    ceil = zstd_ceiling(a, max(2, a_.runs - 1))
    base = tempfile.mkdtemp(prefix="warp-bench-tiles-", dir=a_.dir)
    rows = []
    try:
        ts_name = "tensorstore " + _ver("tensorstore")
        writers = [(f"warp TileWriter ({a_.backend})", lambda x, p: warp_writer(x, p, a_.backend)),
                   (ts_name + (" +chunk crc" if a_.ts_codecs == "same" else ""),
                    lambda x, p: tensorstore_writer(x, p, chunk_crc=a_.ts_codecs == "same")),
                   ("zarr-python " + _ver("zarr"), zarr_writer)]
        if a_.checksum_cost:
            writers.append((f"warp no-crc ({a_.backend})", lambda x, p: warp_writer(x, p, a_.backend, checksum=False)))
        paths = [os.path.join(base, f"{i}-" + name.split()[0] + ".zarr") for i, (name, _) in enumerate(writers)]
        fns = [make(a, path) for (_, make), path in zip(writers, paths, strict=True)]
        walls: list[list[float]] = [[] for _ in writers]
        cpus: list[list[float]] = [[] for _ in writers]
        roles: list[list[tuple[float, dict]]] = [[] for _ in writers]
        # round-robin (warp, tensorstore, zarr, warp, ...): load from other sessions hits each alike
        for _ in range(a_.runs):
            for i, fn in enumerate(fns):
                # the previous run's output is deleted outside the timing (freeing ~0.5 GB of
                # pages is not part of writing)
                shutil.rmtree(paths[i], ignore_errors=True)
                with ThreadRoles() as r:
                    w, c = measure(fn, 1)
                walls[i] += w
                cpus[i] += c
                roles[i].append((c[0], r.cpu))
        for i, (name, _) in enumerate(writers):
            stored = du(paths[i])
            check(paths[i], a)
            shutil.rmtree(paths[i], ignore_errors=True)
            gb = a.nbytes / 1e9
            rows.append((name, gb / min(walls[i]), gb / statistics.median(walls[i]), gb / statistics.median(cpus[i]),
                         a.nbytes / stored))
            print(f"[{label}] {name}: walls {[round(w, 2) for w in walls[i]]} s, cpu {[round(c, 2) for c in cpus[i]]} s",
                  file=sys.stderr)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    # the ceiling again after the writers (the machine's load drifts): the faster of all is used
    again = zstd_ceiling(a, 1)
    for k, v in again.items():
        ceil[k] = (max(ceil[k][0], v[0]), max(ceil[k][1], v[1]), v[2])
    load1 = os.getloadavg()
    for k, (one_, cpu_, r_) in ceil.items():
        print(f"[{label}] zstd level 1, {'every core at once' if k == 'all cores' else 'one thread, ' + k}: "
              f"{one_:.3f} GB/s ({cpu_:.3f} GB/CPU-s) at ratio {r_:.3f}", file=sys.stderr)
    single = {k: v for k, v in ceil.items() if k != "all cores"}
    one = max(v[0] for v in single.values())
    one_cpu = max(v[1] for v in single.values())
    measured = ceil.get("all cores", (one * n,))[0]
    ratio = ceil["bytes"][2]
    ceiling = one * n
    sha = sha256_rate(a, 2)
    # zstd, then SHA-256 of what it wrote (1/ratio of the input): the work warp's format needs
    format_ceiling = n / (1 / one + 1 / (ratio * sha))
    print(f"[{label}] SHA-256 of the frames, one thread: {sha:.3f} GB/s; zstd + SHA-256 ceiling "
          f"{format_ceiling:.3f} GB/s on {n} cores ({100 * format_ceiling / ceiling:.1f} % of the zstd ceiling)",
          file=sys.stderr)
    warp = rows[0]
    # warp's CPU by thread role, mean of its runs, against zstd alone over the same tiles
    zstd_cpu = a.nbytes / one_cpu / 1e9
    runs0 = roles[0]
    mean = {k: statistics.fmean(r.get(k, 0.0) for _, r in runs0) for k in (*ThreadRoles.ROLES, "other")}
    total = statistics.fmean(c for c, _ in runs0)
    parts = ", ".join(f"{k} {v:.2f}" for k, v in mean.items())
    print(f"[{label}] warp CPU by thread role, mean of {len(runs0)} runs: {total:.2f} CPU-s = {parts}, unattributed "
          f"{total - sum(mean.values()):.2f}; zstd alone over the same tiles {zstd_cpu:.2f} CPU-s "
          f"(warp = {total / zstd_cpu:.2f}x, its compression workers {mean['warp-tiles-cpu'] / zstd_cpu:.2f}x)",
          file=sys.stderr)
    print(f"\n{label} u16 volume {list(a.shape)} ({a.nbytes / 2**30:.2f} GiB) in {a_.dir}, chunks {list(CHUNKS)}, "
          f"shards {list(SHARDS)}, zstd 1 (ratio {ratio:.3f} over the chunks); {n}-core zstd ceiling {ceiling:.3f} GB/s "
          f"wall ({one:.3f}/core, best of compress() and into a preallocated buffer), {one_cpu:.3f} GB per CPU-second; "
          f"zstd + SHA-256 ceiling {format_ceiling:.3f} GB/s; every core compressing at once {measured:.3f} GB/s "
          f"({100 * measured / ceiling:.1f} % of the ceiling); "
          f"load average {load0[0]:.2f} at start, {load1[0]:.2f} / {load1[1]:.2f} (1/5 min) at end")
    hdr = (f"{'writer':28} {'best GB/s':>9} {'median GB/s':>11} {'GB/CPU-s':>8} {'ratio':>6} {'warp/this med':>13} "
           f"{'warp/this CPU':>13} {'% ceiling':>9} {'% zstd+sha':>10} {'% all cores':>11} {'% zstd/CPU-s':>12}")
    print(hdr)
    print("-" * len(hdr))
    for name, best, med, per_cpu, r in rows:
        print(f"{name:28} {best:9.3f} {med:11.3f} {per_cpu:8.3f} {r:6.3f} {warp[2] / med:13.2f} "
              f"{warp[3] / per_cpu:13.2f} {100 * med / ceiling:8.1f}% {100 * med / format_ceiling:9.1f}% "
              f"{100 * med / measured:10.1f}% {100 * per_cpu / one_cpu:11.1f}%")
    return rows, ceiling, format_ceiling, measured, load0, load1


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--gib", type=float, default=1.0, help="volume size in GiB (default 1)")
    p.add_argument("--runs", type=int, default=3, help="runs per writer (default 3)")
    p.add_argument("--dir", default="/dev/shm" if os.path.isdir("/dev/shm") else None,
                   help="where outputs go (default /dev/shm); a disk directory measures the realistic case")
    p.add_argument("--backend", default="cpu", choices=("cpu", "gpu"),
                   help="warp backend (gpu: on a CUDA machine with cupy + nvidia-nvcomp)")
    p.add_argument("--volume", choices=("photo", "noisy", "both"), default="both",
                   help="photo-like (~2.2x at zstd 1), noisier (~1.7x), or both (default)")
    p.add_argument("--ts-codecs", choices=("same", "index-only"), default="same",
                   help="same: tensorstore also ends every chunk with its CRC-32C, as warp does (default); "
                        "index-only: tensorstore checksums only the shard index")
    p.add_argument("--checksum-cost", action="store_true",
                   help="also run warp without the per-chunk CRC-32C (checksum=False), round-robin with the rest")
    p.add_argument("--stages", action="store_true",
                   help="only warp's CPU seconds per stage (zstd, gather, CRCs, SHA-256, writes, ...), "
                        "each timed in its thread, against zstd alone over the same tiles; no peers")
    a_ = p.parse_args(argv)

    from warpdata.sampledata.volume import photo_like_volume

    z = max(64, int(round(a_.gib * 512 / 64)) * 64)
    shape = (z, 1024, 1024)
    makers = {"photo": lambda: photo_like_volume(shape, "uint16", seed=0), "noisy": lambda: noisy_volume(shape)}
    labels = list(makers) if a_.volume == "both" else [a_.volume]
    figures = []
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from _figures import emit, figure

    load_start = os.getloadavg()[0]
    for label in labels:
        t0 = time.perf_counter()
        a = makers[label]()
        print(f"{label} volume {shape} u16, {a.nbytes / 2**30:.2f} GiB, generated in {time.perf_counter() - t0:.1f} s; "
              f"{cores()} cores", file=sys.stderr)
        if a_.stages:
            ceil = zstd_ceiling(a, 2)
            zstd_alone = a.nbytes / max(v[1] for k, v in ceil.items() if k != "all cores") / 1e9
            print_stages(label, stage_profile(a, a_.runs, a_.dir), zstd_alone, a.nbytes)
            continue
        rows, ceiling, format_ceiling, measured, load0, load1 = run_volume(a, label, a_)
        warp = rows[0]
        note = f"{label}, {a.nbytes / 2**30:.2f} GiB u16, median of {a_.runs}, load {load0[0]:.2f} -> {load1[0]:.2f}"
        figures += [figure(f"tiles write ({label}) vs {name.split()[0]} (median GB/s)", warp[2] / med, "x",
                           target=1.05 if name.startswith("tensorstore") else None, note=note)
                    for name, _best, med, _c, _r in rows[1:3]]
        figures.append(figure(f"tiles write ({label}), warp ({a_.backend}), % of the {cores()}-core zstd ceiling",
                              100 * warp[2] / ceiling, "%", target=90, note=note))
        figures.append(figure(f"tiles write ({label}), warp ({a_.backend}), % of the zstd + SHA-256 ceiling",
                              100 * warp[2] / format_ceiling, "%", note=note))
        figures.append(figure(f"tiles write ({label}), warp ({a_.backend}), % of zstd on every core at once",
                              100 * warp[2] / measured, "%", note=note))
        del a
    if a_.stages:
        return 0  # a profile, not the comparison: no figures
    emit("tiles_write", figures, load_start=load_start)
    return 0


def _ver(dist: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(dist)
    except PackageNotFoundError:
        return "?"


if __name__ == "__main__":
    sys.exit(main())
