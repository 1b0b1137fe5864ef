"""Benchmark stand-in (see bench/_peer_stubs/README.md)."""

import sys

sys.path.insert(0, __file__.rsplit("/torchvision/", 1)[0])
from _unavailable import Unavailable


class VisionDataset(Unavailable):
    pass


class CIFAR10(Unavailable):
    pass
