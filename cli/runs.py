"""A flow run that belongs to this command: created up front (so the command knows its own
release: the release id is the flow run id), run in a thread of this process, and stopped cleanly
by SIGINT or SIGTERM whatever step it is at.

An interrupt always ends the same way: the release is stopped (its reservation refunded and the
release marked failed in one store transaction; a release the controller had already approved,
whose budget is committed, finishes publishing instead: the command says it waits for that, and
waits), its Prefect flow run is marked Cancelled, one line is printed on stderr, and the command
exits with 128 + the signal number (130 for SIGINT, 143 for SIGTERM). Releases left by commands
that died without that chance (kill -9) are settled by their run's watchdog, else recovered by the
sweep each command runs first (dprelease.recovery).
"""

from __future__ import annotations

import gc
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from contextlib import contextmanager

from dprelease import pipeline, recovery
from dprelease.settings import Settings
from dprelease.store import StoreError

from . import prefect_server

_stopping = threading.Lock()  # held by the one thread that stops this command's run
SIGNAL_NAMES = {signal.SIGINT: "SIGINT", signal.SIGTERM: "SIGTERM"}


class Interrupted(Exception):
    """SIGINT or SIGTERM reached this command."""

    def __init__(self, signum: int) -> None:
        super().__init__(SIGNAL_NAMES.get(signum, str(signum)))
        self.signum = signum


def _raise_interrupted(signum, frame) -> None:
    for sig in SIGNAL_NAMES:  # one stop: a second Ctrl-C does not interrupt the cleanup
        signal.signal(sig, signal.SIG_IGN)
    raise Interrupted(signum)


class OwnRun:
    """The flow run this command started: its id, its thread, whether that thread's work has ended
    (`ended`, set by the thread itself), and what it returned or raised.

    Why `ended` and never `worker.is_alive()` or `worker.join()`: on CPython 3.11 and 3.12 a join
    that the signal handler's Interrupted breaks off releases the thread's own state lock and marks
    the thread stopped while it still runs (threading.Thread._wait_for_tstate_lock's bpo-45274
    clause, taken whenever the lock is held, which a living thread always does). The stop then
    took a run still publishing an approved release for ended and finished the publication beside
    it (see _stop). An Event the thread sets as it ends is not changed by a wait broken off."""

    def __init__(self, settings: Settings, flow_run_id: str, worker: threading.Thread, out: dict,
                 ended: threading.Event) -> None:
        self.settings, self.flow_run_id, self.worker, self.out, self.ended = settings, flow_run_id, worker, out, ended
        self.release_id = flow_run_id
        self.platform = pipeline.Platform.open(settings)

    def running(self) -> bool:
        """Whether the run's thread is still at work (its hooks included)."""
        return not self.ended.is_set()

    def wait_for_approval(self) -> bool:
        """Wait until this run pauses for a decision (True), or ends (False). No deadline of its
        own: while the run's thread lives it is on its way (a busy Prefect server can take minutes
        to record the pause; the run's approval timeout bounds the wait that follows)."""
        from dprelease.flows.approvals import awaiting_here, forget_awaiting

        said_awaiting = awaiting_here(self.release_id)  # set by the flow's thread as it asks
        try:
            return self._wait_for_pause(said_awaiting)
        finally:
            forget_awaiting(self.release_id, said_awaiting)

    def _wait_for_pause(self, said_awaiting: threading.Event) -> bool:
        from dprelease.flows.approvals import QUICK_POLL_SECONDS, wait_until_paused

        while self.running():
            said_awaiting.clear()  # before each look: a pause asked after it sets it again
            try:
                status = self.platform.store.get_release(self.release_id).status
            except StoreError:  # not recorded yet
                status = None
            if status == "awaiting_approval":
                try:
                    wait_until_paused(self.flow_run_id, timeout=5, poll_s=QUICK_POLL_SECONDS)
                    return True
                except RuntimeError:  # the run ended instead of pausing
                    return False
                except TimeoutError:  # not paused yet: look again while the run lives
                    continue
            # each look at the store takes its write lock (BEGIN IMMEDIATE): look when the flow's
            # thread says it asks, else every 0.3 s (a run started elsewhere, or one that ends)
            said_awaiting.wait(0.3)
        return False

    def result(self) -> dict:
        while not self.ended.wait(0.3):  # in short steps, so that a signal is handled at once
            pass
        if "error" in self.out:
            raise self.out["error"]
        return self.out["result"]


