"""The store: ledger lifecycle and its rules, budget numbers, named errors, and invariant 3 (committed
plus reserved never exceed the cap) under 20 concurrent reservations, on SQLite and PostgreSQL."""

from __future__ import annotations

import json
import math
import threading
import time
from datetime import UTC

import pytest
from patience import PATIENCE_S
from pg_schema import drop_schema, fresh_schema
from sqlalchemy import text

from dprelease.store import BudgetExceeded, Store, StoreError
from dprelease.store import ledger as store_module
from dprelease.store import series as store_series


def _register(store: Store, name: str = "adult", epsilon_cap: float = 10.0, delta_cap: float = 1e-5) -> None:
    """Register a dataset with the given caps (blob and fingerprint are placeholders)."""
    store.add_dataset(
        name,
        privacy_unit="person_id",
        blob_path=f"/escrow/{name}.fernet",
        fingerprint="0" * 64,
        file_format="csv",
        schema={"person_id": "int", "age": "int"},
        epsilon_cap=epsilon_cap,
        delta_cap=delta_cap,
    )


@pytest.fixture
def sqlite_store(tmp_path):
    store = Store(f"sqlite:///{tmp_path / 'store.db'}")
    store.create_all()
    yield store
    store.close()


@pytest.fixture
def pg_store():
    """A store in a fresh PostgreSQL schema (dropped afterwards); skipped without DPRELEASE_TEST_PG_URL."""
    schema, url = fresh_schema("dprelease_test_")
    store = Store(url)
    store.create_all()
    try:
        yield store
    finally:
        store.close()
        drop_schema(schema)


@pytest.fixture(params=["sqlite", "postgresql"])
def any_store(request):
    return request.getfixturevalue(f"{'sqlite' if request.param == 'sqlite' else 'pg'}_store")


def test_a_process_opens_one_postgresql_store_per_url_and_a_sqlite_one_afresh(pg_store, tmp_path):
    """Platform.open runs in every release step, hook and command: on PostgreSQL the process's store
    of the URL is reused (one pool, its tables checked once: a new engine's first connection and
    create_all cost 150-200 ms each there under load); a SQLite home removed and made again under
    its path is seen as new."""
    from dprelease.store.opened import opened_store

    kept = opened_store(pg_store.url)
    assert opened_store(pg_store.url) is kept
    sqlite_url = f"sqlite:///{tmp_path / 'store.db'}"
    first = opened_store(sqlite_url)
    first.close()
    (tmp_path / "store.db").unlink()
    again = opened_store(sqlite_url)
    assert again is not first and again.list_releases() == []  # its tables made again


# --- datasets -------------------------------------------------------------------------------------


def test_dataset_roundtrip_and_unknown_named(sqlite_store):
    _register(sqlite_store)
    ds = sqlite_store.get_dataset("adult")
    assert ds.privacy_unit == "person_id" and ds.epsilon_cap == 10.0
    assert ds.expectations_json == "[]"
    assert ds.created_at.tzinfo is UTC
    assert [d.name for d in sqlite_store.list_datasets()] == ["adult"]
    with pytest.raises(StoreError, match="'census'"):
        sqlite_store.get_dataset("census")
    with pytest.raises(StoreError, match="already registered"):
        _register(sqlite_store)


def test_a_dataset_keeps_its_risk_profile(sqlite_store):
    """The risk profile given at registration (what the epsilon choice reads) is what the store gives
    back; none given is an empty profile, not a missing one."""
    profile = {"sensitivity": "high", "trust": "public", "n": 32561}
    sqlite_store.add_dataset("adult", privacy_unit="person_id", blob_path="b", fingerprint="f", file_format="csv",
                             schema={"person_id": "int"}, epsilon_cap=1.0, delta_cap=0.0, risk_profile=profile)
    assert json.loads(sqlite_store.get_dataset("adult").risk_json) == profile
    _register(sqlite_store, "census")
    assert json.loads(sqlite_store.get_dataset("census").risk_json) == {}


@pytest.mark.parametrize(
    "field, value, message",
    [("epsilon_cap", 0.0, "epsilon_cap must be a finite number > 0, got 0.0"),
     ("delta_cap", 1.0, "delta_cap = 1 is above the maximum 0.001: delta is the chance that the guarantee fails"),
     ("file_format", "xlsx", "file_format must be one of "),
     ])
def test_dataset_validation_names_the_field(sqlite_store, field, value, message):
    """A refused dataset field is named by its own name first, as the controller wrote it."""
    kwargs = {
        "privacy_unit": "pid", "blob_path": "b", "fingerprint": "f", "file_format": "csv", "schema": {},
        "epsilon_cap": 1.0, "delta_cap": 0.0,
    }
    kwargs[field] = value
    with pytest.raises(ValueError) as caught:
        sqlite_store.add_dataset("x", **kwargs)
    assert str(caught.value).startswith(message), str(caught.value)


def test_unsupported_url_and_missing_directory_are_named(tmp_path):
    with pytest.raises(StoreError, match="unsupported store URL"):
        Store("mysql://u@h/db")
    with pytest.raises(StoreError, match="dprelease init"):
        Store(f"sqlite:///{tmp_path / 'nowhere' / 'store.db'}")


# --- the ledger -----------------------------------------------------------------------------------


def test_a_reservation_of_no_finite_positive_epsilon_is_refused_by_name_and_reserves_nothing(sqlite_store):
    """reserve(epsilon=0, -1, inf or nan) names the epsilon it refuses, and the budget is left untouched."""
    _register(sqlite_store)
    for value in (0.0, -1.0, math.inf, math.nan):
        with pytest.raises(ValueError) as caught:
            sqlite_store.reserve("adult", "r", value, 0.0)
        assert str(caught.value) == f"epsilon must be a finite number > 0, got {value!r}"
    assert sqlite_store.budget("adult")["epsilon_reserved"] == 0


