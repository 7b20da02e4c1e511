"""Who submitted an inbox request, as the store knows it: each analyst's command-line public key
(Ed25519, registered by a controller out of band: `dprelease analyst key`), and the requests the
console wrote for an analyst signed in with her passkey. The analyst never reads the store: her
request is checked against these on the controller's side (dprelease.requests.signed).
"""

from __future__ import annotations

from datetime import datetime

from sqlmodel import Field, SQLModel, select

from .errors import StoreError
from .tables import UTCDateTime, utcnow


class AnalystKey(SQLModel, table=True):
    """An analyst's registered public key (PEM): an inbox request counts as hers only when it is
    signed with the private key of this one."""

    __tablename__ = "analyst_keys"

    name: str = Field(primary_key=True)
    public_key_pem: str
    added_at: datetime = Field(default_factory=utcnow, sa_type=UTCDateTime)


class ConsoleSubmission(SQLModel, table=True):
    """A request file the console wrote in the inbox: for the analyst signed in (her passkey), or a
    controller's epsilon chosen in the console for a request proven the analyst's. Its id, the SHA-256
    of the file written, the analyst, who wrote it: the console's word, kept where analysts cannot write."""

    __tablename__ = "console_submissions"

    request_id: str = Field(primary_key=True)
    analyst: str
    request_sha256: str
    written_by: str = ""  # the analyst, or the controller who chose its epsilon in the console
    submitted_at: datetime = Field(default_factory=utcnow, sa_type=UTCDateTime)


TABLES = [AnalystKey.__table__, ConsoleSubmission.__table__]


def register_key(store, name: str, public_key_pem: str) -> bool:
    """Register `name`'s public key, replacing the one registered before (a lost key); True when it
    replaced one. One key belongs to one analyst."""
    with store._transaction() as session:
        other = session.exec(select(AnalystKey).where(AnalystKey.public_key_pem == public_key_pem)).first()
        if other is not None and other.name != name:
            raise StoreError(f"this public key is already registered to analyst {other.name!r}: each analyst "
                             "has a key of her own")
        found = session.get(AnalystKey, name)
        if found is None:
            session.add(AnalystKey(name=name, public_key_pem=public_key_pem))
            return False
        found.public_key_pem, found.added_at = public_key_pem, utcnow()
        session.add(found)
        return True


def key_of(store, name: str) -> AnalystKey | None:
    """The key registered for analyst `name`, or None."""
    with store._transaction() as session:
        return session.get(AnalystKey, name)


def keys(store) -> list[AnalystKey]:
    """Every registered analyst key, by name."""
    with store._transaction() as session:
        return list(session.exec(select(AnalystKey).order_by(AnalystKey.name)).all())


def record_console_submission(store, request_id: str, analyst: str, request_sha256: str,
                              written_by: str | None = None) -> None:
    """The console's record that this request file is `analyst`'s: she submitted it, signed in, or
    `written_by` (a controller) rewrote her request's epsilon; a rewrite replaces the record."""
    with store._transaction() as session:
        session.merge(ConsoleSubmission(request_id=request_id, analyst=analyst, request_sha256=request_sha256,
                                        written_by=written_by or analyst))


def console_submission(store, request_id: str) -> ConsoleSubmission | None:
    """What the console recorded of an inbox request, or None (not submitted in the console)."""
    with store._transaction() as session:
        return session.get(ConsoleSubmission, request_id)
