"""TileWriter contract, multiscale pyramids, the `warp etl` array pipeline, inspect and doctor."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
import zarr
from hypothesis import given
from hypothesis import strategies as st
from warpdata.core.errors import ConfigError, DataError, InternalError
from warpdata.kernels.cpu import CpuBackend
from warpdata.sampledata.volume import generate, photo_like_volume
from warpdata.storage import zarr_store
from warpdata.tiles.pyramid import Downsampler, reduce_block
from warpdata.tiles.writer import TileWriter, auto_shards


class GatedCpuBackend(CpuBackend):
    """The real CPU backend whose ``collect`` waits for a gate: makes 'both slabs busy' deterministic."""

    def __init__(self, **kw):
        super().__init__(**kw)
        self.gate = threading.Event()

    def collect(self, ticket):
        self.gate.wait(30)
        return super().collect(ticket)


def _vol(shape=(10, 12, 9), dtype="uint16"):
    return photo_like_volume(shape, dtype, seed=4)


# -- writer contract ------------------------------------------------------------

def test_write_returns_zero_when_both_slabs_are_busy(tmp_path):
    a = _vol()
    backend = GatedCpuBackend(threads=2)
    w = TileWriter(tmp_path / "a.zarr", a.shape, a.dtype, (4, 4, 4), backend=backend, fsync=False)
    slab = 4 * 12 * 9 * 2
    raw = a.tobytes()
    assert w.write(raw) == 2 * slab  # two slab buffers filled, the third slab's bytes refused
    assert w.write(raw[2 * slab:]) == 0  # never blocks: 0 means "try again later"
    assert w.reserve() is None
    assert not w.wait(timeout=0.05)  # still busy
    backend.gate.set()
    assert w.wait(timeout=30)
    done = 2 * slab
    while done < len(raw):
        n = w.write(raw[done:])
        if n == 0:
            w.wait()
        done += n
    r = w.close()
    assert r.raw_bytes == a.nbytes
    np.testing.assert_array_equal(zarr.open_array(str(tmp_path / "a.zarr"), mode="r")[...], a)


def test_reserve_commit_zero_copy_path(tmp_path):
    a = _vol((7, 5, 6), "float32")
    raw = memoryview(a.tobytes())
    with TileWriter(tmp_path / "a.zarr", a.shape, a.dtype, (3, 4, 4), backend="cpu", fsync=False) as w:
        pos = 0
        while pos < len(raw):
            mv = w.reserve()
            if mv is None:
                w.wait()
                continue
            n = min(len(mv), 17, len(raw) - pos)  # odd-sized pieces across element boundaries
            mv[:n] = raw[pos:pos + n]
            w.commit(n)
            pos += n
    np.testing.assert_array_equal(zarr.open_array(str(tmp_path / "a.zarr"), mode="r")[...], a)


def test_too_many_bytes_is_a_data_error(tmp_path):
    w = TileWriter(tmp_path / "a.zarr", (2, 3), "u8", (2, 2), backend="cpu", fsync=False)
    with pytest.raises(DataError, match="more than the 6 bytes"):
        w.write(b"x" * 7)
    w.abort()


def test_short_input_fails_and_writes_no_metadata(tmp_path):
    w = TileWriter(tmp_path / "a.zarr", (8, 8), "u16", (4, 4), backend="cpu", fsync=False)
    w.write_all(b"\0" * 100)
    with pytest.raises(DataError, match="input ended after 100 of 128 bytes"):
        w.close()
    assert not (tmp_path / "a.zarr" / "zarr.json").exists()
    assert not (tmp_path / "a.zarr" / "manifest.json").exists()


def test_write_after_close(tmp_path):
    w = TileWriter(tmp_path / "a.zarr", (2, 2), "u8", (2, 2), backend="cpu", fsync=False)
    w.write_all(b"abcd")
    w.close()
    with pytest.raises(DataError, match="write after close"):
        w.write(b"e")


def test_errors_in_the_pipeline_surface_in_the_caller(tmp_path):
    class Broken(CpuBackend):
        def collect(self, ticket):
            raise RuntimeError("disk on fire")

    w = TileWriter(tmp_path / "a.zarr", (8, 4), "u8", (2, 4), backend=Broken(), fsync=False)
    with pytest.raises(RuntimeError, match="disk on fire"):
        w.write_all(b"\1" * 32)
        w.close()
    w.abort()


def test_manifest_and_zarr_json_are_written_last(tmp_path):
    a = _vol((6, 6, 6), "uint8")
    with TileWriter(tmp_path / "a.zarr", a.shape, a.dtype, (3, 3, 3), backend="cpu", fsync=False) as w:
        w.write_array(a)
    root = tmp_path / "a.zarr"
    chunks = [p for p in root.rglob("*") if p.is_file() and "c" in p.relative_to(root).parts]
    newest_chunk = max(p.stat().st_mtime_ns for p in chunks)
    assert (root / "zarr.json").stat().st_mtime_ns >= newest_chunk
    m = json.loads((root / "manifest.json").read_text())
    assert m["kind"] == "zarr-array" and m["raw_bytes"] == a.nbytes and m["objects"] == len(chunks)


def test_auto_shards_respect_the_cap_and_the_slowest_tile():
    assert auto_shards((512, 1024, 1024), (64, 64, 64), 2) == (64, 512, 1024)
    assert auto_shards((1, 300, 40), (8, 16, 16), 1) == (1, 16, 48)
    with pytest.raises(ConfigError, match="must equal the tile size"):
        TileWriter("/nonexistent/x", (8, 8), "u8", (4, 4), shards=(8, 8), backend="cpu")


# -- pyramids --------------------------------------------------------------------

@pytest.mark.parametrize("method", ["median", "mean", "nearest"])
def test_pyramid_levels_and_ome_metadata(tmp_path, method):
    a = _vol((13, 22, 17))
    path = tmp_path / "p.zarr"
    with TileWriter(path, a.shape, a.dtype, (5, 8, 8), levels=3, method=method, backend="cpu", fsync=False) as w:
        w.write_array(a)
    g = zarr.open_group(str(path), mode="r")
    ms = g.attrs["ome"]["multiscales"][0]
    assert [d["path"] for d in ms["datasets"]] == ["0", "1", "2"]
    assert ms["datasets"][2]["coordinateTransformations"][0]["scale"] == [4.0, 4.0, 4.0]
    assert [ax["name"] for ax in ms["axes"]] == ["z", "y", "x"] and ms["type"] == method
    level = a
    for i in range(3):
        np.testing.assert_array_equal(g[str(i)][...], level)
        level = reduce_block(level, (2, 2, 2), method)
    assert g["2"].shape == (4, 6, 5)


def test_median_is_an_order_statistic():
    block = np.array([[1, 9], [3, 7]], dtype=np.uint16)
    assert reduce_block(block, (2, 2), "median").tolist() == [[3]]  # lower median of 1,3,7,9
    assert reduce_block(block, (2, 2), "mean").tolist() == [[5]]
    odd = np.array([[1, 2, 100]], dtype=np.uint8)
    assert reduce_block(odd, (1, 2), "median").tolist() == [[1, 100]]


@given(st.integers(1, 9), st.lists(st.integers(1, 5), min_size=1, max_size=6), st.sampled_from(["median", "mean"]))
def test_downsampler_is_independent_of_block_splits(rows, splits, method):
    a = np.random.default_rng(rows).integers(0, 1000, (rows, 5, 3)).astype(np.uint16)
    d = Downsampler(a.shape[1:], a.dtype, (2, 2, 1), method)
    out, pos = [], 0
    for n in splits + [rows]:
        part = a[pos:pos + n]
        pos += len(part)
        r = d.push(part) if len(part) else None
        if r is not None:
            out.append(r)
    last = d.finish()
    if last is not None:
        out.append(last)
    np.testing.assert_array_equal(np.concatenate(out), reduce_block(a, (2, 2, 1), method))


def test_channel_axis_is_not_downsampled(tmp_path):
    a = _vol((3, 8, 10, 12))
    path = tmp_path / "c.zarr"
    with TileWriter(path, a.shape, a.dtype, (1, 4, 4, 4), levels=2, backend="cpu", fsync=False) as w:
        w.write_array(a)
    g = zarr.open_group(str(path), mode="r")
    assert [ax["type"] for ax in g.attrs["ome"]["multiscales"][0]["axes"]] == ["channel", "space", "space", "space"]
    assert g["1"].shape == (3, 4, 5, 6)


# -- etl pipeline + CLI ------------------------------------------------------------------

@pytest.fixture
def volume_dir(tmp_path):
    generate(tmp_path / "v", count=20, seed=1)
    return tmp_path / "v"


def test_etl_builds_inspects_and_reuses(cli, volume_dir):
    cfg = volume_dir / "volume.toml"
    r = cli("etl", "--config", cfg, "--json")
    assert r.code == 0, r.err
    doc = r.json()
    assert doc["kind"] == "zarr-array" and doc["status"] == "built" and doc["levels"] == 3
    assert doc["raw_bytes"] == 20 * 256 * 256 * 2 and doc["ratio"] > 1.2
    out = Path(doc["path"])
    a = np.fromfile(volume_dir / "volume.raw", dtype="<u2").reshape(20, 256, 256)
    g = zarr.open_group(str(out), mode="r")
    np.testing.assert_array_equal(g["0"][...], a)
    assert json.loads((out / "manifest.json").read_text())["kind"] == "zarr-array"
    again = cli("etl", "--config", cfg, "--json")
    assert again.code == 0 and again.json()["status"] == "up-to-date"
    rebuilt = cli("etl", "--config", cfg, "--clear", "-q")
    assert rebuilt.code == 0 and rebuilt.out.strip() == str(out)
    v = cli("inspect", "--verify", str(out), "--json")
    assert v.code == 0 and v.json()["verified"] is True and v.json()["kind"] == "zarr-array"
    leftovers = [p for p in os.listdir(volume_dir) if p.startswith(".warp-tmp-")]
    assert leftovers == []


def test_etl_npy_input_and_unsharded(cli, volume_dir, tmp_path):
    cfg = tmp_path / "npy.toml"
    cfg.write_text(f'[source]\nformat = "npy"\npath = "{volume_dir / "volume.npy"}"\n'
                   '[output]\npath = "out.zarr"\n[tiles]\nchunks = [8, 64, 64]\nshards = "none"\n')
    r = cli("etl", "--config", cfg, "--json")
    assert r.code == 0, r.err
    assert r.json()["shards"] is None
    np.testing.assert_array_equal(zarr.open_array(str(tmp_path / "out.zarr"), mode="r")[...],
                                  np.load(volume_dir / "volume.npy"))


def test_etl_from_stdin_in_a_subprocess(volume_dir, tmp_path):
    raw = (volume_dir / "volume.raw").read_bytes()
    out = tmp_path / "stdin.zarr"
    p = subprocess.run([sys.executable, "-m", "warpdata", "etl", "--config", str(volume_dir / "volume.toml"),
                        "--input", "-", "--output", str(out), "--json"],
                       input=raw, capture_output=True, check=False)
    assert p.returncode == 0, p.stderr.decode()
    doc = json.loads(p.stdout)
    assert doc["status"] == "built" and doc["path"] == str(out)
    a = np.frombuffer(raw, dtype="<u2").reshape(20, 256, 256)
    np.testing.assert_array_equal(zarr.open_group(str(out), mode="r")["0"][...], a)


_WARM_CHECK = """
import sys, time
import numpy as np
from warpdata.tiles.writer import TileWriter
assert "jsonschema" not in sys.modules
a = np.arange(64 * 64, dtype="<u2").reshape(64, 64)
w = TileWriter(sys.argv[1], a.shape, a.dtype, (32, 32), backend="cpu", fsync=False)
deadline = time.monotonic() + 60  # a bound for a loaded machine, not a timing assertion
while "jsonschema" not in sys.modules and time.monotonic() < deadline:
    time.sleep(0.01)
