"""Conformance suite for warp's on-disk formats: one base class holds the tests, one small
subclass per format supplies the fixtures (the pattern of zarr-python's ``StoreTests`` and
fsspec's abstract tests).

A format is done when its subclass passes:

* **round trip**: hypothesis draws inputs (the project's profile, tests/conftest.py); writing
  one and reading it back through the verifying reader gives the input, and it verifies clean;
* **golden bytes**: writing each fixed input gives exactly the committed golden file (or tree)
  and reading the committed file gives the input. Golden files are compared, never rewritten:
  a format change regenerates them by hand with the folder's ``make_golden.py``;
* **malformed corpus**: every entry of the format's corpus folders is rejected with the
  format's typed error (a :class:`~warpdata.core.errors.DataError`, exit 65, naming the file,
  with a hint), in a child process whose address space is capped at what it had after its
  imports plus :data:`MALFORMED_BUDGET` (a memory bomb shows up as an untyped ``MemoryError``);
* **flipped bytes**: one byte flipped in each checksummed region of a golden artifact makes
  the reader's verify path raise the format's typed checksum error, never return data.

A subclass sets the class attributes below and implements :meth:`write`, :meth:`read`,
:meth:`verify`, :meth:`golden_sample`, :meth:`samples` and :meth:`region`. Name it
``Test...`` in a ``test_*.py`` module; this module is not collected itself.
"""

from __future__ import annotations

import abc
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any, ClassVar

import pytest
from hypothesis import given
from hypothesis import strategies as st
from warpdata.core.errors import DataError, ExitCode

TESTS = Path(__file__).resolve().parent.parent
# what reading one malformed entry may add to the child's address space and resident memory
MALFORMED_BUDGET = 512 << 20
_CORPUS_SKIP = {"expected.json", "__pycache__"}

# The child: imports the subclass's module, caps its address space, opens every entry.
_CHILD = r"""
import importlib.util, json, os, resource, sys, traceback
budget, tests_dir, module_file, cls_name = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
entries = json.loads(sys.stdin.read())
sys.path[:0] = [tests_dir, os.path.dirname(module_file)]
spec = importlib.util.spec_from_file_location("conformance_subject", module_file)
mod = sys.modules["conformance_subject"] = importlib.util.module_from_spec(spec)
spec.loader.exec_module(mod)
suite = getattr(mod, cls_name)()
from warpdata.core.errors import DataError, WarpError

def status(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(field)

cap = status("VmSize") + budget
resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
base_rss = status("VmRSS")
out = {}
for name, path in entries:
    try:
        suite.open_malformed(path)
    except BaseException as e:
        out[name] = {"outcome": "typed" if isinstance(e, WarpError) else "untyped", "type": type(e).__name__,
                     "format_error": isinstance(e, suite.error), "data_error": isinstance(e, DataError),
                     "exit_code": int(getattr(e, "exit_code", -1)), "message": getattr(e, "message", str(e)),
                     "hint": getattr(e, "hint", None),
                     "traceback": "" if isinstance(e, WarpError) else traceback.format_exc()}
    else:
        out[name] = {"outcome": "accepted"}
peak = status("VmHWM")  # this image's high-water mark: ru_maxrss would include the forking worker's RSS
print(json.dumps({"results": out, "peak_growth": peak - base_rss, "cap": cap}))
"""


def flip_byte(root: Path, member: str, offset: int) -> None:
    """XOR one byte of ``root`` (a file) or of ``root/member`` (a file inside a tree) with 0x01."""
    target = root / member if member else root
    data = bytearray(target.read_bytes())
    if not 0 <= offset < len(data):
        raise AssertionError(f"offset {offset} lies outside {target} ({len(data)} bytes)")
    data[offset] ^= 0x01
    target.write_bytes(bytes(data))


def same_bytes(a: Path, b: Path) -> list[str]:
    """Differences between two files or two trees (names present on one side only, bytes that differ)."""
    if a.is_file() or b.is_file():
        return [] if a.is_file() and b.is_file() and a.read_bytes() == b.read_bytes() else [str(a.name)]
    left = {p.relative_to(a).as_posix() for p in a.rglob("*") if p.is_file()}
    right = {p.relative_to(b).as_posix() for p in b.rglob("*") if p.is_file()}
    diff = sorted(left ^ right)
    diff += sorted(k for k in left & right if (a / k).read_bytes() != (b / k).read_bytes())
    return diff


