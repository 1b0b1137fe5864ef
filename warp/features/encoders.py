"""Encoder plugins for the feature cache: load by name, run in batches.

An encoder turns a batch of preprocessed images (``B×3×H×W`` uint8 torch
tensor on the caching device) and their captions into named fixed-shape
arrays (latents, prompt embeddings padded to a fixed token length, a mask).
It is any object with

* ``fields(height, width) -> list[FieldSpec]``: what it produces per sample;
* ``encode(pixels, captions) -> dict[str, Tensor | ndarray]``: one batch,
  leading dimension ``B``;
* ``identity() -> dict``: JSON-able; name, version, a hash of its weights and
  the dtype. It is part of the cache fingerprint, so a new checkpoint or
  dtype rebuilds the cache.

:func:`load_encoder` finds the factory from the config's ``name``: a built-in
name (:data:`BUILTIN`), ``"package.module:function"``, or the name of an entry
point in the ``warpdata.encoders`` group; the factory is called as
``factory(device=..., dtype=..., **options)``. :func:`resolve_device` maps
``caching_device = "auto" | "cuda" | "cpu"`` (auto prefers CUDA).
:class:`BatchEncoder` moves each batch to the device, runs the encoder under
``torch.inference_mode`` (and autocast on CUDA), checks every output against
the declared fields and returns numpy arrays for the shard writer.
:func:`checked_output` is that check, shared with the embedding encoders of
``warp embeddings``: ragged, zero-width, text or object, wrongly shaped and
non-finite output is an :class:`EncoderOutputError` naming the encoder, the
field and the first sample at fault, never a numpy ``ValueError``.

:class:`Pool8HashEncoder` is the built-in, weight-free CPU/GPU encoder that
exercises the whole path: an 8× average-pool "latent" and a hashing text
embedder (xxh64 token buckets into a seeded Gaussian table plus sinusoidal
positions) with a fixed token length and mask.
"""

from __future__ import annotations

import hashlib
import importlib
import re
import unicodedata
from collections.abc import Sequence
from typing import Any

import numpy as np
import xxhash
from warpdata.core.errors import ConfigError, DataError, missing_dependency
from warpdata.formats.featshard import FieldSpec


class EncoderOutputError(DataError):
    """An encoder plugin returned output that is not a numeric array of the declared shape."""

    code = "encoder-output"


def checked_output(value: Any, *, encoder: str, field: str, shape: tuple[int, ...], samples: Sequence[str],
                   dtype: Any = None) -> np.ndarray:
    """``value`` as an array of ``(len(samples), *shape)`` numbers, or :class:`EncoderOutputError`
    naming ``encoder``, ``field`` and the first of ``samples`` (one name per row) at fault."""
    b = len(samples)

    def fail(what: str, i: int | None = None) -> EncoderOutputError:
        at = f" (sample {samples[i]!r})" if i is not None and 0 <= i < b else ""
        return EncoderOutputError(f"encoder {encoder!r} {field}: {what}{at}",
                                  hint="fix the encoder plugin: one row of numbers per sample, "
                                       f"each of shape {shape}", encoder=encoder, field=field,
                                  sample=samples[i] if i is not None and 0 <= i < b else None)

    if any(d <= 0 for d in shape):
        raise fail(f"declares a zero-width shape {shape}")
    try:
        arr = np.asarray(value)
    except (ValueError, TypeError):  # ragged rows: numpy refuses to stack them
        arr = None
    if arr is None or arr.dtype == object:
        rows = list(value) if isinstance(value, Sequence) or hasattr(value, "__iter__") else []
        want = shape[0] if shape else None
        for i, r in enumerate(rows):
            n = len(r) if hasattr(r, "__len__") and not isinstance(r, (str, bytes)) else None
            if n != want:
                raise fail(f"rows differ in length (ragged): this one has {n if n is not None else type(r).__name__}, "
                           f"expected {want}", i)
        raise fail(f"is not an array of numbers ({type(value).__name__})")
    if arr.dtype.kind not in "biuf":
        flat = arr.reshape(len(arr), -1) if arr.ndim and len(arr) == b else None
        i = 0 if flat is not None else None
        raise fail(f"holds {arr.dtype} values ({'text' if arr.dtype.kind in 'US' else 'not numbers'})", i)
    if arr.shape != (b, *shape):
        zero = next((k for k, d in enumerate(arr.shape[1:]) if d == 0), None)
        what = "zero-width output" if zero is not None else "output"
        raise fail(f"{what} of shape {arr.shape}, expected {(b, *shape)}")
    if dtype is not None and not np.can_cast(arr.dtype, dtype, casting="same_kind"):
        raise fail(f"has dtype {arr.dtype}, declared {np.dtype(dtype)}")
    if arr.dtype.kind == "f":
        bad = ~np.isfinite(arr.reshape(b, -1)).all(axis=1)
        if bad.any():
            raise fail("has NaN or infinite values (fp16 overflow under autocast?)", int(np.flatnonzero(bad)[0]))
    return arr


