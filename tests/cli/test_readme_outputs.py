"""The comparator of tests/support/readme_outputs.py: the README's shown output against printed output.

tests/cli/test_readme.py runs the README's commands and fails when what one prints differs from
the lines the README shows under it; these tests show that the comparison can fail (a moved
hash, count or path, a line added or dropped is reported with its README line), that the
conventions (``...``, ``…``, ``≈``, comments) admit what they say and nothing more, and that
``make readme``'s rewrite brings the README up to date and leaves it alone when nothing moved.
"""

from __future__ import annotations

import json
import re

import pytest
from support import readme_outputs as ro
from test_readme import README, parse_readme


def _printed_for(shown: list[str]) -> list[str]:
    """What a run would print for these shown lines: markers filled in, elisions and comments gone."""
    out = []
    for line in shown:
        body = ro.split_comment(line)[0].rstrip()
        if body.strip() == ro.ELIDE:
            continue
        body = body.replace("…", "X")
        out.append(re.sub("≈(" + ro._NUMBER + ")", lambda m: "9" + m.group(1), body))
    return out


def _readme_commands():
    return [c for b in parse_readme(README.read_text(encoding="utf-8")) if b.lang == "console"
            for c in b.commands if c.shown]


def test_every_readme_output_admits_what_it_stands_for():
    """Each command's shown lines match a printout that differs from them only where a marker says so."""
    cmds = _readme_commands()
    assert len(cmds) >= 30
    for c in cmds:
        assert ro.mismatch(c.shown, _printed_for(c.shown)) is None, c.text
        assert ro.rewrite(c.shown, _printed_for(c.shown)) == (c.shown, []), c.text


def test_a_moved_hash_in_the_readme_fails_with_its_line_and_rewrite_fixes_it():
    """Mutate every 12- or 64-hex-digit hash the README shows in turn: each change is reported naming the
    README line, and the rewrite puts the printed hash there, markers and comments kept."""
    mutated = 0
    for c in _readme_commands():
        printed = _printed_for(c.shown)
        shown_idx = [i for i, s in enumerate(c.shown) if ro.split_comment(s)[0].strip() != ro.ELIDE]
        for k, line in enumerate(printed):
            m = re.search(r"\b[0-9a-f]{12}(?:[0-9a-f]{52})?\b", line)
            if not m or not re.search(r"\d", m.group(0)):
                continue
            new_hash = "".join("0123456789abcdef"[(int(ch, 16) + 1) % 16] for ch in m.group(0))
            changed = printed[:k] + [line[:m.start()] + new_hash + line[m.end():]] + printed[k + 1:]
            report = ro.mismatch(c.shown, changed)
            assert report is not None, (c.text, line)
            assert f"README shows: {c.shown[shown_idx[k]]}" in report
            assert new_hash in report
            new, verbatim = ro.rewrite(c.shown, changed)
            assert verbatim == [] and ro.mismatch(new, changed) is None, (c.text, new)
            assert new[shown_idx[k]] == c.shown[shown_idx[k]].replace(m.group(0), new_hash)
            assert [n for i, n in enumerate(new) if i != shown_idx[k]] == \
                   [s for i, s in enumerate(c.shown) if i != shown_idx[k]]
            mutated += 1
    assert mutated >= 15


SHOWN = [
    "published vision/coco@73d37874120b to /home/me/demo-out/store: uploaded 25 of 25 blobs; [≈0.28s]",
    "73d37874120b752ae6f9875b2576c2e33ce4153260daece101b561f75d2988bc",
    "...",
    "tensor-warehouse built: /home/me/demo-out/warehouse/v…-ad8ac1f29a2e    # v, the day, the version",
    "samples      60",
]
PRINTED = [
    "published vision/coco@73d37874120b to /home/me/demo-out/store: uploaded 25 of 25 blobs; [1.93s]",
    "73d37874120b752ae6f9875b2576c2e33ce4153260daece101b561f75d2988bc",
    "step 1",
    "step 2",
    "tensor-warehouse built: /home/me/demo-out/warehouse/v20261207-ad8ac1f29a2e",
    "samples      60",
]


def test_the_conventions_admit_timings_dates_elisions_and_blank_runs():
    assert ro.mismatch(SHOWN, PRINTED) is None
    assert ro.mismatch(SHOWN, PRINTED[:2] + PRINTED[4:]) is None          # "..." stands for none too
    assert ro.mismatch(SHOWN, PRINTED[:5] + ["samples 60   "]) is None    # runs of blanks, trailing blanks
    assert ro.fits("rate ≈303.5 img/s", "rate 1,210.75 img/s")
    assert not ro.fits("rate ≈303.5 img/s", "rate fast img/s")              # ≈ is a number, nothing else
    assert not ro.fits("v…-ad8ac1f29a2e", "v20261207-ad8ac1f29a2f")         # … is not the whole line


