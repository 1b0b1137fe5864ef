"""The README's shell examples run as written, top to bottom, and print what it shows.

Every ```console block (commands are the lines starting with ``$ ``; a line
ending in ``\\`` continues on the next; the other lines are the output the
README shows) and the ```sh block of "The flow in five minutes" (every line
not blank and not a comment is a command) is run as one ``bash`` script, in
its own fresh scratch directory, its commands in order (``cd`` and
``export`` carry over from one command to the next, as in a terminal),
stdin from /dev/null and ``set -o pipefail``. The environment points
``HOME``, ``WARP_STORE`` and ``WARP_CACHE_DIR`` into the scratch directory
(no ``XDG_*``, ``WARP_*`` or ``AWS_*`` variable leaks in), sets ``PYTHONUNBUFFERED``
and puts this venv's ``bin`` first on ``PATH``. The scratch directory holds a link
``examples`` to the repository's ``examples/``, since the README's commands
run from the root of a clone.

S3: ``export WARP_STORE=s3://team-datasets/...`` runs against the real moto
S3 server of ``tests/support/s3fixtures.py`` (``s3`` fixture): the bucket name
``team-datasets`` is rewritten to the fixture's fresh bucket and the
fixture's endpoint and dummy credentials are added to the environment;
nothing else in a block is rewritten.

Checks, per command: the exit status (0 unless ``EXIT_CODES`` says
otherwise), its whole output (below, "Output"), and for the key lines listed
in ``EXPECTED`` that the README shows them under that command *and* that
the command prints them (stdout or stderr; runs of blanks compared as one
space): an elision (``...``) may not hide those. Commands that cannot run on every machine are listed in ``SKIPS``
with the condition and the reason. The other ```sh blocks are not run:
"Install" / "Set up" / "Developing" install packages or run make targets,
"warp inspect" uses placeholder paths, and "warp doctor" exits 1 by design
on machines missing optional backends (tested in tests/doctor/test_doctor.py).

Python: every ```python block runs too, as written, in a ``python`` subprocess
in the scratch directory of its section, after that section's commands (the
README's own set-up: the dataset or file the snippet opens is the one those
commands made); a block whose set-up is another section's runs after that
section's commands (``PY_SETUP``). It must exit 0, and the comment beside a
``print(...)`` call is a line it prints. Blocks that cannot run as
written (placeholders for the reader's own model or camera, distributed ranks) are
listed in ``PY_SKIPS`` with the reason.

Output: what each command prints (stdout and stderr as one stream, in order) must be the
lines the README shows under it, exactly but for the conventions of
``tests/support/readme_outputs.py`` (``...`` lines, ``…`` and ``≈`` markers, comments);
``make readme`` rewrites the lines that moved. For that the commands run in the scratch
home (``~``, printed as ``/home/me``), where ``WARP_STORE`` and ``WARP_CACHE_DIR`` are
warp's defaults under it.
"""

from __future__ import annotations

import importlib.util
import io
import json
import os
import re
import shutil
import subprocess
import sys
import wave
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from support import readme_outputs

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
FLOW = "The flow in five minutes"


@dataclass
class Command:
    text: str                                        # as bash gets it (continuations kept)
    shown: list[str] = field(default_factory=list)   # output lines the README shows under it
    line: int = -1                                   # README.md's line index of the first of them


@dataclass
class Block:
    section: str
    lang: str
    commands: list[Command]


def parse_readme(text: str) -> list[Block]:
    """The runnable blocks: every ```console block, and the ```sh block(s) of the flow section."""
    blocks: list[Block] = []
    section = ""
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("#") and not line.startswith("#!"):
            section = line.lstrip("#").strip()
        m = re.fullmatch(r"```(\w+)", line)
        if not m:
            i += 1
            continue
        lang, body = m.group(1), []
        i += 1
        while lines[i] != "```":
            body.append(lines[i])
            i += 1
        i += 1
        if lang == "console" or (lang == "sh" and section == FLOW):
            blocks.append(Block(section, lang, _commands(lang, body, i - 1 - len(body))))
        elif lang == "python":
            blocks.append(Block(section, lang, [Command("\n".join(body))]))
    return blocks


