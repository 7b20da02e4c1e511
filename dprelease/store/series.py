"""Dataset series in the store: a series, its snapshots (one registered dataset each), the claim
that makes a snapshot's scheduled publication happen once, and the series' budget.

Budget (how statistical offices state it; dp-engine.md, composition):
- per_snapshot: the snapshots hold disjoint sets of people (each period's records are its own
  people), so by parallel composition the series as a whole is (eps, delta)-DP with the largest
  per-snapshot spend; each snapshot's dataset has the per-snapshot cap and nothing more is checked.
- series_cap: the same people appear in every snapshot, so by sequential composition the series
  spends the sum over its snapshots; every reservation on a snapshot is checked, under the series
  row's lock, against the series cap (committed + reserved over all snapshots + asked <= cap).

The claim (table series_claims, primary key series + snapshot) is inserted before any budget is
reserved; a second insert fails on the constraint, so of two runs for one snapshot exactly one goes
on to spend. A refund removes the claim in the same transaction (the snapshot may be published
by a later run); a committed release keeps it for good.
"""

from __future__ import annotations

import json
import math
import re

from sqlalchemy import delete
from sqlalchemy.exc import IntegrityError
from sqlmodel import Session, select

from dp_core.errors import InvalidQueryError
from dp_core.input_checks import check_delta

from .errors import BudgetExceeded, StoreError
from .tables import (
    SERIES_BUDGETS,
    Dataset,
    LedgerEntry,
    Policy,
    Release,
    RunningTotalDeclaration,
    Series,
    Snapshot,
    SnapshotClaim,
)

#: a snapshot label: letters, digits, '-', '.', '_' (e.g. 2026-11, 2026-W07, 2026q3); sorts as text
SNAPSHOT_LABEL = re.compile(r"^[0-9A-Za-z][0-9A-Za-z._-]{0,31}$")
#: what a snapshot's dataset is called: the series name, '@', the label
SNAPSHOT_SEPARATOR = "@"
#: release statuses that end a run without publishing: their claim no longer holds the snapshot
UNPUBLISHED_ENDS = ("failed", "rejected", "expired")
#: relative slack for float sums against a cap (the ledger's CAP_TOLERANCE: 0.1 + 0.2 fits 0.3)
CAP_TOLERANCE = 1e-9


#: the tables of this module (created by Store.create_all; new tables, so existing stores just gain them)
TABLES = [Series.__table__, Snapshot.__table__, SnapshotClaim.__table__, RunningTotalDeclaration.__table__]


class SnapshotRefused(StoreError):
    """A snapshot that cannot be registered or published: missing, already published, bad label."""


def snapshot_dataset_name(series: str, snapshot: str) -> str:
    """The registered dataset that holds one snapshot of a series."""
    return f"{series}{SNAPSHOT_SEPARATOR}{snapshot}"


def check_label(snapshot: str) -> str:
    """A snapshot label must be short and plain (it names a dataset, a folder entry and a chart point)."""
    if not SNAPSHOT_LABEL.match(snapshot or ""):
        raise SnapshotRefused(f"snapshot label {snapshot!r} is not valid: use letters, digits, '-', '.', '_' "
                              "(up to 32 characters, e.g. 2026-11)")
    return snapshot


def schema_differences(contract: dict[str, str], found: dict[str, str]) -> list[str]:
    """What differs between a series' schema and a snapshot's, column by column, in words (columns
    are matched by name: their order in the file does not matter)."""
    out = [f"column {c!r} ({t}) is missing" for c, t in contract.items() if c not in found]
    out += [f"column {c!r} ({t}) is new" for c, t in found.items() if c not in contract]
    out += [f"column {c!r} is {found[c]}, the series has {t}" for c, t in contract.items()
            if c in found and found[c] != t]
    return out


# --- series and snapshots ---------------------------------------------------------------------------


