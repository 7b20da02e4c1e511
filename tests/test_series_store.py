"""Dataset series in the store (issue 21): the once-only claim under concurrency (a constraint, not
a check-then-act), the ledger in both series budgets, and snapshot registration refusing a changed
schema with the same verdict from the Python API and the CLI (nothing written). SQLite, and
PostgreSQL when DPRELEASE_TEST_PG_URL is set."""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path

import pandas as pd
import pytest
from test_store import any_store, pg_store, sqlite_store  # noqa: F401 - the store fixtures
from typer.testing import CliRunner

from dprelease.store import BudgetExceeded, Store
from dprelease.store import series as store_series

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
from monthly_snapshots import write_snapshots
from patience import PATIENCE_S

LABELS = ("2026-01", "2026-02", "2026-03")


def _series(store: Store, mode: str, cap: float) -> None:
    """A series of three snapshots, each its own registered dataset (the blobs are not needed here)."""
    schema = {"person_id": "int64", "visits": "int64"}
    for label in LABELS:
        store.add_dataset(f"visits@{label}", privacy_unit="person_id", blob_path="-", fingerprint="-",
                          file_format="parquet", schema=schema, epsilon_cap=cap, delta_cap=1e-5)
    store_series.add_series(store, "visits", privacy_unit="person_id", schema=schema, budget_mode=mode,
                            epsilon_cap=cap, delta_cap=1e-5)
    for label in LABELS:
        store_series.add_snapshot(store, "visits", label, f"visits@{label}")


def _entries(store: Store) -> list[tuple]:
    from sqlmodel import Session, select

    from dprelease.store import LedgerEntry

    with Session(store.engine) as session:
        return sorted((e.dataset, e.epsilon, e.status) for e in session.exec(select(LedgerEntry)).all())


def test_two_runs_for_one_snapshot_at_once_exactly_one_spends(any_store):  # noqa: F811
    """Eight runs claim 2026-02 at once (PostgreSQL: truly concurrent transactions, each reading
    'free' before any commits): the primary key lets exactly one through to reserve."""
    _series(any_store, "per_snapshot", 1.0)
    barrier, won, refused, other = threading.Barrier(8), [], [], []

    def run(i: int) -> None:
        release_id = f"run-{i}"
        any_store.add_release("visits@2026-02", {}, release_id=release_id)
        barrier.wait()
        try:
            store_series.claim(any_store, "visits", "2026-02", release_id)
        except store_series.SnapshotRefused as err:
            refused.append(str(err))
            return
        except BaseException as err:  # noqa: BLE001 - reported below
            other.append(err)
            return
        any_store.reserve("visits@2026-02", release_id, 0.5, 0.0)
        won.append(release_id)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(PATIENCE_S)
    assert not other and len(won) == 1 and len(refused) == 7, (won, refused, other)
    assert all("released once" in r for r in refused)
    assert _entries(any_store) == [("visits@2026-02", 0.5, "reserved")]


def test_a_refund_gives_the_snapshot_back_and_a_commit_keeps_it(any_store):  # noqa: F811
    _series(any_store, "per_snapshot", 1.0)
    for rid in ("a", "b", "c", "d"):
        any_store.add_release("visits@2026-01", {}, release_id=rid)
    store_series.claim(any_store, "visits", "2026-01", "a")
    any_store.reserve("visits@2026-01", "a", 0.5, 0.0)
    any_store.abandon("a", "rejected", "not this month")  # rejected: refunded, the claim with it
    assert store_series.claims(any_store, "visits") == {}
    store_series.claim(any_store, "visits", "2026-01", "b")
    any_store.update_release("b", status="failed")  # failed before reserving: its claim is stale
    store_series.claim(any_store, "visits", "2026-01", "c")
    any_store.reserve("visits@2026-01", "c", 0.5, 0.0)
    any_store.commit("c")
    any_store.update_release("c", status="published")
    with pytest.raises(store_series.SnapshotRefused, match="already published"):
        store_series.claim(any_store, "visits", "2026-01", "d")
    with pytest.raises(store_series.SnapshotRefused, match="missing"):
        store_series.claim(any_store, "visits", "2027-01", "d")
    assert store_series.claims(any_store, "visits") == {"2026-01": "c"}
    with pytest.raises(store_series.SnapshotRefused, match="no new snapshot"):
        store_series.check_new(any_store, "visits", "2026-01")
    store_series.check_new(any_store, "visits", "2026-02")  # not published yet: a run may go on


