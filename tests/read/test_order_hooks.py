"""``warp order`` through the artifact-kind table (warpdata.artifacts.kinds): a kind no loader reads
is refused by name, and ordering loads only the system it orders."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
from warpdata.core.errors import MissingInputError
from warpdata.read.order import epoch_order


def test_a_zarr_array_has_no_loader_to_order(tmp_path):
    from warpdata.tiles import write_array

    write_array(str(tmp_path / "a.zarr"), np.zeros((4, 32, 32), "u2"), (2, 16, 16), levels=1)
    with pytest.raises(MissingInputError, match="zarr-array has no loader to order"):
        epoch_order(tmp_path / "a.zarr")


def test_ordering_a_tbl_file_loads_no_other_system(tmp_path):
    from warpdata.formats.tbl import TblWriter

    path = tmp_path / "x.tbl"
    with TblWriter(path, fsync=False, compression="none") as w:
        for i in range(5):
            w.add(b"%d" % i, format="unknown", width=0, height=0)
    code = ("import json, sys\nfrom warpdata.read.order import epoch_order\n"
            f"o = epoch_order({str(path)!r})\n"
            "print(json.dumps([o.kind, len(o.sequence), sorted(m for m in sys.modules if m.startswith("
            "('warpdata.warehouse', 'warpdata.features', 'warpdata.tiles')))]))\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout) == ["tbl", 5, []]
