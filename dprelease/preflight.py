"""What a release request can be refused for before any flow starts: an unknown dataset, a query
that does not fit the dataset's columns, a policy that does not allow it, a fixed epsilon beyond
the remaining budget, an escrow key that cannot be used, a shared archive that does not answer.
Data-free and quick (no Prefect, no decryption); the flow checks all of it again (and reserves the
budget atomically), so this is a courtesy, never the guard."""

from __future__ import annotations

from . import column_types, external, pipeline, shared_archive
from .requests import ReleaseRequest
from .settings import Settings


def check_request(settings: Settings, request: ReleaseRequest, evaluator: str | None = None) -> None:
    """Raise the error the release flow would raise first, with the same message."""
    platform = pipeline.Platform.open(settings)
    planned = check_submission(platform, request)  # what it asks: dataset, SQL or spec, columns, backend
    platform.escrow_key()  # no key, a malformed key, a key file others can read
    shared_archive.check(settings)  # the bucket the release would seal into and publish to
    pipeline.check_policy(platform, request, request.epsilon, evaluator)
    pipeline.check_budget_left(platform, request, planned.query.delta)


def check_submission(platform: pipeline.Platform, request: ReleaseRequest) -> pipeline.Plan:
    """What a request is refused for by what it asks, with the message its release would give, against
    the registered catalogue: an unknown dataset, SQL the rules refuse, an epsilon or delta out of range,
    a spec's missing column, a backend the dataset cannot run on. Data-free; checked too when a request
    is submitted to the analysts' inbox (the budget, the policy and the keys are the controller's)."""
    planned = pipeline.plan(platform, request)
    if not planned.sql:
        _check_columns(platform, planned)
    external.resolve_backend(platform.store.get_dataset(request.dataset), request.backend)
    return planned


def _check_columns(platform: pipeline.Platform, planned: pipeline.Plan) -> None:
    """The engine's column checks (dp_core.engine.check_columns) against the registered schema, on
    empty stand-ins typed as the release reads them (column_types): no data is read."""
    column_types.check_query_types(planned.query, platform.store.get_dataset(planned.request.dataset))
