"""Feature cache on the training side: Dataset, shard-aware big-batch loader, resume; CLI."""

from __future__ import annotations

import pickle
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch
from warpdata.etl.quarantine import Threshold, Thresholds
from warpdata.features.reader import ShardCache
from warpdata.features.torch import BigBatchLoader, FeatureCacheDataset, decode_caption, split_batch
from warpdata.features.writer import CacheSpec, build_cache

N = 37
SHARD = 5


def _ids(step_or_batch) -> list[int]:
    b = step_or_batch.batch if hasattr(step_or_batch, "batch") else step_or_batch
    return [int(decode_caption(c, n).split()[1]) for c, n in zip(b["caption"], b["caption_len"], strict=True)]


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> Path:
    from PIL import Image

    root = tmp_path_factory.mktemp("loader")
    src = root / "src"
    src.mkdir()
    for i in range(N):
        Image.fromarray(np.full((20, 24, 3), i, np.uint8)).save(src / f"{i:03d}.png")
        (src / f"{i:03d}.txt").write_text(f"sample {i}")
    build_cache(CacheSpec(source=str(src), output=str(root / "cache"), size=(16, 16), shard_size=SHARD,
                          encoder="pool8-hash", caching_device="cpu", caching_batch_size=8,
                          thresholds=Thresholds(max_invalid_fraction=Threshold(fail=0.5))))
    return root / "cache"


def test_dataset_holds_only_the_cache_handle(cache):
    ds = FeatureCacheDataset(cache, fields=["latents", "caption", "caption_len"])
    one = ds[3]
    assert set(one) == {"latents", "caption", "caption_len"} and one["latents"].dtype == torch.float16
    batch = ds[[5, 0, 36]]
    assert _ids(batch) == [5, 0, 36]
    assert ds.cache.resident()  # shards are mapped in this process...
    blob = pickle.dumps(ds)
    assert len(blob) < 20_000  # ...but only the path, settings and manifest cross to workers
    clone = pickle.loads(blob)
    assert clone.cache.resident() == [] and _ids(clone[[36]]) == [36]