def test_ledger_lifecycle_and_budget_numbers(any_store):
    _register(any_store, epsilon_cap=10.0, delta_cap=1e-5)
    any_store.reserve("adult", "r1", 2.0, 1e-6)
    any_store.reserve("adult", "r2", 3.0, 2e-6)
    any_store.reserve("adult", "r3", 1.0, 0.0)
    b = any_store.budget("adult")
    assert (b["epsilon_cap"], b["epsilon_committed"], b["epsilon_reserved"], b["epsilon_remaining"]) == (10, 0, 6, 4)
    assert b["delta_reserved"] == pytest.approx(3e-6)

    assert any_store.commit("r1").status == "committed"
    assert any_store.refund("r2").status == "refunded"
    b = any_store.budget("adult")
    assert (b["epsilon_committed"], b["epsilon_reserved"], b["epsilon_remaining"]) == (2, 1, 7)
    assert b["delta_committed"] == pytest.approx(1e-6)
    assert b["delta_remaining"] == pytest.approx(9e-6)
    assert any_store.ledger_entry("r3").status == "reserved"


def test_commit_and_refund_rules(any_store):
    _register(any_store)
    any_store.reserve("adult", "c", 1.0, 0.0)
    any_store.reserve("adult", "r", 1.0, 0.0)
    any_store.commit("c")
    assert any_store.commit("c").status == "committed"  # idempotent
    with pytest.raises(StoreError, match="never returned"):
        any_store.refund("c")
    any_store.refund("r")
    assert any_store.refund("r").status == "refunded"  # idempotent
    with pytest.raises(StoreError, match="already refunded"):
        any_store.commit("r")
    with pytest.raises(StoreError, match="'ghost'"):
        any_store.commit("ghost")
    assert any_store.budget("adult")["epsilon_committed"] == 1.0


def test_settling_a_reservation_already_settled_the_other_way_is_refused_saying_what_to_do(sqlite_store):
    """Committing a refunded reservation is refused telling the controller to reserve again under a new
    release id; refunding a committed one says committed budget is never returned (word for word)."""
    _register(sqlite_store)
    sqlite_store.reserve("adult", "back", 1.0, 0.0)
    sqlite_store.reserve("adult", "spent", 1.0, 0.0)
    sqlite_store.refund("back")
    sqlite_store.commit("spent")
    with pytest.raises(StoreError) as caught:
        sqlite_store.commit("back")
    assert str(caught.value) == ("cannot mark the reservation of release 'back' committed: it is already refunded; "
                                 "reserve again under a new release id")
    with pytest.raises(StoreError) as caught:
        sqlite_store.refund("spent")
    assert str(caught.value) == ("cannot mark the reservation of release 'spent' refunded: it is already committed "
                                 "(committed budget is never returned)")


def test_a_refunded_reservation_gives_its_snapshot_back(sqlite_store):
    """A release of a series' snapshot whose reservation is refunded (its run still open, not yet
    marked final) no longer holds the snapshot: the next run may claim and publish it."""
    schema = {"person_id": "int64"}
    sqlite_store.add_dataset("visits@2026-01", privacy_unit="person_id", blob_path="-", fingerprint="-",
                             file_format="parquet", schema=schema, epsilon_cap=1.0, delta_cap=1e-5)
    store_series.add_series(sqlite_store, "visits", privacy_unit="person_id", schema=schema,
                            budget_mode="per_snapshot", epsilon_cap=1.0, delta_cap=1e-5)
    store_series.add_snapshot(sqlite_store, "visits", "2026-01", "visits@2026-01")
    for rid in ("first", "second"):
        sqlite_store.add_release("visits@2026-01", {}, release_id=rid)
    store_series.claim(sqlite_store, "visits", "2026-01", "first")
    sqlite_store.reserve("visits@2026-01", "first", 0.5, 0.0)
    with pytest.raises(store_series.SnapshotRefused, match="already published or being published"):
        store_series.claim(sqlite_store, "visits", "2026-01", "second")
    sqlite_store.refund("first")
    assert store_series.claims(sqlite_store, "visits") == {}
    store_series.claim(sqlite_store, "visits", "2026-01", "second")
    sqlite_store.reserve("visits@2026-01", "second", 0.5, 0.0)


def test_budget_exceeded_message_gives_the_numbers(any_store):
    _register(any_store, epsilon_cap=5.0)
    any_store.reserve("adult", "a", 2.0, 0.0)
    any_store.commit("a")
    any_store.reserve("adult", "b", 2.5, 0.0)
    with pytest.raises(BudgetExceeded) as err:
        any_store.reserve("adult", "c", 1.0, 0.0)
    message = str(err.value)
    for part in ("'adult'", "epsilon cap 5", "committed 2", "reserved 2.5", "requested 1"):
        assert part in message
    # nothing was recorded for the refused request, and an exact fit is still allowed
    with pytest.raises(StoreError, match="no budget reservation"):
        any_store.ledger_entry("c")
    any_store.reserve("adult", "d", 0.5, 0.0)
    assert any_store.budget("adult")["epsilon_remaining"] == 0.0


def test_a_datasets_budget_counts_only_its_own_reservations_and_spending(any_store):
    """Each dataset's cap is its own: what another dataset committed or reserved neither shows in this
    one's budget nor refuses a reservation that fits this one's cap (the amounts are exact binary
    fractions, the deltas under the engine's ceiling 1e-3, so the budget numbers compare exactly)."""
    _register(any_store, "adult", epsilon_cap=10.0, delta_cap=2**-10)
    _register(any_store, "census", epsilon_cap=4.0, delta_cap=2**-10)
    any_store.reserve("census", "c1", 3.0, 2**-11)
    any_store.commit("c1")
    any_store.reserve("census", "c2", 0.5, 2**-12)
    any_store.reserve("adult", "a1", 10.0, 2**-10)  # adult's whole cap, while census holds 3.5 of its own
    assert any_store.budget("adult") == {
        "dataset": "adult", "epsilon_cap": 10.0, "epsilon_committed": 0.0, "epsilon_reserved": 10.0,
        "epsilon_remaining": 0.0, "delta_cap": 2**-10, "delta_committed": 0.0, "delta_reserved": 2**-10,
        "delta_remaining": 0.0}
    assert any_store.budget("census") == {
        "dataset": "census", "epsilon_cap": 4.0, "epsilon_committed": 3.0, "epsilon_reserved": 0.5,
        "epsilon_remaining": 0.5, "delta_cap": 2**-10, "delta_committed": 2**-11, "delta_reserved": 2**-12,
        "delta_remaining": 2**-12}
    any_store.reserve("census", "c3", 0.5, 2**-12)  # census's exact remainder, adult being full
    with pytest.raises(BudgetExceeded) as caught:
        any_store.reserve("adult", "a2", 0.5, 0.0)
    assert str(caught.value) == (
        "budget exceeded for dataset 'adult': epsilon cap 10, committed 0, reserved 10, requested 0.5 "
        "(remaining 0); ask for at most 0, or wait for the pending releases holding 10 to end (a cap is all the data "
        "may ever spend: it cannot be raised)")


