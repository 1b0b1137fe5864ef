"""The ``warp`` dispatcher: one command table, global options, error mapping.

``COMMANDS`` is the single table of subcommands (name, module, summary). It
drives the order of ``warp --help``, the man pages, the shell completions and
the help test. Each command module exposes ``main`` (a Typer-annotated
function) and ``EXAMPLES`` (shown in its help epilog and man page); command
modules import only typer, the standard library and light warp modules at
top level, so building this app is cheap.

Global options (``--json``, ``-q``, ``-v``, ``--color``, ``--debug``) may be
given before or after the subcommand: :func:`main` moves them in front.

Start-up is paid by every call and every TAB completion, so :func:`main`
imports only the module of the subcommand being run; the others are listed
in ``warp --help`` from their ``COMMANDS`` summary without being imported.
Help is Click's plain formatter (``rich_markup_mode=None``): Typer's Rich
help imports rich.markdown and markdown-it, ~90 ms per call here.
Expected failures are :class:`~warpdata.core.errors.WarpError` and print one line
of cause plus a hint, with the documented exit code. An ``OSError`` a command
lets through (a full disk, a file-size limit, a read-only directory, a full
stdout) is the operating system's answer, not a bug: it is typed here by its
errno (:func:`~warpdata.core.errors.os_failure`, exits 73/74/77/78), naming the
path, or ``stdout``, or the environment variable that points at a file where a
directory belongs. A closed stdout (EPIPE) ends quietly with 141, as Unix tools
do. Anything else is a bug (exit 70), with a traceback only under ``--debug`` /
``WARP_DEBUG=1``.
"""

from __future__ import annotations

import functools
import importlib
import io
import os
import sys
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Annotated, Any, Literal

import typer
from warpdata import __version__
from warpdata.cli import output as out
from warpdata.core import envvars
from warpdata.core.errors import (
    ConfigError,
    ExitCode,
    InternalError,
    WarpError,
    dependency_error,
    os_failure,
    process_start_failure,
    thread_start_failure,
)


@dataclass(frozen=True)
class CommandSpec:
    name: str
    module: str
    summary: str


