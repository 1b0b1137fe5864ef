"""A fleet of readers on one machine: what an epoch of a published table costs N nodes, counted.

N reader processes (8 ... 64), each with its own cache directory and its own counted port in
front of the store (moto's S3 server, or a static HTTP host), read one or more epochs of a
published table through the README's API: ``dataset(...).table().batches(8192, rank=r,
world_size=N)``, ``to_torch(num_workers=K)`` or ``warp stream --shard r/N``. Each port counts the
requests and the bytes it served, and can answer 503 SlowDown above R requests a second (per
node, or for the whole store). Printed per run: bytes ÷ the columns read, requests before the
first batch, requests per sample, 503s, retries, failed nodes, exact-once, cache per node, and
epoch 2's bytes. Counts are exact; times are the machine's (printed with its load).

    .venv/bin/python bench/fleet.py --nodes 8,16,32,64 --store s3,http
    .venv/bin/python bench/fleet.py --nodes 16 --rate 1 --store s3          # throttled
    .venv/bin/python bench/fleet.py --nodes 8 --mode torch2 --epochs 2      # DataLoader workers, 2 epochs

The table is 1,000,000 rows in 8 Parquet files written with pyarrow's defaults (~110 MB),
published by ``warp publish`` (``--layout as-is`` publishes the files byte for byte, the layout
readers met before publish added page indexes). ``tests/bench/test_fleet.py`` runs it at 4
nodes and asserts the counts.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))  # tests/support: the moto and static servers

ROWS, FILES, BATCH = 1_000_000, 8, 8192
DATASET = "bench/fleet"
SLOWDOWN = (b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>SlowDown</Code>'
            b"<Message>Please reduce your request rate.</Message></Error>")


# -- the table -------------------------------------------------------------------------------
def write_table(root: Path, rows: int = ROWS, files: int = FILES) -> int:
    """``files`` Parquet files of ``rows`` rows in all, pyarrow's defaults (~110 bytes a row)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    root.mkdir(parents=True, exist_ok=True)
    per = rows // files
    for k in range(files):
        n = per if k < files - 1 else rows - per * (files - 1)
        rng = np.random.default_rng(k)
        ids = np.arange(k * per, k * per + n, dtype=np.int64)
        text = pa.array(np.char.add("caption ", rng.integers(0, 1 << 62, n).astype(str)).tolist())
        pq.write_table(pa.table({
            "id": ids, "label": pa.array([f"class-{i % 100}" for i in ids.tolist()]),
            "score": rng.random(n).astype(np.float32), "emb": pa.FixedSizeListArray.from_arrays(
                pa.array(rng.standard_normal(n * 40).astype(np.float16)), 40),
            "text": text}), root / f"part-{k}.parquet")
    return sum(p.stat().st_size for p in root.glob("*.parquet"))


def column_bytes(store_url: str, env: dict, columns: list[str] | None) -> int:
    """Bytes of the published column chunks of ``columns`` (None: all): what one reading of the
    table must move at least."""
    code = f"""
import json, pyarrow as pa, pyarrow.parquet as pq, warpdata
ds = warpdata.dataset({DATASET!r}, store={store_url!r}, mode="remote")
cols = {columns!r}
total = 0
for s in ds.table().shards:
    md = pq.read_metadata(pa.BufferReader(ds.remote.read_range(ds.blob_key(s), 0, s.byte_size)))
    for g in range(md.num_row_groups):
        rg = md.row_group(g)
        total += sum(rg.column(c).total_compressed_size for c in range(rg.num_columns)
                     if cols is None or rg.column(c).path_in_schema.split(".")[0] in cols)
print(total)
"""
    return int(subprocess.run([sys.executable, "-c", code], env=env, check=True, capture_output=True,
                              text=True).stdout)


def version_of(store_url: str, env: dict) -> str:
    """The full version hash ``latest`` names (what a launcher reads once and pins)."""
    warp = str(Path(sys.executable).with_name("warp"))
    out = subprocess.run([warp, "info", DATASET, "--json"], env={**env, "WARP_STORE": store_url}, check=True,
                         capture_output=True, text=True).stdout
    return json.loads(out)["version"]


# -- counted ports -------------------------------------------------------------------------------
class Limiter:
    """At most ``rate`` requests in any second (a sliding window); shared by ports for a store-wide limit."""

    def __init__(self, rate: float) -> None:
        self.rate, self.times, self.mu = rate, [], threading.Lock()

    def allow(self) -> bool:
        if not self.rate:
            return True
        now = time.monotonic()
        with self.mu:
            self.times = [t for t in self.times if now - t < 1.0]
            if len(self.times) >= self.rate:
                return False
            self.times.append(now)
            return True


