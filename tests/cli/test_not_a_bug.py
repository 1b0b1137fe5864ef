"""Exit 70 is for warp's bugs only: what this machine lacks is typed, with what to do (issue 36).

* an optional package that is not installed: exit 78 naming the extra's pip line. Absence is
  simulated the way Python itself marks a module unimportable: ``None`` in ``sys.modules`` (for
  the module and every submodule already imported), so each import of it raises
  ``ModuleNotFoundError`` for real. Before: the README's S3 publish on a core-only install was
  exit 70 ``ModuleNotFoundError: botocore``; ``-x ray://`` without ``ray[client]`` exit 70 with
  Ray's ``ValueError``;
* a thread the system will not start (``RuntimeError: can't start new thread``): exit 71 (EX_OSERR),
  saying to use fewer workers or raise the limit. Made real by a thread stack size no address
  space can hold, so ``pthread_create`` fails. Before: exit 70;
* a process the system will not start (fork/spawn failing with EAGAIN): 71 as well, made real by
  ``RLIMIT_NPROC`` (not as root, which is exempt) or a pids cgroup holding one task (a container's
  ``pids.max``; root is not exempt), where a whole ``warp etl -x process`` is 71 too;
* Ray failing to come up or to connect: 75, rerun.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading

import pytest
from support.warehouses import coco_config
from warpdata.core.errors import ExitCode
from warpdata.sampledata.detection import generate

SMALL = {"min_side": 64, "max_side": 150}


def _absent(monkeypatch, *modules: str) -> None:
    """Make ``modules`` unimportable for the rest of the test, as if they were not installed."""
    for name in list(sys.modules):
        if any(name == m or name.startswith(m + ".") for m in modules):
            monkeypatch.setitem(sys.modules, name, None)
    for m in modules:
        monkeypatch.setitem(sys.modules, m, None)


@pytest.fixture(scope="module")
def coco(tmp_path_factory):
    d = tmp_path_factory.mktemp("coco") / "coco"
    generate(d, count=8, seed=3, **SMALL)
    return d


@pytest.fixture
def photos(tmp_path, monkeypatch):
    from warpdata.sampledata.__main__ import main as sample

    assert sample(["photos", str(tmp_path), "--count", "6"]) == 0
    monkeypatch.chdir(tmp_path)
    return tmp_path


S3_MODULES = ("botocore", "boto3", "s3fs", "aiobotocore", "s3transfer")


def test_s3_publish_without_the_s3_extra_names_it(cli, s3, photos, monkeypatch):
    """The README's publish to WARP_STORE=s3://... on a core-only install: 78 and the pip line."""
    monkeypatch.setenv("WARP_STORE", s3.url("store"))
    _absent(monkeypatch, *S3_MODULES)
    r = cli("publish", "demo/photos", "--table", "main=data/*.parquet", "--artifact", "media=imgs",
            "--bind", "main.image=media:image")
    assert r.code == 78, r.err
    assert "S3 storage needs the '" in r.err and "which is not installed" in r.err, r.err
    assert "[s3]" in r.err and "pip install" in r.err, r.err
    assert "internal error" not in r.err and "ModuleNotFoundError" not in r.err
    assert s3.count("PUT", "store") == 0  # nothing was uploaded


def test_ls_of_an_s3_store_without_the_s3_extra_names_it(cli, s3, monkeypatch):
    monkeypatch.setenv("WARP_STORE", s3.url("store"))
    _absent(monkeypatch, *S3_MODULES)
    r = cli("ls")
    assert r.code == 78 and "[s3]" in r.err and "internal error" not in r.err, r.err


def test_ray_client_address_without_ray_client_names_it(cli, coco, tmp_path, monkeypatch):
    pytest.importorskip("ray")
    _absent(monkeypatch, "grpc")  # Ray Client's gRPC: what `pip install ray` leaves out
    cfg = coco_config(coco, tmp_path / "wh")
    r = cli("etl", "--config", cfg, "--executor", "ray://127.0.0.1:1")
    assert r.code == 78, r.err
    assert "--executor ray://127.0.0.1:1 needs Ray Client" in r.err and "pip install 'ray[client]'" in r.err, r.err
    assert "internal error" not in r.err and not (tmp_path / "wh").exists()


def test_a_missing_optional_module_anywhere_is_78_not_70(cli, monkeypatch):
    """The CLI's last line of defence: an optional package's ImportError from any command is 78."""
    from warpdata.cli.app import not_a_bug

    for mod, extra in (("botocore.exceptions", "s3"), ("distributed", "dask"), ("ray", "ray"), ("torch", "torch")):
        err = not_a_bug(ModuleNotFoundError(f"No module named {mod!r}", name=mod))
        assert err is not None and err.exit_code == 78 and f"[{extra}]" in (err.hint or ""), (mod, err)
    assert not_a_bug(ModuleNotFoundError("No module named 'warpdata.nope'", name="warpdata.nope")) is None


@pytest.fixture
def no_threads():
    """Every new thread fails to start for real: its stack cannot be mapped."""
    old = threading.stack_size()
    threading.stack_size(1 << 46)  # 64 TiB: more than any address space the kernel gives a process
    try:
        yield
    finally:
        threading.stack_size(old)