COMMANDS: tuple[CommandSpec, ...] = (
    # build
    CommandSpec("etl", "warpdata.commands.etl", "Build a training-ready artifact (tensor warehouse, Zarr array, feature cache) from a TOML config."),
    CommandSpec("ingest", "warpdata.commands.ingest", "Publish a raw image folder, file list (CSV/JSONL/Parquet) or paired folders as a dataset, with quarantine."),
    CommandSpec("embeddings", "warpdata.commands.embeddings", "Compute embeddings of a published column with an encoder plugin; list, describe them."),
    CommandSpec("tar-to-tbl", "warpdata.commands.tar_to_tbl", "Pack a WebDataset tar into one TBL v2 file: O(1) random access, cached sizes, checksums."),
    # publish and read
    CommandSpec("publish", "warpdata.commands.publish", "Publish a dataset version (tables, raw artifacts, bindings) to the store: content-addressed, idempotent."),
    CommandSpec("register", "warpdata.commands.register", "Make a dataset of local Parquet files and directories, read in place (nothing copied); changes are detected."),
    CommandSpec("unregister", "warpdata.commands.unregister", "Remove a dataset registered in place; its files stay where they are."),
    CommandSpec("ls", "warpdata.commands.ls", "List the datasets published in a store, from their manifests only."),
    CommandSpec("info", "warpdata.commands.info", "Show a published dataset's version, tables, rows, artifacts and bindings, from its manifest alone."),
    CommandSpec("schema", "warpdata.commands.schema", "List a published table's columns and Arrow types, from the manifest (no shard read)."),
    CommandSpec("head", "warpdata.commands.head", "Show the first rows of a published table, reading one row group, never a whole shard."),
    CommandSpec("inspect", "warpdata.commands.inspect", "Describe any warp artifact: manifests, .tbl files, TWH1 shards, Zarr arrays, datasets."),
    CommandSpec("stream", "warpdata.commands.stream", "Stream a published table's rows to stdout as JSONL, CSV or Arrow IPC, without pulling."),
    CommandSpec("why", "warpdata.commands.why", "Show everything one sample came from (source file and hash, labels, verdicts, recipe, shard), from manifests only."),
    CommandSpec("diff", "warpdata.commands.diff", "Show rows (by key) and members added, removed and changed between two versions; unchanged shards are never read."),
    CommandSpec("card", "warpdata.commands.card", "Write a Markdown dataset card from the manifest and data, keeping hand-written text outside its markers."),
    CommandSpec("cat", "warpdata.commands.cat", "Write one artifact member's raw bytes to stdout (one ranged read, no extraction)."),
    # serve to training
    CommandSpec("warm", "warpdata.commands.warm", "Download a published dataset's shards into the blob cache ahead of training."),
    CommandSpec("cache", "warpdata.commands.cache", "Show, garbage-collect, verify or clear the content-addressed blob cache."),
    CommandSpec("gc", "warpdata.commands.gc", "Delete the store's blobs no version uses (after --grace); --drop old versions first."),
    CommandSpec("order", "warpdata.commands.order", "Print an epoch's sample count, set digest and order digest, the ground truth for loaders' digests."),
    CommandSpec("init", "warpdata.commands.init", "Generate a loader module for a published dataset, with a smoke test."),
    # when something is wrong
    CommandSpec("doctor", "warpdata.commands.doctor", "Check the installation, backends, cache and store, and say how to fix what fails."),
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
    quiet: Annotated[int, typer.Option("--quiet", "-q", count=True, show_default=False,
                                       help="Less output on stderr (-q: only results).")] = 0,
    verbose: Annotated[int, typer.Option("--verbose", "-v", count=True, show_default=False,
                                         help="More detail on stderr (-v, -vv).")] = 0,
    color: Annotated[Literal["auto", "always", "never"], typer.Option(
        "--color", metavar="WHEN", help="auto, always or never (NO_COLOR and FORCE_COLOR are honoured).")] = "auto",
    debug: Annotated[bool, typer.Option("--debug", help="Show tracebacks for errors (also WARP_DEBUG=1).")] = False,
    version: Annotated[bool, typer.Option("--version", callback=_version_callback, is_eager=True,
                                          help="Print warp's version and exit.")] = False,
) -> None:
    out.configure(json=json_, quiet=quiet, verbose=verbose, color=color,
                  debug=debug or envvars.flag("WARP_DEBUG"))
    out.attach_library()


def report_error(err: WarpError) -> None:
    if out.options().json:
        out.emit_json(err.to_dict())
    out.error(err.message, err.hint)


