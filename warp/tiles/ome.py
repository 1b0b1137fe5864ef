"""Which multiscale pyramids are valid OME-Zarr 0.5, and how warp says so.

OME-Zarr 0.5 (https://ngff.openmicroscopy.org/0.5/, "axes metadata") allows
2 to 5 axes: 2 or 3 of type ``space`` (last), at most one ``time`` (first)
and at most one ``channel`` or custom-typed axis between them, names unique.
A pyramid whose axes fit gets ``attributes.ome`` multiscales metadata; any
other (1-D, ≥ 6-D, axes in another order) is still written, with the same
multiscales description under ``attributes.warp`` and the reason it is not
OME-Zarr — never an ``ome`` block that OME readers would reject
(docs/formats/zarr-tiles.md, "Multiscale").
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

OME_VERSION = "0.5"
_ORDER = {"time": 0, "channel": 1, None: 1, "space": 2}


def axes_problem(axes: Sequence[dict]) -> str | None:
    """Why ``axes`` cannot be OME-Zarr 0.5 multiscales axes, or None when they can."""
    n = len(axes)
    if not 2 <= n <= 5:
        return f"{n} dimension{'s' * (n != 1)} (OME-Zarr 0.5 allows 2 to 5)"
    names = [a.get("name") for a in axes]
    if len(set(names)) != n:
        return f"axis names {names} are not unique"
    types = [a.get("type") for a in axes]
    space = types.count("space")
    if space not in (2, 3):
        return f"{space} space axes (OME-Zarr 0.5 needs 2 or 3)"
    if types.count("time") > 1:
        return "more than one time axis"
    if sum(t not in ("space", "time") for t in types) > 1:
        return "more than one channel or custom axis"
    rank = [_ORDER.get(t, 1) for t in types]
    if rank != sorted(rank):
        return f"axis order {[f'{a}:{t}' for a, t in zip(names, types, strict=True)]} (OME-Zarr 0.5: time, " \
               "then channel/custom, then space)"
    return None


def group_attributes(multiscale: dict, axes: Sequence[dict]) -> tuple[dict, dict]:
    """(group attributes, description) for a pyramid's ``multiscale`` entry."""
    problem = axes_problem(axes)
    if problem is None:
        return {"ome": {"version": OME_VERSION, "multiscales": [multiscale]}}, describe(None)
    return {"warp": {"multiscales": [multiscale], "not_ome_zarr": problem}}, describe(problem)


def describe(problem: str | None) -> dict[str, Any]:
    if problem is None:
        return {"version": OME_VERSION, "valid": True, "text": f"valid OME-Zarr {OME_VERSION} multiscales"}
    return {"version": None, "valid": False, "reason": problem,
            "text": f"not OME-Zarr: {problem}; multiscales metadata is under attributes.warp instead"}


def describe_group(doc: dict) -> dict[str, Any]:
    """What a pyramid group's ``zarr.json`` says about OME-Zarr (for ``warp inspect``)."""
    attrs = doc.get("attributes") if isinstance(doc.get("attributes"), dict) else {}
    ome = attrs.get("ome")
    if isinstance(ome, dict):
        ms = ome.get("multiscales")
        axes = ms[0].get("axes") if isinstance(ms, list) and ms and isinstance(ms[0], dict) else None
        if ome.get("version") != OME_VERSION:
            return describe(f"attributes.ome.version is {ome.get('version')!r}, not {OME_VERSION!r}")
        if not isinstance(axes, list) or not all(isinstance(a, dict) for a in axes):
            return describe("attributes.ome multiscales has no axes list")
        problem = axes_problem(axes)
        return describe(problem) if problem else describe(None)
    warp = attrs.get("warp")
    if isinstance(warp, dict) and warp.get("not_ome_zarr"):
        return describe(str(warp["not_ome_zarr"]))
    return describe("no multiscales metadata")