def _commands(lang: str, body: list[str], first: int) -> list[Command]:
    """The commands of a block whose first line is README.md's line ``first`` (an index)."""
    cmds: list[Command] = []
    k = 0
    while k < len(body):
        line = body[k]
        k += 1
        if lang == "console" and not line.startswith("$ "):
            if cmds:
                cmds[-1].shown.append(line)
            continue
        if lang == "sh" and (not line.strip() or line.lstrip().startswith("#")):
            continue
        parts = [line[2:] if lang == "console" else line]
        while parts[-1].rstrip().endswith("\\") and k < len(body):
            parts.append(body[k])
            k += 1
        cmds.append(Command("\n".join(parts), line=first + k))
    return cmds


_PARSED = parse_readme(README.read_text(encoding="utf-8"))
BLOCKS = [b for b in _PARSED if b.lang != "python"]
BY_SECTION = {b.section: b for b in BLOCKS}
# the ```python blocks, by the section (heading) they are under; a heading may hold several
PY_BLOCKS = [b for b in _PARSED if b.lang == "python"]

# Sections whose blocks must be run (a block added, dropped or renamed shows up here).
SECTIONS = [
    FLOW,
    "warp etl (detection labels → tensor warehouse)",
    "warp etl (captioned media → feature cache for pretraining)",
    "warp etl (arrays → tiled, compressed Zarr v3)",
    "warp tar-to-tbl (WebDataset tar → one TBL v2 file)",
    "warp publish (a dataset version to the store)",
    "warp ls / stream / cat / warm / cache / init (reading published datasets)",
    "warp info / schema / head (looking at a dataset)",
    "warp ingest / embeddings (raw folders → a published dataset)",
    "warp register / unregister (datasets read in place)",
    "warp why / diff / card (lineage: where a sample came from, what changed)",
]

# (section, the command (or a regex only it matches), stable text the README shows under it and the command prints)
EXPECTED: list[tuple[str, str, str]] = [
    (SECTIONS[10], 'warp why "$WH" 2', 'annotation_ids ["11"]'),
    (SECTIONS[10], 'warp why "$WH" 2', "label:        file annotations.json"),
    (SECTIONS[10], "warp diff vision/coco", "- samples images/img_00005.jpg"),
    (SECTIONS[10], "warp diff vision/coco", "samples  key  0      1        4        changed"),
    (SECTIONS[9], "warp stream demo/local", '{"id":1,"label":"cat","image":"img/0001.png"}'),
    (SECTIONS[9], "warp doctor demo/local", "PASS dataset/refs 8 member(s) of media via main.image"),
    (SECTIONS[9], "warp unregister demo/local", "its files were left in place"),
    (SECTIONS[1], "warp etl --config demo-out/coco/transform.toml", "skip:truncated 2"),
    (SECTIONS[1], "warp etl --config demo-out/coco/transform.toml", "samples 60"),
    (SECTIONS[1], "warp etl --config demo-out/coco/transform.toml", "quarantined 1 missing, 3 invalid"),
    (SECTIONS[1], "warp etl --config demo-out/coco/transform.toml", "validation warn"),
    (SECTIONS[1], r"--json \| jq",
     '{"status":"up-to-date","samples":60,"shards":16,"verdict":"warn"}'),
    (SECTIONS[1], "python examples/train_detector.py", "trained 20 steps"),
    (SECTIONS[2], "cd demo-cap && warp etl", "records 49"),
    (SECTIONS[2], "cd demo-cap && warp etl", "shards 5, at most 16 records each"),
    (SECTIONS[2], "cd demo-cap && warp etl",
     "quarantined 5 {'decode-error': 1, 'empty-caption': 1, 'missing-caption': 1, 'truncated': 1, "
     "'unsupported-format': 1}"),
    (SECTIONS[2], r"--json \| jq", '{"status":"up-to-date","records":49,"shards":5}'),
    (SECTIONS[3], "cd demo-out/volume && warp etl", "shape [64, 256, 256] uint16"),
    (SECTIONS[3], "cd demo-out/volume && warp etl", "chunks / shards [32, 64, 64] / [32, 256, 256]"),
    (SECTIONS[3], "cd demo-out/volume && warp etl", "levels 3"),
    (SECTIONS[4], "warp tar-to-tbl shard.tar", "samples 64"),
    (SECTIONS[4], "warp tar-to-tbl shard.tar", "sidecars 192"),
    (SECTIONS[4], "warp tar-to-tbl shard.tar", "formats jpeg 64"),
    (SECTIONS[4], "warp tar-to-tbl shard.tar", "verified yes"),
    (SECTIONS[5], "images:image$", "uploaded 4 of 4 blobs"),
    (SECTIONS[5], r"--json \| jq", '{"blobs_uploaded":0,"already_published":true}'),
    (SECTIONS[5], "warp ls", "files,quarantine,reasons,samples,sources,summary 158"),
    (SECTIONS[5], "warp stream vision/coco", '{"key":"images/img_00000.jpg","n_boxes":5,"class_ids":[2,2,2,1,2]}'),
    (SECTIONS[5], "warp stream vision/coco", '{"key":"images/img_00002.jpg","n_boxes":3,"class_ids":[1,3,2]}'),
    (SECTIONS[6], "warp ls", "main 500"),
    (SECTIONS[6], "warp stream demo/photos", '{"id":0,"label":"house","image":"img/0000.png"}'),
    (SECTIONS[6], "warp stream demo/photos", '{"id":1,"label":"cat","image":"img/0001.png"}'),
    (SECTIONS[6], "warp cat demo/photos", "RIFF"),
    (SECTIONS[6], "warp warm demo/photos", "4 blob(s)"),
    (SECTIONS[6], "warp init demo/photos", "Batch 0: 10 rows"),
    (SECTIONS[6], "warp init demo/photos", "image: ImageRef(demo/photos:media/img/0000.png)"),
    (SECTIONS[6], "warp init demo/photos", "Smoke test passed!"),
    (SECTIONS[7], "warp schema demo/photos", "image   string  yes       media (image)"),
    (SECTIONS[7], "warp head demo/photos", "2   car    img/0002.png"),
    (SECTIONS[8], "nothing uploaded$", "already published, nothing uploaded"),
    (SECTIONS[8], "--preview sheet.png", "10 tile(s)"),
    (SECTIONS[8], "embeddings list", "color_hist 128 10 color-hist main.image exact"),
]