def guarded(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Map exceptions from a command to exit codes (see warp(1) EXIT STATUS)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> None:
        try:
            # every numeric WARP_* setting in its documented bound before the command starts: a bad
            # one is exit 78 naming it, whichever library code would have read it first (or never)
            envvars.check_numbers()
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
        except OSError as e:  # the operating system's answer (disk full, limits, permissions)
            if out.options().debug:
                traceback.print_exc()
            raise typer.Exit(_report_os_error(e)) from None
        except Exception as e:  # a bug: say so, and how to report it (unless it is a condition of this machine)
            if out.options().debug:
                traceback.print_exc()
            err = not_a_bug(e) or InternalError(f"internal error: {type(e).__name__}: {e}",
                                                hint="rerun with --debug for a traceback and report it")
            report_error(err)
            raise typer.Exit(int(err.exit_code)) from None
        if isinstance(rc, int) and rc:
            raise typer.Exit(rc)

    return wrapper


# (variable, its value or default, whether it is set) for the directories warp writes under by itself
def _env_dirs() -> list[tuple[str, str, bool]]:
    return [("WARP_CACHE_DIR", envvars.default_cache_dir(), bool(envvars.get("WARP_CACHE_DIR"))),
            ("WARP_STORE", envvars.default_store(), bool(envvars.get("WARP_STORE")))]


def _env_dir_at_fault(path: str) -> ConfigError | None:
    """A ConfigError naming the variable when ``path`` lies under a warp directory that is a file."""
    where = os.path.abspath(path)
    for var, value, is_set in _env_dirs():
        if "://" in value:
            continue
        root = os.path.abspath(os.path.expanduser(value))
        if (where == root or where.startswith(root.rstrip(os.sep) + os.sep)) \
                and os.path.lexists(root) and not os.path.isdir(root):
            said = f"{var}={value}" if is_set else f"{value} (the default of {var})"
            return ConfigError(f"{said} is not a directory: it is a file",
                               hint=f"point {var} at a directory (or move the file away)", variable=var, path=value)
    return None


def _failed_stream(e: BaseException) -> str | None:
    """What an OSError without a file name was writing: ``stdout``, or an open file's name.

    The OS names no path for a failed ``write``/``flush``; the innermost frame that holds
    stdout or an open file (or is one of the functions that print data) says what it was. Within
    a frame, stdout or a file held directly counts before one reached through an object's
    attributes, and the process's stderr and stdin never count: many objects hold them (a console,
    a logging handler), so ``warp stream > /dev/full`` named ``<stderr>`` before.
    """
    stdout = sys.stdout
    outs = [stdout, getattr(stdout, "buffer", None)]
    printers = {out.data.__code__, out.emit_json.__code__}
    frames = []
    tb = e.__traceback__
    while tb is not None:
        frames.append(tb.tb_frame)
        tb = tb.tb_next
    for frame in reversed(frames):
        if frame.f_code in printers:
            return "stdout"
        values = list(frame.f_locals.values())
        for v in values:
            if any(v is o for o in outs if o is not None):
                return "stdout"
        for v in values:  # a file held directly
            if name := _file_name(v):
                return name
        for v in values:  # or by the writer object whose method failed (self.f)
            if name := next((n for a in getattr(v, "__dict__", {}).values() if (n := _file_name(a))), None):
                return name
    return None


def _std_streams() -> list[object]:
    """The process's stderr and stdin (current and original, text and binary): never what failed."""
    found: list[object] = []
    for s in (sys.stderr, sys.__stderr__, sys.stdin, sys.__stdin__):
        if s is not None:
            found += [s, getattr(s, "buffer", None)]
    return [s for s in found if s is not None]


def _file_name(v: object) -> str | None:
    """The path of file object ``v`` (None for anything else, or a closed one opened from a descriptor)."""
    if not isinstance(v, io.IOBase) or any(v is s for s in _std_streams()):
        return None
    name = getattr(v, "name", None)
    if isinstance(name, str):
        return name
    if isinstance(name, int) and not v.closed:  # opened from a descriptor (mkstemp): /proc names it
        try:
            return os.readlink(f"/proc/self/fd/{name}")
        except OSError:
            return None
    return None


def not_a_bug(e: BaseException) -> WarpError | None:
    """The typed error for an exception that is this machine's condition, not warp's bug: an
    optional package that is not installed (78, naming its extra), a thread or process the system
    would not start (71); None for anything else (a bug: exit 70)."""
    if isinstance(e, ImportError):
        return dependency_error(e)
    if isinstance(e, RuntimeError):
        return thread_start_failure(e)
    if isinstance(e, OSError) and _starting_process(e):
        return process_start_failure(e)
    return None


# where the standard library starts a process: subprocess (fork_exec, posix_spawn), multiprocessing
# (Popen._launch of fork, spawn and forkserver)
_PROCESS_STARTERS = frozenset({"_execute_child", "_launch", "_posix_spawn", "_fork_exec", "fork"})


def _starting_process(e: OSError) -> bool:
    """Whether ``e`` is fork/spawn failing for want of resources (EAGAIN, ENOMEM) while starting a process."""
    import errno

    if e.errno not in (errno.EAGAIN, errno.ENOMEM):
        return False
    tb = e.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code.co_name in _PROCESS_STARTERS:
            return True
        tb = tb.tb_next
    return False


def _report_os_error(e: OSError, where: str | None = None) -> int:
    """Report an OSError as its typed warp error; the exit code. ``where``: the stream, when known."""
    if _starting_process(e):
        err0 = process_start_failure(e)
        report_error(err0)
        return int(err0.exit_code)
    if where is None and e.filename is None:
        where = _failed_stream(e)
    err: WarpError | None = None
    for f in (e.filename, e.filename2):
        if err is None and isinstance(f, (str, bytes, os.PathLike)):
            err = _env_dir_at_fault(os.fsdecode(f))
    err = err or os_failure(e, where)
    if where == "stdout":
        _silence_stdout()  # what is still buffered for stdout cannot be written either
    report_error(err)
    return int(err.exit_code)


def _silence_stdout() -> None:
    """After EPIPE, point stdout at /dev/null so the interpreter's final flush is quiet."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):
        pass


def load_command(spec: CommandSpec):
    return importlib.import_module(spec.module)


def keep_layout(text: str) -> str:
    """Mark indented or bulleted paragraphs so Click's help does not rewrap them."""
    paras = []
    for para in text.strip("\n").split("\n\n"):
        lines = para.split("\n")
        if any(ln[:1].isspace() or ln.lstrip()[:2] in ("- ", "* ") for ln in lines):
            para = "\b\n" + para
        paras.append(para)
    return "\n\n".join(paras)


def examples_epilog(examples: str) -> str | None:
    body = examples.strip("\n")
    return "Examples:\n\n\b\n" + body.replace("\n\n", "\n\n\b\n") if body.strip() else None


def _listed_only(name: str) -> Callable[[], None]:
    def listed_only() -> None:  # main() loads the real module whenever `name` runs
        raise InternalError(f"command {name!r} was run without loading its module",
                            hint="report this as a bug")

    return listed_only


_CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 100}

