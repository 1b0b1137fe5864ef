"""Lineage: where a sample came from, what changed between versions, the dataset card.

===================== ============================================================
module                what it answers (docs/lineage.md)
===================== ============================================================
``lineage.why``       everything one sample came from (``warp why``)
``lineage.history``   a published dataset's versions, dated and sized (``warp ls --versions``)
``lineage.diff``      rows and members added, removed, changed (``warp diff``)
``lineage.card``      the Markdown dataset card (``warp card``, ``warp publish --card``)
===================== ============================================================

The library never prints: each module returns a result that ``commands/`` renders.
"""
