"""Shared stand-in: any use raises (see ../README.md)."""


class Unavailable:
    def __init__(self, *args, **kwargs):
        raise ImportError(f"{type(self).__name__} is a benchmark stand-in; install the real package")

    @classmethod
    def from_pretrained(cls, *args, **kwargs):
        raise ImportError("benchmark stand-in; install the real package")


def unavailable(*args, **kwargs):
    raise ImportError("benchmark stand-in; install the real package")
