"""Controller identities and signed decisions: who may publish is enforced here, not by a form.

Each controller holds their own Ed25519 private key; the home's administrator registers the public
key in the store (`dprelease controller add`). A decision (approve/reject, release id, the question
asked, the controller report's fingerprint, time, reason, risk override) is a signed token:

    dpd1.<base64url of the canonical JSON payload>.<base64url of the Ed25519 signature>

The release flow accepts a decision only when the signature verifies with the registered key of
the controller it names, it answers this release's current question about this exact report, and
(risk above the tolerable risk) an approval carries an override with a reason. Everything
accepted or refused is written to the release's archive folder (controller only).

A decision made in the console is the same content with a passkey's WebAuthn assertion over its
hash instead of an Ed25519 signature (a `dpw1.` token, dprelease.passkeys); `authenticated` checks
either kind against what the store registered for the controller, and both are recorded alike.

Automatic approval is not a decision anybody can send: `standing_approval` grants it only to a
scheduled run (the flow reads its origin from Prefect) of a deployment an automatic policy names.
"""

from __future__ import annotations

import base64
import binascii
import fcntl
import hashlib
import json
import os
import threading
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path

from cryptography.exceptions import InvalidSignature

from dp_core import DPError, risk

from . import passkeys, shared_archive
from .reporting import signing
from .settings import Settings
from .store import Store, StoreError

TOKEN_PREFIX = "dpd1"
DECISIONS = ("approve", "reject")
CONTEXT_FILE = "decision-context.json"  # what the pending question is (written before each pause)
DECISION_FILE = "decision.json"  # the accepted decision, with its token
REFUSED_FILE = "refused-decisions.jsonl"  # every decision that was refused, and why


class DecisionRefused(DPError):
    """A decision that does not count: unsigned, unknown signer, bad signature, wrong release or
    report, or an approval above the tolerable risk without an override. Nothing is published."""


@dataclass(frozen=True)
class Decision:
    """The signed content of a controller's decision."""

    release_id: str
    question: str  # the pause it answers (a release may ask more than once, e.g. utility signaling)
    decision: str  # approve | reject
    controller: str
    report_fingerprint: str  # SHA-256 of the controller report's manifest the controller saw
    decided_at: str  # ISO 8601 UTC
    reason: str = ""
    risk_override: str = ""  # the reason for approving a risk above the tolerable risk


# --- controllers -------------------------------------------------------------------------------


def create_controller(settings: Settings, name: str, private_key_path: Path) -> str:
    """Write a new key pair for controller `name` (private key at `private_key_path`, mode 0600,
    public key beside it as .pub.pem) and register the public key. Returns its fingerprint."""
    return register_controller(settings, name, signing.generate_keypair_beside(private_key_path))


def register_controller(settings: Settings, name: str, public_key_path: Path) -> str:
    """Register an existing public key (the controller keeps the private key). Returns its fingerprint."""
    if not name.strip() or name != name.strip():
        raise DecisionRefused(f"a controller name must be non-blank without surrounding spaces, got {name!r}")
    key = signing.load_public_key(Path(public_key_path))
    store = Store(settings.store_url)
    store.create_all()
    try:
        store.add_controller(name, signing.public_key_pem(key).decode())
    except StoreError as err:
        raise DecisionRefused(str(err)) from None
    return signing.key_fingerprint(key)


def controller_of_key(store: Store, private_key) -> str:
    """The registered controller whose public key matches this private key."""
    pem = signing.public_key_pem(private_key.public_key()).decode()
    for controller in store.list_controllers():
        if controller.public_key_pem == pem:
            return controller.name
    raise DecisionRefused("this key belongs to no registered controller: only a controller may decide "
                          "(the administrator registers one with `dprelease controller add NAME`)")


def signer(settings: Settings, private_key_path: Path, name: str | None = None) -> str:
    """The registered controller whose key this file holds (and, given `name`, only if it is
    `name`'s): checked before a release that will be approved with it starts, so that a wrong key
    is refused before anything is reserved. SigningError or DecisionRefused, in one line."""
    key = signing.load_private_key(Path(private_key_path))
    store = Store(settings.store_url)
    store.create_all()
    controller = controller_of_key(store, key)
    if name is not None and controller != name:
        raise DecisionRefused(f"{private_key_path} is the key of controller {controller!r}, not of {name!r}: "
                              f"approve as {controller!r}, or give {name}'s own key (--key)")
    return controller


# --- the question and the report it is about ----------------------------------------------------