def add_series(store, name: str, *, privacy_unit: str, schema: dict[str, str], budget_mode: str,
               epsilon_cap: float, delta_cap: float) -> Series:
    """Create a series (its schema contract, unit and budget); names are unique."""
    if budget_mode not in SERIES_BUDGETS:
        raise ValueError(f"the series budget must be one of {', '.join(SERIES_BUDGETS)}; got {budget_mode!r}")
    if SNAPSHOT_SEPARATOR in name or not name.strip():
        raise SnapshotRefused(f"series name {name!r} is not valid: non-blank, without {SNAPSHOT_SEPARATOR!r}")
    series = Series(name=name, privacy_unit=privacy_unit, schema_text=json.dumps(schema),
                    budget_mode=budget_mode, epsilon_cap=float(epsilon_cap), delta_cap=float(delta_cap))
    if not (math.isfinite(series.epsilon_cap) and series.epsilon_cap > 0):
        raise ValueError(f"the series epsilon must be a finite number > 0, got {epsilon_cap!r}")
    try:
        check_delta(series.delta_cap, "the series delta")  # the engine's rule (dp_core.input_checks)
    except InvalidQueryError as err:
        raise ValueError(str(err)) from None
    try:
        with store._transaction() as session:
            if session.get(Series, name) is not None:
                raise StoreError(f"series {name!r} already exists")
            session.add(series)
    except IntegrityError as exc:
        raise StoreError(f"series {name!r} already exists") from exc
    return series


def get_series(store, name: str) -> Series:
    with store._transaction() as session:
        series = session.get(Series, name)
        if series is None:
            raise SnapshotRefused(f"unknown series {name!r}: register its first snapshot with `dprelease dataset "
                                  f"register {name} FILE --snapshot LABEL --series-budget ...`")
        return series


def find_series(store, name: str) -> Series | None:
    with store._transaction() as session:
        return session.get(Series, name)


def list_series(store) -> list[Series]:
    with store._transaction() as session:
        return list(session.exec(select(Series).order_by(Series.name)).all())


def add_snapshot(store, series: str, snapshot: str, dataset: str) -> Snapshot:
    """Record a registered dataset as a snapshot of a series, and carry the standing policies of
    the series' latest snapshot over to it (a policy set for the series applies to every period)."""
    row = Snapshot(series=series, snapshot=check_label(snapshot), dataset=dataset)
    try:
        with store._transaction() as session:
            # the series row locked (PostgreSQL; SQLite's transactions hold the write lock), so two
            # registrations of the same series at once are checked one after the other
            session.exec(select(Series).where(Series.name == series).with_for_update()).first()
            if session.get(Snapshot, (series, snapshot)) is not None:
                raise SnapshotRefused(f"snapshot {snapshot} of series {series!r} is already registered")
            previous = max(session.exec(select(Snapshot).where(Snapshot.series == series)).all(),
                           key=label_order, default=None)
            if previous is not None and session.get(RunningTotalDeclaration, series) is not None:
                check_after_newest(series, snapshot, previous.snapshot)
            if previous is not None:
                check_same_widths(series, snapshot, previous.snapshot)
            session.add(row)
            if previous is not None:
                for policy in session.exec(select(Policy).where(Policy.dataset == previous.dataset)).all():
                    base = policy.name.split(SNAPSHOT_SEPARATOR)[0]
                    session.add(Policy(name=f"{base}{SNAPSHOT_SEPARATOR}{snapshot}", dataset=dataset,
                                       analyst=policy.analyst, max_epsilon_per_release=policy.max_epsilon_per_release,
                                       approval=policy.approval, evaluators_json=policy.evaluators_json,
                                       deployment=policy.deployment))
    except IntegrityError as exc:
        raise SnapshotRefused(f"snapshot {snapshot} of series {series!r} is already registered") from exc
    return row


def forget_unrecorded_dataset(store, name: str) -> Dataset | None:
    """Undo the dataset registration of a snapshot that could not be recorded (refused in
    add_snapshot, e.g. a concurrent registration took a later label): its row goes, only while nothing
    refers to it (no snapshot, release, ledger entry or policy). The removed row (its blob is the
    caller's to remove), or None when it is referred to or already gone."""
    with store._transaction() as session:
        dataset = session.exec(select(Dataset).where(Dataset.name == name).with_for_update()).first()
        if dataset is None:
            return None
        for table in (Snapshot, Release, LedgerEntry, Policy):
            if session.exec(select(table).where(table.dataset == name)).first() is not None:
                return None
        session.delete(dataset)
        return dataset


