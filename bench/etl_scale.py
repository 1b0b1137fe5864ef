"""Scale-out of ``warp etl`` (tensor warehouse): Dask overhead, object-store output, 1 → 2 workers.

The corpus is ``warp.sampledata.detection`` (COCO labels + JPEGs, 160-480 px),
transformed to 320×320 u8. Every run is a fresh ``warp etl --clear --json``
subprocess; configurations are interleaved round by round and the medians of
``--runs`` rounds are printed, with the load average (the machine may be shared).

* ``local-N``  — the default executor (threads), N workers;
* ``dask-N``   — ``--executor dask``: a LocalCluster of N single-threaded worker
                 processes started by the run (its start-up is included);
* ``s3out-N``  — local executor, ``--output s3://…`` on a moto server on
                 127.0.0.1 (staged build + create-only upload, manifest last);
* ``s3src-N``  — local executor, the corpus (labels and JPEGs) read from the
                 same moto server (``[source] path = "s3://…"``), output local.

Moto is a Python server on the same two cores, so every GET costs CPU here that
real S3 spends elsewhere. The run measures that cost (a plain boto3 GET loop
over the same objects, client and server CPU) and from it the rate an S3-source
ETL could reach at best on this machine: the lower of (local time per image plus
the GETs' CPU spread over the cores) and (moto serving the GETs one at a time,
its threads sharing one GIL, beside the rest of the run). ``s3src`` is reported
against local and against that ceiling.

Rates are samples / wall second of the whole command (scan, build, finalize,
upload), plus the build phase's own rate. From dask-1 and dask-2 walls the
script fits T(n) = s + p/n (s: serial driver part, p: parallel work) and
prints what 64 workers would give.

    python bench/etl_scale.py [--n 2000] [--runs 3] [--json]

``--breakdown`` runs one job (``--n`` photos, ``--size`` px) on ``local``, ``process`` and
``dask`` (a LocalCluster), 2 workers each, ``--runs`` rounds alternated, and prints where the
CPU goes: the driver process by thread (``main``; Dask's ``IO loop`` threads, which carry a
LocalCluster's scheduler, its nannies and the client), each worker process, the fork server
and resource tracker; the bytes of task inputs and results (pickled, as a pool or a cluster
moves them), and tasks per second. The driver runs under ``bench/_etl_probe.py`` (thread
names, byte counts). Choose ``--n`` for the job length: about 550 photos per second at 320 px
on this machine, so ``--n 6000`` is ~11 s and ``--n 18000`` ~33 s:

    python bench/etl_scale.py --breakdown --n 18000 --runs 5

``--scaling``: the same breakdown for ``local-2``, ``process-2``, ``dask-2`` and ``dask-1``, plus
the dask-2 / dask-1 ratio of the whole command and of the build phase (the median of the
back-to-back pairs' ratios). ``--kinds`` picks other executors (``dask-2-processes``,
``dask-2-threads``, ``dask-2-one-process``: an own LocalCluster's layouts, warp/etl/daskrunner.py);
``--cold`` drops the corpus from the page cache before every run, so every header pass reads
from the disk alike. For a dask-1 job of at least 60 s (issue 23's scaling target) take 30,000
photos here (dask-1 ran 18,000 in 41.8 s, quiet); a round of the four is about 4 minutes:

    python bench/etl_scale.py --scaling --cold --n 30000 --runs 5

``--per-task``: the driver process's CPU per task of an own LocalCluster of 2 workers (client,
scheduler and nannies), ``--n`` shard-sized tasks that do nothing, and the Dask tasks that
carried them.

``--idle``: the CPU an own LocalCluster of 2 workers spends doing nothing for 8 s, with
distributed's shipped settings and with those warp starts it with.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import shutil
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "bench" / "out"


def corpus(n: int, copies: int = 1) -> Path:
    """``n`` photos; with ``copies`` > 1, ``n // copies`` generated ones, each file copied (not
    linked: every copy is its own read from the disk) under ``copies`` names, with its labels
    (generating 30,000 distinct photos takes ~30 min on two loaded cores)."""
    from warpdata.sampledata.detection import generate

    if copies > 1:
        return _copied(corpus(n // copies), n // copies, copies)
    d = OUT / f"etl-scale-corpus-{n}"
    if not (d / "annotations.json").is_file():
        shutil.rmtree(d, ignore_errors=True)
        generate(d, count=n, seed=11)
    return d


def _copied(base: Path, n: int, copies: int) -> Path:
    d = OUT / f"etl-scale-corpus-{n}x{copies}"
    if (d / "annotations.json").is_file():
        return d
    shutil.rmtree(d, ignore_errors=True)
    (d / "images").mkdir(parents=True)
    doc = json.loads((base / "annotations.json").read_text())
    images, anns = [], []
    for k in range(copies):
        for im in doc["images"]:
            name = f"c{k:02d}_{im['file_name']}"
            src = base / "images" / im["file_name"]
            if src.is_file():
                shutil.copyfile(src, d / "images" / name)
            images.append({**im, "file_name": name, "id": im["id"] + k * 10**7})
        anns += [{**a, "id": a["id"] + k * 10**7, "image_id": a["image_id"] + k * 10**7} for a in doc["annotations"]]
    (d / "annotations.json").write_text(json.dumps({**doc, "images": images, "annotations": anns}))
    return d


def config(d: Path, out: str, source: str = ".", name: str = "scale.toml", size: int = 320,
           shard_samples: int = 64) -> Path:
    p = d / name
    p.write_text(f"""
