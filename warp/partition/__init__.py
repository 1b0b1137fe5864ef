"""warpdata.partition: one partitioning for every loader, and the digests that prove an epoch's order.

``combine_digests(states)`` (docs/partitioning.md, "Digests") combines the final resume
states of every rank into the epoch's digest, which ``warp order`` prints.
"""

from warpdata.partition.digest import combine_digests, digest_report

__all__ = ["combine_digests", "digest_report"]
