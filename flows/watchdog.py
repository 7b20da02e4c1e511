"""The watchdog of a release run: when the run's process dies (kill -9, the OOM killer, a stopped
worker), a process of its own settles the run's releases at once, by `dprelease recover`'s rules.

Why another process: nothing runs in a process killed with SIGKILL, and a Prefect 3.8.8 worker
stopped with SIGTERM SIGKILLs its run's process before it signals the run's group (docs/deployment.md,
"Stopping a worker"), so the run never hears the stop and its on_crashed hook never runs. Its release
stayed reserved until `dprelease recover` or the next sweep.

The contract:
- `watch(run_key)` (release.record, when the run records its release, before anything is reserved)
  starts `sys.executable -m dprelease.flows.watchdog` (this interpreter: no PATH lookup) in a session
  of its own (the worker's signals to the run's process group do not reach it), its standard input
  the read end of a pipe. Only the run holds the write end: it is not inheritable (a child started
  with exec, a Spark JVM, never has it) and a child forked without exec closes it at once
  (os.register_at_fork). Its output goes nowhere: not into the run's pipes, which a worker reads to
  their end, nor into a file of the analyst's.
- `finish(run_key, ended)` (the run hooks: the run ended through its own path) writes DONE when
  every release of the run is final, and closes the pipe: the watchdog exits, changing nothing.
- End of file without DONE: the run's process is gone (the kernel closed its end), or its flow ended
  leaving a release unfinished. Until then the watchdog held nothing open (no store, no file). It
  then (`settle_dead_run`):
  1. settles nothing if Prefect shows the run suspended (Paused to be rescheduled: its process exits
     by design and another resumes it; the release flows pause in their process, never suspend);
  2. ends each release of the run that is not final and whose lease is gone or names the run's own
     process (never one another process has taken over, as a retry of the run does) with recover's
     own code, recovery.stop: a budget not committed is refunded and the release marked failed; a
     committed one is published, its staged, signed report moved into place (its noise is never drawn
     again). Store.abandon's row lock makes a settle that races the sweep or `dprelease recover`
     harmless: the second finds the release final and changes nothing; a committed publication is
     finished by one of them at a time, after its run (dprelease.publication_lock);
  3. marks the Prefect run Crashed when it is still Pending, Running or Paused, saying that its
     process died and what became of each release (when the API answers).
  Then it exits.
- The watchdog killed itself (or its host gone with the run): nothing changes; the lease names a dead
  process, and the sweep and `dprelease recover` end the release as before.
"""

from __future__ import annotations

import os
import site
import subprocess
import sys
import threading
from pathlib import Path

#: the byte the run writes when its releases ended through its own path
DONE = b"d"
#: what a release the watchdog ended records as its reason (the analyst reads it)
DIED_REASON = ("its flow run's process died before the release ended (killed, out of memory, or its worker "
               "stopped): nothing was released and any budget reserved for it is refunded; submit the request again")
#: how the Crashed state's message begins
DIED = "The run's process died (killed, out of memory, or its worker stopped) before its releases ended"

_write_ends: dict[str, int] = {}  # run key -> the write end of its watchdog's pipe, in this process
_lock = threading.Lock()


def _close_in_forked_child() -> None:
    """A child forked without exec must not hold a write end: the watchdog would wait for it too."""
    for fd in _write_ends.values():
        try:
            os.close(fd)
        except OSError:
            pass
    _write_ends.clear()


os.register_at_fork(after_in_child=_close_in_forked_child)


def watch(run_key: str, flow_run_id: str | None) -> None:
    """Start the watchdog of this process's run `run_key` (its flow run id, or its release id when
    it runs outside a flow run), once per run and process (module docstring)."""
    from dprelease import recovery

    with _lock:
        if run_key in _write_ends:
            return
        read_end, write_end = os.pipe()  # neither is inheritable (PEP 446); stdin below is a copy
        _write_ends[run_key] = write_end
        pid = os.getpid()
        try:
            process = subprocess.Popen(
                [sys.executable, "-m", __name__, run_key, flow_run_id or "", recovery.this_host(), str(pid),
                 repr(recovery.process_started(pid))],
                stdin=read_end, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
                env=_environment())
        except OSError:  # no watchdog: the sweep and `dprelease recover` remain, as before
            del _write_ends[run_key]
            os.close(write_end)
            return
        finally:
            os.close(read_end)
    # reaped when it exits, while this process lives on (a command, a test session running many flows)
    threading.Thread(target=process.wait, name=f"watchdog-{run_key[:8]}", daemon=True).start()


def _environment() -> dict[str, str]:
    """The run's environment for its watchdog: the Prefect API the run uses (which may be set in
    Prefect's settings rather than the environment), where this `dprelease` was imported from, and no
    test pause point (the watchdog must not stop where the run was told to)."""
    from prefect.settings import PREFECT_API_URL

    import dprelease

    env = {k: v for k, v in os.environ.items() if not k.startswith("DPRELEASE_TEST_PAUSE")}
    if api := PREFECT_API_URL.value():
        env["PREFECT_API_URL"] = api
    root = Path(dprelease.__file__).resolve().parents[1]  # a checkout, or site-packages (found anyway)
    if root not in {Path(p).resolve() for p in site.getsitepackages()}:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (env.get("PYTHONPATH"), str(root)) if p)
    return env


