"""Versions that share their bytes (issue 39): what a 3 % edit of a published warehouse costs.

A warehouse of ``--photos`` synthetic photos (640×640 u8 by default, the usual detector size) is
built with ``warp etl`` and published to a local-directory store; then, ``--versions - 1`` times,
1 % of the images are relabelled, 1 % replaced and 1 % appended (``sampledata.detection.edit``),
the warehouse is rebuilt and published again. Reported per version: bytes uploaded (blobs, as the
publish counts them, plus the manifest) against the version's bytes (the manifest's
``total_bytes``: what a reader gets), and the store's growth (bytes of the files the publish
added). A control store gets versions 1 and 2 published with chunking off (``chunk_target=0``:
every TWH1 tar shard stored whole, as before format 5).

Cold reads: version 2 opened with ``warpdata.warehouse.open`` from each store into an empty blob
cache (every shard fetched, assembled from its chunks for the chunked store, hashed), then every
sample read with ``batch``; chunked and control alternate, ``--reads`` runs each, medians.

    .venv/bin/python bench/dedup.py [--photos 2000] [--versions 10] [--size 640] [--reads 3]
    .venv/bin/python bench/dedup.py --kind features [--photos 2000] [--versions 3] [--size 256]
    .venv/bin/python bench/dedup.py --kind removal --photos 1000 --size 128
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path


def _files(root: Path) -> dict[str, int]:
    return {str(p): p.stat().st_size for p in root.rglob("*") if p.is_file()}


def build(src: Path, out: Path, size: int) -> str:
    """``warp etl`` of the COCO folder ``src`` at ``size`` px into ``out``; the version directory."""
    from warpdata.cli.app import main as warp

    cfg = src / f"t-{out.name}.toml"
    cfg.write_text('[source]\nformat = "coco"\nlabels = "annotations.json"\nimages = "images"\n'
                   f'[transform]\ntarget_size = {size}\nmax_boxes = 16\n[output]\nroot = "{out}"\n')
    assert warp(["-q", "etl", "--config", str(cfg)]) == 0
    return str(next(out.glob("v*")))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--photos", type=int, default=2000)
    ap.add_argument("--versions", type=int, default=10)
    ap.add_argument("--size", type=int, default=640)
    ap.add_argument("--reads", type=int, default=3)
    ap.add_argument("--workdir", default=None)
    ap.add_argument("--kind", choices=("warehouse", "features", "removal"), default="warehouse",
                    help="features: a feature cache of captioned photos (pixels stored, no encoder); "
                         "removal: one photo removed from the middle of a warehouse")
    args = ap.parse_args()
    if args.kind == "features":
        return features(args)
    if args.kind == "removal":
        return removal(args)

    from warpdata.publishing.publish import PublishRequest, publish
    from warpdata.registry.store import Store
    from warpdata.sampledata.detection import edit, generate

    base = Path(tempfile.mkdtemp(prefix="warp-dedup-", dir=args.workdir))
    src = base / "coco"
    t = time.perf_counter()
    generate(src, count=args.photos, seed=39, min_side=320, max_side=640, broken=False)
    print(f"generated {args.photos} photos in {time.perf_counter() - t:.1f} s", flush=True)
    one = max(1, round(args.photos / 100))

    def etl(n: int) -> str:
        t = time.perf_counter()
        path = build(src, base / f"wh{n}", args.size)
        print(f"  etl v{n}: {time.perf_counter() - t:.1f} s", flush=True)
        return path

    store, control = Store(str(base / "store")), Store(str(base / "control"))
    rows = []
    first_version = None
    kept: dict[int, str] = {}
    for n in range(1, args.versions + 1):
        if n > 1:
            edit(src, relabel=one, replace=one, append=one, seed=n)
        path = etl(n)
        before = _files(base / "store")
        t = time.perf_counter()
        r = publish(PublishRequest("bench/wh", from_paths=[path]), store=store)
        secs = time.perf_counter() - t
        after = _files(base / "store")
        m = store.get_manifest("bench/wh", r.version_hash)
        manifest = len(store.get_manifest_bytes("bench/wh", r.version_hash))
        row = {"version": n, "version_bytes": m.stats["total_bytes"],
               "uploaded": r.bytes_uploaded + manifest, "blobs_uploaded": r.blobs_uploaded,
               "store_bytes": sum(after.values()), "growth": sum(after.values()) - sum(before.values()),
               "manifest_bytes": manifest, "publish_s": round(secs, 1), "hash": r.version_hash}
        if n <= 2:
            cb = _files(base / "control")
            c = publish(PublishRequest("bench/wh", from_paths=[path], chunk_target=0), store=control)
            ca = _files(base / "control")
            row["control_uploaded"] = c.bytes_uploaded + len(control.get_manifest_bytes("bench/wh", c.version_hash))
            row["control_growth"] = sum(ca.values()) - sum(cb.values())
            row["control_hash"] = c.version_hash
            kept[n] = path
        else:
            shutil.rmtree(base / f"wh{n}")
        if first_version is None:
            first_version = m.stats["total_bytes"]
        rows.append(row)
        pct = 100 * row["uploaded"] / row["version_bytes"]
        grow = f" ({100 * row['growth'] / sum(before.values()):.2f} %)" if before else ""
        print(f"v{n}: version {row['version_bytes'] / 1e6:.1f} MB, uploaded {row['uploaded'] / 1e6:.2f} MB "
              f"({pct:.2f} %), store +{row['growth'] / 1e6:.2f} MB{grow}, store "
              f"{row['store_bytes'] / 1e6:.1f} MB = {row['store_bytes'] / first_version:.3f}x version 1"
              + (f"; control uploaded {row['control_uploaded'] / 1e6:.1f} MB, +{row['control_growth'] / 1e6:.1f} MB"
                 if "control_uploaded" in row else ""), flush=True)

    # cold reads of version 2, alternated
    import numpy as np
    import warpdata.warehouse as wh

    v2 = rows[1]["hash"] if len(rows) > 1 else rows[0]["hash"]
    c2 = rows[1].get("control_hash") if len(rows) > 1 else rows[0]["control_hash"]
    times: dict[str, list[float]] = {"chunked": [], "control": []}
    for i in range(-1, args.reads):  # run -1 warms the imports and the page cache of both stores, untimed
        sides = [("chunked", base / "store", v2), ("control", base / "control", c2)]
        for name, st, version in (sides if i % 2 else sides[::-1]):  # the first side rotates each round
            cache = base / f"cache-{name}-{i}"
            os.environ["WARP_CACHE_DIR"] = str(cache)
            t = time.perf_counter()
            with wh.open("bench/wh", store=str(st), version=version) as w:
                total = 0
                for a in range(0, len(w), 256):
                    total += int(w.batch(np.arange(a, min(len(w), a + 256)))["image"].shape[0])
            took = time.perf_counter() - t
            shutil.rmtree(cache)
            if i < 0:
                continue
            times[name].append(took)
            print(f"  cold read {name} #{i + 1}: {times[name][-1]:.2f} s ({total} samples)", flush=True)
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"cold read of version 2: chunked {med['chunked']:.2f} s, control {med['control']:.2f} s "
          f"({100 * (med['chunked'] / med['control'] - 1):+.1f} %)")
    last = rows[-1]
    # the replaced and appended images of each version are new bytes no layout can share: the
    # store is measured against the first version and against the last (the largest) one
    print(f"{len(rows)} versions: store {last['store_bytes'] / 1e6:.1f} MB = "
          f"{last['store_bytes'] / first_version:.3f}x the first version ({first_version / 1e6:.1f} MB), "
          f"{last['store_bytes'] / last['version_bytes']:.3f}x the last ({last['version_bytes'] / 1e6:.1f} MB); "
          f"the first version plus the replaced and appended images alone: "
          f"{(first_version + (len(rows) - 1) * 2 * one * args.size * args.size * 3) / first_version:.3f}x the first")
    print(json.dumps({"rows": rows, "cold_read_s": times}, indent=None))
    shutil.rmtree(base, ignore_errors=True)
    sys.stdout.flush()


def edit_captions(media: Path, *, relabel: int, replace: int, append: int, seed: int) -> None:
    """The next version of a captions folder: ``relabel`` captions rewritten, ``replace`` images
    given new pixels (same name), ``append`` new captioned images in a third group."""
    import numpy as np
    from warpdata.sampledata.captions import caption_for
    from warpdata.sampledata.photos import encode_jpeg, synthetic_photo

    rng = np.random.default_rng(seed)
    jpgs = sorted(p for p in media.rglob("*.jpg") if p.with_suffix(".txt").is_file() and p.stem.isdigit())
    picked = [jpgs[int(i)] for i in rng.choice(len(jpgs), relabel + replace, replace=False)]
    for p in picked[:relabel]:
        p.with_suffix(".txt").write_text(caption_for(rng) + " (relabelled)\n", encoding="utf-8")
    for p in picked[relabel:]:
        p.write_bytes(encode_jpeg(synthetic_photo(rng, int(rng.integers(200, 320)), int(rng.integers(200, 320)))))
    extra = media / "group_002"
    extra.mkdir(exist_ok=True)
    first = len(list(extra.glob("*.jpg")))
    for i in range(append):
        name = f"{seed:03d}{first + i:05d}"
        (extra / f"{name}.jpg").write_bytes(encode_jpeg(synthetic_photo(rng, 256, 256)))
        (extra / f"{name}.txt").write_text(caption_for(rng) + "\n", encoding="utf-8")


def features(args) -> None:
    """The same edits on a feature cache (issue 39, "and on a feature cache"): ``--photos``
    captioned photos, ``--size`` px, pixels stored (``encoder.name = ""``), each version built with
    ``warp etl`` and published from its folder; the store's bytes against the first version's."""
    import subprocess

    from warpdata.publishing.publish import PublishRequest, publish
    from warpdata.registry.store import Store
    from warpdata.sampledata import captions

    base = Path(tempfile.mkdtemp(prefix="warp-dedup-fc-", dir=args.workdir))
    gen = captions.generate(base / "cap", count=args.photos, seed=39)
    media = Path(gen["path"])
    cfg = base / "cap" / "fc.toml"
    text = Path(gen["config"]).read_text().replace("resolution = 64", f"resolution = {args.size}")
    cfg.write_text(text.replace('name = "pool8-hash"', 'name = ""').replace('path = "cache"',
                                                                            f'path = "{base / "fc"}"'))
    one = max(1, round(args.photos / 100))
    store = Store(str(base / "store"))
    first_version = None
    for n in range(1, args.versions + 1):
        if n > 1:
            edit_captions(media, relabel=one, replace=one, append=one, seed=n)
        t = time.perf_counter()
        r = subprocess.run([sys.executable, "-m", "warpdata", "-q", "etl", "--config", str(cfg), "--json"],
                           capture_output=True, text=True)
        if r.returncode != 0:
            raise SystemExit(f"warp etl failed ({r.returncode}): {r.stderr}")
        res = json.loads(r.stdout)
        built = time.perf_counter() - t
        before = _files(base / "store")
        p = publish(PublishRequest("bench/fc", from_paths=[res["path"]]), store=store)
        after = _files(base / "store")
        m = store.get_manifest("bench/fc", p.version_hash)
        manifest = len(store.get_manifest_bytes("bench/fc", p.version_hash))
        vbytes = m.stats["total_bytes"]
        first_version = first_version or vbytes
        up = p.bytes_uploaded + manifest
        grow = sum(after.values()) - sum(before.values())
        print(f"v{n}: etl {built:.1f} s ({res.get('status')}), version {vbytes / 1e6:.1f} MB, uploaded "
              f"{up / 1e6:.2f} MB ({100 * up / vbytes:.2f} %), store +{grow / 1e6:.2f} MB"
              + (f" ({100 * grow / sum(before.values()):.2f} %)" if before else "")
              + f", store {sum(after.values()) / first_version:.3f}x version 1, "
              f"{sum(after.values()) / vbytes:.3f}x this one", flush=True)
    shutil.rmtree(base, ignore_errors=True)


def removal(args) -> None:
    """One photo of ``--photos`` removed from the labels a third of the way in (a bad image
    dropped): what the next version uploads, against the version's bytes."""
    from warpdata.publishing.publish import PublishRequest, publish
    from warpdata.registry.store import Store
    from warpdata.sampledata.detection import generate

    base = Path(tempfile.mkdtemp(prefix="warp-dedup-rm-", dir=args.workdir))
    src = base / "coco"
    generate(src, count=args.photos, seed=3, min_side=160, max_side=320, broken=False)
    store = Store(str(base / "store"))

    def etl(n: int) -> str:
        return build(src, base / f"wh{n}", args.size)

    publish(PublishRequest("bench/rm", from_paths=[etl(1)]), store=store)
    doc = json.loads((src / "annotations.json").read_text())
    gone = doc["images"][args.photos // 3]["id"]
    doc["images"] = [im for im in doc["images"] if im["id"] != gone]
    doc["annotations"] = [a for a in doc["annotations"] if a["image_id"] != gone]
    (src / "annotations.json").write_text(json.dumps(doc))
    r = publish(PublishRequest("bench/rm", from_paths=[etl(2)]), store=store)
    m = store.get_manifest("bench/rm", r.version_hash)
    shards = len(m.artifacts["tensor-warehouse"].shards)
    print(f"{args.size} px: 1 of {args.photos} photos removed: uploaded {r.bytes_uploaded / 1e6:.2f} MB of "
          f"{m.stats['total_bytes'] / 1e6:.1f} MB = {100 * r.bytes_uploaded / m.stats['total_bytes']:.2f} % "
          f"({shards} shards)")
    shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