print("loaded before close" if "jsonschema" in sys.modules else "not loaded before close")
w.write_array(a)
print(w.close().manifest["kind"])
"""


def test_the_manifest_check_is_loaded_while_the_array_compresses(tmp_path):
    """close()'s schema check imports jsonschema; the writer loads it at start, off the serial tail."""
    p = subprocess.run([sys.executable, "-c", _WARM_CHECK, str(tmp_path / "a.zarr")], capture_output=True,
                       text=True, check=False)
    assert p.returncode == 0, p.stderr
    assert p.stdout.split("\n")[:2] == ["loaded before close", "zarr-array"]


def _cfg(tmp_path, body: str) -> Path:
    (tmp_path / "in.raw").write_bytes(b"\0" * (4 * 6 * 2))
    p = tmp_path / "bad.toml"
    p.write_text(body)
    return p


@pytest.mark.parametrize(("body", "code", "needle"), [
    ('[source]\nformat = "raw"\npath = "in.raw"\ndtype = "u16"\n[output]\npath = "o"\n[tiles]\nchunks = [2, 2]\n',
     78, "needs [source] shape"),
    ('[source]\nformat = "raw"\npath = "in.raw"\nshape = [4, 6]\ndtype = "u16"\n[output]\npath = "o"\n'
     '[tiles]\nchunks = [2, 2]\nlevle = 3\n', 78, "did you mean 'tiles.level'"),
    ('[source]\nformat = "raw"\npath = "in.raw"\nshape = [4, 7]\ndtype = "u16"\n[output]\npath = "o"\n'
     '[tiles]\nchunks = [2, 2]\n', 65, "holds 48 data bytes but shape [4, 7] uint16 needs 56"),
    ('[source]\nformat = "raw"\npath = "in.raw"\nshape = [4, 6]\ndtype = "u16"\n[output]\npath = "o"\n'
     '[tiles]\nchunks = [2, 2, 2]\n', 78, "has 3 dimensions but the array has 2"),
    ('[source]\nformat = "raw"\npath = "in.raw"\nshape = [4, 6]\ndtype = "i16"\n[output]\npath = "o"\n'
     '[tiles]\nchunks = [2, 2]\n', 78, "unsupported dtype"),
    ('[source]\nformat = "raw"\npath = "missing.raw"\nshape = [4, 6]\ndtype = "u16"\n[output]\npath = "o"\n'
     '[tiles]\nchunks = [2, 2]\n', 66, "does not exist"),
    ('[source]\nformat = "raw"\npath = "in.raw"\nshape = [4, 6]\ndtype = "u16"\n[output]\npath = "o"\n'
     '[tiles]\nchunks = [2, 2]\nshards = [4, 2]\n', 78, "must equal the tile size"),
    ('[source]\nformat = "raw"\npath = "in.raw"\nshape = [4, 6]\ndtype = "u16"\n[output]\npath = "o"\n'
     '[tiles]\nchunks = [2, 2]\nbackend = "tpu"\n', 78, "unknown tile backend"),
])
def test_etl_config_errors(cli, tmp_path, body, code, needle):
    r = cli("etl", "--config", _cfg(tmp_path, body))
    assert r.code == code, (r.code, r.err)
    assert needle in r.err, r.err
    assert not (tmp_path / "o" / "zarr.json").exists()