@contextmanager
def _without_prefect_heartbeat():
    """Prefect settings for this command's own run without Prefect's flow-run heartbeat. The run's
    liveness is its release lease (dprelease.recovery: renewed every 5 s, swept when it lapses);
    Prefect's heartbeat (every 180 s) would only add a thread that sleeps in 1 s steps and is
    joined when the run ends: up to a second at the end of every release (0.5-1.1 s profiled)."""
    from prefect.context import SettingsContext
    from prefect.settings import get_current_settings

    current = get_current_settings()
    quiet = current.model_copy(update={"flows": current.flows.model_copy(update={"heartbeat_frequency": None})})
    with SettingsContext(profile=SettingsContext.get().profile, settings=quiet):
        yield


@contextmanager
def own_run(settings: Settings, flow_obj, params: dict, request, warm: Callable[[], None] | None = None):
    """Recover dead runs, create this command's flow run, run it in a thread, and stop it on
    SIGINT/SIGTERM (exits the process: see the module docstring). `warm` imports what the flow will
    need while the Prefect server boots (cli/prefect_server.py)."""
    from prefect.flow_engine import run_flow

    from dprelease.flows.api_client import api_client
    from dprelease.flows.outcomes import outcome, stored_outcome

    platform = pipeline.Platform.open(settings)
    in_main_thread = threading.current_thread() is threading.main_thread()  # only it may handle signals
    previous = {sig: signal.signal(sig, _raise_interrupted) for sig in SIGNAL_NAMES} if in_main_thread else {}
    run = None
    try:
        prefect_server.wait_ready(warm)
        for done in recovery.sweep(platform):
            print(f"dprelease: recovered {done.line()}", file=sys.stderr, flush=True)
        if warm is not None:  # already loaded while a temporary server booted; with a shared one, now
            warm()
        gc.freeze()  # what is loaded by now lives until exit: later collections skip it (0.3 s a release)
        gc.enable()  # off while the command imported (dprelease.cli.errors._collect_after_startup)
        with api_client() as client:
            flow_run = client.create_flow_run(flow_obj, parameters=params)
        out: dict = {}
        ended = threading.Event()

        def work() -> None:
            try:
                # a rejected release ends in its own final state, "Rejected" (dprelease.flows.outcomes)
                with _without_prefect_heartbeat():
                    state = run_flow(flow_obj, flow_run=flow_run, parameters=params, return_type="state")
                out["result"] = outcome(state, stored=lambda: stored_outcome(platform, str(flow_run.id)))
            except BaseException as err:  # noqa: BLE001 - re-raised by OwnRun.result
                out["error"] = _told_by_the_store(platform, str(flow_run.id), err)
            finally:
                ended.set()

        worker = threading.Thread(target=work, name="flow-run", daemon=True)
        worker.start()
        run = OwnRun(settings, str(flow_run.id), worker, out, ended)
        threading.Thread(target=_watch_cancellation, args=(platform, run, request), name="cancel-watch",
                         daemon=True).start()
        yield run
    except Interrupted as stop:
        _stop_and_exit(platform, run, request, stop.signum)
    except Exception as err:  # the command ends with an error: its release ends with it, never left reserved
        if run is None or _finished(platform, run):
            raise
        from .errors import EXIT_REFUSED, describe

        _, what = _stop(platform, run, request, f"the command ended: {str(err)[:300]}")
        message, code = describe(err)
        if code == EXIT_REFUSED:  # a refusal (a decision that cannot count): its line says what became of the release
            raise pipeline.ReleaseError(f"{message} (release {run.release_id} stopped, {what})") from None
        raise
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _told_by_the_store(platform: pipeline.Platform, flow_run_id: str, err: BaseException) -> BaseException:
    """A run that ended without its exception (Prefect's FailedRun: a pause nobody answered before
    the timeout) is told by its release's record: "release ... ended expired: nobody answered in
    time" (refunded, nothing published: an outcome in one line, not a bug)."""
    from prefect.exceptions import FailedRun

    from dprelease.flows.outcomes import stored_outcome

    if not isinstance(err, FailedRun):
        return err
    try:
        stored_outcome(platform, flow_run_id)
    except pipeline.ReleaseError as told:
        return told
    return err


def _watch_cancellation(platform: pipeline.Platform, run: OwnRun, request, every_s: float = 2.0) -> None:
    """Cancel from the Prefect UI: a run in this process has no worker to stop it, so this command
    watches its run's state and, once it is cancelling or cancelled, stops the release (exit 1)."""
    from dprelease.flows.api_client import api_client
    from dprelease.flows.outcomes import is_rejected

    with api_client() as client:  # one client for the whole watch
        while run.running():
            time.sleep(every_s)
            try:
                state = client.read_flow_run(run.flow_run_id).state
            except Exception:  # noqa: BLE001, S112 - an unreachable server is not a cancellation
                continue
            if is_rejected(state):  # the controller's rejection, not a cancel
                return
            if state is not None and (state.is_cancelling() or state.is_cancelled()):
                _stop_and_exit(platform, run, request, None)


