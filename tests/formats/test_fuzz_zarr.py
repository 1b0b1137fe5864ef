"""Mutation fuzzing of warp's Zarr output: every damaged copy is a typed error or reads intact.

Fixed seed, 600 cases over the golden sharded, unsharded and pyramid arrays
(tests/golden/zarr). Each case damages one file — a chunk/shard object or a
``zarr.json`` — by a bit flip, a random byte, a truncation, an extension or a
zeroed run, then reads it through warp's reader (``read_array`` of every
level) and ``warp inspect --verify`` (in-process). Allowed outcomes: a
:class:`~warpdata.core.errors.WarpError` (typed, exit 65/66/...), a verify report
with ``ok=False``, or data identical to the original. A damaged chunk byte
must always be caught (the crc32c codec, docs/formats/zarr-tiles.md).
"""

from __future__ import annotations

import random
import shutil
from pathlib import Path

import numpy as np
import pytest
from warpdata.core.errors import WarpError
from warpdata.formats import zarr_v3
from warpdata.storage import zarr_store
from warpdata.tiles import inspect as zinspect

GOLDEN = Path(__file__).parents[1] / "golden" / "zarr"
CASES = 600
SEED = 20240611


def _files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file() and p.name != "manifest.json")


def _arrays(root: Path) -> list[Path]:
    return [root / p for p in ("0", "1")] if (root / "0").is_dir() else [root]


def _mutate(rng: random.Random, data: bytes) -> tuple[str, bytes]:
    kind = rng.choice(["flip", "byte", "truncate", "extend", "zero", "flip"])
    b = bytearray(data)
    if kind == "flip" and b:
        i = rng.randrange(len(b))
        b[i] ^= 1 << rng.randrange(8)
    elif kind == "byte" and b:
        i = rng.randrange(len(b))
        b[i] = (b[i] + rng.randrange(1, 256)) % 256
    elif kind == "truncate" and b:
        del b[rng.randrange(len(b)):]
    elif kind == "extend":
        b += bytes(rng.randrange(256) for _ in range(rng.randrange(1, 9)))
    elif b:
        i = rng.randrange(len(b))
        b[i:i + rng.randrange(1, 17)] = bytes(min(16, len(b) - i))
    return kind, bytes(b)


def _outcome(root: Path, originals: dict[Path, np.ndarray]) -> tuple[bool, bool]:
    """(warp's reader read the original data everywhere, --verify passed); typed errors count as caught."""
    intact = True
    for arr, want in originals.items():
        try:
            got = zarr_store.read_array(arr)
        except WarpError:
            intact = False
            continue
        if got.dtype != want.dtype or got.shape != want.shape or got.tobytes() != want.tobytes():
            intact = False
            pytest.fail(f"{arr}: warp's reader returned different data without an error")
    try:
        passed = zinspect.inspect(str(root), verify=True).ok
    except WarpError:
        passed = False
    return intact, passed


@pytest.fixture(scope="module")
def workdirs(tmp_path_factory):
    base = tmp_path_factory.mktemp("fuzz")
    out = []
    for name in ("sharded.zarr", "unsharded.zarr", "pyramid.zarr"):
        shutil.copytree(GOLDEN / name, base / name)
        root = base / name
        out.append((root, {a: zarr_store.read_array(a) for a in _arrays(root)}))
    return out


def test_mutations_are_typed_errors_or_intact(workdirs, record_property):
    rng = random.Random(SEED)
    caught_chunks = 0
    counts = {"typed": 0, "intact": 0}
    for case in range(CASES):
        root, originals = workdirs[case % len(workdirs)]
        files = _files(root)
        target = rng.choice(files)
        good = target.read_bytes()
        kind, bad = _mutate(rng, good)
        if bad == good:
            continue
        target.write_bytes(bad)
        try:
            intact, passed = _outcome(root, originals)
        except Exception as e:  # an untyped error is exactly what this test exists to find
            raise AssertionError(f"case {case}: {kind} of {target.relative_to(root.parent)} raised "
                                 f"{type(e).__name__}: {e}") from e
        finally:
            target.write_bytes(good)
        counts["intact" if intact and passed else "typed"] += 1
        where = f"case {case}: {kind} of {target.relative_to(root.parent)}"
        assert intact or not passed, f"{where}: --verify passed although the data no longer reads back"
        if target.name != zarr_v3.ZARR_JSON:  # chunk/shard bytes: always caught by both
            assert not intact and not passed, f"{where}: a damaged chunk object went unnoticed"
            caught_chunks += 1
    record_property("outcomes", counts)  # the fuzz table (--junitxml)
    assert caught_chunks > CASES // 3


def test_malformed_zarr_json_corpus(cli):
    """tests/malformed/zarr: each reproducer is a typed error naming what is wrong (exit 65), in both
    warp's reader and `warp inspect --verify`."""
    import json

    corpus = Path(__file__).parents[1] / "malformed" / "zarr"
    expected = json.loads((corpus / "expected.json").read_text())
    assert expected
    for name, needle in expected.items():
        with pytest.raises(WarpError, match=needle):
            zarr_store.read_array(corpus / name)
        r = cli("inspect", "--verify", str(corpus / name))
        assert r.code == 65, (name, r.code, r.err)
        assert needle.replace("\\", "") in r.err, (name, r.err)
