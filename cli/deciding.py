"""A controller's decision from the command line: sign it with the controller's own key, hand it
to the paused run, and report whether the run accepted it (the run checks the signature against
the registered key; a refused decision leaves the release waiting). The console hands its
passkey-signed decisions to the run the same way (`deliver`)."""

from __future__ import annotations

import json
import math
from pathlib import Path

from dprelease import decisions, shared_archive
from dprelease.recovery import run_is_alive
from dprelease.settings import Settings

#: seconds of one look for the pause, between two looks at whether the run still lives
LOOK_S = 5.0


def decide(settings: Settings, release_id: str, decision: str, key: Path, reason: str = "", risk_override: str = "",
           timeout: float = math.inf) -> str:
    """Sign and send a decision; returns the release's status after the run took it. Raises
    DecisionRefused when the decision cannot be signed or the run refuses it. No deadline of its
    own by default: while the run lives it is on its way (a busy Prefect server takes minutes to
    show a pause or hand over an answer); a run that ended or died without taking it ends the wait."""
    from dprelease.store import Store

    release = Store(settings.store_url).get_release(release_id)
    if release.status != "awaiting_approval" or not release.flow_run_id:
        raise decisions.DecisionRefused(f"release {release_id} is {release.status}, not awaiting a decision")
    token = decisions.sign_for_release(settings, release_id, decision, key, reason, risk_override)
    return deliver(settings, release_id, token, timeout)


def deliver(settings: Settings, release_id: str, token: str, timeout: float = math.inf) -> str:
    """Resume the paused run with a signed decision (a key's or a passkey's) and wait until the run
    recorded it; returns the release's status then. DecisionRefused with the run's reason if it
    refused it, or when the run ended or died without taking it (no deadline of its own otherwise)."""
    from dprelease.flows.approvals import answer, looks
    from dprelease.store import Store

    store = Store(settings.store_url)
    release = store.get_release(release_id)
    signed = decisions.authenticated(store, token)
    refused_file = settings.archive_dir / release_id / decisions.REFUSED_FILE
    refused_before = _lines(refused_file, settings)
    _until_paused(store, release_id, release.flow_run_id, timeout)
    answer(release.flow_run_id, signed.decision, signed.controller, signed.reason, timeout=timeout,
           signed_decision=token)
    for _ in looks(timeout, 0.05, 0.5):  # two small files of the archive, read until the run records the decision
        alive, why = run_is_alive(store, store.get_release(release_id))  # before the reads: a run that took it, then
        refused = _lines(refused_file, settings)                                   # ended, is seen to have taken it
        if len(refused) > len(refused_before):
            raise decisions.DecisionRefused(json.loads(refused[-1])["why"])
        if any(d.get("signed_decision") == token for d in decisions.recorded(settings, release_id)):
            return store.get_release(release_id).status
        if not alive:
            raise decisions.DecisionRefused(
                f"the run of release {release_id} ended without taking the decision ({why})")
    raise decisions.DecisionRefused(f"the run of release {release_id} did not take the decision within {timeout:g} s")


def _until_paused(store, release_id: str, flow_run_id: str, timeout: float) -> None:
    """Wait for the run's pause (Prefect's Paused state and its form) while the run lives."""
    from dprelease.flows.approvals import QUICK_POLL_SECONDS, looks, wait_until_paused

    for _ in looks(timeout, QUICK_POLL_SECONDS):
        try:
            wait_until_paused(flow_run_id, timeout=LOOK_S, poll_s=QUICK_POLL_SECONDS)
            return
        except TimeoutError:  # not paused yet: look again while the run lives
            alive, why = run_is_alive(store, store.get_release(release_id))
            if not alive:
                raise decisions.DecisionRefused(f"the run of release {release_id} ended before it paused ({why})")
    raise decisions.DecisionRefused(f"the run of release {release_id} did not pause within {timeout:g} s")


def refuse_before_start(settings: Settings, approve_as: str | None, key: Path | None, risk_override: str,
                        profile: dict | None) -> None:
    """What would make a decision given on the command line fail, checked before the release
    starts, so that nothing is reserved for it: `--approve-as NAME` without a key, a file that is
    not a key, a key of no registered controller or of another one than NAME, and (the risk
    `profile` at the chosen epsilon, when known before the data is read) an approval above the
    tolerable risk without an override. Raises DecisionRefused or SigningError, in one line."""
    if approve_as and key is None:
        raise decisions.DecisionRefused(
            f"--approve-as {approve_as} needs the controller key of {approve_as} to sign the approval: give --key "
            "KEY.pem (or set DPRELEASE_CONTROLLER_KEY); nothing was started")
    if key is not None:
        decisions.signer(settings, key, approve_as)
    if approve_as and profile and decisions.risk_above_tolerance(profile):
        decisions.require_override("this release", profile, risk_override)


def _lines(path: Path, settings: Settings) -> list[str]:
    """The lines of an archive file the run writes (on its worker's host: pulled from a shared archive)."""
    shared_archive.pull(settings, path)
    return path.read_text().splitlines() if path.exists() else []
