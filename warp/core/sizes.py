"""Sizes given on the command line: a unit is required.

``warp cache gc --limit 20`` used to mean 20 *bytes* and evicted the whole
cache. On the command line a bare number is ambiguous (bytes? GB, like
WARP_CACHE_SIZE_GB?), so options that take a SIZE refuse it and ask for a
unit; the library's :func:`parse_size` still reads bare
numbers as bytes for callers that pass ints.

:func:`parse_size_option` is the one parser of every SIZE option of every
command (``cache gc --limit``, ``publish``/``ingest --shard-size``, ``ingest
--max-file-size``, ``warm --max-bytes``); ``tests/cli/test_output_edges.py``
finds every option whose metavar is SIZE and checks that each refuses a bare
number. :func:`parse_count_option` reads counts the same way (``ingest --max-pixels 1M``):
a bare number is a count there, and K, M, G are the decimal units.
"""

from __future__ import annotations

import re

from warpdata.core.errors import UsageError

_BARE = re.compile(r"^\s*[0-9]*\.?[0-9]+\s*$")

_SIZE = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*([kmgtp]?i?b?)?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "b": 1, "k": 10**3, "kb": 10**3, "m": 10**6, "mb": 10**6, "g": 10**9, "gb": 10**9,
          "t": 10**12, "tb": 10**12, "p": 10**15, "pb": 10**15, "kib": 1 << 10, "mib": 1 << 20,
          "gib": 1 << 30, "tib": 1 << 40, "pib": 1 << 50, "ki": 1 << 10, "mi": 1 << 20, "gi": 1 << 30,
          "ti": 1 << 40, "pi": 1 << 50}


def parse_size(text: str | int | float) -> int:
    """'200GB' → 200e9, '1.5GiB' → 1.5·2³⁰, '4096' → 4096 bytes."""
    if isinstance(text, (int, float)):
        return int(text)
    m = _SIZE.match(text)
    if not m or (m.group(2) or "").lower() not in _UNITS:
        raise UsageError(f"cannot read size {text!r}", hint="write a size like 500MB, 200GB or 1.5TiB")
    from fractions import Fraction  # exact: 36893489TB must not round through a float

    return int(Fraction(m.group(1)) * _UNITS[(m.group(2) or "").lower()])


def format_size(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} TB"


_COUNT = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*([kmg]?)\s*$", re.IGNORECASE)
_COUNT_UNITS = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9}


def parse_count_option(text: str, option: str, example: str = "1M") -> int:
    """A count given to ``option`` (pixels, ...): a whole number, or one with a K, M or G suffix in
    powers of 1000 (``1M`` = 1,000,000, ``2.5K`` = 2,500), as sizes' decimal units; at least 1.
    Anything else is a usage error (exit 2). A count has no binary units: ``Mi`` is refused."""
    m = _COUNT.match(text)
    if m:
        from fractions import Fraction  # exact, as parse_size

        n = Fraction(m.group(1)) * _COUNT_UNITS[m.group(2).lower()]
        if n.denominator == 1 and n >= 1:
            return int(n)
    raise UsageError(f"{option} {text.strip()!r} is not a count of at least 1",
                     hint=f"e.g. {option} {example}: a whole number, or with K, M or G (powers of 1000: "
                          "1M = 1,000,000)", option=option, value=text)


def parse_size_option(text: str, option: str, example: str = "20GB") -> int:
    """Bytes for ``text`` given to ``option``; a bare number is a usage error (exit 2)."""

    if _BARE.match(text):
        num = text.strip()
        raise UsageError(f"{option} {num} has no unit: say {num}GB (or {num}MB, {num}GiB, {num}B)",
                         hint=f"e.g. {option} {example}; sizes are decimal (GB = 10^9 bytes) "
                              "or binary (GiB = 2^30 bytes)", option=option, value=text)
    try:
        return parse_size(text)
    except UsageError as e:
        raise UsageError(f"{option} {text!r} is not a size", hint=f"e.g. {option} {example}",
                         option=option, value=text) from e
