"""A release's outcome from its flow run's final state, decided in one place.

A rejected release ends in its own final state: Cancelled, named "Rejected" (not a green
Completed, and not a cancellation either: the controller decided, the budget is refunded, and the
state still carries the release's outcome). Every place that reads a run's end asks `is_rejected`.
"""

from __future__ import annotations

from prefect.states import Cancelled, State

REJECTED = "Rejected"


def rejected(message: str, data: dict) -> State:
    """The final state of a rejected release (its outcome in `data`)."""
    return Cancelled(name=REJECTED, message=message[:500], data=data)


def is_rejected(state: State | None) -> bool:
    """Whether a run ended because the controller rejected its release (not a cancel, not a failure)."""
    return state is not None and state.is_cancelled() and state.name == REJECTED


def outcome(state: State) -> dict:
    """The release's outcome from the flow run's final state (call the flow with return_state=True):
    a rejection still carries the outcome; any other failure or cancellation is raised."""
    if is_rejected(state):
        return state.result(raise_on_failure=False)
    return state.result()