def test_etl_error_names_the_config_line(cli, tmp_path):
    body = ('[source]\nformat = "raw"\npath = "in.raw"\nshape = [4, 6]\ndtype = "u16"\n[output]\npath = "o"\n'
            '[tiles]\nchunks = [2, 2]\nlevel = 40\n')
    r = cli("etl", "--config", _cfg(tmp_path, body))
    assert r.code == 78 and "bad.toml:10" in r.err and "between 1 and 22" in r.err


def test_fortran_order_npy_is_rejected(cli, tmp_path):
    np.save(tmp_path / "f.npy", np.asfortranarray(np.zeros((4, 6), np.uint16)))
    cfg = tmp_path / "f.toml"
    cfg.write_text('[source]\nformat = "npy"\npath = "f.npy"\n[output]\npath = "o"\n[tiles]\nchunks = [2, 2]\n')
    r = cli("etl", "--config", cfg)
    assert r.code == 65 and "Fortran order" in r.err


def test_doctor_lists_tile_backends(cli):
    r = cli("doctor", "--json")
    doc = json.loads(r.out)  # exactly one JSON document, even on failure
    checks = doc["checks"] if isinstance(doc, dict) and "checks" in doc else doc
    entry = next(c for c in checks if c.get("name", "").endswith("tile-backends"))
    assert entry["status"] in ("PASS", "WARN")
    assert "cpu: available" in entry["detail"] and "gpu:" in entry["detail"]


