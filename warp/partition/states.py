"""Resume states are checked when used: their fields' types and bounds, before anything is allocated
from them, and their consumed set, counts and digests against one another and the plan
(docs/partitioning.md, "Resume": what is checked).

A state is a small JSON document a training job saved; it may have been edited, truncated or
written by hand. Every loader's resume path runs it through here first:

* :func:`load_json`: a state document's size (:data:`MAX_STATE_BYTES`) and JSON nesting
  (:data:`MAX_DEPTH`) are bounded before it is parsed;
* :func:`check_table_state` (a ``Table.batches`` :class:`~warpdata.partition.plan.ResumeState`'s
  values) and :func:`check_dict_state` (``make_loader``'s sampler, ``BigBatchLoader``'s ``sampler``,
  ``TblLoader``): every field the loaders read has its type, and every number its range (``world``
  at most :data:`MAX_WORLD`, DataLoader workers at most :data:`MAX_WORKERS`, interval lists sorted,
  disjoint, at most :data:`MAX_INTERVALS` long, digests 32 hex digits with lanes below ``P``);
* :func:`compare`: the digest fields a loader recomputes from the state's consumed intervals
  against the plan, compared with the state's own, field by field.

Any disagreement is a :class:`ResumeStateError` (a :class:`~warpdata.core.errors.DataError`, exit 65,
and a :class:`~warpdata.partition.world.ResumeMismatchError`) naming the field.
"""

from __future__ import annotations

import numbers
import re
from collections.abc import Iterable, Mapping
from typing import Any

from warpdata.core import jsondoc
from warpdata.core.errors import DataError
from warpdata.core.jsondoc import nesting  # noqa: F401 (re-exported: warp doctor --states)
from warpdata.partition.keys import P
from warpdata.partition.split import MODES
from warpdata.partition.world import ResumeMismatchError

MAX_WORLD = 1 << 20  # ranks in a world: more is refused as a claim, not planned
MAX_WORKERS = 1 << 12  # DataLoader workers of a rank
MAX_INT = (1 << 63) - 1  # seeds, epochs, batch sizes, windows, counts: what an int64 holds
MAX_INTERVALS = 1 << 16  # intervals in one of a state's lists (a state is O(ranks × restarts) of them)
MAX_STATE_BYTES = 16 << 20  # a JSON document of states (one rank's is under 1 KiB)
MAX_DEPTH = 8  # JSON nesting of a document of states (a list of BigBatchLoader states is 5 deep)
MAX_NAME = 4096  # characters of a manifest hash, table name, content name

HINT = ("pass the state the loader's state_dict() saved, unchanged: an edited or damaged state is refused "
        "(docs/partitioning.md, Resume)")
_HEX = re.compile(r"[0-9a-f]*")


class ResumeStateError(DataError, ResumeMismatchError):
    """A resume state whose fields are malformed, out of range, or disagree with one another or with
    the plan of the data it names (docs/partitioning.md, "Resume")."""

    code = "resume-state"


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def bad(where: str, field: str, value: Any, want: str) -> ResumeStateError:
    """The error for field ``field`` of a state: its value and what it must be."""
    return ResumeStateError(f"{where}: the resume state's {field} is {_shown(value)}: {want}", hint=HINT,
                            field=field)


def load_json(text: str | bytes, where: str = "resume state") -> Any:
    """A JSON document of states, its size bounded before it is parsed and its nesting after
    (the parser's own recursion limit is a typed error too, never a RecursionError):
    :func:`warpdata.core.jsondoc.load_json` with the bounds of states."""
    try:
        return jsondoc.load_json(text, where, max_bytes=MAX_STATE_BYTES, max_depth=MAX_DEPTH, hint=HINT)
    except jsondoc.JSONDocumentError as e:
        field = str(e.details.get("field", "json"))
        msg = e.message.replace("such a document", "a document of resume states")
        raise ResumeStateError(msg, hint=HINT, field=field) from None


def as_int(where: str, field: str, value: Any, lo: int = 0, hi: int = MAX_INT) -> int:
    """``value`` if it is an integer (never a bool, float or string) in ``lo .. hi``."""
    if not isinstance(value, numbers.Integral) or isinstance(value, bool):
        raise bad(where, field, value, f"an integer in {lo}..{hi} is expected")
    v = int(value)
    if not lo <= v <= hi:
        raise bad(where, field, value, f"an integer in {lo}..{hi} is expected")
    return v


