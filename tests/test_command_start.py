"""A command's start, before it has done anything: Ctrl-C there, or a home with no store, is one
line and nothing written or started.

Ctrl-C (SIGINT) before a command has done anything: one line that says so, exit 130, no traceback,
nothing written. A release's own interrupt (cli/runs.py, tests/test_operations.py) is installed once
its flow is about to start; before that, and in every other command, Ctrl-C ended the command with
exit 130 and not a word. Real `dprelease` processes and a real signal, stopped at their start by
the test-only pause point `command_start` (dprelease/faults.py)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from patience import PATIENCE_S

CLI = str(Path(sys.executable).with_name("dprelease"))
REQUEST = ("dataset: small\nsql: SELECT WITH ANONYMIZATION g, ANON_COUNT(*, 1) AS n FROM small GROUP BY g\n"
           "epsilon: 1\n")


@pytest.mark.parametrize("args", [
    ("release", "request.yaml", "--approve-as", "alice"),
    ("request", "submit", "request.yaml", "--as", "ana", "--key", "ana.pem"),
    ("dataset", "register", "small", "small.csv", "--unit", "uid", "--epsilon-cap", "5"),
    ("init",),
    ("budget",),
], ids=" ".join)
def test_ctrl_c_at_a_command_s_start_is_one_line_and_exit_130(tmp_path, args):
    (tmp_path / "request.yaml").write_text(REQUEST)
    (tmp_path / "small.csv").write_text("uid,g\n" + "".join(f"{i},{'ab'[i % 2]}\n" for i in range(40)))
    marker = tmp_path / "paused"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DPRELEASE_", "PREFECT_"))}
    env.update(DPRELEASE_HOME=str(tmp_path / "home"), PREFECT_HOME=str(tmp_path / "prefect"),
               DPRELEASE_TEST_PAUSE_AT="command_start", DPRELEASE_TEST_PAUSE_MARKER=str(marker))
    # SIGINT at its default in the child, as in a terminal (a shell's background job would ignore it)
    proc = subprocess.Popen([CLI, *args], cwd=tmp_path, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, process_group=0,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        deadline = time.monotonic() + PATIENCE_S
        while not marker.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)  # polls for the marker: the bound is the suite's patience, not a timing
        assert marker.exists(), proc.communicate()
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=PATIENCE_S)
    finally:
        if proc.poll() is None:
            proc.kill()
    words = " ".join(args[:2] if args[0] in ("dataset", "request") else args[:1])
    assert proc.returncode == 130, out + err
    assert err.strip().splitlines() == [f"dprelease: interrupted (SIGINT): `dprelease {words}` stopped"], err
    assert "Traceback" not in out + err
    assert not (tmp_path / "home").exists(), "a command stopped at its start wrote into the home"


@pytest.mark.parametrize("args", [("release", "request.yaml", "--approve-as", "alice"), ("console", "--port", "8499")],
                         ids=" ".join)
def test_a_command_on_a_home_with_no_store_starts_no_prefect_server(tmp_path, args):
    """`dprelease release` and `dprelease console` before `dprelease init`: one line (run `dprelease
    init` first), exit 2, and no Prefect server started for nothing (the release started this
    PREFECT_HOME's local server, and the console printed "listening" and kept it for 30 minutes)."""
    (tmp_path / "request.yaml").write_text(REQUEST)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DPRELEASE_", "PREFECT_"))}
    env.update(DPRELEASE_HOME=str(tmp_path / "home"), PREFECT_HOME=str(tmp_path / "prefect"))
    try:
        done = subprocess.run([CLI, *args], cwd=tmp_path, env=env, stdin=subprocess.DEVNULL, capture_output=True,
                              text=True, timeout=PATIENCE_S)
    finally:  # a server started by mistake is stopped, not left for 30 minutes
        if (tmp_path / "prefect").exists():
            subprocess.run([CLI, "server", "--stop"], env=env, capture_output=True, timeout=PATIENCE_S)
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr.strip().splitlines() == [
        f"error: directory {tmp_path / 'home'} of the SQLite store does not exist: run `dprelease init` first"]
    assert done.stdout == ""
    assert not (tmp_path / "prefect").exists() and not (tmp_path / "home").exists()