def test_sample_volume_is_deterministic_and_compressible(tmp_path):
    a = photo_like_volume((16, 64, 64), "uint16", seed=3)
    b = photo_like_volume((16, 64, 64), "uint16", seed=3)
    assert a.tobytes() == b.tobytes() and a.std() > 10  # structure, not a constant
    import zstandard

    ratio = a.nbytes / len(zstandard.ZstdCompressor(level=1).compress(a.tobytes()))
    assert 1.3 < ratio < 6  # photo-like: neither zeros nor pure noise


def test_zero_copy_array_path_equals_streaming_path(tmp_path):
    a = _vol((11, 20, 13))
    with TileWriter(tmp_path / "views.zarr", a.shape, a.dtype, (4, 8, 8), backend="cpu", fsync=False) as w:
        w.write_array(a)  # whole array: the backend compresses views of it
    with TileWriter(tmp_path / "stream.zarr", a.shape, a.dtype, (4, 8, 8), backend="cpu", fsync=False) as w:
        w.write_all(memoryview(a.tobytes()))
    for p in sorted((tmp_path / "views.zarr").rglob("*")):
        if p.is_file():
            assert p.read_bytes() == (tmp_path / "stream.zarr" / p.relative_to(tmp_path / "views.zarr")).read_bytes()


def test_npy_header_must_agree_with_the_config(cli, tmp_path):
    np.save(tmp_path / "a.npy", np.zeros((4, 6), np.uint8))
    cfg = tmp_path / "a.toml"
    cfg.write_text('[source]\nformat = "npy"\npath = "a.npy"\ndtype = "u16"\n[output]\npath = "o"\n'
                   '[tiles]\nchunks = [2, 2]\n')
    r = cli("etl", "--config", cfg)
    assert r.code == 78 and "does not match the .npy header" in r.err


def test_top_level_write_array(tmp_path):
    import warpdata as wd

    a = _vol((5, 9, 7), "float64")
    r = wd.write_array(tmp_path / "w.zarr", a, (2, 4, 4), backend="cpu", fsync=False, levels=2)
    assert r.raw_bytes == a.nbytes and [lv["path"] for lv in r.levels] == ["0", "1"]
    np.testing.assert_array_equal(zarr.open_group(str(tmp_path / "w.zarr"), mode="r")["0"][...], a)


# -- object writes ------------------------------------------------------------------

def test_writev_all_resumes_partial_writes(tmp_path, monkeypatch):

    parts = [bytes([i % 256]) * (i * 7 % 23) for i in range(1500)]  # > IOV_MAX buffers, some empty
    real = os.writev
    # a kernel that writes at most 5 bytes of the first buffer per call
    monkeypatch.setattr(os, "writev", lambda fd, bufs: real(fd, [bytes(bufs[0])[:5]]))
    with open(tmp_path / "a", "wb") as f:
        assert zarr_store.writev_all(f.fileno(), parts) == sum(map(len, parts))
    assert (tmp_path / "a").read_bytes() == b"".join(parts)
    monkeypatch.setattr(os, "writev", lambda fd, bufs: 0)
    with open(tmp_path / "c", "wb") as f, pytest.raises(OSError):  # no progress is an error, not a loop
        zarr_store.writev_all(f.fileno(), [b"abc"])
    monkeypatch.setattr(os, "writev", real)
    with open(tmp_path / "b", "wb") as f:
        zarr_store.writev_all(f.fileno(), [memoryview(p) for p in parts])
    assert (tmp_path / "b").read_bytes() == b"".join(parts)


