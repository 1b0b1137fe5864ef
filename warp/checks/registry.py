"""The registry of ``warp doctor`` checks.

A check is a function returning :class:`CheckResult` (PASS / WARN / FAIL /
SKIP, a detail line and the remedy: the command or setting that fixes it).
Checks are registered with :func:`check`; ``CHECK_MODULES`` lists the modules
that hold them, imported only when ``warp doctor`` runs: warp's own checks, then
each artifact kind's (the ``checks`` entry of :data:`warpdata.artifacts.kinds.KINDS`),
so a system adds its checks in its own module plus one entry in the kind table.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field

from warpdata.artifacts.kinds import KINDS
from warpdata.core.registry import load

PASS, WARN, FAIL, SKIP = "PASS", "WARN", "FAIL", "SKIP"


@dataclass
class CheckResult:
    status: str
    detail: str
    remedy: str | None = None
    facts: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Check:
    name: str
    group: str
    fn: Callable[[], CheckResult]


_REGISTRY: dict[str, Check] = {}

CHECK_MODULES: tuple[str, ...] = (
    "warpdata.doctor.install",
    "warpdata.doctor.cache",
    "warpdata.doctor.store",
    *(k.checks for k in KINDS.values() if k.checks),
)


def check(name: str, group: str) -> Callable[[Callable[[], CheckResult]], Callable[[], CheckResult]]:
    def deco(fn: Callable[[], CheckResult]) -> Callable[[], CheckResult]:
        _REGISTRY[name] = Check(name, group, fn)
        return fn

    return deco


def all_checks() -> list[Check]:
    for mod in CHECK_MODULES:
        load(mod, "doctor check module")
    return list(_REGISTRY.values())


def run_check(c: Check) -> CheckResult:
    try:
        return c.fn()
    except Exception as e:  # a check that crashes is itself a failure to report
        return CheckResult(FAIL, f"check crashed: {type(e).__name__}: {e}",
                           "rerun with --debug and report this as a bug")


def dir_check(path: str, what: str, var: str) -> CheckResult:
    """PASS when ``path`` (made if missing) takes a file and has 1 GB free; ``var`` is the setting to change."""
    try:
        os.makedirs(path, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".warp-doctor-", dir=path)
        os.close(fd)
        os.unlink(tmp)
    except OSError as e:
        return CheckResult(FAIL, f"{what} {path} is not writable: {e.strerror}",
                           f"set {var} to a writable directory")
    free = shutil.disk_usage(path).free
    detail = f"{path} writable, {free / 1e9:.1f} GB free"
    if free < 1e9:
        return CheckResult(WARN, detail, f"free disk space or point {var} elsewhere", facts={"free_bytes": free})
    return CheckResult(PASS, detail, facts={"free_bytes": free, "path": path})
