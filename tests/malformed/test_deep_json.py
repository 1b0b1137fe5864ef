"""JSON documents nested 200,000 deep (issue 36): every document a reader meets (a published manifest,
a ``latest`` pointer, a warehouse / feature-cache / tiles manifest, a registration, a tar member index,
an ETL receipt) is refused as malformed data (exit 65, a typed DataError), never a RecursionError (70)."""

from __future__ import annotations

import json

import pytest
from warpdata.core.errors import DataError
from warpdata.core.jsondoc import JSONDocumentError, load_json
from warpdata.core.names import FEATURE_CACHE, TENSOR_WAREHOUSE, ZARR_ARRAY

DEEP = 200_000
HASH = "ab" * 32


def deep(**fields) -> bytes:
    """A JSON object with ``fields`` and a list nested ``DEEP`` deep."""
    head = json.dumps(fields)[:-1] + (", " if fields else "")
    return (head + '"deep": ' + "[" * DEEP + "]" * DEEP + "}").encode()


def test_helper_bounds_size_nesting_and_syntax():
    with pytest.raises(JSONDocumentError, match="nested more than 64 deep") as e:
        load_json(deep(), "doc")
    assert e.value.details["field"] == "nesting"
    with pytest.raises(JSONDocumentError, match="nested more than 3 deep"):  # deep, yet within the parser's limit
        load_json("[[[[1]]]]", "doc", max_depth=3)
    assert load_json("[[[1]]]", "doc", max_depth=3) == [[[1]]]
    with pytest.raises(JSONDocumentError, match="more than such a document may be") as e:
        load_json(b"[" + b"0," * 100 + b"0]", "doc", max_bytes=100)
    assert e.value.details["field"] == "size"
    with pytest.raises(JSONDocumentError, match="not valid JSON"):
        load_json(b"\xff{", "doc")
    assert isinstance(e.value, DataError) and e.value.exit_code == 65


@pytest.mark.parametrize("kind", [TENSOR_WAREHOUSE, FEATURE_CACHE, ZARR_ARRAY])
def test_artifact_manifest_inspect(cli, tmp_path, kind):
    (tmp_path / "manifest.json").write_bytes(deep(kind=kind))
    r = cli("inspect", tmp_path)
    assert r.code == 65, (r.code, r.err)
    assert "RecursionError" not in r.err


def test_warehouse_and_feature_cache_readers(tmp_path):
    from warpdata.features import manifest as fmanifest
    from warpdata.warehouse import manifest as wmanifest

    (tmp_path / "manifest.json").write_bytes(deep(kind=TENSOR_WAREHOUSE))
    with pytest.raises(DataError, match="nested more than"):
        wmanifest.read(tmp_path)
    (tmp_path / "manifest.json").write_bytes(deep(kind=FEATURE_CACHE))
    with pytest.raises(DataError, match="nested more than"):
        fmanifest.read(tmp_path)


def _store(tmp_path, monkeypatch):
    from warpdata.registry.store import Store

    root = tmp_path / "store"
    monkeypatch.setenv("WARP_STORE", str(root))
    return Store(root), root


def test_published_manifest(cli, tmp_path, monkeypatch):
    store, root = _store(tmp_path, monkeypatch)
    (root / store.manifest_key("ws/deep", HASH)).parent.mkdir(parents=True, exist_ok=True)
    (root / store.manifest_key("ws/deep", HASH)).write_bytes(deep(kind="dataset-manifest"))
    (root / store.latest_key("ws/deep")).write_text(json.dumps(
        {"kind": "latest-pointer", "dataset_id": "ws/deep", "version_hash": HASH}))
    for cmd in (("info", "ws/deep"), ("inspect", "ws/deep")):
        r = cli(*cmd)
        assert r.code == 65, (cmd, r.code, r.err)


def test_latest_pointer(cli, tmp_path, monkeypatch):
    store, root = _store(tmp_path, monkeypatch)
    (root / store.latest_key("ws/deep")).parent.mkdir(parents=True, exist_ok=True)
    (root / store.latest_key("ws/deep")).write_bytes(deep(kind="latest-pointer", dataset_id="ws/deep"))
    r = cli("info", "ws/deep")
    assert r.code == 65, (r.code, r.err)
    with pytest.raises(DataError):
        store.read_latest("ws/deep")


def test_registration(cli, tmp_path, monkeypatch):
    from warpdata.registry.register import load, registry_path

    _store(tmp_path, monkeypatch)
    p = registry_path("ws/deep")
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_bytes(deep(kind="registration", dataset_id="ws/deep"))
    with pytest.raises(DataError, match="nested more than"):
        load("ws/deep")
    r = cli("info", "ws/deep")
    assert r.code == 65, (r.code, r.err)


def test_tar_member_index():
    from warpdata.registry.tarpack import ArtifactIndex

    with pytest.raises(DataError, match="nested more than"):
        ArtifactIndex.from_bytes(deep(format="x"), "index.json")


def test_etl_receipt_is_not_a_receipt(tmp_path):
    from warpdata.etl.receipts import Journal

    j = Journal(str(tmp_path))
    with open(j.path("s00000"), "wb") as f:
        f.write(deep(receipt=1, shard_id="s00000"))
    assert j.load("s00000") is None  # a damaged receipt is no receipt: the shard is rebuilt
