"""The all-reduce recipe of docs/partitioning.md ("Digests") and the README, run as written by two
real ``torch.distributed`` ranks (gloo, one process each) over a resumed epoch of a ``.tbl`` file."""

from __future__ import annotations

import multiprocessing
import re
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

DOC = Path(__file__).resolve().parents[2] / "docs" / "partitioning.md"


def recipe() -> str:
    """The four lines of the recipe, from the document."""
    block = re.search(r"\*\*Checking it in a job\*\*.*?```python\n(.*?)```", DOC.read_text(), re.S).group(1)
    lines = [ln for ln in block.splitlines() if ln.strip()]
    assert len(lines) == 4
    return "\n".join(lines)


def _rank(rank: int, init: str, path: str, expected: str, old_states: list, out) -> None:
    import torch.distributed as dist
    import warpdata
    from warpdata.tbl.loader import TblLoader

    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=2)
    try:
        loader = TblLoader(path, 3, shuffle=True, seed=5, threads=1, resume=old_states)  # rank, world: from dist
        epoch = loader.epoch
        for _ in loader:
            pass
        state = loader.state_dict()
        scope = {"dist": dist, "warpdata": warpdata, "state": state, "EXPECTED": expected, "epoch": epoch}
        exec(recipe(), scope)
        out.put((rank, scope["digest"]))
    except BaseException as e:  # reported to the test, which fails with it
        out.put((rank, repr(e)))
    finally:
        dist.destroy_process_group()


def test_the_recipe_checks_a_resumed_epoch_on_two_real_ranks(tmp_path):
    from warpdata.formats import tbl
    from warpdata.read.order import epoch_order
    from warpdata.sampledata.photos import encode_jpeg, synthetic_photo
    from warpdata.tbl.loader import TblLoader

    p = tmp_path / "x.tbl"
    rng = np.random.default_rng(2)
    with tbl.TblWriter(p, fsync=False) as w:
        for _ in range(29):
            w.add(encode_jpeg(synthetic_photo(rng, 8, 8), 70))
    old = []  # a run of 3 ranks stopped after 2 batches each
    for r in range(3):
        loader = TblLoader(p, 3, shuffle=True, seed=5, rank=r, world_size=3, threads=1)
        old.append(loader.state_dict(2))
    expected = epoch_order(p, seed=5, shuffle=True).set_digest()
    ctx = multiprocessing.get_context("fork")
    out = ctx.Queue()
    init = f"file://{tmp_path / 'rendezvous'}"
    procs = [ctx.Process(target=_rank, args=(r, init, str(p), expected, old, out)) for r in range(2)]
    for proc in procs:
        proc.start()
    got = dict(out.get(timeout=120) for _ in procs)
    for proc in procs:
        proc.join(60)
    assert got == {0: expected, 1: expected}


def test_the_readme_shows_the_same_recipe():
    readme = (DOC.parents[1] / "README.md").read_text()
    assert recipe() in readme
