"""The store's tables (sqlmodel): datasets, ledger entries, releases and policies, and their vocabularies.

Timestamps are stored as naive UTC and read back as aware UTC, so SQLite and PostgreSQL agree."""

from __future__ import annotations

import uuid
import warnings
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import DateTime
from sqlalchemy.types import TypeDecorator
from sqlmodel import Field, SQLModel

FILE_FORMATS = ("csv", "csv.gz", "parquet")
EXTERNAL_FORMATS = ("external-table", "external-parquet", "external-csv")  # registered by reference (dprelease.external)
LEDGER_STATUSES = ("reserved", "committed", "refunded")
RELEASE_STATUSES = ("pending", "awaiting_approval", "approved", "rejected", "expired", "failed", "published")
FINAL_STATUSES = ("rejected", "expired", "failed", "published")  # a run in one of these is over
DECISION_STATUSES = ("approved", "rejected", "expired")  # these stamp decided_at when it is not given
APPROVALS = ("manual", "auto")


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
        """A registered dataset: where its encrypted blob is, what it contains, its privacy budget.
        An external dataset (file_format in EXTERNAL_FORMATS) has no blob: `blob_path` holds its
        reference (a Spark table name or a lake path) and `fingerprint` that of the reference and schema."""

        __tablename__ = "datasets"

        name: str = Field(primary_key=True)
        privacy_unit: str
        blob_path: str
        fingerprint: str  # SHA-256 hex of the plaintext bytes
        file_format: str  # one of FILE_FORMATS, or EXTERNAL_FORMATS
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


class Lease(SQLModel, table=True):
    """Who runs a release: the process (host, pid, its start time) and its last heartbeat. A
    reservation whose run has no live lease is refunded by the recovery sweep (dprelease.recovery)."""

    __tablename__ = "leases"

    release_id: str = Field(primary_key=True)
    host: str
    pid: int
    process_started: float = 0.0  # the owner's start time (seconds since boot), so a reused pid is not mistaken
    flow_run_id: str | None = None
    heartbeat_at: datetime = Field(default_factory=utcnow, sa_type=UTCDateTime)


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
    deployment: str | None = None  # auto approval: only scheduled runs of this Prefect deployment
    created_at: datetime = Field(default_factory=utcnow, sa_type=UTCDateTime)


class Controller(SQLModel, table=True):
    """A data controller who may decide releases: their registered Ed25519 public key (PEM). A
    decision counts only if its signature verifies with this key (dprelease.decisions)."""

    __tablename__ = "controllers"

    name: str = Field(primary_key=True)
    public_key_pem: str
    added_at: datetime = Field(default_factory=utcnow, sa_type=UTCDateTime)


# --- dataset series (periodic publication): dprelease.store.series -----------------------------------

SERIES_BUDGETS = ("per_snapshot", "series_cap")  # parallel over disjoint snapshots | sequential over all


class Series(SQLModel, table=True):
    """A dataset published periodically: every snapshot has this schema and unit. budget_mode
    per_snapshot: the snapshots hold disjoint people, each may spend `epsilon_cap` (parallel
    composition); series_cap: the same people in every snapshot, all together may spend `epsilon_cap`
    (sequential composition)."""

    __tablename__ = "series"

    name: str = Field(primary_key=True)
    privacy_unit: str
    schema_text: str  # JSON object: column -> type, the contract every snapshot must meet
    budget_mode: str  # one of SERIES_BUDGETS
    epsilon_cap: float
    delta_cap: float
    created_at: datetime = Field(default_factory=utcnow, sa_type=UTCDateTime)


class Snapshot(SQLModel, table=True):
    """One period of a series: its own registered (escrowed, checked) dataset."""

    __tablename__ = "series_snapshots"

    series: str = Field(foreign_key="series.name", primary_key=True)
    snapshot: str = Field(primary_key=True)  # the period's label, e.g. 2026-11 (sorts in time order)
    dataset: str = Field(foreign_key="datasets.name", unique=True)
    created_at: datetime = Field(default_factory=utcnow, sa_type=UTCDateTime)


class RunningTotalDeclaration(SQLModel, table=True):
    """A series' running total (dprelease.running_total), declared when the series is created with
    its horizon of T periods; its budget is the ledger entry `release_id`, charged once for all T."""

    __tablename__ = "series_running_totals"

    series: str = Field(foreign_key="series.name", primary_key=True)
    spec_json: str  # the declaration: statistic, horizon, contribution bound, groups, epsilon, delta
    release_id: str = Field(unique=True)  # its ledger entry, on the series' first snapshot
    created_at: datetime = Field(default_factory=utcnow, sa_type=UTCDateTime)


class SnapshotClaim(SQLModel, table=True):
    """The scheduled publication of one snapshot: its primary key makes it happen once. Taken before
    any budget is reserved; removed in the transaction that refunds the release (a run that did not
    publish gives the snapshot back)."""

    __tablename__ = "series_claims"

    series: str = Field(foreign_key="series.name", primary_key=True)
    snapshot: str = Field(primary_key=True)
    release_id: str = Field(unique=True)
    created_at: datetime = Field(default_factory=utcnow, sa_type=UTCDateTime)
