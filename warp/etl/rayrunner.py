"""The Ray runner: Ray Core tasks on a Ray started for the run or an existing cluster
(``ray://HOST:PORT``, ``ray:auto``), with the access probe every node runs first. ``ray`` is an
optional extra and heavy: it is imported inside the functions that use it, never at module level.
"""

from __future__ import annotations

import contextlib
import errno
import os
from collections.abc import Callable, Sequence
from typing import Any

from warpdata.core.errors import (
    ConfigError,
    DependencyError,
    InfrastructureError,
    WarpError,
    missing_dependency,
    os_failure,
    process_start_failure,
    thread_start_failure,
)
from warpdata.etl import access as _access
from warpdata.etl.executorspec import ExecutorSpec
from warpdata.etl.lifeline import guard_tree
from warpdata.etl.runners import TASK_RETRIES, Runner


def ray_client_missing(spec: ExecutorSpec) -> DependencyError | None:
    """The DependencyError (exit 78) for ``ray://HOST:PORT`` without Ray Client: a plain ``pip install
    ray`` has no gRPC, and ``ray.init`` said so as a ValueError (exit 70). None when it is there."""
    import importlib.util

    if not (spec.address or "").lower().startswith("ray://"):
        return None
    try:
        found = importlib.util.find_spec("grpc") is not None
    except (ImportError, ValueError):  # ValueError: marked unimportable (None in sys.modules)
        found = False
    if found:
        return None
    return DependencyError(f"{spec.named} needs Ray Client (the 'grpcio' package of ray[client]), which is not "
                           "installed", hint="pip install 'ray[client]' (a plain 'pip install ray' has no client), "
                                             "or run warp on a node of the cluster with --executor ray:auto",
                           package="grpcio", extra="ray[client]")


def start_failure(spec: ExecutorSpec, e: Exception) -> Exception:
    """The typed error for Ray failing to start or to connect (``ray.init``): a node that timed out at
    start-up, an unreachable cluster (75, rerun); no thread or process to start (71); a package Ray
    needs (78). A warp error passes through unchanged."""
    if isinstance(e, WarpError):
        return e
    if isinstance(e, ImportError):
        return missing_dependency(spec.named, e.name or "ray", "ray")
    if isinstance(e, ValueError) and "ray[client]" in str(e):
        return ray_client_missing(spec) or missing_dependency(spec.named, "ray[client]")
    exhausted = thread_start_failure(e)
    if exhausted is not None:
        return exhausted
    if isinstance(e, OSError) and e.errno in (errno.EAGAIN, errno.ENOMEM):  # fork or spawn failed
        return process_start_failure(e, "a Ray process")
    if isinstance(e, OSError) and e.errno is not None and not isinstance(e, (ConnectionError, TimeoutError)):
        return os_failure(e)  # its temporary directory unwritable, full, ...: typed by errno (73, 74, 77)
    first = (str(e).strip().splitlines() or [type(e).__name__])[0]
    if spec.address is None:
        return InfrastructureError(f"{spec.named}: the Ray started for this run did not come up: {first}",
                                   hint="a busy or small machine can time out starting Ray's processes: rerun "
                                        "(finished shards are reused), with fewer workers (-j), or use "
                                        "--executor process; Ray's logs are under /tmp/ray/session_latest/logs")
    return InfrastructureError(f"{spec.named}: cannot connect to the Ray cluster at {spec.address}: {first}",
                               hint="check the address and that the cluster is up ('ray status' on its head "
                                    "node), then rerun: finished shards are reused")


