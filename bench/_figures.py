"""Each benchmark's headline figures, as one small JSON file that ``bench/summary.py`` collects.

A benchmark script calls :func:`emit` once at the end::

    from _figures import emit, figure
    emit("tbl_bench", [figure("conversion vs turboloader", 8.5, "x", target=5)],
         plots=["tbl_disk.png"])

which writes ``bench/out/<bench>.figures.json``. Format (``"format": "warp-bench-figures/1"``)::

    {
      "format": "warp-bench-figures/1",
      "bench": "tbl_bench",                 # the script's name, without .py
      "command": "python bench/tbl_bench.py --runs 3",   # how it was run (sys.argv by default)
      "finished": "2026-11-23T22:40:00+00:00",           # UTC
      "load": {"start": 2.1,                # 1-minute load average when the run began (null if not known)
               "end": [3.4, 3.0, 2.8]},     # 1-, 5- and 15-minute load averages when it ended
      "machine": "2 CPUs, Python 3.11.7",
      "figures": [
        {"name": "conversion, 2 workers, vs turboloader",   # one line of the summary table
         "value": 8.5, "unit": "x",
         "target": 5, "op": ">=",           # the target and its sense (">=" or "<="); null: no target
         "ratio": 1.7,                      # how far past the target, >= 1 when met: value/target
                                            # for ">=", target/value for "<="; null without a target
         "met": true,                       # null without a target
         "note": "median of 3; 2,000 real photos"}
      ],
      "plots": ["tbl_disk.png"]             # files under bench/out/ drawn by the same run
    }

A script without a JSON of this form is simply absent from the summary; any
``*.figures.json`` under ``bench/out/`` is picked up, so a new benchmark only
has to call :func:`emit` (or write the same JSON itself). Figures are plain
numbers: what they mean, and the run conditions, go in ``name`` and ``note``.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import shlex
import sys
from pathlib import Path

OUT = Path(__file__).resolve().parent / "out"
FORMAT = "warp-bench-figures/1"
SUFFIX = ".figures.json"


def figure(name: str, value: float | None, unit: str = "", *, target: float | None = None, op: str = ">=",
           note: str = "") -> dict:
    """One figure; ``ratio``/``met`` follow from ``value``, ``target`` and ``op`` (``>=`` or ``<=``)."""
    if op not in (">=", "<="):
        raise ValueError(f"op must be '>=' or '<=', not {op!r}")
    ratio = met = None
    if target is not None and value is not None:
        if op == ">=":
            ratio = value / target if target else float("inf")
            met = value >= target
        else:
            ratio = target / value if value > 0 else float("inf")  # a growth target met by shrinking
            met = value <= target
    return {"name": name, "value": value, "unit": unit, "target": target, "op": op if target is not None else None,
            "ratio": ratio, "met": met, "note": note}


def emit(bench: str, figures: list[dict], *, plots: list[str] = (), command: str | None = None,
         load_start: float | None = None) -> Path:
    """Write ``bench/out/<bench>.figures.json``; returns its path."""
    OUT.mkdir(parents=True, exist_ok=True)
    load_end = list(os.getloadavg()) if hasattr(os, "getloadavg") else None
    doc = {
        "format": FORMAT,
        "bench": bench,
        "command": command or "python " + " ".join(shlex.quote(a) for a in [os.path.relpath(sys.argv[0])] + sys.argv[1:]),
        "finished": _dt.datetime.now(_dt.UTC).replace(microsecond=0).isoformat(),
        "load": {"start": load_start, "end": load_end},
        "machine": f"{os.cpu_count()} CPUs, Python {sys.version.split()[0]}",
        "figures": figures,
        "plots": list(plots),
    }
    path = OUT / f"{bench}{SUFFIX}"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(doc, indent=1, default=float) + "\n")
    tmp.replace(path)
    return path


def pyplot():
    """matplotlib.pyplot with a file-only backend, or None when matplotlib is not installed."""
    try:
        import matplotlib
    except ImportError:
        return None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt
