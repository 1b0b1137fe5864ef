"""Shared fixtures: run the CLI in-process, isolate warp's directories."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

import pytest
from hypothesis import settings
from support.s3fixtures import *  # noqa: F403  (moto S3 server fixtures: moto_server, s3)

settings.register_profile("dev", max_examples=40, deadline=None)
settings.register_profile("ci", max_examples=200, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci" if os.environ.get("CI") else "dev"))


@dataclass
class CliResult:
    code: int
    out: str
    err: str

    def json(self):
        return json.loads(self.out)


@pytest.fixture(autouse=True)
def _isolated_dirs(tmp_path_factory, monkeypatch):
    """Every test gets its own store, cache and config dirs; no user state leaks in."""
    base = tmp_path_factory.mktemp("xdg")
    monkeypatch.setenv("XDG_DATA_HOME", str(base / "data"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(base / "cache"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(base / "config"))
    for var in ("WARP_STORE", "WARP_CACHE_DIR", "WARP_DEBUG", "NO_COLOR", "FORCE_COLOR", "WARP_CACHE_SIZE_GB"):
        monkeypatch.delenv(var, raising=False)


@pytest.fixture
def cli(capfd):
    """Run ``warp ARGS...`` in-process; returns exit code, stdout and stderr."""
    from warpdata.cli.app import main

    def run(*args: str, stdin: bytes | None = None) -> CliResult:
        capfd.readouterr()
        code = main([str(a) for a in args])
        captured = capfd.readouterr()
        return CliResult(code, captured.out, captured.err)

    return run
