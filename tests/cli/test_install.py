"""A real, non-editable ``pip install .`` installs the package, subpackages, man pages and completions.

The install goes into a fresh virtualenv (no pip of its own); this
environment's site-packages is appended to its path only so dependencies,
pip and setuptools resolve without a download (``--no-deps
--no-build-isolation --no-index``). Editable-install finders there are not
activated (``.pth`` files are processed only in site directories), so
``import warpdata`` must come from the new install.
"""

from __future__ import annotations

import os
import shutil
import site
import subprocess
import sysconfig
import tomllib
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SOURCES = ("pyproject.toml", "README.md", "warp", "commands", "formats", "kernels", "man", "completions")


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("install")
    src = tmp / "src"
    src.mkdir()
    for name in SOURCES:
        p = ROOT / name
        if p.is_dir():
            shutil.copytree(p, src / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc", ".warp-tmp-*", "*.tmp"))
        elif p.exists():
            shutil.copy2(p, src / name)
    env_dir = tmp / "venv"
    venv.EnvBuilder(with_pip=False).create(env_dir)
    py = env_dir / "bin" / "python"
    target_site = Path(subprocess.check_output([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                               text=True).strip())
    (target_site / "_host_site.pth").write_text("\n".join(site.getsitepackages() + [sysconfig.get_paths()["purelib"]]) + "\n")
    r = subprocess.run([str(py), "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--no-index",
                        "--ignore-installed", "--disable-pip-version-check", str(src)],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    return env_dir


def _py(env_dir: Path, code: str) -> str:
    r = subprocess.run([str(env_dir / "bin" / "python"), "-c", code], capture_output=True, text=True,
                       cwd=env_dir, timeout=300)
    assert r.returncode == 0, r.stderr
    return r.stdout


def test_every_package_in_the_tree_is_in_the_distribution():
    """A folder of warp/ with an __init__.py that pyproject.toml does not list is missing from every
    wheel (warpdata.lineage was, while the editable install hid it); and the package face knows it."""
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    folders = {"commands": "warpdata.commands", "formats": "warpdata.formats", "kernels": "warpdata.kernels"}
    tree = {"warpdata"} | {folders[d] for d in folders if (ROOT / d / "__init__.py").is_file()}
    tree |= {"warpdata." + ".".join(p.parent.relative_to(ROOT / "warp").parts)
             for p in (ROOT / "warp").rglob("__init__.py") if p.parent != ROOT / "warp"}
    assert tree - listed == set(), "add these to [tool.setuptools] packages in pyproject.toml"
    assert listed - tree == set()
    import warpdata

    assert {m.split(".", 1)[1] for m in tree if "." in m} <= warpdata._SUBPACKAGES


@pytest.mark.slow
def test_packages_import_from_the_install(installed):
    packages = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    assert {"warpdata", "warpdata.commands", "warpdata.formats", "warpdata.kernels"} <= set(packages)
    code = ("import importlib, json\n"
            f"mods = {packages!r}\n"
            "print(json.dumps({m: importlib.import_module(m).__file__ for m in mods}))\n")
    import json

    files = json.loads(_py(installed, code))
    for mod, f in files.items():
        assert f.startswith(str(installed)), (mod, f)
    assert str(ROOT) not in "".join(files.values())


@pytest.mark.slow
def test_package_data_is_installed(installed):
    wanted = sorted(str(p.relative_to(ROOT / "warp")) for p in (ROOT / "warp").rglob("*.json")
                    if "__pycache__" not in p.parts and not p.name.startswith("."))
    base = Path(_py(installed, "import warpdata, os; print(os.path.dirname(warpdata.__file__))").strip())
    for rel in wanted:
        assert (base / rel).is_file(), rel


@pytest.mark.slow
def test_console_scripts_work(installed):
    r = subprocess.run([str(installed / "bin" / "warp"), "--version"], capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout.startswith("warp ")
    r = subprocess.run([str(installed / "bin" / "warp"), "doctor", "--help"], capture_output=True, text=True)
    assert r.returncode == 0 and "Examples:" in r.stdout
    assert (installed / "bin" / "tar_to_tbl").exists()
    r = subprocess.run([str(installed / "bin" / "python"), "-m", "warpdata", "--version"], capture_output=True, text=True)
    assert r.returncode == 0


@pytest.mark.slow
def test_man_pages_and_completions_installed(installed):
    man1 = installed / "share" / "man" / "man1"
    for page in (ROOT / "man").glob("*.1"):
        assert (man1 / page.name).read_bytes() == page.read_bytes()
    assert (installed / "share" / "bash-completion" / "completions" / "warp.bash").is_file()
    assert (installed / "share" / "zsh" / "site-functions" / "_warp").is_file()
    assert (installed / "share" / "fish" / "vendor_completions.d" / "warp.fish").is_file()


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("man") is None, reason="man is not installed")
def test_man_finds_the_page(installed):
    env = {k: v for k, v in os.environ.items() if k != "MANPATH"}
    # an activated venv: man derives <bin>/../share/man from PATH
    env["PATH"] = f"{installed / 'bin'}:{env.get('PATH', '/usr/bin:/bin')}"
    r = subprocess.run(["man", "-w", "warp"], capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == str(installed / "share" / "man" / "man1" / "warp.1")
    r = subprocess.run(["man", "-w", "warp-doctor"], capture_output=True, text=True,
                       env={**env, "MANPATH": str(installed / "share" / "man")})
    assert r.stdout.strip() == str(installed / "share" / "man" / "man1" / "warp-doctor.1")
