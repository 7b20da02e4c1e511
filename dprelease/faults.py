"""Test-only pause points, to kill a run at a precise step (tests/test_interrupts.py).

The one place outside `settings` that reads the environment, and only for this: when
DPRELEASE_TEST_PAUSE_AT names the step a run reaches, the run writes its pid and the step to the
file DPRELEASE_TEST_PAUSE_MARKER and sleeps until it is killed, or until the test removes the marker
(the run then goes on). Unset, a pause point does nothing.
Steps: command_start (a `dprelease` command parsed, nothing done yet), after_checks, after_reserve,
after_seal, during_publication (budget committed, the signed publication staged, not yet in place),
snapshot_sealed (a series' snapshot sealed and its dataset recorded, the snapshot not yet).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

STEPS = ("command_start", "after_checks", "after_reserve", "after_seal", "during_publication", "snapshot_sealed")


def pause_point(step: str) -> None:
    """Sleep here if a test asked to stop the run at `step`: until the process is killed, or until the
    marker file is removed (forever without a marker)."""
    if os.environ.get("DPRELEASE_TEST_PAUSE_AT") != step:
        return
    marker = os.environ.get("DPRELEASE_TEST_PAUSE_MARKER")
    if marker:
        Path(marker).write_text(f"{os.getpid()} {step}\n")
    while not marker or Path(marker).exists():
        time.sleep(0.2)
