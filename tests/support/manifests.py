"""Helpers for manifest tests. No tests live here."""

from __future__ import annotations

import json

from warpdata.core.canonical import canonical_json
from warpdata.registry.manifest import SEAL_KEY


def unsealed(data: bytes) -> bytes:
    """A manifest's canonical bytes without ``metadata.seal_sha256``: the form written before the seal."""
    doc = json.loads(data)
    doc["metadata"].pop(SEAL_KEY)
    return canonical_json(doc)
