"""Read API vs peers on the same moto S3 server, in one run.

1. Streaming 1 M rows / 10 shards: warp (remote mode) vs pyarrow.dataset over
   pyarrow's native S3 on the same files: time to first batch, rows/s.
2. Warm-cache epoch (warp auto mode after `warm`) vs pyarrow reading the same
   Parquet files from local disk.
3. A selective filter: bytes fetched / bytes stored.
4. Ranged ref reads/s (ImageRef.read_bytes) vs s3fs.cat_file(start, end) on
   the same members.

Pairs of measures run alternately (median of --runs, who goes first rotating); the remote
stream's requests and bytes are counted by the server against the column chunks it needs, and
the moto server's own CPU time (/proc/<pid>/stat) is measured per stream: it is a Python
process on the same cores, so every request a reader sends costs the machine twice.

``--baseline DIR`` adds an older warp's remote stream to the stream rotation (before/after under
the same load), run in a subprocess on the same server and data; DIR holds that checkout's
``warpdata`` package, laid out as pyproject.toml's package-dir maps it::

    git archive REV warp formats commands kernels | tar x -C /tmp/rev
    mkdir -p /tmp/base && cp -a /tmp/rev/warp /tmp/base/warpdata
    for d in formats commands kernels; do cp -a /tmp/rev/$d /tmp/base/warpdata/; done

``--only stream`` (or warm, filter, refs; comma-separated) runs a subset.

Run: .venv/bin/python bench/read_stream.py [--rows 1000000] [--runs 5] [--baseline DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

SECTIONS = ("stream", "warm", "filter", "refs")
B = 65536

# A warp remote stream in a subprocess (--baseline: another checkout's package first on the path):
# one stream per line read on stdin, one JSON line per stream on stdout.
WORKER = """
import json, sys, time
import warpdata
for line in sys.stdin:
    t0, c0 = time.perf_counter(), time.process_time()
    t = warpdata.dataset(sys.argv[1], mode="remote").table("main")
    first, n = None, 0
    for b in t.batches(int(sys.argv[2])):
        if first is None:
            first = time.perf_counter() - t0
        n += b.num_rows
    wall = time.perf_counter() - t0
    print(json.dumps({"first": first, "rate": n / wall, "wall": wall, "cpu": time.process_time() - c0}), flush=True)
"""


def _proc_cpu(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` (the moto server)."""
    with open(f"/proc/{pid}/stat") as f:
        v = f.read().rsplit(")", 1)[1].split()
    return (int(v[11]) + int(v[12])) / os.sysconf("SC_CLK_TCK")


class _Worker:
    """The WORKER script in a subprocess, run once per call."""

    def __init__(self, pythonpath: str, name: str) -> None:
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [pythonpath, os.environ.get("PYTHONPATH")])))
        self.p = subprocess.Popen([sys.executable, "-c", WORKER, name, str(B)], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, text=True, env=env)

    def __call__(self) -> dict:
        self.p.stdin.write("go\n")
        self.p.stdin.flush()
        line = self.p.stdout.readline()
        if not line:
            raise RuntimeError("the baseline worker died (see its stderr above)")
        return json.loads(line)

    def close(self) -> None:
        self.p.stdin.close()
        self.p.wait(timeout=30)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--shards", type=int, default=10)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--refs", type=int, default=300)
    ap.add_argument("--only", default=",".join(SECTIONS), help=f"comma-separated subset of {', '.join(SECTIONS)}")
    ap.add_argument("--baseline", metavar="DIR",
                    help="also time the remote stream of the warpdata package under DIR (another checkout, e.g. "
                         "from 'git archive'), in the same rotation, for before/after figures")
    a = ap.parse_args()
    a.only = set(a.only.split(","))
    if a.only - set(SECTIONS):
        ap.error(f"--only: unknown section(s) {', '.join(sorted(a.only - set(SECTIONS)))}")

    from support.s3fixtures import s3_env, start_moto_server

    server = start_moto_server()
    try:
        run(server, a, s3_env)
    finally:
        server.stop()


