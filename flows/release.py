"""The release flow: the recipe of platform.md, read top-down.

1 load (inside each step, in memory) -> 2 check -> 3 plan and policy -> 4 bounds (inside the
engine, when missing) -> 5 choose epsilon -> 6 reserve -> 7 compute and seal -> 8 summarise ->
9 decide -> 10 publish, or refund. Any failure after the reservation refunds it; nothing is
published.
"""

from __future__ import annotations

import uuid
from typing import Literal

from prefect import flow, get_run_logger
from prefect.exceptions import FlowPauseTimeout
from prefect.flow_runs import pause_flow_run
from prefect.input import RunInput
from prefect.runtime import flow_run

from dprelease import pipeline, recovery
from dprelease.requests import parse_request
from dprelease.settings import Settings
from dprelease.store import StoreError
from tasks import release_steps as steps


class ReleaseDecision(RunInput):
    """The controller's answer: the form shown in the Prefect UI's Resume dialog."""

    decision: Literal["approve", "reject"]
    reviewer: str
    comment: str = ""


def _run_ended(flow_obj, run, state) -> None:
    """Completion and failure hooks: the run's process no longer holds its release."""
    recovery.release_lease(str(run.id))


def _run_stopped(flow_obj, run, state) -> None:
    """Cancellation and crash hooks (the UI's Cancel, a killed worker's run marked Crashed): refund
    and mark the release at once, instead of waiting for a recovery sweep."""
    release_id = str(run.id)
    recovery.release_lease(release_id)
    try:
        recovery.stop(pipeline.Platform.open(Settings.from_env()), release_id, f"the flow run was {state.name.lower()}")
    except StoreError:  # the run ended before it recorded a release
        pass


RUN_HOOKS = {"on_completion": [_run_ended], "on_failure": [_run_ended], "on_cancellation": [_run_stopped],
             "on_crashed": [_run_stopped]}


@flow(name="dp-release", log_prints=True, **RUN_HOOKS)
def release_flow(
    dataset: str,
    sql: str | None = None,
    query: dict | None = None,
    title: str = "",
    epsilon: float | None = None,
    pri_p: float | None = None,
    pri_mode: Literal["public", "data"] = "public",
    pri_beta: float = 0.5,
    risk: dict | None = None,
    delta: float = 1e-6,
    max_partitions_contributed: int = 1,
    requested_by: str | None = None,
    auto_approve_policy: bool = False,
    require_policy: bool = False,
    approval_timeout: int = 3600,
    poll_interval: int = 10,
) -> dict:
    """Release DP statistics of a registered dataset after the controller approves.

    epsilon: a fixed value; or pri_p (choose it from the privacy risk indicator; pri_mode public,
    the default, is data-free; pri_beta its quantile); or risk (trust, sensitivity, max_risk,
    max_noise, n: choose it from the risk model).
    auto_approve_policy / require_policy: let a standing policy with automatic approval decide
    (and refuse without one): for schedules only; otherwise the controller always decides."""
    settings = Settings.from_env()
    pri = {"p": pri_p, "mode": pri_mode, "beta": pri_beta} if pri_p is not None else None
    request = parse_request(request_fields(dataset, sql, query, title, epsilon, pri, risk, delta,
                                           max_partitions_contributed, requested_by))
    release_id = str(flow_run.id or uuid.uuid4())
    platform = pipeline.Platform.open(settings)
    record(platform, release_id, request)
    try:
        steps.check_policy(settings, request)
    except Exception as err:  # refused before anything was computed: recorded as such
        platform.store.update_release(release_id, status="failed", decision_comment=str(err)[:500])
        raise
    planned, decision, verdict = prepare_and_decide(
        settings, platform, release_id, request, auto_approve_policy, require_policy, approval_timeout, poll_interval)
    if verdict.decision == "approve":
        where = steps.publish(settings, release_id, planned, decision, verdict.reviewer, verdict.comment)
        return {"release_id": release_id, "status": "published", "directory": where}
    steps.refund(settings, release_id, "rejected", verdict.reviewer, verdict.comment)
    return {"release_id": release_id, "status": "rejected"}