# start of a command -> exit status the README documents for it (the rest: 0). `# exit 1 if ...`
# comments describe failure cases; on the README's sample data every command succeeds.
EXIT_CODES: dict[str, int] = {"warp diff vision/coco": 1}  # the versions differ


def _has_torch() -> bool:
    return importlib.util.find_spec("torch") is not None


# (text in the command, runs here?, reason it cannot run everywhere)
SKIPS: list[tuple[str, bool, str]] = [
    ("| jq ", shutil.which("jq") is not None, "needs jq, which a fresh CI machine may not have"),
    ("python examples/train_detector.py", _has_torch(), "needs torch (pip install '.[torch]')"),
    ("make_loader(", _has_torch(), "needs torch (pip install '.[torch]')"),
    (".to_torch(", _has_torch(), "needs torch (pip install '.[torch]')"),
]

# ```python blocks (by the section they are under, and a line only that block has) that cannot run
# as written, and why. The others run after the commands of their section, or of PY_SETUP's.
PY_SKIPS: list[tuple[str, str, str]] = [
    ("warp etl (captioned media → feature cache for pretraining)", "opt.zero_grad()",
     "a training loop: model and opt are the reader's own"),
    ("warp etl (arrays → tiled, compressed Zarr v3)", "chunks_from_camera()",
     "chunks_from_camera() is the reader's own data source"),
    ("warp info / schema / head (looking at a dataset)", 'row["audio"]',
     "continues the block above (wd) and reads an audio column the sample table does not have"),
    ("Resuming, and proving the epoch was read exactly once", "dist.all_gather_object",
     "needs torch.distributed ranks: tests/partition/test_order_recipe.py runs it as written on two gloo ranks"),
]
# section of a ```python block -> the section whose commands are its set-up (default: its own)
PY_SETUP: dict[str, str] = {
    # DatasetBuilder over data/p0.parquet, data/p1.parquet and imgs/: the photos sample files
    "warp publish (a dataset version to the store)":
        "warp ls / stream / cat / warm / cache / init (reading published datasets)",
}


def _py_skip(block: Block) -> str | None:
    for section, needle, reason in PY_SKIPS:
        if block.section == section and needle in block.commands[0].text:
            return reason
    return None


def _py_blocks_after(section: str) -> list[Block]:
    """The ```python blocks that run after ``section``'s commands, in README order."""
    return [b for b in PY_BLOCKS if PY_SETUP.get(b.section, b.section) == section and not _py_skip(b)]


S3_BUCKET = "s3://team-datasets/"


def _norm(s: str) -> str:
    return re.sub(r"[ \t]+", " ", s)


def _find(block: Block, needle: str) -> int:
    """The command that is exactly ``needle``, else the only one the regex ``needle`` matches."""
    exact = [k for k, c in enumerate(block.commands) if c.text == needle]
    hits = exact or [k for k, c in enumerate(block.commands) if re.search(needle, c.text)]
    assert len(hits) == 1, f"{block.section}: {len(hits)} commands match {needle!r}"
    return hits[0]