def test_big_batches_split_into_micro_batches(cache):
    loader = BigBatchLoader(cache, micro_batch_size=3, accumulation_steps=2, num_workers=0, shuffle=False,
                            drop_last=False)
    steps = list(loader)
    assert len(steps) == len(loader) == -(-N // 6)
    first = steps[0]
    assert len(first) == 6 and [len(m["latents"]) for m in first.micro_batches] == [3, 3]
    for m, part in zip(first.micro_batches, torch.split(first.batch["latents"], 3), strict=True):
        assert m["latents"].data_ptr() == part.data_ptr()  # views, not copies
    assert [len(m["latents"]) for m in steps[-1].micro_batches] == [1]  # 37 = 6*6 + 1
    assert [i for s in steps for i in _ids(s)] == list(range(N))  # no shuffle: shard order
    assert split_batch({}, 2) == []


@pytest.mark.parametrize("num_workers", [0, 2])
def test_pad_gives_equal_length_across_ranks_repeating_one_sample(cache, num_workers):
    world = 2
    per_rank = {}
    for rank in range(world):
        loader = BigBatchLoader(cache, micro_batch_size=2, accumulation_steps=2, num_workers=num_workers,
                                world_size=world, rank=rank, seed=7, pad=True,
                                fields=["caption", "caption_len"], persistent_workers=False)
        loader.set_epoch(3)
        per_rank[rank] = [i for s in loader for i in _ids(s)]
        assert len(loader) == -(-19 // 4)
    assert len(per_rank[0]) == len(per_rank[1]) == -(-N // world)
    counts = Counter(per_rank[0] + per_rank[1])
    assert set(counts) == set(range(N))
    assert sum(counts.values()) == N + 1 and sorted(counts.values())[-1] == 2  # pad repeats one sample


def test_drop_last_false_reads_every_sample_exactly_once(cache):
    seen = []
    for rank in range(2):
        loader = BigBatchLoader(cache, micro_batch_size=2, accumulation_steps=2, num_workers=0,
                                world_size=2, rank=rank, seed=7, drop_last=False, fields=["caption", "caption_len"])
        seen += [i for s in loader for i in _ids(s)]
    assert sorted(seen) == list(range(N))


def test_drop_last_keeps_steps_equal_and_full(cache):
    lens = []
    for rank in range(3):
        loader = BigBatchLoader(cache, micro_batch_size=2, accumulation_steps=2, num_workers=0, world_size=3,
                                rank=rank, fields=["caption", "caption_len"])
        steps = list(loader)
        lens.append(len(steps))
        assert all(len(s) == 4 for s in steps)
    assert lens == [3, 3, 3]  # 37 // (3 ranks x 4) = 3 full big batches per rank


def test_workers_read_their_own_shards(cache):
    """Each DataLoader worker's batches come from a contiguous run of shards (locality)."""
    loader = BigBatchLoader(cache, micro_batch_size=4, num_workers=2, seed=1, drop_last=False,
                            fields=["caption", "caption_len"], persistent_workers=False)
    steps = list(loader)
    worker_shards = [set(), set()]
    for k, s in enumerate(steps):
        worker_shards[k % 2].update(i // SHARD for i in _ids(s))
    assert len(worker_shards[0] & worker_shards[1]) <= 1  # at most the shard cut at the boundary


def test_epochs_reshuffle_deterministically(cache):
    def order(epoch, seed=0):
        loader = BigBatchLoader(cache, micro_batch_size=4, num_workers=0, seed=seed, drop_last=False,
                                fields=["caption", "caption_len"])
        loader.set_epoch(epoch)
        return [i for s in loader for i in _ids(s)]

    assert order(0) == order(0)
    assert order(0) != order(1)
    assert sorted(order(1)) == list(range(N))


@pytest.mark.parametrize("num_workers", [0, 2])
def test_resume_mid_epoch_continues_where_training_stopped(cache, num_workers):
    kw = dict(micro_batch_size=2, accumulation_steps=2, num_workers=num_workers, seed=5, drop_last=False,
              fields=["caption", "caption_len"], persistent_workers=False)
    full = BigBatchLoader(cache, **kw)
    full.set_epoch(2)
    expected = [_ids(s) for s in full]
    a = BigBatchLoader(cache, **kw)
    a.set_epoch(2)
    it = iter(a)
    done = [_ids(next(it)) for _ in range(3)]
    state = a.state_dict()
    assert state["step"] == 3 and state["sampler"]["consumed"] == 12
    del it
    b = BigBatchLoader(cache, **kw)
    b.load_state_dict(state)
    rest = [_ids(s) for s in b]
    assert b.epoch == 2
    flat = lambda xs: [i for x in xs for i in x]  # noqa: E731
    assert flat(done + rest) == flat(expected)


def test_resume_state_from_another_seed_is_refused_another_batch_size_continues(cache):
    from warpdata.core.errors import ConfigError

    kw = dict(num_workers=0, drop_last=False, fields=["caption", "caption_len"])
    a = BigBatchLoader(cache, micro_batch_size=2, **kw)
    with pytest.raises(ConfigError, match="seed"):
        BigBatchLoader(cache, micro_batch_size=2, seed=1, **kw).load_state_dict(a.state_dict())
    it = iter(a)
    head = [i for _ in range(4) for i in _ids(next(it))]
    b = BigBatchLoader(cache, micro_batch_size=3, **kw)  # a one-rank run's state is every rank's state
    b.load_state_dict(a.state_dict())
    rest = [i for s in b for i in _ids(s)]
    assert sorted(head + rest) == list(range(N))


def test_training_loop_example(cache):
    """The README's loop: gradient accumulation over micro-batches of cached features."""
    torch.manual_seed(0)
    model = torch.nn.Linear(64, 3 * 2 * 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = BigBatchLoader(cache, micro_batch_size=4, accumulation_steps=2, num_workers=0)
    losses = []
    for epoch in range(3):
        loader.set_epoch(epoch)
        for step in loader:
            opt.zero_grad()
            for mb in step.micro_batches:
                pred = model(mb["pooled_prompt_embeds"].float())
                loss = torch.nn.functional.mse_loss(pred, mb["latents"].float().flatten(1))
                (loss / len(step.micro_batches)).backward()
            opt.step()
            losses.append(loss.item())
    assert losses[-1] < losses[0]


# --- CLI ----------------------------------------------------------------------------------

def test_cli_etl_build_reuse_and_inspect(tmp_path, cli):
    from warpdata.sampledata.captions import generate

    info = generate(tmp_path / "d", count=12)
    cfg = info["config"]
    r = cli("etl", "--config", cfg, "--json")
    assert r.code == 0, r.err
    doc = r.json()
    assert doc["kind"] == "feature-cache" and doc["status"] == "built"
    assert doc["records"] == 12 + int(info["video"])
    assert doc["quarantine"]["by_reason"] == {"decode-error": 1, "empty-caption": 1, "missing-caption": 1,
                                              "truncated": 1, "unsupported-format": 1}
    assert doc["fields"]["latents"] == {"dtype": "float16", "shape": [3, 8, 8]}
    assert "warning:" in r.err  # planted failures exceed the warn level
    r = cli("etl", "--config", cfg, "-q")
    assert r.code == 0 and r.out.strip() == doc["path"]
    r = cli("etl", "--config", cfg, "--json")
    assert r.json()["status"] == "up-to-date"
    r = cli("inspect", doc["path"], "--json", "--verify", "--head", "2")
    assert r.code == 0, r.err
    rep = r.json()
    assert rep["kind"] == "feature-cache" and rep["fingerprint"] == doc["fingerprint"]
    assert rep["shards"] == doc["shards"] and rep["verified"] is True
    assert rep["quarantine"]["by_reason"]["truncated"] == 1
    assert len(rep["tables"]["records"]) == 2
    shard = sorted(Path(doc["path"]).glob("shard-*.wfs"))[0]
    r = cli("inspect", str(shard), "--json")
    assert r.code == 0 and r.json()["kind"] == "feature-shard"
    data = bytearray(shard.read_bytes())
    data[-33] ^= 1  # the last byte of the CRC table (before the 32-byte trailer)
    shard.write_bytes(bytes(data))
    r = cli("inspect", doc["path"], "--verify")
    assert r.code == 1 and "trailer CRC-32C mismatch" in r.err


def test_cli_etl_threshold_failure_and_config_errors(tmp_path, cli):
    from warpdata.sampledata.captions import generate

    info = generate(tmp_path / "d", count=6)
    cfg = Path(info["config"])
    strict = cfg.read_text().replace("fail = 0.5", "fail = 0.01")
    cfg.write_text(strict)
    r = cli("etl", "--config", str(cfg))
    assert r.code == 65 and "failed validation" in r.err and "--allow-invalid" in r.err
    assert not (tmp_path / "d" / "cache").exists()
    r = cli("etl", "--config", str(cfg), "--allow-invalid", "--json")
    assert r.code == 0 and r.json()["verdict"] == "fail"
    cfg.write_text(strict.replace("resolution = 64", "resolutoin = 64"))
    r = cli("etl", "--config", str(cfg))
    assert r.code == 78 and "resolutoin" in r.err and "resolution" in r.err and f"{cfg}:" in r.err
    cfg.write_text(strict.replace('name = "pool8-hash"', 'name = "no-such-encoder"'))
    r = cli("etl", "--config", str(cfg), "--clear")
    assert r.code == 78 and "unknown encoder" in r.err


def test_shard_cache_len_and_fields(cache):
    with ShardCache(cache) as c:
        assert len(c) == N and c.num_shards == -(-N // SHARD)
        assert set(c.field_names()) >= {"latents", "prompt_embeds", "prompt_mask", "caption", "size"}


def test_spawned_workers_reopen_the_cache_lazily(cache):
    """Spawn pickles the dataset: only the handle travels, each worker maps its own shards."""
    loader = BigBatchLoader(cache, micro_batch_size=8, num_workers=1, shuffle=False, drop_last=False,
                            fields=["caption", "caption_len"], multiprocessing_context="spawn",
                            persistent_workers=False)
    loader.dataset.cache.get(0)  # the parent has a shard mapped; it must not be pickled
    assert [i for s in loader for i in _ids(s)] == list(range(N))


def test_cli_etl_reads_warp_workers(tmp_path, cli, monkeypatch):
    from warpdata.sampledata.captions import generate

    info = generate(tmp_path / "d", count=12)
    monkeypatch.setenv("WARP_WORKERS", "many")
    r = cli("etl", "--config", info["config"])
    assert r.code == 78 and "WARP_WORKERS" in r.err
    monkeypatch.setenv("WARP_WORKERS", "1")
    (tmp_path / "d" / "cache").mkdir()  # an empty directory is fair game
    r = cli("etl", "--config", info["config"], "--json")
    assert r.code == 0 and r.json()["rebuild_reasons"] == ["new cache"]
    metrics = (tmp_path / "d" / "cache" / "metrics.json").read_text()
    assert '"workers": 1' in metrics
