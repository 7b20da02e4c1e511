"""A `prefect worker start` process started and stopped as a service manager does (systemd: every
signal at its default on start, SIGTERM on `systemctl stop`, SIGKILL only after the stop timeout).

Prefect 3.8.8's worker turns SIGTERM into a SIGINT to itself (prefect.utilities.processutils,
setup_signal_handlers_worker): that SIGINT cancels its loops, SIGTERMs each of its runs' process
groups (SIGKILL after 30 s each) and exits, in under a second here (a release awaiting approval,
mid-compute or mid-publication alike: 0.4-0.6 s, 2026-11-29). A worker that inherited SIGINT
*ignored* (a background job of a non-interactive shell: `.ci/run > log &`) re-sends the SIGINT
into that ignored disposition and never stops: SIGTERM is lost, and only SIGKILL ends it (the
two-host module's teardown waited 60 s for that, then killed it). So a worker is started here with
SIGINT at its default, as systemd starts a service, whatever the test process inherited.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from patience import PATIENCE_S


def start_worker(pool: str, args: list[str], cwd: Path, env: dict, log: Path) -> subprocess.Popen:
    """`prefect worker start --pool <pool> <args>` in a session of its own, SIGINT at its default
    (a handled signal is reset to the default at exec: the child's Python then handles it)."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)  # main thread only, as fixtures run
    try:
        with open(log, "wb") as out:
            return subprocess.Popen([sys.executable, "-m", "prefect", "worker", "start", "--pool", pool, *args],
                                    cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    finally:
        signal.signal(signal.SIGINT, previous)


def stop_worker(proc: subprocess.Popen) -> str | None:
    """Stop a worker as `systemctl stop` does: SIGTERM, then SIGKILL only once a hung worker outlived
    PATIENCE_S. Returns what went wrong (None: it stopped by itself, exit status 0)."""
    if proc.poll() is not None:
        return None
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        status = proc.wait(PATIENCE_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(PATIENCE_S)
        return f"the worker (pid {proc.pid}) ignored SIGTERM for {PATIENCE_S:.0f} s"
    return None if status == 0 else f"the worker (pid {proc.pid}) stopped with status {status} on SIGTERM"
