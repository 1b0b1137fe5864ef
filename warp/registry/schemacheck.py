"""The manifest schema checked without the ``jsonschema`` package: the draft-07 keywords that
``manifest.schema.json`` uses, in the order and with the messages ``jsonschema`` gives.

Importing ``jsonschema`` (with ``referencing``, ``attrs`` and its bundled meta-schemas) cost a
fresh process ~0.1-0.2 s on every dataset open, more than fetching and hashing the manifest
(docs/formats/registry.md: every manifest is validated on read). This interpreter knows only the
keywords in :data:`KEYWORDS`; a schema using another one is refused when it is loaded, and the
tests check its verdicts against ``jsonschema``'s on mutated manifests (tests/registry).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

#: the keywords this interpreter applies; annotations (title, description, ...) are ignored
KEYWORDS = frozenset({
    "$ref", "additionalProperties", "const", "dependencies", "enum", "items", "maxItems", "maxLength",
    "maxProperties", "minLength", "minimum", "not", "pattern", "properties", "propertyNames", "required", "type",
})
_ANNOTATIONS = frozenset({"$id", "$schema", "title", "description", "definitions", "default", "examples"})

Path = tuple[Any, ...]


def _is_type(v: Any, t: str) -> bool:
    if t == "object":
        return isinstance(v, dict)
    if t == "array":
        return isinstance(v, list)
    if t == "string":
        return isinstance(v, str)
    if t == "boolean":
        return isinstance(v, bool)
    if t == "null":
        return v is None
    if isinstance(v, bool):
        return False
    if t == "integer":  # draft 4 and later: 1.0 is an integer
        return isinstance(v, int) or (isinstance(v, float) and v.is_integer())
    if t == "number":
        return isinstance(v, (int, float))
    raise ValueError(f"unknown JSON type {t!r}")


def _equal(a: Any, b: Any) -> bool:
    """JSON equality: ``True`` is not ``1``; ``1`` is ``1.0``."""
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_equal(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, str) != isinstance(b, str):
        return False
    return a == b


class SchemaChecker:
    """``iter_errors(doc)`` yields ``(path, message)`` as ``jsonschema``'s draft-07 validator would."""

    def __init__(self, schema: dict[str, Any]) -> None:
        self.root = schema
        self._patterns: dict[str, re.Pattern[str]] = {}
        self._check_keywords(schema)

    def _check_keywords(self, s: Any) -> None:
        if not isinstance(s, dict):
            return
        unknown = set(s) - KEYWORDS - _ANNOTATIONS
        if unknown:
            raise ValueError(f"schema keyword(s) {sorted(unknown)} not supported by warp's checker")
        for k, v in s.items():
            if k in ("properties", "definitions"):
                for sub in v.values():
                    self._check_keywords(sub)
            elif k in ("items", "additionalProperties", "not", "propertyNames"):
                self._check_keywords(v)
            elif k == "dependencies":
                for sub in v.values():
                    self._check_keywords(sub)

    def _resolve(self, ref: str) -> dict[str, Any]:
        if not ref.startswith("#/"):
            raise ValueError(f"only local references are supported, not {ref!r}")
        node: Any = self.root
        for part in ref[2:].split("/"):
            node = node[part.replace("~1", "/").replace("~0", "~")]
        return node

    def is_valid(self, doc: Any, schema: dict[str, Any]) -> bool:
        return next(self._errors(doc, schema, ()), None) is None

    def iter_errors(self, doc: Any) -> Iterator[tuple[Path, str]]:
        return self._errors(doc, self.root, ())

    def _errors(self, v: Any, s: Any, path: Path) -> Iterator[tuple[Path, str]]:
        if s is True:
            return
        if s is False:
            yield path, f"False schema does not allow {v!r}"
            return
        if "$ref" in s:  # draft 7: a reference replaces its siblings
            yield from self._errors(v, self._resolve(s["$ref"]), path)
            return
        for k, arg in s.items():
            if k in _ANNOTATIONS:
                continue
            yield from getattr(self, "_kw_" + k.replace("$", ""))(v, arg, s, path)

    # -- keywords, as jsonschema/_keywords.py words them ---------------------------------
    def _kw_type(self, v, types, s, path):
        types = [types] if isinstance(types, str) else types
        if not any(_is_type(v, t) for t in types):
            yield path, f"{v!r} is not of type {', '.join(repr(t) for t in types)}"

    def _kw_properties(self, v, props, s, path):
        if isinstance(v, dict):
            for name, sub in props.items():
                if name in v:
                    yield from self._errors(v[name], sub, (*path, name))

    def _kw_additionalProperties(self, v, ap, s, path):
        if not isinstance(v, dict):
            return
        extras = [k for k in v if k not in s.get("properties", {})]
        if isinstance(ap, dict):
            for k in extras:
                yield from self._errors(v[k], ap, (*path, k))
        elif not ap and extras:
            extras = sorted(extras, key=str)
            yield path, (f"Additional properties are not allowed ({', '.join(repr(e) for e in extras)} "
                         f"{'was' if len(extras) == 1 else 'were'} unexpected)")

    def _kw_required(self, v, req, s, path):
        if isinstance(v, dict):
            for name in req:
                if name not in v:
                    yield path, f"{name!r} is a required property"

    def _kw_items(self, v, sub, s, path):
        if isinstance(v, list):
            for i, item in enumerate(v):
                yield from self._errors(item, sub, (*path, i))

    def _kw_propertyNames(self, v, sub, s, path):
        if isinstance(v, dict):
            for name in v:
                yield from self._errors(name, sub, path)

    def _kw_dependencies(self, v, deps, s, path):
        if not isinstance(v, dict):
            return
        for name, dep in deps.items():
            if name not in v:
                continue
            if isinstance(dep, list):
                for each in dep:
                    if each not in v:
                        yield path, f"{each!r} is a dependency of {name!r}"
            else:
                yield from self._errors(v, dep, path)

    def _kw_enum(self, v, enums, s, path):
        if not any(_equal(e, v) for e in enums):
            yield path, f"{v!r} is not one of {enums!r}"

    def _kw_const(self, v, const, s, path):
        if not _equal(v, const):
            yield path, f"{const!r} was expected"

    def _kw_not(self, v, sub, s, path):
        if self.is_valid(v, sub):
            yield path, f"{v!r} should not be valid under {sub!r}"

    def _kw_pattern(self, v, pat, s, path):
        if isinstance(v, str):
            rx = self._patterns.get(pat)
            if rx is None:
                rx = self._patterns[pat] = re.compile(pat)
            if not rx.search(v):
                yield path, f"{v!r} does not match {pat!r}"

    def _kw_minimum(self, v, m, s, path):
        if _is_type(v, "number") and v < m:
            yield path, f"{v!r} is less than the minimum of {m!r}"

    def _kw_minLength(self, v, m, s, path):
        if isinstance(v, str) and len(v) < m:
            yield path, f"{v!r} {'should be non-empty' if m == 1 else 'is too short'}"

    def _kw_maxLength(self, v, m, s, path):
        if isinstance(v, str) and len(v) > m:
            yield path, f"{v!r} {'is expected to be empty' if m == 0 else 'is too long'}"

    def _kw_maxItems(self, v, m, s, path):
        if isinstance(v, list) and len(v) > m:
            yield path, f"{v!r} {'is expected to be empty' if m == 0 else 'is too long'}"

    def _kw_maxProperties(self, v, m, s, path):
        if isinstance(v, dict) and len(v) > m:
            yield path, f"{v!r} {'is expected to be empty' if m == 0 else 'has too many properties'}"