def test_a_snapshot_of_a_series_with_one_cap_is_refused_over_the_series_delta_cap(any_store):
    """A series_cap series composes its snapshots sequentially: a reservation that fits its own snapshot's
    delta cap is refused when the series' delta, summed over every snapshot, would pass the series cap;
    the refusal gives the series' numbers and reserves nothing."""
    schema = {"person_id": "int64"}
    for label in ("2026-01", "2026-02"):
        any_store.add_dataset(f"visits@{label}", privacy_unit="person_id", blob_path="-", fingerprint="-",
                              file_format="parquet", schema=schema, epsilon_cap=1.0, delta_cap=1e-5)
    store_series.add_series(any_store, "visits", privacy_unit="person_id", schema=schema,
                            budget_mode="series_cap", epsilon_cap=1.0, delta_cap=1e-5)
    for label in ("2026-01", "2026-02"):
        store_series.add_snapshot(any_store, "visits", label, f"visits@{label}")
    assert any_store.reserve("visits@2026-01", "january", 0.2, 6e-6).status == "reserved"
    with pytest.raises(BudgetExceeded) as caught:
        any_store.reserve("visits@2026-02", "february", 0.2, 6e-6)  # 0.4 of epsilon fits; 1.2e-5 of delta does not
    assert str(caught.value) == (
        "budget exceeded for series 'visits' (one cap for all snapshots: the same people in each): delta cap 1e-05, "
        "committed 0, reserved 6e-06, requested 6e-06 (remaining 4e-06); ask for at most 4e-06, or wait for the pending "
        "releases holding 6e-06 to end (a cap is all the data may ever spend: it cannot be raised)")
    with pytest.raises(StoreError, match="no budget reservation for release 'february'"):
        any_store.ledger_entry("february")
    assert any_store.reserve("visits@2026-02", "february", 0.2, 4e-6).status == "reserved"  # the series' remainder


@pytest.mark.parametrize("param", ["epsilon", "delta"])
@pytest.mark.parametrize("whose", ["dataset", "series"])
def test_a_budget_refusal_advises_only_what_can_be_done_and_its_advice_fits(any_store, whose, param):
    """A refusal over a cap said "or raise the cap", which no command or API does: it now names the
    largest request that fits (and the reservations to wait for), and that request is accepted."""
    import re

    schema = {"person_id": "int64"}
    name = "visits@2026-01" if whose == "series" else "adult"
    any_store.add_dataset(name, privacy_unit="person_id", blob_path="-", fingerprint="-", file_format="parquet",
                          schema=schema, epsilon_cap=3.0 if whose == "series" else 1.0, delta_cap=1e-4)
    if whose == "series":  # the series' cap (1, 1e-5) is the tighter one
        store_series.add_series(any_store, "visits", privacy_unit="person_id", schema=schema,
                                budget_mode="series_cap", epsilon_cap=1.0, delta_cap=1e-5)
        store_series.add_snapshot(any_store, "visits", "2026-01", name)
    cap = {"epsilon": 1.0, "delta": 1e-5 if whose == "series" else 1e-4}[param]
    held = any_store.reserve(name, "first", *((0.25, 0.0) if param == "epsilon" else (0.1, cap / 4)))
    assert held.status == "reserved"
    with pytest.raises(BudgetExceeded) as caught:
        any_store.reserve(name, "second", *((0.9, 0.0) if param == "epsilon" else (0.1, cap)))
    message = str(caught.value)
    assert "raise" not in message.replace("cannot be raised", ""), message
    advised = float(re.search(r"ask for at most (\S+), or wait for the pending releases holding", message)[1])
    assert advised == pytest.approx(cap * 0.75, rel=1e-3)
    asked = (advised, 0.0) if param == "epsilon" else (0.1, advised)
    assert any_store.reserve(name, "second", *asked).status == "reserved"


def test_delta_cap_is_enforced(sqlite_store):
    _register(sqlite_store, delta_cap=1e-6)
    sqlite_store.reserve("adult", "a", 0.1, 6e-7)
    with pytest.raises(BudgetExceeded, match="delta cap"):
        sqlite_store.reserve("adult", "b", 0.1, 6e-7)


def test_float_rounding_does_not_refuse_an_exact_fit(sqlite_store):
    _register(sqlite_store, epsilon_cap=0.3)
    for i in range(3):
        sqlite_store.reserve("adult", f"r{i}", 0.1, 0.0)  # 0.1 + 0.1 + 0.1 > 0.3 in floats
    with pytest.raises(BudgetExceeded):
        sqlite_store.reserve("adult", "r3", 1e-6, 0.0)


def test_a_request_over_a_small_cap_by_more_than_rounding_error_is_refused(sqlite_store):
    """The rounding allowance is relative to the cap: over a delta cap of 1e-6 (and an epsilon cap of 0.1),
    a request 0.01% (0.0000005%) over it is refused, though by less than 1e-9 in absolute terms; the
    exact cap still fits."""
    _register(sqlite_store, epsilon_cap=0.1, delta_cap=1e-6)
    with pytest.raises(BudgetExceeded, match="delta cap"):
        sqlite_store.reserve("adult", "over delta", 0.05, 1.0001e-6)
    with pytest.raises(BudgetExceeded, match="epsilon cap"):
        sqlite_store.reserve("adult", "over epsilon", 0.1000000005, 0.0)
    sqlite_store.reserve("adult", "exact", 0.1, 1e-6)


