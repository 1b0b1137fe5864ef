"""The executor spec: which executor a run names (``--executor``, ``[build] executor``,
``WARP_EXECUTOR``), parsed and resolved; the runners themselves are in
:mod:`warpdata.etl.executors` (the table of specs is its docstring).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from typing import Any

from warpdata.core import envvars
from warpdata.core.errors import ConfigError, UsageError

KINDS = ("local", "thread", "process", "dask", "ray")
HELP = ("local (threads; also 'thread'), process, dask (a LocalCluster), dask://HOST:PORT (or tcp://HOST:PORT, "
        "as 'dask scheduler' prints it) or dask:SCHEDULER_FILE (an existing cluster), ray, ray://HOST:PORT or ray:auto")


@dataclass(frozen=True)
class ExecutorSpec:
    kind: str  # thread | process | dask | ray
    address: str | None = None  # dask: tcp://host:port or a scheduler file; ray: its address
    text: str = "local"
    # where the spec came from, for every error about it: "--executor", "WARP_EXECUTOR" or the
    # config file's key ("x.toml: [build] executor"); not part of what the spec is
    where: str = field(default="--executor", compare=False)

    @property
    def distributed(self) -> bool:
        return self.kind in ("dask", "ray")

    @property
    def named(self) -> str:
        """The setting and its value as the user wrote them, to start an error message with."""
        if self.where == "--executor":
            return f"--executor {self.text}"
        if self.where == "WARP_EXECUTOR":
            return f"WARP_EXECUTOR={self.text}"
        return f"{self.where} = {self.text!r}"


def parse_executor(text: str, *, where: str = "--executor") -> ExecutorSpec:
    """Parse an executor spec; an error naming ``where`` when it is not one: a UsageError (exit 2)
    for the command line's ``--executor``, a ConfigError (exit 78) for a config file's key or
    ``WARP_EXECUTOR``. The spec keeps ``where`` for later errors about it
    (:attr:`ExecutorSpec.named`)."""
    try:
        spec = _parse_executor(text, where)
    except ConfigError as e:
        if where != "--executor":
            raise
        raise UsageError(e.message, hint=e.hint, **e.details) from None
    return spec if where == "--executor" else replace(spec, where=where)


def _parse_executor(text: str, where: str) -> ExecutorSpec:
    t = text.strip()
    low = t.lower()
    if low in ("", "local", "thread", "threads"):
        return ExecutorSpec("thread", None, t or "local")
    if low in ("process", "processes"):
        return ExecutorSpec("process", None, t)
    if low == "dask":
        return ExecutorSpec("dask", None, t)
    if low.startswith(("dask://", "dask+tcp://", "tcp://")):  # tcp://: the address 'dask scheduler' prints
        rest = t.split("://", 1)[1]
        host, sep, port = rest.rpartition(":")
        if not sep or not host or not port.isdigit():
            raise ConfigError(f"{where}: {t!r} is not dask://HOST:PORT",
                              hint="e.g. dask://10.0.0.5:8786 or tcp://10.0.0.5:8786 (the address 'dask scheduler' "
                                   "prints)")
        if not 1 <= int(port) <= 65535:  # no connection can be tried: not "connection refused"
            raise ConfigError(f"{where}: {t!r}: port {int(port)} is out of range (a TCP port is 1 to 65535)",
                              hint="give the port 'dask scheduler' printed (8786 by default), e.g. "
                                   f"dask://{host}:8786", port=int(port))
        return ExecutorSpec("dask", f"tcp://{rest}", t)
    if low.startswith("dask:"):
        path = t[5:]
        if not path:
            raise ConfigError(f"{where}: {t!r} names no scheduler file", hint="e.g. dask:/shared/scheduler.json")
        return ExecutorSpec("dask", os.path.expanduser(path), t)
    if low == "ray":
        return ExecutorSpec("ray", None, t)
    if low.startswith("ray://") or low.startswith("ray:"):
        addr = t if low.startswith("ray://") else t[4:]
        if not addr:
            raise ConfigError(f"{where}: {t!r} names no Ray cluster", hint="e.g. ray:auto or ray://HOST:10001")
        return ExecutorSpec("ray", addr, t)
    raise ConfigError(f"{where}: {t!r} is not a known executor", hint="use one of: " + HELP)


def check_spec(value: Any) -> str | None:
    """A config schema check (``Field(check=...)``): None when ``value`` is an executor spec."""
    try:
        parse_executor(value)
    except UsageError as e:
        if "port" in e.details:  # a port no scheduler can listen on: refused before any connect
            return f"names port {e.details['port']}; a TCP port is 1 to 65535 (the scheduler's, 8786 by default)"
        return "must be one of: " + HELP
    return None


def resolve_executor(cli: str | None = None, configured: str | None = None, *,
                     where_config: str = "[build] executor", config_file: str | None = None) -> ExecutorSpec:
    """``--executor`` > the config's ``[build] executor`` > ``WARP_EXECUTOR`` > local threads.

    The spec remembers where it came from (:attr:`ExecutorSpec.where`): an error about the cluster
    it names (unreachable, no workers, not a scheduler) names that setting, and ``config_file``
    (the ``--config`` path) when the value came from the file."""
    env = envvars.get("WARP_EXECUTOR")
    env_spec = parse_executor(env, where="WARP_EXECUTOR") if env else None
    if cli:
        return parse_executor(cli)
    if configured:
        where = f"{config_file}: {where_config}" if config_file else where_config
        return parse_executor(configured, where=where)
    return env_spec or ExecutorSpec("thread", None, "local")
