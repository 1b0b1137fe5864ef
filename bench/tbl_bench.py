"""TBL v2 benchmark: warp vs turboloader 2.39 on the same tar, same run.

    .venv/bin/python bench/tbl_bench.py [--count 2000] [--runs 3] [--rss-count 50000] [--only reads,loader]

Sections (medians of --runs, each conversion in a fresh subprocess so its
peak RSS is its own):

1. conversion of a 2,000 real-photo WebDataset tar (.jpg + .json + .cls):
   `warp tar-to-tbl` vs TurboLoader's documented Python route (tarfile +
   TblWriterV2 + add_metadata, sizes from Pillow's header parse);
1b. (``disk``) conversion against the physical ceiling, an fsync'd copy of
   the same tar, on that corpus and on 3,000 large (~130 KB) photos,
   alternating runs (target: warp >= 85 % of the copy's speed);
2. peak RSS of both converters on 2,000 vs 50,000 small synthetic images;
3. 10,000 random reads and a sequential pass, checksums verified
   (TurboLoader with verify on and off), readers interleaved in blocks;
4. loader decode throughput vs a bare simplejpeg loop (same decode, same
   resize, same threads), one epoch each, alternating which goes first.

``--baseline DIR`` adds an older converter to the disk section's rotation
(before/after under the same load); DIR holds that checkout's ``warpdata``
package, laid out as pyproject.toml's package-dir maps it::

    git archive REV warp formats commands kernels | tar x -C /tmp/rev
    mkdir -p /tmp/base && cp -a /tmp/rev/warp /tmp/base/warpdata
    for d in formats commands kernels; do cp -a /tmp/rev/$d /tmp/base/warpdata/; done

Timings on a shared machine drift with other processes' load; interleaving
the contenders in small blocks makes the drift hit them alike (the ratios
are the figures to quote). The script prints ``uptime``'s load average.

Real photos come from scikit-image / scikit-learn (`pip install 'warp-toolchain[bench]'`).
The headline figures go to bench/out/tbl_bench.figures.json (bench/summary.py
collects them) and the disk section's per-run plot to bench/out/tbl_disk.png.
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
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _figures import emit, figure  # noqa: E402

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
t0, c0 = time.perf_counter(), time.process_time()
res = convert(ConvertRequest(src, dst, workers=workers, fsync=fsync))
dt, cpu = time.perf_counter() - t0, time.process_time() - c0
print(json.dumps({"samples": res.samples, "seconds": dt, "cpu_s": cpu, "rss_mb": hwm()}))
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


def run_py(code: str, *args: str, pythonpath: str | None = None) -> dict:
    env = None
    if pythonpath:  # another checkout's package tree first on the path (--baseline)
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [pythonpath, os.environ.get("PYTHONPATH")])))
    p = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, check=True, env=env)
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


def bench_rss(small: int, large: int) -> tuple[str, dict]:
    rows, facts = [], {}
    base = run_py(BASELINE_RSS)["rss_mb"]
    for n in (small, large):
        tar = OUT / f"small-{n}.tar"
        if not tar.exists():
            build_small_tar(tar, n)
        warm(tar)
        w = run_py(WARP_CONVERT, str(tar), str(OUT / "rss.tbl"), "2", "0")
        t = run_py(TURBO_CONVERT, str(tar), str(OUT / "rss.tbl"))
        rows.append([f"{n:,}", f"{tar.stat().st_size / 1e6:.0f}", f"{w['rss_mb']:.0f}", f"{t['rss_mb']:.0f}"])
        facts[n] = w["rss_mb"]
    (OUT / "rss.tbl").unlink()
    return table(f"Peak RSS vs dataset size (32x32 JPEGs; interpreter + imports alone: {base:.0f} MB)",
                 ["samples", "tar MB", "warp peak RSS MB", "turboloader peak RSS MB"], rows), facts


def fsync_copy(src: Path, dst: Path) -> float:
    """Seconds for a durable copy of ``src``: copy_file_range (what cp does) + fsync of file and directory."""
    t0 = time.perf_counter()
    with open(src, "rb") as f, open(dst, "wb") as g:
        n, done = os.fstat(f.fileno()).st_size, 0
        while done < n:
            got = os.copy_file_range(f.fileno(), g.fileno(), n - done)
            if not got:
                break
            done += got
        os.fsync(g.fileno())
    fd = os.open(dst.parent, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    return time.perf_counter() - t0


def bench_disk(tars: list[tuple[str, Path]], runs: int, baseline: str | None = None) -> tuple[str, dict]:
    """tar-to-tbl (2 workers, fsync'd) against the physical ceiling: an fsync'd copy of the same tar.

    The copy moves the same bytes tar -> disk with no parsing and no checksums; warp
    writes ~1 % less (no tar headers and padding) plus index, trailers and metadata.
    Runs rotate which goes first; the tar is in the page cache for all. The
    ratio is copy seconds / warp seconds (1.0 = as fast as the copy). With
    ``baseline`` (a directory holding another checkout's ``warpdata`` package,
    e.g. one made with ``git archive``), that converter runs in the same rotation:
    before and after under the same load.
    """
    rows, facts = [], {}
    names = ["copy", "warp"] + (["baseline"] if baseline else [])
    for label, tar in tars:
        warm(tar)
        size = tar.stat().st_size
        got: dict[str, list] = {n: [] for n in names}
        for r in range(runs):
            for which in names[r % len(names):] + names[:r % len(names)]:
                dst = OUT / f"disk-{which}.out"
                if which == "copy":
                    got["copy"].append(fsync_copy(tar, dst))
                else:
                    got[which].append(run_py(WARP_CONVERT, str(tar), str(dst), "2", "1",
                                             pythonpath=baseline if which == "baseline" else None))
                dst.unlink()
        copies = got["copy"]
        for who in names[1:]:
            xs = got[who]
            c, w = med(copies), med([x["seconds"] for x in xs])
            per_run = [a / b["seconds"] for a, b in zip(copies, xs, strict=True)]
            rss, cpu = max(x["rss_mb"] for x in xs), med([x["cpu_s"] for x in xs])
            rows.append([label if who == "warp" else f"{label} (baseline)", f"{size / 1e6:.0f}", f"{c:.3f}", f"{w:.3f}",
                         f"{c / w:.0%}", ", ".join(f"{x:.0%}" for x in per_run), f"{cpu:.2f}", f"{rss:.0f}"])
            if who == "warp":
                facts[label] = {"copy_s": copies, "warp_s": [x["seconds"] for x in xs], "ratio": c / w,
                                "rss_mb": rss, "cpu_s": cpu, "mb": size / 1e6, "samples": xs[0]["samples"]}
    return table(f"tar-to-tbl vs an fsync'd copy of the tar (the disk ceiling), median of {runs} rotating runs",
                 ["corpus", "tar MB", "fsync'd copy s", "warp s (2 workers, fsync)", "copy / warp",
                  "per run, in run order", "warp CPU s", "warp peak RSS MB"], rows), facts


def plot_disk(facts: dict, path: Path) -> bool:
    """Per-run throughput of the copy and of warp on each corpus, with the 85 % line."""
    from _figures import pyplot

    plt = pyplot()
    if plt is None or not facts:
        return False
    fig, axes = plt.subplots(1, len(facts), figsize=(5 * len(facts), 3.6), squeeze=False)
    for ax, (label, f) in zip(axes[0], facts.items(), strict=True):
        runs = range(1, len(f["copy_s"]) + 1)
        copy = [f["mb"] / x for x in f["copy_s"]]
        ax.plot(runs, copy, "o-", label="fsync'd copy (ceiling)")
        ax.plot(runs, [f["mb"] / x for x in f["warp_s"]], "s-", label="warp tar-to-tbl")
        ax.axhline(0.85 * med(copy), color="grey", ls="--", lw=1, label="85 % of the copy (median)")
        ax.set_title(label, fontsize=9)
        ax.set_xticks(list(runs))
        ax.set_xlabel("run")
        ax.set_ylabel("MB/s (tar bytes)")
        ax.set_ylim(bottom=0)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


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


SECTIONS = ("convert", "disk", "rss", "reads", "loader")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--count", type=int, default=2000)
    ap.add_argument("--large-count", type=int, default=3000, help="~130 KB photos in the large corpus (disk section)")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--rss-count", type=int, default=50_000)
    ap.add_argument("--only", default=",".join(SECTIONS), help=f"comma-separated subset of {', '.join(SECTIONS)}")
    ap.add_argument("--markdown", type=Path, help="also write the tables to this file")
    ap.add_argument("--baseline", metavar="DIR",
                    help="disk section: also time the converter of the warpdata package under DIR (another "
                         "checkout, e.g. from 'git archive'), in the same rotation, for before/after figures")
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

    figures, plots = [], []
    load_start = os.getloadavg()[0]
    if "convert" in only:
        text, conv = bench_convert(tar, a.runs)
        section(text)
        t = conv["turboloader (tarfile + TblWriterV2)"]["img_s"]
        w2 = conv["warp, 2 workers"]
        figures += [figure("tar-to-tbl, 2 workers, fsync'd, vs turboloader (img/s)", w2["img_s"] / t, "x", target=5,
                           note=f"{a.count:,} real photos, {w2['img_s']:,.0f} vs {t:,.0f} img/s"),
                    figure("tar-to-tbl peak RSS, real photos", w2["rss_mb"], "MB", target=64, op="<=")]
    if "disk" in only:
        large = OUT / f"large-{a.large_count}.tar"
        if not large.exists():
            t0 = time.perf_counter()
            info = build_large_tar(large, a.large_count)
            print(f"built {large} ({info['bytes'] / 1e6:.0f} MB) in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
        corpora = [(f"{a.count:,} real photos, ~{tar.stat().st_size / a.count / 1e3:.0f} KB", tar),
                   (f"{a.large_count:,} large photos, ~{large.stat().st_size / a.large_count / 1e3:.0f} KB", large)]
        text, disk = bench_disk(corpora, max(a.runs, 5), a.baseline)
        section(text)
        for label, f in disk.items():
            figures += [figure(f"tar-to-tbl wall vs fsync'd copy of the tar, {label}", 100 * f["ratio"], "%",
                               target=85, note=f"{f['mb']:.0f} MB; warp {f['cpu_s']:.2f} CPU-s"),
                        figure(f"tar-to-tbl peak RSS, {label}", f["rss_mb"], "MB", target=64, op="<=")]
        if plot_disk(disk, OUT.parent / "tbl_disk.png"):
            plots.append("tbl_disk.png")
    if "rss" in only:
        text, rss = bench_rss(2000, a.rss_count)
        section(text)
        figures.append(figure(f"tar-to-tbl peak RSS at {a.rss_count:,} samples", rss[a.rss_count], "MB", target=64,
                              op="<=", note=f"{rss[2000]:.0f} MB at 2,000"))
    tbl_path = OUT / f"photos-{a.count}.tbl"
    if only & {"reads", "loader"}:
        from warpdata.tbl.converter import ConvertRequest, convert

        if tbl_path.exists():
            tbl_path.unlink()
        convert(ConvertRequest(str(tar), str(tbl_path), workers=2))
    if "reads" in only:
        text, reads = bench_reads(tbl_path, max(a.runs, 5))
        section(text)
        w = reads["warp TblReader verify=True"]
        figures += [figure("random verified reads vs turboloader verify=True", w[0] / reads["turboloader verify=True"][0],
                           "x", target=20, note=f"{w[0]:,.0f} reads/s"),
                    figure("random verified reads vs turboloader verify=False (wall)",
                           w[0] / reads["turboloader verify=False"][0], "x", target=1),
                    figure("sequential verified reads", w[2], "/s", target=30_000)]
    if "loader" in only:
        text, ld = bench_loader(tbl_path, max(a.runs, 6))
        section(text)
        figures += [figure(f"TblLoader / bare decode loop, {k}", 100 * v[2], "%", target=85) for k, v in ld.items()]
    if a.markdown:
        a.markdown.write_text("\n".join(out) + "\n")
    if figures:
        print(f"figures: {emit('tbl_bench', figures, plots=plots, load_start=load_start)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