def command_class(mod: Any) -> type:
    """The Click command class of ``mod``'s command: Typer's, and where the module has a
    ``NEGATIVE_ARGUMENT`` string, a negative number given as an argument (`warp why DS -1`, which
    Click reads as an option: "No such option: -1") is a usage error (exit 2) saying that string:
    what the argument counts from."""
    import re

    from typer.core import TyperCommand

    # Click's exceptions as Typer uses them (Typer may carry its own copy of Click)
    clicks = importlib.import_module(typer.BadParameter.__module__)
    said = getattr(mod, "NEGATIVE_ARGUMENT", None)
    if said is None:
        return TyperCommand

    class WarpCommand(TyperCommand):
        def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
            try:
                return super().parse_args(ctx, args)
            except clicks.NoSuchOption as e:
                if not re.fullmatch(r"-[0-9]+", e.option_name or ""):
                    raise
                raise clicks.UsageError(f"{e.option_name} is not an option: {said}", ctx) from None

    return WarpCommand


def build_app(load: Sequence[str] | None = None) -> typer.Typer:
    """The Typer app. ``load`` names the commands whose modules are imported
    (default: all); the rest appear in ``warp --help`` by summary only."""
    app = typer.Typer(
        name="warp",
        help=APP_HELP,
        epilog=APP_EPILOG,
        no_args_is_help=True,
        add_completion=False,
        pretty_exceptions_enable=False,
        rich_markup_mode=None,
        context_settings=_CONTEXT,
    )
    app.callback()(_root)
    for spec in COMMANDS:
        if load is not None and spec.name not in load:
            app.command(name=spec.name, help=spec.summary, short_help=spec.summary,
                        context_settings=_CONTEXT)(_listed_only(spec.name))
            continue
        mod = load_command(spec)
        app.command(
            name=spec.name,
            help=keep_layout(mod.__doc__ or spec.summary),
            short_help=spec.summary,
            epilog=examples_epilog(getattr(mod, "EXAMPLES", "")),
            context_settings=_CONTEXT,
            cls=command_class(mod),
        )(guarded(mod.main))
    return app