def test_no_thread_to_start_is_71_with_what_to_do(cli, coco, tmp_path, no_threads):
    r = cli("etl", "--config", coco_config(coco, tmp_path / "wh"), "-j", "2")
    assert r.code == ExitCode.OSERR == 71, r.err
    assert "error: the system would not start another thread" in r.err, r.err
    assert "hint: use fewer workers" in r.err and "ulimit -u" in r.err, r.err
    assert "internal error" not in r.err


@pytest.mark.skipif(os.geteuid() == 0, reason="root is exempt from RLIMIT_NPROC")
def test_no_process_to_start_is_71_with_what_to_do(coco, tmp_path):
    code = ("import resource, sys\n"
            "resource.setrlimit(resource.RLIMIT_NPROC, (1, 1))\n"
            "from warpdata.cli.app import main\n"
            f"sys.exit(main(['etl', '--config', {str(coco_config(coco, tmp_path / 'wh'))!r}, '-x', 'process', "
            "'-j', '2']))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 71, r.stderr
    assert "the system would not start" in r.stderr and "internal error" not in r.stderr, r.stderr


@pytest.mark.slow  # Ray waits 30 s for its GCS server before it gives up
def test_ray_that_does_not_come_up_is_75(coco, tmp_path):
    """Ray's own start-up failing (here: too few file descriptors for its GCS server, which then
    never writes its port file) is a temporary failure, 75, rerun. Before: exit 70 (RuntimeError)."""
    pytest.importorskip("ray")
    code = ("import resource, sys\n"
            "resource.setrlimit(resource.RLIMIT_NOFILE, (40, 40))\n"
            "from warpdata.cli.app import main\n"
            f"sys.exit(main(['etl', '--config', {str(coco_config(coco, tmp_path / 'wh'))!r}, '-x', 'ray', '-j', '1']))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == ExitCode.TEMPFAIL == 75, r.stderr[-3000:]
    assert "error: --executor ray: the Ray started for this run did not come up: " in r.stderr, r.stderr[-3000:]
    assert "hint: a busy or small machine can time out starting Ray's processes: rerun" in r.stderr
    assert "internal error" not in r.stderr and "Traceback" not in r.stderr
    assert not list((tmp_path / "wh").glob("v*"))


PIDS_V1 = "/sys/fs/cgroup/pids"


@pytest.fixture
def one_task_cgroup(tmp_path):
    """A pids cgroup (v1) that holds one task: a process in it can start no thread and no process."""
    if not os.access(PIDS_V1, os.W_OK):
        pytest.skip("no writable pids cgroup (v1) to limit tasks in")
    cg = os.path.join(PIDS_V1, f"warp-test-{os.getpid()}-{tmp_path.name}")
    os.mkdir(cg)
    try:
        with open(os.path.join(cg, "pids.max"), "w") as f:
            f.write("1")
        yield cg
    finally:
        os.rmdir(cg)  # its one process has exited


@pytest.mark.parametrize("start", ["multiprocessing", "subprocess"])
def test_a_process_the_kernel_will_not_start_is_71(start, one_task_cgroup):
    """fork failing for real (EAGAIN at a container's pids.max; root is not exempt from it), as the
    process executor and Ray start processes: typed 71 by the CLI's mapping, not 74 or 70."""
    code = ("import os, sys\n"
            f"open(os.path.join({one_task_cgroup!r}, 'cgroup.procs'), 'w').write(str(os.getpid()))\n"
            "import multiprocessing, subprocess\n"
            "from warpdata.cli.app import not_a_bug\n"
            "try:\n"
            + ("    multiprocessing.get_context('fork').Process(target=print).start()\n" if start == "multiprocessing"
               else "    subprocess.run(['true'])\n")
            + "except OSError as e:\n"
            "    err = not_a_bug(e)\n"
            "    print(e.errno, err.exit_code if err else None, err.message if err else '', err.hint if err else '', "
            "sep='|')\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       env={**os.environ, "OPENBLAS_NUM_THREADS": "1"})
    errno_, exit_code, message, hint = r.stdout.strip().split("|")
    assert exit_code == "71", (r.stdout, r.stderr[-2000:])
    assert message.startswith("the system would not start a worker process (EAGAIN") and "ulimit -u" in hint


def test_a_command_at_the_containers_pids_max_is_71(coco, tmp_path, one_task_cgroup):
    """`warp etl -x process` in a cgroup that has no task left (pids.max): whichever it starts first,
    a thread or a worker process, the answer is 71 and what to do. (OpenBLAS is kept to one thread:
    its own pool, failing at numpy's import, raises SIGINT.)"""
    code = ("import os, sys\n"
            f"open(os.path.join({one_task_cgroup!r}, 'cgroup.procs'), 'w').write(str(os.getpid()))\n"
            "from warpdata.cli.app import main\n"
            f"sys.exit(main(['etl', '--config', {str(coco_config(coco, tmp_path / 'wh'))!r}, '-x', 'process', "
            "'-j', '2']))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                       env={**os.environ, "OPENBLAS_NUM_THREADS": "1"})
    assert r.returncode == 71, r.stderr[-2000:]
    assert r.stderr.startswith("error: the system would not start "), r.stderr
    assert "hint: use fewer workers" in r.stderr and "pids.max" in r.stderr and "internal error" not in r.stderr
    assert not list((tmp_path / "wh").glob("v*"))