def test_durable_write_syncs_each_directory_once_before_metadata(tmp_path, monkeypatch):
    from warpdata.core import atomic
    events = []
    real_sync = atomic.fsync_dir
    real_fsync = os.fsync
    monkeypatch.setattr(atomic, "fsync_dir", lambda p: (events.append(("dir", str(p))), real_sync(p)))
    monkeypatch.setattr(os, "fsync", lambda fd: (events.append(("file", os.readlink(f"/proc/self/fd/{fd}"))),
                                                  real_fsync(fd)))
    a = _vol((12, 16, 16), "uint16")
    with TileWriter(tmp_path / "a.zarr", a.shape, a.dtype, (4, 8, 8), shards=None, fsync=True) as w:
        w.write_array(a)
    root = tmp_path / "a.zarr"
    chunk_files = [p for p in root.rglob("*") if p.is_file() and p.name not in ("zarr.json", "manifest.json")]
    assert len(chunk_files) == 3 * 2 * 2
    # the output is built in a temporary sibling (.warp-tmp-<pid>-…-a.zarr) and renamed at the end
    tmp_root = next(e[1] for e in events if e[0] == "dir" and "-a.zarr/" in e[1]).split("-a.zarr/")[0] + "-a.zarr"
    dirs = {e[1] for e in events if e[0] == "dir"}  # (fsync_dir's own os.fsync: not a file)
    file_syncs = [e for e in events if e[0] == "file" and e[1] not in dirs
                  and os.path.basename(e[1]).startswith(".warp-tmp-")]
    assert len(file_syncs) == len(chunk_files) + 2  # every object (and both metadata files) fsync'd once
    dir_syncs = [e[1] for e in events if e[0] == "dir"]
    chunk_dirs = {os.path.join(tmp_root, str(p.parent.relative_to(root))) for p in chunk_files}
    # each chunk directory once, then the root (zarr.json, manifest.json) and the parent (the final rename)
    assert chunk_dirs <= set(dir_syncs) and len(dir_syncs) <= len(chunk_dirs) + 3
    assert dir_syncs[-1] == str(tmp_path)
    # every chunk directory is durable before zarr.json exists
    meta = next(i for i, e in enumerate(events) if e[0] == "file" and e[1].endswith("zarr.json")
                and os.path.basename(e[1]).startswith(".warp-tmp-"))
    assert all(events.index(("dir", d)) < meta for d in chunk_dirs)
    np.testing.assert_array_equal(zarr.open_array(str(root), mode="r")[...], a)


def test_backends_without_ready_signal_are_polled(tmp_path):
    """The GPU backend has no on_ready(): the collector polls ready() and the output is the same."""

    class Polled(CpuBackend):
        def on_ready(self, ticket, callback):
            return False

    a = _vol((21, 16, 12), "uint16")
    outs = []
    for i, backend in enumerate((Polled(threads=2), CpuBackend(threads=2))):
        with TileWriter(tmp_path / f"{i}.zarr", a.shape, a.dtype, (4, 8, 8), backend=backend, fsync=False) as w:
            w.write_all(a.tobytes())  # the streaming path: slab buffers, not views
        outs.append(sorted((p.relative_to(tmp_path / f"{i}.zarr"), p.read_bytes())
                           for p in (tmp_path / f"{i}.zarr").rglob("*") if p.is_file() and p.name != "manifest.json"))
        np.testing.assert_array_equal(zarr.open_array(str(tmp_path / f"{i}.zarr"), mode="r")[...], a)
    assert outs[0] == outs[1]


def test_big_shards_written_with_o_direct_are_the_same_files(tmp_path, monkeypatch):
    """Shards >= 256 KiB go through an aligned bounce buffer with O_DIRECT (WARP_DIRECT_IO=1): the same
    files as buffered writes (WARP_DIRECT_IO=0), and zarr-python and tensorstore read them bit-exact."""
    import tensorstore as ts
    from warpdata.core.directio import wants_direct

    a = photo_like_volume((64, 160, 200), "uint16", seed=3)
    trees = {}
    for mode in ("1", "0"):
        monkeypatch.setenv("WARP_DIRECT_IO", mode)
        assert wants_direct(tmp_path) is (mode == "1")
        path = tmp_path / f"d{mode}.zarr"
        with TileWriter(path, a.shape, a.dtype, (32, 64, 64), shards=(32, 128, 128), backend="cpu",
                        fsync=True) as w:
            w.write_array(a)
        files = {p.relative_to(path).as_posix(): p.read_bytes() for p in path.rglob("*")
                 if p.is_file() and p.name not in ("manifest.json",)}
        assert max(len(v) for v in files.values()) >= zarr_store.DIRECT_MIN_BYTES  # the O_DIRECT path ran
        assert not [p for p in path.rglob(".warp-tmp-*")]
        trees[mode] = files
        np.testing.assert_array_equal(zarr.open_array(path, mode="r")[...], a)
        t = ts.open({"driver": "zarr3", "kvstore": {"driver": "file", "path": str(path)}}).result()
        np.testing.assert_array_equal(t.read().result(), a)
    assert trees["1"] == trees["0"]


