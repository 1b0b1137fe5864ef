"""The README's console output, compared with what its commands print, and rewritten by `make readme`.

Under a ``$ command`` line of a ```console block, the lines up to the next ``$`` line are the
output the README shows. ``tests/cli/test_readme.py`` runs the commands and compares those lines
with what each one printed (stdout and stderr as one stream, in the order a terminal shows them)
line by line, exactly, with these conventions (CONTRIBUTING.md, "The README's outputs"):

- ``...`` alone on a line stands for any number of printed lines (none included);
- ``…`` inside a line stands for any text within that line (a date in a directory name, a
  timestamp, the middle of a long path);
- ``≈`` before a number (``[≈0.50s]``, ``≈303.5 img/s``) says it varies from run to run
  (timings, rates): it matches any number, and the one shown is an example;
- two or more blanks then ``# `` end a line with the README's own comment, not printed;
- runs of blanks compare as one blank, and trailing blanks are ignored;
- the run's scratch home directory prints as ``/home/me`` (the README's commands run in ``~``);
- a command with no lines under it shows no output, and its output is not compared;
- the leak report DuckDB's bindings print at exit on some runs (``nanobind: leaked ...``) is
  dropped before comparing (``normalize``).

Everything else — hashes, counts, shapes, sizes, paths — must match. ``make readme`` reruns the
blocks and rewrites the lines that no longer match (``python -m support.readme_outputs write
DIR`` over the outputs the test recorded in ``DIR``): a line whose hash or count moved is
rewritten from the printed one with its ``…``/``≈`` markers and comment kept; a line
added or dropped is added or dropped. Nothing changes when nothing moved.
"""

from __future__ import annotations

import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path

ELIDE = "..."
HOME = "/home/me"
_COMMENT = re.compile(r"[ \t]{2,}#( .*)?$")
_NUMBER = r"-?\d[\d,]*(?:\.\d+)?"
_APPROX = re.compile("≈(" + _NUMBER + ")")
_MARKER = re.compile("(…)|≈(" + _NUMBER + ")")
# digits and hex runs in the README's literal text: what moves when content changes (hashes, counts, sizes)
_MOVABLE = re.compile(r"[0-9a-f]*\d[0-9a-f.,]*")


def split_comment(line: str) -> tuple[str, str]:
    """(the output the line shows, the README's trailing comment with its blanks, or "")."""
    m = _COMMENT.search(line)
    return (line[:m.start()], line[m.start():]) if m else (line, "")


def _blanks(text: str) -> str:
    """Runs of blanks as ``[ \\t]+`` (literal text otherwise)."""
    return r"[ \t]+".join(re.escape(part) for part in re.split(r"[ \t]+", text))


def _relaxed(text: str) -> str:
    """Literal text whose digit and hex runs match any such run (a hash or count that moved)."""
    out, pos = [], 0
    for m in _MOVABLE.finditer(text):
        out += [_blanks(text[pos:m.start()]), r"[0-9a-f.,\-]+"]
        pos = m.end()
    return "".join(out) + _blanks(text[pos:])


def _line_regex(shown: str, *, relaxed: bool) -> re.Pattern[str]:
    """The regex for one shown line (comment removed): markers are groups, in order."""
    lit = _relaxed if relaxed else _blanks
    out, pos = [], 0
    for m in _MARKER.finditer(shown):
        out.append(lit(shown[pos:m.start()]))
        out.append("(.*?)" if m.group(1) else "(" + _NUMBER + ")")
        pos = m.end()
    out.append(lit(shown[pos:]))
    return re.compile("".join(out))


def _clean(line: str) -> str:
    return line.rstrip()


def fits(shown: str, printed: str) -> bool:
    """Whether a shown line (comment removed) stands for this printed line."""
    return _line_regex(_clean(shown), relaxed=False).fullmatch(_clean(printed)) is not None


def refit(shown_line: str, printed: str) -> str | None:
    """The shown line rewritten from ``printed``, its markers and comment kept, if its literal
    text differs from the printed line's only in digit/hex runs (and ``None`` otherwise)."""
    shown, comment = split_comment(shown_line)
    shown, printed = _clean(shown), _clean(printed)
    m = _line_regex(shown, relaxed=True).fullmatch(printed)
    if m is None:
        return None
    out, pos = [], 0
    for g, marker in enumerate(_MARKER.finditer(shown), start=1):
        out.append(printed[pos:m.start(g)])
        out.append(marker.group(0))   # "…", or "≈" and the README's example number, kept
        pos = m.end(g)
    out.append(printed[pos:])
    return "".join(out) + comment


@dataclass
class Step:
    """One step of the alignment: a shown line (``shown`` index) against a printed line."""
    op: str                  # "same", "elide", "refit", "replace", "drop" (shown line not printed), "add"
    shown: int | None
    printed: int | None


