"""Who is reading: one rank of a world of ranks, and one DataLoader worker of it.

Every loader of warp (``Table.batches`` / ``Table.to_torch``, the warehouse's
``make_loader``, the feature cache's ``BigBatchLoader`` and ``TblLoader``) takes
the same partition keywords and resolves them here, in one place
(docs/partitioning.md):

``rank``, ``world_size``
    This process's rank and the number of ranks. Each value not given is
    taken, in this order, from ``torch.distributed`` when torch is already
    imported and a process group is initialised, then from the ``RANK`` /
    ``WORLD_SIZE`` environment variables (torchrun sets both; ``LOCAL_RANK``
    plays no part), else ``rank=0, world_size=1``. Checking for
    ``torch.distributed`` never imports torch.
``drop_last``, ``pad``
    What happens when the samples do not split evenly (:mod:`warpdata.partition.split`):
    the library default (both False) reads every sample exactly once; ``pad=True``
    repeats samples so every rank has as many; ``drop_last=True`` yields only full
    batches, the same number on every rank.
``seed``
    Seeds the epoch's order (with ``epoch``); equal on every rank.

The DataLoader worker (``worker_id`` of ``num_workers``) comes from
``torch.utils.data.get_worker_info()`` when torch is imported (again, never
imported just to ask), else ``(0, 1)``.

Old keyword names (``num_replicas``, ``uneven``, ``shard``, ``policy``) still work
for one release with a :class:`DeprecationWarning` (:func:`renamed`); passing an
old and a new name together is a :class:`~warpdata.core.errors.UsageError`.

Pure Python and the standard library: it is imported in every worker.
"""

from __future__ import annotations

import operator
import sys
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from warpdata.core import envvars
from warpdata.core.errors import UsageError


class ShardingError(UsageError):
    """A partition argument or plan that cannot work (names the values and what to pass)."""

    code = "sharding"


class ResumeMismatchError(ShardingError):
    """A resume state from another run: another dataset version, seed, epoch, shuffle or split mode."""

    code = "resume-mismatch"


@dataclass(frozen=True)
class World:
    """One reader: ``rank`` of ``world_size`` ranks, DataLoader worker ``worker_id`` of ``num_workers``.

    ``source`` says where rank and world size came from: ``"explicit"``,
    ``"torch.distributed"``, ``"env"`` (RANK / WORLD_SIZE) or ``"default"``.
    """

    rank: int = 0
    world_size: int = 1
    worker_id: int = 0
    num_workers: int = 1
    source: str = "default"


def worker_info() -> tuple[int, int]:
    """``(worker_id, num_workers)`` of the PyTorch DataLoader worker running us; ``(0, 1)`` elsewhere."""
    torch_data = sys.modules.get("torch.utils.data")
    if torch_data is not None:
        info = torch_data.get_worker_info()
        if info is not None:
            return int(info.id), int(info.num_workers)
    return 0, 1


def _as_int(name: str, value: Any, where: str) -> int:
    if not isinstance(value, bool):
        try:
            return operator.index(value)
        except TypeError:
            pass
    raise ShardingError(f"{name}={value!r} ({where}) is not an integer", hint=f"pass {name} as an integer")


def _from_dist() -> tuple[int, int] | None:
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        return int(dist.get_rank()), int(dist.get_world_size())
    return None


def _from_env(environ: Mapping[str, str] | None) -> tuple[int, int] | None:
    get = envvars.get if environ is None else environ.get
    rank_s, world_s = get("RANK"), get("WORLD_SIZE")
    if rank_s in (None, "") and world_s in (None, ""):
        return None
    if rank_s in (None, "") or world_s in (None, ""):
        have, miss = ("RANK", "WORLD_SIZE") if world_s in (None, "") else ("WORLD_SIZE", "RANK")
        raise ShardingError(f"{have}={(rank_s if have == 'RANK' else world_s)!r} is set but {miss} is not",
                            hint=f"set both RANK and WORLD_SIZE (torchrun does), unset {have}, "
                                 "or pass rank= and world_size=")
    try:
        return int(rank_s), int(world_s)  # type: ignore[arg-type]
    except ValueError:
        raise ShardingError(f"RANK={rank_s!r} / WORLD_SIZE={world_s!r} are not integers",
                            hint="torchrun sets them; unset them for single-process runs") from None


