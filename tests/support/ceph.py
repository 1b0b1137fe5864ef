"""A real S3 server for tests: a one-node Ceph cluster (monitor, one memstore OSD, manager) and its
RADOS Gateway on 127.0.0.1 (docs/s3-conformance.md has the start-up figures).

``start_ceph()`` builds the cluster in a temporary folder (every file of it: config, monitor
store, OSD, logs, sockets), on free ports, ``auth none`` (the gateway's S3 users still sign:
radosgw checks SigV4 against the user made with ``radosgw-admin user create``). Each daemon runs
in the foreground in a process group of its own, with ``PR_SET_PDEATHSIG`` (SIGKILL): when the
process that started it dies, even by SIGKILL, the kernel kills the daemon; ``CephCluster.stop``
(and an ``atexit`` hook) kills the groups and removes the folder.

The Debian packages (``radosgw ceph-mon ceph-osd ceph-mgr``) are installed with
``apt-get install --no-install-recommends`` when missing and possible (root); when they cannot
be installed or the cluster does not start within its deadline, :func:`ceph_or_skip` skips the
tests that need it, saying why.

Fixtures (``tests/storage/test_rgw_*.py`` import them):

``rgw_server`` (session): the :class:`CephCluster`, or a skip.
``rgw`` (function): a fresh bucket and the environment that points every client at the gateway
with the user's keys: the same attributes as moto's ``s3`` fixture (``bucket``, ``endpoint``,
``client``, ``env``, ``url()``), no request counting.

Run ``python tests/support/ceph.py`` to start one by hand: it prints the endpoint and keys and
serves until interrupted; ``--measure N`` starts it N times and prints the figures.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from dataclasses import dataclass, field

import pytest

__all__ = ["CephCluster", "CephUnavailable", "ceph_or_skip", "rgw", "rgw_server", "start_ceph"]

PACKAGES = ("radosgw", "ceph-mon", "ceph-osd", "ceph-mgr")
BINARIES = ("ceph-mon", "ceph-osd", "ceph-mgr", "radosgw", "radosgw-admin", "monmaptool", "ceph")
START_DEADLINE = 300.0  # seconds for the whole cluster to serve S3 (a loaded 2-core machine)
MEMSTORE_BYTES = 2 << 30  # the OSD keeps every object in RAM: at most this much
ACCESS_KEY = "WARPTESTACCESSKEY000"
SECRET_KEY = "warp-test-secret-key-0000000000000000000"
PR_SET_PDEATHSIG = 1


class CephUnavailable(RuntimeError):
    """Ceph could not be installed or started here (the reason is the message)."""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _die_with_parent() -> None:  # runs in the child between fork and exec
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    os.setpgid(0, 0)


def ensure_packages() -> None:
    """Install the Debian packages when a binary is missing; :class:`CephUnavailable` if that fails."""
    if all(shutil.which(b) for b in BINARIES):
        return
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        raise CephUnavailable(f"Ceph is not installed ({', '.join(PACKAGES)}) and apt-get cannot install it here")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    cmd = ["apt-get", "install", "-y", "-q", "--no-install-recommends", *PACKAGES]
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    if r.returncode != 0:  # the package lists may be missing: once more after an update
        subprocess.run(["apt-get", "update", "-q"], env=env, capture_output=True, timeout=600)
        r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    if r.returncode != 0 or not all(shutil.which(b) for b in BINARIES):
        raise CephUnavailable(f"apt-get install {' '.join(PACKAGES)} failed: {r.stderr.strip()[-400:]}")


@dataclass
class CephCluster:
    """One monitor, one memstore OSD, one manager and a gateway, all under ``root``."""

    root: str
    mon_port: int = 0
    rgw_port: int = 0
    fsid: str = field(default_factory=lambda: str(uuid.uuid4()))
    procs: dict[str, subprocess.Popen] = field(default_factory=dict)
    access_key: str = ACCESS_KEY
    secret_key: str = SECRET_KEY
    started_s: float = 0.0
    version: str = ""

    @property
    def conf(self) -> str:
        return os.path.join(self.root, "ceph.conf")

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.rgw_port}"

    def describe(self) -> str:
        return f"Ceph RADOS Gateway {self.version} at {self.endpoint} (one-node cluster in {self.root})"

    # -- building ----------------------------------------------------------------------------
    def write_conf(self) -> None:
        r = self.root
        os.makedirs(os.path.join(r, "run"), exist_ok=True)
        os.makedirs(os.path.join(r, "log"), exist_ok=True)
        text = f"""[global]