def chosen_command(args: Sequence[str]) -> str | None:
    """The subcommand ``args`` (global options already hoisted) will run, if any."""
    names = {s.name for s in COMMANDS}
    skip = False
    for a in args:
        if skip:
            skip = False
        elif a in GLOBAL_VALUED:
            skip = True
        elif a == "--" or not a.startswith("-"):
            return a if a in names else None
    return None


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
    try:
        return _main(argv)
    finally:  # the library's logging and progress go back to the caller's settings (in-process runs)
        out.detach_library()


def _main(argv: Sequence[str] | None) -> int:
    args = hoist_global_options(sys.argv[1:] if argv is None else argv)
    out.reset()
    front = args[: args.index("--")] if "--" in args else args
    stdout, stderr = sys.stdout, sys.stderr
    code: int
    try:
        chosen = chosen_command(args)
        app = build_app(load=[chosen] if chosen else [])
        # not standalone: usage errors come back here so --json can report them too
        rv = app(args=args, prog_name="warp", standalone_mode=False)
        code = rv if isinstance(rv, int) else 0
    except SystemExit as e:
        if e.code is None or isinstance(e.code, int):
            code = e.code or 0
        else:
            sys.stderr.write(f"{e.code}\n")
            code = 1
    except (KeyboardInterrupt, typer.Abort):
        return int(ExitCode.INTERRUPTED)
    except BrokenPipeError:
        _silence_stdout()
        return int(ExitCode.BROKEN_PIPE)
    except OSError as e:  # Click printing help or usage to a stdout that cannot take it
        return _report_os_error(e, "stdout" if e.filename is None else None)
    except Exception as e:
        if not (isinstance(getattr(e, "exit_code", None), int) and callable(getattr(e, "show", None))):
            # outside any command (e.g. a command module failed to import): still a bug, exit 70,
            # unless an optional package it imports is not installed (78)
            if "--debug" in front or envvars.flag("WARP_DEBUG"):
                traceback.print_exc()
            known = not_a_bug(e)
            if known is not None:
                report_error(known)
                return int(known.exit_code)
            out.error(f"internal error: {type(e).__name__}: {e}", "rerun with --debug for a traceback and report it")
            return int(ExitCode.INTERNAL)
        # a Click usage error (bad option, missing argument, unknown command)
        if "--json" in front:
            out.emit_json({"error": "usage", "message": e.format_message(), "exit_code": e.exit_code})
        e.show()
        code = e.exit_code
    if sys.stdout is not stdout:
        # Click/Typer met EPIPE while printing (help, usage) and swapped in a
        # wrapper that hides it, exiting 1: put the streams back, report 141.
        sys.stdout, sys.stderr = stdout, stderr
        _silence_stdout()
        return int(ExitCode.BROKEN_PIPE)
    try:
        sys.stdout.flush()  # buffered data lines: EPIPE must surface here, not at exit
    except BrokenPipeError:
        _silence_stdout()
        return int(ExitCode.BROKEN_PIPE)
    except OSError as e:  # a full device (ENOSPC on `> /dev/full`): the data did not reach stdout
        return _report_os_error(e, "stdout")
    except ValueError:  # stdout closed by the caller
        pass
    return code


def tar_to_tbl_main(argv: Sequence[str] | None = None) -> int:
    """``tar_to_tbl IN OUT``: alias of ``warp tar-to-tbl``."""
    return main(["tar-to-tbl", *(sys.argv[1:] if argv is None else argv)])