[source]
format = "coco"
path = "{source}"

[transform]
target_size = {size}
max_boxes = 32

[validation]
max_invalid_fraction = {{ warn = 0.0, fail = 0.5 }}
max_missing_fraction = {{ warn = 0.0, fail = 0.5 }}

[output]
root = "{out}"
shard_samples = {shard_samples}

[build]
durable = false
overlap = true
""")
    return p


def run(cfg: Path, args: list[str], env: dict[str, str]) -> dict:
    t, c0 = time.perf_counter(), _children_cpu()
    r = subprocess.run([sys.executable, "-m", "warpdata", "etl", "--config", str(cfg), "--json", "--clear", *args],
                       capture_output=True, text=True, env=env)
    wall, cpu_s = time.perf_counter() - t, _children_cpu() - c0
    if r.returncode != 0:
        raise SystemExit(f"warp etl {' '.join(args)} failed ({r.returncode}):\n{r.stderr[-2000:]}")
    doc = json.loads(r.stdout)
    phases = {}
    mpath = Path(str(doc.get("path", ""))) / "metrics.json"
    if mpath.is_file():
        phases = json.loads(mpath.read_text()).get("phases_s", {})
    return {**{f"{k}_s": float(phases.get(k, 0.0)) for k in ("labels", "probe", "build", "finalize")},
            "wall_s": wall, "samples": doc["samples"], "rate": doc["samples"] / wall,
            "build_rate": doc.get("rate_samples_per_s") or 0.0, "shards": doc["shards"], "cpu_s": cpu_s}


PROBE = Path(__file__).resolve().parent / "_etl_probe.py"
POLL_S = 0.1


def _tid_cpu(pid: int) -> dict[int, tuple[str, float]]:
    """``{tid: (thread name, CPU seconds)}`` of ``pid``'s threads."""
    out = {}
    tick = os.sysconf("SC_CLK_TCK")
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/comm") as f:
                name = f.read().strip()
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                v = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        out[int(tid)] = (name, (int(v[11]) + int(v[12])) / tick)
    return out


def _thread_group(name: str) -> str:
    if "Dask-Default-Threads" in name or "Dask-Actor-Threads" in name:
        return "dask worker threads"  # an own LocalCluster's workers as threads of the driver
    if name == "IO loop" or name.startswith("Dask-"):
        return "dask loop (scheduler, nannies, client)"
    if name == "main":
        return "main"
    return "other threads"


