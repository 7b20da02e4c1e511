"""Whose an inbox request is, proven rather than claimed. From the command line the analyst signs it
with her own Ed25519 key (`request submit --as NAME --key FILE`): the signature, beside the request
file as `<id>.sig`, covers the request id, the SHA-256 of the file's exact bytes, her name and the
time. In the console the server records the signed-in analyst's request in the store. A controller's
command checks either against the store alone (the key a controller registered for that name out of
band, never one shipped in the inbox), so one analyst cannot submit under another's name and policy,
nor raise a request's epsilon after it was signed.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from cryptography.exceptions import InvalidSignature

from ..reporting import signing
from ..settings import Settings
from ..store import Store, StoreError, analysts
from ..store.database import readable_here
from ..store.opened import opened_store
from .request import RequestError

FORMAT = "dprelease-request-signature/1"
SUFFIX = ".sig"  # beside <id>.json: not a request file, so the inbox's listing never takes it for one


def _resubmit(name) -> str:
    """What a refusal asks for: the analyst submits the request again, signed with her own key."""
    return (f"ask {name or 'its analyst'} to submit it again signed (`dprelease request submit FILE --as "
            f"{name or 'NAME'} --key THEIR_KEY.pem`)")


@dataclass(frozen=True)
class Verdict:
    """An inbox request's author as checked: `analyst` when it is proven, else `problem`, one line
    saying what is wrong and how to fix it."""

    analyst: str | None
    how: str = ""  # "key" (signed on the command line) or "console" (the console's record)
    problem: str = ""


def signature_path(path: Path) -> Path:
    """Where the signature of an inbox request file is kept."""
    return Path(path).with_suffix(SUFFIX)


def _payload(request_id: str, request_bytes: bytes, analyst: str, signed_at: str) -> bytes:
    """The canonical bytes an analyst's key signs."""
    return json.dumps({"format": FORMAT, "request_id": request_id, "analyst": analyst, "signed_at": signed_at,
                       "request_sha256": hashlib.sha256(request_bytes).hexdigest()},
                      sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def sign(request_id: str, request_bytes: bytes, analyst: str, private_key) -> bytes:
    """The signature file's content for a request file about to be written to the inbox."""
    signed_at = datetime.now(UTC).isoformat(timespec="seconds")
    signature = private_key.sign(_payload(request_id, request_bytes, analyst, signed_at))
    return (json.dumps({"format": FORMAT, "analyst": analyst, "signed_at": signed_at,
                        "signature": base64.b64encode(signature).decode()}, indent=2) + "\n").encode()


def private_key(source) -> object:
    """An analyst's private key from its file (or a key object, as it is); RequestError in one line."""
    if not isinstance(source, (str, Path)):
        return source
    try:
        return signing.load_private_key(Path(source))
    except signing.SigningError as err:
        raise RequestError(f"--key: {err}: give the private key whose public key a controller registered for you "
                           "(`dprelease analyst key NAME`)") from None


def check_signer(settings: Settings, analyst: str, private_key) -> None:
    """Refuse at once, where this home's store can be read, a key that is not the one registered for
    `analyst` (the controller's check would refuse the request): an analyst given the inbox alone has
    it checked when a controller lists or runs the request."""
    if not readable_here(settings.store_url):
        return
    registered = analysts.key_of(opened_store(settings.store_url), analyst)
    if registered is None:
        raise RequestError(f"{analyst!r} has no registered analyst key: a controller registers yours (`dprelease "
                           f"analyst key {analyst} --public-key YOUR_KEY.pub.pem`), then submit again")
    if registered.public_key_pem != signing.public_key_pem(private_key.public_key()).decode():
        raise RequestError(f"--key is not the key registered for {analyst!r}: sign with your own key as your own "
                           "name (one analyst cannot submit as another)")


def check(store: Store, path: Path) -> Verdict:
    """Who submitted the inbox request file `path`, checked against what the store registered (its
    tables created: Store.create_all)."""
    path = Path(path)
    where = f"request {path.stem} of the analysts' inbox"
    try:
        data = path.read_bytes()
        named = json.loads(data).get("requested_by")
    except (OSError, ValueError, AttributeError) as err:
        return Verdict(None, problem=f"{where} cannot be read as a request ({err})")
    recorded = analysts.console_submission(store, path.stem)
    if recorded is not None:
        if recorded.request_sha256 != hashlib.sha256(data).hexdigest() or recorded.analyst != named:
            return Verdict(None, problem=f"{where} was changed after {recorded.analyst!r} submitted it in the "
                                         f"console: refused; ask {recorded.analyst} to submit it again in the console")
        return Verdict(named, "console")
    return _check_key_signature(store, path, data, named, where)


def _check_key_signature(store: Store, path: Path, data: bytes, named, where: str) -> Verdict:
    """The verdict on a request signed on the command line (its `<id>.sig`)."""
    resubmit = _resubmit(named)
    try:
        signed = json.loads(signature_path(path).read_bytes())
        analyst, signed_at = signed["analyst"], signed["signed_at"]
        signature = base64.b64decode(signed["signature"], validate=True)
        if signed["format"] != FORMAT or not isinstance(analyst, str) or not isinstance(signed_at, str):
            raise ValueError(f"not a {FORMAT}")
    except FileNotFoundError:
        return Verdict(None, problem=f"{where} is not signed (written into the inbox by hand, or by a version "
                                     f"before requests were signed): it is nobody's; {resubmit}")
    except (OSError, ValueError, KeyError, TypeError, binascii.Error) as err:
        return Verdict(None, problem=f"{where}: its signature {signature_path(path).name} is malformed ({err}); "
                                     f"{resubmit}")
    if analyst != named:
        return Verdict(None, problem=f"{where} names {named!r} as its analyst but is signed as {analyst!r}: one "
                                     f"analyst cannot submit as another; refused; {resubmit}")
    registered = analysts.key_of(store, analyst)
    if registered is None:
        return Verdict(None, problem=f"{where} is signed as {analyst!r}, who has no registered analyst key: "
                                     f"register theirs (`dprelease analyst key {analyst} --public-key "
                                     f"{analyst}.pub.pem`, the public key they hand you), then it counts")
    try:
        signing.load_public_key(registered.public_key_pem.encode()).verify(
            signature, _payload(path.stem, data, analyst, signed_at))
    except InvalidSignature:
        return Verdict(None, problem=f"{where} does not verify with the registered key of {analyst!r} (changed "
                                     f"after it was signed, or signed with another analyst's key): refused; "
                                     f"{resubmit}")
    return Verdict(analyst, "key")


def require(settings: Settings, path: Path) -> str:
    """The analyst an inbox request is proven to be from; RequestError in one line otherwise (what a
    controller's `dprelease release ID` says before anything starts or is spent)."""
    try:
        verdict = check(opened_store(settings.store_url), path)  # tables of an earlier version's store added
    except StoreError as err:
        raise RequestError(f"request {Path(path).stem} of the analysts' inbox cannot be checked: {err}") from None
    if verdict.analyst is None:
        raise RequestError(verdict.problem)
    return verdict.analyst


def _check_name(name: str) -> None:
    if not name.strip() or name != name.strip():
        raise RequestError(f"an analyst's name must be non-blank without surrounding spaces, got {name!r}")


def register_key(settings: Settings, name: str, public_key_path: Path) -> tuple[str, bool]:
    """Register analyst `name`'s public key (a controller, out of band): its fingerprint, and
    whether it replaced a key registered before (requests signed with that one no longer count)."""
    _check_name(name)
    try:
        key = signing.load_public_key(Path(public_key_path))
    except signing.SigningError as err:
        raise RequestError(str(err)) from None
    try:
        replaced = analysts.register_key(opened_store(settings.store_url), name, signing.public_key_pem(key).decode())
    except StoreError as err:
        raise RequestError(str(err)) from None
    return signing.key_fingerprint(key), replaced


def create_key(settings: Settings, name: str, private_key_path: Path) -> tuple[str, bool]:
    """Write a new key pair for analyst `name` (the private key for her alone, the public key beside
    it as .pub.pem) and register the public key."""
    _check_name(name)
    try:
        public_path = signing.generate_keypair_beside(private_key_path)
    except signing.SigningError as err:
        raise RequestError(str(err)) from None
    return register_key(settings, name, public_path)
