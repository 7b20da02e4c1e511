"""The release flow: the recipe of platform.md, read top-down.

1 load (inside each step, in memory) -> 2 plan and policy (data-free; a fixed epsilon the budget
cannot cover stops here) -> 3 check the data -> 4 bounds (inside the engine, when missing) -> 5 choose
epsilon -> 6 reserve -> 7 compute and seal -> 8 summarise -> 9 decide -> 10 publish, or refund. Any failure after the reservation refunds it; nothing is
published.
"""

from __future__ import annotations

import time
import uuid
from typing import Literal

from prefect import flow, get_run_logger
from prefect.exceptions import FlowPauseTimeout, TerminationSignal
from prefect.input import RunInput
from prefect.runtime import flow_run
from pydantic import Field

from dprelease import decisions, pipeline, recovery
from dprelease.external import BackendChoice
from dprelease.flows import approvals, watchdog
from dprelease.flows.outcomes import ended_releases, outcome, rejected, retry_ended  # noqa: F401 - outcome: callers import it from here
from dprelease.flows.pausing import pause_for_input
from dprelease.flows.release_form import Mapping, Text
from dprelease.requests import parse_request
from dprelease.requests.epsilon import EpsilonChoice
from dprelease.settings import Settings
from dprelease.store import StoreError
from dprelease.store.tables import FINAL_STATUSES
from dprelease.tasks import release_steps as steps
from dprelease.tasks.prefect_keys import artifact_key, prefect_key

#: seconds between the paused run's checks for an answer (an internal setting, not a form field):
#: an answer from elsewhere (the UI, `dprelease approve`) is a person's, seconds to hours away
APPROVAL_POLL_SECONDS = 1.0
#: the same when this process answers its own run (cli/interactive.py): a person at this terminal's
#: prompt, or (`--approve-as`, no terminal) this process within milliseconds of the pause, when
#: every moment until the run sees the answer adds to the release (0.1 s: ten reads a second of a
#: run that waits a fraction of a second; five commands at once share one SQLite-backed server)
ANSWERED_HERE_POLL_SECONDS = {"prompt": 0.5, "at_once": 0.1}


def answer_here(at_once: bool) -> None:
    """This process answers its own runs' pauses: look for the answer every 0.5 s (a prompt) or every
    0.1 s (answered at once), not every second. A process-wide setting: a command runs one flow."""
    global APPROVAL_POLL_SECONDS
    APPROVAL_POLL_SECONDS = ANSWERED_HERE_POLL_SECONDS["at_once" if at_once else "prompt"]


class ReleaseDecision(RunInput):
    """The controller's answer: the form shown in the Prefect UI's Resume dialog. Only the signed
    decision counts: its signature must verify with the registered key of the controller named."""

    decision: Literal["approve", "reject"] = Field(description="approve: publish the analyst report; "
                                                   "reject: publish nothing and refund the budget")
    reviewer: str = Field(min_length=1, pattern=r"\S", description="your registered controller name")
    comment: str = Field("", description="a note for this form; the reason recorded in the archive is the one "
                         "signed with your decision (--reason)")
    signed_decision: str = Field(min_length=1, description="your signed decision: the output of "
                                 "`dprelease decision sign RELEASE_ID approve|reject --key YOUR_KEY --reason \"...\"` "
                                 "(add --override-risk \"REASON\" when the risk needs an override)")


def run_releases(platform: pipeline.Platform, flow_run_id: str) -> list:
    """The releases a flow run made: its own id, and `<id>@<snapshot>` for each further snapshot of a
    series run (Store.releases_of_run)."""
    return platform.store.releases_of_run(flow_run_id)


def _run_ended(flow, flow_run, state) -> None:
    """Completion and failure hooks: the run's process no longer holds its releases. (A hook's
    parameters have the names Prefect's runner passes them by, flow=, flow_run=, state=, when it
    runs a worker run's cancellation hooks itself; its engine passes them by position.)"""
    recovery.release_lease(str(flow_run.id))
    releases = run_releases(pipeline.Platform.open(Settings.from_env()), str(flow_run.id))
    for release in releases:
        recovery.release_lease(release.id)
    watchdog.finish(str(flow_run.id), ended=all(r.status in FINAL_STATUSES for r in releases))