def as_str(where: str, field: str, value: Any, max_len: int = MAX_NAME) -> str:
    if not isinstance(value, str) or len(value) > max_len:
        raise bad(where, field, value, f"a string of at most {max_len} characters is expected")
    return value


def as_bool(where: str, field: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise bad(where, field, value, "true or false is expected")
    return value


def as_hex(where: str, field: str, value: Any, digits: int) -> str:
    """``""`` or ``digits`` lowercase hex digits."""
    if not isinstance(value, str) or (value and (len(value) != digits or not _HEX.fullmatch(value))):
        raise bad(where, field, value, f"empty or {digits} lowercase hex digits are expected")
    return value


def as_digest(where: str, field: str, value: Any) -> str:
    """``""`` or a sample digest: 32 hex digits, two lanes below ``P``."""
    text = as_hex(where, field, value, 32)
    if text and (int(text[:16], 16) >= P or int(text[16:], 16) >= P):
        raise bad(where, field, value, "a digest's lanes are below 2^61 - 1")
    return text


def as_intervals(where: str, field: str, value: Any, hi: int = MAX_INT) -> tuple[tuple[int, int], ...]:
    """Sorted, disjoint, non-empty half-open intervals ``[a, b)`` within ``0 .. hi``, at most
    :data:`MAX_INTERVALS` of them (the length is checked before any is read)."""
    if not isinstance(value, (list, tuple)):
        raise bad(where, field, value, "a list of [start, stop] intervals is expected")
    if len(value) > MAX_INTERVALS:
        raise bad(where, field, f"{len(value):,} intervals", f"at most {MAX_INTERVALS:,} are expected")
    out: list[tuple[int, int]] = []
    at = 0
    for iv in value:
        if not isinstance(iv, (list, tuple)) or len(iv) != 2:
            raise bad(where, field, iv, "each interval is a [start, stop] pair")
        a, b = (as_int(where, field, x, 0, hi) for x in iv)
        if a >= b or a < at:
            raise bad(where, field, [a, b], f"intervals are non-empty, sorted and disjoint, within 0..{hi}")
        out.append((a, b))
        at = b
    return tuple(out)


def as_carried(where: str, value: Any) -> tuple:
    """``()`` or ``(consumed digest, samples, pad digest, pad samples)``."""
    if value in ((), [], None):
        return ()
    if not isinstance(value, (list, tuple)) or len(value) != 4:
        raise bad(where, "carried", value, "empty or [digest, samples, pad digest, pad samples] is expected")
    return (as_digest(where, "carried", value[0]), as_int(where, "carried", value[1]),
            as_digest(where, "carried", value[2]), as_int(where, "carried", value[3]))


_COUNTS = ("consumed_samples", "pad_samples", "dropped_samples")
_DIGESTS = ("consumed_digest", "pad_digest", "dropped_digest")


def check_tally(where: str, d: Mapping[str, Any]) -> None:
    """The digest fields of any loader's state: types and ranges, each digest with its count."""
    as_str(where, "content", d.get("content", ""))
    as_hex(where, "order_digest", d.get("order_digest", ""), 32)
    for k in _DIGESTS:
        as_digest(where, k, d.get(k, ""))
    for k in _COUNTS:
        as_int(where, k, d.get(k, 0))
    as_carried(where, d.get("carried", ()))


def check_table_state(where: str, d: Mapping[str, Any]) -> None:
    """The fields of a ``Table.batches`` resume state (:class:`~warpdata.partition.plan.ResumeState`'s values)."""
    as_str(where, "manifest", d["manifest"])
    as_str(where, "table", d["table"])
    as_int(where, "seed", d["seed"], -MAX_INT - 1, MAX_INT)
    as_int(where, "epoch", d["epoch"])
    world = as_int(where, "world", d["world"], 0, MAX_WORLD)
    as_int(where, "rank", d["rank"], 0, max(0, world - 1))
    as_int(where, "batch_size", d["batch_size"], 1)
    if d["policy"] not in MODES:
        raise bad(where, "policy", d["policy"], f"one of {', '.join(MODES)} is expected")
    as_bool(where, "shuffle", d["shuffle"])
    nb = as_int(where, "num_batches", d["num_batches"])
    as_intervals(where, "consumed", d["consumed"], nb)
    as_intervals(where, "done_rows", d["done_rows"])
    check_tally(where, d)
    if world == 0 and (d["consumed"] or nb):
        raise bad(where, "consumed", d["consumed"], "a merged state (world 0) has consumed nothing itself")


def check_dict_state(where: str, st: Any) -> Mapping[str, Any]:
    """The fields of a sampler's or ``TblLoader``'s resume state (a dict); returns it."""
    if not isinstance(st, Mapping):
        raise bad(where, "state", st, "a JSON object (the dict state_dict() returned) is expected")
    for k in ("epoch", "rank", "world_size", "batch_size", "consumed", "mode"):
        if k not in st:
            raise bad(where, k, None, "every field state_dict() saves is expected")
    as_int(where, "epoch", st["epoch"])
    world = as_int(where, "world_size", st["world_size"], 1, MAX_WORLD)
    as_int(where, "rank", st["rank"], 0, world - 1)
    as_int(where, "batch_size", st["batch_size"], 1)
    as_int(where, "consumed", st["consumed"])
    if "seed" in st:
        as_int(where, "seed", st["seed"], -MAX_INT - 1, MAX_INT)
    if "num_workers" in st:
        as_int(where, "num_workers", st["num_workers"], 1, MAX_WORKERS)
    if "window" in st:
        as_int(where, "window", st["window"], 1)
    if "shuffle" in st:
        as_bool(where, "shuffle", st["shuffle"])
    for k in ("fingerprint", "data", "kind"):
        if k in st:
            as_str(where, k, st[k], 64)
    if st["mode"] not in MODES:
        raise bad(where, "mode", st["mode"], f"one of {', '.join(MODES)} is expected")
    as_intervals(where, "done", st.get("done", []))
    check_tally(where, st)
    return st


def check_done(where: str, done: Iterable[tuple[int, int]], n: int) -> None:
    """Intervals ``done`` lie within an epoch of ``n`` samples."""
    for a, b in done:
        if b > n:
            raise bad(where, "done", [a, b], f"positions consumed lie within the epoch's {n} samples")


def compare(where: str, state: Mapping[str, Any], want: Mapping[str, Any], what: str) -> None:
    """The state's digest fields equal ``want`` (recomputed from ``what``: its consumed set against the plan)."""
    for k in ("order_digest", "consumed_samples", "consumed_digest", "pad_samples", "pad_digest",
              "dropped_samples", "dropped_digest", "carried"):
        got, exp = state.get(k), want.get(k)
        if k == "carried":
            got, exp = tuple(got or ()), tuple(exp or ())
        elif k in _COUNTS:
            got, exp = got or 0, exp or 0
        else:
            got, exp = got or "", exp or ""
        if got != exp:
            if k == "order_digest":
                msg = (f"{where}: the resume state's order_digest {_shown(got)} is not this epoch's "
                       f"({exp}): another data version, seed, epoch, shuffle or split mode")
            else:
                msg = (f"{where}: the resume state's {k} is {_shown(got)}, but its {what} give {_shown(exp)} "
                       "against the plan")
            raise ResumeStateError(msg, hint=HINT, field=k)


def check_carried(where: str, carried: Any, holds: bool, done: tuple[tuple[int, int], ...], digest_of_done) -> None:
    """What a state carries (``carried``: what the ranks of earlier runs consumed) is the digest and count of
    the positions in its ``done`` set: held by rank 0 (``holds``) of a run resumed at another world size, by
    no other rank. ``digest_of_done()`` gives the hex digest of those positions' samples."""
    carried = tuple(carried or ())
    if not holds:
        if carried:
            raise bad(where, "carried", list(carried), "only rank 0 carries what earlier runs consumed")
        return
    n = sum(b - a for a, b in done)
    if not n and not (carried and carried[1]):
        return
    want = digest_of_done()
    if not carried or (carried[0], carried[1]) != (want, n):
        raise ResumeStateError(f"{where}: the resume state's carried {_shown(list(carried[:2]))} is not what its done "
                               f"positions give ({want}, {n} samples)", hint=HINT, field="carried")