class _CorruptingBackend(CpuBackend):
    """The real CPU backend, but one chunk of every slab is compressed from the wrong bytes."""

    def __init__(self, bad_tile: int, **kw):
        super().__init__(**kw)
        self.bad_tile = bad_tile

    def collect(self, ticket):
        frames = list(super().collect(ticket))
        import zstandard
        from warpdata.formats.zarr_v3 import chunk_crc

        t = self.bad_tile if self.bad_tile >= 0 else len(frames) + self.bad_tile
        raw = zstandard.ZstdDecompressor().decompress(bytes(frames[t])[:-4])  # a valid chunk CRC-32C follows
        frame = zstandard.ZstdCompressor(level=1).compress(raw[::-1])
        frames[t] = frame + chunk_crc(frame)
        return frames


@pytest.mark.parametrize("bad_tile", [0, -1])
def test_a_backend_that_compresses_the_wrong_bytes_fails_before_commit(tmp_path, bad_tile):
    a = photo_like_volume((8, 20, 30), "uint16", seed=4)  # edge tiles: the last one is padded
    path = tmp_path / "a.zarr"
    w = TileWriter(path, a.shape, a.dtype, (4, 8, 8), backend=_CorruptingBackend(bad_tile), fsync=False)
    with pytest.raises(InternalError, match="compressed chunk .* of the first slab") as e, w:
        w.write_array(a)
    assert "cpu backend" in e.value.hint
    assert not (path / "zarr.json").exists()


def test_the_first_slab_check_passes_on_the_cpu_backend_with_padding(tmp_path):
    a = photo_like_volume((3, 20, 30), "uint16", seed=5)  # smaller than one tile in dimension 0
    with TileWriter(tmp_path / "b.zarr", a.shape, a.dtype, (4, 8, 8), backend="cpu", fsync=False,
                    fill_value=7) as w:
        w.write_array(a)
    np.testing.assert_array_equal(zarr.open_array(tmp_path / "b.zarr", mode="r")[...], a)


# -- temporary names, gap-free replace, permissions (docs/formats/zarr-tiles.md "Writing and replacing") --

def _tmp_leftovers(parent: Path) -> list[str]:
    return sorted(p for p in os.listdir(parent) if p.startswith(".warp-tmp-"))