@pytest.mark.parametrize(("k", "line"), [
    (0, "published vision/coco@73d37874120b to /home/me/demo-out/store: uploaded 24 of 25 blobs; [1.93s]"),
    (5, "samples      61"),
    (4, "tensor-warehouse built: /home/me/demo-out/warehouse/v20261207-ad8ac1f29a2f"),
    (4, "tensor-warehouse built: /tmp/pytest-7/home/demo-out/warehouse/v20261207-ad8ac1f29a2e"),
])
def test_a_changed_count_or_path_is_reported(k, line):
    printed = PRINTED[:k] + [line] + PRINTED[k + 1:]
    report = ro.mismatch(SHOWN, printed)
    assert report is not None and f"printed:      {line}" in report


def test_a_line_added_or_dropped_is_reported_and_rewritten():
    added = PRINTED + ["warning: aggregate: invalid_fraction = 0.0469 exceeds warn limit 0.0"]
    report = ro.mismatch(SHOWN, added)
    assert "(not in the README)" in report and "invalid_fraction" in report
    new, verbatim = ro.rewrite(SHOWN, added)
    assert new == SHOWN + [added[-1]] and verbatim == [added[-1]]
    dropped = PRINTED[:5]
    report = ro.mismatch(SHOWN, dropped)
    assert report == "  README shows: samples      60    (not printed)"
    assert ro.rewrite(SHOWN, dropped) == (SHOWN[:4], [])


def test_rewrite_keeps_markers_examples_and_comments():
    printed = [p.replace("73d37874120b", "e74eb357d4aa").replace("ad8ac1f29a2e", "0123456789ab") for p in PRINTED]
    new, verbatim = ro.rewrite(SHOWN, printed)
    assert verbatim == []
    assert new == [
        "published vision/coco@e74eb357d4aa to /home/me/demo-out/store: uploaded 25 of 25 blobs; [≈0.28s]",
        "e74eb357d4aa752ae6f9875b2576c2e33ce4153260daece101b561f75d2988bc",
        "...",
        "tensor-warehouse built: /home/me/demo-out/warehouse/v…-0123456789ab    # v, the day, the version",
        "samples      60",
    ]


def test_normalize_names_home_and_drops_the_bindings_leak_report():
    text = ("/tmp/x/home/demo-out/store\n"
            "nanobind: leaked 29 instances!\n - leaked instance 0x55 of type \"_duckdb.X\"\n"
            "nanobind: this is likely caused by a reference counting issue in the binding code.\n"
            "See https://nanobind.readthedocs.io/en/latest/refleaks.html\n"
            "done  \n\n")
    assert ro.normalize(text, "/tmp/x/home") == ["/home/me/demo-out/store", "done"]


def test_write_rewrites_the_recorded_lines_in_place(tmp_path):
    """`make readme`'s last step on a copy of the README: the moved hash is rewritten at its line, and a
    second write over records that now agree changes nothing (byte for byte)."""
    copy = tmp_path / "README.md"
    copy.write_bytes(README.read_bytes())
    cmd = next(c for c in _readme_commands() if re.fullmatch(r"[0-9a-f]{64}", c.shown[-1]))
    old = cmd.shown[-1]
    new_hash = old[::-1]
    printed = _printed_for(cmd.shown)[:-1] + [new_hash]
    records = tmp_path / "rec"
    records.mkdir()
    (records / "00.json").write_text(json.dumps([{"command": cmd.text, "line": cmd.line, "shown": cmd.shown,
                                                  "printed": printed}]))
    assert ro.write(records, copy) == 0
    before, after = README.read_text("utf-8").split("\n"), copy.read_text("utf-8").split("\n")
    at = cmd.line + len(cmd.shown) - 1
    assert before[at] == old and after[at] == new_hash
    assert before[:at] + before[at + 1:] == after[:at] + after[at + 1:]
    (records / "00.json").write_text(json.dumps([{"command": cmd.text, "line": cmd.line,
                                                  "shown": cmd.shown[:-1] + [new_hash], "printed": printed}]))
    written = copy.read_bytes()
    assert ro.write(records, copy) == 0 and copy.read_bytes() == written
    # a README edited since the run is refused, not patched at the wrong line
    copy.write_text("\n" + copy.read_text("utf-8"), encoding="utf-8")
    assert ro.write(records, copy) == 75
