"""The table of artifact kinds: every kind has a schema that loads, and the schema is enforced."""

from __future__ import annotations

import json

import jsonschema
import numpy as np
import pytest
from warpdata.artifacts import kinds
from warpdata.artifacts.inspect import INSPECTORS
from warpdata.core.errors import DataError
from warpdata.core.names import MANIFEST_NAME


@pytest.mark.parametrize("kind", sorted(kinds.KINDS))
def test_every_kind_has_a_valid_json_schema(kind):
    s = kinds.schema(kind)
    jsonschema.Draft202012Validator.check_schema(s)
    assert kinds.KINDS[kind].manifest == MANIFEST_NAME


def test_every_kind_has_an_inspector():
    inspected = {t.name: t for t in INSPECTORS}
    assert set(kinds.KINDS) <= set(inspected)
    for k in kinds.KINDS.values():
        assert inspected[k.name].inspector == k.inspector and inspected[k.name].previewer == k.previewer


def test_a_written_zarr_manifest_validates_and_a_damaged_one_is_refused(tmp_path):
    from warpdata.tiles import write_array

    a = np.arange(16 * 64 * 64, dtype="u2").reshape(16, 64, 64)
    write_array(str(tmp_path / "a.zarr"), a, (8, 32, 32), levels=2)
    doc = json.loads((tmp_path / "a.zarr" / MANIFEST_NAME).read_bytes())
    assert kinds.validate(doc, "a.zarr") is doc
    for field, bad in [("shape", [-1, 64, 64]), ("codec", {"name": "gzip", "level": 1, "checksum": None}),
                       ("array", "../outside"), ("input_crc32c", "xyz")]:
        with pytest.raises(DataError, match=field):
            kinds.validate({**doc, field: bad}, "a.zarr/manifest.json")
    with pytest.raises(DataError, match="unknown manifest kind"):
        kinds.validate({**doc, "kind": "nope"}, "a.zarr/manifest.json")


def test_every_order_hook_loads_and_the_loaders_are_the_ones_warp_order_names():
    """``warp order`` finds each loader's order through the table (warpdata.read.order imports no system)."""
    from warpdata.core.registry import load
    from warpdata.read.order import KIND_NAMES

    hooks = {name: k.order for name, k in kinds.KINDS.items() if k.order}
    hooks.update({name: k.order for name, k in kinds.FILE_KINDS.items()})
    assert set(hooks) == set(KIND_NAMES) == {"tensor-warehouse", "feature-cache", "tbl"}
    for target in hooks.values():
        assert callable(load(target, "order hook"))
