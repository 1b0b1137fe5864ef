"""``warp inspect`` framework: detection, manifest summaries, errors for unknown input."""

from __future__ import annotations

import importlib
import json

import pytest
from warpdata.artifacts.inspect import INSPECTORS, Report, find_inspector, read_head
from warpdata.core.errors import ExitCode

# a kind no richer inspector claims, so the generic manifest inspector describes it
MANIFEST = {"kind": "test-artifact", "version": "v1-abc", "samples": 12, "shards": [{"n": 6}, {"n": 6}],
            "recipe": {"size": 640}}


@pytest.fixture
def artifact(tmp_path):
    d = tmp_path / "wh"
    d.mkdir()
    (d / "manifest.json").write_text(json.dumps(MANIFEST))
    return d


def test_registry_modules_follow_the_protocol():
    names = [t.name for t in INSPECTORS]
    assert len(names) == len(set(names)) and "manifest" in names
    for t in INSPECTORS:
        mod = importlib.import_module(t.inspector)
        assert callable(mod.sniff) and callable(mod.inspect)


def test_every_previewer_in_the_tables_resolves():
    """Each kind's previewer and checks, named by dotted path in the kind table, load and are callable."""
    from warpdata.artifacts.kinds import KINDS
    from warpdata.core.registry import load

    previewers = [t.previewer for t in INSPECTORS if t.previewer]
    assert len(previewers) == 5 and all(k.previewer for k in KINDS.values())
    for target in previewers:
        assert callable(load(target, "previewer"))
    for k in KINDS.values():
        if k.checks:
            load(k.checks, "doctor check module")


def test_manifest_directory_human(cli, artifact):
    r = cli("inspect", artifact)
    assert r.code == 0 and r.err == ""
    lines = r.out.splitlines()
    assert lines[0] == f"test-artifact: {artifact}"
    assert any(ln.split() == ["samples", "12"] for ln in lines)
    assert any(ln.split() == ["shards", "2", "entries"] for ln in lines)


def test_manifest_directory_json(cli, artifact):
    doc = cli("inspect", artifact, "--json").json()
    assert doc["kind"] == "test-artifact" and doc["ok"] is True and doc["target"] == str(artifact)
    assert doc["samples"] == 12 and doc["version"] == "v1-abc"
    assert doc["sections"] == {"shards": 2, "recipe": 1}


def test_manifest_file_directly(cli, artifact):
    doc = cli("--json", "inspect", artifact / "manifest.json").json()
    assert doc["kind"] == "test-artifact"


def test_unknown_file_is_bad_data(cli, tmp_path):
    p = tmp_path / "x.dat"
    p.write_bytes(b"\x89NOPE" + bytes(100))
    r = cli("inspect", p)
    assert r.code == ExitCode.DATA and "not a warp artifact" in r.err and r.out == ""


def test_json_without_kind_is_not_a_manifest(cli, tmp_path):
    p = tmp_path / "other.json"
    p.write_text('{"name": "not ours"}')
    assert cli("inspect", p).code == ExitCode.DATA


def test_directory_without_manifest_is_bad_data(cli, tmp_path):
    (tmp_path / "a.txt").write_text("x")
    r = cli("inspect", tmp_path)
    assert r.code == ExitCode.DATA and str(tmp_path) in r.err


@pytest.mark.parametrize(("content", "why"), [
    ("{not json", "not valid JSON"),
    ('{"name": "x"}', "no 'kind' field"),
    ('["kind"]', "no 'kind' field"),
])
def test_broken_manifest_in_directory(cli, tmp_path, content, why):
    (tmp_path / "manifest.json").write_text(content)
    r = cli("inspect", tmp_path)
    assert r.code == ExitCode.DATA and why in r.err and str(tmp_path / "manifest.json") in r.err


def test_missing_path_is_missing_input(cli, tmp_path):
    r = cli("inspect", tmp_path / "gone" / "x.tbl")
    assert r.code == ExitCode.NO_INPUT and "does not exist" in r.err


def test_empty_file(cli, tmp_path):
    (tmp_path / "empty").write_bytes(b"")
    assert cli("inspect", tmp_path / "empty").code == ExitCode.DATA


def test_read_head_and_find_inspector(tmp_path, artifact):
    (tmp_path / "f").write_bytes(b"A" * 10000)
    assert read_head(str(tmp_path / "f")) == (b"A" * 4096, False)
    assert read_head(str(tmp_path)) == (None, True)
    assert read_head(str(tmp_path / "none")) == (None, False)
    assert find_inspector(str(artifact)).__name__ == "warpdata.artifacts.inspect_manifest"
    assert find_inspector(str(tmp_path / "f")) is None


def test_report_to_dict_tables():
    r = Report(kind="k", target="t", summary={"n": 1}, tables=[("rows", ["a", "b"], [[1, 2], [3, 4]])],
               ok=False, problems=["sample 3: crc mismatch"])
    assert r.to_dict() == {"kind": "k", "target": "t", "ok": False, "n": 1, "problems": ["sample 3: crc mismatch"],
                           "tables": {"rows": [{"a": 1, "b": 2}, {"a": 3, "b": 4}]}}


def test_sniffing_a_target_loads_no_reader_of_the_kinds_tried_before_it(tmp_path):
    """Every target is sniffed by the entries before its own: a .tbl file or a plain manifest must
    not load the feature cache's reader (the first entry) on the way (a fresh interpreter)."""
    import subprocess
    import sys

    tbl = tmp_path / "x.tbl"
    tbl.write_bytes(b"TBL\x02" + bytes(60))
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "manifest.json").write_text(json.dumps({"kind": "something-else"}))
    code = ("import sys\nfrom warpdata.artifacts.inspect import find_target\n"
            f"assert find_target({str(tbl)!r}).name == 'tbl'\n"
            f"assert find_target({str(tmp_path / 'm')!r}).name == 'manifest'\n"
            "loaded = sorted(m for m in sys.modules if m.startswith(('warpdata.features.reader', "
            "'warpdata.features.inspect')))\n"
            "assert not loaded, loaded\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
