"""Benchmark stand-in (see bench/_peer_stubs/README.md)."""

import sys

sys.path.insert(0, __file__.rsplit("/torchvision/", 1)[0])
from _unavailable import unavailable as to_tensor  # noqa: F401
