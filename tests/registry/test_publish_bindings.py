"""`warp publish --bind`: every bound value must name an artifact member (local store)."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from warpdata.registry.store import Store


@pytest.fixture
def inputs(tmp_path):
    (tmp_path / "photos" / "img").mkdir(parents=True)
    for i in range(20):
        (tmp_path / "photos" / "img" / f"{i:03d}.png").write_bytes(bytes([i]) * 100)
    return tmp_path


def _table(root, values, name="t.parquet"):
    pq.write_table(pa.table({"id": list(range(len(values))), "image": values}), root / name)
    return f"main={root / name}"


def _args(root, table, *extra):
    return ("publish", "ws/b", "--table", table, "--artifact", f"images={root / 'photos'}",
            "--bind", "main.image=images:image", "--store", str(root / "store"), *extra)


def test_dangling_bind_is_refused_and_nothing_is_published(cli, inputs):
    # the classic mistake: paths include the artifact directory's own name
    values = [f"photos/img/{i:03d}.png" for i in range(20)]
    r = cli(*_args(inputs, _table(inputs, values)))
    assert r.code == 65, r.err
    assert "20 of 20 values name no member" in r.err
    assert "'photos/img/000.png'" in r.err and "..." in r.err  # the first few, not all 20
    assert "strip the prefix 'photos/'" in r.err and "--allow-dangling" in r.err
    assert r.out == ""
    assert list(Store(str(inputs / "store")).iter_latest(None)) == []


def test_some_dangling_values_are_counted_and_listed(cli, inputs):
    values = [f"img/{i:03d}.png" for i in range(18)] + ["img/nope.png", None]
    r = cli(*_args(inputs, _table(inputs, values)), "--json")
    assert r.code == 65
    doc = json.loads(r.out)
    assert doc["error"] == "dangling-binding" and doc["details"]["missing"] == 1
    assert doc["details"]["values"] == 19  # nulls are no reference
    assert doc["details"]["first_missing"] == ["img/nope.png"]


def test_allow_dangling_publishes_and_records_the_count(cli, inputs):
    values = [f"img/{i:03d}.png" for i in range(17)] + ["a", "b", "c"]
    r = cli(*_args(inputs, _table(inputs, values), "--allow-dangling", "--json"))
    assert r.code == 0, r.err
    assert r.json()["dangling_refs"] == {"main.image=images": 3}
    assert "3 value(s) of main.image=images name no member" in r.err
    st = Store(str(inputs / "store"))
    m = st.get_manifest("ws/b", r.json()["version_hash"])
    assert m.metadata["dangling_refs"] == {"main.image=images": 3}


def test_resolving_bind_publishes_csv_too(cli, inputs):
    (inputs / "t.csv").write_text("id,image\n" + "".join(f"{i},img/{i:03d}.png\n" for i in range(20)))
    r = cli(*_args(inputs, f"main={inputs / 't.csv'}", "--json"))
    assert r.code == 0, r.err
    assert "dangling_refs" not in r.json()
    (inputs / "u.csv").write_text("id,image\n1,img/000.png\n2,000.png\n")
    r = cli(*_args(inputs, f"main={inputs / 'u.csv'}"))
    assert r.code == 65 and "1 of 2 values" in r.err and "'img/000.png'" in r.err


def test_binding_a_non_string_column_is_a_data_error(cli, inputs):
    pq.write_table(pa.table({"image": [1, 2, 3]}), inputs / "n.parquet")
    r = cli(*_args(inputs, f"main={inputs / 'n.parquet'}"))
    assert r.code == 65 and "holds int64, not member paths" in r.err


def test_symlinked_directories_are_named_and_followed_on_request(cli, inputs, tmp_path):
    """A common layout: the artifact directory links to where the images really live."""
    real = tmp_path / "elsewhere" / "train"
    real.mkdir(parents=True)
    for i in range(3):
        (real / f"{i}.png").write_bytes(bytes([i]) * 50)
    (inputs / "photos" / "train").symlink_to(real, target_is_directory=True)
    table = _table(inputs, [f"train/{i}.png" for i in range(3)], "s.parquet")
    r = cli(*_args(inputs, table))
    assert r.code == 65
    assert "symlinked director" in r.err and "'train'" in r.err and "--follow-symlinks" in r.err
    r = cli(*_args(inputs, table, "--follow-symlinks", "--json"))
    assert r.code == 0, r.err
    st = Store(str(inputs / "store"))
    m = st.get_manifest("ws/b", r.json()["version_hash"])
    assert m.artifacts["images"].member_count == 23


def test_only_symlinked_directories_is_an_empty_artifact_with_a_hint(cli, tmp_path):
    (tmp_path / "real").mkdir()
    (tmp_path / "real" / "a.txt").write_text("a")
    (tmp_path / "art").mkdir()
    (tmp_path / "art" / "link").symlink_to(tmp_path / "real", target_is_directory=True)
    r = cli("publish", "ws/c", "--artifact", f"raw={tmp_path / 'art'}", "--store", str(tmp_path / "store"))
    assert r.code == 66 and "not followed: link" in r.err and "--follow-symlinks" in r.err


def test_a_symlink_cycle_is_a_data_error(cli, tmp_path):
    (tmp_path / "art" / "sub").mkdir(parents=True)
    (tmp_path / "art" / "sub" / "a.txt").write_text("a")
    (tmp_path / "art" / "sub" / "up").symlink_to(tmp_path / "art", target_is_directory=True)
    r = cli("publish", "ws/c", "--artifact", f"raw={tmp_path / 'art'}", "--store", str(tmp_path / "store"),
            "--follow-symlinks")
    assert r.code == 65 and "loops at 'sub/up'" in r.err
    r = cli("publish", "ws/c", "--artifact", f"raw={tmp_path / 'art'}", "--store", str(tmp_path / "store"))
    assert r.code == 0, r.err  # not following, the cycle is simply not entered


@pytest.mark.parametrize("command", ["publish", "register"])
@pytest.mark.parametrize("bind, named", [
    ("other.image=images:image", "--bind names table 'other', which is not being {verb}"),
    ("main.image=pics:image", "--bind names artifact 'pics', which is not being {verb}"),
    ("main.photo=images:image", "--bind main.photo: table main has no column 'photo'"),
])
def test_a_bind_naming_what_is_not_there_is_a_usage_error(cli, inputs, command, bind, named):
    table = _table(inputs, [f"img/{i:03d}.png" for i in range(20)])
    store = ("--store", str(inputs / "store")) if command == "publish" else ()
    r = cli(command, "ws/b", "--table", table, "--artifact", f"images={inputs / 'photos'}", "--bind", bind, *store)
    assert r.code == 2, r.err  # a usage error
    assert named.format(verb="published" if command == "publish" else "registered") in r.err, r.err
    assert "internal error" not in r.err and r.out == ""