def test_refund_frees_budget_for_new_releases(sqlite_store):
    _register(sqlite_store, epsilon_cap=1.0)
    sqlite_store.reserve("adult", "a", 1.0, 0.0)
    with pytest.raises(BudgetExceeded):
        sqlite_store.reserve("adult", "b", 1.0, 0.0)
    sqlite_store.refund("a")
    sqlite_store.reserve("adult", "b", 1.0, 0.0)


@pytest.mark.parametrize(
    "epsilon, delta, match",
    [(0.0, 0.0, "epsilon"), (-1.0, 0.0, "epsilon"), (float("inf"), 0.0, "epsilon"), (float("nan"), 0.0, "epsilon"),
     (1.0, 1.0, "delta"), (1.0, -1e-9, "delta"), (1.0, float("nan"), "delta")],
)
def test_reserve_validates_epsilon_and_delta(sqlite_store, epsilon, delta, match):
    _register(sqlite_store)
    with pytest.raises(ValueError, match=match):
        sqlite_store.reserve("adult", "r", epsilon, delta)


def test_second_reservation_for_a_release_is_refused(any_store):
    _register(any_store)
    any_store.reserve("adult", "same", 1.0, 0.0)
    with pytest.raises(StoreError, match="already has a budget reservation") as err:
        any_store.reserve("adult", "same", 1.0, 0.0)
    assert not isinstance(err.value, BudgetExceeded)
    with pytest.raises(StoreError, match="unknown dataset 'nope'"):
        any_store.reserve("nope", "other", 1.0, 0.0)
    assert any_store.budget("adult")["epsilon_reserved"] == 1.0


# --- invariant 3 under concurrency -----------------------------------------------------------------


def _slow_totals(monkeypatch) -> None:
    """Sleep between reading the ledger and inserting, so unlocked reservations would overlap."""
    original = store_module._totals

    def slow(session, dataset):
        totals = original(session, dataset)
        time.sleep(0.02)
        return totals

    monkeypatch.setattr(store_module, "_totals", slow)


def _race(store: Store, threads: int = 20) -> tuple[list[str], list[str], list[BaseException], list[float]]:
    """Start `threads` reservations of epsilon 1 together; winners commit or stay reserved alternately.
    A watcher samples committed + reserved all along."""
    barrier = threading.Barrier(threads)
    ok: list[str] = []
    refused: list[str] = []
    other: list[BaseException] = []
    samples: list[float] = []
    done = threading.Event()

    def reserve(i: int) -> None:
        release_id = f"release-{i}"
        barrier.wait()
        try:
            store.reserve("adult", release_id, 1.0, 0.0)
        except BudgetExceeded:
            refused.append(release_id)
            return
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            other.append(exc)
            return
        ok.append(release_id)
        if i % 2 == 0:
            store.commit(release_id)

    def watch() -> None:
        while not done.is_set():
            b = store.budget("adult")
            samples.append(b["epsilon_committed"] + b["epsilon_reserved"])
            time.sleep(0.005)

    watcher = threading.Thread(target=watch)
    workers = [threading.Thread(target=reserve, args=(i,)) for i in range(threads)]
    watcher.start()
    for t in workers:
        t.start()
    for t in workers:
        t.join(timeout=PATIENCE_S)
    done.set()
    watcher.join(timeout=PATIENCE_S)
    return ok, refused, other, samples


def test_concurrent_reservations_never_exceed_the_cap(any_store, monkeypatch):
    _register(any_store, epsilon_cap=10.0)
    _slow_totals(monkeypatch)
    ok, refused, other, samples = _race(any_store)
    assert other == []
    assert len(ok) == 10 and len(refused) == 10
    assert samples and max(samples) <= 10.0
    b = any_store.budget("adult")
    assert b["epsilon_committed"] + b["epsilon_reserved"] == 10.0
    assert b["epsilon_remaining"] == 0.0


# --- releases and policies ------------------------------------------------------------------------


def test_release_crud(any_store):
    _register(any_store)
    r = any_store.add_release("adult", {"sql": "SELECT COUNT(*) FROM adult"})
    assert len(r.id) == 32 and r.status == "pending" and r.artifacts_json == "{}"
    fixed = any_store.add_release("adult", "{}", release_id="fixed-id", status="awaiting_approval")
    with pytest.raises(StoreError, match="'fixed-id' already exists"):
        any_store.add_release("adult", "{}", release_id="fixed-id")
    with pytest.raises(StoreError, match="unknown dataset"):
        any_store.add_release("census", "{}")

    updated = any_store.update_release(
        fixed.id, status="approved", decision_by="alice", decision_comment="ok", artifacts_json={"a.html": "ab" * 32}
    )
    assert updated.decided_at is not None and updated.decided_at.tzinfo is UTC
    again = any_store.get_release(fixed.id)
    assert again.decision_by == "alice" and '"a.html"' in again.artifacts_json
    assert [x.id for x in any_store.list_releases(status="approved")] == [fixed.id]
    assert {x.id for x in any_store.list_releases()} == {r.id, fixed.id}


    with pytest.raises(StoreError, match="nonsense"):
        any_store.update_release(fixed.id, nonsense=1)
    with pytest.raises(ValueError, match="status"):
        any_store.update_release(fixed.id, status="done")
    with pytest.raises(StoreError, match="'missing'"):
        any_store.get_release("missing")


def test_releases_of_a_run_are_its_own_its_snapshots_and_its_retries_only(any_store):
    _register(any_store)
    for release_id in ("run-a", "run-a-retry1", "run-a-retry2", "run-ab", "run-a-retried", "run-b-retry1", "run",
                       "run-a@2026-02", "run-ab@2026-02", "run@2026-02"):
        any_store.add_release("adult", "{}", release_id=release_id)
    assert [x.id for x in any_store.releases_of_run("run-a")] == ["run-a", "run-a-retry1", "run-a-retry2",
                                                                   "run-a@2026-02"]
    assert [x.id for x in any_store.releases_of_run("run-b")] == ["run-b-retry1"]
    assert any_store.releases_of_run("missing") == []