def report_fingerprint(settings: Settings, release_id: str) -> str:
    """SHA-256 of the controller report's signed manifest (it lists every file of the report)."""
    manifest = settings.archive_dir / release_id / "controller" / signing.MANIFEST
    shared_archive.pull(settings, manifest)  # written by the worker's host
    if not manifest.exists():  # a decision must be bound to the report it was made on
        raise DecisionRefused(f"release {release_id} has no signed controller report to decide on")
    return hashlib.sha256(manifest.read_bytes()).hexdigest()


def risk_above_tolerance(profile: dict) -> bool:
    """Whether the risk at the chosen epsilon exceeds the tolerable risk (risk.md)."""
    if not profile or "risk" not in profile or "max_risk" not in profile:
        return False
    return float(profile["risk"]) > risk.level_value(profile["max_risk"]) + 1e-12


def risk_notice(profile: dict, release_id: str = "RELEASE_ID", markdown: bool = True) -> str:
    """The warning shown when the risk is above the tolerable risk, in words (no symbol that a
    font may lack): markdown for the Prefect UI and the terminal, plain text for the controller
    report (which shows it in red by CSS). It says how to approve anyway: the override reason is
    part of the signed decision (`--override-risk`), since the Resume form has no field for it."""
    code, strong = ("`", "**") if markdown else ("", "")
    tolerable = risk.level_value(profile["max_risk"])
    return (f"{strong}WARNING: above your tolerable risk.{strong} The risk at this epsilon is "
            f"{risk.risk_words(float(profile['risk']), tolerable)}. Approving needs an override reason, signed with "
            f"the decision: {code}dprelease approve {release_id} --key YOUR_KEY --override-risk \"REASON\"{code}, or "
            f"in the Prefect UI's Resume form paste into Signed Decision the output of {code}dprelease decision sign "
            f"{release_id} approve --key YOUR_KEY --override-risk \"REASON\"{code} (the form has no override field). "
            "The reason is recorded in the archive.")


def require_override(which: str, profile: dict, risk_override: str) -> None:
    """An approval of a risk above the tolerable risk carries an override with a reason: refused
    otherwise (`profile` holds the risk and the tolerable risk, as a risk profile or a context)."""
    if risk_override.strip():
        return
    raise DecisionRefused(f"{which} is above your tolerable risk: its risk is {risk_written(profile)}; approving "
                          "needs an explicit override with a reason (--override-risk REASON)")


def risk_written(profile: dict) -> str:
    """The risk of a profile or context as the summary and the reports write it (dp_core.risk.risk_words),
    so that a refusal never reads "0.308" beside a summary's "0.31"."""
    return risk.risk_words(float(profile["risk"]), risk.level_value(profile["max_risk"]))


def write_context(settings: Settings, release_id: str, question: str, profile: dict) -> dict:
    """Record what is being asked, so a controller's tool signs for exactly this question."""
    context = {"release_id": release_id, "question": question,
               "report_fingerprint": report_fingerprint(settings, release_id),
               "above_tolerance": risk_above_tolerance(profile),
               "risk": profile.get("risk"), "max_risk": profile.get("max_risk")}
    path = settings.archive_dir / release_id / CONTEXT_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    _write_whole(path, json.dumps(context, indent=2))
    shared_archive.push(settings, path)
    return context


def read_context(settings: Settings, release_id: str) -> dict:
    path = settings.archive_dir / release_id / CONTEXT_FILE
    shared_archive.pull(settings, path)
    if not path.exists():
        raise DecisionRefused(f"release {release_id} asks no question now (no {CONTEXT_FILE} in its archive)")
    return json.loads(path.read_text())


def question_now(settings: Settings, release_id: str) -> dict:
    """The context of the question a release asks now; refused, in `dprelease approve`'s words,
    when it awaits no decision (a published release keeps the context of its last question)."""
    status = Store(settings.store_url).get_release(release_id).status
    if status != "awaiting_approval":  # every question's pause sets it (flows/release.py ask_controller)
        raise DecisionRefused(f"release {release_id} is {status}, not awaiting approval")
    return read_context(settings, release_id)


