"""bench/summary.py: every *.figures.json under bench/out becomes rows of one table, ratios to targets included."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"


@pytest.fixture
def bench_modules(monkeypatch, tmp_path):
    monkeypatch.syspath_prepend(str(BENCH))
    for name in ("_figures", "summary"):
        sys.modules.pop(name, None)
    import _figures
    import summary

    monkeypatch.setattr(_figures, "OUT", tmp_path)
    return _figures, summary


def test_figure_ratios_and_sense(bench_modules):
    f, _s = bench_modules
    up = f.figure("speed", 8.5, "x", target=5)
    assert up["ratio"] == pytest.approx(1.7) and up["met"] is True and up["op"] == ">="
    down = f.figure("rss", 80, "MB", target=64, op="<=")
    assert down["ratio"] == pytest.approx(0.8) and down["met"] is False
    shrink = f.figure("growth", -7.0, "%", target=5, op="<=")  # shrinking meets a growth cap
    assert shrink["met"] is True and shrink["ratio"] == float("inf")
    zero = f.figure("uploads", 0, "", target=0, op="<=")
    assert zero["met"] is True
    none = f.figure("info only", 3.0, "x")
    assert none["ratio"] is None and none["met"] is None and none["op"] is None
    with pytest.raises(ValueError):
        f.figure("bad", 1, op=">")


def test_summary_collects_every_bench_and_flags_misses(bench_modules, tmp_path):
    f, s = bench_modules
    f.emit("alpha", [f.figure("fast enough", 2.0, "x", target=1.5), f.figure("small enough", 70, "MB", target=64, op="<=")],
           plots=["alpha.png", "missing.png"], command="python bench/alpha.py", load_start=1.25)
    f.emit("beta", [f.figure("a number, no target", 123.456, "img/s")])
    (tmp_path / "alpha.png").write_bytes(b"\x89PNG")
    (tmp_path / "features_build.json").write_text("[1, 2]")  # a bench's raw data: not a figures file, ignored
    (tmp_path / "broken.figures.json").write_text("{not json")
    (tmp_path / "other.figures.json").write_text(json.dumps({"format": "something-else/9", "figures": []}))

    assert s.main(["--out", str(tmp_path)]) == 0
    md = (tmp_path / "summary.md").read_text()
    assert "2 benchmark(s); 1 target(s) met, 1 missed" in md
    assert "| alpha | fast enough | 2x | ≥ 1.50x | 1.33 | yes |" in md
    assert "| alpha | small enough | 70 MB | ≤ 64 MB | 0.91 | **no** |" in md
    assert "| beta | a number, no target | 123 img/s | — | — | — |" in md
    assert "`python bench/alpha.py`" in md and "1.25 at the start" in md
    assert "![alpha.png](alpha.png)" in md and "missing.png" not in md  # only plots that exist
    assert "broken.figures.json: not readable JSON" in md and "other.figures.json: not a warp-bench-figures/1" in md
    assert "features_build" not in md
    assert s.main(["--out", str(tmp_path), "--check"]) == 1  # a missed target fails --check


def test_tbl_bench_figures_match_the_format(bench_modules, tmp_path):
    """The TBL bench's plot helper draws from the disk section's facts (matplotlib from the bench extra)."""
    pytest.importorskip("matplotlib")
    import tbl_bench

    facts = {"corpus A": {"copy_s": [1.0, 1.1, 0.9], "warp_s": [1.1, 1.2, 1.0], "mb": 300.0}}
    assert tbl_bench.plot_disk(facts, tmp_path / "disk.png")
    assert (tmp_path / "disk.png").read_bytes()[:4] == b"\x89PNG"
