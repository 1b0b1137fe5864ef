"""TOML configuration with precise errors.

A config is declared as a schema: nested dicts of :class:`Field` (a leaf) or
dicts (a table). :func:`load_config` parses the file with ``tomllib`` and
checks it against the schema, raising :class:`~warpdata.core.errors.ConfigError`
that names the file, the line, the dotted key and what was expected; unknown
keys are rejected with a did-you-mean. Defaults fill missing keys; a field
may name a registered environment variable (``env=``) that overrides the
file, and a ``check`` callable for constraints a type cannot express.

The same schema documents itself: :func:`describe` renders the key list that
``docs/`` and ``--help`` epilogs show.
"""

from __future__ import annotations

import difflib
import math
import os
import re
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from warpdata.core import envvars
from warpdata.core.errors import ConfigError, MissingInputError

_MISSING = object()


@dataclass(frozen=True)
class Field:
    """One config key. ``type`` is a Python type or a tuple of them."""

    type: type | tuple[type, ...]
    default: Any = _MISSING
    help: str = ""
    choices: tuple[Any, ...] | None = None
    env: str | None = None
    check: Callable[[Any], str | None] | None = None  # returns an error text or None
    item_type: type | None = None  # for lists

    @property
    def required(self) -> bool:
        return self.default is _MISSING


Schema = Mapping[str, "Field | Schema"]


@dataclass
class KeyLocator:
    """Maps dotted keys to 1-based line numbers of a TOML text (best effort)."""

    lines: dict[str, int] = field(default_factory=dict)

    @classmethod
    def from_text(cls, text: str) -> KeyLocator:
        """Also indexes arrays of tables: the k-th ``[[name]]`` as ``name[k]``, its keys as ``name[k].key``."""
        loc = cls()
        table = ""
        elem = ""  # "name[k]" inside the k-th [[name]], else ""
        arrays: dict[str, int] = {}
        header = re.compile(r"^\s*(\[\[?)\s*([^\]]+?)\s*\]\]?\s*(#.*)?$")
        keyline = re.compile(r'^\s*("[^"]*"|\'[^\']*\'|[A-Za-z0-9_.\-]+)\s*=')
        for no, line in enumerate(text.splitlines(), start=1):
            m = header.match(line)
            if m:
                table = ".".join(p.strip().strip("\"'") for p in m.group(2).split("."))
                loc.lines.setdefault(table, no)
                elem = ""
                if m.group(1) == "[[":
                    k = arrays.get(table, 0)
                    arrays[table] = k + 1
                    elem = f"{table}[{k}]"
                    loc.lines.setdefault(elem, no)
                continue
            m = keyline.match(line)
            if m:
                key = ".".join(p.strip().strip("\"'") for p in m.group(1).split("."))
                loc.lines.setdefault(f"{table}.{key}" if table else key, no)
                if elem:
                    loc.lines.setdefault(f"{elem}.{key}", no)
        return loc

    def line(self, dotted: str) -> int | None:
        while dotted:
            if dotted in self.lines:
                return self.lines[dotted]
            dotted = dotted.rpartition(".")[0]
        return None


_TYPE_NAMES = {str: "a string", int: "an integer", float: "a number", bool: "true or false",
               list: "an array", dict: "a table"}


def _type_name(t: type | tuple[type, ...]) -> str:
    if isinstance(t, tuple):
        return " or ".join(_TYPE_NAMES.get(x, x.__name__) for x in t)
    return _TYPE_NAMES.get(t, t.__name__)


def _matches(value: Any, t: type | tuple[type, ...]) -> bool:
    types = t if isinstance(t, tuple) else (t,)
    for x in types:
        if x is float and isinstance(value, (int, float)) and not isinstance(value, bool):
            return True
        if x is int and isinstance(value, bool):
            continue
        if isinstance(value, x):
            return True
    return False


INT_LIMIT = 2**63  # TOML integers are 64-bit; Python's parser accepts more


