"""Tile-compression backends, by name.

A backend turns one slab (a tile-height of dimension 0, see
:class:`warpdata.formats.tiling.SlabPlan`) into one zstd frame per tile, in
C order over the slab's tile grid. ``BACKENDS`` maps names to dotted import
paths plus the install hint shown when a backend cannot be used (fsspec's
``known_implementations`` style); importing this package imports no backend.

* ``cpu`` – numpy gather into reused per-thread tile buffers, one zstd
  context per thread compressing into reused output arenas (GIL released).
* ``gpu`` – a CuPy kernel for lift/transpose, nvCOMP batched zstd with the
  RAW bitstream (plain zstd frames), pinned host buffers, async streams.
* ``auto`` – ``gpu`` when a CUDA device and its packages are present, else
  ``cpu``. ``WARP_BACKEND`` sets the default.

Contract every backend meets (the conformance suite in
``tests/tiles/test_kernels.py`` checks it):

``prepare(plan)`` once, then ``alloc_slab()`` for each host slab buffer the
caller fills; ``submit(slab, rows)`` starts compressing a filled buffer and
returns at once; ``ready(ticket)`` polls; ``collect(ticket)`` waits and
returns the tiles' chunk payloads (bytes-like; possibly views into
backend-owned output buffers, valid until ``release(ticket)``, which the
caller invokes once it has written them). Optionally (``set_groups``,
``on_group_ready``, ``group_frames``) a backend hands each stored object's
chunks over as soon as they are compressed, before the rest of the slab. A payload is one plain zstd frame,
followed — when the backend's ``checksum`` is on, the default — by the
Zarr ``crc32c`` codec's 4 bytes: the CRC-32C of the frame, little-endian
(docs/formats/zarr-tiles.md, "chunk payload"). A buffer passed to ``submit`` is not touched by the
caller until its ticket is collected. ``close()`` frees everything.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass
from typing import Any

from warpdata.core import envvars
from warpdata.core.errors import ConfigError, DependencyError, InternalError
from warpdata.core.registry import load


@dataclass(frozen=True)
class BackendInfo:
    name: str
    target: str  # "module:Class"
    summary: str
    install: str | None  # what to install when it is missing


BACKENDS: dict[str, BackendInfo] = {
    "cpu": BackendInfo("cpu", "warpdata.kernels.cpu:CpuBackend",
                       "numpy gather + per-thread zstandard (always available)", None),
    "gpu": BackendInfo("gpu", "warpdata.kernels.gpu:GpuBackend",
                       "CuPy lift/transpose kernel + nvCOMP batched zstd",
                       "needs a CUDA GPU, cupy and nvidia-nvcomp: pip install 'warp-toolchain[gpu]' (CUDA 12) "
                       "or 'warp-toolchain[gpu-cu13]' (CUDA 13)"),
}
CHOICES = ("auto", *BACKENDS)


class TileBackend(abc.ABC):
    """Base class: the methods every backend implements (see the module docstring)."""

    name = "base"
    #: submit() takes any C-contiguous host array (not only alloc_slab() buffers) of ``rows`` rows
    accepts_views = False

    def __init__(self, *, level: int = 1, threads: int | None = None, checksum: bool = True) -> None:
        self.level = int(level)
        self.threads = threads
        #: append the crc32c codec's CRC-32C to every frame (set before ``prepare``)
        self.checksum = bool(checksum)

    @classmethod
    def probe(cls) -> str | None:
        """None when usable here, else why not (one line)."""
        return None

    @abc.abstractmethod
    def prepare(self, plan) -> None:
        """See the module docstring."""

    @abc.abstractmethod
    def alloc_slab(self):
        """See the module docstring."""

    @abc.abstractmethod
    def submit(self, slab, rows: int) -> Any:
        """See the module docstring."""

    def ready(self, ticket) -> bool:
        """Non-blocking: True when collect(ticket) would not wait."""
        return True

    @abc.abstractmethod
    def collect(self, ticket) -> list:
        """See the module docstring."""

    def on_ready(self, ticket, callback) -> bool:
        """Arrange for ``callback()`` (from any thread) once ``ready(ticket)`` is True, so the
        caller can sleep instead of polling. False: not supported, the caller polls."""
        return False

    def set_groups(self, groups) -> None:  # noqa: B027 - optional hook, default: ignored
        """After ``prepare``: the tiles of each stored object, in file order (a list of lists of tile
        numbers). A backend that can uses it to finish objects one after another, so that
        :meth:`on_group_ready` can hand each object over before its slab is done."""

    def on_group_ready(self, ticket, callback) -> bool:
        """Arrange for ``callback(g)`` (from any thread) once every tile of group ``g`` of
        :meth:`set_groups` is compressed, each group once; then :meth:`group_frames` returns its
        frames. A group whose compression failed is never signalled (``collect`` raises). False:
        not supported, the caller waits for the whole ticket."""
        return False

    def group_frames(self, ticket, tiles) -> list:
        """The chunk payloads of ``tiles`` once their group is signalled (valid until ``release``)."""
        raise InternalError(f"tile backend {self.name} does not signal groups (on_group_ready() returned False)",
                            hint="report this with the array's shape and options")

    def release(self, ticket) -> None:  # noqa: B027 - optional hook
        """The caller is done with the frames ``collect(ticket)`` returned (they may be views
        into backend-owned buffers that this lets the backend reuse). Default: nothing to do."""

    def close(self) -> None:  # noqa: B027 - optional hook, default: nothing to release
        """Free the backend's buffers and threads."""


def backend_class(name: str) -> type[TileBackend]:
    info = BACKENDS[name]
    return load(info.target, "tile backend")


def availability() -> dict[str, str | None]:
    """name → None when usable, else the reason it is not (install hint included)."""
    out: dict[str, str | None] = {}
    for name, info in BACKENDS.items():
        try:
            reason = backend_class(name).probe()
        except ImportError as e:
            reason = f"import failed: {e}"
        if reason and info.install:
            reason = f"{reason}; {info.install}"
        out[name] = reason
    return out


def resolve(name: str | None = None) -> str:
    """A concrete backend name for ``name`` (default: WARP_BACKEND, then auto)."""
    name = (name or envvars.get("WARP_BACKEND") or "auto").strip().lower()
    if name not in CHOICES:
        raise ConfigError(f"unknown tile backend {name!r}", hint="use one of: " + ", ".join(CHOICES)
                          + " (WARP_BACKEND or [tiles] backend)")
    if name != "auto":
        return name
    return "gpu" if backend_class("gpu").probe() is None else "cpu"


def get_backend(name: str | None = None, *, level: int = 1, threads: int | None = None,
                checksum: bool = True) -> TileBackend:
    """An instance of the named backend; DependencyError (with the install hint) when unusable."""
    concrete = resolve(name)
    cls = backend_class(concrete)
    reason = cls.probe()
    if reason is not None:
        raise DependencyError(f"tile backend {concrete!r} is unavailable: {reason}",
                              hint=BACKENDS[concrete].install or "run 'warp doctor'")
    return cls(level=level, threads=threads, checksum=checksum)