def watched_run(cfg: Path, args: list[str], env: dict[str, str], stats: Path) -> dict:
    """One ``warp etl`` under the probe, its process tree's CPU sampled every :data:`POLL_S`."""
    import psutil

    env = {**env, "WARP_BENCH_STATS": str(stats)}
    load0 = os.getloadavg()[0]
    t = time.perf_counter()
    p = subprocess.Popen([sys.executable, str(PROBE), "etl", "--config", str(cfg), "--json", "--clear", *args],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    procs: dict[int, dict] = {}  # pid -> {role, cpu}
    threads: dict[int, tuple[str, float]] = {}
    root = psutil.Process(p.pid)
    while p.poll() is None:
        try:
            tree = [root, *root.children(recursive=True)]
        except psutil.Error:
            tree = []
        for q in tree:
            try:
                if q.pid not in procs:
                    cmd = " ".join(q.cmdline())
                    parent = q.ppid()
                    role = ("driver" if q.pid == p.pid else "fork server" if "forkserver" in cmd and parent == p.pid
                            else "resource tracker" if "resource_tracker" in cmd else "worker")
                    procs[q.pid] = {"role": role, "cpu": 0.0}
                c = q.cpu_times()
                procs[q.pid]["cpu"] = c.user + c.system
            except psutil.Error:
                continue
        threads.update(_tid_cpu(p.pid))
        time.sleep(POLL_S)
    out, err = p.communicate()
    wall = time.perf_counter() - t
    if p.returncode != 0:
        raise SystemExit(f"warp etl {' '.join(args)} failed ({p.returncode}):\n{err[-2000:]}")
    doc = json.loads(out)
    phases = {}
    mpath = Path(str(doc.get("path", ""))) / "metrics.json"
    if mpath.is_file():
        phases = json.loads(mpath.read_text()).get("phases_s", {})
    counts = json.loads(stats.read_text()) if stats.is_file() else {}
    full = counts.pop("_threads", {})  # whole thread names (the OS keeps 15 bytes)
    by_thread: dict[str, float] = {}
    for tid, (name, cpu) in threads.items():
        g = _thread_group(full.get(str(tid), name))
        by_thread[g] = by_thread.get(g, 0.0) + cpu
    workers = sorted((v["cpu"] for v in procs.values() if v["role"] == "worker"), reverse=True)
    roles: dict[str, float] = {}
    for v in procs.values():
        roles[v["role"]] = roles.get(v["role"], 0.0) + v["cpu"]
    return {"wall_s": wall, "samples": doc["samples"], "rate": doc["samples"] / wall,
            "build_s": float(phases.get("build", 0.0)), "probe_s": float(phases.get("probe", 0.0)),
            "driver_cpu_s": roles.get("driver", 0.0), "driver_threads_cpu_s": by_thread,
            "workers_cpu_s": workers, "helpers_cpu_s": roles.get("fork server", 0.0) + roles.get("resource tracker", 0.0),
            "total_cpu_s": sum(roles.values()), "tasks": counts, "load_1m": (load0 + os.getloadavg()[0]) / 2}


def evict(d: Path) -> None:
    """Drop the corpus's pages from the page cache (``POSIX_FADV_DONTNEED``, these files only), so
    every run's header pass reads from the disk alike: a run's 5 GB of output otherwise evicts a
    varying part of the inputs, and the next run's header pass waits on the disk or does not."""
    for p in d.rglob("*"):
        if p.is_file():
            fd = os.open(p, os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


# --breakdown / --scaling: the executors by name, their arguments and environment
_DASK = ["--executor", "dask"]
KINDS: dict[str, tuple[list[str], dict[str, str]]] = {
    "local-1": (["-j", "1"], {}),
    "local-2": (["-j", "2"], {}),
    "process-2": (["-j", "2", "--executor", "process"], {}),
    "dask-1": (["-j", "1", *_DASK], {}),
    "dask-2": (["-j", "2", *_DASK], {}),
    # the own LocalCluster's layouts (warp/etl/daskrunner.py, OWN_CLUSTER_LAYOUTS), set by bench/_etl_probe.py
    "dask-1-processes": (["-j", "1", *_DASK], {"WARP_BENCH_DASK_LAYOUT": "processes"}),
    "dask-2-processes": (["-j", "2", *_DASK], {"WARP_BENCH_DASK_LAYOUT": "processes"}),
    "dask-2-threads": (["-j", "2", *_DASK], {"WARP_BENCH_DASK_LAYOUT": "threads"}),
    "dask-1-threads": (["-j", "1", *_DASK], {"WARP_BENCH_DASK_LAYOUT": "threads"}),
    "dask-2-one-process": (["-j", "2", *_DASK], {"WARP_BENCH_DASK_LAYOUT": "one-process"}),
    # the header pass read before the plan, not overlapped with the build (set by bench/_etl_probe.py)
    "local-1-serial": (["-j", "1"], {"WARP_BENCH_SERIAL_HEADER": "1"}),
    "local-2-serial": (["-j", "2"], {"WARP_BENCH_SERIAL_HEADER": "1"}),
    "dask-1-serial": (["-j", "1", *_DASK], {"WARP_BENCH_SERIAL_HEADER": "1"}),
    "dask-2-serial": (["-j", "2", *_DASK], {"WARP_BENCH_SERIAL_HEADER": "1"}),
    # the header pass on warp.etl.workers.header_threads(-j) threads (set by bench/_etl_probe.py)
    "local-2-header": (["-j", "2"], {"WARP_BENCH_HEADER_THREADS": "1"}),
    "dask-1-header": (["-j", "1", *_DASK], {"WARP_BENCH_HEADER_THREADS": "1"}),
    "dask-2-header": (["-j", "2", *_DASK], {"WARP_BENCH_HEADER_THREADS": "1"}),
}
BREAKDOWN_KINDS = ["local-2", "process-2", "dask-2"]
SCALING_KINDS = ["local-2", "process-2", "dask-2", "dask-1"]


def breakdown(a: argparse.Namespace) -> int:
    """Where the CPU of one job goes on local threads, a process pool and a Dask LocalCluster."""
    d = corpus(a.n, a.copies)
    work = OUT / "etl-scale-breakdown"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    env = {**os.environ, "WARP_CACHE_DIR": str(work / "cache")}
    cfg = config(d, str(work / "wh"), name="breakdown.toml", size=a.size)
    names = a.kinds.split(",") if a.kinds else (SCALING_KINDS if a.scaling else BREAKDOWN_KINDS)
    unknown = [k for k in names if k not in KINDS]
    if unknown:
        raise SystemExit(f"--kinds: unknown {unknown}; one of {', '.join(KINDS)}")
    kinds = {k: KINDS[k] for k in names}
    res: dict[str, list[dict]] = {k: [] for k in kinds}
    for i in range(a.runs):
        for name in (list(kinds) if i % 2 == 0 else list(reversed(kinds))):
            args, extra = kinds[name]
            if a.cold:
                evict(d)
            res[name].append(watched_run(cfg, args, {**env, **extra}, work / f"stats-{name}-{i}.json"))
    report = {}
    for name, runs in res.items():
        # the median run, whole (its parts add up); res keeps the rounds' order for the pairs below
        report[name] = sorted(runs, key=lambda r: r["wall_s"])[len(runs) // 2]
    base_name = "local-2" if "local-2" in report else next(iter(report))
    base = report[base_name]["rate"]
    ratios = {}
    for one, two in (("dask-1", "dask-2"), ("dask-1-threads", "dask-2-threads"),
                     ("dask-1-processes", "dask-2-processes"), ("local-1", "local-2"),
                     ("dask-1-serial", "dask-2-serial"), ("local-1-serial", "local-2-serial")):
        if one in res and two in res:
            # medians of the per-round ratios: each round's pair ran back to back, under the same load
            pairs = list(zip(res[one], res[two], strict=True))
            ratios[f"{two} / {one}"] = {
                "whole": statistics.median(o["wall_s"] / t["wall_s"] for o, t in pairs),
                "build": statistics.median(o["build_s"] / max(1e-9, t["build_s"]) for o, t in pairs),
                "one_wall_s": statistics.median(o["wall_s"] for o, _ in pairs)}
    if a.json:
        print(json.dumps({"n": a.n, "size": a.size, "runs": a.runs, "cpus": os.cpu_count(), "median_runs": report,
                          "ratios": ratios, "all": res}, indent=2))
        return 0
    loads = [r["load_1m"] for v in res.values() for r in v]
    print(f"{a.n} photos at {a.size} px, {a.runs} rounds alternated, {os.cpu_count()} CPUs, load average (1 min) "
          f"{min(loads):.2f}-{max(loads):.2f}; the median run of each executor:")
    print(f"\n{'executor':16} {'wall s':>7} {'x ' + base_name:>10} "
          f"{'header s':>8} {'build s':>8} {'CPU s':>7} {'ms/img':>7} {'main':>6} {'loop':>6} {'other':>6} "
          f"{'workers':>8} {'fork':>6} {'load':>5}")
    for name, m in report.items():
        th = m["driver_threads_cpu_s"]
        print(f"{name:16} {m['wall_s']:7.2f} {m['rate'] / base:10.3f} {m['probe_s']:8.2f} {m['build_s']:8.2f} "
              f"{m['total_cpu_s']:7.2f} {1e3 * m['total_cpu_s'] / m['samples']:7.3f} {th.get('main', 0):6.2f} "
              f"{th.get('dask loop (scheduler, nannies, client)', 0):6.2f} {th.get('other threads', 0):6.2f} "
              f"{sum(m['workers_cpu_s']) + th.get('dask worker threads', 0):8.2f} {m['helpers_cpu_s']:6.2f} {m['load_1m']:5.2f}")
    for k, v in ratios.items():
        print(f"{k}: {v['whole']:.3f}x the whole command, {v['build']:.3f}x the build phase "
              f"(median of {a.runs} back-to-back pairs; the one-worker job {v['one_wall_s']:.1f} s)")
    for name, m in report.items():
        n = m["samples"]
        print(f"\n{name}: wall {m['wall_s']:.2f} s, {m['rate']:.1f} img/s ({m['rate'] / base:.3f}x {base_name}), "
              f"header pass {m['probe_s']:.2f} s, build {m['build_s']:.2f} s, load {m['load_1m']:.2f}")
        print(f"  CPU s: total {m['total_cpu_s']:.2f} ({1e3 * m['total_cpu_s'] / n:.2f} ms/img); "
              f"driver process {m['driver_cpu_s']:.2f} ("
              + ", ".join(f"{k} {v:.2f}" for k, v in sorted(m["driver_threads_cpu_s"].items())) + "); "
              f"workers {' + '.join(f'{w:.2f}' for w in m['workers_cpu_s']) or '-'}; "
              f"fork server + resource tracker {m['helpers_cpu_s']:.2f}")
        for fn, st in m["tasks"].items():
            moved = st["executor"] != "thread"
            print(f"  {fn}: {st['tasks']} tasks, {st['tasks'] / max(1e-9, st['seconds']):.1f} tasks/s, inputs "
                  f"{st['task_bytes'] / 1e6:.2f} MB ({st['task_bytes'] / max(1, st['tasks']) / 1e3:.1f} kB/task), "
                  f"results {st['result_bytes'] / 1e6:.3f} MB"
                  + ("" if moved else " (threads: nothing is moved)"))
    return 0


def idle_cost(seconds: float = 8.0) -> dict[str, list[float]]:
    """CPU % of one core that an idle own LocalCluster of 2 workers spends, per process (driver with
    scheduler and nannies, then each worker), with distributed's shipped settings and with the
    ones warp starts it with (``OWN_CLUSTER_CONFIG``, warp/etl/daskrunner.py)."""
    import psutil
    from warpdata.etl import daskrunner, executors

    out = {}
    ours = daskrunner.OWN_CLUSTER_CONFIG
    for label, table in (("shipped", {}), ("warp", ours)):
        daskrunner.OWN_CLUSTER_CONFIG = table
        with executors.open_runner(executors.parse_executor("dask"), 2) as r:
            list(r.imap_unordered(abs, range(4)))
            me = psutil.Process()
            # the worker processes: children of the fork server (which shares their command line)
            procs = [me] + [q for q in me.children(recursive=True) if q.ppid() != me.pid]
            c0 = [sum(q.cpu_times()[:2]) for q in procs]
            t = time.perf_counter()
            time.sleep(seconds)
            dt = time.perf_counter() - t
            out[label] = [round(100 * (sum(q.cpu_times()[:2]) - a) / dt, 1) for q, a in zip(procs, c0, strict=True)]
    daskrunner.OWN_CLUSTER_CONFIG = ours
    return out


def _children_cpu() -> float:
    r = os.times()
    return r.children_user + r.children_system


def _proc_cpu(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        v = f.read().rsplit(")", 1)[1].split()
    return (int(v[11]) + int(v[12])) / os.sysconf("SC_CLK_TCK")


def _noop(x):
    return x


@dataclass
class _ShardLike:
    """A task as large as a warehouse shard's (64 samples: ~28 kB pickled, paths and hashes)."""

    index: int
    samples: list


def _shard_noop(task: _ShardLike) -> tuple[int, str]:
    from distributed import get_worker

    return task.index, get_worker().get_current_task()  # the Dask task that carried it


def per_task_cost(n: int = 400) -> dict:
    """The driver process's CPU (client, scheduler, nannies) per task of an own LocalCluster of 2
    workers over ``n`` tasks that do nothing, and how many Dask tasks carried them."""
    from warpdata.etl.executors import open_runner, parse_executor

    tasks = [_ShardLike(i, [{"key": f"{i:06d}-{j:06d}", "path": f"/data/coco/images/train2017/{i:06d}{j:06d}.jpg",
                             "sha256": f"{i:032x}{j:032x}", "size": 100_000 + j, "boxes": [[1.0, 2.0, 3.0, 4.0 + j]] * 3,
                             "classes": [1, 2, j]} for j in range(64)]) for i in range(n)]
    with open_runner(parse_executor("dask"), 2) as r:
        list(r.imap_unordered(_shard_noop, tasks[:8]))
        c, t = time.process_time(), time.perf_counter()
        got = list(r.imap_unordered(_shard_noop, tasks))
        c, t = time.process_time() - c, time.perf_counter() - t
    if sorted(i for i, _ in got) != list(range(n)):
        raise SystemExit("per-task: a task's result is missing or repeated")
    return {"driver_ms_per_task": 1e3 * c / n, "wall_ms_per_task": 1e3 * t / n,
            "dask_tasks": len({k for _, k in got}), "task_kb": len(pickle.dumps(tasks[0])) / 1e3,
            "load_1m": os.getloadavg()[0]}


def task_round_trip() -> float:
    """Seconds per task of a Dask LocalCluster (2 workers, 2 tasks in flight each), no work in it."""
    from warpdata.etl.executors import open_runner, parse_executor

    with open_runner(parse_executor("dask"), 2) as r:
        list(r.imap_unordered(_noop, range(20)))
        t = time.perf_counter()
        list(r.imap_unordered(_noop, range(400)))
        return (time.perf_counter() - t) / 400 * 4  # 4 in flight: one task's round trip


def receipt_cost(base: str, n: int = 256) -> dict:
    """The journal's store requests, measured: seconds per receipt written through the driver's
    background writer (RECEIPT_CONCURRENCY in flight), and per receipt of a resume (one listing,
    then concurrent GETs). ``base``: a fresh s3:// build prefix on the bench's server."""
    from warpdata.etl.receipts import Journal

    t = time.perf_counter()
    with Journal(base).writer() as out:
        for i in range(n):
            out.add(f"shard-{i:05d}", f"{i:064x}", f"{i + 1:064x}", i, {"index": i})
    write_s = (time.perf_counter() - t) / n
    t = time.perf_counter()
    got = Journal(base).load_all()
    read_s = (time.perf_counter() - t) / max(1, len(got))
    return {"receipt_write_ms": 1e3 * write_s, "receipt_resume_read_ms": 1e3 * read_s}


def upload_corpus(client, bucket: str, d: Path, prefix: str) -> list[str]:
    """The corpus's labels and images under s3://bucket/prefix/; returns the image keys."""
    keys = []
    for p in sorted(d.rglob("*")):
        rel = p.relative_to(d).as_posix()
        if p.is_file() and (rel == "annotations.json" or rel.startswith("images/")):
            client.put_object(Bucket=bucket, Key=f"{prefix}/{rel}", Body=p.read_bytes())
            if rel.startswith("images/"):
                keys.append(f"{prefix}/{rel}")
    return keys


def get_cost(client, bucket: str, keys: list[str], server_pid: int) -> dict:
    """CPU per GET of a plain boto3 loop over ``keys`` (this process + the moto server)."""
    t, c0, s0 = time.perf_counter(), time.process_time(), _proc_cpu(server_pid)
    for k in keys:
        client.get_object(Bucket=bucket, Key=k)["Body"].read()
    wall, client_cpu, server_cpu = time.perf_counter() - t, time.process_time() - c0, _proc_cpu(server_pid) - s0
    n = len(keys)
    return {"wall_ms_per_get": 1e3 * wall / n, "client_cpu_ms_per_get": 1e3 * client_cpu / n,
            "server_cpu_ms_per_get": 1e3 * server_cpu / n}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=2000)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--breakdown", action="store_true",
                    help="where the CPU goes on local, process and dask (one job, --n photos at --size px)")
    ap.add_argument("--size", type=int, default=320, help="--breakdown: target size in px")
    ap.add_argument("--copies", type=int, default=1,
                    help="--breakdown/--scaling: --n photos as --n/COPIES generated ones, each file copied COPIES times")
    ap.add_argument("--scaling", action="store_true",
                    help="--breakdown of local-2, process-2, dask-2 and dask-1, with the dask-2 / dask-1 ratio "
                         "(whole command and build phase)")
    ap.add_argument("--cold", action="store_true",
                    help="--breakdown: drop the corpus from the page cache before every run (the header pass reads "
                         "from the disk each time)")
    ap.add_argument("--kinds", default="",
                    help="--breakdown: the executors to run, comma-separated (" + ", ".join(KINDS) + ")")
    ap.add_argument("--idle", action="store_true",
                    help="CPU an idle own Dask LocalCluster (2 workers) spends, shipped settings vs warp's")
    ap.add_argument("--per-task", action="store_true",
                    help="driver CPU per task of a Dask LocalCluster (2 workers): --n shard-sized no-op tasks")
    a = ap.parse_args()
    if a.per_task:
        r = per_task_cost(a.n)
        print(f"{a.n} no-op tasks of {r['task_kb']:.1f} kB on a Dask LocalCluster of 2 workers: "
              f"{r['dask_tasks']} Dask tasks, driver CPU {r['driver_ms_per_task']:.2f} ms per task, "
              f"wall {r['wall_ms_per_task']:.2f} ms per task, load {r['load_1m']:.2f}")
        return 0
    if a.idle:
        for label, pcts in idle_cost().items():
            print(f"idle LocalCluster-2, {label} settings: % of one core per process (driver, workers): "
                  f"{pcts}, sum {sum(pcts):.1f} %")
        return 0
    if a.breakdown or a.scaling:
        return breakdown(a)

    sys.path.insert(0, str(ROOT / "tests"))
    from support.s3fixtures import s3_env, start_moto_server

    d = corpus(a.n)
    work = OUT / "etl-scale-work"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    env = {**os.environ, "WARP_CACHE_DIR": str(work / "cache")}
    cfg = config(d, str(work / "wh"))
    server = start_moto_server()
    try:
        s3env = {**env, **s3_env(server.endpoint)}
        import boto3

        client = boto3.client("s3", endpoint_url=server.endpoint, region_name="us-east-1",
                              aws_access_key_id="testing", aws_secret_access_key="testing")
        client.create_bucket(Bucket="bench")
        keys = upload_corpus(client, "bench", d, "corpus")
        cfg_s3 = config(d, str(work / "wh"), source="s3://bench/corpus", name="scale-s3src.toml")
        gets: list[dict] = []
        systems = {
            "local-2": (["-j", "2"], env),
            "dask-2": (["-j", "2", "--executor", "dask"], env),
            "dask-1": (["-j", "1", "--executor", "dask"], env),
            "local-1": (["-j", "1"], env),
            "s3out-2": (["-j", "2", "--output", "s3://bench/wh-{i}"], s3env),  # a fresh prefix per round
            "s3src-2": (["-j", "2"], s3env),
        }
        res: dict[str, list[dict]] = {k: [] for k in systems}
        loads = []
        for i in range(a.runs):
            order = list(systems) if i % 2 == 0 else list(reversed(systems))
            for name in order:
                args, e = systems[name]
                args = [x.format(i=i) for x in args]
                if name.startswith("s3"):
                    server.reset()
                res[name].append(run(cfg_s3 if name.startswith("s3src") else cfg, args, e))
                if name.startswith("s3"):
                    reqs = server.requests()
                    res[name][-1]["puts"] = sum(r["method"] == "PUT" for r in reqs)
                    res[name][-1]["gets"] = sum(r["method"] == "GET" for r in reqs)
                    res[name][-1]["heads"] = sum(r["method"] == "HEAD" for r in reqs)
                loads.append(os.getloadavg()[0])
            gets.append(get_cost(client, "bench", keys, server.proc.pid))
        os.environ.update({k: v for k, v in s3env.items() if k.startswith(("AWS_", "WARP_S3"))})
        receipts = receipt_cost("s3://bench/receipts-bench")
    finally:
        server.stop()

    med = {k: {f: statistics.median(r[f] for r in v) for f in v[0]} for k, v in res.items()}
    t1, t2 = med["dask-1"]["wall_s"], med["dask-2"]["wall_s"]
    p = max(0.0, 2 * (t1 - t2))
    s = max(0.0, t1 - p)
    n = med["local-2"]["samples"]
    # The model of docs/design.md §11:
    #   T(N, W) = S0 + N*d + N*c/W + (N/64)*tau/W + (N/64)*r, capped by the store's request limits
    #   c   worker seconds per image: local-1's header pass + build (one worker does both on a cluster)
    #   d   driver seconds per image: labels + finalize of local-2 (fixed costs included: an upper bound)
    #   S0  the cluster's start-up and shutdown: dask-1's wall minus local-1's
    #   tau one task's round trip through the scheduler (measured here)
    #   r   the driver's share of one receipt PUT (written in the background, RECEIPT_CONCURRENCY at once)
    #   resume: one LIST per 1,000 receipts, then one GET per receipt, read concurrently
    task_s = task_round_trip()
    c = (med["local-1"]["probe_s"] + med["local-1"]["build_s"]) / n
    d = (med["local-2"]["labels_s"] + med["local-2"]["finalize_s"]) / n
    s0 = max(0.0, med["dask-1"]["wall_s"] - med["local-1"]["wall_s"])
    per_shard = 64
    big = 1_000_000

    receipt_s = receipts["receipt_write_ms"] / 1e3

    def predict(w: int) -> float:
        return big / (s0 + big * d + big * c / w + (big / per_shard) * task_s / w + (big / per_shard) * receipt_s)

    puts_per_shard = med["s3out-2"]["puts"] / max(1, med["s3out-2"]["shards"])
    # an S3 source costs one GET per image (none for an unchanged one on a rerun): one prefix caps it
    s3_get_limit = 5500
    model = {"serial_s": round(s, 3), "parallel_s": round(p, 3),
             "predicted_rate_64": round(n / (s + p / 64), 1) if s + p / 64 > 0 else None,
             "max_rate_serial_bound": round(n / s, 1) if s else None,
             "worker_ms_per_image": round(1e3 * c, 3), "driver_ms_per_image": round(1e3 * d, 4),
             "startup_s": round(s0, 3), "dask_task_round_trip_ms": round(1e3 * task_s, 2),
             "rate_1M_images": {w: round(predict(w), 0) for w in (1, 2, 8, 16, 64, 256)},
             "driver_bound_rate": round(1 / d, 0) if d else None,
             "s3_put_bound_rate": round(3500 / puts_per_shard * per_shard, 0),
             "s3_get_bound_rate_sources": s3_get_limit,
             "rate_1M_images_s3_source": {w: round(min(predict(w), s3_get_limit), 0) for w in (1, 2, 8, 16, 64, 256)},
             "puts_per_shard_measured": round(puts_per_shard, 3),
             "receipt_write_ms": round(receipts["receipt_write_ms"], 3),
             "receipt_resume_read_ms": round(receipts["receipt_resume_read_ms"], 3),
             "resume_s_1M_images": round((big / per_shard) * receipts["receipt_resume_read_ms"] / 1e3
                                         + (big / per_shard / 1000) * 0.05, 1)}
    ratios = {
        "dask2_over_local2": round(med["dask-2"]["rate"] / med["local-2"]["rate"], 3),
        "dask2_over_local2_build": round(med["dask-2"]["build_rate"] / med["local-2"]["build_rate"], 3),
        "s3out2_over_local2": round(med["s3out-2"]["rate"] / med["local-2"]["rate"], 3),
        "dask2_over_dask1": round(med["dask-2"]["rate"] / med["dask-1"]["rate"], 3),
        "local2_over_local1": round(med["local-2"]["rate"] / med["local-1"]["rate"], 3),
        "puts_per_shard_s3out": round(med["s3out-2"]["puts"] / max(1, med["s3out-2"]["shards"]), 3),
        "s3src2_over_local2": round(med["s3src-2"]["rate"] / med["local-2"]["rate"], 3),
        "gets_per_image_s3src": round(med["s3src-2"]["gets"] / max(1, len(keys)), 3),
    }
    # The best an S3-source run can do here: the local run's CPU per image plus the GETs' CPU
    # (client and moto), spread over the cores, and never faster than the local run itself.
    get = {f: statistics.median(g[f] for g in gets) for f in gets[0]}
    cpus = os.cpu_count() or 1
    local_cpu_per_img = med["local-2"]["cpu_s"] / n
    get_cpu = (get["client_cpu_ms_per_get"] + get["server_cpu_ms_per_get"]) / 1e3
    # Two bounds: the GETs' CPU spread over the cores, and moto serving them one at a time (its
    # Python threads share one GIL) while the rest of the run (all but the local header pass) goes on
    moto_serial_s = n * get["server_cpu_ms_per_get"] / 1e3 + med["local-2"]["wall_s"] - med["local-2"]["probe_s"]
    ceiling = min(med["local-2"]["rate"],
                  1.0 / ((med["local-2"]["wall_s"] / n) + get_cpu / cpus),
                  n / moto_serial_s)
    ratios["s3src2_over_ceiling"] = round(med["s3src-2"]["rate"] / ceiling, 3)
    # the cluster's start-up (dask-1 minus local-1) is a fixed cost; past it, Dask's own overhead
    s0_fixed = max(0.0, med["dask-1"]["wall_s"] - med["local-1"]["wall_s"])
    ratios["dask2_over_local2_after_startup"] = round(
        med["local-2"]["wall_s"] / max(1e-9, med["dask-2"]["wall_s"] - s0_fixed), 3)
    ratios["s3src_ceiling_over_local2"] = round(ceiling / med["local-2"]["rate"], 3)
    get_report = {k: round(v, 3) for k, v in get.items()} | {"local_cpu_ms_per_image": round(1e3 * local_cpu_per_img, 3),
                                                             "s3src_ceiling_rate": round(ceiling, 1)}
    report = {"n": a.n, "runs": a.runs, "cpus": os.cpu_count(), "loadavg_1m_median": round(statistics.median(loads), 2),
              "median": {k: {f: round(v, 3) for f, v in m.items()} for k, m in med.items()},
              "ratios": ratios, "model": model, "get_cost": get_report}
    from _figures import emit, figure, pyplot

    plots = []
    plt = pyplot()
    if plt is not None:  # the scaling curve: measured points and the model's prediction for 1 M images
        fig, ax = plt.subplots(figsize=(6, 4))
        ws = [1, 2, 4, 8, 16, 32, 64, 128, 256]
        ax.plot(ws, [predict(w) for w in ws], "o-", label="model, 1 M images (docs/design.md §11)")
        ax.plot([1, 2], [med["dask-1"]["rate"], med["dask-2"]["rate"]], "s", label=f"measured, dask ({a.n} photos)")
        ax.plot([1, 2], [med["local-1"]["rate"], med["local-2"]["rate"]], "^", label=f"measured, local ({a.n} photos)")
        if d:
            ax.axhline(1 / d, ls="--", c="grey", label="driver limit")
        ax.axhline(5500, ls=":", c="grey", label="S3 GET limit, one prefix (S3 sources)")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("workers")
        ax.set_ylabel("img/s")
        ax.set_title(f"warehouse ETL scaling ({os.cpu_count()} CPUs, load {report['loadavg_1m_median']})")
        ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(OUT / "etl_scale.png", dpi=110)
        plots.append("etl_scale.png")

    load = f"load {report['loadavg_1m_median']}, median of {a.runs}"
    emit("etl_scale", [
        figure("warehouse ETL, dask LocalCluster-2 / local-2 (img/s)", ratios["dask2_over_local2"], "x", target=0.9,
               note=load),
        figure("warehouse ETL, dask LocalCluster-2 / local-2, cluster start-up excluded",
               ratios["dask2_over_local2_after_startup"], "x", target=0.9,
               note=f"{load}; start-up = dask-1 wall - local-1 wall"),
        figure("warehouse ETL, S3 sources / local sources (img/s)", ratios["s3src2_over_local2"], "x", target=0.8,
               note=f"{load}; moto shares the 2 cores"),
        figure("warehouse ETL, S3 sources / this machine's S3-source ceiling", ratios["s3src2_over_ceiling"], "x",
               note="ceiling: local CPU per image + measured moto GET CPU, over the cores"),
        figure("GETs per source image", ratios["gets_per_image_s3src"], "GET", target=1.05, op="<="),
        figure("warehouse ETL, dask-2 / dask-1 (img/s)", ratios["dask2_over_dask1"], "x", note=load),
        figure("model: 64 Dask workers (img/s)", model["predicted_rate_64"], "img/s",
               note=f"T(n) = {model['serial_s']} s + {model['parallel_s']} s / n"),
        figure("model: 1 M images on 64 workers (img/s)", model["rate_1M_images"][64], "img/s",
               note="docs/design.md §11: S0 + N*d + N*c/W"),
    ], plots=plots)
    if a.json:
        print(json.dumps(report, indent=2))
    else:
        print(f"{a.n} photos, {a.runs} rounds, {os.cpu_count()} CPUs, load average (1 min, median) "
              f"{report['loadavg_1m_median']}")
        print(f"{'config':10} {'wall s':>8} {'img/s':>8} {'build img/s':>12}")
        for k, m in med.items():
            print(f"{k:10} {m['wall_s']:8.2f} {m['rate']:8.1f} {m['build_rate']:12.1f}")
        for k, v in ratios.items():
            print(f"{k:28} {v}")
        print(f"moto GET: {get_report['client_cpu_ms_per_get']} ms client + {get_report['server_cpu_ms_per_get']} ms "
              f"server CPU, {get_report['wall_ms_per_get']} ms wall; S3-source ceiling here "
              f"{get_report['s3src_ceiling_rate']} img/s")
        print(f"two-point fit T(n) = {model['serial_s']} s + {model['parallel_s']} s / n  ->  64 workers: "
              f"{model['predicted_rate_64']} img/s (this corpus; serial bound {model['max_rate_serial_bound']} img/s)")
        print(f"model: worker {model['worker_ms_per_image']} ms/img, driver {model['driver_ms_per_image']} ms/img, "
              f"start-up {model['startup_s']} s, Dask task round trip {model['dask_task_round_trip_ms']} ms")
        print("  1 M images, img/s by workers: " + ", ".join(f"{w}: {r:.0f}" for w, r in model["rate_1M_images"].items()))
        print(f"  limits: driver {model['driver_bound_rate']} img/s; S3 PUT 3,500/s per prefix -> "
              f"{model['s3_put_bound_rate']} img/s ({model['puts_per_shard_measured']} PUTs per shard measured); "
              f"S3 GET 5,500/s per prefix (sources) -> 5,500 img/s")
        print("  1 M images from an S3 source, img/s by workers: "
              + ", ".join(f"{w}: {r:.0f}" for w, r in model["rate_1M_images_s3_source"].items()))
        print(f"  receipts: {model['receipt_write_ms']} ms of the driver per receipt written, "
              f"{model['receipt_resume_read_ms']} ms per receipt on resume (one listing, concurrent GETs): "
              f"~{model['resume_s_1M_images']} s to resume 1 M images")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
