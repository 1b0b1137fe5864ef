"""TBL v2 benchmark: warp vs turboloader 2.39 on the same tar, same run.

    .venv/bin/python bench/tbl_bench.py [--count 2000] [--runs 3] [--rss-count 50000] [--only reads,loader]

Sections (medians of --runs, each conversion in a fresh subprocess so its
peak RSS is its own):

1. conversion of a 2,000 real-photo WebDataset tar (.jpg + .json + .cls):
   `warp tar-to-tbl` vs TurboLoader's documented Python route (tarfile +
   TblWriterV2 + add_metadata, sizes from Pillow's header parse);
2. peak RSS of both converters on 2,000 vs 50,000 small synthetic images;
3. 10,000 random reads and a sequential pass, checksums verified
   (TurboLoader with verify on and off), readers interleaved in blocks;
4. loader decode throughput vs a bare simplejpeg loop (same decode, same
   resize, same threads), one epoch each, alternating which goes first.

Timings on a shared machine drift with other processes' load; interleaving
the contenders in small blocks makes the drift hit them alike (the ratios
are the figures to quote). The script prints ``uptime``'s load average.

Real photos come from scikit-image / scikit-learn (`pip install 'warpdata[bench]'`).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

OUT = Path(__file__).resolve().parent / "out" / "tbl"

TURBO_CONVERT = r"""
import io, json, sys, tarfile, time

def hwm():
    # peak RSS of this process image: ru_maxrss would include the parent's peak (kept across exec)
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
import turboloader as t
from PIL import Image
src, dst = sys.argv[1], sys.argv[2]
FMT = {"JPEG": t.SampleFormat.JPEG, "PNG": t.SampleFormat.PNG, "WEBP": t.SampleFormat.WEBP}
t0 = time.perf_counter()
w = t.TblWriterV2(dst, enable_compression=True)
n = 0
cur_key, cur = None, {}
def flush():
    global n
    img = cur.get("jpg")
    if img is None:
        return
    im = Image.open(io.BytesIO(img))
    idx = w.add_sample(img, FMT.get(im.format, t.SampleFormat.UNKNOWN), width=im.width, height=im.height)
    side = {k: v.decode() for k, v in cur.items() if k != "jpg"}
    w.add_metadata(idx, json.dumps({"key": cur_key, **side}), t.MetadataType.JSON)
    n += 1
with tarfile.open(src) as tf:
    for m in tf:
        if not m.isfile():
            continue
        key, _, ext = m.name.partition(".")
        if key != cur_key:
            flush()
            cur_key, cur = key, {}
        cur[ext] = tf.extractfile(m).read()
    flush()
w.finalize()
dt = time.perf_counter() - t0
print(json.dumps({"samples": n, "seconds": dt, "rss_mb": hwm()}))
"""

WARP_CONVERT = r"""
import json, sys, time
from warpdata.tbl.converter import ConvertRequest, convert

def hwm():
    # peak RSS of this process image: ru_maxrss would include the parent's peak (kept across exec)
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
src, dst, workers, fsync = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4] == "1"
t0 = time.perf_counter()
res = convert(ConvertRequest(src, dst, workers=workers, fsync=fsync))
dt = time.perf_counter() - t0
print(json.dumps({"samples": res.samples, "seconds": dt, "rss_mb": hwm()}))
"""

BASELINE_RSS = r"""
import json

