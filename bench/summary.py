"""Collect every benchmark's figures into one table: bench/out/summary.md.

    .venv/bin/python bench/summary.py [--out bench/out] [--check]

Reads each ``bench/out/*.figures.json`` (the format is documented in
``bench/_figures.py``) and writes ``summary.md``: one row per figure with
its value, its target, the ratio to the target (>= 1 means met) and whether
it was met, grouped by benchmark with the command, the time and the load
average of the run, then the plots the runs drew. ``--check`` also exits 1
when a figure misses its target (for CI; ``make bench`` does not use it).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _figures import FORMAT, OUT, SUFFIX


def _num(v) -> str:
    if v is None:
        return "—"
    if isinstance(v, bool):
        return str(v)
    if v == float("inf"):
        return "∞"
    a = abs(v)
    if float(v).is_integer():
        return f"{v:,.0f}"
    if a >= 1000:
        return f"{v:,.0f}"
    if a >= 100:
        return f"{v:.0f}"
    if a >= 10:
        return f"{v:.1f}"
    return f"{v:.2f}" if a >= 0.01 or a == 0 else f"{v:.2g}"


def _cell(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def load(out: Path) -> tuple[list[dict], list[str]]:
    """The figure documents under ``out`` (sorted by bench name) and one problem line per unreadable file."""
    docs, problems = [], []
    for p in sorted(out.glob(f"*{SUFFIX}")):
        try:
            doc = json.loads(p.read_text())
        except (OSError, ValueError) as e:
            problems.append(f"{p.name}: not readable JSON ({e})")
            continue
        if not isinstance(doc, dict) or doc.get("format") != FORMAT or not isinstance(doc.get("figures"), list):
            problems.append(f"{p.name}: not a {FORMAT} document")
            continue
        docs.append(doc)
    docs.sort(key=lambda d: str(d.get("bench")))
    return docs, problems


def render(docs: list[dict], problems: list[str], out: Path) -> str:
    met = sum(1 for d in docs for f in d["figures"] if f.get("met") is True)
    missed = [(d["bench"], f) for d in docs for f in d["figures"] if f.get("met") is False]
    lines = ["# Benchmark summary", "",
             f"{len(docs)} benchmark(s); {met} target(s) met, {len(missed)} missed. "
             "Ratio = value / target for a ≥ target, target / value for a ≤ target: ≥ 1 means met. "
             "Each figure comes from the run named under its benchmark (medians as that script states).", ""]
    if missed:
        lines += ["Missed: " + "; ".join(f"{b}: {f['name']}" for b, f in missed), ""]
    lines += ["| benchmark | figure | value | target | ratio | met |", "|---|---|---|---|---|---|"]
    for d in docs:
        for f in d["figures"]:
            unit = f.get("unit") or ""
            sep = "" if unit in ("x", "%", "×") else " "
            value = f"{_num(f.get('value'))}{sep}{unit}".strip()
            target = "—" if f.get("target") is None else f"{'≥' if f.get('op') == '>=' else '≤'} " \
                                                       f"{_num(f['target'])}{sep}{unit}".rstrip()
            ok = {True: "yes", False: "**no**", None: "—"}[f.get("met")]
            name = f["name"] + (f" ({f['note']})" if f.get("note") else "")
            lines.append(f"| {_cell(d['bench'])} | {_cell(name)} | {value} | {target} | {_num(f.get('ratio'))} | {ok} |")
    lines += ["", "## Runs", ""]
    for d in docs:
        ld = d.get("load") if isinstance(d.get("load"), dict) else {}
        end = ld.get("end") or []
        start = "" if ld.get("start") is None else f"{_num(ld['start'])} at the start, "
        lines.append(f"- **{d['bench']}**: `{d.get('command', '?')}`, finished {d.get('finished', '?')}; load average "
                     f"{start}{' / '.join(_num(x) for x in end) or '?'} (1/5/15 min) at the end; {d.get('machine', '')}")
    plots = [(d["bench"], p) for d in docs for p in d.get("plots") or [] if (out / p).exists()]
    if plots:
        lines += ["", "## Plots", ""]
        lines += [f"### {b}: {p}\n\n![{p}]({p})\n" for b, p in plots]
    if problems:
        lines += ["", "## Files not read", ""] + [f"- {p}" for p in problems]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=OUT, help="where the *.figures.json files are (default bench/out)")
    ap.add_argument("--check", action="store_true", help="exit 1 if any figure misses its target")
    a = ap.parse_args(argv)
    docs, problems = load(a.out)
    text = render(docs, problems, a.out)
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "summary.md").write_text(text)
    n = sum(len(d["figures"]) for d in docs)
    tail = f"; {len(problems)} file(s) not read" if problems else ""
    print(f"{a.out / 'summary.md'}: {n} figure(s) from {len(docs)} benchmark(s){tail}")
    if a.check and any(f.get("met") is False for d in docs for f in d["figures"]):
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
