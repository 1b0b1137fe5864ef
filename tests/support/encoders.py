"""Embedding encoder plugins for the embeddings tests: real encoders, loaded by module path.

``support.encoders:CountingText`` embeds text like the built-in ``hash-text``
and records every call (how many items each) in :data:`CALLS`, so a test can
show which rows were encoded. ``support.encoders:RawFloat32`` reads a binary
column of packed float32 vectors (the column holds the embedding already).
"""

from __future__ import annotations

from typing import Any

from warpdata.registry.embeddings import HashTextEncoder

CALLS: list[list[str]] = []  # one entry per embed() call: the items it was given


class CountingText(HashTextEncoder):
    def embed(self, items: list[str]):
        CALLS.append(list(items))
        return super().embed(items)

    def identity(self) -> dict[str, Any]:
        return {**super().identity(), "name": "counting-text"}


class RawFloat32:
    def __init__(self, *, device: str = "cpu", dim: int = 64) -> None:
        self.dim = int(dim)

    def embed(self, items: list[bytes]):
        import numpy as np

        return np.frombuffer(b"".join(items), np.float32).reshape(len(items), self.dim)

    def identity(self) -> dict[str, Any]:
        return {"name": "raw-float32", "dim": self.dim}
