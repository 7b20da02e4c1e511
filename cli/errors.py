"""The command line's one error boundary: every expected failure becomes one line on stderr
(`error: <what>, <where>: <how to fix>`) and a non-zero exit; no traceback unless `--debug`.

Expected failures are the project's own error classes (a refused request, an unknown name, a
store, escrow or signing problem, a file that cannot be read). Anything else is a bug: one line
that says so and how to see the traceback (exit 1); its traceback is also kept in <home>/logs/,
so that a failure seen once (under load, in CI) can be reported without running it again. Library
logs and warnings are silenced for the command (`dprelease.cli.quiet`); user text is escaped before Rich sees
it, so `[uid]` prints as is.
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import NoReturn

import click
import typer
from rich.console import Console
from rich.markup import escape
from typer.core import TyperGroup

from .quiet import quiet_libraries, silence_shutdown_noise

#: exit code of a refused command (bad input, unknown name, failed check); 1 is left to bugs and
#: to commands whose answer is "no" (verify FAILED)
EXIT_REFUSED = 2
EXIT_BUG = 1
#: exit code of a command stopped by Ctrl-C (128 + SIGINT), as a release's own interrupt (cli/runs.py)
EXIT_INTERRUPTED = 130

#: the project's error classes, by module: one is caught only if its module was loaded (an error
#: of a class can only exist once its module is imported), so the boundary imports nothing heavy
EXPECTED_ERRORS = (
    ("dp_core.errors", "DPError"),  # requests, queries, data, releases (RequestError, ReleaseError, ...)
    ("dprelease.store.errors", "StoreError"),  # unknown dataset / release, budget exceeded
    ("dprelease.escrow.errors", "EscrowError"),  # keys, blobs, registration
    ("dprelease.reporting.signing", "SigningError"),
    ("prefect.exceptions", "FlowPauseTimeout"),  # nobody answered in time
    ("dprelease.cli.temporary_prefect_server", "ServerUnavailable"),  # a Prefect server of ours did not start or answer
)
#: standard errors that are about the user's input or environment, not a bug
EXPECTED_BUILTINS = (OSError, ValueError)

err_console = Console(stderr=True, soft_wrap=True, highlight=False)


def one_line(text: str) -> str:
    """The message on one line (a multi-line message joined with '; ')."""
    lines = [" ".join(line.split()) for line in str(text).splitlines()]
    return "; ".join(line for line in lines if line)


def print_error(message: str) -> None:
    """`error: <message>` on stderr, on one line, user text escaped for Rich."""
    err_console.print(f"[red]error:[/red] {escape(one_line(message))}")


def fail(message: str, code: int = EXIT_REFUSED) -> None:
    """Refuse the command with one line on stderr."""
    print_error(message)
    raise typer.Exit(code)


def _click_classes(name: str) -> tuple[type, ...]:
    """Click's exception class `name`, and the same class of the click that Typer vendors (Typer 0.2x
    parses arguments with its own copy, `typer._click`, whose errors are not click's)."""
    vendored = (cls for cls in typer.BadParameter.__mro__ if cls.__name__ == name)
    return tuple({getattr(click.exceptions, name), *vendored})


#: what the command line's parsing raises for a wrong argument (a missing one, an unknown option, a
#: value of the wrong type): the person's mistake, one line and exit 2, never "a bug"
USAGE_ERRORS = _click_classes("UsageError")
#: how a command ends on purpose (typer.Exit, Ctrl-C at a prompt, click's own errors): passed on as is
ENDINGS = (typer.Exit, typer.Abort, *_click_classes("ClickException"), *_click_classes("Exit"),
           *_click_classes("Abort"))


def usage_line(err: Exception) -> str:
    """A parsing error as one line: what is wrong, in which command, and where its usage is."""
    ctx = getattr(err, "ctx", None)
    command = ctx.command_path if ctx is not None else "dprelease"
    return f"{err.format_message()} (in `{command}`: see `{command} --help`)"


def in_option_words(message: str, command) -> str:
    """A refusal worded for the command line: the library names its parameters as Python does
    (`epsilon_cap must be > 0`), the person typed options (`--epsilon-cap`). Only names with an
    underscore, whose option is that name spelt with dashes, are rewritten (a one-word name such as
    `epsilon` is also the ordinary word)."""
    for param in getattr(command, "params", ()):
        if getattr(param, "param_type_name", "") == "option" and param.name and "_" in param.name:
            spelt = "--" + param.name.replace("_", "-")  # an option named otherwise (--as for requested_by):
            if spelt in param.opts:  # its Python name is another thing's too (a request file's field)
                message = re.sub(rf"(?<![-\w]){re.escape(param.name)}(?!\w)", spelt, message)
    return message


def _expected_classes() -> tuple[type, ...]:
    found = []
    for module_name, class_name in EXPECTED_ERRORS:
        module = sys.modules.get(module_name)
        if module is not None and isinstance(getattr(module, class_name, None), type):
            found.append(getattr(module, class_name))
    return tuple(found)


def describe(err: BaseException) -> tuple[str, int]:
    """The one line and the exit code for an error that reached the boundary."""
    if isinstance(err, OSError) and err.filename is not None:
        reason = err.strerror or type(err).__name__
        return f"{err.filename}: {reason.lower()}", EXIT_REFUSED
    if isinstance(err, _expected_classes()):
        return str(err) or type(err).__name__, EXIT_REFUSED
    if isinstance(err, EXPECTED_BUILTINS):
        return str(err) or type(err).__name__, EXIT_REFUSED
    return (f"unexpected {type(err).__name__}: {err} (a bug: run again with --debug for the traceback, "
            "and report it)"), EXIT_BUG


