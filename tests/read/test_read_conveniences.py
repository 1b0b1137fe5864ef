"""Opt-in conveniences of the read API: Table.query, to_pandas / to_polars (guarded), rows(), and
AudioRef.as_array(sample_rate=...) on real WAV files written by the standard library."""

from __future__ import annotations

import importlib.util
import io
import wave

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
import warpdata
from support.datasets import make_rows, publish, write_media
from warpdata.core.errors import DataError, DependencyError, UsageError
from warpdata.read.refs import AudioRef, ImageRef
from warpdata.read.table import MAX_IN_MEMORY_ROWS

HAS_PANDAS = importlib.util.find_spec("pandas") is not None
HAS_POLARS = importlib.util.find_spec("polars") is not None
HAS_SOUNDFILE = importlib.util.find_spec("soundfile") is not None
STEREO = (np.arange(-3000, 3000, 3, dtype=np.int16).reshape(-1, 2))  # 1000 frames × 2 channels


def _wav(frames: np.ndarray, rate: int) -> bytes:
    b = io.BytesIO()
    with wave.open(b, "wb") as w:
        w.setnchannels(1 if frames.ndim == 1 else frames.shape[1])
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(frames.astype("<i2").tobytes())
    return b.getvalue()


@pytest.fixture
def demo(tmp_path, monkeypatch):
    media = tmp_path / "media"
    write_media(media, 6)
    (media / "snd" / "stereo.wav").write_bytes(_wav(STEREO, 22050))
    tone = (np.sin(2 * np.pi * 250 * np.arange(1600) / 8000) * 16000).astype(np.int16)  # 50 whole periods
    (media / "snd" / "tone.wav").write_bytes(_wav(tone, 8000))
    (media / "snd" / "clip.flac").write_bytes(b"fLaC\x00\x00\x00\x22" + bytes(64))  # not WAV, not decodable
    url = str(tmp_path / "store")
    m = publish(url, "ws/demo", {"main": [make_rows(300, 0, image_every=6), make_rows(200, 300, image_every=6)]},
                tmp_path, row_group_size=100, media=media)
    monkeypatch.setenv("WARP_STORE", url)
    monkeypatch.setenv("WARP_CACHE_DIR", str(tmp_path / "cache"))
    return m


def test_query_matches_arrow_compute(demo):
    t = warpdata.dataset("ws/demo").table("main")
    got = t.query("SELECT label, count(*) AS n, sum(x) AS sx FROM main WHERE id % 2 = 0 GROUP BY label ORDER BY label")
    full = pa.concat_tables([make_rows(300, 0, image_every=6), make_rows(200, 300, image_every=6)])
    even = full.filter(pc.equal(pc.bit_wise_and(full["id"], 1), 0))
    want = even.group_by("label").aggregate([("id", "count"), ("x", "sum")]).sort_by("label")
    assert got.column("label").to_pylist() == want.column("label").to_pylist()
    assert got.column("n").to_pylist() == want.column("id_count").to_pylist()
    assert got.column("sx").to_pylist() == want.column("x_sum").to_pylist()
    view = t.select(["id", "label"])
    assert view.query("SELECT * FROM main ORDER BY id DESC LIMIT 1").to_pylist() == [{"id": 499, "label": "label-2"}]
    with pytest.raises(UsageError, match="x") as ei:  # a select() view hides the other columns
        view.query("SELECT x FROM main")
    assert "id, label" in ei.value.hint


def test_rows_yields_dicts_with_typed_refs(demo):
    t = warpdata.dataset("ws/demo").table("main")
    rows = list(t.rows(limit=7, columns=["id", "label", "image", "audio"], batch_size=3))
    assert [r["id"] for r in rows] == list(range(7)) and list(rows[0]) == ["id", "label", "image", "audio"]
    assert isinstance(rows[6]["image"], ImageRef) and rows[6]["image"].member == "img/0000.png"
    assert isinstance(rows[1]["audio"], AudioRef) and rows[1]["audio"].sample_rate == 9000
    assert sum(1 for _ in t.rows()) == 500


def test_to_pandas_and_polars_within_the_guard(demo):
    t = warpdata.dataset("ws/demo").table("main")
    if HAS_PANDAS:
        df = t.to_pandas(limit=10)
        assert list(df["id"]) == list(range(10))
    else:
        with pytest.raises(DependencyError, match="'pandas' package") as ei:
            t.to_pandas(limit=10)
        assert "pip install 'pandas>=2.0'" in ei.value.hint and "[pandas] extra" in ei.value.hint and ei.value.exit_code == 78
    if HAS_POLARS:
        assert t.to_polars(limit=10)["id"].to_list() == list(range(10))
    else:
        with pytest.raises(DependencyError, match="'polars' package") as ei:
            t.to_polars()
        assert "pip install 'polars>=1.0'" in ei.value.hint


