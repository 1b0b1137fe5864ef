"""Feature-cache config (docs/features-config.md): [[directory]] sources with num_repeats and caption
prefixes, `resolutions`, shard_size and caching_device defaults, config errors through the CLI;
num_repeats weighting in the shard-aware sampler and the big-batch loader (real DataLoader workers)."""

from __future__ import annotations

import json
import os
import sys
import textwrap
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from warpdata.core.config import ConfigSource, KeyLocator
from warpdata.core.errors import ConfigError, DataError
from warpdata.etl.quarantine import Threshold, Thresholds
from warpdata.features.reader import ShardCache
from warpdata.features.writer import CacheSpec, SourceDir, build_cache
from warpdata.partition.sampler import ShardAwareSampler

ROOT = Path(__file__).resolve().parents[2]
LOOSE = Thresholds(max_invalid_fraction=Threshold(fail=0.9), max_missing_fraction=Threshold(fail=0.9))
# three folders: 5 records x3, 7 records x1, 4 records x2 = 30 weighted samples per epoch
FOLDERS = {"a": (5, 3), "b": (7, 1), "c": (4, 2)}
SHARD = 3  # shards 1 and 3 hold records of two folders


def make_folder(root: Path, tag: str, n: int) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    for i in range(n):
        sub = root / ("sub" if i % 2 else "")
        sub.mkdir(exist_ok=True)
        Image.fromarray(np.full((20, 24, 3), 10 * i, np.uint8)).save(sub / f"{tag}{i:02d}.png")
        (sub / f"{tag}{i:02d}.txt").write_text(f"{tag} {i}\n", encoding="utf-8")
    return root


def sample_id(caption: str) -> str:
    """'prefix: a 3' -> 'a3' (the folder tag and number, whatever the prefix)."""
    tag, num = caption.rsplit(" ", 2)[-2:]
    return f"{tag}{num}"


