"""`make demo`'s command runs the whole platform from nothing (a subprocess, no terminal: it
approves automatically and says so) and ends with a verified, signed publication.

A demo is a Prefect server's boot and a release (10-25 CPU-seconds): each runs for more than one
check. The demo from nothing, with a clean environment, is the installed wheel's
(tests/test_wheel.py, which checks what the first test here checked); here, two demos with your
settings exported, the first held while a second is refused in its directory."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from patience import PATIENCE_S

CLI = str(Path(sys.executable).with_name("dprelease"))


def _clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith(("DPRELEASE_", "PREFECT_"))}


def test_the_demo_never_touches_your_home_store_keys_or_prefect_server_and_runs_one_at_a_time(tmp_path):
    """`make demo` with your settings exported (the guides export DPRELEASE_HOME): your home, store,
    keys and Prefect server are neither read nor changed; the demo runs in ./demo-output, and its
    next run replaces only what a demo made.

    Two `make demo` at once in one directory: the second deleted ./demo-output under the first
    (its store, keys and escrow). It is now refused in one line while the first runs, and the first,
    held at a step of its release (dprelease/faults.py), then finishes as if alone."""
    yours = tmp_path / "yours"
    yours.mkdir()
    (yours / "store.db").write_text("your budget ledger")
    env = _clean_env()
    env.update(DPRELEASE_HOME=str(yours), DPRELEASE_KEY_DIR=str(yours / "keys"),
               DPRELEASE_STORE_URL=f"sqlite:///{yours / 'store.db'}", DPRELEASE_CONTROLLER_KEY=str(yours / "me.pem"),
               PREFECT_HOME=str(yours / "prefect"),
               PREFECT_API_URL="http://127.0.0.1:9/api")  # a server that is not there
    work = tmp_path / "work"
    work.mkdir()
    marker = tmp_path / "first-demo-paused"
    first = subprocess.Popen([CLI, "demo"], cwd=work, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True,
                             env={**env, "DPRELEASE_TEST_PAUSE_AT": "after_checks",
                                  "DPRELEASE_TEST_PAUSE_MARKER": str(marker)})
    try:
        deadline = time.monotonic() + PATIENCE_S
        while not marker.exists() and first.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)  # polls for the marker: the bound is the suite's patience, not a timing
        assert marker.exists(), first.communicate()
        home = work / "demo-output"

        def held() -> list:  # the first demo's store, keys and escrow (its Prefect folder is its server's)
            return sorted(str(p.relative_to(home)) for p in home.rglob("*") if p.relative_to(home).parts[0] != "prefect")

        before = held()
        assert "store.db" in before and any(p.startswith("escrow/") for p in before)
        second = subprocess.run([CLI, "demo"], cwd=work, env=env, stdin=subprocess.DEVNULL, capture_output=True,
                                text=True, timeout=PATIENCE_S)
        assert second.returncode == 2, second.stdout + second.stderr
        assert second.stderr.strip().splitlines() == [
            f"error: another `dprelease demo` is running in {work}: wait for it to end, or run this one from "
            "another directory"]
        assert held() == before
        marker.unlink()  # the first demo goes on
        out, err = first.communicate(timeout=PATIENCE_S)
    finally:
        if first.poll() is None:
            first.kill()
    assert first.returncode == 0, out + err
    assert "verify: OK, signature and every file intact" in out
    assert len(list((work / "demo-output" / "published").glob("*/index.html"))) == 1
    # the next run replaces the first's home
    done = subprocess.run([CLI, "demo"], cwd=work, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                          timeout=PATIENCE_S)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "verify: OK, signature and every file intact" in done.stdout
    assert len(list((work / "demo-output" / "published").glob("*/index.html"))) == 1
    assert sorted(p.name for p in yours.iterdir()) == ["store.db"]
    assert (yours / "store.db").read_text() == "your budget ledger"


def test_the_demo_refuses_a_demo_output_folder_it_did_not_make(tmp_path):
    """./demo-output holding something else (not a demo's home) is refused in one line, left as it was."""
    kept = tmp_path / "demo-output" / "notes.txt"
    kept.parent.mkdir()
    kept.write_text("mine")
    (tmp_path / "demo-output" / "store.db").write_text("not a demo's")
    done = subprocess.run([CLI, "demo"], cwd=tmp_path, env=_clean_env(), stdin=subprocess.DEVNULL, capture_output=True,
                          text=True, timeout=PATIENCE_S)
    assert done.returncode == 2, done.stdout + done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "move it away" in lines[0], done.stderr
    assert sorted(p.name for p in kept.parent.iterdir()) == ["notes.txt", "store.db"]