def _run_stopped(flow, flow_run, state) -> None:
    """Cancellation and crash hooks (the UI's Cancel, a killed worker's run marked Crashed): refund
    and mark the release at once, instead of waiting for a recovery sweep. A release already final
    (a series run's earlier snapshot, published or rejected) stays as it is."""
    platform = pipeline.Platform.open(Settings.from_env())
    recovery.release_lease(str(flow_run.id))
    for release in run_releases(platform, str(flow_run.id)):
        recovery.release_lease(release.id)
        if release.status in FINAL_STATUSES:
            continue
        try:
            recovery.stop(platform, release.id, f"the flow run was {state.name.lower()}")
        except StoreError:  # the run ended before it recorded a release
            pass
    watchdog.finish(str(flow_run.id), ended=True)  # each release is final now, or never recorded


RUN_HOOKS = {"on_completion": [_run_ended], "on_failure": [_run_ended], "on_cancellation": [_run_stopped],
             "on_crashed": [_run_stopped]}


def _run_name() -> str:
    """Runs are named after the request's title (else the dataset), so the UI lists what they are."""
    params = flow_run.parameters or {}
    title = str(params.get("title") or "").strip()
    return (title or f"release of {params.get('dataset', 'a dataset')}")[:120]


@flow(name="dp-release", log_prints=True, flow_run_name=_run_name, **RUN_HOOKS)
def release_flow(
    dataset: str,
    sql: Text = "",
    query: Mapping = {},  # noqa: B006 - never changed; a plain default draws a plain form field
    title: str = "",
    *,
    epsilon: EpsilonChoice,
    delta: float = 1e-6,
    max_partitions_contributed: int = 1,
    requested_by: Text = "",
    approval_timeout: int = 3600,
    backend: BackendChoice = "auto",
) -> dict:
    """Release DP statistics of a registered dataset after a controller approves.

    A controller always decides, unless this run was created by the schedule of a deployment that a
    standing automatic policy names (read from Prefect's record of the run, never from a parameter).
    Epsilon is one choice: a fixed value, the privacy risk indicator, or the risk model, each with
    only its own fields (dprelease.requests.epsilon; a number or a request file's `epsilon:` is
    accepted too).

    Args:
        dataset: the registered dataset to query (see `dprelease dataset list`)
        sql: the query, in SQL with ANONYMIZATION (give sql or query, not both)
        query: the query as a release spec (aggregates, group_by), instead of sql (empty: the sql)
        title: a title for the release: the run's name and the report's heading
        epsilon: how epsilon is chosen: a fixed value, from the privacy risk indicator (PRI), or from the risk model (pick one: only its fields apply)
        delta: the delta of the release (Gaussian noise and partition selection)
        max_partitions_contributed: how many groups one person may contribute to
        requested_by: the analyst who asked (their policy applies; empty: nobody named)
        approval_timeout: seconds to wait for a controller's decision before refunding the budget
        backend: where the data is computed: auto (the dataset's own: Spark for an external dataset, DuckDB in this process for escrowed data), spark, or duckdb (an external Parquet/CSV path read here)
    """
    settings = Settings.from_env()
    request = parse_request(request_fields(dataset, sql or None, query or None, title, epsilon=epsilon, delta=delta,
                                           cu=max_partitions_contributed, requested_by=requested_by or None,
                                           backend=backend))
    platform = pipeline.Platform.open(settings)
    if ended := retried_and_ended(platform):
        return retry_ended(platform, ended)
    release_id = attempt_release_id(platform)
    record(platform, release_id, request)
    try:
        steps.check_policy(settings, request)
    except Exception as err:  # refused before anything was computed: recorded as such
        platform.store.update_release(release_id, status="failed", decision_comment=str(err)[:500])
        raise
    planned, decision, verdict = prepare_and_decide(settings, platform, release_id, request, approval_timeout)
    if verdict.decision == "approve":
        where = steps.publish(settings, release_id, planned, decision, verdict.reviewer, verdict.comment)
        steps.budget_view(settings, request.dataset)
        return {"release_id": release_id, "status": "published", "directory": where}
    steps.refund(settings, release_id, "rejected", verdict.reviewer, verdict.comment)
    steps.budget_view(settings, request.dataset)
    return rejected(f"rejected by {verdict.reviewer}: {verdict.comment}",
                    {"release_id": release_id, "status": "rejected"})


