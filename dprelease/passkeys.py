"""Passkeys (WebAuthn, via py_webauthn): registering a person's credential, checking a sign-in, and
the passkey-signed decision, a second kind of authenticated decision beside the Ed25519 token.

A decision made in the console is a WebAuthn assertion whose challenge is the SHA-256 of the
decision's canonical JSON (the same fields an Ed25519 token signs: release, question, decision,
controller, fingerprint of the signed controller report, time, reason, risk override):

    dpw1.<base64url of the payload>.<base64url of the assertion JSON (id, authenticatorData,
                                     clientDataJSON, signature), as the browser returned it>

It counts only when (WebAuthn Level 2, section 7.2) the credential is registered in the store to a
controller; clientDataJSON's type is webauthn.get, its challenge is SHA-256(payload) and its origin
the one the credential was registered at; the authenticator data's RP id hash is that of the
credential's RP id, with user presence and user verification set; and the signature over
authenticatorData || SHA-256(clientDataJSON) verifies with the registered public key. The private
key never leaves the controller's device, so whoever holds only the server cannot make one.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import secrets
from dataclasses import dataclass

from dp_core import DPError

from .store import people

TOKEN_PREFIX = "dpw1"


class PasskeyRefused(DPError):
    """A passkey answer that does not count: unknown credential, another site, not the challenge
    asked, no user verification, or a signature that does not verify."""


@dataclass(frozen=True)
class RelyingParty:
    """Where passkeys are used: the RP id (the site's domain, e.g. console.example.org, or localhost)
    and the origin browsers report (https://console.example.org). A passkey works only there."""

    rp_id: str
    origin: str
    name: str = "dprelease console"


def b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


def unb64url(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def new_challenge() -> bytes:
    """32 bytes from the OS CSPRNG (a challenge must never repeat)."""
    return secrets.token_bytes(32)


def decision_challenge(payload: bytes) -> bytes:
    """The challenge a decision's assertion signs: the SHA-256 of the decision's canonical JSON."""
    return hashlib.sha256(payload).digest()


# --- ceremonies --------------------------------------------------------------------------------------


def _webauthn():
    """py_webauthn and its exceptions and structs, imported on first use: 50-100 ms (cbor2, pyasn1)
    that a process deciding with controllers' keys (a release, `dprelease approve`) never needs."""
    import webauthn
    from webauthn.helpers import exceptions, structs

    return webauthn, exceptions, structs


def registration_options(rp: RelyingParty, person: str, challenge: bytes, existing: list[str]) -> str:
    """The options (JSON) of navigator.credentials.create for a person's new passkey: a discoverable
    credential with user verification, none of the person's registered ones again."""
    webauthn, _, structs = _webauthn()
    options = webauthn.generate_registration_options(
        rp_id=rp.rp_id, rp_name=rp.name, user_name=person, user_id=hashlib.sha256(person.encode()).digest()[:16],
        challenge=challenge,
        authenticator_selection=structs.AuthenticatorSelectionCriteria(
            resident_key=structs.ResidentKeyRequirement.REQUIRED,
            user_verification=structs.UserVerificationRequirement.REQUIRED),
        exclude_credentials=[structs.PublicKeyCredentialDescriptor(id=unb64url(c)) for c in existing])
    return webauthn.options_to_json(options)


def verify_registration(rp: RelyingParty, response: dict, challenge: bytes) -> people.Passkey:
    """The passkey a registration response creates, once it answers this challenge at this site."""
    webauthn, webauthn_errors, _ = _webauthn()
    try:
        verified = webauthn.verify_registration_response(credential=response, expected_challenge=challenge,
                                                         expected_rp_id=rp.rp_id, expected_origin=rp.origin,
                                                         require_user_verification=True)
    except (webauthn_errors.WebAuthnException, ValueError, KeyError, TypeError) as err:
        raise PasskeyRefused(f"the passkey could not be registered: {err}") from None
    return people.Passkey(credential_id=b64url(verified.credential_id), person="",
                          public_key=b64url(verified.credential_public_key), sign_count=verified.sign_count,
                          rp_id=rp.rp_id, origin=rp.origin)


def assertion_options(rp: RelyingParty, challenge: bytes, allowed: list[str] | None = None) -> str:
    """The options (JSON) of navigator.credentials.get: any of this site's passkeys (sign-in), or
    only the signed-in person's (a decision), with user verification."""
    webauthn, _, structs = _webauthn()
    options = webauthn.generate_authentication_options(
        rp_id=rp.rp_id, challenge=challenge, user_verification=structs.UserVerificationRequirement.REQUIRED,
        allow_credentials=[structs.PublicKeyCredentialDescriptor(id=unb64url(c)) for c in allowed or []])
    return webauthn.options_to_json(options)


def verify_assertion(store, response: dict, challenge: bytes,
                     counted: bool = False) -> tuple[people.Passkey, people.Person, int]:
    """The registered passkey and person that made this assertion over `challenge`, and the
    authenticator's new counter; PasskeyRefused saying why otherwise. The site and origin checked
    are those the passkey was registered for (from the store, not from the request). `counted`: the
    counter must have moved past the last one seen (a sign-in now; a cloned authenticator's lags),
    not so for a recorded decision checked again later."""
    credential_id = response.get("id") if isinstance(response, dict) else None
    found = people.passkey(store, credential_id) if isinstance(credential_id, str) else None
    if found is None:
        raise PasskeyRefused("this passkey is not registered here (enrol with the link your administrator gave you)")
    person = people.get_person(store, found.person)
    webauthn, webauthn_errors, _ = _webauthn()
    try:
        verified = webauthn.verify_authentication_response(
            credential=response, expected_challenge=challenge, expected_rp_id=found.rp_id,
            expected_origin=found.origin, credential_public_key=unb64url(found.public_key),
            credential_current_sign_count=found.sign_count if counted else 0, require_user_verification=True)
    except (webauthn_errors.WebAuthnException, ValueError, KeyError, TypeError) as err:
        raise PasskeyRefused(f"the passkey's answer does not verify: {err}") from None
    return found, person, verified.new_sign_count


# --- the passkey-signed decision ---------------------------------------------------------------------


def is_token(token: str | None) -> bool:
    return (token or "").strip().startswith(TOKEN_PREFIX + ".")


def make_token(payload: bytes, assertion: dict) -> str:
    """The decision token: the payload and the assertion the controller's device made over its hash."""
    return f"{TOKEN_PREFIX}.{b64url(payload)}.{b64url(json.dumps(assertion, separators=(',', ':')).encode())}"


def verify_token(store, token: str) -> tuple[bytes, str]:
    """The payload of a passkey-signed decision and the controller whose registered passkey signed
    it; PasskeyRefused when it is malformed, not a controller's, or does not verify."""
    parts = (token or "").strip().split(".")
    if len(parts) != 3 or parts[0] != TOKEN_PREFIX:
        raise PasskeyRefused("not a passkey-signed decision")
    try:
        payload, assertion = unb64url(parts[1]), json.loads(unb64url(parts[2]))
    except (binascii.Error, ValueError) as err:
        raise PasskeyRefused(f"the passkey-signed decision is malformed ({err})") from None
    found, person, _ = verify_assertion(store, assertion, decision_challenge(payload))
    if person is None or person.role != "controller":
        raise PasskeyRefused(f"the passkey belongs to {found.person!r}, who is not a controller: refused")
    return payload, person.name