ENTRY_POINT_GROUP = "warpdata.encoders"
BUILTIN: dict[str, str] = {
    "pool8-hash": "warpdata.features.encoders:Pool8HashEncoder",
}
DTYPES = ("float16", "float32")  # numpy (and so WFS1) has no bfloat16


def _torch():
    try:
        import torch
    except ImportError:
        raise missing_dependency("encoding the feature cache", "torch", "torch") from None
    return torch


def resolve_device(device: str) -> str:
    """``auto`` → ``cuda`` when a CUDA device is usable, else ``cpu``."""
    if device not in ("auto", "cuda", "cpu") and not device.startswith("cuda:"):
        raise ConfigError(f"caching_device must be auto, cuda, cuda:N or cpu, got {device!r}")
    if device == "cpu":
        return "cpu"
    torch = _torch()
    if torch.cuda.is_available():
        return "cuda" if device == "auto" else device
    if device == "auto":
        return "cpu"
    raise ConfigError(f"caching_device = {device!r} but no CUDA device is available",
                      hint="set caching_device = \"auto\" or \"cpu\", or run on a machine with a GPU")


def find_factory(name: str):
    """The encoder factory for a built-in name, ``module:function`` or entry point name."""
    target = BUILTIN.get(name)
    if target is None and ":" not in name:
        from importlib.metadata import entry_points

        eps = [ep for ep in entry_points(group=ENTRY_POINT_GROUP) if ep.name == name]
        if not eps:
            known = sorted(BUILTIN) + sorted(ep.name for ep in entry_points(group=ENTRY_POINT_GROUP))
            raise ConfigError(f"unknown encoder {name!r}",
                              hint="use 'package.module:function' or one of: " + ", ".join(known))
        try:
            return eps[0].load()
        except Exception as e:  # a plugin's import failure: report, do not crash with a traceback
            raise ConfigError(f"encoder entry point {name!r} ({eps[0].value}) failed to load: {e}",
                              hint="check that the plugin package is installed correctly") from e
    mod, _, attr = (target or name).partition(":")
    if not mod or not attr:
        raise ConfigError(f"encoder {name!r} must look like 'package.module:function'")
    try:
        module = importlib.import_module(mod)
    except ImportError as e:
        raise ConfigError(f"encoder module {mod!r} cannot be imported: {e}",
                          hint="install the package that provides it, or fix encoder.name") from e
    try:
        return getattr(module, attr)
    except AttributeError:
        raise ConfigError(f"encoder module {mod!r} has no attribute {attr!r}",
                          hint="check encoder.name") from None


