"""The release steps as Prefect tasks (platform.md steps 1-10). Each opens the platform from the
settings it is given and calls one function of `dprelease.pipeline`; no task returns raw data, so
nothing Prefect persists can hold it."""

from __future__ import annotations

from dataclasses import dataclass

from prefect import task
from prefect.artifacts import create_markdown_artifact

from dprelease import decisions, pipeline, shared_archive
from dprelease.requests import ReleaseRequest
from dprelease.settings import Settings
from dprelease.tasks.prefect_keys import artifact_key


@dataclass(frozen=True)
class SealedRef:
    """What the compute task returns (and Prefect may persist): where the sealed result is."""

    release_id: str
    path: str


def _platform(settings: Settings) -> pipeline.Platform:
    return pipeline.Platform.open(settings)


@task(name="check-data", retries=1)
def check_data(settings: Settings, dataset: str, backend: str = "auto") -> str:
    """Great-expectations checks on the decrypted data (an external dataset's: on Spark); fails the
    run with the summary."""
    report = pipeline.check_data(_platform(settings), dataset, backend)
    if not report.success:
        raise pipeline.ReleaseError(report.failure(dataset))
    return report.summary()


@task(name="check-policy")
def check_policy(settings: Settings, request: ReleaseRequest, evaluator: str | None = None) -> None:
    """The analyst's policy, before anything is computed (epsilon checked when fixed)."""
    pipeline.check_policy(_platform(settings), request, request.epsilon, evaluator)


@task(name="check-budget-left")
def check_budget_left(settings: Settings, planned: pipeline.Plan) -> None:
    """A fixed epsilon the remaining budget cannot cover: refused before the data is read."""
    pipeline.check_budget_left(_platform(settings), planned.request, planned.query.delta)


@task(name="plan")
def plan(settings: Settings, request: ReleaseRequest) -> pipeline.Plan:
    return pipeline.plan(_platform(settings), request)


@task(name="choose-epsilon")
def choose_epsilon(settings: Settings, planned: pipeline.Plan) -> pipeline.EpsilonDecision:
    """Epsilon, then the policy's limit on it (before any budget is reserved)."""
    platform = _platform(settings)
    decision = pipeline.choose_epsilon(platform, planned)
    pipeline.check_policy(platform, planned.request, decision.epsilon)
    return decision


@task(name="accuracy-preview")
def preview(settings: Settings, release_id: str, planned: pipeline.Plan, epsilon: float) -> str:
    """The expected interval of each statistic at this epsilon, from the plan only (before the
    budget is reserved): an artifact in the UI and a file beside the summary."""
    markdown = pipeline.preview_markdown(_platform(settings), planned, epsilon)
    create_markdown_artifact(markdown, key=artifact_key("preview", release_id), description="accuracy preview")
    path = settings.archive_dir / release_id / "preview.md"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(markdown)
    shared_archive.push(settings, path)
    return markdown


@task(name="budget-view")
def budget_view(settings: Settings, dataset: str) -> None:
    """The dataset's budget as a table artifact (one key per dataset: the UI's budget view)."""
    import re

    from prefect.artifacts import create_table_artifact

    from dprelease.reporting.budget_table import budget_rows

    b = _platform(settings).store.budget(dataset)
    rows = budget_rows(b)
    key = "budget-" + re.sub(r"[^a-z0-9-]+", "-", dataset.lower()).strip("-")
    create_table_artifact(rows, key=key[:60] or "budget", description=f"privacy budget of dataset {dataset}")


@task(name="reserve-budget")
def reserve_budget(settings: Settings, release_id: str, planned: pipeline.Plan, epsilon: float) -> None:
    pipeline.reserve(_platform(settings), release_id, planned.request.dataset, epsilon, planned.query.delta)


def _release_key(context, parameters) -> str:
    return f"dprelease-result-{parameters['release_id']}"


@task(name="compute-dp-result", cache_key_fn=_release_key, persist_result=True, retries=1)
def compute(settings: Settings, release_id: str, planned: pipeline.Plan,
            decision: pipeline.EpsilonDecision) -> SealedRef:
    """Draw the noise once: the result is sealed in the archive under the release id; a retry or
    a resumed run gets the same sealed numbers (and Prefect's cache returns the same reference)."""
    platform = _platform(settings)
    pipeline.compute_sealed(platform, release_id, planned, decision)
    return SealedRef(release_id, str(pipeline.sealed_path(platform, release_id)))


@task(name="controller-summary")
def summarise(settings: Settings, release_id: str, planned: pipeline.Plan, decision: pipeline.EpsilonDecision) -> str:
    """The controller's summary: a markdown artifact in the Prefect UI and the signed controller report."""
    platform = _platform(settings)
    result = pipeline.open_sealed(platform, release_id, planned, decision)
    profile = pipeline.risk_profile(platform, planned, decision)
    markdown = pipeline.controller_summary(release_id, planned, decision, result, profile)
    if decisions.risk_above_tolerance(profile):  # a decision, not a label: said first, in words and red
        markdown = decisions.risk_notice(profile, release_id) + "\n\n" + markdown
    create_markdown_artifact(markdown, key=artifact_key("release", release_id), description="controller summary")
    pipeline.save_summary(platform, release_id, markdown)
    pipeline.write_controller_report(platform, release_id, planned, decision, result)
    return markdown


@task(name="publish")
def publish(settings: Settings, release_id: str, planned: pipeline.Plan, decision: pipeline.EpsilonDecision,
            approved_by: str, comment: str) -> str:
    platform = _platform(settings)
    result = pipeline.open_sealed(platform, release_id, planned, decision)
    directory = pipeline.publish(platform, release_id, planned, decision, result, approved_by, comment)
    create_markdown_artifact(f"Published release `{release_id}` to `{directory}` (signed).",
                             key=artifact_key("published", release_id))
    return str(directory)


@task(name="refund")
def refund(settings: Settings, release_id: str, status: str, by: str | None, comment: str) -> None:
    pipeline.refund(_platform(settings), release_id, status, by, comment)


@task(name="evaluate-utility")
def evaluate_utility(settings: Settings, release_id: str, planned: pipeline.Plan, decision: pipeline.EpsilonDecision,
                     evaluator: str, params: dict) -> str:
    """f(DP output) and f(raw output), withheld in the archive; the summary for the last approval."""
    platform = _platform(settings)
    result = pipeline.open_sealed(platform, release_id, planned, decision)
    utility = pipeline.evaluate_utility(platform, release_id, result, evaluator, params,
                                        pipeline.enabled_evaluators(platform, planned.request))
    markdown = pipeline.utility_summary(utility)
    create_markdown_artifact(markdown, key=artifact_key("utility", release_id),
                             description="utility signal (withheld)")
    return markdown


@task(name="publish-utility")
def publish_utility(settings: Settings, release_id: str, planned: pipeline.Plan, decision: pipeline.EpsilonDecision,
                    approved_by: str) -> str:
    import json

    platform = _platform(settings)
    result = pipeline.open_sealed(platform, release_id, planned, decision)
    utility_file = platform.settings.archive_dir / release_id / "utility.json"
    shared_archive.pull(settings, utility_file)  # evaluated on another host, maybe
    utility = json.loads(utility_file.read_text())
    return str(pipeline.publish_utility(platform, release_id, planned, decision, result, utility, approved_by))
