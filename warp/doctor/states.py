"""``warp doctor TARGET --states FILE...``: check saved resume states against the epoch's order.

The states are the final ``state_dict()`` of every rank of a run (docs/partitioning.md,
"Digests"), saved as JSON: one state per file or a list of them. They are checked
against :func:`warpdata.read.order.epoch_order` for the seed, epoch, shuffle and split
mode they carry: one run of one epoch, every rank of its world, the artifact's content,
the order digest, and that :func:`~warpdata.partition.digest.combine_digests` equals the
set digest (every sample yielded exactly once over all runs).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from warpdata.checks.registry import FAIL, PASS, CheckResult
from warpdata.core.errors import MissingInputError, WarpError
from warpdata.partition.digest import EpochKeys, EpochOrder, check_same_epoch, digest_report
from warpdata.partition.plan import ResumeState, ShardPlan
from warpdata.partition.states import (
    HINT,
    MAX_DEPTH,
    MAX_STATE_BYTES,
    ResumeStateError,
    as_int,
    bad,
    check_dict_state,
    load_json,
    nesting,
)
from warpdata.read.dataset import dataset
from warpdata.read.order import epoch_order


def load_states(files: Sequence[str | Path]) -> list[dict[str, Any]]:
    """Every state in ``files`` (a JSON state, or a list of them, per file): each file's size and JSON nesting
    bounded (:data:`~warpdata.partition.states.MAX_STATE_BYTES`, :data:`~warpdata.partition.states.MAX_DEPTH`),
    each state's fields and ranges checked (:func:`check_fields`) before anything is made of them."""
    out: list[dict[str, Any]] = []
    for f in files:
        p = Path(f)
        try:
            with p.open("rb") as fh:
                raw = fh.read(MAX_STATE_BYTES + 1)  # never more: the size is bounded before anything is parsed
        except FileNotFoundError:
            raise MissingInputError(f"{p}: no such state file",
                                    hint="save every rank's state_dict() as JSON, e.g. json.dump(state, f)") from None
        except IsADirectoryError:  # a read: not the OS taxonomy's "cannot write"
            raise MissingInputError(f"{p}: a directory, not a state file",
                                    hint="pass each rank's state file: --states DIR/rank0.json ...") from None
        if len(raw) > MAX_STATE_BYTES:
            raise ResumeStateError(f"{p}: more than {MAX_STATE_BYTES:,} bytes, larger than a file of resume states",
                                   hint=HINT, field="size")
        try:
            doc = json.loads(raw.decode())
            deep = nesting(doc) > MAX_DEPTH
        except RecursionError:  # the parser's own limit: deeper than any state
            doc, deep = None, True
        except ValueError as e:
            raise MissingInputError(f"{p}: not JSON ({e})",
                                    hint="save every rank's state_dict() as JSON (ResumeState.to_json())") from None
        if deep:
            raise ResumeStateError(f"{p}: JSON nested more than {MAX_DEPTH} deep, deeper than a file of resume "
                                   "states", hint=HINT, field="nesting")
        for st in doc if isinstance(doc, list) else [doc]:
            if isinstance(st, str):
                try:
                    st = load_json(st, f"{p}: a state in the list")
                except ResumeStateError as e:
                    if e.details.get("field") != "json":
                        raise
                    raise MissingInputError(f"{p}: a state in the list is a string that is not JSON",
                                            hint="save every rank's state_dict() as JSON (ResumeState.to_json())"
                                            ) from None
            out.append(check_fields(str(p), st))
    return out


def check_fields(where: str, st: Any) -> Any:
    """A state's fields: their types and ranges (a table's, a sampler's, a ``.tbl`` loader's or a
    ``BigBatchLoader``'s state), a :class:`ResumeStateError` (exit 65) naming the field. A document that is
    not a state at all is left to the checks (they fail it)."""
    if not isinstance(st, dict):
        return st
    if "sampler" in st:  # BigBatchLoader's: {"epoch", "step", "sampler": the sampler's state}
        as_int(where, "step", st.get("step", 0))
        if not isinstance(st["sampler"], dict):
            raise bad(where, "sampler", st["sampler"], "BigBatchLoader's sampler state (a JSON object) is expected")
        check_dict_state(where, st["sampler"])
    elif "policy" in st or "manifest" in st:  # a Table.batches ResumeState
        ResumeState.from_dict(st, where)
    else:
        check_dict_state(where, st)
    return st


def _settings(st: dict[str, Any]) -> dict[str, Any]:
    s = st.get("sampler", st)  # fields checked by check_fields
    mode = s.get("policy", s.get("mode"))
    return {"seed": s.get("seed", 0), "epoch": s.get("epoch", 0), "shuffle": bool(s.get("shuffle")),
            "drop_last": mode == "drop", "pad": mode == "pad", "table": s.get("table") or None,
            "rank": s.get("rank", 0), "world": s.get("world", s.get("world_size", 1))}