def check_after_newest(series: str, snapshot: str, newest: str) -> None:
    """A series with a running total takes only a label that sorts after its newest (why:
    dprelease.running_total.check_next_label); checked again where the snapshot is recorded, so that
    two registrations at once cannot both pass against the same newest."""
    if snapshot <= newest:
        raise SnapshotRefused(
            f"running total of series {series!r}: snapshot {snapshot} sorts before {newest}, so it would take the "
            "place of a period whose noise is sealed; give a label that sorts after it as text (zero-padded, e.g. "
            "2026-09 then 2026-10); nothing registered")


def same_widths(label: str, newest: str) -> str | None:
    """`label` with each number as wide as the same number of `newest` (zero-padded), when the two
    are alike (numbers in the same places, the same text between them); `label` itself when they are
    not alike or already agree; None when a number is wider and cannot be narrowed. Text order is
    number order only for numbers of one width: 2026-2 after 2026-01 sorts after it, and then
    2026-03 .. 2026-12 all sort before 2026-2."""
    parts, model = re.split(r"(\d+)", label), re.split(r"(\d+)", newest)
    if len(parts) != len(model) or parts[0::2] != model[0::2]:
        return label
    for i in range(1, len(parts), 2):
        width = len(model[i])
        number = parts[i].lstrip("0").rjust(width, "0")
        if len(number) > width:
            return None
        parts[i] = number
    return "".join(parts)


def check_same_widths(series: str, snapshot: str, newest: str) -> None:
    """Every series takes only a label whose numbers are as wide as its newest's: its periods are
    listed (the series page, the index, `latest`, oldest first) in label order, as text, which is
    their order only when each number keeps one width (2026-10 sorts before 2026-9). A back-fill
    written as the series writes its labels (2026-03 after 2026-05) takes its place among them."""
    padded = same_widths(snapshot, newest)
    if padded == snapshot:
        return
    fix = (f"write it {padded}" if padded is not None else
           f"this series' labels are narrower, so it cannot take {snapshot}: register its periods in a new series "
           "whose labels are zero-padded from the first (2026-09, then 2026-10)")
    raise SnapshotRefused(f"snapshot {snapshot} of series {series!r} writes its numbers with other widths than "
                          f"{newest}, and a series lists its periods in label order as text, where numbers of "
                          f"other widths are out of order (2026-10 sorts before 2026-9): {fix}; nothing registered")


def label_order(snapshot: Snapshot) -> str:
    """A snapshot's place in its series: its label in code-point order, Python's, the same on every
    database (a PostgreSQL whose collation is linguistic, e.g. en_US, puts '2026-a' before '2026-B'
    and ignores '-' against '_'; SQLite and the C collation do not), so the periods a running total
    numbers and the label it checks a new snapshot against agree wherever the store is."""
    return snapshot.snapshot


def snapshots(store, series: str) -> list[Snapshot]:
    """The snapshots of a series, oldest label first (label_order)."""
    with store._transaction() as session:
        return sorted(session.exec(select(Snapshot).where(Snapshot.series == series)).all(), key=label_order)


def resolve(store, series: str, rule: str) -> Snapshot:
    """The snapshot a run publishes: `latest` (the newest label) or a label (a back-fill);
    SnapshotRefused naming what exists when there is none."""
    get_series(store, series)
    known = snapshots(store, series)
    if rule == "latest":
        if not known:
            raise SnapshotRefused(f"series {series!r} has no snapshot yet: register one first")
        return known[-1]
    for snap in known:
        if snap.snapshot == rule:
            return snap
    have = ", ".join(s.snapshot for s in known[-6:]) or "none"
    raise SnapshotRefused(f"snapshot {rule!r} of series {series!r} is missing (latest registered: {have}): "
                          f"register it with `dprelease dataset register {series} FILE --snapshot {rule}`")


def check_new(store, series: str, snapshot: str) -> None:
    """For the `latest` rule: refuse, naming it, when the newest snapshot is already published (no
    new period has been registered since). A message only: the claim's key is what enforces once."""
    with store._transaction() as session:
        held = session.get(SnapshotClaim, (series, snapshot))
        if held is not None and (holder := session.get(Release, held.release_id)) is not None \
                and holder.status == "published":
            raise SnapshotRefused(f"no new snapshot of series {series!r}: the latest, {snapshot}, is already published "
                                  f"(nothing spent); register the new period with `dprelease dataset register {series} "
                                  "FILE --snapshot LABEL`")


