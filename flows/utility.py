"""Utility signaling (pri.md, the seed's protocol, steps 0-6): the analyst learns how the DP noise
affects their task without seeing the raw output.

0-1 the request names the query and the evaluation (an evaluator the policy enables) ->
2-3 the DP release, withheld until the controller's first approval -> 4-5 the controller approves
running the evaluation: f(DP output) and f(raw output) are computed and withheld -> 6 the last
approval releases both numbers in the analyst report. Each rejection ends the flow there.
"""

from __future__ import annotations

import uuid

from prefect import flow
from prefect.runtime import flow_run

from dprelease import pipeline
from dprelease.flows.release import RUN_HOOKS, ask_controller, prepare_and_decide, record, request_fields
from dprelease.requests import parse_request
from dprelease.settings import Settings
from dprelease.tasks import release_steps as steps


@flow(name="dp-utility-signal", log_prints=True, **RUN_HOOKS)
def utility_flow(
    dataset: str,
    evaluator: str,
    evaluator_params: dict,
    sql: str | None = None,
    query: dict | None = None,
    title: str = "",
    epsilon: float | None = None,
    delta: float = 1e-6,
    max_partitions_contributed: int = 1,
    requested_by: str | None = None,
    approval_timeout: int = 3600,
    poll_interval: int = 10,
) -> dict:
    """A DP release followed by a utility signal for one vetted evaluation function."""
    settings = Settings.from_env()
    request = parse_request(request_fields(dataset, sql, query, title, epsilon=epsilon, delta=delta,
                                           cu=max_partitions_contributed, requested_by=requested_by))
    release_id = str(flow_run.id or uuid.uuid4())
    platform = pipeline.Platform.open(settings)
    steps.check_policy(settings, request, evaluator)  # 0: before anything is computed
    from dprelease.evaluators import enabled_evaluator

    enabled_evaluator(evaluator, pipeline.enabled_evaluators(platform, request)).check_params(evaluator_params)
    record(platform, release_id, request)

    planned, decision, verdict = prepare_and_decide(                                    # 1-2
        settings, platform, release_id, request, approval_timeout, poll_interval)
    if verdict.decision != "approve":
        steps.refund(settings, release_id, "rejected", verdict.reviewer, verdict.comment)
        return {"release_id": release_id, "status": "rejected", "stopped_at": 1}
    directory = steps.publish(settings, release_id, planned, decision, verdict.reviewer, verdict.comment)  # 3

    ask = (f"## Run the evaluation `{evaluator}`?\nParameters: `{evaluator_params}`. It will be computed on the "  # 4-5
           "DP output and on the output without noise; both stay withheld until your last approval.")
    run_it = ask_controller(platform, release_id, ask, f"utility-run-{release_id}", approval_timeout, poll_interval,
                            answered="published", with_preview=False)  # the budget is spent: no preview
    if run_it.decision != "approve":
        return {"release_id": release_id, "status": "published", "directory": directory, "utility": "not run",
                "stopped_at": 2}
    summary = steps.evaluate_utility(settings, release_id, planned, decision, evaluator, evaluator_params)

    last = ask_controller(platform, release_id, summary, f"utility-release-{release_id}", approval_timeout,  # 6
                          poll_interval, answered="published", with_preview=False)
    if last.decision != "approve":
        return {"release_id": release_id, "status": "published", "directory": directory, "utility": "withheld",
                "stopped_at": 3}
    steps.publish_utility(settings, release_id, planned, decision, last.reviewer)
    return {"release_id": release_id, "status": "published", "directory": directory, "utility": "released"}