def hwm():
    # peak RSS of this process image: ru_maxrss would include the parent's peak (kept across exec)
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
import numpy, lz4.block, zstandard, fastcrc
from warpdata.tbl.converter import convert
print(json.dumps({"rss_mb": hwm()}))
"""


def run_py(code: str, *args: str) -> dict:
    p = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, check=True)
    return json.loads(p.stdout.strip().splitlines()[-1])


def build_photo_tar(path: Path, count: int) -> dict:
    from warpdata.sampledata.photos import real_photo_corpus
    from warpdata.sampledata.wds import write_tar

    def gen():
        for i, (jpg, w, h) in enumerate(real_photo_corpus(count, seed=0)):
            yield f"s{i:07d}", {"jpg": jpg, "json": json.dumps({"w": w, "h": h}).encode(),
                                "cls": str(i % 10).encode()}
    return write_tar(path, gen())


def build_large_tar(path: Path, count: int, unique: int = 500) -> dict:
    """~125 KB real-photo JPEGs (800-1050 px sides, q88-92) + .json/.cls sidecars.

    ``unique`` distinct photos are cycled: the converter never decodes, so
    repeats cost it the same as new photos, and the corpus builds in ~40 s.
    """
    from warpdata.sampledata.photos import real_photo_corpus
    from warpdata.sampledata.wds import write_tar

    pool = list(real_photo_corpus(min(unique, count), seed=1, min_side=800, max_side=1050, quality=(88, 92)))

    def gen():
        for i in range(count):
            jpg, w, h = pool[i % len(pool)]
            yield f"s{i:07d}", {"jpg": jpg, "json": json.dumps({"w": w, "h": h}).encode(),
                                "cls": str(i % 10).encode()}
    return write_tar(path, gen())


def build_small_tar(path: Path, count: int) -> dict:
    import numpy as np
    from warpdata.sampledata.photos import encode_jpeg, synthetic_photo
    from warpdata.sampledata.wds import write_tar

    rng = np.random.default_rng(0)
    pool = [encode_jpeg(synthetic_photo(rng, 32, 32), 80) for _ in range(256)]

    def gen():
        for i in range(count):
            yield f"s{i:07d}", {"jpg": pool[i % len(pool)], "cls": str(i % 10).encode()}
    return write_tar(path, gen())


def warm(path: Path) -> None:
    with open(path, "rb") as f:
        while f.read(8 << 20):
            pass


def med(xs):
    return statistics.median(xs)


def table(title: str, cols: list[str], rows: list[list]) -> str:
    lines = [f"\n### {title}\n", "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    text = "\n".join(lines)
    print(text, flush=True)
    return text


def bench_convert(tar: Path, runs: int) -> tuple[str, dict]:
    warm(tar)
    res: dict[str, list[dict]] = {"turboloader (tarfile + TblWriterV2)": [], "warp, 1 worker": [],
                                  "warp, 2 workers": [], "warp, 2 workers, no fsync": []}
    for r in range(runs):
        for name in res:
            dst = OUT / f"conv-{r}.tbl"
            if name.startswith("turbo"):
                got = run_py(TURBO_CONVERT, str(tar), str(dst))
            else:
                workers = "1" if "1 worker" in name else "2"
                got = run_py(WARP_CONVERT, str(tar), str(dst), workers, "0" if "no fsync" in name else "1")
            got["bytes"] = dst.stat().st_size
            res[name].append(got)
            dst.unlink()
    base = med([x["samples"] / x["seconds"] for x in res["turboloader (tarfile + TblWriterV2)"]])
    rows, facts = [], {}
    for name, xs in res.items():
        rate = med([x["samples"] / x["seconds"] for x in xs])
        rows.append([name, xs[0]["samples"], f"{rate:,.0f}", f"{rate / base:.2f}x",
                     f"{med([x['rss_mb'] for x in xs]):.0f}", f"{xs[0]['bytes'] / tar.stat().st_size:.4f}"])
        facts[name] = {"img_s": rate, "rss_mb": med([x["rss_mb"] for x in xs])}
    return table(f"Conversion, {xs[0]['samples']:,} real photos ({tar.stat().st_size / 1e6:.0f} MB tar), median of {runs}",
                 ["converter", "samples", "img/s", "vs turboloader", "peak RSS MB", "out/tar bytes"], rows), facts


def bench_rss(small: int, large: int) -> str:
    rows = []
    base = run_py(BASELINE_RSS)["rss_mb"]
    for n in (small, large):
        tar = OUT / f"small-{n}.tar"
        if not tar.exists():
            build_small_tar(tar, n)
        warm(tar)
        w = run_py(WARP_CONVERT, str(tar), str(OUT / "rss.tbl"), "2", "0")
        t = run_py(TURBO_CONVERT, str(tar), str(OUT / "rss.tbl"))
        rows.append([f"{n:,}", f"{tar.stat().st_size / 1e6:.0f}", f"{w['rss_mb']:.0f}", f"{t['rss_mb']:.0f}"])
    (OUT / "rss.tbl").unlink()
    return table(f"Peak RSS vs dataset size (32x32 JPEGs; interpreter + imports alone: {base:.0f} MB)",
                 ["samples", "tar MB", "warp peak RSS MB", "turboloader peak RSS MB"], rows)


def bench_reads(tbl_path: Path, runs: int, n_random: int = 10_000, block: int = 250) -> tuple[str, dict]:
    """Random and sequential reads, interleaved in blocks so machine load hits every reader alike.

    Every reader returns each sample's bytes to Python: turboloader copies them
    out of its mmap into a new ``bytes``; warp returns a zero-copy ``memoryview``
    of its mmap after checking the payload's CRC-32 trailer. The "+ bytes()"
    row adds the copy to warp so the outputs are the same type. Reads are
    single-threaded and CPU-bound (memory stalls count as CPU time), so the
    thread's CPU time is also shown: unlike wall time it does not count the
    slices other processes take on a shared machine.
    """
    import turboloader as t
    from warpdata.formats.tbl import TblReader

    warm(tbl_path)
    r = TblReader(tbl_path, verify=True)
    n = len(r)
    rng = random.Random(0)
    tl_nv = t.TblReaderV2(str(tbl_path), verify_checksums=False)
    tl_v = t.TblReaderV2(str(tbl_path), verify_checksums=True)

    def loop(read):
        def run(idx):
            for i in idx:
                read(i)
        return run

    def warp_copy(i, read=r.read):
        return bytes(read(i))

    cases = {"turboloader verify=False": loop(tl_nv.read_sample),
             "warp TblReader verify=True": loop(r.read),
             "warp verify=True + bytes()": loop(warp_copy)}
    rand: dict[str, list[float]] = {k: [] for k in cases}
    rand_cpu: dict[str, list[float]] = {k: [] for k in cases}
    seq: dict[str, list[float]] = {k: [] for k in cases}
    names = list(cases)
    for run in range(runs):
        spent = dict.fromkeys(names, 0.0)
        spent_cpu = dict.fromkeys(names, 0.0)
        for b in range(n_random // block):
            k = (run + b) % len(names)
            for name in names[k:] + names[:k]:  # rotate who goes first
                # indices of its own: the same ones would still be in the L3
                # cache (block x ~80 KB < 32 MB) from the reader before
                idx = [rng.randrange(n) for _ in range(block)]
                t0, c0 = time.perf_counter(), time.thread_time()
                cases[name](idx)
                spent_cpu[name] += time.thread_time() - c0
                spent[name] += time.perf_counter() - t0
        for name in names:
            rand[name].append(n_random / spent[name])
            rand_cpu[name].append(n_random / spent_cpu[name])
        for name in names[run % len(names):] + names[:run % len(names)]:
            t0 = time.perf_counter()
            cases[name](range(n))
            seq[name].append(n / (time.perf_counter() - t0))
    # turboloader's default verify=True runs ~500-1,500 reads/s: one pass of the same kind
    idx = [rng.randrange(n) for _ in range(n_random)]
    t0, c0 = time.perf_counter(), time.thread_time()
    loop(tl_v.read_sample)(idx)
    tv_rand, tv_cpu = n_random / (time.perf_counter() - t0), n_random / (time.thread_time() - c0)
    res = {name: (med(rand[name]), med(rand_cpu[name]), med(seq[name])) for name in names}
    w, t_ = "warp TblReader verify=True", "turboloader verify=False"
    ratio_runs = [a / b for a, b in zip(rand[w], rand[t_], strict=True)]
    ratio_cpu = [a / b for a, b in zip(rand_cpu[w], rand_cpu[t_], strict=True)]
    res["turboloader verify=True"] = (tv_rand, tv_cpu, None)
    bn, bn_cpu = res[t_][0], res[t_][1]
    rows = [[name, f"{a:,.0f}", f"{a / tv_rand:.1f}x", f"{a / bn:.2f}x", f"{c:,.0f}", f"{c / bn_cpu:.2f}x",
             f"{q:,.0f}" if q else "-"]
            for name, (a, c, q) in res.items()]
    text = table(f"Reads of {n:,} photos: {n_random:,} random reads (blocks of {block}, readers interleaved) "
                 f"+ one sequential pass, median of {runs} (turboloader verify=True: 1 pass)",
                 ["reader", "random reads/s (wall)", "vs TL verify", "vs TL no-verify",
                  "random reads per CPU-s", "vs TL no-verify (CPU)", "sequential reads/s"], rows)
    line = (f"\nwarp verified / turboloader unverified, random reads, per run: wall "
            f"{', '.join(f'{x:.2f}' for x in sorted(ratio_runs))} (median {med(ratio_runs):.2f}); "
            f"CPU time {', '.join(f'{x:.2f}' for x in sorted(ratio_cpu))} (median {med(ratio_cpu):.2f})")
    print(line)
    return text + "\n" + line, res


def bench_loader(tbl_path: Path, runs: int, threads: int = 2) -> tuple[str, dict]:
    """TblLoader vs a bare loop doing the same decode (+ resize) on the same threads.

    One epoch each per run, in alternating order (load drift hits both alike;
    the per-run ratios are printed). The bare loop decodes bytes already in
    memory and drops each image at once; the loader reads from the mmap,
    checks each CRC, shuffles and hands out whole batches, as a training loop
    uses them. A loader runs a whole epoch, so its steady state (warm pooled
    batch buffers) is what is measured; building one per few batches would
    measure its start-up instead.
    """
    import numpy as np
    import simplejpeg
    from PIL import Image
    from warpdata.formats.tbl import TblReader
    from warpdata.tbl.loader import TblLoader

    r = TblReader(tbl_path)
    blobs = [bytes(r[i]) for i in range(len(r))]
    n = len(blobs)
    rows, res = [], {}
    for size in (None, 224):
        def bare_one(b, size=size):
            if size is None:
                return simplejpeg.decode_jpeg(b, colorspace="RGB")
            img = simplejpeg.decode_jpeg(b, colorspace="RGB", min_height=size, min_width=size)
            return np.asarray(Image.fromarray(img).resize((size, size), Image.BILINEAR))

        def do_bare(run, bare_one=bare_one):
            perm = np.random.default_rng(run).permutation(n)
            with ThreadPoolExecutor(threads) as pool:
                for _x in pool.map(bare_one, [blobs[i] for i in perm]):
                    pass
            return n

        def do_loader(run, size=size):
            got = 0
            for b in TblLoader(r, 64, size=size, threads=threads, shuffle=True, seed=run):
                got += len(b)
            return got

        runs += runs % 2  # as many runs with the bare loop first as with the loader first
        spent = {do_bare: 0.0, do_loader: 0.0}
        per_run = []
        for run in range(runs):
            took = {}
            for which in ((do_bare, do_loader) if run % 2 == 0 else (do_loader, do_bare)):
                t0 = time.perf_counter()
                got = which(run)
                took[which] = time.perf_counter() - t0
                assert got == n
            spent[do_bare] += took[do_bare]
            spent[do_loader] += took[do_loader]
            per_run.append(took[do_bare] / took[do_loader])
        b, lw = runs * n / spent[do_bare], runs * n / spent[do_loader]
        label = "full size" if size is None else f"resize to {size}x{size} (DCT downscale + bilinear)"
        rows.append([label, f"{b:,.0f}", f"{lw:,.0f}", f"{lw / b:.0%}",
                     ", ".join(f"{x:.0%}" for x in per_run)])
        res[label] = (b, lw, lw / b)
    return table(f"Loader decode throughput, {n:,} photos, {threads} threads: {runs} runs of one epoch each, "
                 "bare first in even runs, loader first in odd ones; img/s over all runs",
                 ["decode", "bare simplejpeg loop img/s", "TblLoader img/s (verified, shuffled)",
                  "loader / bare", "per run, in run order"], rows), res


def load() -> str:
    return "load average " + ", ".join(f"{x:.2f}" for x in os.getloadavg())


SECTIONS = ("convert", "rss", "reads", "loader")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--count", type=int, default=2000)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--rss-count", type=int, default=50_000)
    ap.add_argument("--only", default=",".join(SECTIONS), help=f"comma-separated subset of {', '.join(SECTIONS)}")
    ap.add_argument("--markdown", type=Path, help="also write the tables to this file")
    a = ap.parse_args()
    only = set(a.only.split(","))
    if only - set(SECTIONS):
        ap.error(f"--only: unknown section(s) {', '.join(sorted(only - set(SECTIONS)))}")
    OUT.mkdir(parents=True, exist_ok=True)
    tar = OUT / f"photos-{a.count}.tar"
    if not tar.exists():
        t0 = time.perf_counter()
        info = build_photo_tar(tar, a.count)
        print(f"built {tar} ({info['bytes'] / 1e6:.0f} MB) in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    import numpy  # noqa: F401  (import cost outside the timings)
    out = [f"machine: {os.cpu_count()} CPUs, Python {sys.version.split()[0]}, {load()} at start"]
    print(out[0])

    def section(text: str) -> None:
        out.append(text)
        out.append(f"\n({load()} after this section)")
        print(out[-1], flush=True)

    if "convert" in only:
        section(bench_convert(tar, a.runs)[0])
    if "rss" in only:
        section(bench_rss(2000, a.rss_count))
    tbl_path = OUT / f"photos-{a.count}.tbl"
    if only & {"reads", "loader"}:
        from warpdata.tbl.converter import ConvertRequest, convert

        if tbl_path.exists():
            tbl_path.unlink()
        convert(ConvertRequest(str(tar), str(tbl_path), workers=2))
    if "reads" in only:
        section(bench_reads(tbl_path, max(a.runs, 5))[0])
    if "loader" in only:
        section(bench_loader(tbl_path, max(a.runs, 6))[0])
    if a.markdown:
        a.markdown.write_text("\n".join(out) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
