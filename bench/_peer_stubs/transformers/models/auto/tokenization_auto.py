"""Benchmark stand-in (see bench/_peer_stubs/README.md)."""

import sys

sys.path.insert(0, __file__.rsplit("/transformers/", 1)[0])
from _unavailable import Unavailable


class AutoTokenizer(Unavailable):
    pass