def _stop_and_exit(platform: pipeline.Platform, run: OwnRun | None, request, signum: int | None) -> None:
    """The one way an interrupted (signum) or cancelled (None) command ends (module docstring)."""
    if not _stopping.acquire(blocking=False):  # a signal and a cancellation at once: the first one acts
        while True:
            time.sleep(60)
    name = SIGNAL_NAMES.get(signum, str(signum)) if signum is not None else "cancelled in the Prefect UI"
    if run is None:
        _exit(f"interrupted ({name}) before the release started: nothing was reserved", signum)
    reason = f"interrupted by {name} at the command line" if signum is not None else "cancelled in the Prefect UI"
    outcome, what = _stop(platform, run, request, reason)
    if outcome in ("published", "unfinished"):
        message = f"interrupted ({name}) after the release {run.release_id} was approved: {what}"
    else:
        message = f"interrupted ({name}): release {run.release_id} stopped, {what}"
    _exit(message, signum)


def _finished(platform: pipeline.Platform, run: OwnRun) -> bool:
    """Whether the run's release has ended (or was never recorded): nothing of it is left to stop."""
    from dprelease.store import FINAL_STATUSES

    if run.running():
        return False
    try:
        return platform.store.get_release(run.release_id).status in FINAL_STATUSES
    except StoreError:
        return True


def _stop(platform: pipeline.Platform, run: OwnRun, request, reason: str) -> tuple[str, str]:
    """End this command's release as the module docstring says (refunded and marked failed, or, once
    approved and committed, published by its run) and mark its flow run Cancelled. Returns the
    outcome (published, refunded, marked, or unfinished: committed, and what is left said with the
    command that finishes it) and the words for it.

    An approved release is finished by one writer at a time: its run, which this waits for (said on
    stderr: the command does not end at once), then recovery.stop, which completes what the run left
    (a run that failed after the commit) under the publication's lock (dprelease.publication_lock),
    as the run's watchdog and `dprelease recover` do."""
    store = platform.store
    try:
        store.get_release(run.release_id)
    except StoreError:  # not recorded yet: record it as failed, so the run can reserve nothing
        try:
            store.add_release(request.dataset, request.to_json(), release_id=run.release_id, status="failed",
                              flow_run_id=run.flow_run_id)
            store.update_release(run.release_id, decision_comment=reason)
        except StoreError:  # recorded meanwhile by the run itself
            pass
    ledger = store.abandon(run.release_id, "failed", reason)
    if ledger == "committed":  # approved and publishing: let the run finish it
        if run.running():
            print(f"dprelease: release {run.release_id} was approved and is being published: waiting for its run "
                  "to finish the publication", file=sys.stderr, flush=True)
        run.ended.wait()
    try:
        done = recovery.stop(platform, run.release_id, reason)
    except Exception as err:  # noqa: BLE001 - said with what finishes it (the run is over: recover may)
        if ledger != "committed":
            raise
        return "unfinished", (f"its budget is committed but its publication could not be finished here "
                              f"({str(err)[:300]}): run `dprelease recover` to finish it")
    _cancel_flow_run(run.flow_run_id, reason)
    release = store.get_release(run.release_id)
    status = release.status
    if status == "published":
        return "published", "it is published"
    if ledger == "committed":
        return "unfinished", (f"its budget is committed but it is not published, marked {status}: "
                              f"{release.decision_comment}")
    if done.outcome == "refunded" or ledger == "refunded":
        return "refunded", f"epsilon {done.epsilon:g} refunded, marked {status}"
    return "marked", f"nothing was reserved, marked {status}"


def _cancel_flow_run(flow_run_id: str, reason: str, wait_s: float = 5.0) -> None:
    """Mark the Prefect flow run Cancelled (best effort, a few seconds at most)."""
    from dprelease.flows.approvals import cancel_flow_run

    thread = threading.Thread(target=cancel_flow_run, args=(flow_run_id, reason), daemon=True)
    thread.start()
    thread.join(wait_s)


def _exit(message: str, signum: int | None) -> None:
    """Print the one line, stop the temporary server, and end the process at once (the flow's
    thread with it): 128 + the signal number, or 1 for a cancellation."""
    print(f"dprelease: {message}", file=sys.stderr, flush=True)
    sys.stdout.flush()
    prefect_server.stop()
    os._exit(1 if signum is None else 128 + signum)