def series_of_dataset(session: Session, dataset: str) -> tuple[Series, Snapshot] | None:
    """The series and snapshot a dataset belongs to, or None for a plain dataset."""
    snap = session.exec(select(Snapshot).where(Snapshot.dataset == dataset)).first()
    if snap is None:
        return None
    return session.get(Series, snap.series), snap


def snapshot_of_dataset(store, dataset: str) -> tuple[str, str] | None:
    """(series, snapshot label) of a snapshot's dataset, or None for a plain dataset."""
    with store._transaction() as session:
        found = series_of_dataset(session, dataset)
        return None if found is None else (found[0].name, found[1].snapshot)


def series_name_of(store, dataset: str) -> str | None:
    """The series a dataset is a snapshot of (None for a plain dataset)."""
    found = snapshot_of_dataset(store, dataset)
    return None if found is None else found[0]


# --- the once-only claim ----------------------------------------------------------------------------


def claim(store, series: str, snapshot: str, release_id: str) -> SnapshotClaim:
    """Take the snapshot's scheduled publication for `release_id` (before any budget is reserved).

    Refused when another release holds it (published, or still running); a claim left by a run
    that ended without publishing (failed, rejected, expired) is replaced. The primary key decides
    between concurrent runs: the second insert fails, whatever either run read before."""
    taken = SnapshotRefused(f"snapshot {snapshot} of series {series!r} is already published or being published: "
                            "a snapshot is released once (nothing spent)")
    try:
        with store._transaction() as session:
            if session.get(Snapshot, (series, snapshot)) is None:
                raise SnapshotRefused(f"snapshot {snapshot!r} of series {series!r} is missing: nothing spent")
            held = session.exec(select(SnapshotClaim).where(SnapshotClaim.series == series,
                                                            SnapshotClaim.snapshot == snapshot)
                                .with_for_update()).first()
            if held is not None:
                if held.release_id == release_id:
                    return held  # the same run, resumed or retried
                holder = session.get(Release, held.release_id)
                if holder is None or holder.status not in UNPUBLISHED_ENDS:
                    raise SnapshotRefused(f"{taken} (release {held.release_id})")
                session.delete(held)
                session.flush()
            row = SnapshotClaim(series=series, snapshot=snapshot, release_id=release_id)
            session.add(row)
    except IntegrityError as exc:  # a concurrent run inserted it first
        raise taken from exc
    return row


def drop_claim(session: Session, release_id: str) -> None:
    """Give back the snapshot a release claimed (called in the transaction that refunds it)."""
    session.exec(delete(SnapshotClaim).where(SnapshotClaim.release_id == release_id))


def claims(store, series: str) -> dict[str, str]:
    """snapshot label -> the release id holding it."""
    with store._transaction() as session:
        rows = session.exec(select(SnapshotClaim).where(SnapshotClaim.series == series)).all()
        return {r.snapshot: r.release_id for r in rows}


# --- the series budget --------------------------------------------------------------------------------


def _series_totals(session: Session, series: str) -> dict[str, dict[str, float]]:
    rows = session.exec(
        select(LedgerEntry.status, LedgerEntry.epsilon, LedgerEntry.delta)
        .join(Snapshot, Snapshot.dataset == LedgerEntry.dataset)
        .where(Snapshot.series == series, LedgerEntry.status.in_(("reserved", "committed")))
    ).all()
    return {param: {status: math.fsum(r[col] for r in rows if r[0] == status) for status in ("committed", "reserved")}
            for param, col in (("epsilon", 1), ("delta", 2))}


def check_series_fits(session: Session, dataset: str, epsilon: float, delta: float) -> None:
    """In a reservation's transaction: a snapshot of a series_cap series must also fit the series
    cap (sequential composition over all snapshots). Locks the series row, so reservations on
    different snapshots of one series are serialised (PostgreSQL; SQLite locks the whole file)."""
    found = series_of_dataset(session, dataset)
    if found is None or found[0].budget_mode != "series_cap":
        return
    series = session.exec(select(Series).where(Series.name == found[0].name).with_for_update()).one()
    totals = _series_totals(session, series.name)
    for param, cap, asked in (("epsilon", series.epsilon_cap, epsilon), ("delta", series.delta_cap, delta)):
        spent, reserved = totals[param]["committed"], totals[param]["reserved"]
        if math.fsum((spent, reserved, asked)) > cap + CAP_TOLERANCE * max(cap, 1e-12):
            raise BudgetExceeded.over(f"series {series.name!r} (one cap for all snapshots: the same people in each)",
                                      param, cap, spent, reserved, asked)


