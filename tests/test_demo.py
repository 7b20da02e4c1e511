"""`make demo`'s command runs the whole platform from nothing (a subprocess, no terminal: it
approves automatically and says so) and ends with a verified, signed publication."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from patience import PATIENCE_S


def test_demo_runs_end_to_end_without_a_terminal(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DPRELEASE_", "PREFECT_"))}
    cli = Path(sys.executable).with_name("dprelease")
    done = subprocess.run([str(cli), "demo"], cwd=tmp_path, env=env, stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, timeout=PATIENCE_S)
    out = done.stdout
    assert done.returncode == 0, out + done.stderr
    assert "no terminal: approved automatically" in out
    assert "verify: OK, signature and every file intact" in out
    published = list((tmp_path / "demo-output" / "published").glob("*/index.html"))
    assert len(published) == 1
    controller = list((tmp_path / "demo-output" / "archive").glob("*/controller/controller.html"))
    assert len(controller) == 1 and "partition" in controller[0].read_text().lower()