fsid = {self.fsid}
mon host = v2:127.0.0.1:{self.mon_port}
public addr = 127.0.0.1
cluster addr = 127.0.0.1
ms bind msgr1 = false
ms bind ipv6 = false
auth cluster required = none
auth service required = none
auth client required = none
run dir = {r}/run
admin socket = {r}/run/$name.asok
pid file = {r}/run/$name.pid
log file = {r}/log/$name.log
mon data = {r}/mon.$id
mgr data = {r}/mgr.$id
osd data = {r}/osd.$id
osd objectstore = memstore
memstore device bytes = {MEMSTORE_BYTES}
osd pool default size = 1
osd pool default min size = 1
osd pool default pg num = 8
osd pool default pgp num = 8
osd pool default pg autoscale mode = off
osd crush chooseleaf type = 0
mon allow pool size one = true
mon allow pool delete = true
mon warn on pool no redundancy = false
mon warn on insecure global id reclaim allowed = false
mon max pg per osd = 1000
mon data avail warn = 1
mon data avail crit = 0
osd op num threads per shard = 1
osd op num shards = 2
crash dir = {r}/crash
[client.rgw]
# radosgw asks the monitor for a "secure" session by default, which auth none cannot give
ms mon client mode = crc
rgw frontends = beast endpoint=127.0.0.1:{self.rgw_port}
rgw data = {r}/rgw
rgw thread pool size = 64
rgw enable usage log = false
rgw dns name = 127.0.0.1
"""
        with open(self.conf, "w") as f:
            f.write(text)

    def run(self, *args: str, timeout: float = 120) -> str:
        r = subprocess.run([*args], capture_output=True, text=True, timeout=timeout, preexec_fn=_die_with_parent)
        if r.returncode != 0:
            raise CephUnavailable(f"{' '.join(args[:3])} ... failed ({r.returncode}): {(r.stderr or r.stdout)[-600:]}")
        return r.stdout

    def ceph(self, *args: str, timeout: float = 60) -> str:
        return self.run("ceph", "-c", self.conf, "--connect-timeout", "30", *args, timeout=timeout)

    def daemon(self, name: str, *args: str) -> None:
        with open(os.path.join(self.root, "log", f"{name}.out"), "ab") as log:
            self.procs[name] = subprocess.Popen([*args, "-c", self.conf, "-f"], stdout=log, stderr=subprocess.STDOUT,
                                                stdin=subprocess.DEVNULL, preexec_fn=_die_with_parent)

    def check_alive(self) -> None:
        for name, p in self.procs.items():
            if p.poll() is not None:
                tail = ""
                with contextlib.suppress(OSError), open(os.path.join(self.root, "log", f"{name}.out"), "rb") as f:
                    tail = f.read()[-600:].decode(errors="replace")
                raise CephUnavailable(f"{name} exited with {p.returncode}: {tail}")

    def wait(self, what: str, ok, deadline: float, poll: float = 1.0):
        while True:
            self.check_alive()
            with contextlib.suppress(CephUnavailable, subprocess.TimeoutExpired, urllib.error.URLError, OSError,
                                     ValueError):
                got = ok()
                if got:
                    return got
            if time.monotonic() > deadline:
                raise CephUnavailable(f"Ceph: {what} not reached within {START_DEADLINE:.0f}s (logs in {self.root}/log)")
            time.sleep(poll)

    def start(self) -> None:
        t0 = time.monotonic()
        deadline = t0 + START_DEADLINE
        self.version = self.run("ceph-mon", "--version").split("(")[0].replace("ceph version", "").strip()
        self.mon_port, self.rgw_port = _free_port(), _free_port()
        self.write_conf()
        monmap = os.path.join(self.root, "monmap")
        self.run("monmaptool", "--create", "--clobber", "--fsid", self.fsid,
                 "--addv", "a", f"[v2:127.0.0.1:{self.mon_port}]", monmap)
        self.run("ceph-mon", "-c", self.conf, "--mkfs", "-i", "a", "--monmap", monmap)
        self.daemon("mon.a", "ceph-mon", "-i", "a")
        self.wait("the monitor answering", lambda: self.ceph("mon", "stat", timeout=45), deadline)
        os.makedirs(os.path.join(self.root, "mgr.x"), exist_ok=True)
        self.daemon("mgr.x", "ceph-mgr", "-i", "x")
        osd_uuid = str(uuid.uuid4())
        osd_id = self.ceph("osd", "new", osd_uuid).strip()
        os.makedirs(os.path.join(self.root, f"osd.{osd_id}"), exist_ok=True)
        self.run("ceph-osd", "-c", self.conf, "-i", osd_id, "--mkfs", "--osd-uuid", osd_uuid, timeout=180)
        self.daemon(f"osd.{osd_id}", "ceph-osd", "-i", osd_id)
        self.wait("the OSD up", lambda: json.loads(self.ceph("osd", "stat", "-f", "json")).get("num_up_osds") == 1,
                  deadline)
        os.makedirs(os.path.join(self.root, "rgw"), exist_ok=True)
        self.daemon("rgw", "radosgw", "-n", "client.rgw")

        def serving() -> bool:
            with urllib.request.urlopen(self.endpoint + "/", timeout=10) as r:
                return r.status == 200

        self.wait("the gateway serving S3", serving, deadline)
        self.run("radosgw-admin", "-c", self.conf, "-n", "client.rgw", "user", "create", "--uid", "warp-test",
                 "--display-name", "warp tests", "--access-key", self.access_key, "--secret", self.secret_key,
                 timeout=120)
        self.wait("the cluster healthy", lambda: "HEALTH_ERR" not in self.ceph("health"), deadline)
        self.started_s = time.monotonic() - t0

    # -- tearing down ----------------------------------------------------------------------
    def rss_bytes(self) -> dict[str, int]:
        """Resident memory of each daemon (VmRSS), bytes."""
        out = {}
        for name, p in self.procs.items():
            with contextlib.suppress(OSError), open(f"/proc/{p.pid}/status") as f:
                for line in f:
                    if line.startswith("VmRSS:"):
                        out[name] = int(line.split()[1]) * 1024
        return out

    def stop(self) -> None:
        for p in reversed(list(self.procs.values())):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(p.pid, signal.SIGKILL)
        for p in self.procs.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(timeout=30)
        self.procs.clear()
        shutil.rmtree(self.root, ignore_errors=True)


def start_ceph() -> CephCluster:
    """A running one-node cluster with its gateway and an S3 user; :class:`CephUnavailable` if not."""
    ensure_packages()
    cluster = CephCluster(tempfile.mkdtemp(prefix="warp-ceph-"))
    atexit.register(cluster.stop)
    try:
        cluster.start()
    except BaseException:
        cluster.stop()
        raise
    return cluster


_UNAVAILABLE: list[str] = []


def ceph_or_skip() -> CephCluster:
    if _UNAVAILABLE:
        pytest.skip(_UNAVAILABLE[0])
    try:
        return start_ceph()
    except (CephUnavailable, OSError, subprocess.SubprocessError) as e:
        _UNAVAILABLE.append(f"no Ceph RADOS Gateway here: {e}")
        pytest.skip(_UNAVAILABLE[0])


def rgw_env(cluster: CephCluster) -> dict[str, str]:
    """Environment that points every S3 client at the gateway with the test user's keys."""
    from support.s3fixtures import s3_env

    return {**s3_env(cluster.endpoint), "AWS_ACCESS_KEY_ID": cluster.access_key,
            "AWS_SECRET_ACCESS_KEY": cluster.secret_key}


