"""Hostile manifests and shards: the malformed corpus, then seeded fuzzing of TWH1 warehouses and
feature caches (manifest JSON and shard bytes). Every outcome is a typed error (exit 65/66/1) or a
read identical to the original; a changed byte a reader uses never goes unnoticed."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest
from warpdata.core.errors import ExitCode, WarpError

CORPUS = Path(__file__).parents[1] / "malformed" / "manifests"
EXPECTED = json.loads((CORPUS / "expected.json").read_text())
CASES_PER_FORMAT = 500
TYPED = (ExitCode.DATA, ExitCode.NO_INPUT, ExitCode.NEGATIVE)


def _typed(e: BaseException) -> bool:
    return isinstance(e, WarpError) and e.exit_code in TYPED


# -- the corpus ------------------------------------------------------------------------------------

def _open_corpus_case(name: str, tmp_path: Path) -> None:
    raw = (CORPUS / name).read_bytes()
    kind = name.split("/")[0]
    if kind == "latest":
        from warpdata.read.dataset import _parse_latest
        from warpdata.registry.store import Store

        with pytest.raises(WarpError) as ei:
            _parse_latest(raw, "ws/name", name)
        assert type(ei.value).__name__ == EXPECTED[name]["error"]
        store = Store(str(tmp_path / "store"))
        key = tmp_path / "store" / Store.latest_key("ws/name")
        key.parent.mkdir(parents=True)
        key.write_bytes(raw)
        store.read_latest("ws/name")  # raises below
        return
    d = tmp_path / "a"
    d.mkdir()
    (d / "manifest.json").write_bytes(raw)
    if kind == "warehouse":
        import warpdata.warehouse as wh

        wh.open(d)
    else:
        from warpdata.features.reader import ShardCache

        ShardCache(d)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_malformed_manifest_corpus_raises_typed_errors(name, tmp_path):
    with pytest.raises(WarpError) as ei:
        _open_corpus_case(name, tmp_path)
    assert type(ei.value).__name__ == EXPECTED[name]["error"] or name.startswith("latest/")
    assert int(ei.value.exit_code) == EXPECTED[name]["exit_code"], ei.value.message


def test_cached_latest_pointer_with_a_bad_hash_is_ignored(tmp_path):
    from warpdata.storage.blobcache import BlobCache

    bc = BlobCache(tmp_path / "c")
    bc.put_pointer("ws/name", "ab" * 32, None)
    p = next((tmp_path / "c").rglob("name.json"))
    for bad in (5, None, ["x"], "zz"):
        doc = json.loads(p.read_text())
        doc["version"] = bad
        p.write_text(json.dumps(doc))
        assert bc.get_pointer("ws/name") is None


# -- fuzzing ---------------------------------------------------------------------------------------

def _mutate_bytes(rng: random.Random, data: bytes) -> bytes:
    b = bytearray(data)
    op = rng.randrange(5)
    if op == 0 or not b:  # flip bits in one byte
        i = rng.randrange(max(1, len(b)))
        if b:
            b[i] ^= 1 << rng.randrange(8)
        else:
            b += b"\0"
    elif op == 1:  # truncate
        del b[rng.randrange(len(b)):]
    elif op == 2:  # overwrite a run with random bytes
        i = rng.randrange(len(b))
        n = rng.randint(1, 16)
        b[i:i + n] = bytes(rng.randrange(256) for _ in range(min(n, len(b) - i)))
    elif op == 3:  # insert
        i = rng.randrange(len(b) + 1)
        b[i:i] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 8)))
    else:  # delete a run
        i = rng.randrange(len(b))
        del b[i:i + rng.randint(1, 32)]
    return bytes(b)


_VALUES = [0, -1, 1, 2**63, 1.5, "", "x", "../x", "/etc/passwd", None, True, [], {}, [1, 2], {"a": 1}, "ab" * 32]


def _leaves(doc, path=()):
    if isinstance(doc, dict):
        for k, v in doc.items():
            yield from _leaves(v, (*path, k))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            yield from _leaves(v, (*path, i))
    yield path


def _mutate_json(rng: random.Random, raw: bytes) -> bytes:
    doc = json.loads(raw)
    paths = [p for p in _leaves(doc) if p]
    path = rng.choice(paths)
    parent = doc
    for k in path[:-1]:
        parent = parent[k]
    op = rng.randrange(4)
    if op == 0 and isinstance(parent, dict):
        del parent[path[-1]]
    elif op == 0 and isinstance(parent, list):
        parent.pop(path[-1])
    elif op == 1 and isinstance(parent[path[-1]], str) and parent[path[-1]]:
        s = parent[path[-1]]
        i = rng.randrange(len(s))
        parent[path[-1]] = s[:i] + chr((ord(s[i]) + 1) % 0x7F or 65) + s[i + 1:]  # same length
    elif op == 2 and isinstance(parent[path[-1]], int) and not isinstance(parent[path[-1]], bool):
        parent[path[-1]] += rng.choice([-1, 1])
    else:
        parent[path[-1]] = rng.choice(_VALUES)
    return json.dumps(doc).encode()


def _fuzz(rng: random.Random, root: Path, files: list[str], read_all) -> dict[str, int]:
    """Mutate one file per case (restored after), read everything back; count outcomes."""
    original = {f: (root / f).read_bytes() for f in files}
    baseline = read_all(root)
    outcomes = {"typed": 0, "intact": 0}
    for case in range(CASES_PER_FORMAT):
        f = rng.choice(files)
        data = original[f]
        if f == "manifest.json" and rng.random() < 0.6:
            new = _mutate_json(rng, data)
        else:
            new = _mutate_bytes(rng, data)
        if new == data:
            continue
        (root / f).write_bytes(new)
        try:
            got = read_all(root)
        except Exception as e:
            assert _typed(e), f"case {case}: {f} mutated -> untyped {type(e).__name__}: {e}"
            outcomes["typed"] += 1
        else:
            # a read that succeeds must be exactly the original: the mutation touched nothing read
            assert _same(got, baseline), f"case {case}: {f} mutated and the read changed silently"
            outcomes["intact"] += 1
        finally:
            (root / f).write_bytes(data)
    return outcomes


def _same(a, b) -> bool:
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, np.ndarray):
        return a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b, equal_nan=True)
    return a == b


def test_fuzz_tensor_warehouse(tmp_path, record_property):
    import warpdata.warehouse as wh
    from warpdata.cli.app import main
    from warpdata.sampledata.detection import generate

    d = tmp_path / "coco"
    generate(d, count=10, seed=5, min_side=40, max_side=90, broken=False)
    (d / "t.toml").write_text('[source]\nformat = "coco"\n[transform]\ntarget_size = [16, 16]\nmax_boxes = 4\n'
                              '[output]\nroot = "../wh"\nshard_samples = 4\n')
    assert main(["-q", "etl", "--config", str(d / "t.toml")]) == 0
    root = next((tmp_path / "wh").glob("v*"))

    def read_all(p):
        with wh.open(p, verify="full") as w:
            out = [(s.image.copy(), s.boxes.copy(), s.mask.copy(), s.classes.copy(), s.frame_id, s.key, s.run_id)
                   for s in (w[i] for i in range(len(w)))]
            return {"samples": out, "classes": w.classes, "transform": w.transform}

    files = ["manifest.json"] + sorted(p.name for p in root.glob("*.twh1"))
    got = _fuzz(random.Random(1234), root, files, read_all)
    record_property("outcomes", got)  # the fuzz table (--junitxml)
    assert got["typed"] > CASES_PER_FORMAT * 0.9, got


def test_fuzz_feature_cache(tmp_path, record_property):
    from warpdata.features.reader import ShardCache
    from warpdata.features.writer import CacheSpec, build_cache
    from warpdata.sampledata.captions import generate

    generate(tmp_path / "src", count=8, seed=2)
    build_cache(CacheSpec(source=str(tmp_path / "src"), output=str(tmp_path / "cache"), size=(16, 16),
                          shard_size=3), allow_invalid=True)
    root = tmp_path / "cache"

    def read_all(p):
        with ShardCache(p, verify="full") as c:
            return {"records": [c.get(i) for i in range(len(c))], "fields": c.fields}

    files = ["manifest.json"] + sorted(p.name for p in root.glob("*.wfs"))
    got = _fuzz(random.Random(4321), root, files, read_all)
    record_property("outcomes", got)  # the fuzz table (--junitxml)
    assert got["typed"] > CASES_PER_FORMAT * 0.9, got