class CountedPort:
    """A port in front of ``upstream`` that forwards every request and logs (time, method, path,
    range, status, body bytes); 503 SlowDown when ``limiter`` refuses."""

    def __init__(self, upstream: str, limiter: Limiter) -> None:
        u = urllib.parse.urlsplit(upstream)
        self.log: list[tuple[float, str, str, str | None, int, int]] = []
        mu = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a) -> None:
                pass

            def _forward(self) -> None:
                import http.client

                n = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(n) if n else None
                t = time.time()
                if not limiter.allow():
                    status, data, headers = 503, SLOWDOWN, [("Content-Type", "application/xml")]
                else:
                    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=120)
                    try:
                        conn.request(self.command, self.path, body=body,
                                     headers={k: v for k, v in self.headers.items() if k.lower() != "connection"})
                        r = conn.getresponse()
                        status, data = r.status, r.read()
                        headers = [(k, v) for k, v in r.getheaders()
                                   if k.lower() not in ("connection", "transfer-encoding", "content-length")]
                        if self.command == "HEAD":
                            headers.append(("Content-Length", r.getheader("Content-Length", "0")))
                    finally:
                        conn.close()
                with mu:
                    outer.log.append((t, self.command, self.path, self.headers.get("Range"), status,
                                      len(data) if self.command == "GET" else 0))
                self.send_response(status)
                for k, v in headers:
                    self.send_header(k, v)
                if self.command != "HEAD":
                    self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if self.command != "HEAD" and data:
                    self.wfile.write(data)

            do_GET = do_HEAD = do_PUT = do_POST = do_DELETE = _forward

        class Server(ThreadingHTTPServer):
            def handle_error(self, request, client_address) -> None:  # a reader that hung up: not news
                if not isinstance(sys.exc_info()[1], ConnectionError):
                    super().handle_error(request, client_address)

        self.server = Server(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


# -- a node -------------------------------------------------------------------------------------------
def node(args: argparse.Namespace) -> None:
    """One reader: its rank's share of every epoch; ids to ``out``, facts as one JSON line."""
    import numpy as np
    import warpdata

    out = Path(args.out)
    cols = args.columns.split(",") if args.columns else None
    facts: dict = {"rank": args.rank, "epochs": [], "first_batch": None}
    ds = warpdata.dataset(DATASET)
    table = ds.table()
    for epoch in range(args.epochs):
        start = time.time()
        ids: list = []
        if args.mode == "batches":
            it = table.batches(BATCH, columns=cols, rank=args.rank, world_size=args.world, epoch=epoch,
                               shuffle=args.shuffle)
            for b in it:
                facts["first_batch"] = facts["first_batch"] or time.time()
                ids.append(b.column("id").to_numpy())
        elif args.mode.startswith("torch"):
            loader = table.to_torch(BATCH, columns=cols, num_workers=int(args.mode[5:]), rank=args.rank,
                                    world_size=args.world, epoch=epoch, shuffle=args.shuffle)
            for b in loader:
                facts["first_batch"] = facts["first_batch"] or time.time()
                ids.append(np.asarray(b["id"]))
        else:  # warp stream --shard r/N
            cmd = [str(Path(sys.executable).with_name("warp")), "stream", DATASET, "--shard",
                   f"{args.rank}/{args.world}", "--columns", args.columns or "id", "--format", "csv"]
            p = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
            header = p.stdout.readline()
            assert header.strip().strip('"') == "id", header
            got = []
            for line in p.stdout:
                facts["first_batch"] = facts["first_batch"] or time.time()
                got.append(int(line))
            if p.wait():
                raise SystemExit(p.returncode)
            ids.append(np.asarray(got, np.int64))
        arr = np.concatenate(ids) if ids else np.zeros(0, np.int64)
        np.save(out / f"ids-{args.rank}-{epoch}.npy", arr)
        facts["epochs"].append({"start": start, "end": time.time(), "rows": int(len(arr))})
    stats = getattr(getattr(ds, "remote", None), "stats", None)
    facts["retries"] = getattr(stats, "retries", 0)
    print(json.dumps(facts), flush=True)


# -- a run --------------------------------------------------------------------------------------------
def run_fleet(nodes: int, upstream: str, store_url: str, base_env: dict, work: Path, *, mode: str = "batches",
              epochs: int = 1, rate: float = 0, rate_scope: str = "node", columns: str = "", shuffle: bool = False,
              rows: int = ROWS, pin: str | None = None) -> dict:
    """One fleet run: ``nodes`` processes through their own counted ports; the counts."""
    import numpy as np

    shared = Limiter(rate) if rate_scope == "store" else None
    ports = [CountedPort(upstream, shared or Limiter(rate)) for _ in range(nodes)]
    run = Path(tempfile.mkdtemp(dir=work, prefix=f"fleet-{nodes}-"))
    procs = []
    for r in range(nodes):
        env = dict(base_env)
        cache = run / f"cache-{r}"
        env["WARP_CACHE_DIR"] = str(cache)
        if pin:  # what a launcher sets once for the job: no rank reads the `latest` pointer
            env["WARP_PIN"] = f"{DATASET}@{pin}"
        if store_url.startswith("s3://"):
            env.update({"AWS_ENDPOINT_URL": ports[r].url, "WARP_S3_ENDPOINT": ports[r].url, "WARP_STORE": store_url})
        else:
            env["WARP_STORE"] = ports[r].url
        cmd = [sys.executable, __file__, "node", "--rank", str(r), "--world", str(nodes), "--mode", mode,
               "--epochs", str(epochs), "--out", str(run), "--columns", columns] + (["--shuffle"] if shuffle else [])
        procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    facts, failed, errors = [], 0, []
    for p in procs:
        out, err = p.communicate()
        if p.returncode:
            failed += 1
            errors.append(err.strip().splitlines()[-1] if err.strip() else f"exit {p.returncode}")
        else:
            facts.append(json.loads(out.strip().splitlines()[-1]))
    for port in ports:
        port.stop()
    if os.environ.get("FLEET_DUMP"):  # every request of rank 0, to see where bytes go
        for r, port in enumerate(ports):
            for x in port.log:
                print("  ", r, f"{x[0] % 1000:.3f}", x[1], x[2].split("?")[0][-30:], *x[3:], file=sys.stderr)
    res: dict = {"nodes": nodes, "mode": mode, "failed": failed, "errors": errors[:3]}
    per_epoch = []
    for e in range(epochs):
        got = [np.load(f) for f in sorted(run.glob(f"ids-*-{e}.npy"))]
        ids = np.concatenate(got) if got else np.zeros(0, np.int64)
        uniq = np.unique(ids)
        per_epoch.append({"rows": int(len(ids)), "duplicates": int(len(ids) - len(uniq)),
                          "missing": int(rows - len(uniq))})
    res["exact_once"] = all(x["duplicates"] == 0 and x["missing"] == 0 for x in per_epoch) and not failed
    res["per_epoch"] = per_epoch
    by_rank = {f["rank"]: f for f in facts}
    logs = [p.log for p in ports]
    res["bytes"] = sum(x[5] for log in logs for x in log if x[4] < 300)
    res["requests"] = sum(len(log) for log in logs)
    res["throttled"] = sum(1 for log in logs for x in log if x[4] == 503)
    res["retries"] = sum(f.get("retries", 0) for f in facts)
    before = [sum(1 for x in logs[r] if x[0] < by_rank[r]["first_batch"]) for r in by_rank
              if by_rank[r]["first_batch"]]
    meta_before = [sum(1 for x in logs[r] if x[0] < by_rank[r]["first_batch"] and "/blobs/" not in x[2])
                   for r in by_rank if by_rank[r]["first_batch"]]
    res["requests_before_first_batch"] = max(before) if before else None
    res["metadata_requests_before_first_batch"] = max(meta_before) if meta_before else None
    if epochs > 1:
        res["epoch_bytes"] = [sum(x[5] for r in by_rank for x in logs[r]
                                  if x[4] < 300 and by_rank[r]["epochs"][e]["start"] <= x[0]
                                  and (e + 1 == epochs or x[0] < by_rank[r]["epochs"][e + 1]["start"]))
                              for e in range(epochs)]
    res["cache_bytes_per_node"] = max((sum(f.stat().st_size for f in (run / f"cache-{r}").rglob("*") if f.is_file())
                                       for r in range(nodes)), default=0)
    res["samples"] = sum(x["rows"] for x in per_epoch)
    res["requests_per_sample"] = res["requests"] / max(1, res["samples"])
    shutil.rmtree(run, ignore_errors=True)
    return res


def setup(work: Path, stores: list[str], layout: str, rows: int = ROWS, files: int = FILES) -> dict:
    """Write the table, publish it to each store; ``{store: (upstream, store_url, env)}`` and facts."""
    from support.httpserve import StaticServer
    from support.s3fixtures import s3_env, start_moto_server

    data = work / "data"
    raw = write_table(data, rows, files)
    base = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "WARP_"))}
    base["WARP_CACHE_DIR"] = str(work / "publisher-cache")
    out: dict = {"raw_bytes": raw, "stores": {}, "servers": []}
    keep = ["--keep-layout"] if layout == "as-is" else []
    warp = str(Path(sys.executable).with_name("warp"))
    if "s3" in stores:
        moto = start_moto_server()
        out["servers"].append(moto)
        import boto3

        env = {**base, **s3_env(moto.endpoint)}
        boto3.client("s3", endpoint_url=moto.endpoint, region_name="us-east-1", aws_access_key_id="testing",
                     aws_secret_access_key="testing").create_bucket(Bucket="fleet")
        url = "s3://fleet/warp"
        subprocess.run([warp, "publish", DATASET, "--table", f"main={data}/*.parquet", "--store", url, *keep, "-q"],
                       env=env, check=True, stdout=subprocess.DEVNULL)
        out["stores"]["s3"] = (moto.endpoint, url, env)
    if "http" in stores:
        local = work / "store"
        subprocess.run([warp, "publish", DATASET, "--table", f"main={data}/*.parquet", "--store", str(local),
                        *keep, "-q"], env=base, check=True, stdout=subprocess.DEVNULL)
        srv = StaticServer(local)
        out["servers"].append(srv)
        out["stores"]["http"] = (srv.url, srv.url, base)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd")
    n = sub.add_parser("node")
    n.add_argument("--rank", type=int, required=True)
    n.add_argument("--world", type=int, required=True)
    n.add_argument("--mode", default="batches")
    n.add_argument("--epochs", type=int, default=1)
    n.add_argument("--out", required=True)
    n.add_argument("--columns", default="")
    n.add_argument("--shuffle", action="store_true")
    ap.add_argument("--nodes", default="8,16,32,64")
    ap.add_argument("--store", default="s3,http")
    ap.add_argument("--mode", default="batches", help="batches, torch0, torch2, stream (comma-separated)")
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--rate", type=float, default=0, help="503 SlowDown above this many requests a second")
    ap.add_argument("--rate-scope", default="node", choices=["node", "store"])
    ap.add_argument("--columns", default="")
    ap.add_argument("--shuffle", action="store_true")
    ap.add_argument("--layout", default="paged", choices=["paged", "as-is"])
    ap.add_argument("--rows", type=int, default=ROWS)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--pin", action="store_true", help="set WARP_PIN on every node, as a launcher would")
    args = ap.parse_args()
    if args.cmd == "node":
        node(args)
        return
    work = Path(tempfile.mkdtemp(prefix="warp-fleet-"))
    ctx = setup(work, args.store.split(","), args.layout, args.rows)
    try:
        print(f"# load {os.getloadavg()[0]:.2f}, {os.cpu_count()} cores; table {args.rows:,} rows in {FILES} files, "
              f"{ctx['raw_bytes'] / 1e6:.1f} MB as written; layout {args.layout}", file=sys.stderr)
        rows = []
        for store, (upstream, url, env) in ctx["stores"].items():
            for mode in args.mode.split(","):
                cols = args.columns or ("id" if mode == "stream" else "")  # warp stream prints ids as CSV
                want = column_bytes(url if store == "s3" else upstream, env if store == "s3" else
                                    {**env, "WARP_STORE": upstream}, cols.split(",") if cols else None)
                pin = version_of(url if store == "s3" else upstream, env) if args.pin else None
                for nodes in [int(x) for x in args.nodes.split(",")]:
                    r = run_fleet(nodes, upstream, url, env, work, mode=mode, epochs=args.epochs, rate=args.rate,
                                  rate_scope=args.rate_scope, columns=cols, shuffle=args.shuffle,
                                  rows=args.rows, pin=pin)
                    r.update(store=store, columns_bytes=want, bytes_ratio=r["bytes"] / (want * args.epochs))
                    if "epoch_bytes" in r:
                        r["epoch_ratios"] = [b / want for b in r["epoch_bytes"]]
                    rows.append(r)
                    if args.json:
                        print(json.dumps(r), flush=True)
                    else:
                        print(f"{store:4} {mode:7} N={nodes:3}  bytes/columns {r['bytes_ratio']:.3f}"
                              + (f" (epochs {', '.join(f'{x:.3f}' for x in r['epoch_ratios'])})"
                                 if "epoch_ratios" in r else "")
                              + f"  before 1st batch {r['requests_before_first_batch']} "
                              f"(metadata {r['metadata_requests_before_first_batch']})"
                              f"  req/sample {r['requests_per_sample']:.5f}  503s {r['throttled']}"
                              f"  retries {r['retries']}  failed {r['failed']}  exact-once {r['exact_once']}"
                              f"  cache/node {r['cache_bytes_per_node'] / 1e6:.1f} MB"
                              + (f"  errors {r['errors']}" if r["errors"] else ""), flush=True)
    finally:
        for s in ctx["servers"]:
            s.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
