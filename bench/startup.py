"""Start-up cost of `warp` and of a TAB completion, hyperfine-style.

Every `warp` call and every TAB press pays interpreter + import start-up, so
DESIGN.md §2 sets a 150 ms wall budget for `warp --help` and completion.
This runs each command N times (after warm-up runs) as a fresh process and
prints the median and min wall time, and the ratio to `python -c pass`
measured in the same run. Reference rows: the bare interpreter, `import
typer`, Typer's own Rich help for a two-command app (what warp's help cost
before it switched to Click's plain formatter), and bash itself.

    python bench/startup.py [--runs 30] [--json]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable
BIN = Path(PY).parent

RICH_HELP_APP = """
import typer
app = typer.Typer(rich_markup_mode="rich")
@app.command()
def a(x: int = 0): "A command."
@app.command()
def b(): "Another."
app(["--help"])
"""


def _bash_completion(line: str) -> list[str]:
    words = line.split(" ")
    script = (f"source {ROOT / 'completions' / 'warp.bash'}; "
              f"COMP_WORDS=({' '.join(words)}); COMP_CWORD={len(words) - 1}; _warp; echo ${{COMPREPLY[*]}}")
    return ["bash", "--norc", "--noprofile", "-c", script]


def cases() -> list[tuple[str, list[str]]]:
    warp = shutil.which("warp", path=str(BIN))
    warp_cmd = [warp] if warp else [PY, "-m", "warpdata"]
    rows = [
        ("python -c pass", [PY, "-c", "pass"]),
        ("python -c 'import typer'", [PY, "-c", "import typer"]),
        ("typer app, Rich help (reference)", [PY, "-c", RICH_HELP_APP]),
        ("warp --help", [*warp_cmd, "--help"]),
        ("warp --version", [*warp_cmd, "--version"]),
        ("warp doctor --help", [*warp_cmd, "doctor", "--help"]),
        ("warp inspect --help", [*warp_cmd, "inspect", "--help"]),
        ("bash -c : (reference)", ["bash", "--norc", "--noprofile", "-c", ":"]),
    ]
    if (ROOT / "completions" / "warp.bash").exists():
        rows += [("TAB: warp in<TAB> (bash)", _bash_completion("warp in")),
                 ("TAB: warp inspect --<TAB> (bash)", _bash_completion("warp inspect --"))]
    return rows


def measure(all_cases: list[tuple[str, list[str]]], runs: int, warmup: int = 3) -> dict[str, list[float]]:
    """Round-robin over the cases, so load from other processes hits every case alike."""
    times: dict[str, list[float]] = {name: [] for name, _ in all_cases}
    for i in range(warmup + runs):
        for name, argv in all_cases:
            t0 = time.perf_counter()
            r = subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=ROOT)
            dt = time.perf_counter() - t0
            if r.returncode != 0:
                raise SystemExit(f"{argv!r} failed ({r.returncode}): {r.stderr.decode()[-500:]}")
            if i >= warmup:
                times[name].append(dt)
    return times


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--json", action="store_true", help="print the results as JSON")
    a = ap.parse_args()
    results = []
    for name, t in measure(cases(), a.runs).items():
        results.append({"case": name, "median_ms": statistics.median(t) * 1e3, "min_ms": min(t) * 1e3,
                        "runs": a.runs})
    base = results[0]["median_ms"]
    for r in results:
        r["x_python"] = r["median_ms"] / base
    if a.json:
        json.dump(results, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 0
    w = max(len(r["case"]) for r in results)
    print(f"{'case':<{w}}  {'median ms':>9}  {'min ms':>7}  {'x python':>8}")
    for r in results:
        print(f"{r['case']:<{w}}  {r['median_ms']:9.1f}  {r['min_ms']:7.1f}  {r['x_python']:8.2f}")
    print(f"\n{a.runs} runs each after 3 warm-up rounds, cases interleaved; budget for warp --help and TAB: 150 ms wall")
    return 0


if __name__ == "__main__":
    sys.exit(main())