# --- tokens ------------------------------------------------------------------------------------


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _payload_bytes(decision: Decision) -> bytes:
    return json.dumps(asdict(decision), sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def sign(decision: Decision, private_key) -> str:
    """The token of a decision, signed with the controller's private key."""
    payload = _payload_bytes(decision)
    return f"{TOKEN_PREFIX}.{_b64(payload)}.{_b64(private_key.sign(payload))}"


def parse(token: str) -> tuple[Decision, bytes, bytes]:
    """The decision, its exact payload bytes and the signature, from a token."""
    parts = (token or "").strip().split(".")
    if len(parts) != 3 or parts[0] != TOKEN_PREFIX:
        raise DecisionRefused("no signed decision: a decision must be signed with a controller's key "
                              "(`dprelease approve ID --key YOUR_KEY` or `dprelease decision sign ...`)")
    try:
        payload, signature = _unb64(parts[1]), _unb64(parts[2])
        fields = json.loads(payload)
        decision = Decision(**fields)
    except (binascii.Error, ValueError, TypeError) as err:
        raise DecisionRefused(f"the signed decision is malformed ({err})") from None
    return decision, payload, signature


def sign_for_release(settings: Settings, release_id: str, decision: str, private_key_path: Path, reason: str = "",
                     risk_override: str = "") -> str:
    """Sign `decision` on the question a release asks now, as the controller whose key this is."""
    if decision not in DECISIONS:
        raise DecisionRefused(f"a decision is approve or reject, got {decision!r}")
    key = signing.load_private_key(Path(private_key_path))
    store = Store(settings.store_url)
    context = question_now(settings, release_id)  # no question asked: said before the key's owner is looked up
    return sign(_decision_on(release_id, context, decision, controller_of_key(store, key), reason, risk_override), key)


# --- checking and recording -----------------------------------------------------------------------


def check(store: Store, token: str, *, release_id: str, question: str, fingerprint: str, above_tolerance: bool,
          form_decision: str | None = None, form_controller: str | None = None) -> Decision:
    """The decision a token carries, if it counts; DecisionRefused saying why otherwise."""
    decision = authenticated(store, token)
    if decision.release_id != release_id or decision.question != question:
        raise DecisionRefused(f"the signed decision is for release {decision.release_id} ({decision.question}), "
                              f"not for {release_id} ({question})")
    if decision.report_fingerprint != fingerprint:
        raise DecisionRefused("the signed decision is about another version of the controller report")
    if decision.decision not in DECISIONS:
        raise DecisionRefused(f"a decision is approve or reject, got {decision.decision!r}")
    if form_decision is not None and form_decision != decision.decision:
        raise DecisionRefused(f"the form says {form_decision!r} but the signed decision says {decision.decision!r}")
    if form_controller is not None and form_controller.strip() != decision.controller:
        raise DecisionRefused(f"the form names {form_controller!r} but the decision is signed by {decision.controller!r}")
    if decision.decision == "approve" and above_tolerance and not decision.risk_override.strip():
        raise DecisionRefused("the risk is above your tolerable risk: approving needs an override reason signed with "
                              f"the decision (`dprelease decision sign {release_id} approve --key YOUR_KEY "
                              '--override-risk "REASON"`)')
    return decision


def authenticated(store: Store, token: str) -> Decision:
    """The decision a token carries once its signature verifies with what the store registered for
    the controller it names: their Ed25519 key (a dpd1 token), or their passkey (a dpw1 token made in
    the console: dprelease.passkeys). DecisionRefused saying why otherwise."""
    if passkeys.is_token(token):
        return _passkey_decision(store, token)
    decision, payload, signature = parse(token)
    try:
        registered = store.get_controller(decision.controller)
    except StoreError as err:
        raise DecisionRefused(f"not a controller's decision: {err}") from None
    key = signing.load_public_key(registered.public_key_pem.encode())
    try:
        key.verify(signature, payload)
    except InvalidSignature:
        raise DecisionRefused(f"the signature does not verify with the registered key of {decision.controller!r}: "
                              "refused") from None
    return decision


def _passkey_decision(store: Store, token: str) -> Decision:
    """A console decision: the assertion verifies with the passkey registered to the controller it names."""
    try:
        payload, signer = passkeys.verify_token(store, token)
        decision = Decision(**json.loads(payload))
    except passkeys.PasskeyRefused as err:
        raise DecisionRefused(str(err)) from None
    except (ValueError, TypeError) as err:
        raise DecisionRefused(f"the passkey-signed decision is malformed ({err})") from None
    if signer != decision.controller:
        raise DecisionRefused(f"the decision names {decision.controller!r} but was made with the passkey of "
                              f"{signer!r}: refused")
    return decision


def to_sign(settings: Settings, release_id: str, decision: str, controller: str, reason: str = "",
            risk_override: str = "") -> Decision:
    """The decision `controller` is about to sign on the question a release asks now (with a key
    or a passkey); refused at once when it could not count."""
    if decision not in DECISIONS:
        raise DecisionRefused(f"a decision is approve or reject, got {decision!r}")
    return _decision_on(release_id, question_now(settings, release_id), decision, controller, reason, risk_override)


def _decision_on(release_id: str, context: dict, decision: str, controller: str, reason: str,
                 risk_override: str) -> Decision:
    """The decision on the question `context` (question_now) records; an approval above the
    tolerable risk without an override reason is refused."""
    if decision == "approve" and context.get("above_tolerance"):
        require_override(f"release {release_id}", context, risk_override)
    return Decision(release_id=release_id, question=context["question"], decision=decision, controller=controller,
                    report_fingerprint=context["report_fingerprint"],
                    decided_at=datetime.now(UTC).isoformat(timespec="seconds"), reason=reason,
                    risk_override=risk_override)


def payload_of(decision: Decision) -> bytes:
    """The canonical JSON a decision's signature (Ed25519) or passkey assertion (its hash) covers."""
    return _payload_bytes(decision)


def audit(settings: Settings, store: Store, release_id: str) -> list[tuple[bool, str]]:
    """Every recorded decision of a release checked again from what the store registered (the
    controller's key or passkey, never a copy kept beside the decision), the last one against the
    signed controller report in the archive: (ok, one line) per decision."""
    entries = recorded(settings, release_id)
    lines = []
    for i, entry in enumerate(entries):
        token = entry.get("signed_decision")
        if not token:
            lines.append((str(entry.get("controller", "")).startswith("policy:"),
                          f"{entry.get('decision')} by {entry.get('controller')}: a standing policy's automatic "
                          "approval (no signature)"))
            continue
        kind = "passkey" if passkeys.is_token(token) else "key"
        try:
            decision = authenticated(store, token)
        except DecisionRefused as err:
            lines.append((False, f"{entry.get('decision')} by {entry.get('controller')}: {err}"))
            continue
        same = all(entry.get(k) == v for k, v in asdict(decision).items())
        about = i < len(entries) - 1 or decision.report_fingerprint == report_fingerprint(settings, release_id)
        if not (same and about and decision.release_id == release_id):
            lines.append((False, f"{decision.decision} by {decision.controller}: the recorded decision differs from "
                                 "what was signed, or is about another controller report"))
            continue
        lines.append((True, f"{decision.decision} by {decision.controller} at {decision.decided_at}: verifies with "
                            f"{decision.controller}'s registered {kind}"))
    return lines


def record(settings: Settings, release_id: str, decision: Decision | dict, token: str | None) -> Path:
    """The accepted decision in the release's archive: who, what, when, why, about which report."""
    entry = asdict(decision) if isinstance(decision, Decision) else dict(decision)
    entry["signed_decision"] = token
    path = settings.archive_dir / release_id / DECISION_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_suffix(".lock"), "w") as lock:  # one writer at a time: no decision lost
        fcntl.flock(lock, fcntl.LOCK_EX)
        history = json.loads(path.read_text()) if path.exists() else []
        history.append(entry)
        _write_whole(path, json.dumps(history, indent=2))
        shared_archive.push(settings, path)
    return path


