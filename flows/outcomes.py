"""A release's outcome from its flow run's final state, decided in one place.

A rejected release ends in its own final state: Completed, named "Rejected". The controller decided
and the budget is refunded: the run did its job, so it ends without an error. Not Cancelled: Prefect
3.8 resolves a Cancelled or Failed final state into an exception when the engine returns the run's
result (a worker's run), and a state carrying the outcome then fails with "TypeError: Unexpected
result for failed state ... dict cannot be resolved into an exception", a traceback in the run's
logs. The name tells it apart from a publication, in the UI and through the API alike; every place
that reads a run's end asks `is_rejected`.

Prefect keeps a flow's return value in memory only (results are not persisted), so a final state
that comes back from the API carries no value. That happens when the API's answer to the final
transition is lost (a timeout or a dropped connection under load): the client retries, the server
has already committed the transition and rejects the duplicate with the run's stored state
(Prefect's PreventDuplicateTransitions). The run did end as that state says; its outcome is then
read from the release store, which the flow wrote before it returned (`stored_outcome`).

Prefect's Retry (the UI's button sets the run Scheduled, named AwaitingRetry, and a worker runs the
flow again under the same run id) of a run whose releases have all ended ends at once in the state
their statuses give (`retry_ended`): a published release stays published, a rejected, expired or
failed one stays refunded; nothing is decrypted, checked, spent or drawn again. A new release is a
new run.
"""

from __future__ import annotations

from collections.abc import Callable

from prefect.exceptions import MissingResult
from prefect.states import Completed, State

from dprelease.pipeline import ReleaseError
from dprelease.store.tables import FINAL_STATUSES

REJECTED = "Rejected"


def rejected(message: str, data: dict) -> State:
    """The final state of a rejected release (its outcome in `data`)."""
    return Completed(name=REJECTED, message=message[:500], data=data)


def is_rejected(state: State | None) -> bool:
    """Whether a run ended because the controller rejected its release (not a cancel, not a failure)."""
    return state is not None and state.is_completed() and state.name == REJECTED


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
    release (`<id>@<snapshot>` when a series run released several), published or rejected; any other
    end is raised."""
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


def ended_releases(platform, flow_run_id: str) -> list:
    """The releases of a flow run when it made some and every one has ended (the run is being
    retried), else [] (a first run, or a run resumed before its release ended)."""
    releases = platform.store.releases_of_run(flow_run_id)
    return releases if releases and all(r.status in FINAL_STATUSES for r in releases) else []


def retry_ended(platform, releases: list) -> State:
    """The final state of a Retry of a run whose releases have ended, saying what each release is:
    Failed when the last one failed or expired (raised: ReleaseError), Completed when one is
    published, else Rejected; nothing is run again."""
    said = "; ".join(_release_line(platform, r) for r in releases)
    note = f"{said}. This retry ran nothing again (nothing decrypted, checked, spent or drawn); start a new run " \
           "to release again"
    last = releases[-1]
    if last.status in ("failed", "expired"):
        raise ReleaseError(note)
    published = [r for r in releases if r.status == "published"]
    if published:
        return Completed(message=note[:500], data={"release_id": published[-1].id, "status": "published",
                                                   "directory": str(platform.settings.publication_dir / published[-1].id),
                                                   "retried": True})
    return rejected(note, {"release_id": last.id, "status": "rejected", "retried": True})


def _release_line(platform, release) -> str:
    """`release ID is published at DIR` / `... was rejected by X: why (budget refunded)` / ..."""
    if release.status == "published":
        return f"release {release.id} is already published at {platform.settings.publication_dir / release.id}"
    by = f" by {release.decision_by}" if release.decision_by else ""
    why = f": {release.decision_comment}" if release.decision_comment else ""
    ended = "was rejected" if release.status == "rejected" else release.status
    return f"release {release.id} {ended}{by}{why} (its budget was refunded)"