def keep_traceback(err: BaseException) -> Path | None:
    """Write a bug's traceback to <home>/logs/bug-<UTC time>-<pid>.txt (None when it cannot be written:
    the one line is still printed)."""
    import traceback
    from datetime import datetime, timezone

    try:
        from dprelease.settings import Settings

        logs = Settings.from_env().home / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        kept = logs / f"bug-{datetime.now(timezone.utc):%Y%m%dT%H%M%S%fZ}-{os.getpid()}.txt"
        kept.write_text("".join(traceback.format_exception(err)))
        return kept
    except Exception:  # noqa: BLE001 - a bug report must not hide the bug
        return None


def flags_without_type(command) -> None:
    """Help without a type on flags: Typer 0.29 shows `--debug <bool>` as if a flag took a value;
    a flag is typed as itself (`--debug`). Every command under `command`, once per process."""
    help_names = SimpleNamespace(help_option_names=["--help"])  # all the help option's making reads of a context
    try:
        help_option = [command.get_help_option(help_names)] if hasattr(command, "get_help_option") else []
    except Exception:  # noqa: BLE001 - help's looks must never stop a command
        help_option = []
    for param in [*getattr(command, "params", ()), *filter(None, help_option)]:
        if getattr(param, "is_flag", False) and param.metavar is None:
            param.metavar = ""
    for inner in getattr(command, "commands", {}).values():
        flags_without_type(inner)


class ErrorBoundary(TyperGroup):
    """The top-level command group: runs every command inside the error boundary and with library
    output silenced. `--debug` (read from the parsed options) lets the traceback and logs through."""

    def make_context(self, info_name, args, parent=None, **extra):
        """The top level's own options parsed (`dprelease --bad`): a mistake there is one line too."""
        flags_without_type(self)
        try:
            return super().make_context(info_name, args, parent=parent, **extra)
        except USAGE_ERRORS as err:
            if "--debug" in args:
                raise
            print_error(usage_line(err))
            raise typer.Exit(EXIT_REFUSED) from None

    def _command_typed(self, ctx) -> tuple[str, object]:
        """The command a person typed (`dprelease dataset register`), from the words left to parse,
        and its click command (the deepest one the words name)."""
        words, command = [ctx.command_path], self
        for word in [*getattr(ctx, "_protected_args", ()), *ctx.args]:
            inner = getattr(command, "commands", {}).get(word)
            if inner is None:
                break
            words.append(word)
            command = inner
        return " ".join(words), command

    def invoke(self, ctx: click.Context):
        from dprelease.faults import pause_point

        debug = bool(ctx.params.get("debug"))
        typed, command = self._command_typed(ctx)  # before the group hands its words to the command
        with quiet_libraries(debug):
            try:
                pause_point("command_start")
                return super().invoke(ctx)
            except USAGE_ERRORS as err:
                if debug:
                    raise
                print_error(usage_line(err))
                raise typer.Exit(EXIT_REFUSED) from None
            except ENDINGS:
                raise
            except KeyboardInterrupt:  # Ctrl-C before a release's own handler (cli/runs.py) or in another command
                if debug:
                    raise
                print(f"dprelease: interrupted (SIGINT): `{typed}` stopped", file=sys.stderr, flush=True)
                raise typer.Exit(EXIT_INTERRUPTED) from None
            except Exception as err:  # the boundary: every error ends here
                if debug:
                    raise
                message, code = describe(err)
                if code == EXIT_REFUSED:
                    message = in_option_words(message, command)
                if code == EXIT_BUG and (kept := keep_traceback(err)) is not None:
                    message += f"; its traceback: {kept}"
                print_error(message)
                raise typer.Exit(code) from None


class CommandLine(typer.Typer):
    """The `dprelease` app: a Typer whose top group is the error boundary. Run as a program (the
    console script calls the app), it also keeps native libraries' shutdown noise off the terminal."""

    def __init__(self, **kwargs) -> None:
        super().__init__(cls=ErrorBoundary, **kwargs)

    def __call__(self, *args, **kwargs):
        if "--debug" not in sys.argv[1:]:
            silence_shutdown_noise()
        return super().__call__(*args, **kwargs)


STARTUP_S = 20.0  # the garbage collector is off for at most this long at a command's start


def _collect_after_startup() -> None:
    """No garbage collection while a command imports its libraries: what they allocate lives until
    exit, and collecting it as it grows took 0.25 s of the 1.9 s a release spends importing (13%,
    measured 2026-11-25). A release turns collection back on once it has loaded what it needs
    (dprelease.cli.runs.own_run); every other command after STARTUP_S seconds at most."""
    import gc
    import threading

    gc.disable()
    timer = threading.Timer(STARTUP_S, gc.enable)
    timer.daemon = True
    timer.start()


def run_program(app: CommandLine) -> NoReturn:
    """Run the app as the `dprelease` program, then end the process without the interpreter's
    teardown: what a normal exit waits for still happens (other non-daemon threads finish, exit
    handlers run: a temporary Prefect server is stopped, logs are flushed), but the modules a release
    loads (Prefect, great-expectations, pandas, DuckDB) are not torn down one by one, which took 0.8
    to 1.2 s after the answer was printed. `--debug` keeps the ordinary exit."""
    import atexit
    import threading

    _collect_after_startup()
    try:
        app()
        code = 0
    except SystemExit as done:
        if isinstance(done.code, str):  # sys.exit("message"): printed, status 1, as Python does
            print(done.code, file=sys.stderr)
        code = done.code if isinstance(done.code, int) else (0 if done.code is None else 1)
    if "--debug" in sys.argv[1:]:
        sys.exit(code)
    for thread in threading.enumerate():
        if thread is not threading.current_thread() and not thread.daemon:
            thread.join()
    atexit._run_exitfuncs()  # the handlers a normal exit runs (silence_shutdown_noise's among them)
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)