class RayRunner(Runner):
    """Ray Core tasks; a task whose worker dies is retried (``max_retries``)."""

    kind = "ray"

    def __init__(self, spec: ExecutorSpec, workers: int, initializer: Callable[[], None] | None = None,
                 resources: dict[str, float] | None = None, access: Sequence[tuple[str, str]] = ()) -> None:
        super().__init__(workers, resources)
        try:
            import ray
        except ImportError:
            raise missing_dependency(spec.named, "ray", "ray") from None
        self.ray = ray
        self.own = spec.address is None
        self.guard = None
        # non-secret store settings travel with every task (warp/etl/access.py)
        self.settings = _access.travelling_settings()
        if not ray.is_initialized():
            if self.own:
                # the GCS server, raylet, agents and workers of a Ray started here end with this
                # process, even after a kill -9 of it (warp/etl/lifeline.py)
                self.guard = guard_tree()
                try:
                    with self.guard.marking() if self.guard is not None else contextlib.nullcontext():
                        ray.init(num_cpus=workers, include_dashboard=False, log_to_driver=False,
                                 configure_logging=False)
                except Exception as e:
                    self.close()
                    raise start_failure(spec, e) from e
                except BaseException:
                    self.close()
                    raise
            else:
                client_missing = ray_client_missing(spec)
                if client_missing is not None:
                    raise client_missing
                try:
                    ray.init(address=spec.address, log_to_driver=False, configure_logging=False)
                except Exception as e:
                    raise start_failure(spec, e) from e
        else:
            self.own = False
        self.initializer = initializer
        if access:
            try:
                self._probe_nodes(access, spec.named)
            except BaseException:
                self.close()
                raise
        have = ray.cluster_resources()
        self.threads = int(have.get("CPU", workers))
        missing = {k: v for k, v in self.resources.items() if float(have.get(k, 0)) < float(v)}
        if missing:
            self.close()
            want = ", ".join(f"{k}={v:g}" for k, v in sorted(missing.items()))
            raise ConfigError(f"{spec.named}: the Ray cluster offers none of the resources the tasks ask "
                              f"for ({want}); they would wait forever",
                              hint="start Ray nodes with those resources (ray start --num-gpus / --resources), "
                                   "or change what the tasks ask for ([build] resources, caching_device)")
        if spec.address is not None:
            self.workers = max(1, self.threads)

    def _probe_nodes(self, access: Sequence[tuple[str, str]], text: str) -> None:
        """One access probe on every live node of the cluster (warp/etl/access.py), before any task:
        a node that cannot reach the run's sources or output stops the run, naming it and the
        setting (nodes that join later are not probed)."""
        ray = self.ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        probe = ray.remote(num_cpus=0, max_retries=0)(_ray_probe)
        refs = []
        for node in ray.nodes():
            if not node.get("Alive"):
                continue
            nid = node["NodeID"]
            name = f"ray node {node.get('NodeManagerAddress', '?')} ({nid[:12]})"
            refs.append(probe.options(scheduling_strategy=NodeAffinitySchedulingStrategy(nid, soft=False))
                        .remote(self.settings, list(access), name))
        try:
            ray.get(refs, timeout=PROBE_TIMEOUT_S)
        except ray.exceptions.RayTaskError as e:
            cause = e.as_instanceof_cause()
            raise (cause.cause if getattr(cause, "cause", None) is not None else cause) from None
        except ray.exceptions.GetTimeoutError:
            raise InfrastructureError(f"{text}: the Ray cluster's nodes did not run the access probe "
                                      f"within {PROBE_TIMEOUT_S:g} s",
                                      hint="check every node is up ('ray status'), then rerun") from None

    def describe(self) -> dict[str, Any]:
        d = {"executor": "ray", "workers": self.threads, "cluster": "local" if self.own else "external"}
        if self.resources:
            d["resources"] = dict(sorted(self.resources.items()))
        return d

    def imap_unordered(self, fn, tasks, *, window=None):
        ray = self.ray
        init = self.initializer
        settings = self.settings

        def call(task):
            if settings:
                os.environ.update(settings)
            if init is not None:
                init()
            return fn(task)

        res = dict(self.resources)
        gpus = res.pop("GPU", 0)
        remote = ray.remote(max_retries=TASK_RETRIES, retry_exceptions=False, num_cpus=1,
                            **({"num_gpus": gpus} if gpus else {}), **({"resources": res} if res else {}))(call)
        window = window or 2 * max(1, self.threads)
        it = iter(tasks)
        pending = []
        for task in it:
            pending.append(remote.remote(task))
            if len(pending) >= window:
                break
        try:
            while pending:
                done, pending = ray.wait(pending, num_returns=1)
                try:
                    res = ray.get(done[0])
                except ray.exceptions.RayTaskError as e:
                    cause = e.as_instanceof_cause()
                    raise (cause.cause if getattr(cause, "cause", None) is not None else cause) from None
                except (ray.exceptions.WorkerCrashedError, ray.exceptions.NodeDiedError) as e:
                    raise InfrastructureError(f"the Ray cluster lost a task: {e}",
                                              hint="rerun the same command: finished shards are reused") from None
                nxt = next(it, None)
                if nxt is not None:
                    pending.append(remote.remote(nxt))
                yield res
        except BaseException:
            for r in pending:
                with contextlib.suppress(Exception):
                    ray.cancel(r)
            raise

    def close(self) -> None:
        if self.own:
            with contextlib.suppress(Exception):
                self.ray.shutdown()
        if self.guard is not None:
            self.guard.release()
            self.guard = None


# seconds every node of a Ray cluster has to run its access probe
PROBE_TIMEOUT_S = 60.0


def _ray_probe(settings: dict[str, str], paths: list[tuple[str, str]], name: str) -> None:
    """A Ray node's access probe (warp/etl/access.py), with the driver's non-secret store settings."""
    _access.apply_settings(settings)
    _access.probe(paths, name)
