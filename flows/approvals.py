"""Answering a paused release flow: wait until Prefect has it paused, then resume it with the
controller's decision (the same form the UI's Resume dialog fills)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

#: seconds between looks at the server while a pause is expected at once (this process's own
#: run, whose flow thread said it is pausing: awaiting_here) or a resumed run should leave it;
#: the wait grows by half at each look, up to SLOW_POLL_SECONDS, so a run that takes its time is
#: not asked fifty times a second
QUICK_POLL_SECONDS = 0.02
SLOW_POLL_SECONDS = 0.2
_awaiting_here: dict[str, threading.Event] = {}
_awaiting_lock = threading.Lock()


def looks(timeout: float, first_s: float, last_s: float = SLOW_POLL_SECONDS) -> Iterator[None]:
    """Yield before each look until `timeout` seconds have passed, sleeping between looks: first
    `first_s`, then half as long again each time, up to `last_s`. The caller decides after the
    loop what running out of time means."""
    deadline, wait = time.monotonic() + timeout, first_s
    while True:
        yield
        if time.monotonic() >= deadline:
            return
        time.sleep(wait)
        wait = min(wait * 1.5, last_s)


def awaiting_here(release_id: str) -> threading.Event:
    """Set by the flow (in the thread of this process that runs it) the moment a release starts
    awaiting a decision: the command answering its own run waits on it instead of polling the store."""
    with _awaiting_lock:
        return _awaiting_here.setdefault(release_id, threading.Event())


def forget_awaiting(release_id: str, event: threading.Event) -> None:
    """Drop the release's event (its pause is over, or its command stopped waiting), so that a
    long-lived process that runs many flows keeps none of them; only the caller's own event, never
    one a later wait of the same release (the `utility` command's next decision) has taken since."""
    with _awaiting_lock:
        if _awaiting_here.get(release_id) is event:
            del _awaiting_here[release_id]


def wait_until_paused(flow_run_id: str, timeout: float = 60.0, poll_s: float = SLOW_POLL_SECONDS) -> None:
    """The store says "awaiting approval" just before the flow pauses: wait for the pause itself,
    and for the form it waits for with its description. Prefect sets the Paused state first, then
    saves the form's schema, then its description (prefect.flow_runs.pause_flow_run); a resume
    before the schema is refused by the server ("Run input schema not found"), which a loaded
    machine made happen, and a dialog read before the description lacks the controller summary
    (every dprelease pause has one: flows.release.ask_controller)."""
    from dprelease.flows.api_client import api_client

    with api_client() as client:
        for _ in looks(timeout, poll_s):
            state = client.read_flow_run(flow_run_id).state
            if state is not None and state.is_paused() and _form_saved(client, flow_run_id, state):
                return
            if state is not None and state.is_final():
                raise RuntimeError(f"flow run {flow_run_id} ended ({state.name}) before it asked for approval")
    raise TimeoutError(f"flow run {flow_run_id} did not pause within {timeout:g} s")


def _form_saved(client, flow_run_id: str, state) -> bool:
    """The paused state's input form (its schema) and its description are on the server, or the
    pause waits for none."""
    from prefect.exceptions import PrefectHTTPStatusError

    keyset = state.state_details.run_input_keyset
    if not keyset:
        return True
    try:
        client.read_flow_run_input(flow_run_id, keyset["schema"])
        client.read_flow_run_input(flow_run_id, keyset["description"])
    except PrefectHTTPStatusError as err:
        if err.response.status_code == 404:
            return False
        raise
    return True


def answer(flow_run_id: str, decision: str, reviewer: str, comment: str = "", timeout: float = 60.0,
           signed_decision: str = "") -> None:
    """Resume the paused flow run with a decision ("approve" or "reject") and the controller's
    signed decision (the only part that counts), then wait until the run has left the pause (so
    that a next pause is not mistaken for this one)."""
    from dprelease.flows.api_client import api_client

    wait_until_paused(flow_run_id, timeout, QUICK_POLL_SECONDS)
    with api_client() as client:
        _resume(client, flow_run_id, {"decision": decision, "reviewer": reviewer, "comment": comment,
                                      "signed_decision": signed_decision})
        for _ in looks(timeout, QUICK_POLL_SECONDS):
            state = client.read_flow_run(flow_run_id).state
            if state is None or not state.is_paused():
                return


def _resume(client, flow_run_id: str, run_input: dict) -> None:
    """prefect.flow_runs.resume_flow_run, on this process's client: a run that is not paused, or a
    resume the server rejects, raises as there."""
    from prefect.client.schemas.objects import StateType
    from prefect.client.schemas.responses import SetStateStatus
    from prefect.exceptions import FlowPauseTimeout, NotPausedError

    run = client.read_flow_run(flow_run_id)
    if not run.state or not run.state.is_paused():
        raise NotPausedError("Cannot resume a run that isn't paused!")
    response = client.resume_flow_run(flow_run_id, run_input=run_input)
    if response.status == SetStateStatus.REJECT:
        if response.state and response.state.type == StateType.FAILED:
            raise FlowPauseTimeout("Flow run can no longer be resumed.")
        raise RuntimeError(f"Cannot resume this run: {response.details.reason}")


def cancel_flow_run(flow_run_id: str, reason: str) -> None:
    """Mark a flow run Cancelled (its process is gone or stopping): the UI then shows the truth
    instead of a run Running or Paused forever. Best effort: an unreachable server is ignored.
    Without PREFECT_API_URL there is no shared server to correct (a command's temporary server keeps
    its runs in a private database that ends with it)."""
    from prefect.settings import PREFECT_API_URL
    from prefect.states import Cancelled

    from dprelease.flows.api_client import api_client

    if not PREFECT_API_URL.value():
        return
    try:
        with api_client() as client:
            client.set_flow_run_state(flow_run_id, Cancelled(message=reason[:200]), force=True)
    except Exception:  # noqa: BLE001 - the store already holds the truth; the UI is a view of it
        pass
