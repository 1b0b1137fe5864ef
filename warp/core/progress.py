"""Progress reporting without printing: the library reports, the CLI renders.

Library code wraps long loops in :func:`progress` and calls ``advance(n)`` on what it
yields. Nothing is drawn unless a front end installed a factory with
:func:`set_progress_factory` (``warp`` installs a Rich bar on stderr that shows only on a
terminal); library users get a no-op, or install their own (tqdm, a logger). Warnings and
notes go through :mod:`logging` under the ``warpdata`` logger, never to a stream directly.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any, Protocol


class Bar(Protocol):
    def advance(self, n: float = 1) -> None: ...
    def update(self, **kwargs: Any) -> None: ...


class _NoBar:
    def advance(self, n: float = 1) -> None:
        pass

    def update(self, **kwargs: Any) -> None:
        pass


Factory = Callable[[str, "float | None", str], AbstractContextManager[Bar]]
_factory: Factory | None = None


def set_progress_factory(factory: Factory | None) -> Factory | None:
    """Install ``factory(description, total, unit)`` (a context manager yielding a bar); returns the old one."""
    global _factory
    old, _factory = _factory, factory
    return old


@contextmanager
def progress(description: str, total: float | None = None, unit: str = "it") -> Iterator[Bar]:
    """A progress bar from the installed factory, or a no-op bar."""
    if _factory is None:
        yield _NoBar()
        return
    with _factory(description, total, unit) as bar:
        yield bar
