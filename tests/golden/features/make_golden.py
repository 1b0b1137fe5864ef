"""The feature-cache builds that single-process caches must keep reproducing (run by hand, never by tests).

    .venv/bin/python tests/golden/features/make_golden.py --write

``expected.json`` was written by the single-process writer that predates the
ETL kit (commit b67f332, ``warp/features/writer.py``), so
``tests/features/test_features_kit.py`` checks that the kit's plan (a driver
probe, count-cut shard tasks, a re-cut after a late decode failure:
docs/formats/feature-shard.md, "Building on an executor") still writes the
same records into the same shards. Every case is cut by fixed counts
(``shard_size`` set, or a size under 8: "Shard boundaries"); it was last
regenerated when the shard meta lost its index and the manifest gained
``shard_cut``, records and data unchanged. Each case builds from
``warpdata.sampledata.captions`` (planted broken files included: the
truncated JPEG of the first folder sits mid-cache, so later shards are
re-packed). Hashes leave out what the code versions reach (the fingerprint
inside the manifest, each shard's meta's task identity) and the temporary paths in
``quarantine.jsonl``; the library versions are recorded and the test skips
where they differ (a new Pillow may resize differently).
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

HERE = Path(__file__).parent
CASES = ("pixels-multi", "encoder-multi", "pixels-one")


def versions() -> dict[str, str]:
    import numpy
    import PIL

    v = {"pillow": PIL.__version__, "numpy": numpy.__version__}
    try:
        import cv2

        v["opencv"] = cv2.__version__
    except ImportError:
        v["opencv"] = "none"
    try:
        import torch

        v["torch"] = torch.__version__
    except ImportError:
        v["torch"] = "none"
    return v


def make_sources(root: Path) -> tuple[Path, Path]:
    from warpdata.sampledata import captions

    a = captions.generate(root / "a", count=20, seed=3)
    b = captions.generate(root / "b", count=9, seed=4)
    return Path(a["path"]), Path(b["path"])


def spec(case: str, root: Path, out: Path):
    from warpdata.etl.quarantine import Threshold, Thresholds
    from warpdata.features.writer import CacheSpec, SourceDir

    a, b = root / "a" / "media", root / "b" / "media"
    loose = Thresholds(max_invalid_fraction=Threshold(fail=0.9), max_missing_fraction=Threshold(fail=0.9))
    dirs = [SourceDir(str(a)), SourceDir(str(b), num_repeats=3, caption_prefix="photo: ")]
    if case == "pixels-multi":
        return CacheSpec(source="", output=str(out), size=(32, 32), shard_size=5, thresholds=loose, sources=dirs)
    if case == "encoder-multi":
        return CacheSpec(source="", output=str(out), size=(32, 32), encoder="pool8-hash", caching_device="cpu",
                         caching_batch_size=4, thresholds=loose, sources=dirs)
    if case == "pixels-one":
        return CacheSpec(source=str(a), output=str(out), size=(48, 32), shard_size=7, thresholds=loose)
    raise ValueError(case)


def digest(cache: Path, root: Path) -> dict[str, object]:
    """What must not change, per file of a built cache (metrics.json, timings only, left out)."""
    import pyarrow.parquet as pq
    from warpdata.formats.featshard import parse

    out: dict[str, object] = {}
    manifest = json.loads((cache / "manifest.json").read_bytes())
    shards = []
    for sh in manifest["shards"]:
        raw = (cache / sh["path"]).read_bytes()
        h = parse(raw, sh["path"])
        meta = {k: v for k, v in h.meta.items() if k not in ("fingerprint", "task")}
        shards.append({"path": sh["path"], "records": sh["records"], "bytes": sh["bytes"], "meta": meta,
                       "fields": hashlib.sha256(raw[64:64 + 96 * len(h.layout.fields)]).hexdigest(),
                       "data": hashlib.sha256(raw[h.data_offset:]).hexdigest()})
    out["shards"] = shards
    m = {k: v for k, v in manifest.items() if k not in ("fingerprint", "content_sha256", "shards", "side_tables")}
    m["fingerprint_inputs"] = {k: v for k, v in m["fingerprint_inputs"].items() if k != "code"}
    out["manifest"] = m
    out["keys.txt"] = hashlib.sha256((cache / "keys.txt").read_bytes()).hexdigest()
    out["records.parquet"] = hashlib.sha256(json.dumps(pq.read_table(cache / "records.parquet").to_pylist(),
                                                       sort_keys=True).encode()).hexdigest()
    q = (cache / "quarantine.jsonl").read_text(encoding="utf-8").replace(str(root), "<root>")
    out["quarantine.jsonl"] = q.splitlines()
    return out


def build(case: str, root: Path, workers: int = 1, **kw) -> Path:
    from warpdata.features.writer import build_cache

    out = root / f"cache-{case}-{workers}"
    build_cache(spec(case, root, out), workers=workers, **kw)
    return out


def main() -> int:
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        make_sources(root)
        doc = {"versions": versions(), "cases": {c: digest(build(c, root), root) for c in CASES}}
    text = json.dumps(doc, indent=1, sort_keys=True, ensure_ascii=False) + "\n"
    if "--write" in sys.argv:
        (HERE / "expected.json").write_text(text, encoding="utf-8")
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
