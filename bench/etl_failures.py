"""The ETL driver's failure table (issue 23's closing note): ``warp etl`` run as a user runs it.

Every case is a fresh ``python -m warpdata etl --config ...`` subprocess on a small generated
COCO-style dataset (``warp.sampledata.detection``), against real ``dask scheduler`` /
``dask worker`` processes (each worker a simulated node: its own cache directory and a fresh
machine's environment, tests/support/clusters.py) and moto's S3 server on 127.0.0.1 with its
request log (tests/support/s3fixtures.py). One row per case: exit code, wall seconds of the
command, the first line of its stderr, whether a Python traceback appeared and how many stderr
lines there were. What each case expects is in docs/ and issue 23's list; the script reports what
happens, it does not judge.

    python bench/etl_failures.py [--cases 1,2,...] [--json]

Cases: 1 worker without S3 settings; 2 a port where nothing listens; 3 a port that is not a
scheduler; 4 an unresolvable host; 5 a scheduler without workers (``WARP_CLUSTER_WAIT=5``);
6 the scheduler killed mid-run; 7 the GETs of an up-to-date rerun from an S3 source, per image;
8 a damaged receipt in an S3 build; 9 a tiles-to-S3 rerun; 10 ``kill -9`` of a ``-x process``
driver: seconds until none of its children is left. About 2 minutes on 2 cores.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from support.clusters import dask_processes  # noqa: E402
from support.processes import kill_when, spawn_etl  # noqa: E402
from support.s3fixtures import s3_env, start_moto_server  # noqa: E402
from support.warehouses import coco_config  # noqa: E402

# a hang ends here instead of never (and is reported as exit "timeout")
GUARD_S = 120
# a machine with nothing configured: no AWS files, no instance metadata service
BARE = {"AWS_EC2_METADATA_DISABLED": "true", "AWS_CONFIG_FILE": os.devnull, "AWS_SHARED_CREDENTIALS_FILE": os.devnull}


@dataclass
class Row:
    case: str
    exit: int | str
    seconds: float
    first_line: str
    traceback: bool
    stderr_lines: int
    note: str = ""


def _row(case: str, rc: int | str, seconds: float, err: str, note: str = "") -> Row:
    lines = [ln.strip() for ln in err.splitlines() if ln.strip()]
    errors = [ln for ln in lines[1:] if ln.startswith("error")]
    if errors:  # the first line is a warning or the cluster line: say warp's error line too
        note = "; ".join(filter(None, [f"error line: {errors[0]}", note]))
    return Row(case, rc, round(seconds, 2), lines[0] if lines else "", "Traceback" in err, len(lines), note)


def _etl(cfg: Path, *args: str, env: dict[str, str] | None = None) -> tuple[int | str, float, str, str]:
    t0 = time.perf_counter()
    try:
        r = subprocess.run([sys.executable, "-m", "warpdata", "etl", "--config", str(cfg), *args],
                           capture_output=True, text=True, timeout=GUARD_S, env={**os.environ, **(env or {})})
        return r.returncode, time.perf_counter() - t0, r.stdout, r.stderr
    except subprocess.TimeoutExpired as e:
        err = e.stderr.decode(errors="replace") if isinstance(e.stderr, bytes) else (e.stderr or "")
        return "timeout", time.perf_counter() - t0, "", err


class S3:
    """One bucket on the moto server, its client and the environment a process needs to reach it."""

    def __init__(self, server) -> None:
        import boto3

        self.server = server
        self.env = s3_env(server.endpoint)
        self.bucket = f"warp-bench-{uuid.uuid4().hex[:12]}"
        self.client = boto3.client("s3", endpoint_url=server.endpoint, region_name="us-east-1",
                                   aws_access_key_id="testing", aws_secret_access_key="testing")
        self.client.create_bucket(Bucket=self.bucket)

    def url(self, prefix: str) -> str:
        return f"s3://{self.bucket}/{prefix}"

    def count(self, method: str, key_prefix: str) -> int:
        return sum(1 for r in self.server.requests() if r["bucket"] == self.bucket
                   and r["method"] == method and r["key"].startswith(key_prefix))

    def upload(self, d: Path, prefix: str) -> int:
        n = 0
        for p in sorted(d.rglob("*")):
            rel = p.relative_to(d).as_posix()
            if p.is_file() and (rel == "annotations.json" or rel.startswith("images/")):
                self.client.put_object(Bucket=self.bucket, Key=f"{prefix}/{rel}", Body=p.read_bytes())
                n += rel.startswith("images/")
        return n


def _session(sid: int) -> list[int]:
    """Live processes of session ``sid`` (a driver started with ``start_new_session``)."""
    out = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[3]) == sid and fields[0] != "Z":
            out.append(int(pid))
    return out


# -- the cases ---------------------------------------------------------------

def case_worker_without_s3(ctx) -> Row:
    cfg = coco_config(ctx.data, ctx.tmp / "c1-unused", name="c1.toml")
    with dask_processes(ctx.tmp / "c1-cluster") as cl:
        cl.add_worker(BARE, name="node-bare")  # started as on another machine: no S3 settings at all
        cl.wait_for_workers(1)
        rc, s, _, err = _etl(cfg, "--input", ctx.s3.url("src"), "--output", ctx.s3.url("c1-wh"),
                             "--executor", f"dask://{cl.address}", env=ctx.driver_env)
    return _row("1 worker without S3 settings (S3 source and output)", rc, s, err)


def case_nothing_listens(ctx) -> Row:
    with socket.socket() as srv:
        srv.bind(("127.0.0.1", 0))
        port = srv.getsockname()[1]
    rc, s, _, err = _etl(coco_config(ctx.data, ctx.tmp / "c2-wh", name="c2.toml"),
                         "--executor", f"dask://127.0.0.1:{port}")
    return _row("2 dask://127.0.0.1:<closed port>", rc, s, err)


def case_not_a_scheduler(ctx) -> Row:
    with socket.socket() as srv:  # accepts connections and never answers
        srv.bind(("127.0.0.1", 0))
        srv.listen(8)
        port = srv.getsockname()[1]
        held: list = []
        threading.Thread(target=lambda: held.extend(srv.accept() for _ in range(8)), daemon=True).start()
        rc, s, _, err = _etl(coco_config(ctx.data, ctx.tmp / "c3-wh", name="c3.toml"),
                             "--executor", f"dask://127.0.0.1:{port}")
        for c, _ in held:
            c.close()
    row = _row("3 dask://<silent TCP listener>", rc, s, err)
    port = ctx.s3.server.port  # and an HTTP server (moto) in place of a scheduler
    rc, s, _, err = _etl(coco_config(ctx.data, ctx.tmp / "c3b-wh", name="c3b.toml"),
                         "--executor", f"dask://127.0.0.1:{port}")
    return [row, _row("3b dask://<moto's HTTP port>", rc, s, err)]


def case_no_such_host(ctx) -> Row:
    rc, s, _, err = _etl(coco_config(ctx.data, ctx.tmp / "c4-wh", name="c4.toml"),
                         "--executor", "dask://no-such-host.invalid:8786")
    return _row("4 dask://no-such-host.invalid:8786", rc, s, err)


def case_no_workers(ctx) -> Row:
    with dask_processes(ctx.tmp / "c5-cluster") as cl:
        rc, s, _, err = _etl(coco_config(ctx.data, ctx.tmp / "c5-wh", name="c5.toml"),
                             "--executor", f"dask://{cl.address}", env={"WARP_CLUSTER_WAIT": "5"})
    return _row("5 scheduler, no workers, WARP_CLUSTER_WAIT=5", rc, s, err)


def case_scheduler_killed(ctx) -> Row:
    out = ctx.tmp / "c6-wh"
    with dask_processes(ctx.tmp / "c6-cluster", workers=1) as cl:
        t0 = time.perf_counter()
        proc = spawn_etl(coco_config(ctx.data, out, name="c6.toml"), "--executor", f"dask://{cl.address}", "-j", "1")
        try:
            kill_when(cl.scheduler, lambda: bool(list(out.glob(".warp-tmp-build-*/receipts/shard-*.json"))),
                      timeout=GUARD_S)
            killed = time.perf_counter()
            try:
                _, err = proc.communicate(timeout=GUARD_S)
                rc: int | str = proc.returncode
            except subprocess.TimeoutExpired:
                proc.kill()
                _, err = proc.communicate()
                rc = "timeout"
        finally:
            if proc.poll() is None:
                proc.kill()
        end = time.perf_counter()
    return _row("6 scheduler killed after the first receipt", rc, end - t0, err.decode(errors="replace"),
                f"exit {end - killed:.2f} s after the kill")


def case_noop_rerun_gets(ctx) -> Row:
    cfg = coco_config(ctx.data, ctx.tmp / "c7-unused", name="c7.toml")
    args = ("--input", ctx.s3.url("src"), "--output", ctx.s3.url("c7-wh"), "--json", "-j", "2")
    rc, s, out, err = _etl(cfg, *args, env=ctx.driver_env)
    if rc != 0:
        return _row("7 up-to-date rerun, S3 source: first build failed", rc, s, err)
    ctx.first_s3_build = json.loads(out)
    ctx.s3.server.reset()
    rc, s, out, err = _etl(cfg, *args, env=ctx.driver_env)
    gets = ctx.s3.count("GET", "src/images/")
    status = json.loads(out).get("status", "?") if rc == 0 else "?"
    return _row("7 up-to-date rerun, S3 source and output", rc, s, err,
                f"status {status}; image GETs {gets} / images {ctx.images} = {gets / ctx.images:.3f}; "
                f"HEADs {ctx.s3.count('HEAD', 'src/images/')}")


def case_damaged_receipt(ctx) -> Row:
    first = getattr(ctx, "first_s3_build", None)
    cfg = coco_config(ctx.data, ctx.tmp / "c7-unused", name="c7.toml")
    args = ("--input", ctx.s3.url("src"), "--output", ctx.s3.url("c7-wh"), "--json", "-j", "2")
    if first is None:
        rc, s, out, err = _etl(cfg, *args, env=ctx.driver_env)
        if rc != 0:
            return _row("8 damaged receipt, S3 build: first build failed", rc, s, err)
        first = json.loads(out)
    vdir = first["path"].rsplit("/", 1)[-1]
    # a killed run's state: the version's manifest gone, a receipt cut short in the build's journal
    ctx.s3.client.delete_object(Bucket=ctx.s3.bucket, Key=f"c7-wh/{vdir}/manifest.json")
    journal = f"c7-wh/.warp-tmp-build-{first['version'][:12]}/receipts"
    ctx.s3.client.put_object(Bucket=ctx.s3.bucket, Key=f"{journal}/shard-00001.json",
                             Body=b'{"receipt": 1, "shard_id": "shard-000')
    rc, s, out, err = _etl(cfg, *args, env=ctx.driver_env)
    note = ""
    if rc == 0:
        j = json.loads(out)
        note = (f"status {j.get('status')}; shards built {j.get('shards_built')}, reused {j.get('shards_reused')}; "
                f"receipts dropped {j.get('receipts', {}).get('dropped')}; same version: {j['version'] == first['version']}")
    return _row("8 damaged receipt in an S3 build", rc, s, err, note)


def case_tiles_s3_rerun(ctx) -> Row:
    from warpdata.sampledata.volume import generate

    d = ctx.tmp / "c9"
    d.mkdir()
    generate(d, count=8, seed=2)
    args = ("--output", ctx.s3.url("c9.zarr"), "--json")
    rc, s, _, err = _etl(d / "volume.toml", *args, env=ctx.driver_env)
    if rc != 0:
        return _row("9 tiles to S3: first run failed", rc, s, err)
    rc, s, out, err = _etl(d / "volume.toml", *args, env=ctx.driver_env)
    status = json.loads(out).get("status", "?") if rc == 0 else "?"
    return _row("9 tiles to S3, same command again", rc, s, err, f"status {status}")


def case_kill_process_driver(ctx) -> Row:
    if not os.path.isdir("/proc"):
        return Row("10 kill -9 of a -x process driver", "skipped", 0.0, "needs /proc (Linux)", False, 0)
    out = ctx.tmp / "c10-wh"
    proc = spawn_etl(coco_config(ctx.data, out, name="c10.toml"), "-x", "process", "-j", "2")
    try:
        deadline = time.monotonic() + GUARD_S
        while not list(out.glob(".warp-tmp-build-*/receipts/shard-*.json")) and proc.poll() is None \
                and time.monotonic() < deadline:
            time.sleep(0.01)
        if proc.poll() is not None:
            return Row("10 kill -9 of a -x process driver", "skipped", 0.0,
                       "the build finished before the driver could be killed", False, 0)
        children = len(_session(proc.pid)) - 1
        os.kill(proc.pid, signal.SIGKILL)  # the driver only, as the OOM killer would
        t0 = time.perf_counter()
        proc.communicate(timeout=60)
        deadline = time.monotonic() + 60
        while _session(proc.pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        gone = round(time.perf_counter() - t0, 2)  # one value for the row and its note (0.049 printed 0.0, 0.05)
        left = len(_session(proc.pid))
    finally:
        if _session(proc.pid):
            os.killpg(proc.pid, signal.SIGKILL)
    return Row("10 kill -9 of a -x process driver", -9, gone, "(killed: seconds until no child is left)",
               False, 0, f"{children} children at the kill, {left} left after {gone:.1f} s")


CASES = {1: case_worker_without_s3, 2: case_nothing_listens, 3: case_not_a_scheduler, 4: case_no_such_host,
         5: case_no_workers, 6: case_scheduler_killed, 7: case_noop_rerun_gets, 8: case_damaged_receipt,
         9: case_tiles_s3_rerun, 10: case_kill_process_driver}
NEEDS_S3 = {1, 3, 7, 8, 9}


def _table(rows: list[Row]) -> str:
    head = "| case | exit | s | first stderr line | traceback | stderr lines | note |\n|---|---|---|---|---|---|---|\n"
    return head + "".join(
        f"| {r.case} | {r.exit} | {r.seconds:.2f} | {r.first_line.replace('|', '/')} | "
        f"{'yes' if r.traceback else 'no'} | {r.stderr_lines} | {r.note.replace('|', '/')} |\n" for r in rows)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", default=",".join(map(str, CASES)), help="comma-separated case numbers (1-10)")
    ap.add_argument("--images", type=int, default=60, help="images in the generated COCO dataset")
    ap.add_argument("--json", action="store_true", help="print the rows as JSON instead of a table")
    a = ap.parse_args(argv)
    want = [int(c) for c in a.cases.split(",") if c.strip()]
    unknown = [c for c in want if c not in CASES]
    if unknown:
        ap.error(f"--cases: no case {unknown}; the cases are 1-10")

    from warpdata.sampledata.detection import generate

    load0 = os.getloadavg()[0]
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="warp-etl-failures-") as tmpd:
        ctx = argparse.Namespace(tmp=Path(tmpd), data=Path(tmpd) / "coco", s3=None)
        generate(ctx.data, count=a.images, seed=5, min_side=64, max_side=150)
        server = start_moto_server() if NEEDS_S3 & set(want) else None
        try:
            if server is not None:
                ctx.s3 = S3(server)
                ctx.images = ctx.s3.upload(ctx.data, "src")
                ctx.driver_env = {**ctx.s3.env, "WARP_CACHE_DIR": str(ctx.tmp / "driver-cache")}
            rows: list[Row] = []
            for c in want:
                got = CASES[c](ctx)
                rows.extend(got if isinstance(got, list) else [got])
                print(f"case {c} done ({time.perf_counter() - t0:.0f} s)", file=sys.stderr, flush=True)
        finally:
            if server is not None:
                server.stop()
    total = time.perf_counter() - t0
    load1 = os.getloadavg()[0]
    if a.json:
        print(json.dumps({"rows": [asdict(r) for r in rows], "images": a.images, "total_s": round(total, 1),
                          "load_1m": [round(load0, 2), round(load1, 2)], "cpus": os.cpu_count()}, indent=2))
    else:
        print(_table(rows), end="")
        print(f"\n{a.images} images; {total:.0f} s in all; load average (1 min) {load0:.2f} at start, "
              f"{load1:.2f} at end; {os.cpu_count()} CPUs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
