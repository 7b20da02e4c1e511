"""The platform's store: datasets, the budget ledger, releases and policies (sqlmodel).

SQLite file by default, PostgreSQL by URL (`postgresql+psycopg://...`). Budget reservation is one
transaction holding a lock, so a dataset's committed plus reserved epsilon and delta never exceed
its cap, however many releases run at once (platform.md, invariant 3):

- PostgreSQL: `SELECT ... FOR UPDATE` on the dataset's row serialises reservations per dataset.
- SQLite: every transaction starts with `BEGIN IMMEDIATE` (SQLAlchemy's pysqlite recipe), which
  takes the database's write lock up front; other writers wait (busy timeout 30 s).

Ledger entries go reserved -> committed | refunded. Committed budget is never returned.
"""

from __future__ import annotations

import json
import math
import uuid
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sqlalchemy import DateTime, event
from sqlalchemy.engine import URL, Engine, make_url
from sqlalchemy.exc import IntegrityError
from sqlalchemy.types import TypeDecorator
from sqlmodel import Field, Session, SQLModel, create_engine, select

from dprelease.settings import Settings

FILE_FORMATS = ("csv", "csv.gz", "parquet")
LEDGER_STATUSES = ("reserved", "committed", "refunded")
RELEASE_STATUSES = ("pending", "awaiting_approval", "approved", "rejected", "expired", "failed", "published")
DECISION_STATUSES = ("approved", "rejected", "expired")  # these stamp decided_at when it is not given
APPROVALS = ("manual", "auto")
SQLITE_BUSY_TIMEOUT_S = 30.0
# Relative slack when comparing sums of floats with a cap: 0.1 + 0.2 must fit a cap of 0.3.
CAP_TOLERANCE = 1e-9


class StoreError(Exception):
    """A store operation that cannot proceed; the message names the problem and the fix."""


class BudgetExceeded(StoreError):
    """A reservation that would take a dataset's committed plus reserved budget above its cap."""


def utcnow() -> datetime:
    """The current time, timezone-aware UTC (one clock for every timestamp in the store)."""
    return datetime.now(UTC)


class UTCDateTime(TypeDecorator):
    """Stores naive UTC and returns aware UTC, so SQLite and PostgreSQL give back the same value."""

    impl = DateTime
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Any) -> datetime | None:
        """Convert to UTC and drop the zone before writing (naive values are taken as UTC)."""
        if value is None or value.tzinfo is None:
            return value
        return value.astimezone(UTC).replace(tzinfo=None)

    def process_result_value(self, value: datetime | None, dialect: Any) -> datetime | None:
        """Mark values read back as UTC."""
        return None if value is None else value.replace(tzinfo=UTC)


# `schema_json` (the spec's column name) shadows pydantic's deprecated BaseModel.schema_json(); harmless here.
with warnings.catch_warnings():
    warnings.filterwarnings("ignore", message='Field name "schema_json"', category=UserWarning)

    class Dataset(SQLModel, table=True):
        """A registered dataset: where its encrypted blob is, what it contains, its privacy budget."""

        __tablename__ = "datasets"

        name: str = Field(primary_key=True)
        privacy_unit: str
        blob_path: str
        fingerprint: str  # SHA-256 hex of the plaintext bytes
        file_format: str  # one of FILE_FORMATS
        schema_json: str  # JSON object: column -> type
        epsilon_cap: float
        delta_cap: float
        expectations_json: str = "[]"
        risk_json: str = "{}"  # risk profile: sensitivity, trust, n, max_risk (risk.md)
        created_at: datetime = Field(default_factory=utcnow, sa_type=UTCDateTime)


class LedgerEntry(SQLModel, table=True):
    """One release's share of a dataset's budget: reserved, then committed or refunded."""

    __tablename__ = "ledger_entries"

    id: int | None = Field(default=None, primary_key=True)
    dataset: str = Field(foreign_key="datasets.name", index=True)
    release_id: str = Field(unique=True)
    epsilon: float
    delta: float
    status: str = "reserved"  # one of LEDGER_STATUSES
    created_at: datetime = Field(default_factory=utcnow, sa_type=UTCDateTime)
    updated_at: datetime = Field(default_factory=utcnow, sa_type=UTCDateTime)


