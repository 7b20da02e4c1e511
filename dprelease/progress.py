"""Progress of long steps (registration, data checks, the compute step), so none is silent.

`track(label, total, unit)` gives an `advance(n)` callable: a rich progress bar on stderr when it
is a terminal, else log lines (logger "dprelease.progress", or the Prefect run logger inside a
flow run) at most every LOG_EVERY seconds and at the end. Prefect is never imported here: its run
logger is used only when Prefect is already loaded (a flow is running).
"""

from __future__ import annotations

import logging
import os
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

LOG_EVERY = 5.0  # seconds between log lines when there is no terminal

_log = logging.getLogger("dprelease.progress")


def _logger():
    """The Prefect run logger inside a flow run, else "dprelease.progress" (on stderr when the
    application configured no logging, so a CLI without a terminal still shows progress)."""
    if "prefect" in sys.modules:
        try:
            from prefect.logging import get_run_logger

            return get_run_logger()
        except Exception:  # noqa: BLE001, S110 - outside a flow or task run: the module logger
            pass
    if not _log.handlers and not logging.getLogger().handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(message)s"))
        _log.addHandler(handler)
        _log.setLevel(logging.INFO)
        _log.propagate = False
    return _log


def _use_bar() -> bool:
    if os.environ.get("DPRELEASE_PROGRESS") == "log":
        return False
    return sys.stderr.isatty() and os.environ.get("TERM") != "dumb"


def note(message: str) -> None:
    """One progress line (a phase starting): on stderr in a terminal, else logged."""
    if _use_bar():
        print(message, file=sys.stderr, flush=True)
    else:
        _logger().info(message)


@contextmanager
def track(label: str, total: int | None = None, unit: str = "rows") -> Iterator[Callable[[int], None]]:
    """Count work as it is done; `total` None gives a counter without a percentage."""
    if _use_bar():
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        columns = [TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                   TextColumn(unit), TimeElapsedColumn()]
        with Progress(*columns, console=Console(stderr=True), transient=False) as bar:
            task = bar.add_task(label, total=total)
            yield lambda n: bar.advance(task, n)
        return
    logger = _logger()
    state = {"done": 0, "last": time.monotonic()}
    started = state["last"]

    def line() -> str:
        share = f" ({state['done'] / total:.0%})" if total else ""
        return f"{label}: {state['done']:,}{f' of {total:,}' if total else ''} {unit}{share}"

    def advance(n: int) -> None:
        state["done"] += n
        now = time.monotonic()
        if now - state["last"] >= LOG_EVERY:
            state["last"] = now
            logger.info(line())

    logger.info(f"{label}: started")
    yield advance
    logger.info(f"{line()}, done in {time.monotonic() - started:.1f} s")