def test_series_cap_charges_every_snapshot_against_one_cap_under_concurrency(any_store, monkeypatch):  # noqa: F811
    """Sequential composition: ten reservations of 0.3 on different snapshots at once against a
    series cap of 1.0: at most three fit, whatever the interleaving (the series row is locked)."""
    _series(any_store, "series_cap", 1.0)
    original = store_series._series_totals

    def slow(session, series):
        totals = original(session, series)
        time.sleep(0.02)
        return totals

    monkeypatch.setattr(store_series, "_series_totals", slow)
    barrier, ok, refused = threading.Barrier(10), [], []

    def reserve(i: int) -> None:
        dataset = f"visits@{LABELS[i % 3]}"
        barrier.wait()
        try:
            any_store.reserve(dataset, f"r{i}", 0.3, 0.0)
            ok.append(i)
        except BudgetExceeded as err:
            refused.append((dataset, str(err)))

    threads = [threading.Thread(target=reserve, args=(i,)) for i in range(10)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(PATIENCE_S)
    assert len(ok) == 3 and len(refused) == 7
    for dataset, message in refused:  # the series refuses; a snapshot holding 0.9 itself may refuse first
        own = sum(0.3 for i in ok if f"visits@{LABELS[i % 3]}" == dataset)
        assert "series 'visits'" in message or (own + 0.3 > 1.0 and f"'{dataset}'" in message), message
    for i in ok:
        any_store.commit(f"r{i}")
    budget = store_series.series_budget(any_store, "visits")
    assert budget["composition"] == "sequential"
    assert budget["epsilon_total"] == pytest.approx(0.9) and budget["epsilon_remaining"] == pytest.approx(0.1)


@pytest.mark.parametrize("mode", ["series_cap", "per_snapshot"])
def test_a_snapshot_s_budget_left_is_what_a_reservation_on_it_may_take(sqlite_store, mode):  # noqa: F811
    """`dprelease budget` and the console's budgets page (Store.budget) said a series_cap series' next
    snapshot had its whole cap left (2.2) while the series, whose one cap every snapshot spends, had
    1.2: what a reservation on it may take, and what the PRI chooses epsilon within, is the smaller."""
    _series(sqlite_store, mode, 1.0)
    sqlite_store.reserve("visits@2026-01", "r1", 0.6, 1e-6)
    sqlite_store.commit("r1")
    sqlite_store.reserve("visits@2026-02", "r2", 0.1, 0.0)  # reserved counts as spent until refunded
    left = 0.3 if mode == "series_cap" else 1.0
    for label, own in (("2026-02", 0.9), ("2026-03", 1.0)):
        budget = sqlite_store.budget(f"visits@{label}")
        assert budget["epsilon_remaining"] == pytest.approx(min(own, left))
        with pytest.raises(BudgetExceeded):  # just above it is refused; it is itself taken
            sqlite_store.reserve(f"visits@{label}", f"over-{label}", budget["epsilon_remaining"] + 1e-3, 0.0)
    sqlite_store.reserve("visits@2026-03", "r3", left, 0.0)


def test_per_snapshot_budget_each_period_its_own_cap_total_is_the_largest(sqlite_store):  # noqa: F811
    """Parallel composition over disjoint snapshots: each snapshot may spend its cap; the series'
    guarantee is the largest period's epsilon, not the sum."""
    _series(sqlite_store, "per_snapshot", 1.0)
    for i, label in enumerate(LABELS):
        sqlite_store.reserve(f"visits@{label}", f"r{i}", 1.0 if i == 1 else 0.5, 0.0)
        sqlite_store.commit(f"r{i}")
    with pytest.raises(BudgetExceeded, match="visits@2026-02"):
        sqlite_store.reserve("visits@2026-02", "again", 0.1, 0.0)
    budget = store_series.series_budget(sqlite_store, "visits")
    assert budget["composition"] == "parallel" and budget["epsilon_total"] == 1.0
    assert [p["epsilon"] for p in budget["per_period"].values()] == [0.5, 1.0, 0.5]


def test_a_snapshot_with_a_changed_schema_is_refused_the_same_by_api_and_cli(tmp_path, monkeypatch):
    from dprelease import admin, series
    from dprelease.cli.app import app
    from dprelease.settings import Settings

    monkeypatch.setenv("DPRELEASE_HOME", str(tmp_path / "home"))
    settings = Settings.from_env()
    admin.init(settings)
    (jan, jan_path), (feb, feb_path) = write_snapshots(tmp_path / "data", months=2, rows=200)
    code = CliRunner().invoke(app, ["dataset", "register", "visits", str(jan_path), "--snapshot", jan, "--unit",
                                    "person_id", "--epsilon-cap", "1", "--series-budget", "per_snapshot"])
    assert code.exit_code == 0, code.output
    changed = pd.read_csv(feb_path).drop(columns=["age"]).assign(visits=lambda d: d.visits * 0.5, extra="x")
    changed.to_csv(tmp_path / "feb.csv", index=False)

    def state():
        store = Store(settings.store_url)
        return (sorted(p.name for p in settings.escrow_dir.iterdir()), [d.name for d in store.list_datasets()],
                [s.snapshot for s in store_series.snapshots(store, "visits")])

    before = state()
    with pytest.raises(store_series.SnapshotRefused) as api:
        series.register_snapshot(settings, "visits", tmp_path / "feb.csv", feb)
    result = CliRunner().invoke(app, ["dataset", "register", "visits", str(tmp_path / "feb.csv"), "--snapshot", feb])
    assert result.exit_code == 2 and "Traceback" not in result.output
    line = " ".join(result.output.split())
    for words in ("changes the schema", "'age' (int64) is missing", "'extra' (object) is new",
                  "'visits' is float64, the series has int64"):
        assert words in str(api.value) and words in line, (words, line)
    assert state() == before  # nothing sealed, nothing recorded
    # the same snapshot label twice, and options that contradict the series: refused the same way
    again = CliRunner().invoke(app, ["dataset", "register", "visits", str(feb_path), "--snapshot", jan])
    assert again.exit_code == 2 and "already registered" in again.output
    other = CliRunner().invoke(app, ["dataset", "register", "visits", str(feb_path), "--snapshot", feb,
                                     "--series-budget", "series_cap"])
    assert other.exit_code == 2 and "keeps its unit and budget" in " ".join(other.output.split())
    ok = CliRunner().invoke(app, ["dataset", "register", "visits", str(feb_path), "--snapshot", feb])
    assert ok.exit_code == 0 and "visits@2026-02" in ok.output
    budget = CliRunner().invoke(app, ["budget"])
    assert budget.exit_code == 0 and "(parallel)" in budget.output and "1 each" in budget.output


def test_a_store_made_before_series_gains_the_series_tables_on_open(tmp_path):
    """Existing stores migrate by addition: the series tables are new tables, created on open
    (Store.create_all, which Platform.open calls); the datasets and ledger already there are kept."""
    from sqlalchemy import inspect
    from sqlmodel import SQLModel

    from dprelease.store import Controller, Dataset, Lease, LedgerEntry, Policy, Release

    old = Store(f"sqlite:///{tmp_path / 'old.db'}")
    SQLModel.metadata.create_all(old.engine, tables=[m.__table__ for m in (Dataset, LedgerEntry, Release, Policy,
                                                                           Lease, Controller)])
    old.add_dataset("visits@2026-01", privacy_unit="person_id", blob_path="-", fingerprint="-", file_format="parquet",
                    schema={"person_id": "int64"}, epsilon_cap=1.0, delta_cap=1e-5)
    from sqlmodel import Session

    with Session(old.engine) as session:  # an entry the old code reserved
        session.add(LedgerEntry(dataset="visits@2026-01", release_id="r0", epsilon=0.25, delta=0.0))
        session.commit()
    assert "series_claims" not in inspect(old.engine).get_table_names()
    old.create_all()
    assert {"series", "series_snapshots", "series_claims"} <= set(inspect(old.engine).get_table_names())
    assert old.budget("visits@2026-01")["epsilon_reserved"] == 0.25
    store_series.add_series(old, "visits", privacy_unit="person_id", schema={"person_id": "int64"},
                            budget_mode="series_cap", epsilon_cap=1.0, delta_cap=1e-5)
    store_series.add_snapshot(old, "visits", "2026-01", "visits@2026-01")
    assert store_series.series_budget(old, "visits")["epsilon_reserved"] == 0.25
    old.close()


def test_a_series_orders_its_snapshots_by_code_point_whatever_the_databases_collation(any_store):  # noqa: F811
    """The periods of a series are its labels in code-point order (Python's, which the running
    total's label check uses) on every database. On PostgreSQL the label column is first given a
    linguistic collation (ICU en-US, what a database initialised under en_US.UTF-8 has), where
    '2026-a' sorts before '2026-B' and '2026_1' next to '2026-1': the store sorted by it."""
    from sqlalchemy import text

    if any_store.engine.dialect.name == "postgresql":
        with any_store.engine.begin() as conn:
            if conn.execute(text("SELECT 1 FROM pg_collation WHERE collname = 'en-US-x-icu'")).first() is None:
                pytest.skip("this PostgreSQL has no ICU en-US collation")
            conn.execute(text('ALTER TABLE series_snapshots ALTER COLUMN snapshot TYPE VARCHAR COLLATE "en-US-x-icu"'))
    schema = {"person_id": "int64", "visits": "int64"}
    labels = ("2026-a", "2026-B", "2026_1", "2026-2", "2026.1")
    store_series.add_series(any_store, "visits", privacy_unit="person_id", schema=schema, budget_mode="per_snapshot",
                            epsilon_cap=1.0, delta_cap=1e-5)
    for i, label in enumerate(labels):
        any_store.add_dataset(f"visits@{label}", privacy_unit="person_id", blob_path="-", fingerprint="-",
                              file_format="parquet", schema=schema, epsilon_cap=1.0, delta_cap=1e-5)
        any_store.add_policy(f"p{i}@{label}", dataset=f"visits@{label}", analyst="ana", max_epsilon_per_release=0.5)
        store_series.add_snapshot(any_store, "visits", label, f"visits@{label}")
    assert [s.snapshot for s in store_series.snapshots(any_store, "visits")] == sorted(labels)
    # a new snapshot takes the standing policies of the newest label in the same order ('2026_1')
    any_store.add_dataset("visits@2027", privacy_unit="person_id", blob_path="-", fingerprint="-",
                          file_format="parquet", schema=schema, epsilon_cap=1.0, delta_cap=1e-5)
    store_series.add_snapshot(any_store, "visits", "2027", "visits@2027")

    def standing(label: str) -> set[str]:
        return {p.name.split("@")[0] for p in any_store.policies_for(f"visits@{label}", "ana")}

    assert standing("2027") == standing("2026_1") != standing("2026.1")


@pytest.mark.parametrize(("first", "then", "listed"), [
    ("2026-9", "2026-10", None),  # unpadded: as text, 2026-10 sorts before 2026-9
    ("2026-01", "2026-2", None),  # sorts after 2026-01, but every later month (2026-03 ...) before it
    ("2026-12", "2027-1", None),
    ("v9", "v10", None),
    ("2026-05", "2026-03", ["2026-03", "2026-05"]),  # a back-fill written as the series writes: in its place
    ("2026-09", "2026-10", ["2026-09", "2026-10"]),
])
def test_a_plain_series_refuses_a_label_whose_numbers_are_not_as_wide_as_its_newest(tmp_path, monkeypatch, first,
                                                                                      then, listed):
    """A series without a running total lists its periods in label order, as text (the series page, the
    index, `latest`): a label written with other widths than the newest's (2026-10 after 2026-9) was
    registered and its period published before the earlier one. It is refused the same by the Python
    API and the CLI in one line saying how to write it, nothing sealed or recorded; a label written as
    the series writes its labels is taken, a back-fill included, and listed in its place."""
    from dprelease import admin, series
    from dprelease.cli.app import app
    from dprelease.settings import Settings

    monkeypatch.setenv("DPRELEASE_HOME", str(tmp_path / "home"))
    settings = Settings.from_env()
    admin.init(settings)
    path = tmp_path / "period.csv"
    pd.DataFrame({"person_id": range(20), "visits": [1, 2] * 10}).to_csv(path, index=False)
    series.register_snapshot(settings, "visits", path, first, privacy_unit="person_id", budget_mode="per_snapshot",
                             epsilon_cap=1.0)
    store = Store(settings.store_url)

    def state():
        return (sorted(p.name for p in settings.escrow_dir.iterdir()), [d.name for d in store.list_datasets()],
                [s.snapshot for s in store_series.snapshots(store, "visits")])

    if listed is not None:
        result = CliRunner().invoke(app, ["dataset", "register", "visits", str(path), "--snapshot", then])
        assert result.exit_code == 0, result.output
        assert state()[2] == listed
        return
    before = state()
    with pytest.raises(store_series.SnapshotRefused) as api:
        series.register_snapshot(settings, "visits", path, then)
    with pytest.raises(store_series.SnapshotRefused) as recorded:  # where it is recorded, under the series' lock
        store_series.add_snapshot(store, "visits", then, f"visits@{first}")
    result = CliRunner().invoke(app, ["dataset", "register", "visits", str(path), "--snapshot", then])
    assert result.exit_code == 2 and "Traceback" not in result.output, result.output
    line = " ".join(result.output.split())
    assert line == f"error: {api.value}" == f"error: {recorded.value}", (line, str(api.value))
    assert f"snapshot {then} of series 'visits' writes its numbers with other widths than {first}" in line, line
    padded = store_series.same_widths(then, first)
    assert (f"write it {padded}" if padded else "a new series whose labels are zero-padded from the first") in line
    assert state() == before  # nothing sealed, nothing recorded