def test_more_than_a_million_rows_need_allow_large(tmp_path, monkeypatch):
    n = MAX_IN_MEMORY_ROWS + 1
    url = str(tmp_path / "store")
    publish(url, "ws/huge", {"main": [pa.table({"id": pa.array(np.arange(n, dtype=np.int32))})]}, tmp_path,
            row_group_size=1 << 20)
    monkeypatch.setenv("WARP_STORE", url)
    monkeypatch.setenv("WARP_CACHE_DIR", str(tmp_path / "cache"))
    t = warpdata.dataset("ws/huge").table("main")
    for fn in (t.to_pandas, t.to_polars):
        with pytest.raises(UsageError, match="1,000,001 rows") as ei:
            fn()
        assert "allow_large=True" in ei.value.hint and ei.value.exit_code == 2
    assert t.query("SELECT count(*) AS n, max(id) AS top FROM main").to_pylist() == [{"n": n, "top": n - 1}]
    if HAS_PANDAS:
        assert len(t.to_pandas(allow_large=True)) == n
    else:  # past the guard, the missing package is what stops it
        with pytest.raises(DependencyError, match="pandas"):
            t.to_pandas(allow_large=True)
    with pytest.raises(UsageError, match="limit must be >= 0"):
        t.to_pandas(limit=-1)


def test_audio_as_array_is_sample_exact(demo):
    art = warpdata.dataset("ws/demo").artifact("media")
    stereo = art.ref("snd/stereo.wav", "audio")
    a = stereo.as_array()
    assert a.dtype == np.float32 and a.shape == (1000, 2) and stereo.sample_rate == 22050
    assert np.array_equal(a, STEREO.astype(np.float32) / 32768.0)
    assert np.array_equal(stereo.as_array(sample_rate=22050), a)  # its own rate: as decoded
    mono = art.ref("snd/1.wav", "audio")  # write_media: arange(400) * 2 at 9000 Hz
    assert np.array_equal(mono.as_array(), (np.arange(400, dtype=np.int16) * 2).astype(np.float32) / 32768.0)
    if HAS_SOUNDFILE:
        import soundfile

        ref, rate = soundfile.read(io.BytesIO(stereo.read_bytes()), dtype="float32")
        assert rate == 22050 and np.array_equal(a, ref)


def test_audio_resampling_keeps_the_tone(demo):
    tone = warpdata.dataset("ws/demo").artifact("media").ref("snd/tone.wav", "audio")
    for rate in (16000, 4000, 11025):
        y = tone.as_array(sample_rate=rate)
        n = int(round(1600 * rate / 8000))
        assert y.shape == (n,) and y.dtype == np.float32
        want = np.sin(2 * np.pi * 250 * np.arange(n) / rate) * 16000 / 32768
        assert np.abs(y - want).max() < 2e-3, rate  # int16 quantisation of the source, nothing more
    for bad in (0, -8000, 1.5, "16k", True):
        with pytest.raises(UsageError, match="sample_rate"):
            tone.as_array(sample_rate=bad)


def test_audio_that_is_not_wav_needs_soundfile(demo):
    clip = warpdata.dataset("ws/demo").artifact("media").ref("snd/clip.flac", "audio")
    if HAS_SOUNDFILE:
        with pytest.raises(DataError, match="not a readable audio file"):
            clip.as_array()
        return
    with pytest.raises(DependencyError, match="'soundfile' package") as ei:
        clip.as_array()
    assert "snd/clip.flac" in ei.value.message and "audio" in ei.value.hint  # the [audio] extra


def test_query_sees_every_shard_whatever_the_rank(tmp_path, monkeypatch):
    """Shards are read whole-table (no rank / DataLoader worker split) by query()."""
    url = str(tmp_path / "store")
    parts = [pa.table({"k": pa.array([i] * 10, pa.int64())}) for i in range(5)]
    publish(url, "ws/parts", {"main": parts}, tmp_path)
    monkeypatch.setenv("WARP_STORE", url)
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    t = warpdata.dataset("ws/parts").table("main")
    assert t.query("SELECT count(DISTINCT k) AS n FROM main").to_pylist() == [{"n": 5}]
