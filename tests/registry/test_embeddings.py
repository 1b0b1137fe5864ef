"""Embeddings as a derived, published artifact: `warp embeddings add|list|info` and exact search."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import warpdata
from PIL import Image


@pytest.fixture
def pets(cli, tmp_path):
    colors = {"red": (230, 30, 30), "green": (30, 230, 30), "blue": (30, 30, 230)}  # shades stay in one bin
    for cname, c in colors.items():
        (tmp_path / "f" / cname).mkdir(parents=True)
        for i in range(3):
            shade = tuple(v - 5 * i for v in c)
            Image.new("RGB", (24, 24), shade).save(tmp_path / "f" / cname / f"{cname}{i}.png")
    r = cli("ingest", "imagefolder", tmp_path / "f", "ws/pets", "--json")
    assert r.code == 0, r.err
    return r.json()["version_hash"]


def test_add_list_info_and_search(cli, pets):
    r = cli("embeddings", "add", "ws/pets", "--column", "image", "--encoder", "color-hist", "--json")
    assert r.code == 0, r.err
    doc = r.json()
    assert doc["rows"] == 9 and doc["dim"] == 128 and doc["version_hash"] != pets
    ds = warpdata.dataset("ws/pets")
    assert ds.manifest.version_hash == doc["version_hash"]
    assert {"main", "emb_color_hist"} <= set(ds.tables) and "emb_color_hist_index" in ds.artifacts
    # the new version keeps the old tables and artifacts, blob for blob
    old = warpdata.dataset("ws/pets", version=pets).manifest
    assert ds.manifest.tables["main"] == old.tables["main"] and ds.manifest.artifacts["images"] == old.artifacts["images"]
    lst = cli("embeddings", "list", "ws/pets", "--json").json()
    assert list(lst["embeddings"]) == ["color_hist"] and lst["embeddings"]["color_hist"]["count"] == 9
    info = cli("embeddings", "info", "ws/pets", "color_hist", "--json").json()
    assert info["metric"] == "cosine" and info["column"] == "image" and info["encoder"]["name"] == "color-hist"

    idx = ds.embeddings("color_hist")
    ids = ds.table("main").to_arrow().column("id").to_pylist()
    hits = idx.search(ids.index("green1"), k=3)
    assert {h["id"] for h in hits} == {"green0", "green1", "green2"}
    assert abs(hits[0]["distance"]) < 1e-6 and hits[0]["id"] == "green0"  # equal distances: lowest row first
    assert [h["distance"] for h in hits] == sorted(h["distance"] for h in hits)
    assert idx.search("red0", k=1)[0]["id"] == "red0"
    # a query vector gives the same answer as a brute-force search over the published table
    vec = np.stack(ds.table("emb_color_hist").to_arrow().column("vector").to_numpy(zero_copy_only=False))
    q = vec[ids.index("blue2")]
    sims = (vec / np.linalg.norm(vec, axis=1, keepdims=True)) @ (q / np.linalg.norm(q))
    assert [h["row"] for h in idx.search(q, k=4)] == list(np.argsort(-sims, kind="stable")[:4])
    # adding the same embedding again uploads nothing new
    again = cli("embeddings", "add", "ws/pets", "--column", "image", "--encoder", "color-hist", "--json").json()
    assert again["blobs_uploaded"] == 0


def test_text_column_plugin_by_module_path(cli, tmp_path):
    src = tmp_path / "t.parquet"
    pq.write_table(pa.table({"id": ["a", "b", "c"], "caption": ["a red cat", "a red cat sleeps", "blue sky"]}), src)
    from warpdata.registry.publish import DatasetBuilder

    DatasetBuilder("ws/text").add_table("main", str(src)).publish()
    r = cli("embeddings", "add", "ws/text", "--column", "caption", "--encoder",
            "warpdata.registry.embeddings:HashTextEncoder", "--name", "words", "--json")
    assert r.code == 0, r.err
    hits = warpdata.dataset("ws/text").embeddings("words").search("a", k=2)
    assert [h["id"] for h in hits] == ["a", "b"]


def test_errors_are_typed(cli, pets):
    assert cli("embeddings", "add", "ws/pets", "--column", "nope", "--encoder", "color-hist").code == 2
    assert cli("embeddings", "add", "ws/pets", "--column", "image", "--encoder", "no_such_encoder").code == 78
    assert cli("embeddings", "add", "ws/pets", "--column", "label", "--encoder", "color-hist").code == 65
    assert cli("embeddings", "info", "ws/pets", "clip").code == 66
    assert cli("embeddings", "frobnicate", "ws/pets").code == 2
    assert cli("embeddings", "add", "ws/pets", "--column", "image", "--encoder", "color-hist").code == 0
    from warpdata.core.errors import UsageError

    with pytest.raises(UsageError, match="dimensions"):
        warpdata.dataset("ws/pets").embeddings("color_hist").search(np.zeros(3), k=1)