def _write_whole(path: Path, text: str) -> None:
    """Replace the file in one step: a reader sees the old text or the new, never a torn file
    (a decision read while another is being recorded was once an empty file)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def record_refusal(settings: Settings, release_id: str, reason: str, token: str | None) -> None:
    path = settings.archive_dir / release_id / REFUSED_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as fh:
        fh.write(json.dumps({"at": datetime.now(UTC).isoformat(timespec="seconds"), "why": reason,
                             "token": (token or "")[:2000]}) + "\n")
    shared_archive.push(settings, path)


def recorded(settings: Settings, release_id: str) -> list[dict]:
    """The decisions recorded for a release (oldest first)."""
    path = settings.archive_dir / release_id / DECISION_FILE
    shared_archive.pull(settings, path)  # recorded by the run, on its worker's host
    return json.loads(path.read_text()) if path.exists() else []


# --- automatic approval ------------------------------------------------------------------------------


def standing_approval(store: Store, dataset: str, requested_by: str | None, epsilon: float,
                      scheduled_deployment: str | None):
    """The automatic policy that approves this release, if any: only for a scheduled run (its
    origin read from Prefect, never from a parameter) of the deployment the policy names."""
    if not scheduled_deployment:
        return None
    for policy in store.policies_for(dataset, requested_by):
        if (policy.approval == "auto" and policy.deployment == scheduled_deployment
                and epsilon <= policy.max_epsilon_per_release + 1e-12):
            return policy
    return None
