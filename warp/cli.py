"""The ``warp`` dispatcher: one command table, global options, error mapping.

``COMMANDS`` is the single table of subcommands (name, module, summary). It
drives the order of ``warp --help``, the man pages, the shell completions and
the help test. Each command module exposes ``main`` (a Typer-annotated
function) and ``EXAMPLES`` (shown in its help epilog and man page); command
modules import only typer, the standard library and light warp modules at
top level, so building this app is cheap.

Global options (``--json``, ``-q``, ``-v``, ``--color``, ``--debug``) may be
given before or after the subcommand: :func:`main` moves them in front.
Expected failures are :class:`~warpdata.errors.WarpError` and print one line
of cause plus a hint, with the documented exit code; anything else is a bug
(exit 70), with a traceback only under ``--debug`` / ``WARP_DEBUG=1``.
"""

from __future__ import annotations

import functools
import importlib
import os
import sys
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Annotated, Any

import typer

from . import __version__, envvars
from . import output as out
from .errors import EXIT_CODE_DOCS, ExitCode, InternalError, WarpError


@dataclass(frozen=True)
class CommandSpec:
    name: str
    module: str
    summary: str


COMMANDS: tuple[CommandSpec, ...] = (
    CommandSpec("etl", "warpdata.commands.etl", "Build a training-ready artifact (tensor warehouse, Zarr array, feature cache) from a TOML config."),
    CommandSpec("doctor", "warpdata.commands.doctor", "Check the installation, backends, cache and store, and say how to fix what fails."),
    CommandSpec("inspect", "warpdata.commands.inspect", "Describe any warp artifact: manifests, .tbl files, TWH1 shards, Zarr arrays, datasets."),
)

GLOBAL_FLAGS = {"--json", "--debug", "--quiet", "--verbose", "-q", "-v"}
GLOBAL_VALUED = {"--color"}

APP_HELP = """warp: turn raw ML training data into versioned, verifiable, training-ready
artifacts, publish them to object storage, and serve them to training fast.

Global options may also be given after the subcommand."""

APP_EPILOG = "Run 'warp COMMAND --help' for a command's options and examples; 'man warp' for exit codes and environment."


def _version_callback(value: bool) -> None:
    if value:
        out.data(f"warp {__version__}")
        raise typer.Exit(0)


def _root(
    json_: Annotated[bool, typer.Option("--json", help="Print exactly one JSON document on stdout.")] = False,
    quiet: Annotated[int, typer.Option("--quiet", "-q", count=True, help="Less output on stderr (-q: only results).")] = 0,
    verbose: Annotated[int, typer.Option("--verbose", "-v", count=True, help="More detail on stderr (-v, -vv).")] = 0,
    color: Annotated[str, typer.Option("--color", help="auto, always or never (NO_COLOR and FORCE_COLOR are honoured).",
                                       click_type=None, metavar="WHEN")] = "auto",
    debug: Annotated[bool, typer.Option("--debug", help="Show tracebacks for errors (also WARP_DEBUG=1).")] = False,
    version: Annotated[bool, typer.Option("--version", callback=_version_callback, is_eager=True,
                                          help="Print warp's version and exit.")] = False,
) -> None:
    if color not in ("auto", "always", "never"):
        raise typer.BadParameter(f"must be auto, always or never, not {color!r}", param_hint="--color")
    out.configure(json=json_, quiet=quiet, verbose=verbose, color=color,
                  debug=debug or envvars.flag("WARP_DEBUG"))


def report_error(err: WarpError) -> None:
    if out.options().json:
        out.emit_json(err.to_dict())
    out.error(err.message, err.hint)


