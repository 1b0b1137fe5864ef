"""Tensor-warehouse ETL throughput: warp etl vs the decode-bound ceilings and peers.

Same photo-like JPEG corpus (``--images photos``: 600-900 px crops of real photos, ~0.56 MP;
``--images 1080p``: 1920x1080), same transform (decode + letterbox to ``--size``, uint8 CHW,
boxes), same worker count, same run:

* ceiling  — a bare loop of the same libraries (simplejpeg *full-size* decode + OpenCV
             letterbox into a reused buffer) on N threads, from memory, writing nothing;
* ceiling-scaled — the same loop with the DCT-scaled decode warp uses by default
             (``decode = "scaled"``: libjpeg-turbo decodes at 1/2, 1/4 or 1/8, then resizes);
* decode   — simplejpeg full decode alone on N threads (for reference);
* disk     — the same number of bytes written sequentially and fsync'd (the
             disk-bound ceiling: 1.2 MB per sample at 640);
* warp     — ``warp etl`` end to end (labels, header pass with SHA-256 of
             every source, validation, build, manifest, Parquet), --clear,
             every shard fsync'd (``[build] durable = true``, the default), ``decode = "scaled"``;
* warp-full — the same with ``decode = "full"`` (warp before DCT scaling);
* warp-nosync — ``durable = false`` (write-back left to the OS, as the peers do);
* litdata  — ``litdata.optimize`` with N workers;
* mds      — MosaicML ``MDSWriter`` fed by a pool of N transform processes;
* wds      — WebDataset ``ShardWriter`` fed by a pool of N transform processes.

Peers run warp's own transform function (bench/_warehouse_common.py, scaled decode),
so they differ only in how they parallelise and write. Each system runs in its own
process; systems alternate within a round and the first system rotates from round to
round; rates are medians of ``--runs`` rounds and ratios medians of per-round ratios
(wall and per CPU-second). The load average is printed before, during and after.
``--pixels`` prints the pixel difference of scaled against full decode instead.

    python bench/warehouse_etl.py [--n 1000] [--runs 3] [--workers 2] [--size 640] [--images photos|1080p]
    python bench/warehouse_etl.py --systems ceiling,ceiling-scaled,warp,warp-full --size 320 --runs 5
    python bench/warehouse_etl.py --pixels --size 320
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _warehouse_common as common

SYSTEMS = ("ceiling", "ceiling-scaled", "decode", "disk", "warp", "warp-full", "warp-nosync", "litdata", "mds", "wds")
CEILINGS = ("ceiling", "ceiling-scaled")
PEER_MODULES = {"litdata": "litdata", "mds": "streaming", "wds": "webdataset"}


def _cpu_s() -> float:
    import resource

    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


_START: dict[str, float] = {}


def _start() -> float:
    """The start of the timed part: its wall clock, and the CPU count from the same point (imports
    and set-up before it count in neither)."""
    _START["cpu"] = _cpu_s()
    return time.perf_counter()


def child(system: str, corpus: Path, out: Path, workers: int, size: int) -> dict:
    """Run one system; adds the CPU seconds (this process + its finished children) it spent in the
    part its wall clock times."""
    r = _child(system, corpus, out, workers, size)
    r["cpu_s"] = _cpu_s() - _START["cpu"]
    return r


def _child(system: str, corpus: Path, out: Path, workers: int, size: int) -> dict:
    import numpy as np

    items = common.items(corpus)
    n = len(items)
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    if system in ("ceiling", "ceiling-scaled", "decode"):
        import threading
        from concurrent.futures import ThreadPoolExecutor

        import cv2
        import simplejpeg
        from warpdata.warehouse.transform import Transformer, TransformSpec

        cv2.setNumThreads(1)
        datas = []
        for path, _, _ in items:  # the ceiling reads from memory: no I/O, no hashing
            with open(path, "rb") as f:
                datas.append(f.read())
        local = threading.local()
        mode = "scaled" if system == "ceiling-scaled" else "full"

        def one(data: bytes) -> None:
            st = getattr(local, "st", None)
            if st is None:
                st = local.st = (Transformer(TransformSpec(size, size, decode=mode)),
                                 np.empty((3, size, size), np.uint8))
            if system == "decode":
                simplejpeg.decode_jpeg(data, colorspace="RGB")
                return
            from warpdata.warehouse.images import probe

            st[0](data, probe(data), st[1])

        t0 = _start()
        with ThreadPoolExecutor(workers) as ex:
            list(ex.map(one, datas))
        return {"seconds": time.perf_counter() - t0, "n": n}
    if system == "disk":
        # the bytes warp writes (u8 CHW + header/boxes), written sequentially and fsync'd
        per = 3 * size * size + 16 * 21 + 64
        buf = np.zeros(8 << 20, np.uint8)
        total = per * n
        t0 = _start()
        with open(out / "disk.bin", "wb") as f:
            left = total
            while left > 0:
                k = min(left, len(buf))
                f.write(memoryview(buf)[:k])
                left -= k
            f.flush()
            os.fsync(f.fileno())
        return {"seconds": time.perf_counter() - t0, "n": n}
    if system in ("warp", "warp-full", "warp-nosync"):
        from warpdata.cli import output
        from warpdata.core.config import parse_toml
        from warpdata.etl.pipelines import EtlRequest
        from warpdata.warehouse.etl import run

        output.configure(quiet=1)
        cfg = common.write_config(corpus, out / "wh", size, workers, durable=system != "warp-nosync",
                                  decode="full" if system == "warp-full" else "scaled")
        data, source = parse_toml(cfg)
        t0 = _start()
        res = run(EtlRequest(config_path=cfg, config=data, source=source, clear=True))
        dt = time.perf_counter() - t0
        metrics = json.loads((Path(res.path) / "metrics.json").read_text())
        return {"seconds": dt, "n": res.summary["samples"], "build_rate": metrics["build_samples_per_s"],
                "cpu_ms": metrics["cpu_ms_per_sample"]}
    if system == "litdata":
        from litdata import optimize

        t0 = _start()
        optimize(fn=common.peer_transform, inputs=items, output_dir=str(out / "litdata"), num_workers=workers,
                 chunk_bytes="192MB", mode="overwrite")
        return {"seconds": time.perf_counter() - t0, "n": n}
    import multiprocessing

    t0 = _start()
    with multiprocessing.get_context("fork").Pool(workers) as pool:
        results = pool.imap(common.peer_transform, items, chunksize=4)
        if system == "mds":
            from streaming import MDSWriter

            cols = {"key": "str", "image": "ndarray:uint8", "boxes": "ndarray:float32", "classes": "ndarray:int32"}
            with MDSWriter(out=str(out / "mds"), columns=cols, size_limit=192 * 2**20) as w:
                for r in results:
                    w.write(r)
        else:
            import webdataset as wds

            with wds.ShardWriter(str(out / "wds-%06d.tar"), maxsize=192e6, verbose=0) as w:
                for r in results:
                    w.write({"__key__": r["key"].rsplit(".", 1)[0], "image.npy": r["image"], "boxes.npy": r["boxes"],
                             "classes.npy": r["classes"]})
    return {"seconds": time.perf_counter() - t0, "n": n}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=1000)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--size", type=int, default=640)
    p.add_argument("--systems", default=",".join(SYSTEMS))
    p.add_argument("--images", dest="kind", choices=("photos", "1080p"), default="photos",
                   help="photos: 600-900 px crops of real photos; 1080p: 1920x1080")
    p.add_argument("--pixels", action="store_true", help="print scaled vs full decode pixel differences, then exit")
    p.add_argument("--json", action="store_true")
    p.add_argument("--child", help=argparse.SUPPRESS)
    p.add_argument("--corpus", help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.child:
        print(json.dumps(child(a.child, Path(a.corpus), Path(a.out), a.workers, a.size)))
        return 0
    corpus = common.corpus(a.n) if a.kind == "photos" else common.corpus_1080p(a.n)
    if a.pixels:
        d = common.pixel_difference(corpus, a.size)
        print(json.dumps(d, indent=2) if a.json else _pixel_table(d, a.kind))
        return 0
    systems = [s for s in a.systems.split(",") if s]
    versions = {}
    for s in systems:
        if s in PEER_MODULES:
            versions[s] = common.peer_available(PEER_MODULES[s])
    runs: dict[str, list[dict]] = {s: [] for s in systems}
    loads = [os.getloadavg()[0]]
    for k in range(a.runs):
        for s in systems[k % len(systems):] + systems[:k % len(systems)]:  # the first system rotates
            if s in versions and versions[s] is None:
                continue
            out = common.OUT / f"warehouse-etl-{s}"
            r = common.run_child(Path(__file__), ["--child", s, "--corpus", str(corpus), "--out", str(out),
                                                  "--workers", str(a.workers), "--size", str(a.size)])
            runs[s].append(r)
            shutil.rmtree(out, ignore_errors=True)
        loads.append(os.getloadavg()[0])
    rates: dict[str, float | None] = {}
    extra: dict[str, dict] = {}
    for s, rs in runs.items():
        ok = [r for r in rs if "seconds" in r]
        rates[s] = common.median([r["n"] / r["seconds"] for r in ok]) if ok else None
        if ok and "build_rate" in ok[0]:
            extra[s] = {"build_rate": common.median([r["build_rate"] for r in ok]), "cpu_ms": ok[-1]["cpu_ms"]}
        if rs and not ok:
            extra[s] = {"error": rs[-1].get("error")}
    def per_round(num: str, den: str, cpu: bool = False) -> float | None:
        """Median over rounds of the ratio of two systems' rates measured in the same round (less noise).

        ``cpu``: images per CPU-second instead of per wall second (robust to other load on the machine).
        """
        key = "cpu_s" if cpu else "seconds"
        pairs = [(x, y) for x, y in zip(runs.get(num, []), runs.get(den, []), strict=False)
                 if x.get(key) and y.get(key)]
        if not pairs:
            return None
        return common.median([(x["n"] / x[key]) / (y["n"] / y[key]) for x, y in pairs])

    result = {"n": a.n, "corpus": a.kind, "workers": a.workers, "size": a.size, "runs": a.runs,
              "rates_img_per_s": rates, "versions": versions, "extra": extra, "load": loads,
              "of_ceiling": {s: per_round(s, "ceiling") for s in systems},
              "of_ceiling_cpu": {s: per_round(s, "ceiling", cpu=True) for s in systems},
              "of_ceiling_scaled": {s: per_round(s, "ceiling-scaled") for s in systems},
              "of_ceiling_scaled_cpu": {s: per_round(s, "ceiling-scaled", cpu=True) for s in systems},
              "warp_over": {s: per_round("warp", s) for s in systems}}
    from _figures import emit, figure  # the summary's figures (bench/summary.py)

    wall, cpu = result["of_ceiling"].get("warp"), result["of_ceiling_cpu"].get("warp")
    swall, scpu = result["of_ceiling_scaled"].get("warp"), result["of_ceiling_scaled_cpu"].get("warp")
    note = f"{a.n} {a.kind} JPEGs -> {a.size}, {a.workers} workers"
    emit("warehouse_etl", [figure("warp ETL / full-decode + letterbox ceiling (wall)", wall, "x", target=1.2,
                                  note=f"{note}; per CPU-s: {_x(cpu)}"),
                           figure("warp ETL, % of the scaled-decode + letterbox ceiling (wall)",
                                  swall and 100 * swall, "%", target=85,
                                  note=f"{note}; per CPU-s: {'-' if scpu is None else f'{100 * scpu:.0f} %'}")]
         + [figure(f"warp ETL / {s}", v, "x", target=2) for s, v in result["warp_over"].items()
            if v and s in PEER_MODULES])
    if a.json:
        print(json.dumps(result, indent=2))
        return 0
    warp = rates.get("warp")
    what = "600-900 px photo crops" if a.kind == "photos" else "1920x1080 photos"
    print(f"tensor-warehouse ETL: {a.n} {what} (JPEG) -> letterbox {a.size} u8, {a.workers} workers, "
          f"median of {a.runs}")
    print("img/s: median of rounds; ratios: median of per-round ratios (systems alternate, the first rotates)")
    print("load average (1 min) before, after each round: " + " ".join(f"{x:.2f}" for x in loads)
          + f"  ({os.cpu_count()} CPUs)")
    print(f"{'system':<12}{'img/s':>9}{'% of ceiling':>14}{'warp / system':>15}{'img/CPU-s':>11}{'% ceil (CPU)':>14}"
          "  note")
    for s in systems:
        r = rates.get(s)
        if r is None:
            why = "not installed" if s in versions and versions[s] is None else extra.get(s, {}).get("error", "")
            print(f"{s:<12}{'-':>9}{'':>14}{'':>15}  {why}")
            continue
        cpu_v = per_round(s, "ceiling", cpu=True)
        pct_v = per_round(s, "ceiling")
        pct = f"{100 * pct_v:.0f}%" if pct_v else ""
        ratio_v = per_round("warp", s) if warp and not s.startswith("warp") else None
        ratio = f"{ratio_v:.2f}x" if ratio_v else ""
        note = versions.get(s) or ""
        if s.startswith("warp") and s in extra:
            note = f"build phase {extra[s]['build_rate']:.0f} img/s; cpu ms/img " + ", ".join(
                f"{k} {v:.2f}" for k, v in extra[s]["cpu_ms"].items())
        ok = [x for x in runs[s] if x.get("cpu_s")]
        per_cpu = common.median([x["n"] / x["cpu_s"] for x in ok]) if ok else None
        print(f"{s:<12}{r:>9.0f}{pct:>14}{ratio:>15}{(f'{per_cpu:.0f}' if per_cpu else ''):>11}"
              f"{(f'{100 * cpu_v:.0f}%' if cpu_v else ''):>14}  {note}")
    for w in ("warp", "warp-full"):
        if w not in systems:
            continue
        parts = []
        for c, target in (("ceiling", 1.2), ("ceiling-scaled", 0.85)):
            if c in systems:
                wall_v, cpu_v = per_round(w, c), per_round(w, c, cpu=True)
                parts.append(f"{c} {_x(wall_v)} wall, {_x(cpu_v)} per CPU-s"
                             + (f" (target >= {target:g}x)" if w == "warp" else ""))
        if parts:
            print(f"{w} / " + "; ".join(parts))
    return 0


def _x(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}x"


def _pixel_table(d: dict, kind: str) -> str:
    f, a = d["vs_full"], d["vs_full_area"]
    lines = [f"scaled vs full decode, {d['images']} {kind} JPEGs -> letterbox {d['size']} (content pixels; "
             f"scales used: {', '.join(f'{k} x{v}' for k, v in d['scales'].items())})",
             f"{'reference':<34}{'max |d|':>9}{'median max':>12}{'mean |d|':>10}{'worst mean':>12}"
             f"{'PSNR min':>10}{'PSNR med':>10}"]
    for name, r in (("full decode + linear (warp full)", f), ("full decode + INTER_AREA", a)):
        lines.append(f"{name:<34}{r['max_abs']:>9.0f}{r['max_abs_median']:>12.1f}{r['mean_abs']:>10.3f}"
                     f"{r['mean_abs_worst']:>12.3f}{r['psnr_min']:>10.2f}{r['psnr_median']:>10.2f}")
    lines.append(f"|d| vs full: p99 {d['abs_p99']}, p99.9 {d['abs_p999']}, share > 8: {100 * d['share_over_8']:.2f} %; "
                 f"full + linear vs full + INTER_AREA: PSNR median {d['full_vs_area_psnr_median']:.2f}")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
