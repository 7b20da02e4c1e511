"""Periodic publication: the release flow on a schedule, approved by a standing policy.

Each run is its own release with its own budget entry. A run created by this deployment's schedule
is approved by a standing automatic policy that names the deployment (epsilon within its limit,
risk within the tolerable risk); any other run, or one no policy covers, waits for a controller.
The publication directory keeps the index of every release.

With `series`, a run publishes snapshots of a dataset series, each exactly once: with `latest` (the
schedule's rule) every registered snapshot not yet published, oldest first, so a period registered
late is not skipped; with a label, that one (a back-fill). Each snapshot is claimed in the store
before any budget is reserved (a second run for it is refused by the claim's primary key, nothing
spent) and is its own release, charged to the series budget; when the budget (or anything else)
stops one, the older ones stay published and the run fails naming those left and why. A missing
snapshot fails the run with nothing spent. After each publication the series page is published
again (signed), showing every released period and any run that was refused, and so is the
publication index, which links it. A series with a running total (dprelease.running_total) has it
released through each published period first: its budget was charged once at the declaration.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Annotated

from prefect import flow, get_run_logger
from prefect.runtime import flow_run
from pydantic import Field

from dprelease import pipeline
from dprelease.flows.outcomes import ended_releases, is_rejected, outcome, rejected, retry_ended
from dprelease.flows.release import (
    RUN_HOOKS,
    attempt_release_id,
    prepare_and_decide,
    record,
    release_flow,
    retried_and_ended,
)
from dprelease.requests import load_request
from dprelease.requests.epsilon import to_parameter
from dprelease.series import note_refusal, series_directory, snapshots_to_publish
from dprelease.series_period import period_published
from dprelease.settings import Settings
from dprelease.store import series as store_series
from dprelease.tasks import release_steps as steps

#: the snapshot rule's default: the newest registered snapshot of the series
LATEST = "latest"


def _run_name() -> str:
    """A series run is named after the series and its snapshot rule, so the UI lists what it published."""
    params = flow_run.parameters or {}
    if params.get("series"):
        return f"{params['series']} ({params.get('snapshot') or LATEST})"[:120]
    return f"publication of {Path(str(params.get('request_file', 'a request'))).stem}"[:120]


@flow(name="dp-scheduled-publication", log_prints=True, flow_run_name=_run_name, **RUN_HOOKS)
def publication_flow(
    request_file: str,
    series: str | None = None,
    snapshot: Annotated[str, Field(pattern=r"^[0-9A-Za-z][0-9A-Za-z._-]{0,31}$")] = LATEST,
    approval_timeout: Annotated[int, Field(gt=0)] = 3600,
) -> dict:
    """Release the statistics of a request file under its dataset's standing policy; with `series`,
    release each snapshot of the series once and publish the series page again.

    Args:
        request_file: the release request (.yaml/.json) published each period; for a series, its SQL reads the series by its name
        series: the dataset series to publish (empty: the request's own dataset, republished each run)
        snapshot: which snapshots of the series: latest (every registered one not yet published, oldest first: what the schedule uses) or a label such as 2026-11 (a back-fill)
        approval_timeout: seconds to wait for a controller when no standing policy approves the run (then the budget is refunded)
    """
    request = load_request(Path(request_file))
    if series:
        return publish_snapshot(request, series, snapshot, approval_timeout)
    platform = pipeline.Platform.open(Settings.from_env())
    if ended := ended_releases_of_subflows(platform):  # a Retry of this run: its release ran as a subflow
        return retry_ended(platform, ended)
    state = release_flow(
        dataset=request.dataset, sql=request.sql, query=request.query, title=request.title,
        epsilon=to_parameter(request), delta=request.delta,
        max_partitions_contributed=request.max_partitions_contributed,
        requested_by=request.requested_by or "schedule", approval_timeout=approval_timeout, backend=request.backend,
        return_state=True,
    )
    result = outcome(state)
    if is_rejected(state):  # the scheduled run ends in the same Rejected state
        return rejected(state.message or "rejected", result)
    return result


def ended_releases_of_subflows(platform) -> list:
    """The releases made by this run's release subflows, when it had some and all have ended: this
    run is being retried, and Prefect would start a new subflow (a release charged again) for a
    subflow that did not complete or whose result it did not keep. Else []."""
    from prefect import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterParentFlowRunId

    if flow_run.id is None:
        return []
    with get_client(sync_client=True) as client:
        children = client.read_flow_runs(flow_run_filter=FlowRunFilter(
            parent_flow_run_id=FlowRunFilterParentFlowRunId(any_=[flow_run.id])))
    ended = [ended_releases(platform, str(child.id)) for child in children]
    if not children or not all(ended):
        return []
    return sorted((release for found in ended for release in found), key=lambda release: release.created_at)


def publish_snapshot(request, series: str, rule: str, approval_timeout: int = 3600):
    """The series path: the snapshots to publish (rule `latest`: every registered snapshot not yet
    published, oldest first; a label: that one, a back-fill), each claimed and released in turn by
    the release steps (dprelease.flows.release) on its dataset. The first release's id is this run's id, each
    further one `<run id>@<snapshot>` (Store.releases_of_run), so the run hooks refund the one
    running if the run is cancelled or crashes (which gives its snapshot back). When one cannot be
    released (the series budget does not cover it, its data checks fail), the older ones stay
    published and the run fails naming the snapshots left and why."""
    settings = Settings.from_env()
    platform = pipeline.Platform.open(settings)
    if ended := retried_and_ended(platform):
        return retry_ended(platform, ended)
    try:
        snaps = (snapshots_to_publish(platform.store, series) if rule == LATEST
                 else [store_series.resolve(platform.store, series, rule)])
    except store_series.SnapshotRefused as err:
        note_refusal(platform, series, rule, str(err), flow_run.id, public=True)  # shown on the series page
        pipeline.write_index(platform)
        raise
    logger = get_run_logger()
    if len(snaps) > 1:
        logger.warning("%d snapshots of series %s are not published yet: publishing %s, oldest first", len(snaps),
                       series, ", ".join(s.snapshot for s in snaps))
    run_id = attempt_release_id(platform)
    outcomes: list[dict] = []
    for number, snap in enumerate(snaps):
        release_id = run_id if number == 0 else f"{run_id}@{snap.snapshot}"
        try:
            outcomes.append(release_snapshot(settings, platform, request, series, snap, release_id,
                                             approval_timeout))
        except Exception as err:
            if len(snaps) == 1:
                raise
            raise pipeline.ReleaseError(left_unpublished(series, outcomes, snaps[number:], err)) from err
    published = [o for o in outcomes if o["status"] == "published"]
    if not published:
        return rejected("; ".join(o["said"] for o in outcomes), outcomes[-1]["outcome"])
    result = dict(published[-1]["outcome"])
    if len(snaps) > 1:
        result["snapshots"] = {o["outcome"]["snapshot"]: o["status"] for o in outcomes}
    return result


def release_running_total(platform, series: str, snapshot: str) -> Path:
    """The step after a period's publication (dprelease.series_period.period_published, as the recovery that
    finishes one does): the series' running total through this period when it has one (its budget
    was charged once at the declaration), or through the period before the first one not published;
    then the series page and the index. What did not reach this period, or could not be done, is
    logged (the period is published whatever follows). Returns where the series page is."""
    for note in period_published(platform, series, snapshot):
        get_run_logger().warning("%s", note)
    return series_directory(platform.settings, series)


def left_unpublished(series: str, outcomes: list[dict], left: list, err: Exception) -> str:
    """What a run that stopped part way through the series says: what it released, what it left and why."""
    done = ", ".join(f"{o['outcome']['snapshot']} {o['status']}" for o in outcomes) or "nothing"
    message = (f"series {series!r}: released {done}; left unpublished, oldest first: "
               f"{', '.join(s.snapshot for s in left)}, because {left[0].snapshot} could not be released: {err}")
    get_run_logger().error(message)
    return message


def release_snapshot(settings, platform, request, series: str, snap, release_id: str, approval_timeout: int) -> dict:
    """One snapshot: claim it, then the release steps; the series page and the index are published
    again after a publication. Returns {"status", "said", "outcome"}."""
    request = replace(request, dataset=snap.dataset, requested_by=request.requested_by or "schedule",
                      title=f"{request.title or series}: {snap.snapshot}")
    record(platform, release_id, request)
    try:
        store_series.claim(platform.store, series, snap.snapshot, release_id)
        steps.check_policy(settings, request)
    except Exception as err:  # refused before anything was reserved: recorded as such, nothing spent
        platform.store.update_release(release_id, status="failed", decision_comment=str(err)[:500])
        note_refusal(platform, series, snap.snapshot, str(err), flow_run.id)
        raise
    get_run_logger().info("publishing snapshot %s of series %s (release %s)", snap.snapshot, series, release_id)
    planned, decision, verdict = prepare_and_decide(settings, platform, release_id, request, approval_timeout)
    if verdict.decision == "approve":
        where = steps.publish(settings, release_id, planned, decision, verdict.reviewer, verdict.comment)
        page = release_running_total(platform, series, snap.snapshot)
        steps.budget_view(settings, request.dataset)
        return {"status": "published", "said": f"{snap.snapshot} published",
                "outcome": {"release_id": release_id, "status": "published", "directory": where, "series": series,
                            "snapshot": snap.snapshot, "series_page": str(page)}}
    steps.refund(settings, release_id, "rejected", verdict.reviewer, verdict.comment)
    return {"status": "rejected", "said": f"{snap.snapshot} rejected by {verdict.reviewer}: {verdict.comment}",
            "outcome": {"release_id": release_id, "status": "rejected", "series": series, "snapshot": snap.snapshot}}
