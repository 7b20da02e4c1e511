"""A release's outcome from its flow run's final state, decided in one place.

A rejected release ends in its own final state: Cancelled, named "Rejected" (not a green
Completed, and not a cancellation either: the controller decided, the budget is refunded, and the
state still carries the release's outcome). Every place that reads a run's end asks `is_rejected`.

Prefect keeps a flow's return value in memory only (results are not persisted), so a final state
that comes back from the API carries no value. That happens when the API's answer to the final
transition is lost (a timeout or a dropped connection under load): the client retries, the server
has already committed the transition and rejects the duplicate with the run's stored state
(Prefect's PreventDuplicateTransitions). The run did end as that state says; its outcome is then
read from the release store, which the flow wrote before it returned (`stored_outcome`).
"""

from __future__ import annotations

from collections.abc import Callable

from prefect.exceptions import MissingResult
from prefect.states import Cancelled, State

from dprelease.pipeline import ReleaseError

REJECTED = "Rejected"


def rejected(message: str, data: dict) -> State:
    """The final state of a rejected release (its outcome in `data`)."""
    return Cancelled(name=REJECTED, message=message[:500], data=data)


def is_rejected(state: State | None) -> bool:
    """Whether a run ended because the controller rejected its release (not a cancel, not a failure)."""
    return state is not None and state.is_cancelled() and state.name == REJECTED


def outcome(state: State, stored: Callable[[], dict] | None = None) -> dict:
    """The release's outcome from the flow run's final state (call the flow with return_state=True):
    a rejection still carries the outcome; any other failure or cancellation is raised. `stored`
    gives the outcome from the release store, for a final state that came back without its value."""
    try:
        if is_rejected(state):
            value = state.result(raise_on_failure=False)
            if not isinstance(value, dict):  # the API's copy of the state: its data is gone
                raise MissingResult(f"the rejected state carries no outcome ({type(value).__name__})")
            return value
        return state.result()
    except MissingResult:
        if stored is None:
            raise
        return stored()


def stored_outcome(platform, flow_run_id: str) -> dict:
    """The outcome of a flow run that has ended, as the release store records it: the run's last
    release (`<id>-retryN` after a Retry), published or rejected; any other end is raised."""
    releases = platform.store.releases_of_run(flow_run_id)
    if not releases:
        raise ReleaseError(f"flow run {flow_run_id} ended without recording a release; see the run in the Prefect UI")
    last = releases[-1]
    if last.status == "published":
        return {"release_id": last.id, "status": "published",
                "directory": str(platform.settings.publication_dir / last.id)}
    if last.status == "rejected":
        return {"release_id": last.id, "status": "rejected"}
    detail = f": {last.decision_comment}" if last.decision_comment else ""
    raise ReleaseError(f"release {last.id} ended {last.status}{detail}")
