"""warp's draft-07 interpreter of the manifest schema gives jsonschema's verdicts, in its order."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import jsonschema
import pytest
from warpdata.registry.manifest import fast_schema, schema
from warpdata.registry.schemacheck import SchemaChecker

GOLDEN = Path(__file__).parents[1] / "golden" / "registry"
DOCS = ["manifest-v1.json", "manifest-v2.json", "manifest-v4.json", "manifest-v4-sealed.json"]
VALUES = [None, True, False, 0, -1, 1.0, 2.5, "", "x", "XYZ", "a" * 300, "/home/me/file", [], [1, "a"], {}, {"k": 1}]


def _paths(doc, path=()):
    yield path
    if isinstance(doc, dict):
        for k, v in doc.items():
            yield from _paths(v, (*path, k))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            yield from _paths(v, (*path, i))


def _mutants(doc):
    """Every node replaced by each of VALUES, every key removed, an extra key in every object."""
    for path in _paths(doc):
        if not path:
            continue
        for v in [*VALUES, "DELETE"]:
            d = copy.deepcopy(doc)
            parent = d
            for p in path[:-1]:
                parent = parent[p]
            if v == "DELETE":
                del parent[path[-1]]
            else:
                parent[path[-1]] = copy.deepcopy(v)
            yield d
        node = doc
        for p in path:
            node = node[p]
        if isinstance(node, dict):
            d = copy.deepcopy(doc)
            parent = d
            for p in path:
                parent = parent[p]
            parent["zz_extra"] = 1
            yield d


def _jsonschema_errors(validator, doc):
    return sorted(((tuple(e.absolute_path), e.message) for e in validator.iter_errors(doc)), key=lambda e: list(e[0]))


def _own_errors(checker, doc):
    return sorted(checker.iter_errors(doc), key=lambda e: list(e[0]))


@pytest.mark.parametrize("name, full", [(d, d == "manifest-v2.json") for d in DOCS])
def test_same_verdicts_as_jsonschema(name, full):
    """What opens use (shard stats left to Python), and the whole schema on a manifest with stats."""
    doc = json.loads((GOLDEN / name).read_text())
    for sch in (fast_schema(), schema()) if full else (fast_schema(),):
        reference = jsonschema.Draft7Validator(sch)
        own = SchemaChecker(sch)
        assert _own_errors(own, doc) == _jsonschema_errors(reference, doc) == []
        n_bad = 0
        for d in _mutants(doc):
            want = _jsonschema_errors(reference, d)
            assert _own_errors(own, d) == want, json.dumps(d)[:400]
            n_bad += bool(want)
        assert n_bad > 100  # the mutations do reach the schema's rules


def test_unknown_keyword_refused():
    with pytest.raises(ValueError, match="oneOf"):
        SchemaChecker({"type": "object", "properties": {"a": {"oneOf": [{"type": "string"}]}}})