def test_policies(any_store):
    _register(any_store)
    any_store.add_policy("anyone", "adult", max_epsilon_per_release=1.0)
    any_store.add_policy("bob-only", "adult", analyst="bob", max_epsilon_per_release=0.5, approval="auto",
                         evaluators=["mean_age"])
    assert [p.name for p in any_store.policies_for("adult", "bob")] == ["anyone", "bob-only"]
    assert [p.name for p in any_store.policies_for("adult", "carol")] == ["anyone"]
    assert [p.name for p in any_store.policies_for("adult")] == ["anyone"]
    assert any_store.policies_for("adult", "bob")[1].evaluators_json == '["mean_age"]'
    with pytest.raises(StoreError, match="'anyone' already exists"):
        any_store.add_policy("anyone", "adult", max_epsilon_per_release=1.0)
    with pytest.raises(ValueError, match="approval"):
        any_store.add_policy("p", "adult", max_epsilon_per_release=1.0, approval="sometimes")
    with pytest.raises(ValueError, match="max_epsilon_per_release"):
        any_store.add_policy("p", "adult", max_epsilon_per_release=0.0)


def test_fifty_concurrent_reservations_against_a_cap_for_ten(any_store, monkeypatch):
    """Issue 12: 50 releases at once, the cap allows 10: never over the cap, exactly 10 pass."""
    _register(any_store, epsilon_cap=10.0)
    _slow_totals(monkeypatch)
    ok, refused, other, samples = _race(any_store, threads=50)
    assert other == []
    assert len(ok) == 10 and len(refused) == 40
    assert samples and max(samples) <= 10.0
    assert any_store.budget("adult")["epsilon_remaining"] == 0.0


def test_abandon_refunds_and_marks_once_and_a_finished_release_reserves_nothing(any_store):
    _register(any_store, epsilon_cap=10.0)
    any_store.add_release("adult", "{}", release_id="r1")
    any_store.reserve("adult", "r1", 2.0, 0.0)
    assert any_store.abandon("r1", "failed", "interrupted") == "refunded"
    assert any_store.abandon("r1", "failed", "again") == "refunded"  # idempotent
    rel = any_store.get_release("r1")
    assert rel.status == "failed" and rel.decision_comment == "interrupted"
    assert any_store.budget("adult")["epsilon_reserved"] == 0.0
    any_store.add_release("adult", "{}", release_id="r2", status="failed")
    with pytest.raises(StoreError, match="is failed: a finished release reserves nothing"):
        any_store.reserve("adult", "r2", 1.0, 0.0)
    any_store.add_release("adult", "{}", release_id="r3")
    any_store.reserve("adult", "r3", 1.0, 0.0)
    any_store.commit("r3")
    assert any_store.abandon("r3", "failed", "too late") == "committed"  # approved: left to publish
    assert any_store.get_release("r3").status == "pending"
    any_store.add_release("adult", "{}", release_id="r4")
    assert any_store.abandon("r4", "failed", "before reserving") == "none"
    with pytest.raises(StoreError, match="unknown release"):
        any_store.abandon("nope")
    any_store.take_lease("r3", "host", 123, 4.0, "flow")
    any_store.renew_lease("r3")
    assert any_store.get_lease("r3").pid == 123
    any_store.end_lease("r3")
    assert any_store.get_lease("r3") is None


def test_an_abandon_racing_an_approval_leaves_the_committed_budget_spent(any_store):
    """A run abandoned while an approval is committing its reservation: the abandon waits for the
    approval and then finds the budget committed (it refunds nothing and leaves the release to
    publish). Without waiting, it would read "reserved" and overwrite the commit with a refund: the
    released statistics' budget given back. The approval is held open in this thread while the
    abandon runs in another, and committed a moment later; on PostgreSQL the wait is the entry's row
    lock, on SQLite the store's write lock."""
    _register(any_store, epsilon_cap=10.0)
    any_store.add_release("adult", "{}", release_id="racing")
    any_store.reserve("adult", "racing", 2.0, 0.0)
    outcome = {}

    def abandon():
        try:
            outcome["abandon"] = any_store.abandon("racing", "failed", "worker lost")
        except Exception as err:  # reported below, not lost in the thread
            outcome["error"] = err

    with any_store._transaction() as session:  # the approval's commit, held open
        entry = any_store._entry(session, "racing", lock=True)
        entry.status = "committed"
        session.add(entry)
        session.flush()
        worker = threading.Thread(target=abandon)
        worker.start()
        time.sleep(1.0)  # the abandon reads the entry now (or waits for it)
    worker.join(timeout=PATIENCE_S)
    assert "error" not in outcome, outcome.get("error")
    assert outcome["abandon"] == "committed"
    assert any_store.ledger_entry("racing").status == "committed"
    assert any_store.budget("adult")["epsilon_committed"] == 2.0
    assert any_store.get_release("racing").status == "pending"