def _number_problem(value: Any) -> str | None:
    """Numbers no setting can use: beyond 64 bits, NaN or infinite (``1e400`` parses as inf)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int) and not -INT_LIMIT <= value < INT_LIMIT:
        return f"is too large ({len(str(abs(value)))} digits; integers must fit in 64 bits)"
    if isinstance(value, float) and not math.isfinite(value):
        return f"must be a finite number, got {value!r}"
    return None


def _coerce_env(raw: str, f: Field, name: str) -> Any:
    types = f.type if isinstance(f.type, tuple) else (f.type,)
    for t in types:
        try:
            if t is bool:
                low = raw.strip().lower()
                if low in {"1", "true", "yes", "on"}:
                    return True
                if low in {"0", "false", "no", "off"}:
                    return False
                continue
            if t in (int, float, str):
                return t(raw)
        except ValueError:
            continue
    raise ConfigError(f"environment variable {name}={raw!r} is not {_type_name(f.type)}",
                      hint=f"unset {name} or give it a valid value")


class ConfigSource:
    """Where values came from, for error messages."""

    def __init__(self, path: str, text: str) -> None:
        self.path = path
        self.locator = KeyLocator.from_text(text)

    def where(self, dotted: str) -> str:
        line = self.locator.line(dotted)
        return f"{self.path}:{line}" if line else self.path


def parse_toml(path: str | os.PathLike) -> tuple[dict, ConfigSource]:
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise MissingInputError(f"config file {p} does not exist",
                                hint="check the path given to --config") from None
    except (IsADirectoryError, PermissionError, UnicodeDecodeError) as e:
        raise ConfigError(f"cannot read config file {p}: {e}", hint="pass a UTF-8 TOML file") from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        # tomllib (3.11) puts the position only in its message: "... (at line 3, column 8)"
        msg = str(e)
        m = re.search(r"\s*\(at line (\d+), column (\d+)\)$", msg) or re.search(r"\s*\(at end of document\)$", msg)
        if m and m.groups():
            line, col = int(m.group(1)), int(m.group(2))
        else:
            line, col = text.count("\n") + 1, 1
        cause = msg[: m.start()] if m else msg
        raise ConfigError(f"{p}:{line}:{col}: TOML syntax error: {cause}",
                          hint="fix the TOML syntax at the line shown", file=str(p), line=line, column=col) from None
    return data, ConfigSource(str(p), text)


def validate(data: Mapping[str, Any], schema: Schema, source: ConfigSource, prefix: str = "") -> dict:
    """Check ``data`` against ``schema``; return a new dict with defaults applied."""
    out: dict[str, Any] = {}
    for key in data:
        dotted = f"{prefix}{key}"
        if key not in schema:
            close = difflib.get_close_matches(key, list(schema), n=1, cutoff=0.6)
            hint = f"did you mean '{prefix}{close[0]}'?" if close else (
                "valid keys here: " + ", ".join(sorted(schema)))
            raise ConfigError(f"{source.where(dotted)}: unknown key '{dotted}'", hint=hint,
                              file=source.path, key=dotted)
    for key, spec in schema.items():
        dotted = f"{prefix}{key}"
        present = key in data
        if isinstance(spec, Mapping):
            sub = data.get(key, {})
            if not isinstance(sub, Mapping):
                raise ConfigError(f"{source.where(dotted)}: '{dotted}' must be a table",
                                  hint=f"write it as [{dotted}]", file=source.path, key=dotted)
            out[key] = validate(sub, spec, source, prefix=f"{dotted}.")
            continue
        value = data[key] if present else _MISSING
        where = source.where(dotted)
        if spec.env:
            raw = envvars.get(spec.env)
            if raw is not None:
                value = _coerce_env(raw, spec, spec.env)
                present = True
                where = f"environment variable {spec.env} (overrides {where})"
        if value is _MISSING:
            if spec.required:
                raise ConfigError(f"{source.where(prefix.rstrip('.'))}: missing required key '{dotted}'"
                                  + (f" ({spec.help})" if spec.help else ""),
                                  hint=f"add `{key} = ...` under [{prefix.rstrip('.')}]" if prefix else f"add `{key} = ...`",
                                  file=source.path, key=dotted)
            out[key] = spec.default
            continue
        if not _matches(value, spec.type):
            raise ConfigError(f"{where}: '{dotted}' must be {_type_name(spec.type)}, got {value!r}",
                              hint=spec.help or None, file=source.path, key=dotted)
        problem = _number_problem(value)
        if problem:
            raise ConfigError(f"{where}: '{dotted}' {problem}", hint=spec.help or None, file=source.path, key=dotted)
        if spec.type is float and isinstance(value, int):
            value = float(value)  # TOML `batch = 2` where a number is expected
        if spec.item_type is not None and isinstance(value, list):
            for i, item in enumerate(value):
                if not _matches(item, spec.item_type):
                    raise ConfigError(f"{where}: '{dotted}[{i}]' must be {_type_name(spec.item_type)}, got {item!r}",
                                      file=source.path, key=dotted)
                problem = _number_problem(item)
                if problem:
                    raise ConfigError(f"{where}: '{dotted}[{i}]' {problem}", file=source.path, key=dotted)
        if spec.choices is not None and value not in spec.choices:
            close = difflib.get_close_matches(str(value), [str(c) for c in spec.choices], n=1)
            hint = f"did you mean {close[0]!r}?" if close else None
            raise ConfigError(f"{where}: '{dotted}' must be one of "
                              + ", ".join(repr(c) for c in spec.choices) + f", got {value!r}",
                              hint=hint, file=source.path, key=dotted)
        if spec.check is not None:
            problem = spec.check(value)
            if problem:
                raise ConfigError(f"{where}: '{dotted}' {problem}, got {value!r}",
                                  hint=spec.help or None, file=source.path, key=dotted)
        out[key] = value
    return out


def load_config(path: str | os.PathLike, schema: Schema) -> tuple[dict, ConfigSource]:
    data, source = parse_toml(path)
    return validate(data, schema, source), source


def describe(schema: Schema, prefix: str = "") -> list[tuple[str, str, str, str]]:
    """Rows of (dotted key, type, default, help) for documentation."""
    rows = []
    for key, spec in schema.items():
        dotted = f"{prefix}{key}"
        if isinstance(spec, Mapping):
            rows.extend(describe(spec, f"{dotted}."))
        else:
            default = "(required)" if spec.required else repr(spec.default)
            t = _type_name(spec.type) if spec.choices is None else " | ".join(map(str, spec.choices))
            rows.append((dotted, t, default, spec.help + (f" [env {spec.env}]" if spec.env else "")))
    return rows


def positive(value: Any) -> str | None:
    return None if value > 0 else "must be > 0"


def non_negative(value: Any) -> str | None:
    return None if value >= 0 else "must be >= 0"