def resolve_world(rank: int | None = None, world_size: int | None = None, *,
                  environ: Mapping[str, str] | None = None, worker: tuple[int, int] | None = None) -> World:
    """The :class:`World` of this process: explicit values, else torch.distributed, else RANK/WORLD_SIZE, else (0, 1).

    Each of ``rank`` / ``world_size`` that is None is filled from the first
    source that has one (``environ`` stands in for ``os.environ`` in tests).
    ``worker``: ``(worker_id, num_workers)``; default: :func:`worker_info`.
    A rank outside ``0 .. world_size-1`` is a :class:`ShardingError` naming both
    values and where they came from.
    """
    source = "explicit"
    got = {"rank": "argument", "world_size": "argument"}
    if rank is not None:
        rank = _as_int("rank", rank, "argument")
    if world_size is not None:
        world_size = _as_int("world_size", world_size, "argument")
    if rank is None or world_size is None:
        found, source = _from_dist(), "torch.distributed"
        if found is None:
            found, source = _from_env(environ), "env"
        if found is None:
            found, source = (0, 1), "default"
        if rank is None:
            rank = found[0]
            got["rank"] = {"env": "RANK"}.get(source, source)
        if world_size is None:
            world_size = found[1]
            got["world_size"] = {"env": "WORLD_SIZE"}.get(source, source)
    if world_size < 1:
        raise ShardingError(f"world size must be at least 1, not {world_size} (world_size from {got['world_size']})",
                            hint="pass world_size= as the number of ranks, e.g. world_size=8")
    if not 0 <= rank < world_size:
        raise ShardingError(f"rank {rank} is not in 0..{world_size - 1} (world size {world_size}; "
                            f"rank from {got['rank']}, world size from {got['world_size']})",
                            hint="pass rank= and world_size= with 0 <= rank < world_size")
    wid, nw = worker if worker is not None else worker_info()
    return World(rank, world_size, wid, max(1, nw), source)


# -- deprecated keyword names ----------------------------------------------------------------

_UNSET: Any = type("_Unset", (), {"__repr__": lambda self: "<unset>", "__bool__": lambda self: False})()
UNSET = _UNSET  # the default of a deprecated keyword: "not passed"


def renamed(where: str, old: str, old_value: Any, new: str, new_value: Any, new_default: Any,
            convert: Callable[[Any], Any] = lambda v: v, *, stacklevel: int = 3) -> Any:
    """``new_value``, or the value of deprecated keyword ``old`` mapped by ``convert`` (with a warning).

    ``old_value`` is :data:`UNSET` when the caller did not pass ``old``. Passing
    ``old`` and ``new`` (``new_value`` not ``new_default``) is a :class:`UsageError`.
    """
    if old_value is _UNSET:
        return new_value
    kw = new if new.endswith("=") else new + "="
    if new_value is not new_default and new_value != new_default:
        raise UsageError(f"{where}: pass {kw} or the deprecated {old}=, not both "
                         f"({new.rstrip('=')}={new_value!r}, {old}={old_value!r})",
                         hint=f"drop {old}=; it is the old name of {kw} (docs/partitioning.md)")
    warnings.warn(f"{where}: {old}= is deprecated and will be removed in the next release; use {kw} "
                  "(docs/partitioning.md)", DeprecationWarning, stacklevel=stacklevel)
    return convert(old_value)


def split_policy(where: str, old: str, value: Any) -> tuple[bool, bool]:
    """``(drop_last, pad)`` for an old uneven-split policy name (``uneven=`` / ``policy=``)."""
    table = {"pad": (False, True), "drop": (True, False), "exact": (False, False)}
    if value not in table:
        raise ShardingError(f"{where}: unknown {old}={value!r}",
                            hint="use drop_last= and pad= instead (docs/partitioning.md)")
    return table[value]


def parse_shard(where: str, shard: Any) -> tuple[int | None, int | None]:
    """``(rank, world_size)`` of an old ``shard=`` value; ``(None, None)`` for ``"auto"``."""
    if shard is None:
        return 0, 1
    if shard == "auto":
        return None, None
    if isinstance(shard, str) and "/" in shard:
        a, _, b = shard.partition("/")
        try:
            return int(a), int(b)
        except ValueError:
            pass
    if isinstance(shard, (tuple, list)) and len(shard) == 2:
        return _as_int("rank", shard[0], where), _as_int("world_size", shard[1], where)
    raise ShardingError(f"{where}: shard={shard!r} is not (rank, world_size), 'RANK/WORLD' or 'auto'",
                        hint="pass rank= and world_size= instead (docs/partitioning.md)")