def series_cap_left(session: Session, dataset: str) -> dict | None:
    """For a snapshot of a series_cap series: the epsilon and delta its series' one cap has left (less
    every snapshot's committed and reserved); None for any other dataset."""
    found = series_of_dataset(session, dataset)
    if found is None or found[0].budget_mode != "series_cap":
        return None
    series = found[0]
    totals = _series_totals(session, series.name)
    return {param: cap - totals[param]["committed"] - totals[param]["reserved"]
            for param, cap in (("epsilon", series.epsilon_cap), ("delta", series.delta_cap))}


def series_budget(store, name: str) -> dict:
    """The series' budget as stated in its page: the mode, the per-period spend and the total
    guarantee (parallel: the largest period; sequential: the sum) with what remains."""
    series = get_series(store, name)
    with store._transaction() as session:
        rows = session.exec(
            select(Snapshot.snapshot, LedgerEntry.epsilon, LedgerEntry.delta, LedgerEntry.release_id)
            .join(LedgerEntry, LedgerEntry.dataset == Snapshot.dataset)
            .where(Snapshot.series == name, LedgerEntry.status == "committed")).all()
        totals = _series_totals(session, name)
    declared = running_total_declaration(store, name)
    per_period: dict[str, dict[str, float]] = {}
    for label, eps, dlt, release_id in rows:
        if declared is not None and release_id == declared.release_id:
            continue  # the running total: charged once for the horizon, stated apart
        period = per_period.setdefault(label, {"epsilon": 0.0, "delta": 0.0})
        period["epsilon"] = math.fsum((period["epsilon"], eps))
        period["delta"] = math.fsum((period["delta"], dlt))
    out = {"series": name, "mode": series.budget_mode, "epsilon_cap": series.epsilon_cap,
           "delta_cap": series.delta_cap, "per_period": dict(sorted(per_period.items()))}
    if declared is not None:
        entry = store.ledger_entry(declared.release_id)
        out["running_total"] = {"epsilon": entry.epsilon, "delta": entry.delta, "status": entry.status,
                                "horizon": json.loads(declared.spec_json)["horizon"],
                                "release_id": declared.release_id}
    eps_values = [p["epsilon"] for p in per_period.values()]
    delta_values = [p["delta"] for p in per_period.values()]
    if series.budget_mode == "per_snapshot":
        out["composition"] = "parallel"
        out["epsilon_total"] = max(eps_values, default=0.0)
        out["delta_total"] = max(delta_values, default=0.0)
    else:
        out["composition"] = "sequential"
        out["epsilon_total"] = totals["epsilon"]["committed"]
        out["delta_total"] = totals["delta"]["committed"]
        out["epsilon_reserved"] = totals["epsilon"]["reserved"]
        out["epsilon_remaining"] = max(0.0, series.epsilon_cap - totals["epsilon"]["committed"]
                                       - totals["epsilon"]["reserved"])
    return out



# --- the running total: declared with the series, charged once for its horizon ----------------------


def running_total_id(series: str) -> str:
    """The ledger entry (release id) of a series' running total."""
    return f"running-total:{series}"


def declare_running_total(store, series: str, spec: dict, epsilon: float, delta: float) -> RunningTotalDeclaration:
    """Record the series' running total and charge its budget once for the whole horizon: a ledger
    entry on the first snapshot, reserved (the dataset's and the series' caps checked) and
    committed. Refused when the series already has one (nothing charged)."""
    get_series(store, series)
    if running_total_declaration(store, series) is not None:
        raise SnapshotRefused(f"series {series!r} already has a running total: it is declared once, with the series")
    first = snapshots(store, series)[0]
    release_id = running_total_id(series)
    store.reserve(first.dataset, release_id, epsilon, delta)
    try:
        with store._transaction() as session:
            row = RunningTotalDeclaration(series=series, spec_json=json.dumps(spec, sort_keys=True),
                                          release_id=release_id)
            session.add(row)
    except Exception:
        store.refund(release_id)
        raise
    store.commit(release_id)
    return row


def running_total_declaration(store, series: str) -> RunningTotalDeclaration | None:
    """The series' running total, or None."""
    with store._transaction() as session:
        return session.get(RunningTotalDeclaration, series)