def align(shown: list[str], printed: list[str]) -> tuple[int, list[Step]]:
    """The cheapest alignment of the README's lines with the printed ones; cost 0 when they agree."""
    n, m = len(shown), len(printed)
    body = [split_comment(s)[0] for s in shown]
    inf = float("inf")
    cost = [[inf] * (m + 1) for _ in range(n + 1)]
    move: list[list[tuple[str, int, int] | None]] = [[None] * (m + 1) for _ in range(n + 1)]
    cost[n][m] = 0
    for i in range(n, -1, -1):
        for j in range(m, -1, -1):
            if i == n and j == m:
                continue
            options: list[tuple[float, str, int, int]] = []
            if i < n and body[i].strip() == ELIDE:
                options.append((cost[i + 1][j], "elide-end", i + 1, j))
                if j < m:
                    options.append((cost[i][j + 1], "elide", i, j + 1))
            else:
                if i < n and j < m:
                    if fits(body[i], printed[j]):
                        options.append((cost[i + 1][j + 1], "same", i + 1, j + 1))
                    elif refit(shown[i], printed[j]) is not None:
                        options.append((1 + cost[i + 1][j + 1], "refit", i + 1, j + 1))
                    else:
                        options.append((2 + cost[i + 1][j + 1], "replace", i + 1, j + 1))
                if i < n:
                    options.append((2 + cost[i + 1][j], "drop", i + 1, j))
                if j < m:
                    options.append((2 + cost[i][j + 1], "add", i, j + 1))
            best = min(options, key=lambda o: o[0])
            cost[i][j] = best[0]
            move[i][j] = best[1:]
    steps: list[Step] = []
    i = j = 0
    while (i, j) != (n, m):
        op, ni, nj = move[i][j]
        if op == "elide-end":
            steps.append(Step("elide", i, None))
        elif op == "elide":
            pass
        else:
            steps.append(Step(op, i if ni > i else None, j if nj > j else None))
        i, j = ni, nj
    return int(cost[0][0]), steps


def mismatch(shown: list[str], printed: list[str]) -> str | None:
    """``None`` when the README's lines stand for the printed ones, else what differs, line by line."""
    c, steps = align(shown, printed)
    if c == 0:
        return None
    out = []
    for s in steps:
        if s.op in ("same", "elide"):
            continue
        if s.shown is not None:
            out.append(f"  README shows: {shown[s.shown]}")
        if s.printed is not None:
            out.append(f"  printed:      {printed[s.printed]}")
        if s.shown is None:
            out[-1] += "    (not in the README)"
        elif s.printed is None:
            out[-1] += "    (not printed)"
    return "\n".join(out)


def rewrite(shown: list[str], printed: list[str]) -> tuple[list[str], list[str]]:
    """The README's lines brought up to date with the printed ones, and the lines written as printed
    (no marker could be kept: if a part of one varies from run to run, mark it by hand)."""
    c, steps = align(shown, printed)
    if c == 0:
        return list(shown), []
    out, verbatim = [], []
    for s in steps:
        if s.op in ("same", "elide"):
            out.append(shown[s.shown])
        elif s.op == "refit":
            out.append(refit(shown[s.shown], printed[s.printed]))
        elif s.op in ("replace", "add"):
            out.append(printed[s.printed].rstrip())
            verbatim.append(out[-1])
    return out, verbatim


def normalize(text: str, home: str) -> list[str]:
    """Printed text as the README shows it: the scratch home as ``/home/me``, no trailing blank lines,
    and without the leak report DuckDB's bindings (nanobind) print at interpreter exit now and then
    (from ``nanobind: leaked`` to its ``See https://nanobind...`` line): not warp's output, and not
    printed on every run."""
    lines: list[str] = []
    in_leak_report = False
    for ln in text.replace(home, HOME).splitlines():
        if ln.startswith("nanobind: leaked"):
            in_leak_report = True
        if not in_leak_report:
            lines.append(ln.rstrip())
        elif ln.startswith("See https://nanobind.readthedocs.io/"):
            in_leak_report = False
    while lines and not lines[-1]:
        lines.pop()
    return lines


def write(record_dir: Path, readme: Path) -> int:
    """Rewrite ``readme``'s shown output from the records in ``record_dir`` (one JSON file per block run:
    ``[{"line": first shown line's index, "shown": [...], "printed": [...]}, ...]``)."""
    lines = readme.read_text(encoding="utf-8").split("\n")
    records = []
    for f in sorted(record_dir.glob("*.json")):
        records += json.loads(f.read_text(encoding="utf-8"))
    if not records:
        print(f"make readme: no recorded outputs in {record_dir}", file=sys.stderr)
        return 66
    changed = 0
    for r in sorted(records, key=lambda r: r["line"], reverse=True):
        at, shown = r["line"], r["shown"]
        if lines[at:at + len(shown)] != shown:
            print(f"make readme: README.md changed since the run at line {at + 1}; run make readme again",
                  file=sys.stderr)
            return 75
        new, verbatim = rewrite(shown, r["printed"])
        if new != shown:
            changed += 1
            lines[at:at + len(shown)] = new
            print(f"README.md:{at + 1}: `{r['command']}`: {len(shown)} line(s) -> {len(new)}")
            for v in verbatim:
                print(f"    written as printed (mark a varying part with … or ≈ by hand): {v}")
    if changed:
        readme.write_text("\n".join(lines), encoding="utf-8")
    print(f"make readme: {changed} command output(s) rewritten in {readme}")
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 4 or sys.argv[1] != "write":
        print("usage: python -m support.readme_outputs write RECORD_DIR README.md", file=sys.stderr)
        sys.exit(2)
    sys.exit(write(Path(sys.argv[2]), Path(sys.argv[3])))
