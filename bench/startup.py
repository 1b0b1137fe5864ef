"""Start-up cost of `warp` and of a TAB completion, hyperfine-style.

Every `warp` call and every TAB press pays interpreter + import start-up, so
docs/design.md §2 sets a 150 ms wall budget for `warp --help` and completion.
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
import resource
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


def cases(warp: str | None = None) -> list[tuple[str, list[str]]]:
    warp = warp or shutil.which("warp", path=str(BIN))
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


def _children_cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def measure(all_cases: list[tuple[str, list[str]]], runs: int, warmup: int = 3) -> dict[str, tuple[list[float], list[float]]]:
    """Round-robin over the cases, so load from other processes hits every case alike.

    Returns (wall seconds, CPU seconds of the child) per case; CPU time is the
    steadier figure on a shared machine, wall time is what the budget is about.
    """
    times: dict[str, tuple[list[float], list[float]]] = {name: ([], []) for name, _ in all_cases}
    for i in range(warmup + runs):
        for name, argv in all_cases:
            c0, t0 = _children_cpu(), time.perf_counter()
            r = subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=ROOT)
            dt, dc = time.perf_counter() - t0, _children_cpu() - c0
            if r.returncode != 0:
                raise SystemExit(f"{argv!r} failed ({r.returncode}): {r.stderr.decode()[-500:]}")
            if i >= warmup:
                times[name][0].append(dt)
                times[name][1].append(dc)
    return times


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--json", action="store_true", help="print the results as JSON")
    ap.add_argument("--warp", help="the warp executable to time (default: the one beside this Python), "
                                   "e.g. from a non-editable install, which skips the editable-install finder")
    a = ap.parse_args()
    results = []
    for name, (t, cpu) in measure(cases(a.warp), a.runs).items():
        results.append({"case": name, "median_ms": statistics.median(t) * 1e3, "min_ms": min(t) * 1e3,
                        "cpu_median_ms": statistics.median(cpu) * 1e3, "runs": a.runs})
    base = results[0]["median_ms"]
    for r in results:
        r["x_python"] = r["median_ms"] / base
    from _figures import emit, figure  # bench/out/startup.figures.json, for bench/summary.py

    emit("startup", [figure(f"{r['case']}, wall median", r["median_ms"], "ms", target=150, op="<=",
                            note=f"{a.runs} runs, CPU {r['cpu_median_ms']:.0f} ms")
                     for r in results if r["case"] == "warp --help" or r["case"].startswith("TAB:")])
    if a.json:
        json.dump(results, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 0
    w = max(len(r["case"]) for r in results)
    print(f"{'case':<{w}}  {'wall median ms':>14}  {'wall min ms':>11}  {'CPU median ms':>13}  {'x python':>8}")
    for r in results:
        print(f"{r['case']:<{w}}  {r['median_ms']:14.1f}  {r['min_ms']:11.1f}  {r['cpu_median_ms']:13.1f}"
              f"  {r['x_python']:8.2f}")
    print(f"\n{a.runs} runs each after 3 warm-up rounds, cases interleaved; budget for warp --help and TAB: 150 ms wall")
    return 0


if __name__ == "__main__":
    sys.exit(main())
