"""Enrolment and sign-in with passkeys: a one-time link registers a person's passkey on their own
device; signing in is a WebAuthn assertion with any registered passkey. No password is stored."""

from __future__ import annotations

import json

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse

from dprelease import passkeys
from dprelease.store import people

from .security import SESSION_COOKIE, Refused, check_csrf, form_of, set_session_cookie, visitor
from .views import render

router = APIRouter()


def challenge_of(credential: dict) -> str:
    """The challenge (base64url) a browser's WebAuthn answer says it answers (checked again by the
    signature verification: a different one fails there)."""
    try:
        client_data = json.loads(passkeys.unb64url(credential["response"]["clientDataJSON"]))
        return str(client_data["challenge"])
    except (KeyError, TypeError, ValueError) as err:
        raise Refused(400, f"the passkey answer is malformed ({err})") from None


async def credential_of(request: Request) -> dict:
    """The WebAuthn credential (JSON) a ceremony's answer posts."""
    try:
        body = await request.json()
        credential = body["credential"]
    except (ValueError, KeyError, TypeError):
        raise Refused(400, "the request carries no passkey answer") from None
    if not isinstance(credential, dict):
        raise Refused(400, "the passkey answer is malformed")
    return credential


def _enrolment(store, token: str) -> people.Enrolment:
    try:
        return people.enrolment(store, token)
    except people.ConsoleRefused as err:
        raise Refused(410, str(err)) from None


@router.get("/enrol/{token}", response_class=HTMLResponse)
def enrol_page(request: Request, token: str):
    who = visitor(request)
    found = _enrolment(request.app.state.store, token)
    person = people.get_person(request.app.state.store, found.person)
    return render(request, who, "enrol.html", person=person, token=token)


@router.post("/enrol/{token}/options")
async def enrol_options(request: Request, token: str):
    who = visitor(request)
    await check_csrf(request, who)
    store, rp = request.app.state.store, request.app.state.rp
    found = _enrolment(store, token)
    challenge = passkeys.new_challenge()
    people.new_challenge(store, passkeys.b64url(challenge), f"enrol:{people.sha256(token)}")
    existing = [p.credential_id for p in people.passkeys_of(store, found.person)]
    return JSONResponse({"options": json.loads(passkeys.registration_options(rp, found.person, challenge, existing))})


@router.post("/enrol/{token}/finish")
async def enrol_finish(request: Request, token: str):
    who = visitor(request)
    await check_csrf(request, who)
    store, rp = request.app.state.store, request.app.state.rp
    credential = await credential_of(request)
    _enrolment(store, token)
    try:
        challenge = people.take_challenge(store, challenge_of(credential), f"enrol:{people.sha256(token)}")
        passkey = passkeys.verify_registration(rp, credential, passkeys.unb64url(challenge.challenge))
        person = people.enrol(store, token, passkey)
    except (people.ConsoleRefused, passkeys.PasskeyRefused) as err:
        raise Refused(410 if isinstance(err, people.ConsoleRefused) else 400, str(err)) from None
    response = JSONResponse({"next": "/", "person": person.name})
    set_session_cookie(response, people.open_session(store, person))
    return response


@router.get("/signin", response_class=HTMLResponse)
def signin_page(request: Request):
    return render(request, visitor(request), "signin.html")


@router.post("/signin/options")
async def signin_options(request: Request):
    who = visitor(request)
    await check_csrf(request, who)
    store, rp = request.app.state.store, request.app.state.rp
    challenge = passkeys.new_challenge()
    people.new_challenge(store, passkeys.b64url(challenge), "sign-in")
    return JSONResponse({"options": json.loads(passkeys.assertion_options(rp, challenge))})


@router.post("/signin/finish")
async def signin_finish(request: Request):
    who = visitor(request)
    await check_csrf(request, who)
    store = request.app.state.store
    credential = await credential_of(request)
    try:
        challenge = people.take_challenge(store, challenge_of(credential), "sign-in")
        passkey, person, count = passkeys.verify_assertion(store, credential, passkeys.unb64url(challenge.challenge),
                                                           counted=True)
    except (people.ConsoleRefused, passkeys.PasskeyRefused) as err:
        raise Refused(401, str(err)) from None
    people.note_sign_count(store, passkey.credential_id, count)
    response = JSONResponse({"next": "/", "person": person.name})
    set_session_cookie(response, people.open_session(store, person))
    return response


@router.post("/signout")
async def signout(request: Request):
    who = visitor(request)
    await check_csrf(request, who, await form_of(request))
    token = request.cookies.get(SESSION_COOKIE)
    if token:
        people.close_session(request.app.state.store, token)
    response = RedirectResponse("/signin", status_code=303)
    response.delete_cookie(SESSION_COOKIE, path="/")
    return response