def prepare_and_decide(settings, platform, release_id, request, timeout, poll_interval: float | None = None):
    """Steps 2-9: everything up to the controller's decision; refunds on any failure."""
    try:
        planned = steps.plan(settings, request)  # data-free: a bad query is refused before the data is read
        steps.check_budget_left(settings, planned)  # a fixed epsilon the budget cannot cover, likewise
        steps.check_data(settings, request.dataset, request.backend)
        decision = steps.choose_epsilon(settings, planned)
        steps.preview(settings, release_id, planned, decision.epsilon)  # before anything is spent
        profile = pipeline.risk_profile(platform, planned, decision)
        warn_before_reserving(release_id, profile)
        steps.reserve_budget(settings, release_id, planned, decision.epsilon)
        steps.compute(settings, release_id, planned, decision)
        summary = steps.summarise(settings, release_id, planned, decision)
        deployment = scheduled_deployment()
        policy = decisions.standing_approval(platform.store, request.dataset, request.requested_by, decision.epsilon,
                                             deployment)
        if policy is not None and not decisions.risk_above_tolerance(profile):
            get_run_logger().info("auto-approved by policy %s (scheduled run of %s)", policy.name, deployment)
            verdict = ReleaseDecision.model_construct(decision="approve", reviewer=f"policy:{policy.name}",
                                                      comment=f"standing policy; scheduled run of {deployment}",
                                                      signed_decision="")
            decisions.record(settings, release_id, {
                "release_id": release_id, "decision": "approve", "controller": f"policy:{policy.name}",
                "decided_at": pipeline.now(), "reason": verdict.comment,
                "report_fingerprint": decisions.report_fingerprint(settings, release_id)}, None)
        else:
            verdict = ask_controller(platform, release_id, summary, f"approval-{release_id}", timeout, poll_interval,
                                     profile=profile)
    except FlowPauseTimeout:
        steps.refund(settings, release_id, "expired", None, "nobody answered in time")
        raise
    except BaseException as err:  # cancellation and termination too: never leave budget reserved
        pipeline.refund(platform, release_id, "failed", None, failure_reason(err))
        if isinstance(err, (TerminationSignal, KeyboardInterrupt)):  # the process ends now: no hook of its
            recovery.release_lease(release_id)  # own runs after a stop, and there is nothing left to recover
        raise
    return planned, decision, verdict


#: why a release failed when its run's process was told to stop before the decision (Prefect's
#: TerminationSignal: a cancel in the UI, its worker stopped; Ctrl-C where it runs in a terminal)
STOPPED_REASON = ("the flow run was stopped before a decision (cancelled in Prefect, or its worker or "
                  "process stopped): nothing was released and the budget is refunded; submit the request again")


def failure_reason(err: BaseException) -> str:
    """The words a release's record keeps for the error that ended it before its decision: the
    error's own message (the CLI's interrupt names its signal), else STOPPED_REASON for a stop
    (Prefect's TerminationSignal says nothing), else the error's class."""
    said = str(err)[:500]
    if said:
        return said
    return STOPPED_REASON if isinstance(err, (TerminationSignal, KeyboardInterrupt)) else type(err).__name__


def warn_before_reserving(release_id: str, profile: dict) -> None:
    """A chosen epsilon (a fixed one, typically) whose risk is above the dataset's tolerable risk:
    said on the run's page (artifact risk-<release>) and in its log before any budget is reserved,
    not first in the approval dialog. The run goes on: a controller may approve it with an override."""
    if not decisions.risk_above_tolerance(profile):
        return
    from prefect.artifacts import create_markdown_artifact

    notice = decisions.risk_notice(profile, release_id)
    get_run_logger().warning("before reserving the budget: %s", notice.replace("**", "").replace("`", ""))
    create_markdown_artifact(
        f"# Before the reservation: release `{release_id}`\n\n{notice}\n\nThe budget is reserved next and stays "
        "reserved until you decide; rejecting (or cancelling the run) refunds it. To stay within the tolerable risk, "
        "cancel this run and start one with a smaller epsilon, or choose epsilon from the risk model.",
        key=artifact_key("risk", release_id), description="risk above the tolerable risk, before the reservation")