def run(server, a, s3_env) -> None:
    import boto3
    import numpy as np
    import pyarrow as pa
    import pyarrow.dataset as pads
    import pyarrow.parquet as pq
    from support.datasets import publish, range_bytes, write_media

    load0 = os.getloadavg()
    os.environ.update(s3_env(server.endpoint))
    tmp = Path(tempfile.mkdtemp(prefix="warp-bench-"))
    os.environ["WARP_CACHE_DIR"] = str(tmp / "cache")
    os.environ["WARP_CACHE_SIZE_GB"] = "20"
    boto3.client("s3", endpoint_url=server.endpoint, region_name="us-east-1").create_bucket(Bucket="bench")
    store = "s3://bench/warp"
    os.environ["WARP_STORE"] = store
    per = a.rows // a.shards
    rng = np.random.default_rng(0)
    parts = []
    for k in range(a.shards):
        ids = np.arange(k * per, (k + 1) * per, dtype=np.int64)
        parts.append(pa.table({"id": ids, "x": rng.random(per), "y": rng.integers(0, 1000, per, dtype=np.int32),
                               "label": pa.array(np.char.add("c", (ids % 100).astype(str)))}))
    write_media(tmp / "media", 400)
    for i in range(a.shards):
        parts[i] = parts[i].append_column("image", pa.array([f"img/{j % 400:04d}.png" for j in range(per)]))
        parts[i] = parts[i].append_column("audio", pa.array([f"snd/{j % 3}.wav" for j in range(per)]))
    m = publish(store, "bench/stream", {"main": parts}, tmp, row_group_size=65536, media=tmp / "media",
                tar_target=1 << 20, compression="snappy")
    import warpdata

    shard_paths = [f"bench/warp/{s.uri}" for s in m.tables["main"].shards]
    local_dir = tmp / "local"
    local_dir.mkdir()
    for i, p in enumerate(parts):
        pq.write_table(p, local_dir / f"{i}.parquet", row_group_size=65536, compression="snappy")
    from warpdata.storage.locations import StorageConfig

    cfg = StorageConfig.from_env()
    pid = server.proc.pid

    def pyarrow_s3():
        fs = cfg.pyarrow_s3()
        t0, c0 = time.perf_counter(), time.process_time()
        d = pads.dataset(shard_paths, format="parquet", filesystem=fs)
        first, n = None, 0
        for b in d.to_batches(batch_size=B):
            if first is None:
                first = time.perf_counter() - t0
            n += b.num_rows
        wall = time.perf_counter() - t0
        return {"first": first, "rate": n / wall, "wall": wall, "cpu": time.process_time() - c0}

    def warp_remote():
        t0, c0 = time.perf_counter(), time.process_time()
        t = warpdata.dataset("bench/stream", mode="remote").table("main")
        first, n = None, 0
        for b in t.batches(B):
            if first is None:
                first = time.perf_counter() - t0
            n += b.num_rows
        wall = time.perf_counter() - t0
        return {"first": first, "rate": n / wall, "wall": wall, "cpu": time.process_time() - c0}

    def pyarrow_local():
        t0 = time.perf_counter()
        n = sum(b.num_rows for b in pads.dataset(str(local_dir), format="parquet").to_batches(batch_size=B))
        return time.perf_counter() - t0, n / (time.perf_counter() - t0)

    def warp_warm():
        t0 = time.perf_counter()
        t = warpdata.dataset("bench/stream").table("main")
        n = sum(b.num_rows for b in t.batches(B, prefetch="off"))
        return time.perf_counter() - t0, n / (time.perf_counter() - t0)

    def med(fn):
        fn()  # warm-up: imports, clients, connection pool
        rs = [fn() for _ in range(a.runs)]
        return statistics.median(r[0] for r in rs), statistics.median(r[1] for r in rs)

    def rotation(fns: dict) -> dict:
        """Each reader's per-run results ({first, rate, wall, cpu, server_cpu}), the readers run in
        turns after one warm-up each, who goes first rotating from run to run."""
        for fn in fns.values():
            fn()
        names = list(fns)
        out: dict[str, list[dict]] = {n: [] for n in names}
        for r in range(a.runs):
            for name in names[r % len(names):] + names[:r % len(names)]:
                s0 = _proc_cpu(pid)
                res = fns[name]()
                res["server_cpu"] = _proc_cpu(pid) - s0
                out[name].append(res)
        return out

    def md(rs: list[dict], k: str) -> float:
        return statistics.median(r[k] for r in rs)

    # requests and bytes of one remote stream, against the column chunks it needs (+ footers)
    def needed_bytes(columns=None) -> int:
        total = 0
        for p in local_dir.glob("*.parquet"):
            meta = pq.read_metadata(p)
            names = [meta.schema.column(c).name for c in range(meta.num_columns)]
            for g in range(meta.num_row_groups):
                rg = meta.row_group(g)
                total += sum(rg.column(c).total_compressed_size for c in range(rg.num_columns)
                             if columns is None or names[c] in columns)
        return total + sum(s.stats["footer_size"] for s in m.tables["main"].shards)

    def stream_traffic(fn):
        server.reset()
        fn()
        reqs = [r for r in server.requests() if "/blobs/" in r["key"]]
        return len(reqs), sum(r["method"] == "HEAD" for r in reqs), range_bytes(reqs)

    rows = []
    figures = []
    from _figures import emit, figure  # the summary's figures (bench/summary.py)

    if "stream" in a.only:
        fns = {"pyarrow": pyarrow_s3, "warp": warp_remote}
        base = _Worker(a.baseline, "bench/stream") if a.baseline else None
        if base:
            fns["baseline"] = base
        try:
            res = rotation(fns)
            b_traffic = stream_traffic(base) if base else None
        finally:
            if base:
                base.close()
        pa_rs, w_rs = res["pyarrow"], res["warp"]
        ratios = [w["rate"] / p["rate"] for w, p in zip(w_rs, pa_rs, strict=True)]
        w_rate, pa_rate = md(w_rs, "rate"), md(pa_rs, "rate")
        w_first, pa_first = md(w_rs, "first"), md(pa_rs, "first")
        w_req, w_head, w_bytes = stream_traffic(warp_remote)
        p_req, p_head, p_bytes = stream_traffic(pyarrow_s3)
        need = needed_bytes()

        def warp_projected():
            t = warpdata.dataset("bench/stream", mode="remote").table("main")
            return sum(b.num_rows for b in t.batches(B, columns=["id", "x"]))

        wp_req, _, wp_bytes = stream_traffic(warp_projected)
        need_p = needed_bytes({"id", "x"})
        rows += [
            ("stream 1M rows / 10 shards (remote)", f"{w_rate / 1e6:.2f} M rows/s",
             f"{pa_rate / 1e6:.2f} M rows/s (pyarrow.dataset, native S3)", w_rate / pa_rate),
            ("time to first batch (remote)", f"{w_first * 1000:.0f} ms", f"{pa_first * 1000:.0f} ms (pyarrow.dataset)",
             w_first / pa_first)]
        lines = ["", f"{'remote stream':<10}  {'M rows/s':>8}  {'first ms':>8}  {'wall ms':>7}  {'client CPU ms':>13}  "
                     f"{'moto CPU ms':>11}  {'requests':>8}  {'MB':>6}"]
        traffic = {"pyarrow": (p_req, p_head, p_bytes), "warp": (w_req, w_head, w_bytes)}
        if base:
            traffic["baseline"] = b_traffic
        for name, rs in res.items():
            q, h, by = traffic[name]
            lines.append(f"{name:<10}  {md(rs, 'rate') / 1e6:>8.2f}  {md(rs, 'first') * 1e3:>8.0f}  "
                         f"{md(rs, 'wall') * 1e3:>7.0f}  {md(rs, 'cpu') * 1e3:>13.0f}  {md(rs, 'server_cpu') * 1e3:>11.0f}  "
                         f"{f'{q} ({h} HEAD)':>8}  {by / 1e6:>6.2f}")
        stream_text = "\n".join(lines) + (
            f"\nstream, per run (warp / pyarrow rate): {', '.join(f'{x:.2f}' for x in ratios)} "
            f"(median {statistics.median(ratios):.2f}x)"
            f"\nremote stream bytes: warp {w_bytes / need:.3f}x the column chunks + footers it needs "
            f"({need / 1e6:.2f} MB), pyarrow.dataset {p_bytes / need:.3f}x\n"
            f"projected stream (id, x): warp {wp_req} requests, {wp_bytes / 1e6:.2f} MB = {wp_bytes / need_p:.3f}x "
            f"the needed {need_p / 1e6:.2f} MB (target <= 1.05x)")
        figures += [
            figure("stream 1M rows / 10 shards vs pyarrow.dataset", w_rate / pa_rate, "x", target=1.0,
                   note=f"{w_rate / 1e6:.2f} M rows/s, median of {a.runs} alternating runs"),
            figure("time to first batch / pyarrow.dataset", w_first / pa_first, "x", target=1.0, op="<=",
                   note=f"{w_first * 1000:.0f} ms"),
            figure("remote stream bytes / column chunks needed", w_bytes / need, "x", target=1.05, op="<=",
                   note=f"{w_req} requests, pyarrow.dataset {p_req}"),
            figure("projected stream bytes / column chunks needed", wp_bytes / need_p, "x", target=1.05, op="<=",
                   note=f"{wp_req} requests")]
        if base:
            b_rate = md(res["baseline"], "rate")
            rows.append(("stream, this warp vs --baseline", f"{w_rate / 1e6:.2f} M rows/s",
                         f"{b_rate / 1e6:.2f} M rows/s (baseline warp)", w_rate / b_rate))
            figures.append(figure("stream vs the --baseline warp", w_rate / b_rate, "x",
                                  note=f"baseline {b_rate / 1e6:.2f} M rows/s, pyarrow {b_rate / pa_rate:.2f}x"))

    warm_text = ""
    if "warm" in a.only:
        warpdata.dataset("bench/stream").warm()

        def warm_epochs(n):
            """Warm-cache epochs, warp and pyarrow in turns (who goes first alternates): per run the
            rate ratio and each one's CPU time (all threads), which the load of other processes on a
            shared machine disturbs far less than wall time."""
            pyarrow_local(), warp_warm(), warp_held()
            pairs = []
            for r in range(n):
                one = []
                for fn in ((warp_warm, warp_held, pyarrow_local) if r % 2 else (pyarrow_local, warp_held, warp_warm)):
                    c0 = time.process_time()
                    secs, rate = fn()
                    one.append((fn, secs, rate, time.process_time() - c0))
                by = {fn: (rate, cpu) for fn, _s, rate, cpu in one}
                held.append(by[warp_held][0] / by[pyarrow_local][0])
                t0 = time.perf_counter()
                warpdata.dataset("bench/stream").table("main")
                opens.append(time.perf_counter() - t0)
                pairs.append((by[warp_warm], by[pyarrow_local]))
            return pairs

        held_table = warpdata.dataset("bench/stream").table("main")

        def warp_held():
            """An epoch of a dataset opened before (a training loop's second epoch): no `latest` GET."""
            t0 = time.perf_counter()
            n = sum(b.num_rows for b in held_table.batches(B, prefetch="off"))
            return time.perf_counter() - t0, n / (time.perf_counter() - t0)

        held: list[float] = []
        opens: list[float] = []
        warm_pairs = warm_epochs(max(a.runs, 7))
        ww_rate = statistics.median(w[0] for w, _ in warm_pairs)
        loc_rate = statistics.median(p[0] for _, p in warm_pairs)
        warm_ratios = [w[0] / p[0] for w, p in warm_pairs]
        ww_cpu = statistics.median(w[1] for w, _ in warm_pairs)
        loc_cpu = statistics.median(p[1] for _, p in warm_pairs)
        rows.append(("warm-cache epoch", f"{ww_rate / 1e6:.2f} M rows/s",
                     f"{loc_rate / 1e6:.2f} M rows/s (pyarrow, local Parquet)", ww_rate / loc_rate))
        warm_text = (f"warm-cache epoch, per run (warp / pyarrow rate): {', '.join(f'{x:.2f}' for x in warm_ratios)} "
                     f"(median {statistics.median(warm_ratios):.2f}x); CPU per epoch, all threads: warp "
                     f"{ww_cpu * 1e3:.0f} ms, pyarrow {loc_cpu * 1e3:.0f} ms ({loc_cpu / ww_cpu:.2f}x the rate per CPU-s)" +
                     f"\nwarm-cache epoch of a dataset opened before (no `latest` GET), per-run median "
                     f"{statistics.median(held):.2f}x pyarrow; opening (one GET of `latest` to moto, manifest "
                     f"from the cache) {statistics.median(opens) * 1e3:.1f} ms")
        figures += [
            figure("warm-cache epoch vs pyarrow on local Parquet", ww_rate / loc_rate, "x", target=0.9,
                   note=f"per-run median {statistics.median(warm_ratios):.2f}x"),
            figure("warm-cache epoch rows per CPU-s vs pyarrow on local Parquet", loc_cpu / ww_cpu, "x"),
            figure("warm-cache epoch, dataset opened before, vs pyarrow on local Parquet", statistics.median(held), "x",
                   target=0.9, note="per-run median; no `latest` round trip in the epoch"),
            figure("dataset open on a warm cache (one GET of latest)", statistics.median(opens) * 1e3, "ms")]

    filter_text = ""
    if "filter" in a.only:
        server.reset()
        q = warpdata.dataset("bench/stream", mode="remote").table("main").filter("id BETWEEN 123456 AND 123999")
        got = q.select(["id", "x"]).to_arrow().num_rows
        blob_reqs = [r for r in server.requests() if "/blobs/" in r["key"]]
        fetched = range_bytes(blob_reqs)
        touched = len({r["key"] for r in blob_reqs})
        total = sum(s.byte_size for s in m.tables["main"].shards)
        rows.append(("filter: id BETWEEN 123456 AND 123999", f"{fetched / total * 100:.2f} % of bytes ({got} rows)",
                     f"{touched} of {a.shards} shards touched, {len(blob_reqs)} requests", None))
        filter_text = f"selective filter fetched {fetched / total * 100:.2f} % of the stored bytes (target <= 10 %)"
        figures.append(figure("selective filter: share of stored bytes fetched", fetched / total * 100, "%",
                              target=10, op="<="))

    if "refs" in a.only:
        ds = warpdata.dataset("bench/stream", mode="remote")
        art = ds.artifact("media")
        members = [f"img/{i:04d}.png" for i in range(min(a.refs, 400))]
        art.read(members[0])
        idx = art.index
        import s3fs

        fs3 = s3fs.S3FileSystem(**cfg.s3fs_kwargs())
        locs = []
        for mem in members:
            h, off, ln = idx.lookup(mem)
            locs.append((f"bench/warp/blobs/sha256/{h[:2]}/{h}", off, ln))

        def warp_refs():
            t0 = time.perf_counter()
            for mem in members:
                art.read(mem)
            return 0, len(members) / (time.perf_counter() - t0)

        def s3fs_refs():
            t0 = time.perf_counter()
            for p, off, ln in locs:
                fs3.cat_file(p, start=off, end=off + ln)
            return 0, len(members) / (time.perf_counter() - t0)

        _, wr = med(warp_refs)
        _, sr = med(s3fs_refs)
        rows.append(("ranged ref reads", f"{wr:.0f} reads/s", f"{sr:.0f} reads/s (s3fs.cat_file)", wr / sr))
        figures.append(figure("ranged ref reads vs s3fs.cat_file", wr / sr, "x"))

    print(f"\nrows={a.rows} shards={a.shards} runs={a.runs} (median), moto S3 on 127.0.0.1\n")
    w = max(len(r[0]) for r in rows)
    print(f"{'measure'.ljust(w)}  {'warp':<28}  {'peer':<48}  ratio")
    for name, wv, pv, ratio in rows:
        print(f"{name.ljust(w)}  {wv:<28}  {pv:<48}  {'' if ratio is None else f'{ratio:.2f}x'}")
    if "stream" in a.only:
        print(stream_text)
    for text in (warm_text, filter_text):
        if text:
            print(text)
    print(f"load average at start {' '.join(f'{x:.2f}' for x in load0)}, "
          f"at end {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    if a.only == set(SECTIONS):
        emit("read_stream", figures, load_start=load0[0])
    else:
        print("(a subset of the sections ran: bench/out/read_stream.figures.json left as it was)")


if __name__ == "__main__":
    main()
