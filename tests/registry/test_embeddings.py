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
    r = cli("ingest", "imagefolder", tmp_path / "f", "ws/pets", "--id", "stem", "--json")
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
    from warpdata.publishing.publish import DatasetBuilder

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


# -- reuse: a new dataset version encodes only the rows that changed ------------------------------

def _publish_text(tmp_path, rows: dict[str, str], tag: str) -> str:
    from warpdata.publishing.publish import DatasetBuilder

    src = tmp_path / f"{tag}.parquet"
    pq.write_table(pa.table({"id": list(rows), "caption": list(rows.values())}), src)
    return DatasetBuilder("ws/caps").add_table("main", str(src)).publish().version_hash


def test_new_version_encodes_only_changed_rows(cli, tmp_path):
    from support import encoders

    v1 = {f"t{i}": f"caption number {i} of a {['cat', 'dog', 'bird'][i % 3]}" for i in range(300)}
    _publish_text(tmp_path, v1, "v1")
    encoders.CALLS.clear()
    args = ("embeddings", "add", "ws/caps", "--column", "caption", "--encoder", "support.encoders:CountingText",
            "--name", "caps")
    r = cli(*args, "--json")
    assert r.code == 0, r.err
    first = r.json()
    assert (first["encoded"], first["reused"], first["reused_from"]) == (300, 0, None)
    assert sum(len(c) for c in encoders.CALLS) == 300
    v1_vectors = dict(zip(*[warpdata.dataset("ws/caps").table("emb_caps").to_arrow().column(c).to_pylist()
                            for c in ("id", "vector")], strict=True))

    # version 2: 5 rows dropped, 7 captions edited, 11 new rows (one repeats a kept row's caption under a new id),
    # and the rows in reverse order: matching is by id and content, not by position
    v2 = {k: v for k, v in v1.items() if k not in {f"t{i}" for i in range(5)}}
    edited = [f"t{i}" for i in range(100, 107)]
    for k in edited:
        v2[k] += " (edited)"
    new = {f"n{i}": f"a brand new caption {i}" for i in range(10)} | {"n10": v1["t200"]}
    v2 = dict(reversed(list((v2 | new).items())))
    _publish_text(tmp_path, v2, "v2")
    assert "emb_caps" not in warpdata.dataset("ws/caps").tables  # the new version has no embeddings yet
    encoders.CALLS.clear()
    r = cli(*args)
    assert r.code == 0, r.err
    assert "encoded 18, reused 288 from " + first["version_hash"][:12] in r.err
    assert sorted(x for c in encoders.CALLS for x in c) == sorted([v2[k] for k in edited] + list(new.values()))
    ds = warpdata.dataset("ws/caps")
    assert ds.manifest.version_hash == r.out.strip()
    t = ds.table("emb_caps").to_arrow()
    assert t.column("id").to_pylist() == list(v2)
    got = dict(zip(t.column("id").to_pylist(), t.column("vector").to_pylist(), strict=True))
    fresh = encoders.CountingText().embed(list(v2.values()))
    for i, k in enumerate(v2):  # every vector is what encoding the row now gives, reused ones bit for bit
        assert np.array_equal(np.asarray(got[k], np.float32), fresh[i]), k
        if k in v1 and k not in edited:
            assert got[k] == v1_vectors[k]
    assert ds.embeddings("caps").search("n10", k=2)[0]["distance"] < 1e-6

    # the same version again: nothing encoded, nothing uploaded; another encoder identity reuses nothing
    encoders.CALLS.clear()
    again = cli(*args, "--json").json()
    assert (again["encoded"], again["reused"], again["blobs_uploaded"]) == (0, 306, 0) and encoders.CALLS == []
    other = cli(*args, "--option", "dim=128", "--json").json()
    assert (other["encoded"], other["reused"], other["dim"]) == (306, 0, 128)
    forced = cli(*args, "--no-reuse", "--json").json()
    assert (forced["encoded"], forced["reused"]) == (306, 0)


def test_changed_image_is_the_only_one_encoded(cli, pets, tmp_path):
    first = cli("embeddings", "add", "ws/pets", "--column", "image", "--encoder", "color-hist", "--json").json()
    assert first["encoded"] == 9
    Image.new("RGB", (24, 24), (200, 200, 20)).save(tmp_path / "f" / "red" / "red1.png")  # new bytes, same name
    r = cli("ingest", "imagefolder", tmp_path / "f", "ws/pets", "--id", "stem", "--json")
    assert r.code == 0, r.err
    second = cli("embeddings", "add", "ws/pets", "--column", "image", "--encoder", "color-hist", "--json").json()
    assert (second["encoded"], second["reused"], second["reused_from"]) == (1, 8, first["version_hash"])
    hits = warpdata.dataset("ws/pets").embeddings("color_hist").search("red0", k=3)
    assert "red1" not in {h["id"] for h in hits}  # its vector is the new image's


def test_option_parsing_is_typed(cli, pets):
    r = cli("embeddings", "add", "ws/pets", "--column", "image", "--encoder", "color-hist", "--option", "dim")
    assert r.code == 2 and "KEY=VALUE" in r.err
    r = cli("embeddings", "add", "ws/pets", "--column", "image", "--encoder", "color-hist", "--option", "size=3")
    assert r.code == 78 and "rejected its options ['size']" in r.err
    r = cli("embeddings", "add", "ws/pets", "--column", "image", "--encoder", "color-hist", "--index", "hnsw")
    assert r.code == 2 and "auto, exact, ivf-flat" in r.err
