"""`warp card` and `warp publish --card`: generated sections between markers, hand-written text
kept, history with diff summaries, a preview beside the card (docs/lineage.md)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from warpdata.sampledata.photos import encode_jpeg, synthetic_photo


def image_dataset(d: Path, n: int, seed: int = 0) -> list[str]:
    """``n`` JPEGs under d/photos and d/table/main.parquet naming them (a bound image column)."""
    rng = np.random.default_rng(seed)
    (d / "photos").mkdir(parents=True, exist_ok=True)
    (d / "table").mkdir(exist_ok=True)
    names = []
    for i in range(n):
        (d / "photos" / f"p{i:03d}.jpg").write_bytes(encode_jpeg(synthetic_photo(rng, 40, 32)))
        names.append(f"p{i:03d}.jpg")
    pq.write_table(pa.table({"key": [f"k{i}" for i in range(n)], "image": names, "label": list(range(n))}),
                   d / "table" / "main.parquet")
    return names


def publish(cli, d: Path, store, *extra) -> str:
    r = cli("publish", "ws/pics", "--table", f"main={d / 'table' / 'main.parquet'}", "--artifact",
            f"photos={d / 'photos'}", "--bind", "main.image=photos:image", "--store", store, "--json", *extra)
    assert r.code == 0, r.err
    return r.json()["version_hash"]


def test_a_card_has_every_section_and_a_preview_beside_it(cli, tmp_path):
    store = tmp_path / "store"
    image_dataset(tmp_path, 5)
    v = publish(cli, tmp_path, store)
    card = tmp_path / "CARD.md"
    r = cli("card", "ws/pics", "--out", card, "--store", store)
    assert r.code == 0, r.err
    assert r.out == "" and "wrote" in r.err
    text = card.read_text()
    for name in ("summary", "tables", "artifacts", "quarantine", "sources", "history", "preview"):
        assert f"<!-- warp:card:begin {name} -->" in text and f"<!-- warp:card:end {name} -->" in text
    assert v in text and "| `label` | int64 | 0 | 4 | 0 |" in text
    assert "| files | `image`" not in text and "| main | `image` | photos | image |" in text
    assert "![preview of ws/pics](CARD.preview.png)" in text
    png = (tmp_path / "CARD.preview.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    assert "first version" in text
    shown = cli("card", "ws/pics", "--store", store)
    assert shown.code == 0 and shown.out.startswith("# ws/pics") and "No preview" in shown.out


def test_regenerating_keeps_hand_written_text_and_updates_the_sections(cli, tmp_path):
    store = tmp_path / "store"
    image_dataset(tmp_path, 5)
    v1 = publish(cli, tmp_path, store)
    card = tmp_path / "CARD.md"
    assert cli("card", "ws/pics", "--out", card, "--store", store).code == 0
    text = card.read_text()
    intro = "Photos of the lab bench, taken by hand.\n\nLicense: CC-BY-4.0 | do not remove.\n"
    between = "\nA note between two sections, kept as written.\n"
    edited = text.replace("# ws/pics\n", "# ws/pics\n\n" + intro, 1)
    edited = edited.replace("<!-- warp:card:end tables -->\n", "<!-- warp:card:end tables -->\n" + between, 1)
    edited += "\n## Citation\n\n@misc{pics, title={Pics}}\n"
    card.write_text(edited)
    image_dataset(tmp_path, 6, seed=1)  # one more photo and every pixel new: a second version
    v2 = publish(cli, tmp_path, store)
    r = cli("card", "ws/pics", "--out", card, "--store", store, "--json")
    assert r.code == 0, r.err
    assert r.json()["kept_from"] == "file"
    new = card.read_text()
    assert intro in new and between in new and new.endswith("\n## Citation\n\n@misc{pics, title={Pics}}\n")
    assert v2 in new and v1 not in new.split("<!-- warp:card:begin history -->")[0]
    history = new.split("<!-- warp:card:begin history -->")[1]
    assert f"`{v1[:12]}`" in history and f"`{v2[:12]}` (this card)" in history
    assert "rows +1 -0 ~0, members +1 -0 ~5" in history  # the new row and photo; 5 photos repainted
    outside = [part.split("<!-- warp:card:begin")[0] for part in new.split("-->\n")]
    assert any("Photos of the lab bench" in p for p in outside)


def test_broken_markers_are_refused_and_the_file_is_left_alone(cli, tmp_path):
    store = tmp_path / "store"
    image_dataset(tmp_path, 3)
    publish(cli, tmp_path, store)
    card = tmp_path / "CARD.md"
    card.write_text("# mine\n<!-- warp:card:begin tables -->\nhalf a section\n")
    r = cli("card", "ws/pics", "--out", card, "--store", store)
    assert r.code == 2 and "end marker" in r.err
    assert card.read_text() == "# mine\n<!-- warp:card:begin tables -->\nhalf a section\n"


def test_publish_card_keeps_it_in_the_envelope_and_card_regenerates_around_it(cli, tmp_path):
    from warpdata.registry.store import Store

    store = tmp_path / "store"
    image_dataset(tmp_path, 4)
    mine = tmp_path / "mine.md"
    mine.write_text("# Pics\n\nHand-written: what these photos are for.\n")
    v = publish(cli, tmp_path, store, "--card", mine)
    doc = json.loads(Store(store).get_manifest_bytes("ws/pics", v))
    assert doc["metadata"]["card"] == mine.read_text()
    r = cli("card", "ws/pics", "--store", store)
    assert r.code == 0 and r.out.startswith("# Pics\n\nHand-written: what these photos are for.\n")
    assert "<!-- warp:card:begin summary -->" in r.out
    again = cli("publish", "ws/pics", "--table", f"main={tmp_path / 'table' / 'main.parquet'}", "--artifact",
                f"photos={tmp_path / 'photos'}", "--bind", "main.image=photos:image", "--store", store,
                "--card", tmp_path / "CARD-other.md")
    assert again.code == 66 and "CARD-other.md" in again.err
    (tmp_path / "other.md").write_text("another card")
    again = cli("publish", "ws/pics", "--table", f"main={tmp_path / 'table' / 'main.parquet'}", "--artifact",
                f"photos={tmp_path / 'photos'}", "--bind", "main.image=photos:image", "--store", store,
                "--card", tmp_path / "other.md", "--json")
    assert again.code == 0 and again.json()["card_stored"] is False and "already published" in again.err
    assert json.loads(Store(store).get_manifest_bytes("ws/pics", v))["metadata"]["card"] == mine.read_text()


@pytest.mark.s3
def test_a_card_of_a_warehouse_on_s3_counts_quarantine_reasons_and_lists_source_hashes(cli, s3, coco_warehouse,
                                                                                       tmp_path):
    import hashlib

    url = s3.url("warp")
    assert cli("publish", "ws/wh", "--from", coco_warehouse, "--store", url).code == 0
    r = cli("card", "ws/wh", "--out", tmp_path / "CARD.md", "--store", url)
    assert r.code == 0, r.err
    text = (tmp_path / "CARD.md").read_text()
    quarantine = text.split("<!-- warp:card:begin quarantine -->")[1].split("<!-- warp:card:end")[0]
    assert "| `truncated` | 2 |" in quarantine and "| `missing-file` | 1 |" in quarantine
    img = coco_warehouse.parent.parent / "coco" / "images" / "img_00000.jpg"
    assert f"| images/img_00000.jpg | `{hashlib.sha256(img.read_bytes()).hexdigest()}` |" in text
    version = json.loads((coco_warehouse / "manifest.json").read_text())["version"]
    assert f"tensor-warehouse | version `{version}`" in text
    assert "No preview: ws/wh binds no column to an image artifact" in text


def test_out_that_is_binary_or_a_directory_is_refused_with_a_typed_error(cli, tmp_path):
    # review finding: a non-UTF-8 --out file exited 70 (UnicodeDecodeError); a directory drew the
    # preview beside it, then failed naming a temporary file
    store = tmp_path / "store"
    image_dataset(tmp_path, 3)
    publish(cli, tmp_path, store)
    binary = tmp_path / "photo.md"
    binary.write_bytes(b"\x89PNG\r\n\x1a\n\xff\xfe")
    r = cli("card", "ws/pics", "--out", binary, "--store", store)
    assert r.code == 65 and f"--out {binary}: not UTF-8 text" in r.err and "hint:" in r.err
    assert binary.read_bytes() == b"\x89PNG\r\n\x1a\n\xff\xfe"
    folder = tmp_path / "cards"
    folder.mkdir()
    r = cli("card", "ws/pics", "--out", folder, "--store", store)
    assert r.code == 2 and f"--out {folder}: it is a directory" in r.err and ".warp-tmp" not in r.err
    assert not (tmp_path / "cards.preview.png").exists()


def test_publish_card_that_is_a_directory_is_a_usage_error_not_a_write_failure(cli, tmp_path):
    # review finding: the read fell through to the OS taxonomy: "cannot write DIR", exit 73
    image_dataset(tmp_path, 2)
    r = cli("publish", "ws/pics", "--table", f"main={tmp_path / 'table' / 'main.parquet'}",
            "--store", tmp_path / "store", "--card", tmp_path / "photos")
    assert r.code == 2 and f"--card {tmp_path / 'photos'}: it is a directory" in r.err
    assert "cannot write" not in r.err and not (tmp_path / "store").exists()


def test_publish_refuses_a_card_with_broken_markers(cli, tmp_path):
    # review finding: it was stored, and every later `warp card` of that version failed with a
    # hint ("restore the end marker") that cannot be followed: a stored manifest is never rewritten
    store = tmp_path / "store"
    image_dataset(tmp_path, 2)
    broken = tmp_path / "broken.md"
    broken.write_text("# Pics\n<!-- warp:card:begin tables -->\nhalf a section\n")
    r = cli("publish", "ws/pics", "--table", f"main={tmp_path / 'table' / 'main.parquet'}", "--store", store,
            "--card", broken)
    assert r.code == 2 and "--card: section 'tables' has no" in r.err and "cannot be edited" in r.err
    assert not (store / "datasets").exists()


def test_publish_card_headed_with_another_datasets_name_is_warned_about(cli, tmp_path):
    # issue 40: a card headed with another dataset's name was stored without a note
    store = tmp_path / "store"
    image_dataset(tmp_path, 2)
    other = tmp_path / "other.md"
    other.write_text("# vision/coco\n\nThe COCO subset.\n")
    args = ["publish", "ws/pics", "--table", f"main={tmp_path / 'table' / 'main.parquet'}", "--store", store, "-q"]
    r = cli(*args, "--card", other)
    assert r.code == 0 and len(r.out.strip()) == 64
    assert r.err == (f"warning: --card {other} is headed vision/coco, not ws/pics: another dataset's card? It is "
                     "stored with ws/pics as written, and a version's stored card is never rewritten\n")
    # a card `warp card` wrote for another dataset, its heading changed by hand: its summary names it
    generated = cli("card", "ws/pics", "--store", store, "--no-history").out
    assert generated.startswith("# vision/coco\n") and "| dataset | `ws/pics` |" in generated
    (tmp_path / "gen.md").write_text(generated.replace("# vision/coco", "# Pictures", 1))
    r = cli("publish", "ws/pics2", *args[2:], "--card", tmp_path / "gen.md")
    assert r.code == 0 and f"--card {tmp_path / 'gen.md'} is headed ws/pics, not ws/pics2" in r.err
    # its own card, a heading in words, or none: no note
    for i, text in enumerate(("# ws/own0\n", "# Pics\n\nHand-written.\n", "no heading at all\n")):
        (tmp_path / "own.md").write_text(text)
        r = cli("publish", f"ws/own{i}", *args[2:], "--card", tmp_path / "own.md")
        assert r.code == 0 and r.err == "" and len(r.out.strip()) == 64, text
