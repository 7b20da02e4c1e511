"""The console's people in the store: who may sign in (controllers and analysts), their passkeys
(WebAuthn public credentials, never a password), one-time enrolment links, sign-in sessions, the
challenges of ceremonies under way, and the claim that lets exactly one console decision through.

Secrets (enrolment links, session tokens) are stored only as their SHA-256: a copy of the store
cannot be used to sign in. Every one-time thing is taken by a conditional UPDATE or DELETE in one
transaction, so of two requests racing for it exactly one wins.
"""

from __future__ import annotations

import hashlib
import secrets
from datetime import datetime, timedelta

from sqlalchemy import delete, update
from sqlalchemy.exc import IntegrityError
from sqlmodel import Field, SQLModel, select

from .errors import StoreError
from .tables import UTCDateTime, utcnow

ROLES = ("controller", "analyst")
#: how long an enrolment link may be used (the administrator hands it over out of band)
ENROLMENT_TTL = timedelta(hours=24)
#: how long a console session lasts without signing in again
SESSION_TTL = timedelta(hours=8)
#: how long a WebAuthn ceremony (sign-in, enrolment, decision) may take between its options and its answer
CHALLENGE_TTL = timedelta(minutes=5)


class Person(SQLModel, table=True):
    """Someone who signs in to the console, in one role (controller or analyst)."""

    __tablename__ = "console_people"

    name: str = Field(primary_key=True)
    role: str  # one of ROLES
    added_at: datetime = Field(default_factory=utcnow, sa_type=UTCDateTime)


class Passkey(SQLModel, table=True):
    """A registered WebAuthn credential: its id and COSE public key (base64url), the relying party
    and origin it was registered for. Decisions made with it are checked against exactly these."""

    __tablename__ = "console_passkeys"

    credential_id: str = Field(primary_key=True)  # base64url
    person: str = Field(foreign_key="console_people.name", index=True)
    public_key: str  # base64url of the COSE key
    sign_count: int = 0
    rp_id: str
    origin: str
    added_at: datetime = Field(default_factory=utcnow, sa_type=UTCDateTime)


class Enrolment(SQLModel, table=True):
    """A one-time enrolment link (stored as the SHA-256 of its token): used once, before it expires."""

    __tablename__ = "console_enrolments"

    token_sha256: str = Field(primary_key=True)
    person: str = Field(foreign_key="console_people.name")
    expires_at: datetime = Field(sa_type=UTCDateTime)
    used_at: datetime | None = Field(default=None, sa_type=UTCDateTime)


class ConsoleSession(SQLModel, table=True):
    """A signed-in browser (the cookie holds the token; the store its SHA-256) and its CSRF token."""

    __tablename__ = "console_sessions"

    token_sha256: str = Field(primary_key=True)
    person: str = Field(foreign_key="console_people.name", index=True)
    role: str
    csrf: str
    expires_at: datetime = Field(sa_type=UTCDateTime)


class Challenge(SQLModel, table=True):
    """A WebAuthn challenge handed out for one ceremony (`purpose`), taken back once."""

    __tablename__ = "console_challenges"

    challenge: str = Field(primary_key=True)  # base64url
    purpose: str  # "sign-in", "enrol:<person>", "decide:<release id>"
    payload: str = ""  # what a decision challenge is the hash of (the decision's canonical JSON)
    expires_at: datetime = Field(sa_type=UTCDateTime)


class DecisionClaim(SQLModel, table=True):
    """The one console decision on a release's question being delivered: its primary key lets one through."""

    __tablename__ = "console_decision_claims"

    release_id: str = Field(primary_key=True)
    question: str = Field(primary_key=True)
    person: str
    claimed_at: datetime = Field(default_factory=utcnow, sa_type=UTCDateTime)


TABLES = [Person.__table__, Passkey.__table__, Enrolment.__table__, ConsoleSession.__table__, Challenge.__table__,
          DecisionClaim.__table__]


class ConsoleRefused(StoreError):
    """A sign-in, enrolment or claim the console refuses (expired, used, unknown, already claimed)."""