def _skip_reason(cmd: Command) -> str | None:
    for needle, ok, reason in SKIPS:
        if needle in cmd.text and not ok:
            return reason
    return None


def test_readme_blocks_and_lists_agree():
    """The parse finds the blocks, and every EXPECTED / EXIT_CODES / SKIPS entry names a real line."""
    assert [b.section for b in BLOCKS] == SECTIONS
    for b in BLOCKS:
        assert b.commands, b.section
        for c in b.commands:
            assert not c.text.rstrip().endswith("\\"), (b.section, c.text)
    for section, needle, text in EXPECTED:
        cmd = BY_SECTION[section].commands[_find(BY_SECTION[section], needle)]
        assert _norm(text) in _norm("\n".join(cmd.shown)), (section, needle, text)
    for prefix in EXIT_CODES:
        assert any(c.text.startswith(prefix) for b in BLOCKS for c in b.commands), prefix
    for needle, _, _ in SKIPS:
        assert any(needle in c.text for b in _PARSED for c in b.commands), needle
    assert any(S3_BUCKET in c.text for c in BY_SECTION[FLOW].commands)
    for section, needle, _ in PY_SKIPS:
        assert sum(b.section == section and needle in b.commands[0].text for b in PY_BLOCKS) == 1, needle
    assert set(PY_SETUP.values()) <= set(SECTIONS) and set(PY_SETUP) <= {b.section for b in PY_BLOCKS}
    # every ```python block runs after some section's commands, or is skipped with a reason
    for b in PY_BLOCKS:
        assert _py_skip(b) or PY_SETUP.get(b.section, b.section) in SECTIONS, b.section
    assert len(PY_BLOCKS) >= 8 and sum(not _py_skip(b) for b in PY_BLOCKS) >= 4
    # the flow's shape comment is checked against what its print() prints (issue 40: it said 12 where 16 printed)
    assert _print_comments(PY_BLOCKS[0].commands[0].text) == ["0 (16, 3, 320, 320) (16, 16, 4)"]


def test_photos_sample_data_is_the_readme_dataset(tmp_path):
    """`sampledata photos`: two Parquet parts (id, label, image), real PNGs behind every ref, a real WAV."""
    import pyarrow.parquet as pq
    from PIL import Image
    from warpdata.sampledata.__main__ import main

    assert main(["photos", str(tmp_path), "--count", "37", "--seed", "3"]) == 0
    t = pq.read_table([tmp_path / "data" / "p0.parquet", tmp_path / "data" / "p1.parquet"])
    assert t.column_names == ["id", "label", "image"] and t.num_rows == 37
    assert t.column("id").to_pylist() == list(range(37))
    for ref in set(t.column("image").to_pylist()):
        with Image.open(tmp_path / "imgs" / ref) as im:
            assert im.format == "PNG" and im.mode == "RGB"
    with wave.open(io.BytesIO((tmp_path / "imgs" / "snd" / "0.wav").read_bytes())) as w:
        assert (w.getnchannels(), w.getsampwidth(), w.getframerate(), w.getnframes()) == (1, 2, 8000, 2000)
    assert main(["photos", str(tmp_path / "none"), "--count", "0"]) == 2
    assert not (tmp_path / "none").exists()


def _script(block: Block, rundir: Path, bucket: str | None) -> tuple[str, dict[int, str]]:
    lines = ["set -o pipefail", "exec </dev/null"]
    skipped: dict[int, str] = {}
    for k, cmd in enumerate(block.commands):
        reason = _skip_reason(cmd)
        if reason:
            skipped[k] = reason
            continue
        text = cmd.text.replace(S3_BUCKET, f"s3://{bucket}/") if bucket else cmd.text
        lines.append(f"{{ {text}\n}} >'{rundir}/{k}.log' 2>&1; echo $? >'{rundir}/{k}.rc'")
    for i, py in enumerate(_py_blocks_after(block.section)):
        reason = _skip_reason(py.commands[0])
        if reason:
            continue
        code = py.commands[0].text
        assert "WARP_README_PY" not in code
        lines.append(f"{{ python - <<'WARP_README_PY'\n{code}\nWARP_README_PY\n}} "
                     f">'{rundir}/py{i}.out' 2>'{rundir}/py{i}.err'; echo $? >'{rundir}/py{i}.rc'")
    return "\n".join(lines) + "\n", skipped