def finish(run_key: str, ended: bool) -> None:
    """The run ended through its own path: DONE when `ended` (its releases are all final), then close
    the pipe; its watchdog exits (without DONE it first settles what the run left unfinished)."""
    with _lock:
        write_end = _write_ends.pop(run_key, None)
    if write_end is None:
        return
    try:
        if ended:
            os.write(write_end, DONE)
    except OSError:  # the watchdog was killed: nothing to tell it
        pass
    finally:
        os.close(write_end)


# -- the watchdog process --------------------------------------------------------------------------

def wait_for_end(fd: int = 0) -> bool:
    """Block until the run closes its end of the pipe (or dies); whether it wrote DONE first."""
    done = False
    while chunk := os.read(fd, 64):
        done = done or DONE in chunk
    return done


def settle_dead_run(run_key: str, flow_run_id: str | None, host: str, pid: int, started: float) -> list:
    """Steps 1-3 of the module docstring for the run `run_key` whose process (`pid` on `host`, started
    at `started`) ended without DONE; returns what recovery.stop did to each release."""
    from dprelease import pipeline, recovery
    from dprelease.settings import Settings
    from dprelease.store import FINAL_STATUSES

    settings = Settings.from_env()
    if not settings.home.exists():  # the home was removed (a test's temporary home): nothing to settle
        return []
    state = _prefect_state(flow_run_id)
    if state is not None and state.is_paused() and state.state_details.pause_reschedule:
        return []  # suspended: another process resumes it
    platform = pipeline.Platform.open(settings)
    done = []
    for release in platform.store.releases_of_run(run_key):
        lease = platform.store.get_lease(release.id)
        ours = lease is None or ((lease.host, lease.pid) == (host, pid) and lease.process_started in (0.0, started))
        if release.status not in FINAL_STATUSES and ours:
            done.append(recovery.stop(platform, release.id, DIED_REASON))
    if _still_running(state):
        _mark_crashed(flow_run_id, crashed_message(done))
    return done


def crashed_message(done: list) -> str:
    """The Crashed state's message: that the process died, and each release's outcome."""
    if not done:
        return f"{DIED}; nothing was left to settle."
    return f"{DIED}; its watchdog settled them as `dprelease recover` does: " + "; ".join(map(_ended, done)) + "."


def _ended(done) -> str:
    """One release's outcome (a recovery.Recovered), in the words of the Crashed state."""
    if done.outcome == "published":
        return f"release {done.release_id} had been approved: published, epsilon {done.epsilon:g} committed once"
    if done.outcome == "refunded":
        return (f"release {done.release_id} failed, epsilon {done.epsilon:g} refunded, nothing published "
                "(the analyst may submit it again)")
    return f"release {done.release_id} failed before anything was reserved (the analyst may submit it again)"


def _prefect_state(flow_run_id: str | None):
    """The run's state in Prefect, None without a flow run, an API, or an answer from it."""
    from prefect.settings import PREFECT_API_URL

    if not flow_run_id or not PREFECT_API_URL.value():  # no API: never an ephemeral server of our own
        return None
    from dprelease.flows.api_client import api_client

    try:
        with api_client() as client:
            return client.read_flow_run(flow_run_id).state
    except Exception:  # noqa: BLE001 - an unreachable API: the store is settled all the same
        return None


def _still_running(state) -> bool:
    """Whether Prefect still shows the run as one that goes on (Pending, Running, Paused): a final
    state, or a Cancelling one that Prefect is ending, is left as it is."""
    return state is not None and (state.is_pending() or state.is_running() or state.is_paused())


def _mark_crashed(flow_run_id: str, message: str) -> None:
    """Set the run's state to Crashed with `message` (forced: a Paused run too), if the API answers."""
    from prefect.states import Crashed

    from dprelease.flows.api_client import api_client

    try:
        with api_client() as client:
            client.set_flow_run_state(flow_run_id, Crashed(message=message), force=True)
    except Exception:  # noqa: BLE001 - the API went away: the release is settled, the run's state is Prefect's
        pass


def main(argv: list[str]) -> int:
    """`python -m dprelease.flows.watchdog RUN_KEY FLOW_RUN_ID HOST PID STARTED`, started by `watch`.
    Its output goes nowhere: a settle that fails says so in the run's Crashed state, if it can."""
    run_key, flow_run_id, host, pid, started = argv
    if wait_for_end():
        return 0
    try:
        settle_dead_run(run_key, flow_run_id or None, host, int(pid), float(started))
    except Exception as err:  # the store unreachable, say: recover and the sweep remain
        state = _prefect_state(flow_run_id or None)
        if _still_running(state):
            _mark_crashed(flow_run_id, f"{DIED}; its watchdog could not settle them ({str(err)[:300]}): "
                          "run `dprelease recover`")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
