"""The Dask runner: tasks as Dask futures on an own ``LocalCluster`` or an existing scheduler
(``dask://HOST:PORT``, ``dask:SCHEDULER_FILE``), and the cluster's helpers: an own cluster's
settings and layouts, the checks of an existing scheduler (its file, host, identity, first
worker) and the quieting of ``distributed``'s logs. ``dask`` and ``distributed`` are optional
extras and heavy (over 1 s of CPU to import: :func:`warpdata.etl.executors.require`): they are
imported inside the functions that use them, never at module level.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import socket
import threading
import traceback
import uuid
from collections.abc import Callable, Iterator, Sequence, Sized
from typing import Any

from warpdata.core import envvars
from warpdata.core.errors import ConfigError, InfrastructureError, WarpError, missing_dependency
from warpdata.etl import access as _access
from warpdata.etl.executorspec import ExecutorSpec
from warpdata.etl.runners import Runner, _init_worker, batch_size, pack_batch, run_packed_batch

log = logging.getLogger(__name__)


class DaskRunner(Runner):
    """Tasks as Dask futures on a ``distributed.Client`` (own LocalCluster or an existing scheduler)."""

    kind = "dask"

    def __init__(self, spec: ExecutorSpec, workers: int, initializer: Callable[[], None] | None = None,
                 resources: dict[str, float] | None = None, preload: tuple[str, ...] = (),
                 access: Sequence[tuple[str, str]] = ()) -> None:
        super().__init__(workers, resources)
        try:
            import dask
            from distributed import Client, LocalCluster
        except ImportError:
            raise missing_dependency(spec.named, "distributed", "dask") from None
        self.cluster = None
        self.layout = None
        self.address = spec.address
        env: dict[str, str] | None = None
        try:
            if spec.address is None:
                # an own cluster offers what the tasks ask for: one task per worker slot at a time
                self.layout = OWN_CLUSTER_LAYOUT if not self.resources else RESOURCES_LAYOUT
                layout = OWN_CLUSTER_LAYOUTS[self.layout]
                processes = layout["processes"]
                n, threads = (1, workers) if layout["one_worker"] else (workers, 1)
                with (_forkserver(preload) if processes else contextlib.nullcontext()) as env, \
                        dask.config.set(own_cluster_config()):
                    # threads: the scheduler and workers talk in-process (inproc://), never over a socket,
                    # and have no memory limit: a worker thread would measure the whole driver's memory
                    # against its share of the machine and pause (stop taking tasks) or spill for it
                    self.cluster = LocalCluster(n_workers=n, threads_per_worker=threads, processes=processes,
                                                **({"host": "127.0.0.1"} if processes else {"memory_limit": 0}),
                                                dashboard_address=":0",  # no fixed port (8787)
                                                scheduler_kwargs={"dashboard": False}, silence_logs=40,
                                                **({"resources": self.resources} if self.resources else {}),
                                                **({"env": env} if env else {}))
                self.client = Client(self.cluster, set_as_default=False)
            else:
                _quiet_distributed()
                address = spec.address if spec.address.startswith("tcp://") else _scheduler_file_address(spec)
                _resolve_host(address, spec.named)
                ident = _scheduler_identity(address, spec.named)
                self.client = Client(address, set_as_default=False, timeout=f"{CONNECT_TIMEOUT_S:g}s")
                if not ident.get("n_workers"):
                    _wait_for_workers(self.client, spec)
        except WarpError:
            self.close()
            raise
        except (OSError, TimeoutError) as e:
            self.close()
            raise InfrastructureError(f"{spec.named}: could not reach the Dask scheduler: {e}",
                                      hint="check the scheduler is running and reachable, then rerun") from None
        except BaseException:
            self.close()
            raise
        if initializer is not None or env:
            from distributed.diagnostics.plugin import WorkerPlugin

            class _Init(WorkerPlugin):
                name = "warp-etl-init"

                def setup(self, worker):  # runs on every worker, including replacements
                    if env:  # forked from the fork server: exactly the driver's environment of now
                        _init_worker(env, initializer)
                    elif initializer is not None:
                        initializer()

            self.client.register_plugin(_Init(), name="warp-etl-init")
        if spec.address is not None:
            self._register_access(access)
        info = self.client.scheduler_info(n_workers=-1) if _accepts_n_workers(self.client) else self.client.scheduler_info()
        self.n_workers = len(info.get("workers", {}))
        self.threads = sum(w.get("nthreads", 1) for w in info.get("workers", {}).values())
        self.scheduler = info.get("address", spec.address or "")
        self.offering: list[str] = []
        if self.resources:
            self.offering = sorted(a for a, w in info.get("workers", {}).items()
                                   if all(float(w.get("resources", {}).get(k, 0)) >= float(v)
                                          for k, v in self.resources.items()))
            if not self.offering:
                self.close()
                want = " ".join(f"{k}={v:g}" for k, v in sorted(self.resources.items()))
                raise ConfigError(f"{spec.named}: no worker of the Dask cluster {self.scheduler} offers "
                                  f"the resources the tasks ask for ({want}); they would wait forever",
                                  hint=f"start workers with 'dask worker ... --resources \"{want}\"' (one per GPU), "
                                       "or change what the tasks ask for ([build] resources, caching_device)")
        if spec.address is not None:
            self.workers = max(1, self.threads)

    def _register_access(self, access: Sequence[tuple[str, str]]) -> None:
        """Hand every worker of an existing cluster (and each that joins later) the driver's
        non-secret store settings, then have it probe the run's sources and output
        (warp/etl/access.py); a worker that cannot reach them stops the run before any task."""
        from distributed.diagnostics.plugin import WorkerPlugin

        settings = _access.travelling_settings()
        paths = list(access)

        class _Access(WorkerPlugin):
            name = "warp-etl-access"

            def setup(self, worker):
                _access.apply_settings(settings)
                name = worker.name if isinstance(worker.name, str) else str(worker.name)
                _access.probe(paths, f"{name} ({worker.address})" if name != worker.address else worker.address)

        try:
            self.access_registered = True
            self.client.register_plugin(_Access(), name="warp-etl-access")
        except WarpError:
            self.close()
            raise

    def describe(self) -> dict[str, Any]:
        d = {"executor": "dask", "scheduler": self.scheduler, "workers": self.n_workers, "threads": self.threads,
             "cluster": "LocalCluster" if self.cluster is not None else "external"}
        if self.cluster is not None:
            d["layout"] = self.layout
        if self.resources:
            d["resources"] = dict(sorted(self.resources.items()))
            d["workers_offering"] = self.offering
        return d

    def imap_unordered(self, fn, tasks, *, window=None):
        from distributed import as_completed

        slots = max(1, len(self.offering) if self.resources else self.threads)
        window = window or 2 * slots
        # several tasks per Dask task while many are left: each Dask task costs the driver ~9 ms
        # of CPU in the scheduler and client (BENCHMARKS.md, "ETL scaling: where Dask's time goes")
        left = len(tasks) if isinstance(tasks, Sized) else 0
        it = iter(tasks)
        n = 0
        # a key the scheduler has never seen: an external cluster keeps the keys of earlier runs,
        # and pid + id(self) repeat (a runner freed and another made at its address in the same
        # driver), so the scheduler answered a new batch with an old run's result
        run = uuid.uuid4().hex[:16]

        def submit():
            nonlocal n, left
            batch = list(itertools.islice(it, batch_size(left, slots)))
            if not batch:
                return None
            left = max(0, left - len(batch))
            # pure=False: every submission is computed (a task lost with its worker is rescheduled
            # by the scheduler itself, up to distributed.scheduler.allowed-failures times)
            n += 1
            return self.client.submit(run_packed_batch, fn, pack_batch(batch), pure=False, key=f"warp-etl-{run}-{n}",
                                      **({"resources": self.resources} if self.resources else {}))

        first = []
        while len(first) < window and (fut := submit()) is not None:
            first.append(fut)
        if not first:
            return
        ac = as_completed(first, loop=self.client.loop)
        try:
            for fut in ac:
                try:
                    outcomes = fut.result()
                    nxt = submit()
                    if nxt is not None:
                        ac.add(nxt)
                    for ok, res in outcomes:
                        if not ok:
                            raise res
                        yield res
                except Exception as e:
                    if _is_infrastructure(e):
                        if _scheduler_lost(self.client, self.scheduler, e):
                            raise InfrastructureError(
                                f"lost the connection to the Dask scheduler {self.scheduler} during the run",
                                hint="restart the scheduler and its workers, then rerun the same command: "
                                     "finished shards are reused") from None
                        raise InfrastructureError(f"the Dask cluster lost the task {fut.key}: {e}",
                                                  hint="rerun the same command: finished shards are reused") from None
                    raise
                finally:
                    fut.release()
        except BaseException:
            for f in list(ac.futures):
                f.cancel()
            raise

    def close(self) -> None:
        client = getattr(self, "client", None)
        if client is not None and getattr(self, "access_registered", False):
            # the probe names this run's paths: a worker joining later, for another run, must not run it
            with contextlib.suppress(Exception):
                client.unregister_worker_plugin("warp-etl-access")
        for obj in (client, self.cluster):
            if obj is not None:
                with contextlib.suppress(Exception):
                    obj.close()


# What an own LocalCluster changes of distributed's shipped defaults: its scheduler, nannies and
# workers live for one run, on this machine's cores, and nobody reads their dashboards. With the
# defaults they spend ~18 % of one core while idle (two workers and the driver on two cores,
# measured in BENCHMARKS.md, "ETL scaling: where Dask's time goes"): each worker samples its
# threads' stacks every 10 ms (the profiler), every server checks its event loop every 20 ms, takes
# a psutil snapshot every 500 ms, and each nanny reads its worker's memory every 100 ms. A value
# the user configured (anything but the shipped default) is kept.
OWN_CLUSTER_CONFIG: dict[str, tuple[Any, Any]] = {  # key: (distributed's default, an own cluster's)
    "distributed.worker.profile.enabled": (True, False),
    "distributed.admin.tick.interval": ("20ms", "1s"),
    "distributed.admin.system-monitor.interval": ("500ms", "5s"),
    "distributed.worker.memory.monitor-interval": ("100ms", "1s"),
}


# How the LocalCluster warp starts itself (``--executor dask``) runs its workers; the external
# cluster path (dask://, dask:FILE) is whatever the user started (BENCHMARKS.md, "Dask's own
# LocalCluster: workers as threads" and "Session 10: worker processes again"):
#   processes    one single-threaded worker process per worker, each under a nanny, forked from a
#                fork server that imported distributed and the pipeline's modules once;
#   threads      the workers are threads of the driver process (processes=False, inproc://
#                transport): no nannies, no fork server, no sockets, tasks and results not
#                pickled; the decoders and the resize release the GIL, as on local threads;
#   one-process  one worker process (and nanny) with a thread per worker.
# "processes" is the fastest since a batch of tasks travels as one pickle (runners.pack_batch): on
# 30,000 photos its build took 13.8 s against 15.8 s on local threads and 17.4 s on "threads", for
# the same CPU per image: each worker has a GIL of its own, where worker threads wait for the
# driver's (its main thread, the scheduler's event loop, and each other's Python between the
# decoders' C calls). A kill -9 of the driver leaves nothing running: each worker process exits
# when its pipe from the driver's nanny closes (distributed's own watch), the fork server and the
# resource tracker on end-of-file (tests/etl/test_lifeline.py). "threads" spent ~20 % less CPU per
# image when every task was pickled apart; it stays, measured and tested, as "one-process" does.
OWN_CLUSTER_LAYOUTS: dict[str, dict[str, bool]] = {
    "processes": {"processes": True, "one_worker": False},
    "threads": {"processes": False, "one_worker": False},
    "one-process": {"processes": True, "one_worker": True},
}
OWN_CLUSTER_LAYOUT = "processes"
# tasks that ask for resources (the feature cache's GPU encoder) keep a process per worker: each
# loads its model in its own process and device context, as on a real cluster
RESOURCES_LAYOUT = "processes"


def own_cluster_config() -> dict[str, Any]:
    """The dask settings an own LocalCluster starts with (:data:`OWN_CLUSTER_CONFIG`), except
    those the user set to something else."""
    import dask

    return {k: ours for k, (default, ours) in OWN_CLUSTER_CONFIG.items() if dask.config.get(k, default) == default}


# an existing scheduler answers within this many seconds or the run stops (docs/formats/receipts.md,
# "Clusters"): a wrong address must never hang the driver
CONNECT_TIMEOUT_S = 10.0
CLUSTER_WAIT_S = 60.0


def cluster_wait() -> float:
    """``WARP_CLUSTER_WAIT``: seconds to wait for a first worker; ConfigError when malformed or out of
    its bound (:mod:`warpdata.core.envvars`: 0 to a day)."""
    value = envvars.number("WARP_CLUSTER_WAIT")
    return CLUSTER_WAIT_S if value is None else float(value)


def _scheduler_file_address(spec: ExecutorSpec) -> str:
    import json

    try:
        with open(spec.address, "rb") as f:
            address = json.load(f)["address"]
    except FileNotFoundError:
        raise ConfigError(f"{spec.named}: scheduler file {spec.address} does not exist",
                          hint="start 'dask scheduler --scheduler-file FILE' first, on a shared filesystem") from None
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ConfigError(f"{spec.named}: {spec.address} is not a Dask scheduler file ({e})",
                          hint="pass the file 'dask scheduler --scheduler-file FILE' wrote") from None
    if not isinstance(address, str) or "://" not in address:
        raise ConfigError(f"{spec.named}: {spec.address} names no scheduler address",
                          hint="pass the file 'dask scheduler --scheduler-file FILE' wrote")
    return address


# a name lookup answers within this many seconds (a resolver that does not answer is the network's
# failure, exit 75); an unknown host fails at once, before the connect's CONNECT_TIMEOUT_S
RESOLVE_TIMEOUT_S = 5.0
# seconds one probe connect to the scheduler's port may take before the handshake check takes over
PROBE_CONNECT_S = 3.0
# getaddrinfo's "this name does not exist" answers: the address is wrong, a rerun cannot help (exit 78)
_NO_SUCH_HOST = {getattr(socket, n) for n in ("EAI_NONAME", "EAI_NODATA", "EAI_FAIL", "EAI_ADDRFAMILY")
                 if hasattr(socket, n)}


def _resolve_host(address: str, named: str) -> None:
    """Look the scheduler's host up before connecting: ``distributed``'s connect retries an
    unresolvable name until its timeout (10 s of silence), where the resolver has already said the
    name does not exist (ConfigError, exit 78, naming the address). A resolver that does not answer
    within :data:`RESOLVE_TIMEOUT_S`, or answers "try again", is InfrastructureError (exit 75)."""
    hostport = address.split("://", 1)[-1]
    host, _, port = hostport.rpartition(":")
    host = host.strip("[]")  # tcp://[::1]:8786
    if not host or not port.isdigit():
        return  # not host:port (the connect names what is wrong with it)
    box: list[Any] = []

    def lookup() -> None:
        try:
            box.append(socket.getaddrinfo(host, int(port), type=socket.SOCK_STREAM))
        except OSError as e:
            box.append(e)

    # on a thread: getaddrinfo has no timeout of its own and a dead resolver blocks it for 20 s and more
    t = threading.Thread(target=lookup, name="warp-etl-resolve", daemon=True)
    t.start()
    t.join(RESOLVE_TIMEOUT_S)
    if not box:
        raise InfrastructureError(f"{named}: looking up the host {host!r} did not answer within "
                                  f"{RESOLVE_TIMEOUT_S:g} s",
                                  hint="check the network and DNS on this machine, then rerun") from None
    e = box[0]
    if isinstance(e, socket.gaierror) and e.errno in _NO_SUCH_HOST:
        raise ConfigError(f"{named}: the host {host!r} of {address} does not resolve ({e.strerror})",
                          hint="pass the address 'dask scheduler' printed (tcp://HOST:8786 by default), "
                               "spelled as this machine resolves it")
    if isinstance(e, OSError):
        raise InfrastructureError(f"{named}: could not look up the host {host!r} of {address}: {e}",
                                  hint="check the network and DNS on this machine, then rerun")
    _refuse_fast(e, address, named)


def _refuse_fast(infos: list[Any], address: str, named: str) -> None:
    """InfrastructureError (exit 75) at once when every address of the scheduler's host refuses
    the connection: nothing listens on that port, and ``distributed``'s connect would retry it for
    its whole timeout (10 s) before saying so. A connect that does not finish within
    :data:`PROBE_CONNECT_S` is left to the handshake check, which has its own deadline."""
    refused = 0
    for family, kind, proto, _name, sockaddr in infos:
        with socket.socket(family, kind, proto) as s:
            s.settimeout(PROBE_CONNECT_S)
            try:
                s.connect(sockaddr)
            except ConnectionRefusedError:
                refused += 1
                continue
            except OSError:
                return  # unreachable or slow: the handshake check names it within its deadline
            return  # something listens
    if infos and refused == len(infos):
        raise InfrastructureError(f"{named}: nothing listens at {address} (connection refused)",
                                  hint="start the scheduler ('dask scheduler' prints its address) or fix the "
                                       "port, then rerun")


def _scheduler_identity(address: str, named: str) -> dict[str, Any]:
    """The scheduler's ``identity`` reply, within :data:`CONNECT_TIMEOUT_S`.

    ``distributed.Client(address, timeout=...)`` bounds the TCP connect but not the handshake: a
    port that accepts and never answers (anything but a scheduler) hangs it for good. One
    ``identity`` request under a deadline tells a scheduler from anything else first.
    """
    import asyncio

    from distributed.comm import connect

    async def ask() -> Any:
        comm = await connect(address, timeout=CONNECT_TIMEOUT_S)
        try:
            await comm.write({"op": "identity", "reply": True})
            return await comm.read()
        finally:
            comm.abort()

    try:
        reply = asyncio.run(asyncio.wait_for(ask(), CONNECT_TIMEOUT_S))
    except TimeoutError:
        raise InfrastructureError(f"{named}: {address} did not answer as a Dask scheduler within "
                                  f"{CONNECT_TIMEOUT_S:g} s",
                                  hint="check the address is the one 'dask scheduler' printed (its port, "
                                       "8786 by default) and that the scheduler is running, then rerun") from None
    except OSError as e:
        raise InfrastructureError(f"{named}: could not reach the Dask scheduler at {address}: {e}",
                                  hint="check the scheduler is running and reachable, then rerun") from None
    except Exception as e:  # a peer that speaks something else: the protocol fails to parse
        raise ConfigError(f"{named}: {address} is not a Dask scheduler ({type(e).__name__}: {e})",
                          hint="pass the address 'dask scheduler' printed (tcp://HOST:8786 by default)") from None
    kind = reply.get("type") if isinstance(reply, dict) else None
    if kind != "Scheduler":
        raise ConfigError(f"{named}: {address} is a Dask {kind or 'peer'}, not a scheduler",
                          hint="pass the scheduler's address (the one 'dask scheduler' printed), not a worker's")
    return reply


def _wait_for_workers(client: Any, spec: ExecutorSpec) -> None:
    """Wait up to ``WARP_CLUSTER_WAIT`` seconds for a first worker, saying so (a silent wait looks
    like a hang); InfrastructureError (exit 75) when none joins."""
    wait = cluster_wait()
    log.warning(f"waiting up to {wait:g} s for a worker to join the Dask scheduler {spec.text} ({spec.where}; "
                "WARP_CLUSTER_WAIT)")
    try:
        client.wait_for_workers(1, timeout=wait)
    except TimeoutError:
        raise InfrastructureError(f"{spec.named}: no Dask worker joined the scheduler within {wait:g} s",
                                  hint=f"start workers with 'dask worker {client.scheduler.address}' "
                                       "(README, \"Clusters\"), or raise WARP_CLUSTER_WAIT, then rerun") from None


class _DebugOnly(logging.Handler):
    """``distributed``'s own log records (tracebacks of a lost scheduler: ~30 lines) reach warp's
    logger at debug level only; the run ends with warp's one line (``-vv`` shows them)."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            msg = record.getMessage()
            if record.exc_info:
                msg += "\n" + "".join(traceback.format_exception(*record.exc_info)).rstrip()
            log.debug(f"{record.name}: {msg}")
        except Exception:
            self.handleError(record)


