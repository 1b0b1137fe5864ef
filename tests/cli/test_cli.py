"""The CLI contract every command shares: help, exit codes, streams, global options.

Most tests run ``warp`` in-process (the ``cli`` fixture) and assert on exit
code, stdout and stderr together; signals, broken pipes, start-up imports and
the console scripts need a real process.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from warpdata import __version__
from warpdata.cli import output as out
from warpdata.cli.app import COMMANDS, chosen_command, hoist_global_options, tar_to_tbl_main
from warpdata.core.errors import ExitCode

BIN = Path(sys.executable).parent
ESC = "\x1b["


def run_warp(*args: str, env: dict | None = None, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "warpdata", *args], capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, timeout=120, **kw)


@pytest.fixture
def junk(tmp_path) -> Path:
    p = tmp_path / "junk.bin"
    p.write_bytes(b"\x00\x01 definitely not a warp artifact")
    return p


@pytest.fixture
def bad_toml(tmp_path) -> Path:
    p = tmp_path / "bad.toml"
    p.write_text('[source]\nformat = "coco"\npath = \n')
    return p


# -- help ----------------------------------------------------------------------


@pytest.mark.parametrize("spec", COMMANDS, ids=[c.name for c in COMMANDS])
def test_every_command_help(cli, spec):
    r = cli(spec.name, "--help")
    assert r.code == 0, r.err
    assert r.err == ""
    assert r.out.startswith(f"Usage: warp {spec.name} ")
    assert "Examples:" in r.out and f"warp {spec.name}" in r.out.split("Examples:")[1]
    assert "<int>" not in r.out.split("Options:")[0]


def test_root_help_lists_commands_in_table_order(cli):
    r = cli("--help")
    assert r.code == 0 and r.err == ""
    listed = r.out.split("Commands:")[1]
    positions = [listed.index(f"\n  {c.name} ") for c in COMMANDS]
    assert positions == sorted(positions)
    # count options are flags: no value placeholder shown for -q / -v
    assert "-q, --quiet  " in r.out and "-v, --verbose  " in r.out
    assert "<int>" not in r.out
    assert "--color WHEN" in r.out


def test_no_arguments_prints_help_and_is_usage_error(cli):
    r = cli()
    assert r.code == ExitCode.USAGE
    assert "Usage: warp" in r.out + r.err


def test_help_imports_no_command_module_and_no_rich():
    """Start-up cost: `warp --help` lists commands from COMMANDS without importing them."""
    code = ("import sys\nfrom warpdata.cli.app import main\nrc = main(sys.argv[1:])\n"
            "mods = sorted(m for m in sys.modules if m.startswith(('warpdata.commands.', 'rich', 'numpy')))\n"
            "sys.stderr.write('MODS=' + ','.join(mods))\n")
    r = subprocess.run([sys.executable, "-c", code, "--help"], capture_output=True, text=True)
    assert r.returncode == 0 and r.stderr == "MODS="
    r = subprocess.run([sys.executable, "-c", code, "inspect", "--help"], capture_output=True, text=True)
    assert r.returncode == 0 and r.stderr == "MODS=warpdata.commands.inspect"


def test_chosen_command_skips_global_option_values():
    assert chosen_command(["--color", "never", "doctor", "x"]) == "doctor"
    assert chosen_command(["--json", "-v", "inspect"]) == "inspect"
    assert chosen_command(["--help"]) is None
    assert chosen_command(["nosuch", "doctor"]) is None


# -- exit codes ----------------------------------------------------------------


def test_exit_0_version(cli):
    r = cli("--version")
    assert (r.code, r.out, r.err) == (0, f"warp {__version__}\n", "")


def test_exit_1_negative_result(cli, monkeypatch, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    monkeypatch.setenv("WARP_CACHE_DIR", str(blocker / "cache"))
    r = cli("doctor", "--only", "cache")
    assert r.code == ExitCode.NEGATIVE
    assert "FAIL" in r.out and "WARP_CACHE_DIR" in r.out


def test_exit_2_usage(cli):
    r = cli("inspect", "--no-such-option", "x")
    assert r.code == ExitCode.USAGE and r.out == ""
    assert "No such option" in r.err
    r = cli("--color", "sometimes", "doctor")
    assert r.code == ExitCode.USAGE and "'sometimes' is not one of" in r.err
    r = cli("no-such-command")
    assert r.code == ExitCode.USAGE and "No such command" in r.err


def test_exit_65_bad_data(cli, junk):
    r = cli("inspect", junk)
    assert r.code == ExitCode.DATA and r.out == ""
    assert r.err.startswith(f"error: {junk}: not a warp artifact")
    assert "\nhint: " in r.err and "Traceback" not in r.err


def test_exit_66_missing_input(cli, tmp_path):
    r = cli("inspect", tmp_path / "nope")
    assert r.code == ExitCode.NO_INPUT and r.out == ""
    assert "does not exist" in r.err and "hint:" in r.err


def test_exit_78_bad_config_names_file_and_line(cli, bad_toml):
    r = cli("etl", "--config", bad_toml)
    assert r.code == ExitCode.CONFIG and r.out == ""
    assert f"{bad_toml}:3" in r.err and "TOML syntax error" in r.err


def _explode(*a, **k):
    return {}["no such key"]


def test_exit_70_internal_error_without_traceback(cli, monkeypatch, tmp_path):
    import warpdata.artifacts.inspect

    monkeypatch.setattr(warpdata.artifacts.inspect, "find_inspector", _explode)
    r = cli("inspect", tmp_path)
    assert r.code == ExitCode.INTERNAL and r.out == ""
    assert "internal error: KeyError" in r.err and "--debug" in r.err
    assert "Traceback" not in r.err


@pytest.mark.parametrize("how", ["flag", "flag-after", "env"])
def test_debug_shows_traceback(cli, monkeypatch, tmp_path, how):
    import warpdata.artifacts.inspect

    monkeypatch.setattr(warpdata.artifacts.inspect, "find_inspector", _explode)
    if how == "env":
        monkeypatch.setenv("WARP_DEBUG", "1")
        r = cli("inspect", tmp_path)
    elif how == "flag":
        r = cli("--debug", "inspect", tmp_path)
    else:
        r = cli("inspect", tmp_path, "--debug")
    assert r.code == ExitCode.INTERNAL
    assert "Traceback (most recent call last)" in r.err and "_explode" in r.err


def test_debug_traceback_for_expected_errors_only_when_asked(cli, junk):
    assert "Traceback" not in cli("inspect", junk).err
    assert "Traceback" in cli("--debug", "inspect", junk).err


def test_exit_130_keyboard_interrupt_in_process(cli, monkeypatch, tmp_path):
    import warpdata.artifacts.inspect

    def interrupted(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(warpdata.artifacts.inspect, "find_inspector", interrupted)
    r = cli("inspect", tmp_path)
    assert r.code == ExitCode.INTERRUPTED and "interrupted" in r.err


def test_exit_130_sigint_to_a_real_process(tmp_path):
    """SIGINT while `warp etl` blocks reading its config from a FIFO."""
    fifo = tmp_path / "config.toml"
    os.mkfifo(fifo)
    # A child inherits an *ignored* SIGINT (Python then installs no handler of its own), and a
    # cluster test that ran earlier in this worker process may have left it ignored: restore it.
    p = subprocess.Popen([sys.executable, "-m", "warpdata", "etl", "--config", str(fifo)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.monotonic() + 60
    writer = None
    while writer is None:  # opening the FIFO for writing succeeds once warp has it open for reading
        try:
            writer = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
        except OSError:
            assert p.poll() is None, p.communicate()
            assert time.monotonic() < deadline
            time.sleep(0.02)
    try:
        time.sleep(0.1)  # let it enter read(); nothing is ever written, so it blocks there
        p.send_signal(signal.SIGINT)
        stdout, stderr = p.communicate(timeout=60)
    finally:
        os.close(writer)
    assert p.returncode == ExitCode.INTERRUPTED, stderr
    assert stdout == "" and "interrupted" in stderr and "Traceback" not in stderr


@pytest.mark.parametrize("args", [["--help"], ["--version"], ["doctor", "--help"], ["--json", "doctor"],
                                  ["inspect", "--json", "MISSING"]])
def test_exit_141_broken_pipe(args, tmp_path):
    """stdout is a pipe whose reader is already gone: exit 141, no traceback."""
    args = [str(tmp_path / "missing") if a == "MISSING" else a for a in args]
    r, w = os.pipe()
    os.close(r)
    try:
        p = subprocess.run([sys.executable, "-m", "warpdata", *args], stdout=w, stderr=subprocess.PIPE,
                           text=True, timeout=120)
    finally:
        os.close(w)
    assert p.returncode == ExitCode.BROKEN_PIPE, p.stderr
    assert "Traceback" not in p.stderr and "Exception ignored" not in p.stderr


def test_exit_141_through_a_shell_pipeline():
    warp = shutil.which("warp", path=str(BIN)) or f"{sys.executable} -m warpdata"
    r = subprocess.run(["bash", "-c", f"{warp} --json doctor | head -c0; echo ${{PIPESTATUS[0]}}"],
                       capture_output=True, text=True, timeout=120)
    assert r.stdout.strip() == "141", r.stderr
    assert "Traceback" not in r.stderr


def test_every_exit_code_is_exercised():
    """The exit codes documented in warp(1) are exactly the ones the tests above cover."""
    # 75 (temporary failure: object store or cluster unreachable) is exercised in tests/etl/test_etl_scale.py;
    # 73, 74 and 77 (the operating system's refusals) in tests/cli/test_os_errors.py; 71 (no thread or
    # process to start) in tests/cli/test_not_a_bug.py
    assert sorted(int(c) for c in ExitCode) == [0, 1, 2, 65, 66, 70, 71, 73, 74, 75, 77, 78, 130, 141]


# -- --json and streams ----------------------------------------------------------


def test_json_is_one_document_and_nothing_else(cli):
    r = cli("--json", "doctor", "--only", "install")
    doc = json.loads(r.out)  # the whole of stdout parses
    assert r.code == 0 and doc["ok"] is True and doc["checks"]
    assert "checks:" not in r.err  # the human summary line is not printed under --json either


def test_json_error_document(cli, tmp_path):
    r = cli("inspect", tmp_path / "nope", "--json")
    doc = json.loads(r.out)
    assert r.code == 66
    assert doc == {"error": "missing-input", "exit_code": 66, "message": f"{tmp_path / 'nope'} does not exist",
                   "hint": doc["hint"]}
    assert r.err.startswith("error: ")


def test_data_on_stdout_messages_on_stderr(cli, tmp_path):
    d = tmp_path / "art"
    d.mkdir()
    (d / "manifest.json").write_text(json.dumps({"kind": "dataset", "name": "ws/x", "shards": [1, 2]}))
    r = cli("inspect", d)
    assert r.code == 0 and r.err == ""
    assert r.out.startswith(f"dataset: {d}\n") and "shards" in r.out


# -- global options anywhere ------------------------------------------------------


@pytest.mark.parametrize("argv", [
    ["--json", "inspect", "TARGET"],
    ["inspect", "--json", "TARGET"],
    ["inspect", "TARGET", "--json"],
    ["-v", "inspect", "TARGET", "--json", "--color", "never"],
    ["inspect", "TARGET", "--color=never", "-vv", "--json"],
])
def test_global_options_before_or_after_the_command(cli, tmp_path, argv):
    d = tmp_path / "art"
    d.mkdir()
    (d / "manifest.json").write_text(json.dumps({"kind": "dataset", "name": "ws/x"}))
    r = cli(*[str(d) if a == "TARGET" else a for a in argv])
    assert r.code == 0, r.err
    assert json.loads(r.out)["kind"] == "dataset"


def test_hoisting_stops_at_double_dash():
    assert hoist_global_options(["inspect", "x", "--json"]) == ["--json", "inspect", "x"]
    assert hoist_global_options(["inspect", "--", "--json"]) == ["inspect", "--", "--json"]
    assert hoist_global_options(["doctor", "--color", "never", "-qq"]) == ["--color", "never", "-qq", "doctor"]


def test_quiet_silences_info_but_not_errors(cli, tmp_path):
    assert "checks:" in cli("doctor", "--only", "install").err
    r = cli("doctor", "--only", "install", "-q")
    assert r.code == 0 and r.err == ""
    r = cli("-q", "inspect", tmp_path / "nope")
    assert r.code == 66 and "error:" in r.err


def test_verbose_adds_detail(cli):
    assert "install/python" not in cli("doctor", "--only", "install").err
    assert "install/python: PASS" in cli("doctor", "--only", "install", "-v").err


# -- colour ------------------------------------------------------------------


@pytest.mark.parametrize(("flag", "env", "coloured"), [
    (None, {}, False),  # stderr is not a terminal
    ("always", {}, True),
    ("never", {"FORCE_COLOR": "1"}, False),
    (None, {"FORCE_COLOR": "1"}, True),
    (None, {"NO_COLOR": "1", "FORCE_COLOR": "1"}, False),
    ("always", {"NO_COLOR": "1"}, True),  # an explicit flag beats the environment
])
def test_color(cli, monkeypatch, tmp_path, flag, env, coloured):
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    args = ["inspect", str(tmp_path / "nope")] + (["--color", flag] if flag else [])
    r = cli(*args)
    assert r.code == 66
    assert (ESC in r.err) is coloured, r.err
    assert ESC not in r.out


def test_progress_is_silent_when_stderr_is_not_a_terminal(capfd):
    with out.progress("work", total=3) as bar:
        bar.advance()
    assert capfd.readouterr().err == ""


# -- entry points ------------------------------------------------------------


def test_python_dash_m_warpdata():
    r = run_warp("--version")
    assert (r.returncode, r.stdout, r.stderr) == (0, f"warp {__version__}\n", "")


def test_console_script_warp():
    warp = shutil.which("warp", path=str(BIN))
    if warp is None:
        pytest.skip("warp console script not installed in this environment")
    r = subprocess.run([warp, "doctor", "--help"], capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout.startswith("Usage: warp doctor")


def test_tar_to_tbl_alias(capfd):
    if "tar-to-tbl" not in {c.name for c in COMMANDS}:
        pytest.skip("tar-to-tbl is not registered yet")
    assert tar_to_tbl_main(["--help"]) == 0
    assert capfd.readouterr().out.startswith("Usage: warp tar-to-tbl")
    script = shutil.which("tar_to_tbl", path=str(BIN))
    if script:
        r = subprocess.run([script, "--help"], capture_output=True, text=True)
        assert r.returncode == 0 and r.stdout.startswith("Usage: warp tar-to-tbl")


def test_no_command_redefines_a_global_option():
    """Global options are hoisted from anywhere on the line, so a command must not reuse their names."""
    import typer
    from warpdata.cli.app import GLOBAL_FLAGS, GLOBAL_VALUED, build_app

    group = typer.main.get_command(build_app())
    reserved = GLOBAL_FLAGS | GLOBAL_VALUED
    for name, cmd in group.commands.items():
        for p in cmd.params:
            clash = set(getattr(p, "opts", ())) & reserved
            assert not clash, f"warp {name} redefines global option(s) {clash}"


def test_json_usage_error_is_one_document(cli):
    r = cli("--json", "inspect", "--no-such-option", "x")
    assert r.code == ExitCode.USAGE
    assert json.loads(r.out) == {"error": "usage", "exit_code": 2, "message": "No such option: --no-such-option"}
    assert "No such option" in r.err


def test_a_command_module_that_fails_to_import_is_exit_70(cli, monkeypatch):
    import warpdata.cli.app as cli_mod

    monkeypatch.setattr(cli_mod, "COMMANDS", (*cli_mod.COMMANDS,
                                              cli_mod.CommandSpec("broken", "warpdata.no_such_module", "A broken entry.")))
    r = cli("broken")
    assert r.code == ExitCode.INTERNAL
    assert "internal error: ModuleNotFoundError" in r.err and "Traceback" not in r.err
    assert "Traceback" in cli("broken", "--debug").err
    assert cli("--help").code == 0  # listing it does not import it


# -- the library's top-level namespace ----------------------------------------------


def _pyproject_subpackages() -> list[str]:
    import tomllib

    root = Path(__file__).resolve().parents[2]
    pkgs = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    return sorted(p.split(".", 1)[1] for p in pkgs if p.count(".") == 1)


@pytest.mark.parametrize("sub", _pyproject_subpackages())
def test_public_subpackages_resolve_on_attribute_access(sub):
    """`import warpdata; warpdata.warehouse.open(...)` must not raise AttributeError
    (a fresh interpreter, so no earlier import has bound the attribute), and plain
    `import warpdata` still imports nothing heavy."""
    code = ("import sys, warpdata\n"
            "heavy = sorted(m for m in ('numpy', 'pyarrow', 'duckdb') if m in sys.modules)\n"
            f"mod = warpdata.{sub}\n"
            "print(mod.__name__, ','.join(heavy), sep='|')\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == f"warpdata.{sub}|"


def test_documented_entry_points_of_subpackages_resolve():
    code = ("import warpdata\n"
            "print(callable(warpdata.warehouse.open), callable(warpdata.tiles.write_array))\n"
            "print(set(dir(warpdata)) >= {'warehouse', 'tiles', 'registry'})\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["True", "True", "True"]
    r = subprocess.run([sys.executable, "-c", "import warpdata; warpdata.nope"], capture_output=True, text=True)
    assert r.returncode == 1 and "has no attribute 'nope'" in r.stderr