@pytest.mark.slow
@pytest.mark.parametrize("section", SECTIONS)
def test_readme_block_runs_as_written(section, tmp_path, request):
    block = BY_SECTION[section]
    work, rundir = tmp_path / "home", tmp_path / "run"   # the README's commands run in ~ (/home/me)
    work.mkdir()
    rundir.mkdir()
    (work / "examples").symlink_to(ROOT / "examples")
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("XDG_", "WARP_", "AWS_")) and k not in ("COLUMNS", "LINES")}
    env.update(HOME=str(work), WARP_STORE=str(work / ".local/share/warp/store"),
               WARP_CACHE_DIR=str(work / ".cache/warp"), PYTHONUNBUFFERED="1",   # stdout and stderr in order
               PATH=os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")]))
    bucket = None
    if any(S3_BUCKET in c.text for c in block.commands):
        s3 = request.getfixturevalue("s3")
        env.update(s3.env)
        bucket = s3.bucket
    script, skipped = _script(block, rundir, bucket)
    p = subprocess.run(["bash", "-c", script], cwd=work, env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    for k, cmd in enumerate(block.commands):
        if k in skipped:
            continue
        rc_file = rundir / f"{k}.rc"
        log = (rundir / f"{k}.log").read_text(errors="replace") if rc_file.exists() else ""
        want = next((c for pre, c in EXIT_CODES.items() if cmd.text.startswith(pre)), 0)
        assert rc_file.exists() and int(rc_file.read_text()) == want, (
            f"{section}: `{cmd.text}` exited {rc_file.read_text().strip() if rc_file.exists() else '?'}, "
            f"README expects {want}\n--- stdout and stderr\n{log[-6000:]}")
    _compare_outputs(block, rundir, work, skipped)
    for i, py in enumerate(_py_blocks_after(section)):
        if _skip_reason(py.commands[0]):
            continue
        rc_file = rundir / f"py{i}.rc"
        err = (rundir / f"py{i}.err").read_text(errors="replace") if rc_file.exists() else ""
        assert rc_file.exists() and int(rc_file.read_text()) == 0, (
            f"{section}: the ```python block under {py.section!r} failed:\n{py.commands[0].text}\n"
            f"--- stderr\n{err[-3000:]}")
        printed = [_norm(ln).strip() for ln in (rundir / f"py{i}.out").read_text(errors="replace").splitlines()]
        for shown in _print_comments(py.commands[0].text):
            assert shown in printed, (f"{section}: the ```python block under {py.section!r} shows `# {shown}` "
                                      f"beside a print(), which printed:\n" + "\n".join(printed[:20]))
    for sec, needle, text in EXPECTED:
        if sec != section:
            continue
        k = _find(block, needle)
        if k in skipped:
            continue
        printed = (rundir / f"{k}.log").read_text(errors="replace")
        assert _norm(text) in _norm(printed), f"{section}: `{needle}` did not print {text!r}:\n{printed[-3000:]}"


def _print_comments(code: str) -> list[str]:
    """The comments beside ``print(...)`` calls of a ```python block: each is a line that block prints."""
    return [_norm(m.group(1)).strip() for m in re.finditer(r"^\s*print\(.*\)\s+#\s*(.+)$", code, re.M)]


def _compare_outputs(block: Block, rundir: Path, home: Path, skipped: dict[int, str]) -> None:
    """Every command's printed output against the lines the README shows under it
    (tests/support/readme_outputs.py). With README_RECORD_DIR set (``make readme``), the outputs
    are written there for ``python -m support.readme_outputs write`` instead of compared."""
    records, wrong = [], []
    for k, cmd in enumerate(block.commands):
        if k in skipped or not cmd.shown:
            continue
        text = (rundir / f"{k}.log").read_text(errors="replace")
        printed = readme_outputs.normalize(text.replace(str(home.resolve()), str(home)), str(home))
        records.append({"command": cmd.text, "line": cmd.line, "shown": cmd.shown, "printed": printed})
        diff = readme_outputs.mismatch(cmd.shown, printed)
        if diff:
            wrong.append(f"README.md:{cmd.line + 1}: `{cmd.text}` prints other lines than the README shows:\n{diff}")
    record_dir = os.environ.get("README_RECORD_DIR")
    if record_dir:
        out = Path(record_dir) / f"{SECTIONS.index(block.section):02d}.json"
        out.write_text(json.dumps(records, ensure_ascii=False, indent=1), encoding="utf-8")
        return
    assert not wrong, "\n\n".join(wrong) + "\n\n(make readme rewrites these lines from what the commands print)"
