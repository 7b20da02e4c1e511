"""Connecting to the store: a SQLite file or PostgreSQL, with the locking that reservations rely on.

- PostgreSQL: `SELECT ... FOR UPDATE` on the dataset's row serialises reservations per dataset.
- SQLite: every transaction starts with `BEGIN IMMEDIATE` (SQLAlchemy's pysqlite recipe), which
  takes the database's write lock up front; other writers wait (busy timeout 120 s).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sqlalchemy import event
from sqlalchemy.engine import URL, Engine, make_url
from sqlmodel import create_engine

from .errors import StoreError

SQLITE_BUSY_TIMEOUT_S = 120.0  # generous: on an overloaded machine a lock holder may wait its turn for a CPU


def readable_here(url: str) -> bool:
    """Whether this process can read the store at `url` without creating one: an analyst given the
    inbox alone has no SQLite file to read (and none is created for her); a server may always be asked."""
    import os

    parsed = make_url(url)
    return parsed.get_backend_name() != "sqlite" or os.access(parsed.database or "", os.R_OK)


def _normalise_url(url: str) -> URL:
    """Parse the store URL; plain `postgresql://` means psycopg 3 (the driver the platform ships)."""
    parsed = make_url(url)
    if parsed.drivername in ("postgresql", "postgres"):
        parsed = parsed.set(drivername="postgresql+psycopg")
    backend = parsed.get_backend_name()
    if backend not in ("sqlite", "postgresql"):
        raise StoreError(
            f"unsupported store URL {parsed.render_as_string(hide_password=True)!r}: use a SQLite file "
            "(sqlite:///path/store.db) or PostgreSQL (postgresql+psycopg://user@host/db)"
        )
    return parsed


def _check_sqlite_path(url: URL) -> None:
    """A SQLite file store needs an existing directory; say so instead of 'unable to open'."""
    database = url.database
    if not database or database == ":memory:" or database.startswith("file:"):
        raise StoreError(
            "the SQLite store must be a file (sqlite:///path/store.db): an in-memory database is "
            "private to one connection and cannot be locked across threads"
        )
    parent = Path(database).expanduser().resolve().parent
    if not parent.is_dir():
        raise StoreError(f"directory {parent} of the SQLite store does not exist: run `dprelease init` first")


def _install_sqlite_locking(engine: Engine) -> None:
    """SQLAlchemy's pysqlite recipe: disable the driver's own BEGIN, emit `BEGIN IMMEDIATE` ourselves.

    The write lock is then taken when a transaction starts, not at its first write, so a reservation's
    read of the ledger and its insert cannot interleave with another writer's."""

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, connection_record: Any) -> None:
        dbapi_connection.isolation_level = None  # pysqlite emits no BEGIN (nor COMMIT before DDL)
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA foreign_keys = ON")
        cursor.execute(f"PRAGMA busy_timeout = {int(SQLITE_BUSY_TIMEOUT_S * 1000)}")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Any) -> None:
        conn.exec_driver_sql("BEGIN IMMEDIATE")


def make_engine(url: str) -> Engine:
    """An engine for the store URL with the locking that budget reservations rely on."""
    parsed = _normalise_url(url)
    if parsed.get_backend_name() == "sqlite":
        _check_sqlite_path(parsed)
        engine = create_engine(
            parsed, connect_args={"check_same_thread": False, "timeout": SQLITE_BUSY_TIMEOUT_S}
        )
        _install_sqlite_locking(engine)
        return engine
    return create_engine(parsed, pool_pre_ping=True)