def test_an_exception_inside_with_leaves_nothing_visible(tmp_path):
    a = _vol((12, 16, 16))
    path = tmp_path / "a.zarr"
    with pytest.raises(KeyError), TileWriter(path, a.shape, a.dtype, (4, 8, 8), backend="cpu", fsync=False) as w:
        w.write_all(a.tobytes()[: a.nbytes // 2])  # some slabs are compressed and written meanwhile
        raise KeyError("caller failed")
    assert not path.exists()
    assert _tmp_leftovers(tmp_path) == []


def test_a_short_input_inside_with_leaves_nothing_visible(tmp_path):
    a = _vol((12, 16, 16))
    path = tmp_path / "a.zarr"
    with pytest.raises(DataError, match="input ended after"), \
            TileWriter(path, a.shape, a.dtype, (4, 8, 8), backend="cpu", fsync=False, levels=2) as w:
        w.write_all(a.tobytes()[:1000])
    assert not path.exists() and _tmp_leftovers(tmp_path) == []


def test_output_is_invisible_until_close(tmp_path):
    a = _vol((12, 16, 16))
    path = tmp_path / "a.zarr"
    w = TileWriter(path, a.shape, a.dtype, (4, 8, 8), backend="cpu", fsync=False)
    w.write_array(a)
    assert not path.exists() and len(_tmp_leftovers(tmp_path)) == 1
    r = w.close()
    assert r.url == str(path) and _tmp_leftovers(tmp_path) == []
    np.testing.assert_array_equal(zarr.open_array(str(path), mode="r")[...], a)


def test_replacing_an_output_swaps_it_in_one_step(tmp_path):
    from warpdata.core import atomic
    path = tmp_path / "a.zarr"
    old, new = _vol((8, 8, 8)), _vol((12, 16, 16))
    with TileWriter(path, old.shape, old.dtype, (4, 8, 8), backend="cpu", fsync=False) as w:
        w.write_array(old)
    (path / "stale-object").write_bytes(b"x")  # nothing of the old output may survive
    seen = []
    real = atomic.exchange

    def watch(a, b):
        seen.append((os.path.exists(b), os.path.exists(a)))
        ok = real(a, b)
        seen.append((os.path.exists(b), os.path.exists(a)))
        return ok

    atomic.exchange = watch
    try:
        with TileWriter(path, new.shape, new.dtype, (4, 8, 8), backend="cpu", fsync=False) as w:
            w.write_array(new)
    finally:
        atomic.exchange = real
    if not seen or seen[-1] != (True, True):
        pytest.skip("renameat2(RENAME_EXCHANGE) is not supported on this filesystem: the fallback ran")
    assert seen == [(True, True), (True, True)]  # the final name existed before and after the swap
    np.testing.assert_array_equal(zarr.open_array(str(path), mode="r")[...], new)
    assert not (path / "stale-object").exists() and _tmp_leftovers(tmp_path) == []


def test_replace_fallback_without_exchange_still_replaces(tmp_path, monkeypatch):
    from warpdata.core import atomic
    monkeypatch.setattr(atomic, "_renameat2", False)  # an OS / libc without renameat2
    path = tmp_path / "a.zarr"
    for shape in ((8, 8, 8), (12, 16, 16)):
        a = _vol(shape)
        with TileWriter(path, a.shape, a.dtype, (4, 8, 8), backend="cpu", fsync=False) as w:
            w.write_array(a)
    np.testing.assert_array_equal(zarr.open_array(str(path), mode="r")[...], a)
    assert _tmp_leftovers(tmp_path) == []


def test_a_non_array_directory_is_never_replaced(tmp_path):
    precious = tmp_path / "home"
    precious.mkdir()
    (precious / "thesis.tex").write_text("do not delete")
    with pytest.raises(ConfigError, match="not a Zarr array written by warp"):
        TileWriter(precious, (4, 4), "u8", (2, 2), backend="cpu", fsync=False)
    assert (precious / "thesis.tex").read_text() == "do not delete" and _tmp_leftovers(tmp_path) == []


_KILLED_WRITER = r"""
import os, signal, sys
import numpy as np
from warpdata.tiles import replace
from warpdata.tiles.writer import TileWriter

def die(*_a, **_k):
    os.kill(os.getpid(), signal.SIGKILL)  # killed right before the new output is put in place

replace.publish_dir = die
a = np.full((8, 8), 2, np.uint8)
with TileWriter(sys.argv[1], a.shape, a.dtype, (4, 4), backend="cpu", fsync=False) as w:
    w.write_array(a)
"""


def test_a_killed_replace_keeps_the_old_output_and_a_rerun_cleans_up(tmp_path):
    path = tmp_path / "a.zarr"
    old = np.full((8, 8), 1, np.uint8)
    with TileWriter(path, old.shape, old.dtype, (4, 4), backend="cpu", fsync=False) as w:
        w.write_array(old)
    p = subprocess.run([sys.executable, "-c", _KILLED_WRITER, str(path)], capture_output=True, check=False)
    assert p.returncode == -9, p.stderr.decode()
    np.testing.assert_array_equal(zarr.open_array(str(path), mode="r")[...], old)  # never a gap
    left = _tmp_leftovers(tmp_path)
    assert len(left) == 1 and re.match(r"\.warp-tmp-\d+-", left[0])
    past = os.stat(tmp_path / left[0]).st_mtime - 5
    os.utime(tmp_path / left[0], (past, past))  # from a run that ended before this one started
    new = np.full((8, 8), 3, np.uint8)
    with TileWriter(path, new.shape, new.dtype, (4, 4), backend="cpu", fsync=False) as w:
        w.write_array(new)
    np.testing.assert_array_equal(zarr.open_array(str(path), mode="r")[...], new)
    assert _tmp_leftovers(tmp_path) == []


def test_leftovers_of_running_writers_and_other_names_are_kept(tmp_path):
    from warpdata.tiles import replace

    keep = [tmp_path / f".warp-tmp-{os.getpid()}-abcdefgh-a.zarr",  # a live process (this one)
            tmp_path / ".warp-tmp-999999999-abcdefgh-other-a.zarr"]  # another output's
    gone = [tmp_path / ".warp-tmp-999999999-abcdefgh-a.zarr", tmp_path / ".warp-tmp-old-abcdefgh-a.zarr"]
    for d in keep + gone:
        d.mkdir()
        os.utime(d, (1, 1))
    fresh = tmp_path / ".warp-tmp-999999998-abcdefgh-a.zarr"
    fresh.mkdir()  # newer than the run: left alone
    removed = replace.clean_leftovers(tmp_path / "a.zarr", started=100)
    assert sorted(removed) == sorted(str(d) for d in gone)
    assert all(d.exists() for d in keep) and fresh.exists()


@pytest.mark.parametrize("umask", [0o022, 0o002, 0o077])
def test_cli_output_follows_the_umask(cli, tmp_path, umask):
    generate(tmp_path / "v", count=4, seed=1)
    out = tmp_path / "out.zarr"
    old = os.umask(umask)
    try:
        r = cli("etl", "--config", tmp_path / "v" / "volume.toml", "--output", out, "-q")
    finally:
        os.umask(old)
    assert r.code == 0, r.err
    for p in [out, *out.rglob("*")]:
        want = (0o777 if p.is_dir() else 0o666) & ~umask
        assert (p.stat().st_mode & 0o777) == want, (p, oct(p.stat().st_mode & 0o777))


# -- OME-Zarr 0.5 (docs/formats/zarr-tiles.md "Multiscale") ------------------------------

@pytest.mark.parametrize("shape", [(9, 10), (6, 9, 10), (2, 6, 9, 10), (2, 2, 6, 9, 10)])
def test_pyramids_of_2_to_5_dims_are_valid_ome_zarr_0_5(tmp_path, shape):
    ome_image = pytest.importorskip("ome_zarr_models.v05.image")
    a = _vol(shape)
    path = tmp_path / "p.zarr"
    tile = tuple(min(4, s) for s in shape)
    with TileWriter(path, a.shape, a.dtype, tile, levels=2, backend="cpu", fsync=False) as w:
        w.write_array(a)
    assert w.result.ome_zarr["valid"] is True
    ome_image.Image.from_zarr(zarr.open_group(str(path), mode="r"))  # raises on anything invalid


@pytest.mark.parametrize("shape", [(40,), (2, 2, 2, 6, 8, 10)])
def test_pyramids_that_cannot_be_ome_zarr_say_so_and_keep_non_space_axes(cli, tmp_path, shape):
    a = _vol(shape) if len(shape) > 1 else np.arange(40, dtype=np.uint16)
    path = tmp_path / "p.zarr"
    tile = tuple(min(4, s) for s in shape)
    with TileWriter(path, a.shape, a.dtype, tile, levels=2, backend="cpu", fsync=False) as w:
        w.write_array(a)
    r = w.result
    assert r.ome_zarr["valid"] is False and "OME-Zarr 0.5 allows 2 to 5" in r.ome_zarr["reason"]
    g = json.loads((path / "zarr.json").read_text())
    assert "ome" not in g["attributes"] and g["attributes"]["warp"]["not_ome_zarr"]
    want = tuple(-(-s // 2) for s in shape[-3:])
    assert zarr.open_array(str(path / "1"), mode="r").shape == shape[:-3] + want  # only z, y, x halve
    doc = cli("inspect", str(path), "--json").json()
    assert doc["ome_zarr"]["valid"] is False
    assert "not OME-Zarr" in cli("inspect", str(path)).out


def test_verify_says_what_it_checked_and_that_it_passed(cli, tmp_path):
    a = _vol((12, 16, 16))
    path = tmp_path / "p.zarr"
    with TileWriter(path, a.shape, a.dtype, (4, 8, 8), levels=2, backend="cpu", fsync=False) as w:
        w.write_array(a)
    plain = cli("inspect", str(path)).out
    v = cli("inspect", "--verify", str(path))
    assert v.code == 0, v.err
    assert v.out != plain
    for needle in ("levels", "2 of 2 read", "CRC-32C matched", "zarr-python", "PASSED", "input_crc32c"):
        assert needle in v.out, (needle, v.out)
    doc = cli("inspect", "--verify", str(path), "--json").json()
    ver = doc["verification"]
    assert ver["passed"] is True and ver["levels"] == 2 and ver["chunk_crcs"] == ver["chunks"] > 0
    assert ver["metadata"] == 3  # the group and both levels


class _RecordingBackend(CpuBackend):
    """The real CPU backend, noting each object it hands over before its slab is done."""

    def __init__(self, **kw) -> None:
        super().__init__(**kw)
        self.early: list[tuple[int, ...]] = []

    def group_frames(self, ticket, tiles):
        self.early.append(tuple(tiles))
        return super().group_frames(ticket, tiles)


def test_shards_are_written_as_soon_as_their_chunks_are_compressed(tmp_path):
    """After the first slab (whose chunks are checked first) each shard is handed to the I/O pool
    once its own chunks are done, while the rest of its slab compresses; the bytes are those of a
    writer that waits for whole slabs (the compress() fallback, which cannot signal objects)."""
    a = _vol((12, 32, 32))
    early = _RecordingBackend(threads=1)
    with TileWriter(tmp_path / "early.zarr", a.shape, a.dtype, (4, 8, 8), shards=(4, 16, 16), backend=early,
                    fsync=False) as w:
        w.write_array(a)
    whole = CpuBackend(threads=2, direct=False)
    with TileWriter(tmp_path / "whole.zarr", a.shape, a.dtype, (4, 8, 8), shards=(4, 16, 16), backend=whole,
                    fsync=False) as w:
        w.write_all(memoryview(a.tobytes()))
    # slabs 1 and 2, four shards each: with one worker at least the first three of each are handed
    # over before their slab is ready (the last may race the slab's own completion)
    shard0 = tuple(r * 4 + c for r in range(2) for c in range(2))
    assert early.early.count(shard0) == 2 and len(early.early) >= 6
    files = sorted(p.relative_to(tmp_path / "early.zarr") for p in (tmp_path / "early.zarr").rglob("*") if p.is_file())
    assert len(files) == 3 * 4 + 2
    for rel in files:
        assert (tmp_path / "early.zarr" / rel).read_bytes() == (tmp_path / "whole.zarr" / rel).read_bytes(), rel
    np.testing.assert_array_equal(zarr.open_array(str(tmp_path / "early.zarr"), mode="r")[...], a)
