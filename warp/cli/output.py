"""Terminal output: data on stdout, everything else on stderr.

One process-wide :class:`OutputOptions` is set by the dispatcher from the
global flags (``--json``, ``-q``/``-v``, ``--color``, ``--debug``). Helpers
here are the only way commands print:

* :func:`emit_json` writes exactly one JSON document to stdout;
* :func:`data` writes plain data lines to stdout; :func:`end_data` flushes them before a
  summary on stderr;
* :func:`info`, :func:`warn`, :func:`detail` write to stderr, honouring -q/-v;
* :func:`progress` is a Rich progress bar on a stderr console, and a no-op
  when stderr is not a terminal, under ``--json`` or ``-q``;
* :func:`table` renders rows on stdout (or stderr with ``to_stderr``).

Rich is imported lazily: it costs start-up time on every call.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any


@dataclass
class OutputOptions:
    json: bool = False
    quiet: int = 0
    verbose: int = 0
    color: str = "auto"  # auto | always | never
    debug: bool = False


_opts = OutputOptions()


def configure(**kwargs: Any) -> OutputOptions:
    global _opts
    _opts = OutputOptions(**{**_opts.__dict__, **kwargs})
    return _opts


def reset() -> None:
    global _opts
    _opts = OutputOptions()


def options() -> OutputOptions:
    return _opts


def _color_flags(stream) -> dict[str, Any]:
    if _opts.color == "never" or (_opts.color == "auto" and os.environ.get("NO_COLOR")):
        return {"no_color": True, "color_system": None}
    if _opts.color == "always" or (_opts.color == "auto" and os.environ.get("FORCE_COLOR")):
        return {"force_terminal": True}
    return {}


def console(stderr: bool = True):
    """A Rich console on the *current* sys.stderr/sys.stdout (tests swap them)."""
    from rich.console import Console

    stream = sys.stderr if stderr else sys.stdout
    return Console(file=stream, highlight=False, soft_wrap=True, **_color_flags(stream))


def stderr_is_tty() -> bool:
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):
        return False


def stdout_is_tty() -> bool:
    """True when stdout is a terminal: binary output (Arrow IPC, raw image bytes) is refused there
    unless forced (``--force``)."""
    try:
        return sys.stdout.isatty()
    except (AttributeError, ValueError):  # no stdout, or a closed one
        return False


def emit_json(obj: Any) -> None:
    sys.stdout.write(json.dumps(obj, indent=2, sort_keys=True, ensure_ascii=False, default=str))
    sys.stdout.write("\n")
    sys.stdout.flush()


def data(line: str = "") -> None:
    sys.stdout.write(line + "\n")


def end_data() -> None:
    """End what was printed on stdout before a summary goes to stderr: flush it, so a terminal or a
    ``2>&1`` pipe shows the table (and its last line's newline) whole, then the summary."""
    stream = sys.stdout  # a local: an error flushing it is reported as stdout's
    stream.flush()


def _stderr(markup: str, plain: str) -> None:
    if _opts.color == "never" or os.environ.get("NO_COLOR") and _opts.color != "always" or not (
        stderr_is_tty() or _opts.color == "always" or os.environ.get("FORCE_COLOR")
    ):
        sys.stderr.write(plain + "\n")
        sys.stderr.flush()
        return
    console().print(markup)


def _escape(text: str) -> str:
    return text.replace("[", "\\[")


def info(msg: str) -> None:
    """Progress notes and summaries for humans; silenced by -q."""
    if _opts.quiet:
        return
    _stderr(_escape(msg), msg)


def detail(msg: str, level: int = 1) -> None:
    """Shown only with -v (level 1) or -vv (level 2)."""
    if _opts.verbose >= level and not _opts.quiet:
        _stderr(f"[dim]{_escape(msg)}[/dim]", msg)


def warn(msg: str) -> None:
    """Warnings always reach stderr (even under -q: they are not progress)."""
    _stderr(f"[yellow]warning:[/yellow] {_escape(msg)}", f"warning: {msg}")


def error(msg: str, hint: str | None = None) -> None:
    _stderr(f"[bold red]error:[/bold red] {_escape(msg)}", f"error: {msg}")
    if hint:
        _stderr(f"[cyan]hint:[/cyan] {_escape(hint)}", f"hint: {hint}")


def table(title: str | None, columns: Sequence[str], rows: Iterable[Sequence[Any]], *, to_stderr: bool = False) -> None:
    """A table for humans. Plain aligned text when the stream is not a terminal."""
    rows = [[("" if c is None else str(c)) for c in r] for r in rows]
    stream = sys.stderr if to_stderr else sys.stdout
    try:
        tty = stream.isatty()
    except (AttributeError, ValueError):
        tty = False
    if tty or _opts.color == "always":
        from rich.table import Table

        t = Table(title=title, show_edge=False, header_style="bold")
        for c in columns:
            t.add_column(c)
        for r in rows:
            t.add_row(*(_escape(c) for c in r))
        console(stderr=to_stderr).print(t)
        return
    widths = [max([len(c)] + [len(r[i]) for r in rows if i < len(r)]) for i, c in enumerate(columns)]
    if title:
        stream.write(title + "\n")
    stream.write("  ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True)).rstrip() + "\n")
    for r in rows:
        stream.write("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=False)).rstrip() + "\n")


class _NoProgress:
    def advance(self, n: float = 1) -> None:
        pass

    def update(self, **kwargs: Any) -> None:
        pass


class _RichProgress:
    def __init__(self, progress, task) -> None:
        self._p, self._t = progress, task

    def advance(self, n: float = 1) -> None:
        self._p.advance(self._t, n)

    def update(self, **kwargs: Any) -> None:
        self._p.update(self._t, **kwargs)


@contextmanager
def progress(description: str, total: float | None = None, unit: str = "it") -> Iterator[_NoProgress | _RichProgress]:
    """A progress bar on stderr; silent unless stderr is a terminal."""
    if _opts.json or _opts.quiet or not (stderr_is_tty() or os.environ.get("FORCE_COLOR")):
        yield _NoProgress()
        return
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TaskProgressColumn,
        TextColumn,
        TimeRemainingColumn,
    )

    cols = [TextColumn("{task.description}"), BarColumn(), TaskProgressColumn(),
            MofNCompleteColumn(), TimeRemainingColumn()]
    with Progress(*cols, console=console(), transient=True) as p:
        yield _RichProgress(p, p.add_task(description, total=total))


class _LibraryLog(logging.Handler):
    """Renders the library's log records (logger ``warpdata``) the CLI's way, on stderr."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            msg = record.getMessage()
            if record.levelno >= logging.WARNING:
                warn(msg)
            elif record.levelno >= logging.INFO:
                info(msg)
            else:
                detail(msg, 2)
        except Exception:  # a broken stderr must not turn a log line into a crash
            self.handleError(record)


def attach_library() -> None:
    """Route the library's logging and progress through this module (once per process).

    The library never prints (docs/design.md §2): it logs under ``warpdata`` and reports
    progress through :mod:`warpdata.core.progress`; the CLI renders both.
    """
    from warpdata.core import progress as lib_progress

    lib_progress.set_progress_factory(progress)
    logger = logging.getLogger("warpdata")
    if not any(isinstance(h, _LibraryLog) for h in logger.handlers):
        logger.addHandler(_LibraryLog())
    logger.setLevel(logging.DEBUG if _opts.verbose >= 2 else logging.INFO)
    logger.propagate = False


def detach_library() -> None:
    """Undo :func:`attach_library`: a program that ran ``warp`` in-process keeps its own logging."""
    from warpdata.core import progress as lib_progress

    lib_progress.set_progress_factory(None)
    logger = logging.getLogger("warpdata")
    for h in [h for h in logger.handlers if isinstance(h, _LibraryLog)]:
        logger.removeHandler(h)
    logger.setLevel(logging.NOTSET)
    logger.propagate = True


def requests_line(stats: dict) -> str:
    """One line about a read's store traffic, from ``RequestStats.to_dict()``."""
    from warpdata.core.sizes import format_size

    kinds = ", ".join(f"{k} {v}" for k, v in stats.get("by_kind", {}).items())
    line = f"requests: {stats['requests']} request(s)" + (f" ({kinds})" if kinds else "") + \
        f", {format_size(stats['bytes'])} received"
    if stats.get("retries"):
        line += (f", {stats['retries']} retried ({stats['throttled']} throttled, "
                 f"{stats['backoff_seconds']:.2f}s backing off)")
    return line


def report(key: str, facts: dict, line: str) -> None:
    """A fact about a command whose stdout is data (stream): ``line`` on stderr (silenced by -q),
    or with --json ``{key: facts}`` as one JSON line on stderr."""
    if _opts.json:
        sys.stderr.write(json.dumps({key: facts}, sort_keys=True) + "\n")
        sys.stderr.flush()
    else:
        info(line)


def report_requests(stats: dict) -> None:
    """Store traffic of a command whose stdout is data (stream, cat): -v prints :func:`requests_line`
    on stderr; --json writes ``{"requests": stats}`` as one JSON line on stderr."""
    if _opts.json:
        sys.stderr.write(json.dumps({"requests": stats}, sort_keys=True) + "\n")
        sys.stderr.flush()
    else:
        detail(requests_line(stats))
