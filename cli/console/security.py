"""Who may call what: the session cookie (secure, HTTP-only, SameSite=Strict, expiring; the store
keeps only its hash), the CSRF token every state-changing request carries, and the role each route
needs, checked on the server for every request."""

from __future__ import annotations

import secrets
from dataclasses import dataclass

from fastapi import Request

from dprelease.store import people

SESSION_COOKIE = "dpc_session"
#: before sign-in there is no session: a state-changing request (a passkey ceremony) carries the
#: token of this cookie instead (double submit), and the origin it came from is checked
PRESESSION_COOKIE = "dpc_presession"
CSRF_HEADER = "x-csrf-token"
CSRF_FIELD = "csrf"


class Refused(Exception):
    """A request the console refuses: the HTTP status and one clear line."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass(frozen=True)
class Visitor:
    """Who is calling: their session (None before sign-in) and the CSRF token their pages carry."""

    session: people.ConsoleSession | None
    csrf: str

    @property
    def name(self) -> str:
        return self.session.person if self.session else ""

    @property
    def role(self) -> str:
        return self.session.role if self.session else ""


def visitor(request: Request) -> Visitor:
    """The session of the request's cookie (if live) and the CSRF token its pages must send back."""
    store = request.app.state.store
    session = people.session_of(store, request.cookies.get(SESSION_COOKIE))
    if session is not None:
        return Visitor(session, session.csrf)
    token = request.cookies.get(PRESESSION_COOKIE) or ""
    if not token:
        token = secrets.token_urlsafe(24)
        request.state.new_presession = token  # set on the response (app.py)
    return Visitor(None, token)


def require(request: Request, *roles: str) -> Visitor:
    """The caller, if signed in with one of `roles`; Refused otherwise (an analyst never reaches a
    controller's route, whatever the page they came from shows)."""
    who = visitor(request)
    if who.session is None:
        raise Refused(401, "sign in first: this page needs a session (your passkey, at /signin)")
    if roles and who.role not in roles:
        raise Refused(403, f"refused: this page is for {' or '.join(r + 's' for r in roles)}, and you are "
                           f"signed in as {who.role} {who.name!r}")
    return who


async def check_csrf(request: Request, who: Visitor, form: dict | None = None) -> None:
    """A state-changing request must carry this visitor's CSRF token (header or form field) and,
    when the browser says where it comes from, come from the console's own origin."""
    origin = request.headers.get("origin")
    expected = request.app.state.rp.origin
    if origin and origin != expected:
        raise Refused(403, f"refused: a request from {origin}, not from the console ({expected})")
    sent = request.headers.get(CSRF_HEADER) or (form or {}).get(CSRF_FIELD) or ""
    if not (who.csrf and sent and secrets.compare_digest(sent, who.csrf)):
        raise Refused(403, "refused: the request carries no valid CSRF token (reload the page and try again)")


async def form_of(request: Request) -> dict[str, str]:
    """An HTML form's fields (application/x-www-form-urlencoded; the last value of a repeated field)."""
    from urllib.parse import parse_qsl

    return dict(parse_qsl((await request.body()).decode("utf-8", "replace"), keep_blank_values=True))


def set_session_cookie(response, token: str) -> None:
    """The signed-in browser's cookie: secure, HTTP-only, SameSite=Strict, expiring with the session."""
    response.set_cookie(SESSION_COOKIE, token, max_age=int(people.SESSION_TTL.total_seconds()), httponly=True,
                        secure=True, samesite="strict", path="/")
    response.delete_cookie(PRESESSION_COOKIE, path="/")


def set_presession_cookie(response, token: str) -> None:
    """The token a browser's ceremonies carry before sign-in (double submit), as strict as the session's."""
    response.set_cookie(PRESESSION_COOKIE, token, max_age=3600, httponly=True, secure=True, samesite="strict",
                        path="/")