@pytest.fixture(scope="module")
def weighted(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("weighted")
    sources = [SourceDir(str(make_folder(root / tag, tag, n)), r, f"{tag} photo: " if tag != "b" else None)
               for tag, (n, r) in FOLDERS.items()]
    build_cache(CacheSpec(source="", output=str(root / "cache"), size=(16, 16), shard_size=SHARD,
                          thresholds=LOOSE, caption_prefix="default: ", sources=sources))
    return root / "cache"


def expected_counts() -> dict[str, int]:
    return {f"{tag}{i}": r for tag, (n, r) in FOLDERS.items() for i in range(n)}


# --- the build ----------------------------------------------------------------------------

def test_directories_are_stored_once_with_their_ranges_weights_and_prefixes(weighted):
    m = json.loads((weighted / "manifest.json").read_text())
    assert m["records"] == 16 and [s["records"] for s in m["shards"]] == [3, 3, 3, 3, 3, 1]
    assert m["sources"] == [
        {"name": "d0", "first_record": 0, "records": 5, "num_repeats": 3, "caption_prefix": "a photo: "},
        {"name": "d1", "first_record": 5, "records": 7, "num_repeats": 1, "caption_prefix": "default: "},
        {"name": "d2", "first_record": 12, "records": 4, "num_repeats": 2, "caption_prefix": "c photo: "}]
    assert m["fingerprint_inputs"]["dataset"]["sources"] == [
        {"caption_prefix": "a photo: ", "num_repeats": 3}, {"caption_prefix": "default: ", "num_repeats": 1},
        {"caption_prefix": "c photo: ", "num_repeats": 2}]
    keys = (weighted / "keys.txt").read_text().split()
    assert keys[:3] == ["d0/a00.png", "d0/a02.png", "d0/a04.png"] and keys[3] == "d0/sub/a01.png"
    assert keys[5].startswith("d1/") and keys[12].startswith("d2/")
    with ShardCache(weighted) as c:
        caps = [bytes(r["caption"][:int(r["caption_len"])]).decode() for r in map(c.get, range(len(c)))]
        assert caps[0] == "a photo: a 0" and caps[5] == "default: b 0" and caps[12] == "c photo: c 0"
        assert c.record_repeats().tolist() == [3] * 5 + [1] * 7 + [2] * 4
    import pyarrow.parquet as pq

    t = pq.read_table(weighted / "records.parquet")
    assert t.column("source").to_pylist() == ["d0"] * 5 + ["d1"] * 7 + ["d2"] * 4
    assert t.column("caption").to_pylist() == caps


def test_num_repeats_is_part_of_the_identity_and_the_seal(tmp_path):
    a = make_folder(tmp_path / "a", "a", 3)
    b = make_folder(tmp_path / "b", "b", 2)

    def spec(ra: int) -> CacheSpec:
        return CacheSpec(source="", output=str(tmp_path / "cache"), size=(16, 16), thresholds=LOOSE,
                         sources=[SourceDir(str(a), ra), SourceDir(str(b))])

    first = build_cache(spec(2))
    assert build_cache(spec(2)).status == "up-to-date"
    again = build_cache(spec(4))  # only the weight changed: a reader would sample differently
    assert again.status == "built" and again.reasons == ["fingerprint changed (dataset)"]
    assert again.manifest["fingerprint"] != first.manifest["fingerprint"]
    assert again.manifest["sources"][0]["num_repeats"] == 4
    # an edited weight is caught by the content seal
    mp = tmp_path / "cache" / "manifest.json"
    doc = json.loads(mp.read_text())
    doc["sources"][0]["num_repeats"] = 9
    mp.write_text(json.dumps(doc))
    with pytest.raises(DataError, match="content_sha256"):
        ShardCache(tmp_path / "cache")


def test_single_source_config_writes_no_sources_and_samples_each_record_once(tmp_path):
    src = make_folder(tmp_path / "src", "a", 4)
    res = build_cache(CacheSpec(source=str(src), output=str(tmp_path / "c"), size=(16, 16), thresholds=LOOSE))
    assert "sources" not in res.manifest and "sources" not in res.manifest["fingerprint_inputs"]["dataset"]
    assert (tmp_path / "c" / "keys.txt").read_text().split()[0] == "a00.png"
    with ShardCache(tmp_path / "c") as c:
        assert c.sources == [] and c.record_repeats() is None


def test_one_folder_twice_or_nested_is_refused(tmp_path, cli):
    make_folder(tmp_path / "data" / "x", "x", 2)
    for second, how in (("data/x", "is the same folder as"), ("data/x/sub", "lies inside"),
                        ("data", "contains")):
        cfg = write_config(tmp_path, directories=[("data/x", 1), (second, 2)])
        r = cli("etl", "--config", cfg)
        assert r.code == 78, r.err
        assert "'directory[1].path'" in r.err and how in r.err and "num_repeats" in r.err
        assert f"{cfg}:" in r.err


# --- the sampler and the loader -------------------------------------------------------------

def test_sampler_with_all_ones_is_the_unweighted_order():
    sizes = [3, 3, 3, 2]
    for world in (1, 2, 3):
        for rank in range(world):
            kw = dict(world_size=world, rank=rank, num_workers=2, batch_size=2, seed=4, window=3)
            plain = ShardAwareSampler(sizes, **kw)
            ones = ShardAwareSampler(sizes, repeats=[1] * 11, **kw)
            for epoch in (0, 1):
                assert plain.epoch_indices(epoch).tolist() == ones.epoch_indices(epoch).tolist()
            assert plain.state_dict() == ones.state_dict()


def test_sampler_yields_each_sample_its_repeat_count_per_epoch():
    sizes = [4, 4, 3]
    repeats = np.asarray([3, 3, 1, 1, 1, 2, 2, 2, 5, 1, 1])
    for world in (1, 2, 3):
        total = Counter()
        lens = set()
        for rank in range(world):
            s = ShardAwareSampler(sizes, world_size=world, rank=rank, num_workers=2, batch_size=3, seed=1,
                                  repeats=repeats, drop_last=world == 3, pad=world != 3)
            s.set_epoch(2)
            idx = list(s)
            lens.add(len(idx))
            total.update(idx)
        assert len(lens) == 1  # every rank the same length
        n = int(repeats.sum())  # 22: even for 1 and 2 ranks; 3 ranks x full batches of 3 drop 4
        if world < 3:
            assert [total[i] for i in range(11)] == repeats.tolist()
        else:
            assert sum(total.values()) == 18 and all(total[i] <= repeats[i] for i in range(11))
        assert sum(total.values()) == lens.pop() * world <= n
    with pytest.raises(ConfigError, match="repeats"):
        ShardAwareSampler(sizes, repeats=[1] * 10)
    with pytest.raises(ConfigError, match="repeats"):
        ShardAwareSampler(sizes, repeats=[0] + [1] * 10)


def test_sampler_state_covers_the_weights():
    a = ShardAwareSampler([2, 2], repeats=[1, 1, 2, 1])
    b = ShardAwareSampler([2, 2], repeats=[1, 2, 1, 1])
    with pytest.raises(ConfigError, match="different shards, weights"):
        b.load_state_dict(a.state_dict())


def _ids(step) -> list[str]:
    from warpdata.features.torch import decode_caption

    return [sample_id(decode_caption(c, n)) for c, n in zip(step.batch["caption"], step.batch["caption_len"],
                                                             strict=True)]


def _epoch(cache: Path, *, world: int, rank: int, seed: int, epoch: int, num_workers: int = 2,
           drop_last: bool = False, **kw) -> tuple[int, list[str]]:
    from warpdata.features.torch import BigBatchLoader

    loader = BigBatchLoader(cache, micro_batch_size=2, accumulation_steps=2, num_workers=num_workers,
                            world_size=world, rank=rank, seed=seed, drop_last=drop_last,
                            fields=["caption", "caption_len"], persistent_workers=False, **kw)
    loader.set_epoch(epoch)
    steps = list(loader)
    assert len(steps) == len(loader)
    return len(steps), [i for s in steps for i in _ids(s)]


@pytest.mark.parametrize("world", [1, 2, 3])
def test_loader_yields_each_record_num_repeats_times_with_equal_steps_per_rank(weighted, world):
    """30 weighted samples split evenly over 1, 2 and 3 ranks: exact counts, equal step counts."""
    steps, seen = set(), Counter()
    for rank in range(world):
        n, ids = _epoch(weighted, world=world, rank=rank, seed=11, epoch=1)
        steps.add(n)
        seen.update(ids)
        assert len(ids) == 30 // world
    assert len(steps) == 1 and steps.pop() == -(-(30 // world) // 4)
    assert dict(seen) == expected_counts()
    # drop_last: full big batches only, still the same number on every rank
    full = {_epoch(weighted, world=world, rank=r, seed=11, epoch=1, drop_last=True)[0] for r in range(world)}
    assert full == {(30 // world) // 4}


def test_loader_order_is_deterministic_per_seed_and_epoch(weighted):
    a = _epoch(weighted, world=2, rank=1, seed=3, epoch=0)[1]
    assert a == _epoch(weighted, world=2, rank=1, seed=3, epoch=0)[1]
    assert a != _epoch(weighted, world=2, rank=1, seed=4, epoch=0)[1]
    assert a != _epoch(weighted, world=2, rank=1, seed=3, epoch=1)[1]


def test_loader_without_repeat_sees_every_record_once(weighted):
    _, ids = _epoch(weighted, world=1, rank=0, seed=0, epoch=0, num_workers=0, repeat=False)
    assert Counter(ids) == Counter({k: 1 for k in expected_counts()})


# --- the config through the CLI -------------------------------------------------------------

def write_config(tmp_path: Path, *, directories=None, source_path: str | None = None,
                 transform: str = "resolution = 16", encoder: str = 'name = ""', extra: str = "",
                 name: str = "c.toml") -> Path:
    parts = ['[source]\nformat = "captions"\ncaption_prefix = "cfg: "']
    if source_path is not None:
        parts[0] += f'\npath = "{source_path}"'
    for d in directories or []:
        path, reps, *prefix = d
        parts.append(f'[[directory]]\npath = "{path}"\nnum_repeats = {reps}'
                     + (f'\ncaption_prefix = "{prefix[0]}"' if prefix else ""))
    parts += [f"[transform]\n{transform}", f"[encoder]\n{encoder}",
              "[validation]\nmax_invalid_fraction = { fail = 0.9 }\nmax_missing_fraction = { fail = 0.9 }",
              '[output]\npath = "cache"']
    p = tmp_path / name
    p.write_text(extra + "\n\n".join(parts) + "\n")
    return p


def test_cli_builds_directories_with_weights_and_prefixes(tmp_path, cli):
    make_folder(tmp_path / "a", "a", 3)
    make_folder(tmp_path / "b", "b", 2)
    cfg = write_config(tmp_path, directories=[("a", 4, "A: "), ("b", 1)])
    r = cli("etl", "--config", cfg, "--json")
    assert r.code == 0, r.err
    doc = r.json()
    assert doc["records"] == 5 and doc["samples_per_epoch"] == 3 * 4 + 2
    assert [(s["name"], s["records"], s["num_repeats"], s["caption_prefix"], s["path"]) for s in doc["sources"]] \
        == [("d0", 3, 4, "A: ", str(tmp_path / "a")), ("d1", 2, 1, "cfg: ", str(tmp_path / "b"))]
    r = cli("inspect", str(tmp_path / "cache"), "--json", "--head", "5")
    assert r.code == 0, r.err
    rep = r.json()
    assert rep["samples_per_epoch"] == 14 and [s["num_repeats"] for s in rep["sources"]] == [4, 1]
    assert [row["caption"] for row in rep["tables"]["records"]] == ["A: a 0", "A: a 2", "A: a 1", "cfg: b 0",
                                                                    "cfg: b 1"]
    r = cli("etl", "--config", cfg)  # human output names the weights
    assert r.code == 0 and "d0 3x4, d1 2x1 = 14 samples/epoch" in r.err


@pytest.mark.parametrize("spelling,size", [("resolution = 32", [32, 32]), ("resolutions = [32]", [32, 32]),
                                           ("resolutions = [[32, 48]]", [32, 48]),
                                           ("resolution = [32, 48]", [32, 48]),
                                           ("resolutions = [[30, 50]]", [32, 48])])
def test_resolution_spellings(tmp_path, cli, spelling, size):
    make_folder(tmp_path / "src", "a", 2)
    cfg = write_config(tmp_path, source_path="src", transform=spelling)
    r = cli("etl", "--config", cfg, "--json")
    assert r.code == 0, r.err
    assert r.json()["target_size"] == size


def test_resolutions_and_resolution_spell_the_same_cache(tmp_path, cli):
    make_folder(tmp_path / "src", "a", 3)
    a = write_config(tmp_path, source_path="src", transform="resolution = [32, 48]", name="a.toml")
    b = write_config(tmp_path, source_path="src", transform="resolutions = [[32, 48]]", name="b.toml")
    ra = cli("etl", "--config", a, "--json")
    rb = cli("etl", "--config", b, "--json")
    assert ra.code == rb.code == 0 and rb.json()["status"] == "up-to-date"
    assert ra.json()["fingerprint"] == rb.json()["fingerprint"]


BAD_CONFIGS = [
    # (transform / extra text, directories, source path, exit code, what the message names)
    ("resolution = 16\nresolutions = [16]", None, "src", 78, ["'transform.resolution'", "'transform.resolutions'"]),
    ("interpolation = \"bicubic\"", None, "src", 78, ["missing required key 'transform.resolution'", "resolutions"]),
    ("resolutions = []", None, "src", 78, ["'transform.resolutions' must list exactly one size"]),
    ("resolutions = [256, 256]", None, "src", 78, ["'transform.resolutions' must list exactly one size",
                                                   "[[height, width]]"]),
    ("resolutions = [[256, 256], [512, 512]]", None, "src", 78, ["'transform.resolutions'"]),
    ("resolutions = [[256, 256, 3]]", None, "src", 78, ["'transform.resolutions[0]'"]),
    ("resolutions = [[256]]", None, "src", 78, ["'transform.resolutions[0]'"]),
    ('resolutions = ["256"]', None, "src", 78, ["transform.resolutions", "integer"]),
    ("resolutions = [0]", None, "src", 78, ["transform.resolutions"]),
    ("resolutions = 256", None, "src", 78, ["'transform.resolutions' must be an array"]),
    ("resolution = 16\nresolutons = [16]", None, "src", 78, ["unknown key 'transform.resolutons'",
                                                             "did you mean 'transform.resolutions'"]),
    ("resolution = 16", [("a", 0)], None, 78, ["'directory[0].num_repeats' must be an integer from 1"]),
    ("resolution = 16", [("a", "2")], None, 78, ["'directory[0].num_repeats' must be an integer"]),
    ("resolution = 16", [("a", 1.5)], None, 78, ["'directory[0].num_repeats' must be an integer"]),
    ("resolution = 16", [("a", "true")], None, 78, ["'directory[0].num_repeats' must be an integer"]),
    ("resolution = 16", [("a", 10**7)], None, 78, ["'directory[0].num_repeats' must be an integer from 1 to"]),
    ("resolution = 16", [("a", 1), ("b", 2)], "src", 78, ["'source.path'", "[[directory]]"]),
    ("resolution = 16", None, None, 78, ["missing required key 'source.path'", "[[directory]]"]),
]


@pytest.mark.parametrize("transform,dirs,source_path,code,names", BAD_CONFIGS)
def test_config_errors_name_the_key(tmp_path, cli, transform, dirs, source_path, code, names):
    make_folder(tmp_path / "src", "s", 1)
    make_folder(tmp_path / "a", "a", 1)
    make_folder(tmp_path / "b", "b", 1)
    cfg = write_config(tmp_path, directories=dirs, source_path=source_path, transform=transform)
    if dirs and dirs[0][1] == "2":
        cfg.write_text(cfg.read_text().replace("num_repeats = 2", 'num_repeats = "2"'))
    r = cli("etl", "--config", cfg)
    assert r.code == code, r.err
    for name in names:
        assert name in r.err, (name, r.err)
    assert f"{cfg}" in r.err
    assert not (tmp_path / "cache").exists()  # nothing written


DIRS_A = '[[directory]]\npath = "a"\n'


@pytest.mark.parametrize("head,tail,key,hint", [
    # (text before the config's tables, text after them, the key named, what the message adds)
    ("", DIRS_A + "num_repeat = 2\n", "directory[0].num_repeat", "did you mean 'directory[0].num_repeats'"),
    ("", DIRS_A + '[[directory]]\npath = "b"\ncaption_prefx = "x"\n', "directory[1].caption_prefx",
     "did you mean 'directory[1].caption_prefix'"),
    ("", DIRS_A + "[[directory]]\nnum_repeats = 2\n", "directory[1].path", "missing required key"),
    ("", '[directory]\npath = "a"\n', "directory", "must be an array"),
    ('directory = ["a"]\n', "", "directory[0]", "must be a table"),
    ("caching_batch_size = 8\n", DIRS_A, "caching_batch_size", "[encoder] caching_batch_size"),
    ("resolutions = [256]\n", DIRS_A, "resolutions", "[transform] resolutions"),
    ("sd3_shard_size = 512\n", DIRS_A, "sd3_shard_size", "[cache] shard_size"),
    ('caching_device = "auto"\n', DIRS_A, "caching_device", "[encoder] caching_device"),
    ("num_repeats = 2\n", DIRS_A, "num_repeats", "inside each [[directory]]"),
    ('training_type = "sd3_light_pretrain"\n', DIRS_A, "training_type", "valid keys here"),
])
def test_unknown_and_misplaced_keys_are_errors_naming_the_key(tmp_path, cli, head, tail, key, hint):
    make_folder(tmp_path / "a", "a", 1)
    make_folder(tmp_path / "b", "b", 1)
    cfg = write_config(tmp_path)
    text = head + cfg.read_text() + "\n" + tail
    cfg.write_text(text)
    r = cli("etl", "--config", cfg)
    assert r.code == 78, r.err
    assert f"'{key}'" in r.err and hint in r.err, r.err
    assert not (tmp_path / "cache").exists()
    # the message points at the line of the offending key (or its table)
    leaf = key.rsplit(".", 1)[-1].split("[")[0]
    lines = text.splitlines()
    if key.startswith("directory[1]"):
        want = [i for i, ln in enumerate(lines, 1) if ln == "[[directory]]"][1]
        want = next((i for i, ln in enumerate(lines, 1) if i > want and ln.startswith(leaf + " ")), want)
    else:
        want = next(i for i, ln in enumerate(lines, 1) if ln.startswith((leaf + " ", f"[{leaf}]", f"[[{leaf}]]")))
    assert f"{cfg}:{want}:" in r.err, (want, r.err)


def test_input_override_conflicts_with_directories(tmp_path, cli):
    make_folder(tmp_path / "a", "a", 1)
    cfg = write_config(tmp_path, directories=[("a", 2)])
    r = cli("etl", "--config", cfg, "--input", str(tmp_path / "a"))
    assert r.code == 2 and "--input" in r.err and "[[directory]]" in r.err


def test_shard_size_defaults_to_caching_batch_size(tmp_path, cli):
    make_folder(tmp_path / "src", "a", 7)
    cfg = write_config(tmp_path, source_path="src", encoder='name = "pool8-hash"\ncaching_batch_size = 3\n'
                                                            'caching_device = "cpu"')
    r = cli("etl", "--config", cfg, "--json")
    assert r.code == 0, r.err
    doc = r.json()
    assert doc["shard_size"] == 3 and doc["shards"] == 3
    cfg.write_text(cfg.read_text().replace("[cache]", "") + "\n[cache]\nshard_size = 5\n")
    doc = cli("etl", "--config", cfg, "--json").json()
    assert doc["shard_size"] == 5 and doc["shards"] == 2


# --- caching_device ---------------------------------------------------------------------------

AUTOCAST_PLUGIN = textwrap.dedent('''
    import numpy as np
    import torch
    from warpdata.formats.featshard import FieldSpec

    class Enc:
        def __init__(self, device, dtype):
            self.device, self.dtype = device, dtype
        def fields(self, h, w):
            return [FieldSpec("autocast", "bool"), FieldSpec("on_cuda", "bool"), FieldSpec("mean", "float32")]
        def encode(self, pixels, captions):
            n = len(captions)
            x = pixels.float()
            y = x.flatten(1) @ torch.ones(x[0].numel(), 1, device=x.device) / x[0].numel()  # matmul: autocast's
            return {"autocast": np.full(n, torch.is_autocast_enabled("cuda"), bool),
                    "on_cuda": np.full(n, pixels.is_cuda, bool),
                    "mean": y[:, 0].float()}
        def identity(self):
            return {"name": "autocast-probe", "version": "1", "weights_sha256": None, "dtype": self.dtype}

    def factory(device, dtype):
        return Enc(device, dtype)
''')


@pytest.fixture
def autocast_plugin(tmp_path, monkeypatch):
    d = tmp_path / "plug"
    d.mkdir()
    name = f"warp_autocast_probe_{os.getpid()}_{abs(hash(str(tmp_path))) % 10**8}"
    (d / f"{name}.py").write_text(AUTOCAST_PLUGIN)
    monkeypatch.syspath_prepend(str(d))
    yield f"{name}:factory"
    sys.modules.pop(name, None)


def _auto_build(tmp_path, cli, encoder: str) -> tuple[dict, dict, list[dict]]:
    make_folder(tmp_path / "src", "a", 4)
    cfg = write_config(tmp_path, source_path="src", encoder=f'name = "{encoder}"\ncaching_device = "auto"')
    r = cli("etl", "--config", cfg, "--json")
    assert r.code == 0, r.err
    metrics = json.loads((tmp_path / "cache" / "metrics.json").read_text())
    with ShardCache(tmp_path / "cache") as c:
        recs = [c.get(i) for i in range(len(c))]
    return r.json(), metrics, recs


def test_caching_device_auto_is_cpu_without_cuda_and_recorded(tmp_path, cli, autocast_plugin):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA: test_caching_device_auto_uses_cuda_under_autocast covers it")
    doc, metrics, recs = _auto_build(tmp_path, cli, autocast_plugin)
    assert doc["metrics"]["device"] == metrics["device"] == "cpu"
    assert metrics["caching_device"] == "auto"
    assert not any(r["autocast"] or r["on_cuda"] for r in recs)
    assert json.loads((tmp_path / "cache" / "manifest.json").read_text())[
        "fingerprint_inputs"]["encoder"]["device_type"] == "cpu"


@pytest.mark.gpu
def test_caching_device_auto_uses_cuda_under_autocast(tmp_path, cli, autocast_plugin):
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    doc, metrics, recs = _auto_build(tmp_path, cli, autocast_plugin)
    assert doc["metrics"]["device"] == metrics["device"] == "cuda" and metrics["caching_device"] == "auto"
    assert all(bool(r["autocast"]) and bool(r["on_cuda"]) for r in recs)
    assert json.loads((tmp_path / "cache" / "manifest.json").read_text())[
        "fingerprint_inputs"]["encoder"]["device_type"] == "cuda"


# --- documentation and examples ----------------------------------------------------------------

def test_examples_validate_and_show_every_key():
    from warpdata.core.config import describe, parse_toml
    from warpdata.features import etl

    texts = []
    for name in ("captions.toml", "captions-multi.toml"):
        data, source = parse_toml(ROOT / "examples" / name)
        etl.check_config(data, source)
        texts.append((ROOT / "examples" / name).read_text())
    both = "\n".join(texts)
    for key, *_ in describe(etl.SCHEMA) + describe(etl.DIRECTORY_SCHEMA):
        if key.startswith("validation."):
            continue  # thresholds: examples/captions.toml shows the two that apply to captions
        leaf = key.rsplit(".", 1)[-1]
        assert f"{leaf} =" in both or f"[[{leaf}]]" in both, f"examples/captions*.toml do not show {key}"


def test_multi_example_builds(tmp_path, cli):
    """examples/captions-multi.toml, pointed at folders made here, builds and reports its weights."""
    text = (ROOT / "examples" / "captions-multi.toml").read_text()
    data_dirs = [line.split('"')[1] for line in text.splitlines() if line.startswith("path = ") and "cache" not in line]
    for i, d in enumerate(data_dirs):
        make_folder(tmp_path / d, f"t{i}", 2)
    (tmp_path / "captions-multi.toml").write_text(text.replace('name = "pool8-hash"', 'name = ""'))
    r = cli("etl", "--config", tmp_path / "captions-multi.toml", "--json", "--allow-invalid")
    assert r.code == 0, r.err
    assert [s["records"] for s in r.json()["sources"]] == [2] * len(data_dirs)


def test_mapping_doc_names_every_design_key():
    doc = (ROOT / "docs" / "features-config.md").read_text()
    for design in ("[[directory]]", "num_repeats", "caption_prefix", "resolutions", "caching_batch_size",
                   "caching_device", "sd3_shard_size"):
        assert f"`{design}" in doc, design


def test_locator_indexes_arrays_of_tables():
    loc = KeyLocator.from_text('[[d]]\npath = "a"\n\n[[d]]\npath = "b"\nn = 2\n[t]\nx = 1\n')
    assert loc.line("d.path") == 2 and loc.line("d[0].path") == 2
    assert loc.line("d[1].path") == 5 and loc.line("d[1].n") == 6 and loc.line("d[1].zzz") == 4
    assert loc.line("t.x") == 8
    assert ConfigSource("c.toml", '[[d]]\np = 1\n[[d]]\np = 2\n').where("d[1].p") == "c.toml:4"