def sha256(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


# --- people and enrolment ---------------------------------------------------------------------------


def add_person(store, name: str, role: str, ttl: timedelta = ENROLMENT_TTL) -> str:
    """Register `name` in `role` (or find them, in the same role) and return a new one-time
    enrolment token; the person registers a passkey with it before it expires."""
    if role not in ROLES:
        raise ConsoleRefused(f"a role is one of {', '.join(ROLES)}, got {role!r}")
    if not name.strip() or name != name.strip() or len(name) > 64:
        raise ConsoleRefused(f"a name must be non-blank, without surrounding spaces, at most 64 characters: {name!r}")
    token = secrets.token_urlsafe(32)
    with store._transaction() as session:
        person = session.get(Person, name)
        if person is None:
            session.add(Person(name=name, role=role))
            session.flush()
        elif person.role != role:
            raise ConsoleRefused(f"{name!r} is already registered as an {person.role}" if person.role == "analyst"
                                 else f"{name!r} is already registered as a {person.role}")
        session.add(Enrolment(token_sha256=sha256(token), person=name, expires_at=utcnow() + ttl))
    return token


def get_person(store, name: str) -> Person | None:
    with store._transaction() as session:
        return session.get(Person, name)


def list_people(store) -> list[Person]:
    with store._transaction() as session:
        return list(session.exec(select(Person).order_by(Person.name)).all())


def enrolment(store, token: str) -> Enrolment:
    """The enrolment a link names, if it may still be used; ConsoleRefused saying why otherwise."""
    with store._transaction() as session:
        found = session.get(Enrolment, sha256(token))
    if found is None:
        raise ConsoleRefused("this enrolment link is not valid: ask your administrator for a new one")
    if found.used_at is not None:
        raise ConsoleRefused("this enrolment link was already used: a link registers one passkey once; "
                             "ask your administrator for a new one")
    if found.expires_at <= utcnow():
        raise ConsoleRefused("this enrolment link has expired: ask your administrator for a new one "
                             "(dprelease controller add NAME --passkey)")
    return found


def enrol(store, token: str, passkey: Passkey) -> Person:
    """Use the link once and register its person's passkey, in one transaction: of two enrolments
    with the same link exactly one registers a passkey."""
    enrolment(store, token)  # the reason, when the link is refused
    with store._transaction() as session:
        taken = session.execute(update(Enrolment).where(
            Enrolment.token_sha256 == sha256(token), Enrolment.used_at.is_(None),
            Enrolment.expires_at > utcnow()).values(used_at=utcnow()))
        if taken.rowcount != 1:
            raise ConsoleRefused("this enrolment link was already used: ask your administrator for a new one")
        person = session.exec(select(Person).join(Enrolment, Enrolment.person == Person.name).where(
            Enrolment.token_sha256 == sha256(token))).one()
        passkey.person = person.name
        session.add(passkey)
        return person


def passkey(store, credential_id: str) -> Passkey | None:
    with store._transaction() as session:
        return session.get(Passkey, credential_id)


def passkeys_of(store, person: str) -> list[Passkey]:
    with store._transaction() as session:
        return list(session.exec(select(Passkey).where(Passkey.person == person)).all())


def note_sign_count(store, credential_id: str, sign_count: int) -> None:
    """Keep the authenticator's counter (a cloned authenticator shows a counter that went back)."""
    with store._transaction() as session:
        session.execute(update(Passkey).where(Passkey.credential_id == credential_id).values(sign_count=sign_count))


# --- sessions ----------------------------------------------------------------------------------------


def open_session(store, person: Person, ttl: timedelta = SESSION_TTL) -> str:
    """A new session for a person who just signed in; returns the cookie's token."""
    token = secrets.token_urlsafe(32)
    with store._transaction() as session:
        session.add(ConsoleSession(token_sha256=sha256(token), person=person.name, role=person.role,
                                   csrf=secrets.token_urlsafe(24), expires_at=utcnow() + ttl))
    return token


def session_of(store, token: str | None) -> ConsoleSession | None:
    """The live session a cookie's token names, else None (unknown or expired)."""
    if not token:
        return None
    with store._transaction() as session:
        found = session.get(ConsoleSession, sha256(token))
    return found if found is not None and found.expires_at > utcnow() else None


def close_session(store, token: str) -> None:
    with store._transaction() as session:
        session.execute(delete(ConsoleSession).where(ConsoleSession.token_sha256 == sha256(token)))


# --- ceremonies and claims ---------------------------------------------------------------------------


def new_challenge(store, challenge: str, purpose: str, payload: str = "") -> None:
    with store._transaction() as session:
        session.execute(delete(Challenge).where(Challenge.expires_at <= utcnow()))
        session.merge(Challenge(challenge=challenge, purpose=purpose, payload=payload,
                                expires_at=utcnow() + CHALLENGE_TTL))


def take_challenge(store, challenge: str, purpose: str) -> Challenge:
    """The challenge, removed (a ceremony's answer is taken once); ConsoleRefused if it was not
    handed out for this purpose, was taken already, or expired."""
    with store._transaction() as session:
        found = session.get(Challenge, challenge)
        if found is None or found.purpose != purpose:
            raise ConsoleRefused("this passkey answer does not belong to a ceremony of this page "
                                 "(used already, or made for another one): start again")
        session.delete(found)
    if found.expires_at <= utcnow():
        raise ConsoleRefused("this passkey ceremony took too long and expired: start again")
    return found


def claim_decision(store, release_id: str, question: str, person: str) -> None:
    """Take the one console decision on this question; ConsoleRefused if another is being delivered."""
    try:
        with store._transaction() as session:
            session.add(DecisionClaim(release_id=release_id, question=question, person=person))
    except IntegrityError:
        with store._transaction() as session:
            other = session.get(DecisionClaim, (release_id, question))
        who = other.person if other is not None else "another controller"
        raise ConsoleRefused(f"release {release_id} was decided by {who} at the same time: only one decision "
                             "counts (reload the page to see it)") from None


def drop_claim(store, release_id: str, question: str) -> None:
    """Give the question back (the run refused the decision or could not be resumed)."""
    with store._transaction() as session:
        session.execute(delete(DecisionClaim).where(DecisionClaim.release_id == release_id,
                                                    DecisionClaim.question == question))