@pytest.mark.parametrize("other", ["abandon", "refund"])
def test_a_commit_racing_an_abandon_or_a_refund_of_one_reservation_lets_exactly_one_take_effect(
        any_store, monkeypatch, other):
    """An approval commits a reservation while the run is abandoned (or the reservation refunded) at
    the same moment: one of the two settles it and the other sees that outcome: abandon reports
    "committed" and changes nothing, or the commit (refund) is refused, and the ledger says what the
    winner did. Each settle reads the entry under its row lock (PostgreSQL; SQLite's write lock
    serialises them anyway); unlocked, both read "reserved" and both succeed, the later write
    overwriting the other: a refund given back for statistics being published. The clock each
    settle reads between its read and its write is slowed so that the two overlap."""
    _register(any_store, epsilon_cap=10.0)
    any_store.add_release("adult", "{}", release_id="racing")
    any_store.reserve("adult", "racing", 2.0, 0.0)
    original = store_module.utcnow

    def slow_clock():
        time.sleep(0.3)
        return original()

    monkeypatch.setattr(store_module, "utcnow", slow_clock)
    barrier, outcome = threading.Barrier(2), {}

    def run(name, settle):
        barrier.wait()
        try:
            outcome[name] = settle()
        except StoreError as err:
            outcome[name] = str(err)

    settles = {"commit": lambda: any_store.commit("racing").status,
               "abandon": lambda: any_store.abandon("racing", "failed", "worker lost"),
               "refund": lambda: any_store.refund("racing").status}
    threads = [threading.Thread(target=run, args=(name, settles[name])) for name in ("commit", other)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=PATIENCE_S)
    status = any_store.ledger_entry("racing").status
    committed_refused = ("cannot mark the reservation of release 'racing' committed: it is already refunded; "
                         "reserve again under a new release id")
    refund_refused = ("cannot mark the reservation of release 'racing' refunded: it is already committed "
                      "(committed budget is never returned)")
    if status == "committed":
        assert outcome == {"commit": "committed", other: "committed" if other == "abandon" else refund_refused}
        assert any_store.get_release("racing").status == "pending"
        assert any_store.budget("adult")["epsilon_committed"] == 2.0
    else:
        assert outcome == {"commit": committed_refused, other: "refunded"}
        assert status == "refunded"
        assert any_store.get_release("racing").status == ("failed" if other == "abandon" else "pending")
        assert any_store.budget("adult")["epsilon_committed"] == 0.0
    assert any_store.budget("adult")["epsilon_reserved"] == 0.0


def test_an_older_store_gains_the_policy_deployment_column(tmp_path):
    """A store created before policies named a deployment opens and takes such policies."""
    import sqlalchemy as sa

    url = f"sqlite:///{tmp_path / 'old.db'}"
    engine = sa.create_engine(url)
    with engine.begin() as c:
        c.execute(sa.text("CREATE TABLE policies (id INTEGER PRIMARY KEY, name VARCHAR UNIQUE, dataset VARCHAR, "
                          "analyst VARCHAR, max_epsilon_per_release FLOAT, approval VARCHAR, evaluators_json VARCHAR, "
                          "created_at DATETIME)"))
    engine.dispose()
    store = Store(url)
    store.create_all()
    assert "deployment" in {c["name"] for c in sa.inspect(store.engine).get_columns("policies")}
    store.close()


def test_a_store_creates_its_own_tables_and_no_other_table_the_program_declared(tmp_path):
    """SQLModel's metadata is shared by the whole program: a table another part of it declared there (an
    application embedding the platform) is not created in the store's database, only the store's own."""
    from sqlalchemy import Column, Integer, Table, inspect
    from sqlmodel import SQLModel

    foreign = Table("application_notes", SQLModel.metadata, Column("id", Integer, primary_key=True))
    try:
        store = Store(f"sqlite:///{tmp_path / 'store.db'}")
        store.create_all()
        names = set(inspect(store.engine).get_table_names())
        store.close()
    finally:
        SQLModel.metadata.remove(foreign)
    assert names == {"controllers", "datasets", "leases", "ledger_entries", "policies", "releases", "series",
                     "series_claims", "series_snapshots", "series_running_totals", "console_people", "console_passkeys", "console_enrolments",
                     "console_sessions", "console_challenges", "console_decision_claims", "analyst_keys",
                     "console_submissions"}


def test_policy_fields_are_stored_and_listed_by_name(sqlite_store):
    """What a policy records is what was given (the deployment an automatic policy names included);
    lists come sorted by name, whatever the order of registration; a repeated name is refused."""
    _register(sqlite_store, "census")
    _register(sqlite_store)
    assert [d.name for d in sqlite_store.list_datasets()] == ["adult", "census"]
    sqlite_store.add_policy("zz-monthly", "adult", max_epsilon_per_release=0.5, approval="auto",
                            deployment="dp-release/monthly")
    sqlite_store.add_policy("aa-anyone", "adult", max_epsilon_per_release=1.0, deployment="")
    sqlite_store.add_policy("mm-carol", "adult", analyst="carol", max_epsilon_per_release=0.2)
    sqlite_store.add_policy("census-only", "census", max_epsilon_per_release=2.0)
    assert [p.name for p in sqlite_store.policies_for("adult")] == ["aa-anyone", "zz-monthly"]
    assert [p.name for p in sqlite_store.policies_for("adult", "carol")] == ["aa-anyone", "mm-carol", "zz-monthly"]
    assert [p.name for p in sqlite_store.all_policies("adult")] == ["aa-anyone", "mm-carol", "zz-monthly"]
    assert [p.name for p in sqlite_store.all_policies("census")] == ["census-only"]
    by_name = {p.name: p for p in sqlite_store.all_policies("adult")}
    assert by_name["zz-monthly"].deployment == "dp-release/monthly" and by_name["zz-monthly"].approval == "auto"
    assert by_name["aa-anyone"].deployment is None  # an empty deployment names none
    assert by_name["mm-carol"].max_epsilon_per_release == 0.2 and by_name["mm-carol"].analyst == "carol"
    assert by_name["mm-carol"].evaluators_json == "[]" and by_name["mm-carol"].approval == "manual"
    with pytest.raises(StoreError) as caught:
        sqlite_store.add_policy("mm-carol", "census", max_epsilon_per_release=1.0)
    assert str(caught.value) == "policy 'mm-carol' already exists: choose another name"
    with pytest.raises(ValueError) as caught:
        sqlite_store.add_policy("p", "adult", max_epsilon_per_release=-1)
    assert str(caught.value) == "max_epsilon_per_release must be a finite number > 0, got -1"
    with pytest.raises(ValueError) as caught:
        sqlite_store.add_policy("p", "adult", max_epsilon_per_release=1.0, approval="sometimes")
    assert str(caught.value) == "approval must be one of manual, auto; got 'sometimes'"