class Release(SQLModel, table=True):
    """A release request and its life: status, the controller's decision, artifacts and digests."""

    __tablename__ = "releases"

    id: str = Field(default_factory=lambda: uuid.uuid4().hex, primary_key=True)
    dataset: str = Field(foreign_key="datasets.name", index=True)
    request_json: str
    status: str = Field(default="pending", index=True)  # one of RELEASE_STATUSES
    decision_by: str | None = None
    decision_comment: str | None = None
    created_at: datetime = Field(default_factory=utcnow, sa_type=UTCDateTime)
    decided_at: datetime | None = Field(default=None, sa_type=UTCDateTime)
    flow_run_id: str | None = None
    artifacts_json: str = "{}"  # JSON object: path -> sha256


class Policy(SQLModel, table=True):
    """What an analyst (or anyone, when analyst is None) may request, and whether it auto-approves."""

    __tablename__ = "policies"

    id: int | None = Field(default=None, primary_key=True)
    name: str = Field(unique=True)
    dataset: str = Field(foreign_key="datasets.name", index=True)
    analyst: str | None = None  # None: any analyst
    max_epsilon_per_release: float
    approval: str = "manual"  # one of APPROVALS
    evaluators_json: str = "[]"
    created_at: datetime = Field(default_factory=utcnow, sa_type=UTCDateTime)


# --- validation -----------------------------------------------------------------------------------


def _check_epsilon(epsilon: float, what: str = "epsilon") -> float:
    """Epsilon must be a positive finite number: zero or infinite budgets are meaningless."""
    eps = float(epsilon)
    if not (math.isfinite(eps) and eps > 0):
        raise ValueError(f"{what} must be a finite number > 0, got {epsilon!r}")
    return eps


def _check_delta(delta: float, what: str = "delta") -> float:
    """Delta must lie in [0, 1): a delta of 1 or more gives no privacy at all."""
    d = float(delta)
    if not (math.isfinite(d) and 0 <= d < 1):
        raise ValueError(f"{what} must be in [0, 1), got {delta!r}")
    return d


def _check_choice(value: str, allowed: tuple[str, ...], what: str) -> str:
    """Refuse a value outside a closed vocabulary, listing the allowed ones."""
    if value not in allowed:
        raise ValueError(f"{what} must be one of {', '.join(allowed)}; got {value!r}")
    return value


def _as_json(value: Any) -> str:
    """JSON text for a *_json column: strings are taken as JSON already and checked to parse."""
    if isinstance(value, str):
        try:
            json.loads(value)
        except json.JSONDecodeError as exc:
            raise ValueError(f"not valid JSON ({exc}): pass a dict or list, or a JSON string") from exc
        return value
    return json.dumps(value, sort_keys=True)


def _within(total: float, cap: float) -> bool:
    """Whether a float sum fits under a cap, allowing only rounding error."""
    return total <= cap + CAP_TOLERANCE * max(cap, 1e-12)


# --- engine ---------------------------------------------------------------------------------------


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


# --- the store ------------------------------------------------------------------------------------