@dataclass
class RgwEnv:
    server: CephCluster
    bucket: str
    client: object
    env: dict[str, str]

    @property
    def endpoint(self) -> str:
        return self.server.endpoint

    def url(self, prefix: str = "warp") -> str:
        return f"s3://{self.bucket}/{prefix}".rstrip("/")


def _listening(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(2)
        return s.connect_ex(("127.0.0.1", port)) == 0


def say(request, line: str) -> None:
    """A line on the terminal, past the output capture (the run names the server it started)."""
    rep = request.config.pluginmanager.get_plugin("terminalreporter")
    capman = request.config.pluginmanager.get_plugin("capturemanager")
    if rep is None:
        return
    with capman.global_and_fixture_disabled() if capman else contextlib.nullcontext():
        rep.write_line(line)


@pytest.fixture(scope="session")
def rgw_server(request):
    if os.environ.get("WARP_RGW") != "1":
        pytest.skip("the Ceph RADOS Gateway tests run with `make s3-conformance` (WARP_RGW=1)")
    cluster = ceph_or_skip()
    say(request, f"\nstarted {cluster.describe()} in {cluster.started_s:.0f}s")
    try:
        yield cluster
    finally:
        ports, pids = (cluster.mon_port, cluster.rgw_port), [p.pid for p in cluster.procs.values()]
        cluster.stop()
        left = [p for p in ports if _listening(p)] + [p for p in pids if os.path.exists(f"/proc/{p}")]
        say(request, f"\nstopped the Ceph cluster: {'LEFT ' + str(left) if left else 'no process left, nothing listening'}")


@pytest.fixture
def rgw(rgw_server, monkeypatch):
    import boto3

    env = rgw_env(rgw_server)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    for k in ("AWS_PROFILE", "WARP_S3_PROFILE", "AWS_SESSION_TOKEN", "WARP_S3_REGION", "AWS_ENDPOINT_URL_S3"):
        monkeypatch.delenv(k, raising=False)
    bucket = f"warp-rgw-{uuid.uuid4().hex[:12]}"
    client = boto3.client("s3", endpoint_url=rgw_server.endpoint, region_name="us-east-1",
                          aws_access_key_id=rgw_server.access_key, aws_secret_access_key=rgw_server.secret_key)
    client.create_bucket(Bucket=bucket)
    return RgwEnv(rgw_server, bucket, client, env)


def _measure(n: int) -> None:
    ensure_packages()
    for i in range(n):
        t0 = time.monotonic()
        try:
            c = start_ceph()
        except CephUnavailable as e:
            print(json.dumps({"start": i, "ok": False, "seconds": round(time.monotonic() - t0, 1), "error": str(e)}),
                  flush=True)
            continue
        rss = c.rss_bytes()
        print(json.dumps({"start": i, "ok": True, "seconds": round(c.started_s, 1),
                          "rss_mib": {k: v >> 20 for k, v in rss.items()}, "rss_total_mib": sum(rss.values()) >> 20}),
              flush=True)
        c.stop()


if __name__ == "__main__":
    if "--measure" in sys.argv:
        _measure(int(sys.argv[sys.argv.index("--measure") + 1]))
    else:
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: sys.exit(0))
        c = start_ceph()
        try:
            print(c.describe(), f"access key {c.access_key} secret {c.secret_key}", flush=True)
            signal.pause()
        finally:
            c.stop()