def test_release_listing_order_filters_and_frozen_fields(sqlite_store):
    """Releases list oldest first (ties by id), filter by status and by dataset, refuse an unknown
    status by name, and never let an update change a release's id or creation time."""
    _register(sqlite_store)
    _register(sqlite_store, "census")
    b = sqlite_store.add_release("adult", "{}", release_id="b-second")
    a = sqlite_store.add_release("adult", "{}", release_id="a-third")
    c = sqlite_store.add_release("census", "{}", release_id="c-census")
    same_time = b.created_at
    sqlite_store.update_release(a.id, status="approved")
    with store_module.Store._transaction(sqlite_store) as session:  # b and a created at the same instant
        for rid in (a.id, b.id):
            session.get(store_module.Release, rid).created_at = same_time
        session.get(store_module.Release, c.id).created_at = same_time.replace(year=same_time.year - 1)
    assert [r.id for r in sqlite_store.list_releases()] == ["c-census", "a-third", "b-second"]
    assert [r.id for r in sqlite_store.list_releases(dataset="adult")] == ["a-third", "b-second"]
    assert [r.id for r in sqlite_store.list_releases(dataset="census")] == ["c-census"]
    assert [r.id for r in sqlite_store.list_releases(status="approved", dataset="adult")] == ["a-third"]
    with pytest.raises(ValueError) as caught:
        sqlite_store.list_releases(status="done")
    assert str(caught.value).startswith("status must be one of ")
    sqlite_store.update_release(b.id, request_json={"sql": "SELECT 2"}, artifacts_json=["a.html"])
    assert (sqlite_store.get_release(b.id).request_json, sqlite_store.get_release(b.id).artifacts_json) == (
        '{"sql": "SELECT 2"}', '["a.html"]')
    with pytest.raises(ValueError) as caught:
        sqlite_store.update_release(b.id, status="done")
    assert str(caught.value).startswith("status must be one of ")
    for frozen in ("id", "created_at"):
        with pytest.raises(StoreError, match=f"cannot update release field\\(s\\) \\['{frozen}'\\]"):
            sqlite_store.update_release(b.id, **{frozen: "x"})


def test_controllers_and_open_reservations(sqlite_store):
    """Controllers: registered once by name and once by key, listed by name, unknown ones named.
    reserved_entries lists only reservations neither committed nor refunded, oldest first."""
    sqlite_store.add_controller("zoe", "PEM-Z")
    sqlite_store.add_controller("adam", "PEM-A")
    assert [c.name for c in sqlite_store.list_controllers()] == ["adam", "zoe"]
    assert sqlite_store.get_controller("zoe").public_key_pem == "PEM-Z"
    with pytest.raises(StoreError) as caught:
        sqlite_store.add_controller("zoe", "PEM-OTHER")
    assert str(caught.value) == "controller 'zoe' is already registered"
    with pytest.raises(StoreError) as caught:
        sqlite_store.add_controller("eve", "PEM-A")
    assert str(caught.value) == "this public key is already registered to another controller"
    with pytest.raises(StoreError) as caught:
        sqlite_store.get_controller("eve")
    assert str(caught.value) == "'eve' is not a registered controller (dprelease controller add NAME)"

    _register(sqlite_store)
    for rid in ("r1", "r2", "r3", "r4"):
        sqlite_store.reserve("adult", rid, 0.1, 0.0)
    sqlite_store.commit("r2")
    sqlite_store.refund("r3")
    assert [(e.release_id, e.status) for e in sqlite_store.reserved_entries()] == [("r1", "reserved"),
                                                                                    ("r4", "reserved")]


def test_abandon_defaults_and_its_refusals_are_exact(sqlite_store):
    """abandon without a comment records none and marks "failed"; a status that is not a release
    status, or not a final one, is refused by name and changes nothing."""
    _register(sqlite_store)
    sqlite_store.add_release("adult", "{}", release_id="r1")
    sqlite_store.reserve("adult", "r1", 1.0, 0.0)
    with pytest.raises(ValueError) as caught:
        sqlite_store.abandon("r1", "gone")
    assert str(caught.value).startswith("status must be one of ") and str(caught.value).endswith("; got 'gone'")
    with pytest.raises(ValueError, match="abandon marks a final status"):
        sqlite_store.abandon("r1", "pending")
    assert sqlite_store.ledger_entry("r1").status == "reserved"
    assert sqlite_store.abandon("r1") == "refunded"
    release = sqlite_store.get_release("r1")
    assert release.status == "failed" and release.decision_comment == "" and release.decision_by is None
    with pytest.raises(ValueError) as caught:
        sqlite_store.abandon("r1", "pending")
    assert str(caught.value) == "abandon marks a final status (rejected, expired, failed, published), not 'pending'"
    sqlite_store.add_release("adult", "{}", release_id="r2")
    assert sqlite_store.abandon("r2", "rejected", "x" * 600, by="alice") == "none"
    release = sqlite_store.get_release("r2")
    assert (release.status, release.decision_comment, release.decision_by) == ("rejected", "x" * 500, "alice")


def test_lease_is_taken_over_and_renewed(sqlite_store):
    """A lease taken again (a run resumed elsewhere) names the new owner; renewing moves the
    heartbeat forward; renewing or ending a lease nobody holds is a no-op."""
    first = sqlite_store.take_lease("r1", "host-a", 11)
    assert (first.host, first.pid, first.process_started, first.flow_run_id) == ("host-a", 11, 0.0, None)
    sqlite_store.take_lease("r1", "host-b", 22, 5.0, "flow-2")
    lease = sqlite_store.get_lease("r1")
    assert (lease.host, lease.pid, lease.process_started, lease.flow_run_id) == ("host-b", 22, 5.0, "flow-2")
    before = lease.heartbeat_at
    time.sleep(0.01)
    sqlite_store.renew_lease("r1")
    assert sqlite_store.get_lease("r1").heartbeat_at > before
    sqlite_store.renew_lease("nobody")
    sqlite_store.end_lease("nobody")
    assert sqlite_store.get_lease("nobody") is None


def test_a_new_release_records_its_request_and_run(sqlite_store):
    """add_release keeps the request (as JSON) and the flow run that carries it; a status outside
    the vocabulary is refused by name."""
    _register(sqlite_store)
    made = sqlite_store.add_release("adult", {"sql": "SELECT 1", "epsilon": 0.5}, flow_run_id="run-7")
    stored = sqlite_store.get_release(made.id)
    assert stored.request_json == '{"epsilon": 0.5, "sql": "SELECT 1"}' and stored.flow_run_id == "run-7"
    with pytest.raises(ValueError) as caught:
        sqlite_store.add_release("adult", "{}", status="done")
    assert str(caught.value).startswith("status must be one of pending, ") and str(caught.value).endswith("got 'done'")