def scheduled_deployment() -> str | None:
    """The deployment's name when this run (or the run it is part of) was created by that
    deployment's schedule, else None. Read from Prefect's own record of the root run (its
    `created_by` is a SCHEDULE and `auto_scheduled` is set only by the server's scheduler), so no
    form field or API parameter can claim it."""
    from prefect import get_client

    root = flow_run.root_flow_run_id
    if not root:
        return None
    with get_client(sync_client=True) as client:
        run = client.read_flow_run(root)
        created = run.created_by
        if not (run.auto_scheduled and run.deployment_id and created is not None and created.type == "SCHEDULE"):
            return None
        return client.read_deployment(run.deployment_id).name


def ask_controller(platform, release_id: str, description: str, key: str, timeout: int,
                   poll_interval: float | None = None, answered: str = "pending",
                   profile: dict | None = None, with_preview: bool = True) -> ReleaseDecision:
    """Pause until a controller's signed decision counts (the UI's Resume form, or `dprelease
    approve`); a decision that does not verify is refused, recorded, and the run asks again. The
    release's status is `awaiting_approval` during the pause and `answered` after it.
    `with_preview`: the accuracy preview under the question (the release's own approval, before
    its budget is spent; not a later question, asked once it is)."""
    settings = platform.settings
    profile = profile or {}
    poll_interval = poll_interval or APPROVAL_POLL_SECONDS
    key = prefect_key(key)  # a release of a series' later snapshot is `<run>@<label>`: no pause key as it is
    context = decisions.write_context(settings, release_id, key, profile)
    deadline = time.monotonic() + timeout
    refused: list[str] = []
    platform.store.update_release(release_id, status="awaiting_approval")
    said = approvals.awaiting_here(release_id)
    said.set()  # a command answering its own run looks now
    try:
        for attempt in range(1000):
            remaining = int(deadline - time.monotonic())
            if remaining <= 0:
                raise FlowPauseTimeout(f"no valid decision within {timeout} s")
            text = waiting_message(release_id, description, refused, with_preview)
            form = ReleaseDecision.with_initial_data(description=text)
            answer = pause_for_input(form, timeout=remaining, poll_interval=poll_interval,
                                     key=key if attempt == 0 else f"{key}-{attempt}")
            try:
                signed = decisions.check(platform.store, answer.signed_decision, release_id=release_id, question=key,
                                         fingerprint=context["report_fingerprint"],
                                         above_tolerance=context["above_tolerance"], form_decision=answer.decision,
                                         form_controller=answer.reviewer)
            except decisions.DecisionRefused as err:
                get_run_logger().warning("decision refused: %s", err)
                decisions.record_refusal(settings, release_id, str(err), answer.signed_decision)
                refused.append(str(err))
                show_refusal(release_id, str(err), answer.decision, answer.reviewer)
                continue
            decisions.record(settings, release_id, signed, answer.signed_decision)
            comment = signed.reason + (f" [risk override: {signed.risk_override}]" if signed.risk_override else "")
            return ReleaseDecision.model_construct(decision=signed.decision, reviewer=signed.controller,
                                                   comment=comment, signed_decision=answer.signed_decision)
        raise pipeline.ReleaseError("too many refused decisions")
    finally:  # answered, timed out or cancelled: the release no longer awaits anything
        approvals.forget_awaiting(release_id, said)
        platform.store.update_release(release_id, status=answered)


def waiting_message(release_id: str, summary: str, refused: list[str], with_preview: bool = True) -> str:
    """The markdown above the Resume form: the last refusal first (a refused decision closed the
    dialog), then that an approval is waiting, where the summary is, and the summary (which opens
    with the risk warning when the risk is above the tolerable risk: said once)."""
    where = (f"The controller summary is below and in the artifact [{summary_artifact_key(release_id)}]"
             f"({summary_link(release_id)}). Sign your decision with "
             f"`dprelease decision sign {release_id} approve|reject --key YOUR_KEY` and paste it below, or run "
             f"`dprelease approve {release_id} --key YOUR_KEY`.")
    console = Settings.from_env().console_url  # the browser path: the console's decision page, a passkey
    where += f" Or decide in your browser: [the decision page]({console}/releases/{release_id})."
    lines = [f"# An approval is waiting: release `{release_id}`"]
    if refused:
        lines.append(f"**Your last decision was refused:** {refused[-1]}")
    return "\n\n".join(lines + [where, summary] + ([preview_text(release_id)] if with_preview else []))