def copy_artifact(src: Path, dst: Path) -> Path:
    if src.is_dir():
        shutil.copytree(src, dst)
    else:
        shutil.copyfile(src, dst)
    return dst


def _roundtrip_test():
    """A fresh @given test per subclass: hypothesis refuses one test method run by several classes
    (HealthCheck.differing_executors), and each format keeps its own example database entries."""

    def test_roundtrip(self, tmp_path_factory, data):
        sample = data.draw(self.samples(), label="sample")
        path = tmp_path_factory.mktemp("roundtrip") / f"artifact{self.suffix}"
        self.write(path, sample)
        assert self.read(path) == self.expected(sample)
        self.verify(path)

    return test_roundtrip


class FormatConformance(abc.ABC):
    """Base of the format suites; see the module docstring for what a subclass supplies."""

    # -- supplied by the subclass --------------------------------------------------------------
    error: ClassVar[type[DataError] | tuple[type[DataError], ...]]  # every rejection is one (the format's typed errors)
    checksum_error: ClassVar[type[DataError]]  # what a flipped byte in a checksummed region raises
    goldens: ClassVar[dict[str, Path]]  # case -> committed golden file or tree, written from golden_sample(case)
    malformed_dirs: ClassVar[tuple[Path, ...]]  # corpus folders: every entry but expected.json and scripts
    flip_case: ClassVar[str]  # the golden case whose copy gets its bytes flipped
    regions: ClassVar[tuple[str, ...]]  # names of the checksummed regions, see region()
    suffix: ClassVar[str] = ""  # file name suffix of artifacts written by the tests

    @abc.abstractmethod
    def write(self, path: Path, sample: Any) -> None:
        """Write ``sample`` as a new artifact at ``path`` (a file, or a folder for tree formats)."""
        ...

    @abc.abstractmethod
    def read(self, path: Path) -> Any:
        """Everything a consumer gets from ``path`` through the verifying reader, as a value
        comparable with ``==`` (bytes, tuples, dicts: no numpy arrays)."""
        ...

    def expected(self, sample: Any) -> Any:
        """What :meth:`read` must return for an artifact written from ``sample``."""
        return sample

    @abc.abstractmethod
    def verify(self, path: Path) -> None:
        """The reader's verify path: raise the typed error when any stored checksum does not match."""
        ...

    @abc.abstractmethod
    def golden_sample(self, case: str) -> Any:
        """The fixed input the golden artifact ``goldens[case]`` was written from."""
        ...

    @abc.abstractmethod
    def samples(self) -> st.SearchStrategy:
        """Hypothesis strategy of inputs for :meth:`write`."""
        ...

    @abc.abstractmethod
    def region(self, path: Path, name: str) -> tuple[str, int]:
        """(member, offset) of one byte inside checksummed region ``name`` of the artifact at
        ``path``: member is "" for a single file, else the path of a file inside the tree."""
        ...

    def malformed_expected(self) -> dict[str, tuple[str | None, str | None]]:
        """Corpus entry -> (error class name, regex its message matches); either may be None.
        The keys must be exactly the corpus entries (an entry nobody expects is a stale file)."""
        return {}

    def open_malformed(self, path: str) -> None:
        """Open, read and verify a corpus entry the way a consumer would; it must raise."""
        self.read(Path(path))
        self.verify(Path(path))

    # -- parametrisation -----------------------------------------------------------------------
    def __init_subclass__(cls, **kw: Any) -> None:
        super().__init_subclass__(**kw)
        fn = _roundtrip_test()
        fn._hypothesis_internal_add_digest = cls.__qualname__.encode()
        cls.test_roundtrip = given(data=st.data())(fn)

    def pytest_generate_tests(self, metafunc: pytest.Metafunc) -> None:
        if "golden_case" in metafunc.fixturenames:
            metafunc.parametrize("golden_case", sorted(self.goldens))
        if "region_name" in metafunc.fixturenames:
            metafunc.parametrize("region_name", list(self.regions))
        if "malformed_entry" in metafunc.fixturenames:
            metafunc.parametrize("malformed_entry", sorted(self.corpus()))

    @classmethod
    def corpus(cls) -> dict[str, Path]:
        """Entry name -> path, over every corpus folder (generator scripts and expected.json excluded)."""
        out: dict[str, Path] = {}
        for d in cls.malformed_dirs:
            for p in sorted(d.iterdir()):
                if p.name in _CORPUS_SKIP or p.name.startswith(".") or p.suffix == ".py":
                    continue
                if p.name in out:
                    raise AssertionError(f"corpus entry {p.name} appears in two folders: {out[p.name]}, {p}")
                out[p.name] = p
        return out

    # -- golden bytes --------------------------------------------------------------------------
    def test_golden_bytes(self, tmp_path, golden_case):
        """Writing the fixed input gives exactly the committed golden artifact (compared, never regenerated)."""
        golden = self.goldens[golden_case]
        assert golden.exists(), f"{golden} is not committed"
        out = tmp_path / f"{golden_case}{self.suffix}"
        self.write(out, self.golden_sample(golden_case))
        assert same_bytes(golden, out) == [], f"output differs from {golden}"

    def test_golden_reads_back(self, golden_case):
        golden = self.goldens[golden_case]
        assert self.read(golden) == self.expected(self.golden_sample(golden_case))
        self.verify(golden)

    # -- malformed corpus ------------------------------------------------------------------------
    @pytest.fixture(scope="class")
    @classmethod
    def malformed_outcomes(cls) -> dict:
        """Open every corpus entry in one child process under an address-space cap; its report."""
        entries = [(name, str(path)) for name, path in sorted(cls.corpus().items())]
        module_file = sys.modules[cls.__module__].__file__
        env = {**os.environ, "MALLOC_ARENA_MAX": "2", "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}
        p = subprocess.run([sys.executable, "-c", _CHILD, str(MALFORMED_BUDGET), str(TESTS), module_file,
                            cls.__name__], input=json.dumps(entries), capture_output=True, text=True,
                           env=env, timeout=600)
        assert p.returncode == 0, f"the corpus child died (exit {p.returncode}):\n{p.stderr[-4000:]}"
        return json.loads(p.stdout.strip().splitlines()[-1])

    def test_malformed_corpus_is_complete(self):
        entries = self.corpus()
        assert entries, f"no corpus entries under {self.malformed_dirs}"
        expected = self.malformed_expected()
        if expected:
            assert sorted(expected) == sorted(entries), "expected.json and the corpus files disagree"

    def test_malformed_is_rejected(self, malformed_entry, malformed_outcomes):
        got = malformed_outcomes["results"][malformed_entry]
        path = str(self.corpus()[malformed_entry])
        assert got["outcome"] != "accepted", f"{path} was read without an error"
        assert got["outcome"] == "typed", f"{path}: untyped {got['type']}: {got['message']}\n{got['traceback']}"
        assert got["format_error"] and got["data_error"], (
            f"{path}: {got['type']} is not the format's typed error (a DataError): {got['message']}")
        assert got["exit_code"] == ExitCode.DATA
        assert path in got["message"], f"the message does not name the file: {got['message']}"
        assert got["hint"], f"{path}: {got['type']} carries no hint"
        cls_name, pattern = self.malformed_expected().get(malformed_entry, (None, None))
        if cls_name is not None:
            assert got["type"] == cls_name, got["message"]
        if pattern is not None:
            assert re.search(pattern, got["message"]), (pattern, got["message"])

    def test_malformed_memory_is_bounded(self, malformed_outcomes):
        """Every entry was handled under the cap, and resident memory grew by less than the budget."""
        assert set(malformed_outcomes["results"]) == set(self.corpus())
        assert 0 <= malformed_outcomes["peak_growth"] < MALFORMED_BUDGET, malformed_outcomes["peak_growth"]

    # -- flipped bytes ---------------------------------------------------------------------------
    def test_flipped_byte_is_a_checksum_error(self, tmp_path, region_name):
        art = copy_artifact(self.goldens[self.flip_case], tmp_path / f"flip{self.suffix}")
        self.verify(art)  # the untouched copy is clean: the error below is the flip's
        member, offset = self.region(art, region_name)
        flip_byte(art, member, offset)
        with pytest.raises(self.checksum_error) as ei:
            self.verify(art)
        assert str(art) in ei.value.message
        with pytest.raises(self.checksum_error):  # the verifying read returns no data either
            self.read(art)