def prepare_and_decide(settings, platform, release_id, request, auto_approve_policy, require_policy, timeout,
                       poll_interval):
    """Steps 2-9: everything up to the controller's decision; refunds on any failure."""
    try:
        steps.check_data(settings, request.dataset)
        planned = steps.plan(settings, request)
        decision = steps.choose_epsilon(settings, planned)
        steps.reserve_budget(settings, release_id, planned, decision.epsilon)
        steps.compute(settings, release_id, planned, decision)
        summary = steps.summarise(settings, release_id, planned, decision)
        policy = pipeline.covering_policy(platform, request, decision.epsilon) if auto_approve_policy else None
        if policy is not None:
            get_run_logger().info("auto-approved by policy %s", policy.name)
            verdict = ReleaseDecision(decision="approve", reviewer=f"policy:{policy.name}", comment="standing policy")
        elif require_policy:
            raise pipeline.ReleaseError(
                f"no standing policy with automatic approval covers epsilon {decision.epsilon:g} on dataset "
                f"{request.dataset!r}: a scheduled release needs one (dprelease policy add ...)"
            )
        else:
            verdict = ask_controller(platform, release_id, summary, f"approval-{release_id}", timeout, poll_interval)
    except FlowPauseTimeout:
        steps.refund(settings, release_id, "expired", None, "nobody answered in time")
        raise
    except BaseException as err:  # cancellation and termination too: never leave budget reserved
        pipeline.refund(platform, release_id, "failed", None, str(err)[:500] or type(err).__name__)
        raise
    return planned, decision, verdict


def ask_controller(platform, release_id: str, description: str, key: str, timeout: int, poll_interval: int,
                   answered: str = "pending") -> ReleaseDecision:
    """Pause for the controller's typed decision (the UI's Resume form, or `dprelease approve`);
    the release's status is `awaiting_approval` during the pause and `answered` after it."""
    platform.store.update_release(release_id, status="awaiting_approval")
    form = ReleaseDecision.with_initial_data(description=description, reviewer="")  # no decision preselected
    try:
        answer = pause_flow_run(wait_for_input=form, timeout=timeout, poll_interval=poll_interval, key=key)
    finally:  # answered, timed out or cancelled: the release no longer awaits anything
        platform.store.update_release(release_id, status=answered)
    if not answer.reviewer.strip():  # the UI may drop field constraints: validate here
        raise pipeline.ReleaseError("the decision must name the reviewer")
    return answer


def request_fields(dataset, sql, query, title, epsilon, pri, risk, delta, cu, requested_by) -> dict:
    fields = {"dataset": dataset, "title": title, "delta": delta, "max_partitions_contributed": cu,
              "requested_by": requested_by}
    fields.update({"sql": sql} if sql else {"query": query})
    chosen = [x for x in (epsilon, pri, risk) if x is not None]
    if len(chosen) > 1:
        raise pipeline.ReleaseError("give one of epsilon, pri_p or risk")
    if pri is not None:
        fields["epsilon"] = {"pri": pri}
    elif risk is not None:
        fields["epsilon"] = {"risk": risk}
    elif epsilon is not None:
        fields["epsilon"] = epsilon
    return fields


def record(platform: pipeline.Platform, release_id: str, request) -> None:
    """The release's row in the store (kept as it is when a run is retried or resumed), held by
    this process's lease; first, the releases of dead runs are recovered (recovery.sweep)."""
    for done in recovery.sweep(platform):
        get_run_logger().warning("recovered %s", done.line())
    try:
        platform.store.get_release(release_id)
    except StoreError:  # a first run: record it
        platform.store.add_release(request.dataset, request.to_json(), release_id=release_id,
                                   flow_run_id=str(flow_run.id) if flow_run.id else None)
    recovery.hold_lease(platform.store, release_id, str(flow_run.id) if flow_run.id else None)