def show_refusal(release_id: str, reason: str, form_decision: str, reviewer: str) -> None:
    """A refused decision on the run's page at once (its Artifacts, and the key refused-<release>):
    the Resume dialog closes and the run is Paused again, so the reason must be where the
    controller looks, not only in the logs."""
    from prefect.artifacts import create_markdown_artifact

    markdown = (f"# Decision refused: release `{release_id}`\n\n**{reason}**\n\n"
                f"The decision submitted ({form_decision} by {reviewer}) does not count: nothing was decided, and the "
                "run is Paused again, waiting for a decision that counts. Open Resume and submit a corrected signed "
                f"decision (`dprelease decision sign {release_id} approve|reject --key YOUR_KEY`), or run "
                f"`dprelease approve|reject {release_id} --key YOUR_KEY`. Every refusal is kept in the archive "
                f"(`{release_id}/refused-decisions.jsonl`).")
    create_markdown_artifact(markdown, key=refusal_artifact_key(release_id), description="refused decision")


def preview_text(release_id: str) -> str:
    """The accuracy preview saved before the reservation (empty when there is none)."""
    path = Settings.from_env().archive_dir / release_id / "preview.md"
    return path.read_text() if path.exists() else ""


def summary_artifact_key(release_id: str) -> str:
    return artifact_key("release", release_id)


def refusal_artifact_key(release_id: str) -> str:
    return artifact_key("refused", release_id)


#: the Prefect UI the server opens (3.8: the V2 UI at /v2, its default): links lead there, not to
#: the V1 UI that Prefect also serves at unprefixed paths
UI_PREFIX = "/v2"


def summary_link(release_id: str) -> str:
    """The summary artifact's page on the Prefect UI (relative when the UI address is unknown)."""
    from prefect.settings import PREFECT_UI_URL

    base = (PREFECT_UI_URL.value() or "").rstrip("/")
    return f"{base}{UI_PREFIX}/artifacts/key/{summary_artifact_key(release_id)}"


def request_fields(dataset, sql, query, title, *, epsilon, delta, cu, requested_by, backend="auto") -> dict:
    """The flow's parameters as a request (parse_request judges them, as it judges a request file)."""
    fields = {"dataset": dataset, "title": title, "delta": delta, "max_partitions_contributed": cu,
              "requested_by": requested_by, "epsilon": epsilon.to_spec() if hasattr(epsilon, "to_spec") else epsilon,
              "backend": backend}
    fields.update({"sql": sql} if sql else {"query": query})
    return fields


def retried_and_ended(platform: pipeline.Platform) -> list:
    """The releases of this run when it is a Retry of a run whose releases have all ended (after
    the releases of dead runs are recovered, so a crashed run's release ends first), else []."""
    recover_dead_runs(platform)
    if flow_run.id is None:
        return []
    ended = ended_releases(platform, str(flow_run.id))
    if ended:
        get_run_logger().info("retry of a run whose releases have ended: %s",
                              ", ".join(f"{r.id} {r.status}" for r in ended))
    return ended


def attempt_release_id(platform: pipeline.Platform) -> str:
    """The release id of this run: the flow run's id, or the release it left running when it is
    resumed (a run whose releases have all ended is not run again: retried_and_ended)."""
    base = str(flow_run.id or uuid.uuid4())
    attempts = run_releases(platform, base)
    return max(attempts, key=lambda r: r.created_at).id if attempts else base


def recover_dead_runs(platform: pipeline.Platform) -> None:
    """End the releases of dead runs (recovery.sweep), each said in this run's log."""
    for done in recovery.sweep(platform):
        get_run_logger().warning("recovered %s", done.line())


def record(platform: pipeline.Platform, release_id: str, request) -> None:
    """The release's row in the store (kept as it is when a run is resumed), held by this
    process's lease and watched by its watchdog (dprelease.flows.watchdog); first, the releases of
    dead runs are recovered."""
    recover_dead_runs(platform)
    try:
        platform.store.get_release(release_id)
    except StoreError:  # a first run: record it
        platform.store.add_release(request.dataset, request.to_json(), release_id=release_id,
                                   flow_run_id=str(flow_run.id) if flow_run.id else None)
    run_id = str(flow_run.id) if flow_run.id else None
    recovery.hold_lease(platform.store, release_id, run_id)
    watchdog.watch(run_id or release_id, run_id)  # settles the release at once if this process dies
