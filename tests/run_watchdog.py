"""Finding a release run's watchdog (dprelease.flows.watchdog) among real processes (Linux /proc),
and waiting for a process to end, for the tests that kill runs."""

from __future__ import annotations

import time
from pathlib import Path

from patience import PATIENCE_S

MODULE = b"dprelease.flows.watchdog"


def alive(pid: int) -> bool:
    """Whether the process exists and is not a zombie."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


def watchdog_of(run_pid: int, run_key: str) -> int:
    """The pid of the watchdog the process `run_pid` started for its run `run_key` (its child, whose
    command line names both); fails when there is none. A child caught in the middle of its exec
    (its command line still empty: the kernel sets it after it closed the parent's exec pipe, so
    after Popen returned) is looked at again."""
    deadline = time.monotonic() + PATIENCE_S  # a bound only a hung exec reaches
    while True:
        execing = False
        for pid, argv in _children(run_pid):
            if MODULE in argv and run_key.encode() in argv:
                return pid
            execing = execing or argv == [b""]
        assert execing and time.monotonic() < deadline, f"process {run_pid} started no watchdog for its run {run_key}"
        time.sleep(0.05)


def _children(pid: int) -> list[tuple[int, list[bytes]]]:
    """The children of a process, each with its command line's arguments."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                found.append((int(entry.name), (entry / "cmdline").read_bytes().split(b"\0")))
        except OSError:
            continue
    return found


def wait_gone(pid: int, what: str) -> None:
    """Wait for the process to end (a bound only a hung process reaches)."""
    deadline = time.monotonic() + PATIENCE_S
    while alive(pid):
        assert time.monotonic() < deadline, f"{what} (process {pid}) never ended"
        time.sleep(0.2)