def guarded(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Map exceptions from a command to exit codes (see warp(1) EXIT STATUS)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> None:
        try:
            rc = fn(*args, **kwargs)
        except typer.Exit:
            raise
        except WarpError as e:
            if out.options().debug:
                traceback.print_exc()
            report_error(e)
            raise typer.Exit(int(e.exit_code)) from None
        except KeyboardInterrupt:
            out.error("interrupted; nothing half-written was left behind")
            raise typer.Exit(int(ExitCode.INTERRUPTED)) from None
        except BrokenPipeError:
            _silence_stdout()
            raise typer.Exit(int(ExitCode.BROKEN_PIPE)) from None
        except Exception as e:  # a bug: say so, and how to report it
            if out.options().debug:
                traceback.print_exc()
            err = InternalError(f"internal error: {type(e).__name__}: {e}",
                                hint="rerun with --debug for a traceback and report it")
            report_error(err)
            raise typer.Exit(int(ExitCode.INTERNAL)) from None
        if isinstance(rc, int) and rc:
            raise typer.Exit(rc)

    return wrapper


def _silence_stdout() -> None:
    """After EPIPE, point stdout at /dev/null so the interpreter's final flush is quiet."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):
        pass


def load_command(spec: CommandSpec):
    return importlib.import_module(spec.module)


def build_app() -> typer.Typer:
    app = typer.Typer(
        name="warp",
        help=APP_HELP,
        epilog=APP_EPILOG,
        no_args_is_help=True,
        add_completion=False,
        pretty_exceptions_enable=False,
        context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
    )
    app.callback()(_root)
    for spec in COMMANDS:
        mod = load_command(spec)
        epilog = getattr(mod, "EXAMPLES", "").strip()
        app.command(
            name=spec.name,
            help=(mod.__doc__ or spec.summary).strip(),
            short_help=spec.summary,
            epilog=("Examples:\n\n" + epilog) if epilog else None,
            context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
        )(guarded(mod.main))
    return app


def hoist_global_options(argv: Sequence[str]) -> list[str]:
    """Move global options given after the subcommand in front of it."""
    args = list(argv)
    names = {s.name for s in COMMANDS}
    try:
        cmd_at = next(i for i, a in enumerate(args) if a in names)
    except StopIteration:
        return args
    front, rest, moved = args[:cmd_at], args[cmd_at:], []
    kept: list[str] = []
    i = 0
    while i < len(rest):
        a = rest[i]
        if a == "--":
            kept.extend(rest[i:])
            break
        if a in GLOBAL_FLAGS or (len(a) > 2 and a[0] == "-" and a[1] != "-" and set(a[1:]) <= {"v"}) \
                or (len(a) > 2 and a[0] == "-" and a[1] != "-" and set(a[1:]) <= {"q"}):
            moved.append(a)
        elif a in GLOBAL_VALUED and i + 1 < len(rest):
            moved.extend(rest[i:i + 2])
            i += 1
        elif any(a.startswith(g + "=") for g in GLOBAL_VALUED):
            moved.append(a)
        else:
            kept.append(a)
        i += 1
    return front + moved + kept


def main(argv: Sequence[str] | None = None) -> int:
    """Run warp with ``argv`` (default ``sys.argv[1:]``); return the exit code."""
    args = hoist_global_options(sys.argv[1:] if argv is None else argv)
    out.reset()
    app = build_app()
    try:
        app(args=args, prog_name="warp", standalone_mode=True)
    except SystemExit as e:
        code = e.code
        if code is None:
            return 0
        if isinstance(code, int):
            return code
        sys.stderr.write(f"{code}\n")
        return 1
    except KeyboardInterrupt:
        return int(ExitCode.INTERRUPTED)
    return 0


def tar_to_tbl_main(argv: Sequence[str] | None = None) -> int:
    """``tar_to_tbl IN OUT``: alias of ``warp tar-to-tbl``."""
    return main(["tar-to-tbl", *(sys.argv[1:] if argv is None else argv)])


def exit_status_table() -> list[tuple[int, str]]:
    return [(int(c), doc) for c, doc in EXIT_CODE_DOCS.items()]
