"""Member names are Unicode NFC on publish and on lookup (docs/formats/registry.md, "Member index").

macOS (and tools copying from it) name files in NFD: ``cafe\\u0301.png``; people and most
data type ``caf\\u00e9.png`` (NFC). The two look identical, so a lookup that compared them
byte for byte answered "no member 'café.png'; did you mean 'café.png'?".
"""

from __future__ import annotations

import json
import unicodedata

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import warpdata
from warpdata.registry.tarpack import ArtifactIndex, member_name

NFC = unicodedata.normalize("NFC", "img/café.png")
NFD = unicodedata.normalize("NFD", NFC)
H = "0" * 63 + "1"


def test_nfc_and_nfd_differ():
    assert NFC != NFD and member_name(NFD) == NFC


@pytest.mark.parametrize("stored", [NFC, NFD])
def test_index_lookup_in_either_form(stored):
    """An NFC index (as published now) and an NFD one (published before names were NFC) both answer both forms."""
    idx = ArtifactIndex.from_bytes(json.dumps(
        {"format": "warp-tar-index-1", "shards": [H], "members": {stored: [0, 512, 7], "a.txt": [0, 1536, 1]}}).encode())
    assert idx.lookup(NFC) == idx.lookup(NFD) == (H, 512, 7)
    assert NFC in idx and NFD in idx and "img/cafe.png" not in idx
    with pytest.raises(KeyError):
        idx.lookup("img/cafe.png")


@pytest.fixture
def photos(tmp_path):
    """An artifact folder whose file is named in NFD (as macOS gives), a table naming it in NFC."""
    (tmp_path / "imgs" / "img").mkdir(parents=True)
    (tmp_path / "imgs" / NFD).write_bytes(b"\x89PNG-cafe")
    (tmp_path / "imgs" / "img" / "plain.png").write_bytes(b"\x89PNG-plain")
    pq.write_table(pa.table({"id": [0, 1], "image": [NFC, "img/plain.png"]}), tmp_path / "t.parquet")
    return tmp_path


def _publish(cli, root, store):
    return cli("publish", "demo/uni", "--table", f"main={root / 't.parquet'}", "--artifact", f"media={root / 'imgs'}",
               "--bind", "main.image=media:image", "--store", store, "-q")


def test_published_in_nfc_and_found_in_either_form(photos, cli):
    store = photos / "store"
    r = _publish(cli, photos, store)
    assert r.code == 0, r.err  # the NFC value names the NFD file: no dangling binding
    ds = warpdata.dataset("demo/uni", store=str(store))
    art = ds.artifact("media")
    assert NFC in art.members() and NFD not in art.members()  # the index holds the NFC name
    assert art.read(NFD) == art.read(NFC) == b"\x89PNG-cafe"
    rows = list(ds.table("main").rows())
    assert rows[0]["image"].read_bytes() == b"\x89PNG-cafe"
    for typed in (NFC, NFD):
        r = cli("cat", "demo/uni", "--artifact", "media", "--ref", typed, "--store", store)
        assert r.code == 0 and r.err == "", r.err


def test_two_files_equal_in_nfc_are_refused(photos, cli):
    (photos / "imgs" / NFC).write_bytes(b"other")  # Linux keeps both names apart; readers could not
    r = _publish(cli, photos, photos / "store")
    assert r.code == 65, r.err
    assert "same name in Unicode NFC" in r.err and "rename one" in r.err
