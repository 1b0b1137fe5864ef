"""Feature cache for pretraining: captioned media → fixed-size WFS1 shards → bounded-memory reads.

Build (``warp etl`` with ``[source] format = "captions"``, :mod:`.etl`):
:mod:`.scan` finds media with same-name captions and quarantines the rest,
:mod:`.transform` center-crops and resizes to one size (multiples of 16),
:mod:`.encoders` loads and batches encoder plugins, :mod:`.writer` writes the
shards (``ShardCacheWriter``) and a fingerprinted manifest, rebuilding when
the fingerprint changes. Read: :mod:`.reader` (``ShardCache``, an LRU of
memory-mapped shards) and :mod:`.torch` (Dataset + shard-aware big-batch
loader). :mod:`.inspect` serves ``warp inspect``. The shard format is
``docs/formats/feature-shard.md`` (:mod:`warpdata.formats.featshard`).
"""