class Store:
    """The platform's database: every method runs in its own short session and transaction."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.engine = make_engine(url)

    @classmethod
    def from_settings(cls, settings: Settings) -> Store:
        """The store named by the settings (`Settings.store_url`)."""
        return cls(settings.store_url)

    def create_all(self) -> None:
        """Create the tables that do not exist yet (safe to call on every start)."""
        SQLModel.metadata.create_all(
            self.engine, tables=[m.__table__ for m in (Dataset, LedgerEntry, Release, Policy)]
        )

    def close(self) -> None:
        """Release the engine's connections (tests, and before deleting a SQLite file)."""
        self.engine.dispose()

    @contextmanager
    def _transaction(self) -> Iterator[Session]:
        """One session in one transaction: committed on success, rolled back on any error."""
        with Session(self.engine, expire_on_commit=False) as session, session.begin():
            yield session

    # --- datasets ---------------------------------------------------------------------------------

    def add_dataset(
        self,
        name: str,
        *,
        privacy_unit: str,
        blob_path: str | Path,
        fingerprint: str,
        file_format: str,
        schema: dict[str, str] | str,
        epsilon_cap: float,
        delta_cap: float,
        expectations: list | str | None = None,
        risk_profile: dict | None = None,
    ) -> Dataset:
        """Register a dataset (its blob is already sealed in the escrow); names are unique."""
        dataset = Dataset(
            name=name,
            privacy_unit=privacy_unit,
            blob_path=str(blob_path),
            fingerprint=fingerprint,
            file_format=_check_choice(file_format, FILE_FORMATS, "file_format"),
            schema_json=_as_json(schema),
            epsilon_cap=_check_epsilon(epsilon_cap, "epsilon_cap"),
            delta_cap=_check_delta(delta_cap, "delta_cap"),
            expectations_json=_as_json([] if expectations is None else expectations),
            risk_json=_as_json(risk_profile or {}),
        )
        try:
            with self._transaction() as session:
                if session.get(Dataset, name) is not None:
                    raise StoreError(f"dataset {name!r} is already registered: choose another name")
                session.add(dataset)
        except IntegrityError as exc:  # a concurrent registration of the same name
            raise StoreError(f"dataset {name!r} is already registered: choose another name") from exc
        return dataset

    def get_dataset(self, name: str) -> Dataset:
        """The dataset called `name`; StoreError naming it when it is not registered."""
        with self._transaction() as session:
            return self._dataset(session, name)

    def list_datasets(self) -> list[Dataset]:
        """All registered datasets, by name."""
        with self._transaction() as session:
            return list(session.exec(select(Dataset).order_by(Dataset.name)).all())

    @staticmethod
    def _dataset(session: Session, name: str, lock: bool = False) -> Dataset:
        """Fetch a dataset in a session, optionally locking its row (FOR UPDATE; no-op in SQLite)."""
        query = select(Dataset).where(Dataset.name == name)
        if lock:
            query = query.with_for_update()
        dataset = session.exec(query).first()
        if dataset is None:
            raise StoreError(f"unknown dataset {name!r}: register it first (`dprelease dataset register`)")
        return dataset

    # --- the budget ledger ------------------------------------------------------------------------

    def reserve(self, dataset: str, release_id: str, epsilon: float, delta: float) -> LedgerEntry:
        """Reserve budget for a release in one locked transaction; BudgetExceeded if it would not fit."""
        epsilon, delta = _check_epsilon(epsilon), _check_delta(delta)
        try:
            with self._transaction() as session:
                ds = self._dataset(session, dataset, lock=True)
                if self._entry(session, release_id, missing_ok=True) is not None:
                    raise StoreError(
                        f"release {release_id!r} already has a budget reservation: a release reserves once"
                    )
                totals = _totals(session, dataset)
                _check_fits(ds, totals, epsilon, delta)
                entry = LedgerEntry(dataset=dataset, release_id=release_id, epsilon=epsilon, delta=delta)
                session.add(entry)
        except IntegrityError as exc:  # unique release_id raced past the check
            raise StoreError(
                f"release {release_id!r} already has a budget reservation: a release reserves once"
            ) from exc
        return entry

    def commit(self, release_id: str) -> LedgerEntry:
        """Mark a reservation as spent (on approval); idempotent; a refunded one cannot be committed."""
        return self._settle(release_id, "committed")

    def refund(self, release_id: str) -> LedgerEntry:
        """Return a reservation (rejected or expired release); idempotent; committed budget stays spent."""
        return self._settle(release_id, "refunded")

    def _settle(self, release_id: str, target: str) -> LedgerEntry:
        """Move a reserved entry to `target`; repeat calls are no-ops; the other final state is an error."""
        with self._transaction() as session:
            entry = self._entry(session, release_id, lock=True)
            if entry.status == target:
                return entry
            if entry.status != "reserved":
                raise StoreError(
                    f"cannot mark the reservation of release {release_id!r} {target}: it is already "
                    f"{entry.status}" + (" (committed budget is never returned)" if target == "refunded"
                                         else "; reserve again under a new release id")
                )
            entry.status = target
            entry.updated_at = utcnow()
            session.add(entry)
            return entry

    def ledger_entry(self, release_id: str) -> LedgerEntry:
        """The ledger entry of a release; StoreError naming it when there is none."""
        with self._transaction() as session:
            return self._entry(session, release_id)

    @staticmethod
    def _entry(session: Session, release_id: str, lock: bool = False, missing_ok: bool = False) -> LedgerEntry | None:
        """Fetch a release's ledger entry in a session, optionally locking its row."""
        query = select(LedgerEntry).where(LedgerEntry.release_id == release_id)
        if lock:
            query = query.with_for_update()
        entry = session.exec(query).first()
        if entry is None and not missing_ok:
            raise StoreError(f"no budget reservation for release {release_id!r}: reserve budget first")
        return entry

    def budget(self, dataset: str) -> dict[str, Any]:
        """The dataset's caps and what is committed, reserved and left, for epsilon and for delta."""
        with self._transaction() as session:
            ds = self._dataset(session, dataset)
            totals = _totals(session, dataset)
        out: dict[str, Any] = {"dataset": dataset}
        for param, cap in (("epsilon", ds.epsilon_cap), ("delta", ds.delta_cap)):
            committed, reserved = totals[param]["committed"], totals[param]["reserved"]
            out[f"{param}_cap"] = cap
            out[f"{param}_committed"] = committed
            out[f"{param}_reserved"] = reserved
            out[f"{param}_remaining"] = max(0.0, cap - committed - reserved)
        return out

    # --- releases ---------------------------------------------------------------------------------

    def add_release(
        self,
        dataset: str,
        request: dict | str,
        *,
        release_id: str | None = None,
        status: str = "pending",
        flow_run_id: str | None = None,
    ) -> Release:
        """Record a new release request (its id is a fresh uuid4 hex unless given)."""
        release = Release(
            dataset=dataset,
            request_json=_as_json(request),
            status=_check_choice(status, RELEASE_STATUSES, "status"),
            flow_run_id=flow_run_id,
        )
        if release_id is not None:
            release.id = release_id
        try:
            with self._transaction() as session:
                self._dataset(session, dataset)
                if session.get(Release, release.id) is not None:
                    raise StoreError(f"release {release.id!r} already exists: use update_release to change it")
                session.add(release)
        except IntegrityError as exc:
            raise StoreError(f"release {release.id!r} already exists: use update_release to change it") from exc
        return release

    def get_release(self, release_id: str) -> Release:
        """The release with this id; StoreError naming it when unknown."""
        with self._transaction() as session:
            return self._release(session, release_id)

    @staticmethod
    def _release(session: Session, release_id: str) -> Release:
        """Fetch a release in a session or name the missing id."""
        release = session.get(Release, release_id)
        if release is None:
            raise StoreError(f"unknown release {release_id!r}: list them with `dprelease pending`")
        return release

    def update_release(self, release_id: str, **fields: Any) -> Release:
        """Change a release's columns; *_json columns take dicts or lists; decisions stamp decided_at."""
        allowed = set(Release.model_fields) - {"id", "created_at"}
        unknown = sorted(set(fields) - allowed)
        if unknown:
            raise StoreError(f"cannot update release field(s) {unknown}: updatable fields are {sorted(allowed)}")
        if "status" in fields:
            _check_choice(fields["status"], RELEASE_STATUSES, "status")
            if fields["status"] in DECISION_STATUSES:
                fields.setdefault("decided_at", utcnow())
        for key in ("request_json", "artifacts_json"):
            if key in fields:
                fields[key] = _as_json(fields[key])
        with self._transaction() as session:
            release = self._release(session, release_id)
            for key, value in fields.items():
                setattr(release, key, value)
            session.add(release)
            return release

    def list_releases(self, status: str | None = None, dataset: str | None = None) -> list[Release]:
        """Releases, oldest first, optionally only those with a status and/or of a dataset."""
        query = select(Release).order_by(Release.created_at, Release.id)
        if status is not None:
            query = query.where(Release.status == _check_choice(status, RELEASE_STATUSES, "status"))
        if dataset is not None:
            query = query.where(Release.dataset == dataset)
        with self._transaction() as session:
            return list(session.exec(query).all())

    # --- policies ---------------------------------------------------------------------------------

    def add_policy(
        self,
        name: str,
        dataset: str,
        *,
        max_epsilon_per_release: float,
        analyst: str | None = None,
        approval: str = "manual",
        evaluators: list | str | None = None,
    ) -> Policy:
        """Record a policy for a dataset (analyst None: applies to every analyst); names are unique."""
        policy = Policy(
            name=name,
            dataset=dataset,
            analyst=analyst,
            max_epsilon_per_release=_check_epsilon(max_epsilon_per_release, "max_epsilon_per_release"),
            approval=_check_choice(approval, APPROVALS, "approval"),
            evaluators_json=_as_json([] if evaluators is None else evaluators),
        )
        try:
            with self._transaction() as session:
                self._dataset(session, dataset)
                if session.exec(select(Policy).where(Policy.name == name)).first() is not None:
                    raise StoreError(f"policy {name!r} already exists: choose another name")
                session.add(policy)
        except IntegrityError as exc:
            raise StoreError(f"policy {name!r} already exists: choose another name") from exc
        return policy

    def policies_for(self, dataset: str, analyst: str | None = None) -> list[Policy]:
        """Policies of a dataset that apply to `analyst`: theirs plus those for any analyst.

        With analyst None (e.g. a schedule) only the any-analyst policies apply."""
        query = select(Policy).where(Policy.dataset == dataset)
        if analyst is None:
            query = query.where(Policy.analyst.is_(None))
        else:
            query = query.where((Policy.analyst.is_(None)) | (Policy.analyst == analyst))
        with self._transaction() as session:
            return list(session.exec(query.order_by(Policy.name)).all())

    def all_policies(self, dataset: str) -> list[Policy]:
        """Every policy of a dataset, whoever it covers (a dataset with none is open to requests)."""
        with self._transaction() as session:
            return list(session.exec(select(Policy).where(Policy.dataset == dataset).order_by(Policy.name)).all())


