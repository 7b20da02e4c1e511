"""The command line's output is the project's own: library logs and warnings that are not the
user's business are silenced once, at CLI start (`--debug` keeps them all).

- Prefect: its console handler (flow/task run lines, "Starting temporary server", failure
  tracebacks) is raised to CRITICAL, in this process and, through the environment, in the
  Prefect server it starts as a subprocess; its telemetry (whose heartbeat fails with
  "database is locked" on SQLite) is off. Logs still reach the Prefect API, so the UI keeps them.
- great-expectations, SQLAlchemy, docket, uvicorn, httpx, py4j, pyspark ...: their loggers print nothing here.
- Spark: a session the platform starts prints none of its own logs (dprelease/spark_logs.py: they
  quote the data); `--debug` sets DPRELEASE_SPARK_LOGS=on for the command, so they print.
- Python warnings (pandas, great-expectations, ...) are ignored, here and in subprocesses.
- DuckDB's nanobind prints ~40 "nanobind: leaked ..." lines when the interpreter shuts down after
  an error; `silence_shutdown_noise` points stderr at /dev/null once every exit handler has run.
"""

from __future__ import annotations

import atexit
import logging
import os
import sys
import warnings
from collections.abc import Iterator
from contextlib import contextmanager

#: read by Prefect when it configures logging (here and in its server subprocess); set only where
#: the user has not set them
QUIET_ENVIRONMENT = {
    "PREFECT_LOGGING_HANDLERS_CONSOLE_LEVEL": "CRITICAL",
    "PREFECT_LOGGING_HANDLERS_DEBUG_LEVEL": "CRITICAL",
    "PREFECT_SERVER_LOGGING_LEVEL": "CRITICAL",
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    "PYTHONWARNINGS": "ignore",
    # not noise but patience: on a busy machine the temporary server takes longer than 20 s
    "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "120",
}
#: library loggers that print on their own (not through Prefect's handlers)
NOISY_LOGGERS = ("great_expectations", "docket", "sqlalchemy", "alembic", "uvicorn", "httpx", "httpcore",
                 "asyncio", "fsspec", "py.warnings", "py4j", "pyspark")
#: with --debug: Spark's own logs print in the sessions the platform starts (dprelease.spark_logs)
DEBUG_ENVIRONMENT = {"DPRELEASE_SPARK_LOGS": "on"}


@contextmanager
def quiet_libraries(debug: bool) -> Iterator[None]:
    """For one command: library logs and warnings off (unless `debug`); everything is restored
    afterwards, so a command run inside a test process leaves no trace."""
    environment = DEBUG_ENVIRONMENT if debug else QUIET_ENVIRONMENT
    saved_env = {name: os.environ.get(name) for name in environment}
    for name, value in environment.items():
        os.environ.setdefault(name, value)
    if debug:
        try:
            yield
        finally:
            _restore(saved_env)
        return
    saved_levels = {name: logging.getLogger(name).level for name in NOISY_LOGGERS}
    for name in NOISY_LOGGERS:
        logging.getLogger(name).setLevel(logging.CRITICAL)
    console_handlers = _prefect_console_handlers()
    saved_handler_levels = [(handler, handler.level) for handler in console_handlers]
    for handler in console_handlers:
        handler.setLevel(logging.CRITICAL)
    root = logging.getLogger()
    silent_root = logging.NullHandler()  # no handler at all would send WARNING+ to logging.lastResort
    root.addHandler(silent_root)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        root.removeHandler(silent_root)
        for handler, level in saved_handler_levels:
            handler.setLevel(level)
        for name, level in saved_levels.items():
            logging.getLogger(name).setLevel(level)
        _restore(saved_env)


def _restore(saved_env: dict[str, str | None]) -> None:
    """The environment variables as they were before the command."""
    for name, value in saved_env.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


def _prefect_console_handlers() -> list[logging.Handler]:
    """Prefect's console handlers already installed in this process (when Prefect was imported
    before the command ran, as in a test process); later ones read the environment instead."""
    if "prefect" not in sys.modules:
        return []
    found = []
    for logger in (logging.getLogger(), logging.getLogger("uvicorn"), logging.getLogger("fastapi")):
        found += [h for h in logger.handlers if type(h).__name__ == "PrefectConsoleHandler"]
    return found


def silence_shutdown_noise() -> None:
    """At process exit, after every exit handler: flush, then send stderr to /dev/null, so
    what native libraries print while the interpreter is torn down (DuckDB's nanobind leak report)
    does not reach the terminal. Only for a real `dprelease` process, never inside a test run."""

    def redirect() -> None:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, 2)
        except OSError:
            pass

    atexit.register(redirect)  # registered first, so it runs last (exit handlers run in reverse)