def load_encoder(name: str, *, device: str = "cpu", dtype: str = "float16",
                 options: dict[str, Any] | None = None):
    if dtype not in DTYPES:
        raise ConfigError(f"encoder dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    factory = find_factory(name)
    try:
        enc = factory(device=device, dtype=dtype, **(options or {}))
    except TypeError as e:
        raise ConfigError(f"encoder {name!r} rejected its options {sorted(options or {})}: {e}",
                          hint="check [encoder.options] against the encoder's documentation") from e
    for attr in ("fields", "encode", "identity"):
        if not callable(getattr(enc, attr, None)):
            raise ConfigError(f"encoder {name!r} returned {type(enc).__name__}, which has no {attr}() method",
                              hint="an encoder needs fields(), encode() and identity(); see warpdata.features.encoders")
    return enc


class BatchEncoder:
    """Runs an encoder over uint8 pixel batches on a device; returns checked numpy arrays."""

    def __init__(self, encoder, device: str, size: tuple[int, int], name: str | None = None) -> None:
        self.encoder = encoder
        self.name = name  # the config's name of the encoder, for errors
        self.device = device
        self.fields = list(encoder.fields(*size))
        names = [f.name for f in self.fields]
        if len(set(names)) != len(names):
            raise ConfigError(f"encoder declares duplicate fields {names}")

    def __call__(self, pixels: np.ndarray, captions: Sequence[str],
                 keys: Sequence[str] | None = None) -> dict[str, np.ndarray]:
        """One batch; ``keys`` name the samples in errors (default: their positions)."""
        torch = _torch()
        cuda = self.device.startswith("cuda")
        x = torch.from_numpy(pixels)
        if cuda:
            x = x.pin_memory().to(self.device, non_blocking=True)
        with torch.inference_mode():
            if cuda:
                with torch.autocast("cuda", dtype=torch.float16):
                    raw = self.encoder.encode(x, list(captions))
            else:
                raw = self.encoder.encode(x, list(captions))
        out: dict[str, np.ndarray] = {}
        b = len(captions)
        names = list(keys) if keys is not None else [f"#{i}" for i in range(b)]
        enc_name = self.name or type(self.encoder).__name__
        for f in self.fields:
            if f.name not in raw:
                raise DataError(f"encoder output lacks declared field {f.name!r}",
                                hint="the encoder's encode() must return every field fields() declares")
            v = raw[f.name]
            if hasattr(v, "detach"):
                v = v.detach()
                if v.dtype == torch.bfloat16:  # autocast may hand back bf16; numpy has none
                    v = v.float()
                v = v.cpu().numpy()
            out[f.name] = checked_output(v, encoder=enc_name, field=f"field {f.name!r}", shape=tuple(f.shape),
                                         samples=names, dtype=f.dtype)
        extra = set(raw) - {f.name for f in self.fields}
        if extra:
            raise DataError(f"encoder returned undeclared fields {sorted(extra)}",
                            hint="declare them in fields() or drop them")
        return out


_TOKEN = re.compile(r"\w+|[^\w\s]", re.UNICODE)


def tokenize(text: str) -> list[str]:
    return _TOKEN.findall(unicodedata.normalize("NFKC", text).lower())


class Pool8HashEncoder:
    """Weight-free reference encoder: pooled pixels as the latent, hashed tokens as the text.

    * ``latents``: ``3 × H/f × W/f`` average pool (``f = latent_factor``, default 8)
      of the pixels scaled to [-1, 1];
    * ``prompt_embeds``: ``max_tokens × text_dim``: token ``t`` at position
      ``p`` embeds as ``table[xxh64(t, seed) % buckets] + pos(p)``, zero past
      the last token; ``prompt_mask``: ``max_tokens`` bools;
    * ``pooled_prompt_embeds``: ``text_dim``, mean over the real tokens.

    The table is drawn from ``numpy.random.default_rng(seed)`` (PCG64:
    identical on every machine) and its SHA-256 is the "weights hash".
    """

    VERSION = "1"

    def __init__(self, *, device: str = "cpu", dtype: str = "float16", latent_factor: int = 8,
                 max_tokens: int = 77, text_dim: int = 64, buckets: int = 4096, seed: int = 0) -> None:
        for k, v in (("latent_factor", latent_factor), ("max_tokens", max_tokens), ("text_dim", text_dim),
                     ("buckets", buckets)):
            if not isinstance(v, int) or v <= 0:
                raise ConfigError(f"pool8-hash option {k} must be a positive integer, got {v!r}")
        if text_dim % 2:
            raise ConfigError(f"pool8-hash option text_dim must be even, got {text_dim}")
        torch = _torch()
        self.device, self.dtype = device, dtype
        self.factor, self.max_tokens, self.text_dim = latent_factor, max_tokens, text_dim
        self.buckets, self.seed = buckets, seed
        table = (np.random.default_rng(seed).standard_normal((buckets, text_dim)) / np.sqrt(text_dim)).astype(np.float32)
        pos = np.arange(max_tokens, dtype=np.float64)[:, None]
        freq = np.exp(-np.log(10000.0) * np.arange(0, text_dim, 2) / text_dim)[None, :]
        pe = np.zeros((max_tokens, text_dim), np.float32)
        pe[:, 0::2], pe[:, 1::2] = 0.1 * np.sin(pos * freq), 0.1 * np.cos(pos * freq)
        self._weights_sha = hashlib.sha256(table.tobytes() + pe.tobytes()).hexdigest()
        self._table = torch.from_numpy(table).to(device)
        self._pe = torch.from_numpy(pe).to(device)
        self._torch_dtype = getattr(torch, dtype)

    def fields(self, height: int, width: int) -> list[FieldSpec]:
        if height % self.factor or width % self.factor:
            raise ConfigError(f"target size {height}x{width} is not divisible by latent_factor {self.factor}")
        store = self.dtype
        return [FieldSpec("latents", store, (3, height // self.factor, width // self.factor)),
                FieldSpec("prompt_embeds", store, (self.max_tokens, self.text_dim)),
                FieldSpec("pooled_prompt_embeds", store, (self.text_dim,)),
                FieldSpec("prompt_mask", "bool", (self.max_tokens,))]

    def token_ids(self, captions: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        ids = np.zeros((len(captions), self.max_tokens), np.int64)
        mask = np.zeros((len(captions), self.max_tokens), bool)
        for i, c in enumerate(captions):
            toks = tokenize(c)[: self.max_tokens]
            ids[i, : len(toks)] = [xxhash.xxh64_intdigest(t.encode("utf-8"), self.seed) % self.buckets for t in toks]
            mask[i, : len(toks)] = True
        return ids, mask

    def encode(self, pixels, captions: Sequence[str]) -> dict[str, Any]:
        torch = _torch()
        # pooling is linear: pool the raw values, scale to [-1, 1] on the 64x smaller result
        lat = torch.nn.functional.avg_pool2d(pixels.to(torch.float32), self.factor).div_(127.5).sub_(1.0)
        ids, mask = self.token_ids(captions)
        ids_t = torch.from_numpy(ids).to(self._table.device)
        m = torch.from_numpy(mask).to(self._table.device)
        emb = (self._table[ids_t] + self._pe[None]) * m[..., None]
        pooled = emb.sum(1) / m.sum(1, keepdim=True).clamp(min=1)
        return {"latents": lat.to(self._torch_dtype), "prompt_embeds": emb.to(self._torch_dtype),
                "pooled_prompt_embeds": pooled.to(self._torch_dtype), "prompt_mask": m}

    def identity(self) -> dict[str, Any]:
        return {"name": "pool8-hash", "callable": BUILTIN["pool8-hash"], "version": self.VERSION,
                "weights_sha256": self._weights_sha, "dtype": self.dtype,
                "options": {"latent_factor": self.factor, "max_tokens": self.max_tokens,
                            "text_dim": self.text_dim, "buckets": self.buckets, "seed": self.seed}}