def _inconsistent(target: str, states: list[dict[str, Any]], order: EpochOrder, version: str | None,
                  store: str | None) -> WarpError | None:
    """The first state whose consumed set, counts and digests disagree with one another or with the epoch's
    plan, as the error its loader's resume would raise (None when every state agrees): a table's states by
    :meth:`ShardPlan.resume`, a ``.tbl`` loader's by :meth:`EpochKeys.verify_span`. A sampler's
    (``make_loader``, ``BigBatchLoader``) are checked when they are resumed (their twin needs the loader's
    shards and settings)."""
    try:
        if order.kind == "table":
            ds = dataset(target, version=version, store=store)
            t = ds.table(states[0].get("table") or None)  # the table epoch_order ordered
            counts = t._row_counts()
            for st in states:
                ShardPlan.resume(counts, ResumeState.from_dict(st, "doctor --states"), manifest=ds.version,
                                 table=t.name)
        elif order.kind == "tbl":
            keys = EpochKeys(order.mode, order.seed)
            for st in states:
                keys.verify_span("doctor --states", st, order.content, order.epoch, order.sequence)
    except ResumeStateError as e:
        return e
    return None


def check_states(target: str, files: Sequence[str | Path], *, version: str | None = None,
                 store: str | None = None) -> list[tuple[str, CheckResult]]:
    """The checks of a saved set of final states against ``warp order TARGET``."""
    states = load_states(files)
    checks: list[tuple[str, CheckResult]] = []
    if not states:
        return [("states", CheckResult(FAIL, "no states in the files", "pass every rank's final state"))]
    try:
        check_same_epoch("states", states)
        report = digest_report(states)
    except WarpError as e:
        return [("states", CheckResult(FAIL, e.message, e.hint))]
    sets = [_settings(s) for s in states]
    first = sets[0]
    same = all({k: v for k, v in s.items() if k != "rank"} == {k: v for k, v in first.items() if k != "rank"}
               for s in sets)
    ranks = sorted(s["rank"] for s in sets)
    world = first["world"]  # at most MAX_WORLD: never a list of a claimed world's ranks
    if not same or len(ranks) != world or ranks != list(range(world)):
        given = set(ranks)
        missing = [r for r in range(min(world, len(ranks) + 10)) if r not in given][:10]
        more = world - len(given & set(range(world))) - len(missing)
        shown = (", ".join(map(str, missing)) + (f" and {more:,} more" if more > 0 else "")) if missing else ""
        few = ranks if len(ranks) <= 20 else [*ranks[:20], "..."]
        checks.append(("states", CheckResult(
            FAIL, f"{len(states)} state(s) are not one per rank of one run (ranks {few}, world size "
                  f"{world:,}" + (f", missing [{shown}])" if shown else ")"),
            "pass the final state of every rank of the last run")))
        return checks
    checks.append(("states", CheckResult(PASS, f"{len(states)} state(s): ranks 0..{first['world'] - 1} of one run, "
                                               f"epoch {first['epoch']}", facts={"ranks": len(states)})))
    order = epoch_order(target, seed=first["seed"], epoch=first["epoch"], drop_last=first["drop_last"],
                        pad=first["pad"], shuffle=first["shuffle"], table=first["table"], version=version,
                        store=store)
    if report.content != order.content:
        checks.append(("version", CheckResult(
            FAIL, f"the states are of content {report.content[:24]}…, {target} is {order.content[:24]}…",
            f"check them against the version they were saved with (--version), or resume against {target}")))
        return checks
    checks.append(("version", CheckResult(PASS, f"content {order.content[:24]}…")))
    if report.order_digest != order.order_digest():
        checks.append(("order", CheckResult(
            FAIL, f"order digest {report.order_digest} of the states, {order.order_digest()} of the epoch",
            "the loader ordered another epoch than its settings say: report it as a warp bug")))
    else:
        checks.append(("order", CheckResult(PASS, f"order digest {report.order_digest} ({order.mode}, seed "
                                                  f"{order.seed}, epoch {order.epoch})")))
    want = order.set_digest()
    wrong = _inconsistent(target, states, order, version, store)
    if wrong is not None:
        checks.append(("exactly-once", CheckResult(
            FAIL, wrong.message, "a state's digests are not those of what it says it consumed: it was edited "
                                 "or damaged after it was saved (docs/partitioning.md, Resume)",
            facts={"field": wrong.details.get("field")})))
        return checks
    facts = {"samples": order.samples, "consumed_samples": report.consumed_samples,
             "pad_samples": report.pad_samples, "dropped_samples": report.dropped_samples,
             "digest": report.digest, "set_digest": want}
    if report.digest == want:
        extra = "".join([f", {report.pad_samples} pad repeat(s)" if report.pad_samples else "",
                         f", {report.dropped_samples} dropped by drop_last" if report.dropped_samples else ""])
        checks.append(("exactly-once", CheckResult(
            PASS, f"{report.consumed_samples} of {order.samples} samples yielded once{extra}; digest {want}",
            facts=facts)))
    else:
        checks.append(("exactly-once", CheckResult(
            FAIL, f"combined digest {report.digest} is not the epoch's set digest {want} "
                  f"({report.consumed_samples + report.dropped_samples} of {order.samples} samples accounted for)",
            "a sample was skipped, repeated or added over the runs: resume from the list of every rank's "
            "states (docs/partitioning.md, Resume)", facts=facts)))
    return checks
