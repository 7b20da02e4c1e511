"""A controller's decision from the command line: sign it with the controller's own key, hand it
to the paused run, and report whether the run accepted it (the run checks the signature against
the registered key; a refused decision leaves the release waiting). The console hands its
passkey-signed decisions to the run the same way (`deliver`)."""

from __future__ import annotations

import json
from pathlib import Path

from dprelease import decisions
from dprelease.settings import Settings


def decide(settings: Settings, release_id: str, decision: str, key: Path, reason: str = "", risk_override: str = "",
           timeout: float = 120.0) -> str:
    """Sign and send a decision; returns the release's status after the run took it. Raises
    DecisionRefused when the decision cannot be signed or the run refuses it."""
    from dprelease.store import Store

    release = Store(settings.store_url).get_release(release_id)
    if release.status != "awaiting_approval" or not release.flow_run_id:
        raise decisions.DecisionRefused(f"release {release_id} is {release.status}, not awaiting a decision")
    token = decisions.sign_for_release(settings, release_id, decision, key, reason, risk_override)
    return deliver(settings, release_id, token, timeout)


def deliver(settings: Settings, release_id: str, token: str, timeout: float = 120.0) -> str:
    """Resume the paused run with a signed decision (a key's or a passkey's) and wait until the run
    recorded it; returns the release's status then. DecisionRefused with the run's reason if it refused it."""
    from dprelease.store import Store
    from flows.approvals import answer, looks

    store = Store(settings.store_url)
    release = store.get_release(release_id)
    signed = decisions.authenticated(store, token)
    refused_file = settings.archive_dir / release_id / decisions.REFUSED_FILE
    refused_before = _lines(refused_file)
    answer(release.flow_run_id, signed.decision, signed.controller, signed.reason, signed_decision=token)
    for _ in looks(timeout, 0.05, 0.5):  # two small files of the archive, read until the run records the decision
        refused = _lines(refused_file)
        if len(refused) > len(refused_before):
            raise decisions.DecisionRefused(json.loads(refused[-1])["why"])
        if any(d.get("signed_decision") == token for d in decisions.recorded(settings, release_id)):
            return store.get_release(release_id).status
    raise decisions.DecisionRefused(f"the run of release {release_id} did not take the decision within {timeout:g} s")


def _lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []
