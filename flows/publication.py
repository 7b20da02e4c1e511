"""Periodic publication: the release flow on a schedule, approved by a standing policy.

Each run is its own release with its own budget entry. A run created by this deployment's schedule
is approved by a standing automatic policy that names the deployment (epsilon within its limit,
risk within the tolerable risk); any other run, or one no policy covers, waits for a controller. The publication directory keeps
the index of every release."""

from __future__ import annotations

from pathlib import Path

from prefect import flow

from dprelease.requests import load_request
from dprelease.requests.epsilon import to_parameter
from flows.outcomes import is_rejected, outcome, rejected
from flows.release import release_flow


@flow(name="dp-scheduled-publication", log_prints=True)
def publication_flow(request_file: str) -> dict:
    """Release the statistics of a request file under its dataset's standing policy."""
    request = load_request(Path(request_file))
    state = release_flow(
        dataset=request.dataset, sql=request.sql, query=request.query, title=request.title,
        epsilon=to_parameter(request), delta=request.delta, max_partitions_contributed=request.max_partitions_contributed,
        requested_by=request.requested_by or "schedule", return_state=True,
    )
    result = outcome(state)
    if is_rejected(state):  # the scheduled run ends in the same Rejected state
        return rejected(state.message or "rejected", result)
    return result