def _quiet_distributed() -> None:
    # dask's logging config gives "distributed" and several of its children (distributed.client,
    # ...) a stderr handler each, with propagation off
    names = [n for n in list(logging.root.manager.loggerDict) if n.split(".")[0] in ("distributed", "tornado")]
    for name in sorted({"distributed", "tornado", *names}):
        lg = logging.getLogger(name)
        if not lg.handlers and lg.propagate:
            continue
        if not any(isinstance(h, _DebugOnly) for h in lg.handlers):
            lg.handlers[:] = [_DebugOnly()]
        lg.propagate = False


@contextlib.contextmanager
def _forkserver(preload: tuple[str, ...]) -> Iterator[dict[str, str] | None]:
    """Start an own LocalCluster's worker processes from a fork server that has imported
    ``distributed`` and ``preload`` once, instead of spawning fresh interpreters that each import
    them (about 0.5 s of the cluster's start on two cores, and the first task's imports).

    Only where the method is Dask's default (``spawn``) and the platform forks; a method the user
    configured (``distributed.worker.multiprocessing-method``) is kept. Yields the environment the
    workers must be given (the fork server keeps the one it started with), or None.
    """
    import multiprocessing
    import sys

    import dask

    method = dask.config.get("distributed.worker.multiprocessing-method", "spawn")
    if method != "spawn" or sys.platform != "linux" or "forkserver" not in multiprocessing.get_all_start_methods():
        yield None
        return
    with dask.config.set({"distributed.worker.multiprocessing-method": "forkserver"}):
        from distributed.utils import get_mp_context

        ctx = get_mp_context()
        ctx.set_forkserver_preload(["distributed", *preload])  # applied when the fork server starts
        yield dict(os.environ)


def _accepts_n_workers(client) -> bool:
    import inspect

    try:
        return "n_workers" in inspect.signature(client.scheduler_info).parameters
    except (TypeError, ValueError):
        return False


def _scheduler_lost(client: Any, scheduler: str, e: BaseException) -> bool:
    """Whether ``e`` says the connection to the scheduler itself went (not one worker)."""
    text = str(e)
    # the client's reconnect can time out before its status says so: "Timed out trying to connect
    # to tcp://HOST:PORT after 10 s" names the scheduler's own address
    return client.status not in ("running", "connecting") or "scheduler-connection-lost" in text or \
        bool(scheduler) and (f"remote={scheduler}>" in text or f"connect to {scheduler} " in text)


def _is_infrastructure(e: BaseException) -> bool:
    import concurrent.futures

    try:
        from distributed.scheduler import KilledWorker
    except ImportError:
        return False
    # a future cancelled under us (the scheduler went away: "scheduler-connection-lost") is the
    # cluster's failure, never the data's
    return isinstance(e, KilledWorker | OSError | TimeoutError | concurrent.futures.CancelledError) and \
        not hasattr(e, "exit_code")
