"""The `Store`: the catalogue of datasets, the budget ledger (reservations), releases and policies.

Budget reservation is one transaction holding a lock, so a dataset's committed plus reserved epsilon
and delta never exceed its cap, however many releases run at once (platform.md, invariant 3).
Ledger entries go reserved -> committed | refunded. Committed budget is never returned.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import or_
from sqlalchemy.exc import IntegrityError, OperationalError
from sqlmodel import Session, SQLModel, select

from dp_core.errors import InvalidQueryError
from dp_core.input_checks import check_delta
from dprelease.settings import Settings

from . import analysts as _analysts
from . import people as _people
from . import series as _series
from .database import SQLITE_BUSY_TIMEOUT_S, make_engine
from .errors import BudgetExceeded, StoreError
from .tables import (
    APPROVALS,
    DECISION_STATUSES,
    EXTERNAL_FORMATS,
    FILE_FORMATS,
    FINAL_STATUSES,
    RELEASE_STATUSES,
    Controller,
    Dataset,
    Lease,
    LedgerEntry,
    Policy,
    Release,
    utcnow,
)

# Relative slack when comparing sums of floats with a cap: 0.1 + 0.2 must fit a cap of 0.3.
CAP_TOLERANCE = 1e-9


# --- validation -----------------------------------------------------------------------------------


def _check_epsilon(epsilon: float, what: str = "epsilon") -> float:
    """Epsilon must be a positive finite number: zero or infinite budgets are meaningless."""
    eps = float(epsilon)
    if not (math.isfinite(eps) and eps > 0):
        raise ValueError(f"{what} must be a finite number > 0, got {epsilon!r}")
    return eps


def _check_delta(delta: float, what: str = "delta") -> float:
    """Delta is 0 or in [MIN_DELTA, MAX_DELTA], the engine's rule (dp_core.input_checks.check_delta): a
    cap or a release above it makes the guarantee meaningless."""
    try:
        return check_delta(float(delta), what)
    except InvalidQueryError as err:
        raise ValueError(str(err)) from None


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
            self.engine, tables=[m.__table__ for m in (Dataset, LedgerEntry, Release, Policy, Lease, Controller)]
        )
        SQLModel.metadata.create_all(self.engine, tables=_series.TABLES)  # dataset series (new tables only)
        SQLModel.metadata.create_all(self.engine, tables=_people.TABLES)  # the console's people (new tables only)
        SQLModel.metadata.create_all(self.engine, tables=_analysts.TABLES)  # analysts' keys (new tables only)
        _add_policy_deployment_column(self.engine)

    def close(self) -> None:
        """Release the engine's connections (tests, and before deleting a SQLite file)."""
        self.engine.dispose()

    @contextmanager
    def _transaction(self) -> Iterator[Session]:
        """One session in one transaction: committed on success, rolled back on any error. A SQLite
        write lock not obtained within the busy timeout is the store's own error (nothing changed)."""
        try:
            with Session(self.engine, expire_on_commit=False) as session, session.begin():
                yield session
        except OperationalError as err:
            if "database is locked" not in str(err):
                raise
            raise StoreError(
                f"the store was busy for {SQLITE_BUSY_TIMEOUT_S:g} s (other commands held its write lock, "
                "on an overloaded machine): this step changed nothing; run the command again, or use "
                "PostgreSQL for many concurrent commands") from None

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
            file_format=_check_choice(file_format, FILE_FORMATS + EXTERNAL_FORMATS, "file_format"),
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
                release = session.exec(select(Release).where(Release.id == release_id).with_for_update()).first()
                if release is not None and release.status in FINAL_STATUSES:
                    raise StoreError(f"release {release_id!r} is {release.status}: a finished release reserves nothing")
                if self._entry(session, release_id, missing_ok=True) is not None:
                    raise StoreError(
                        f"release {release_id!r} already has a budget reservation: a release reserves once"
                    )
                _check_fits_now(session, ds, epsilon, delta)
                entry = LedgerEntry(dataset=dataset, release_id=release_id, epsilon=epsilon, delta=delta)
                session.add(entry)
        except IntegrityError as exc:  # unique release_id raced past the check
            raise StoreError(
                f"release {release_id!r} already has a budget reservation: a release reserves once"
            ) from exc
        return entry

    def check_fits(self, dataset: str, epsilon: float, delta: float) -> None:
        """BudgetExceeded, in `reserve`'s words, if a reservation of (epsilon, delta) would not fit now
        (the dataset's caps, and its series' cap). Reserves nothing: `reserve` checks again under its
        lock; this lets a release its remaining budget cannot cover stop before its data is read."""
        epsilon, delta = _check_epsilon(epsilon), _check_delta(delta)
        with self._transaction() as session:
            _check_fits_now(session, self._dataset(session, dataset), epsilon, delta)

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
            if target == "refunded":
                _series.drop_claim(session, release_id)  # a snapshot not published may be published later
            return entry

    def abandon(self, release_id: str, status: str = "failed", comment: str = "", by: str | None = None) -> str:
        """End a release that will not publish, in one transaction: refund its reservation and mark it
        `status` (a final status). Returns what its ledger entry is now: "refunded", "none" (nothing
        was reserved) or "committed" (it was approved and is publishing: then nothing is changed).
        A release already final keeps its status; an unknown one raises StoreError."""
        if _check_choice(status, RELEASE_STATUSES, "status") not in FINAL_STATUSES:
            raise ValueError(f"abandon marks a final status ({', '.join(FINAL_STATUSES)}), not {status!r}")
        with self._transaction() as session:
            release = session.exec(select(Release).where(Release.id == release_id).with_for_update()).first()
            if release is None:
                raise StoreError(f"unknown release {release_id!r}: list them with `dprelease pending`")
            entry = self._entry(session, release_id, lock=True, missing_ok=True)
            if entry is not None and entry.status == "committed":
                return "committed"
            _series.drop_claim(session, release_id)  # a snapshot not published may be published later
            if entry is not None and entry.status == "reserved":
                entry.status, entry.updated_at = "refunded", utcnow()
                session.add(entry)
            if release.status not in FINAL_STATUSES:
                release.status, release.decision_comment, release.decided_at = status, comment[:500], utcnow()
                release.decision_by = by
                session.add(release)
            return "none" if entry is None else entry.status

    # --- leases: which process runs a release -------------------------------------------------------

    def take_lease(self, release_id: str, host: str, pid: int, process_started: float = 0.0,
                   flow_run_id: str | None = None) -> Lease:
        """Record (or take over, when a run is resumed elsewhere) the process that runs a release."""
        with self._transaction() as session:
            lease = session.get(Lease, release_id) or Lease(release_id=release_id, host=host, pid=pid)
            lease.host, lease.pid, lease.process_started = host, pid, process_started
            lease.flow_run_id, lease.heartbeat_at = flow_run_id, utcnow()
            session.add(lease)
            return lease

    def renew_lease(self, release_id: str) -> None:
        """The owner's heartbeat: the run is alive now."""
        with self._transaction() as session:
            lease = session.get(Lease, release_id)
            if lease is not None:
                lease.heartbeat_at = utcnow()
                session.add(lease)

    def end_lease(self, release_id: str) -> None:
        """The run is over (whatever its outcome): forget its owner."""
        with self._transaction() as session:
            lease = session.get(Lease, release_id)
            if lease is not None:
                session.delete(lease)

    def get_lease(self, release_id: str) -> Lease | None:
        """The lease of a release, None when no process holds it."""
        with self._transaction() as session:
            return session.get(Lease, release_id)

    def reserved_entries(self) -> list[LedgerEntry]:
        """Every reservation not yet committed nor refunded, oldest first."""
        with self._transaction() as session:
            query = select(LedgerEntry).where(LedgerEntry.status == "reserved").order_by(LedgerEntry.id)
            return list(session.exec(query).all())

    def ledger_entries(self, dataset: str | None = None) -> list[LedgerEntry]:
        """Every ledger entry (of one dataset, or all), oldest first: one read for a whole page."""
        with self._transaction() as session:
            query = select(LedgerEntry).order_by(LedgerEntry.id)
            if dataset is not None:
                query = query.where(LedgerEntry.dataset == dataset)
            return list(session.exec(query).all())

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
        """The dataset's caps and what is committed, reserved and left, for epsilon and for delta. A
        snapshot of a series_cap series has left at most what its series has left (what a reservation
        on it may take: every snapshot spends from the series' one cap)."""
        with self._transaction() as session:
            ds = self._dataset(session, dataset)
            totals = _totals(session, dataset)
            shared = _series.series_cap_left(session, dataset)
        out: dict[str, Any] = {"dataset": dataset}
        for param, cap in (("epsilon", ds.epsilon_cap), ("delta", ds.delta_cap)):
            committed, reserved = totals[param]["committed"], totals[param]["reserved"]
            out[f"{param}_cap"] = cap
            out[f"{param}_committed"] = committed
            out[f"{param}_reserved"] = reserved
            out[f"{param}_remaining"] = max(0.0, min(cap - committed - reserved,
                                                     shared[param] if shared else math.inf))
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

    def release_requests(self) -> list:
        """Every release's id, status, creation time and request JSON: four columns, not whole rows (a
        page over thousands of releases)."""
        with self._transaction() as session:
            return list(session.exec(select(Release.id, Release.status, Release.created_at,
                                            Release.request_json)).all())

    def releases_of_run(self, flow_run_id: str) -> list[Release]:
        """The releases one flow run made: its own id, `<id>@<snapshot>` for each further snapshot a
        series run publishes, and `<id>-retryN` (made by Retry before it ended at once) (indexed
        primary-key ranges, not a scan of every release)."""
        prefixes = (f"{flow_run_id}-retry", f"{flow_run_id}@")
        in_range = [(Release.id >= prefix) & (Release.id < prefix + "\uffff") for prefix in prefixes]
        query = (select(Release).where(or_(Release.id == flow_run_id, *in_range))
                 .order_by(Release.created_at, Release.id))
        with self._transaction() as session:
            return [r for r in session.exec(query).all() if r.id == flow_run_id or r.id.startswith(prefixes)]

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
        deployment: str | None = None,
    ) -> Policy:
        """Record a policy for a dataset (analyst None: applies to every analyst); names are unique.
        deployment: the Prefect deployment whose scheduled runs an automatic policy approves."""
        policy = Policy(
            name=name,
            dataset=dataset,
            analyst=analyst,
            max_epsilon_per_release=_check_epsilon(max_epsilon_per_release, "max_epsilon_per_release"),
            approval=_check_choice(approval, APPROVALS, "approval"),
            evaluators_json=_as_json([] if evaluators is None else evaluators),
            deployment=deployment or None,
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


    # --- controllers ------------------------------------------------------------------------------

    def add_controller(self, name: str, public_key_pem: str) -> Controller:
        """Register a controller's public key (names are unique; a key is registered once)."""
        with self._transaction() as session:
            if session.get(Controller, name) is not None:
                raise StoreError(f"controller {name!r} is already registered")
            if session.exec(select(Controller).where(Controller.public_key_pem == public_key_pem)).first():
                raise StoreError("this public key is already registered to another controller")
            controller = Controller(name=name, public_key_pem=public_key_pem)
            session.add(controller)
            return controller

    def get_controller(self, name: str) -> Controller:
        """The registered controller; StoreError naming them when unknown."""
        with self._transaction() as session:
            controller = session.get(Controller, name)
            if controller is None:
                raise StoreError(f"{name!r} is not a registered controller (dprelease controller add NAME)")
            return controller

    def list_controllers(self) -> list[Controller]:
        with self._transaction() as session:
            return list(session.exec(select(Controller).order_by(Controller.name)).all())


def _add_policy_deployment_column(engine) -> None:
    """Stores created before policies named a deployment gain the (nullable) column."""
    from sqlalchemy import inspect, text

    columns = {c["name"] for c in inspect(engine).get_columns("policies")}
    if "deployment" not in columns:
        with engine.begin() as connection:
            connection.execute(text("ALTER TABLE policies ADD COLUMN deployment VARCHAR"))


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


def _check_fits_now(session: Session, ds: Dataset, epsilon: float, delta: float) -> None:
    """In a session: BudgetExceeded unless (epsilon, delta) fits the dataset's caps and, for a snapshot
    of a series_cap series, the series' cap too (what `reserve` and `check_fits` ask)."""
    _check_fits(ds, _totals(session, ds.name), epsilon, delta)
    _series.check_series_fits(session, ds.name, epsilon, delta)


def _check_fits(ds: Dataset, totals: dict[str, dict[str, float]], epsilon: float, delta: float) -> None:
    """Raise BudgetExceeded, with cap, spent, reserved and requested, if the request does not fit."""
    for param, cap, asked in (("epsilon", ds.epsilon_cap, epsilon), ("delta", ds.delta_cap, delta)):
        spent, reserved = totals[param]["committed"], totals[param]["reserved"]
        if not _within(math.fsum((spent, reserved, asked)), cap):
            raise BudgetExceeded.over(f"dataset {ds.name!r}", param, cap, spent, reserved, asked)