# --- budget arithmetic (module level so tests can slow it down to widen race windows) -------------


def _totals(session: Session, dataset: str) -> dict[str, dict[str, float]]:
    """Committed and reserved epsilon and delta of a dataset (exact float sums: math.fsum)."""
    rows = session.exec(
        select(LedgerEntry.status, LedgerEntry.epsilon, LedgerEntry.delta).where(
            LedgerEntry.dataset == dataset, LedgerEntry.status.in_(("reserved", "committed"))
        )
    ).all()
    return {
        param: {
            status: math.fsum(row[col] for row in rows if row[0] == status)
            for status in ("committed", "reserved")
        }
        for param, col in (("epsilon", 1), ("delta", 2))
    }


def _check_fits(ds: Dataset, totals: dict[str, dict[str, float]], epsilon: float, delta: float) -> None:
    """Raise BudgetExceeded, with cap, spent, reserved and requested, if the request does not fit."""
    for param, cap, asked in (("epsilon", ds.epsilon_cap, epsilon), ("delta", ds.delta_cap, delta)):
        spent, reserved = totals[param]["committed"], totals[param]["reserved"]
        if not _within(math.fsum((spent, reserved, asked)), cap):
            raise BudgetExceeded(
                f"budget exceeded for dataset {ds.name!r}: {param} cap {cap:g}, committed {spent:g}, "
                f"reserved {reserved:g}, requested {asked:g} (remaining {max(0.0, cap - spent - reserved):g}); "
                "ask for less, wait for pending releases to be refunded, or raise the cap"
            )
