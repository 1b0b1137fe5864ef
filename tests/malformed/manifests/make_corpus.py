"""Regenerate the malformed-manifest corpus (run from the repository root with the venv's python).

Each case is a whole manifest.json (or latest.json) a reader might meet; expected.json maps the
file to the typed error class and exit code its parser must raise (tests/registry/test_fuzz_manifests.py).
Bases are real manifests written by this warp (an 8-image COCO warehouse, a small feature cache); sealed cases are re-sealed after the edit so they reach the check after the seal.
"""

from __future__ import annotations

import copy
import json
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).parent
HEX = "ab" * 32


def _warehouse(tmp: Path) -> dict:
    from warpdata.cli.app import main
    from warpdata.sampledata.detection import generate

    d = tmp / "coco"
    generate(d, count=8, seed=21, min_side=64, max_side=120)
    (d / "t.toml").write_text('[source]\nformat = "coco"\n[transform]\ntarget_size = [32, 32]\nmax_boxes = 4\n'
                              '[output]\nroot = "../wh"\nshard_samples = 4\n')
    assert main(["-q", "etl", "--config", str(d / "t.toml")]) == 0
    return json.loads(next((tmp / "wh").glob("v*/manifest.json")).read_bytes())


def _features(tmp: Path) -> dict:
    from warpdata.features.writer import CacheSpec, build_cache
    from warpdata.sampledata.captions import generate

    src = tmp / "src"
    generate(src, count=6, seed=3)
    build_cache(CacheSpec(source=str(src), output=str(tmp / "cache"), size=(16, 16), shard_size=2),
                allow_invalid=True)  # the sample set carries deliberately broken files
    return json.loads((tmp / "cache" / "manifest.json").read_bytes())


def main() -> None:
    from warpdata.core.canonical import seal

    cases: dict[str, tuple[object, str]] = {}
    with tempfile.TemporaryDirectory() as t:
        wh = _warehouse(Path(t))
        fc = _features(Path(t))

    def w(name, doc, err, *, sealed=False, raw=None):
        cases[name] = (raw if raw is not None else (seal(doc) if sealed else doc), err)

    # -- tensor warehouse
    d = copy.deepcopy(wh)
    d["classes"][0]["name"] = d["classes"][0]["name"][:-1] + "X"
    w("warehouse/class_name_edited.json", d, "DataError")
    d = copy.deepcopy(wh)
    d["transform"]["dtype"] = "f32"
    w("warehouse/transform_edited.json", d, "DataError")
    d = copy.deepcopy(wh)
    d["shards"].pop()
    d["num_samples"] = sum(s["samples"] for s in d["shards"])
    w("warehouse/shard_entry_deleted.json", d, "DataError")
    d = copy.deepcopy(wh)
    d.pop("content_sha256")
    d["manifest_version"] = 1
    d["created_at_ms"] = 0
    w("warehouse/unsealed_v1.json", d, "DataError")
    d = copy.deepcopy(wh)
    d["shards"][0]["relative_path"] = "../../outside/x.twh1"
    w("warehouse/path_escape.json", d, "UnconfinedPathError", sealed=True)
    d = copy.deepcopy(wh)
    d["shards"][0]["relative_path"] = 7
    w("warehouse/path_not_a_string.json", d, "DataError", sealed=True)
    d = copy.deepcopy(wh)
    d["classes"] = "person"
    w("warehouse/classes_not_a_list.json", d, "DataError", sealed=True)
    d = copy.deepcopy(wh)
    d["shards"][0]["samples"] = "4"
    w("warehouse/samples_a_string.json", d, "DataError", sealed=True)
    d = copy.deepcopy(wh)
    d["content_sha256"] = 5
    w("warehouse/seal_not_a_string.json", d, "DataError")
    w("warehouse/top_level_list.json", [wh], "DataError")
    w("warehouse/truncated.json", None, "DataError", raw=json.dumps(wh)[:200])
    # -- feature cache
    d = copy.deepcopy(fc)
    d["shards"].pop(1)
    w("feature-cache/shard_entry_deleted.json", d, "DataError")
    d = copy.deepcopy(fc)
    d["shards"].pop(1)
    w("feature-cache/shard_entry_deleted_resealed.json", d, "DataError", sealed=True)
    d = copy.deepcopy(fc)
    d["records"] = "5"
    w("feature-cache/records_a_string.json", d, "DataError", sealed=True)
    d = copy.deepcopy(fc)
    d["fields"][0]["shape"] = "3x16x16"
    w("feature-cache/shape_a_string.json", d, "DataError", sealed=True)
    d = copy.deepcopy(fc)
    d["shards"][0]["records"] = None
    w("feature-cache/shard_records_null.json", d, "DataError", sealed=True)
    d = copy.deepcopy(fc)
    d["shards"][0]["path"] = "../shard-00000.wfs"
    w("feature-cache/path_escape.json", d, "DataError", sealed=True)
    d = copy.deepcopy(fc)
    d["shards"] = {"0": d["shards"][0]}
    w("feature-cache/shards_an_object.json", d, "DataError", sealed=True)
    d = copy.deepcopy(fc)
    d.pop("content_sha256")
    d.pop("manifest_version")
    w("feature-cache/unsealed_old.json", d, "DataError")
    d = copy.deepcopy(fc)
    d["fields"][0]["dtype"] = "complex256"
    w("feature-cache/dtype_unknown.json", d, "DataError", sealed=True)
    # -- latest pointers: the version hash in every wrong type and shape
    for i, vh in enumerate([5, 5.5, None, True, [HEX], {"h": HEX}, "", "xyz", HEX[:-1], HEX + "0",
                            "sha256:", "sha256:" + HEX[:10], -1, {"version_hash": HEX}]):
        w(f"latest/hash_{i:02d}.json", {"kind": "dataset-latest", "dataset_id": "ws/name",
                                        "version_hash": vh, "updated_at": "2026-01-01T00:00:00Z"}, "ManifestCorruptedError")
    expected = {}
    for name, (doc, err) in sorted(cases.items()):
        p = HERE / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(doc if isinstance(doc, str) else json.dumps(doc, indent=1, sort_keys=True, ensure_ascii=False))
        expected[name] = {"error": err, "exit_code": 65}
    (HERE / "expected.json").write_text(json.dumps(expected, indent=1, sort_keys=True) + "\n")
    print(f"{len(cases)} cases", file=sys.stderr)


if __name__ == "__main__":
    main()