def test_a_write_lock_held_past_the_busy_timeout_is_one_clear_store_error(tmp_path, monkeypatch):
    """Another process holding SQLite's write lock past the busy timeout: the command gets the
    store's own error (not a driver traceback), and nothing of its step was written."""
    import sqlite3

    from dprelease.store import database

    monkeypatch.setattr(database, "SQLITE_BUSY_TIMEOUT_S", 0.5)
    monkeypatch.setattr(store_module, "SQLITE_BUSY_TIMEOUT_S", 0.5)
    store = Store(f"sqlite:///{tmp_path / 'ledger.db'}")
    store.create_all()
    _register(store)
    holder = sqlite3.connect(tmp_path / "ledger.db", isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")  # another command's open write transaction
    try:
        with pytest.raises(StoreError, match=r"the store was busy for 0.5 s .* changed nothing; run the command again"):
            store.reserve("adult", "r1", 1.0, 0.0)
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert store.budget("adult")["epsilon_reserved"] == 0
    store.close()


# --- row locks under real concurrency (PostgreSQL: SQLite locks the whole file anyway) ------------


def test_abandon_waits_for_a_commit_in_flight_and_leaves_it_committed(pg_store):
    """`abandon` locks the ledger row: while another transaction holds the row and commits the
    reservation, abandon waits, then sees "committed" and changes nothing. Without its lock it reads
    "reserved" before the commit lands and writes "refunded" over a spent budget."""
    _register(pg_store)
    release = pg_store.add_release("adult", "{}", status="approved")
    pg_store.reserve("adult", release.id, 1.0, 1e-7)
    outcome: dict = {}
    with pg_store.engine.connect() as other:
        tx = other.begin()
        other.execute(text("SELECT id FROM ledger_entries WHERE release_id = :r FOR UPDATE"), {"r": release.id})
        other.execute(text("UPDATE ledger_entries SET status = 'committed' WHERE release_id = :r"), {"r": release.id})
        worker = threading.Thread(target=lambda: outcome.update(result=pg_store.abandon(release.id, "failed", "x")))
        worker.start()
        worker.join(2.0)
        assert worker.is_alive(), "abandon did not wait for the row held by the commit in flight"
        tx.commit()
    worker.join(PATIENCE_S)
    assert outcome["result"] == "committed"
    assert pg_store.ledger_entry(release.id).status == "committed"
    assert pg_store.get_release(release.id).status == "approved"
    assert pg_store.budget("adult")["epsilon_committed"] == 1.0


def test_reserved_entries_are_oldest_first_even_after_an_older_row_was_rewritten(pg_store):
    """PostgreSQL writes an updated row anew at the end of the table, so without ORDER BY the
    oldest reservation touched last would come back last."""
    _register(pg_store)
    ids = []
    for i in range(3):
        release = pg_store.add_release("adult", "{}", release_id=f"r{i}")
        pg_store.reserve("adult", release.id, 0.5, 1e-8)
        ids.append(release.id)
    with pg_store.engine.begin() as conn:
        conn.execute(text("UPDATE ledger_entries SET updated_at = updated_at WHERE release_id = 'r0'"))
    assert [e.release_id for e in pg_store.reserved_entries()] == ids


def test_a_dataset_in_an_unknown_file_format_is_refused_naming_the_field(sqlite_store):
    with pytest.raises(ValueError) as caught:
        sqlite_store.add_dataset("adult", privacy_unit="person_id", blob_path="/escrow/adult.fernet",
                                 fingerprint="0" * 64, file_format="xlsx", schema={"person_id": "int"},
                                 epsilon_cap=1.0, delta_cap=1e-6)
    assert str(caught.value).startswith("file_format must be one of ") and str(caught.value).endswith("; got 'xlsx'")
    assert sqlite_store.list_datasets() == []


def test_a_json_field_given_as_text_that_is_not_json_is_refused_saying_what_to_pass(sqlite_store):
    """A *_json field may be given as JSON text; text that does not parse is refused with the parser's
    reason and what to pass instead, and nothing is stored."""
    with pytest.raises(ValueError) as caught:
        sqlite_store.add_dataset("x", privacy_unit="pid", blob_path="b", fingerprint="f", file_format="csv",
                                 schema="{not json", epsilon_cap=1.0, delta_cap=0.0)
    assert str(caught.value) == ("not valid JSON (Expecting property name enclosed in double quotes: line 1 column 2 "
                                 "(char 1)): pass a dict or list, or a JSON string")
    assert sqlite_store.list_datasets() == []


def test_a_release_id_taken_by_another_controller_after_the_check_is_refused_with_the_same_words(pg_store, monkeypatch):
    """Two controllers record a release under the same id at once (PostgreSQL; SQLite's BEGIN IMMEDIATE
    serialises them): the other's insert lands after this one's check found no such release, so the
    primary key refuses this insert, and the controller is told the same as when the check catches it,
    word for word."""
    from dprelease.store.tables import Release

    _register(pg_store)
    other = Store(pg_store.engine.url.render_as_string(hide_password=False))
    checked = store_module.Session.get
    raced: list[str] = []

    def get_then_race(session, entity, ident, *args, **kwargs):
        found = checked(session, entity, ident, *args, **kwargs)
        if entity is Release and ident == "raced" and session.bind is pg_store.engine and not raced:
            raced.append(other.add_release("adult", "{}", release_id="raced").id)  # committed meanwhile
        return found

    monkeypatch.setattr(store_module.Session, "get", get_then_race)
    try:
        with pytest.raises(StoreError) as caught:
            pg_store.add_release("adult", "{}", release_id="raced")
    finally:
        other.close()
    assert raced == ["raced"]
    assert str(caught.value) == "release 'raced' already exists: use update_release to change it"
    assert isinstance(caught.value.__cause__, store_module.IntegrityError)
