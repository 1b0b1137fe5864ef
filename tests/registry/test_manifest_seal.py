"""The registry manifest's envelope (metadata) is sealed: any edit of it is ManifestCorruptedError (exit 65).

docs/formats/registry.md "Seal": ``metadata.seal_sha256`` is the SHA-256 of the canonical JSON
of the whole document without that key. Manifests written before the seal still read.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support.manifests import unsealed
from test_manifest_arrow import sample_manifest_v4
from test_registry_manifest import sample_manifest
from warpdata.core.canonical import canonical_json
from warpdata.core.errors import ExitCode, ManifestCorruptedError
from warpdata.registry.manifest import SEAL_KEY, Manifest, seal_of

GOLDEN = Path(__file__).parents[1] / "golden" / "registry"


def test_golden_sealed_manifest_is_what_the_writer_writes():
    data = (GOLDEN / "manifest-v4-sealed.json").read_bytes()
    m = Manifest.from_bytes(data, expected_hash=(GOLDEN / "manifest-v4.version").read_text().strip())
    assert sample_manifest_v4(created_at="2025-01-01T00:00:00Z", description="golden, sealed").to_bytes() == data
    assert SEAL_KEY not in m.metadata and m.metadata["description"] == "golden, sealed"
    assert m.to_bytes() == data  # re-written: the same bytes, the same seal
    assert unsealed(data) != data and len(json.loads(data)["metadata"][SEAL_KEY]) == 64


def _edit(data: bytes, change) -> bytes:
    doc = json.loads(data)
    change(doc)
    return canonical_json(doc)


EDITS = {
    "description changed": lambda d: d["metadata"].__setitem__("description", "golden, edited"),
    "created_at changed": lambda d: d["metadata"].__setitem__("created_at", "2030-01-01T00:00:00Z"),
    "key added": lambda d: d["metadata"].__setitem__("card", "# a card added by hand"),
    "key removed": lambda d: d["metadata"].pop("description"),
    "seal changed": lambda d: d["metadata"].__setitem__(SEAL_KEY, "0" * 64),
}


@pytest.mark.parametrize("edit", sorted(EDITS))
def test_any_edit_of_the_envelope_is_detected(edit):
    data = (GOLDEN / "manifest-v4-sealed.json").read_bytes()
    bad = _edit(data, EDITS[edit])
    with pytest.raises(ManifestCorruptedError, match="manifest was edited after publishing: its seal") as ei:
        Manifest.from_bytes(bad, source="store/manifests/x.json")
    assert ei.value.exit_code == ExitCode.DATA and "store/manifests/x.json" in ei.value.message
    assert "delete it (and latest.json" in ei.value.hint


def test_seal_covers_any_envelope_key_generically():
    """A key the writer has never heard of (a dataset card, say) is sealed like the rest."""
    m = sample_manifest(created_at="2025-01-01T00:00:00Z", card={"text": "# Demo\nHand-written.", "license": "cc0"})
    data = m.to_bytes()
    assert Manifest.from_bytes(data).metadata["card"]["license"] == "cc0"
    bad = _edit(data, lambda d: d["metadata"]["card"].__setitem__("license", "proprietary"))
    with pytest.raises(ManifestCorruptedError, match="seal"):
        Manifest.from_bytes(bad)
    assert json.loads(data)["metadata"][SEAL_KEY] == seal_of(json.loads(data))


def test_manifests_from_before_the_seal_still_read():
    for name in ("manifest-v1", "manifest-v2"):
        data = (GOLDEN / f"{name}.json").read_bytes()
        assert SEAL_KEY not in json.loads(data)["metadata"]
        m = Manifest.from_bytes(data, expected_hash=(GOLDEN / f"{name}.version").read_text().strip())
        assert json.loads(m.to_bytes())["metadata"][SEAL_KEY] == seal_of(json.loads(m.to_bytes()))


def test_a_missing_seal_is_refused_from_format_4_and_when_signed():
    """Issue 36: the seal was optional, so deleting it let an edited envelope read. Format 4 was
    written sealed from its second day on (the unsealed golden is from its first), and a signed
    manifest always is: a missing seal there was removed."""
    data = (GOLDEN / "manifest-v4.json").read_bytes()
    assert json.loads(data)["format_version"] == 4 and SEAL_KEY not in json.loads(data)["metadata"]
    with pytest.raises(ManifestCorruptedError, match="has no seal .* a format-4 manifest is written sealed") as ei:
        Manifest.from_bytes(data, source="store/versions/v4.json")
    assert ei.value.exit_code == ExitCode.DATA and "store/versions/v4.json" in ei.value.message
    assert "publish the same data again" in ei.value.hint
    signed = _edit((GOLDEN / "manifest-v1.json").read_bytes(),
                   lambda d: d["metadata"].__setitem__("signatures", []))  # format 1, signed, unsealed
    with pytest.raises(ManifestCorruptedError, match="a format-1 signed manifest is written sealed"):
        Manifest.from_bytes(signed)


def test_the_seal_changes_no_version_hash():
    m = sample_manifest(created_at="2025-01-01T00:00:00Z")
    assert json.loads(m.to_bytes())["version_hash"] == json.loads((GOLDEN / "manifest-v1.json").read_bytes())["version_hash"]


def test_cli_reports_an_edited_envelope_in_the_store(cli, tmp_path):
    """`warp info` on a store whose manifest envelope was edited by hand: exit 65 naming the manifest."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"id": [1, 2, 3]}), tmp_path / "t.parquet")
    store = tmp_path / "store"
    r = cli("publish", "ws/sealed", "--table", f"main={tmp_path / 't.parquet'}", "--description", "as published",
            "--store", store, "-q")
    assert r.code == 0, r.err
    version = r.out.strip()
    [path] = [p for p in store.rglob("*.json") if version in p.name]
    path.write_bytes(_edit(path.read_bytes(), lambda d: d["metadata"].__setitem__("description", "edited")))
    r = cli("info", "ws/sealed", "--store", store)
    assert r.code == 65, r.err
    assert "manifest was edited after publishing" in r.err and version in r.err


def test_the_hint_of_an_edited_manifest_is_a_recovery_that_works(cli, tmp_path):
    """Review finding: the hint said "republish the dataset", but publishing the same data again
    answers "already published" and leaves the edited manifest in place (so does deleting only
    the manifest while latest names its version); deleting both, as the hint now says, works."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"id": [1, 2, 3]}), tmp_path / "t.parquet")
    store = tmp_path / "store"
    again = ("publish", "ws/sealed", "--table", f"main={tmp_path / 't.parquet'}", "--store", store, "-q")
    assert cli(*again).code == 0
    [path] = store.rglob("versions/*.json")
    path.write_bytes(_edit(path.read_bytes(), lambda d: d["metadata"].__setitem__("warp_version", "9.9")))
    assert cli(*again).code == 0
    r = cli("head", "ws/sealed", "--store", store)
    assert r.code == 65 and "delete it (and latest.json beside versions/ if it names this version)" in r.err
    path.unlink()  # what the hint says
    (path.parent.parent / "latest.json").unlink()
    assert cli(*again).code == 0
    r = cli("head", "ws/sealed", "--store", store)
    assert r.code == 0, r.err
