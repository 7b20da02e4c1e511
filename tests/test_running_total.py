"""A series' running total (issue 42): declared with the series, charged once for its horizon,
released month by month by the scheduled deployment with every total to date, shown on the signed
series page next to the naive sum's wider interval. Real parts: SQLite store, the escrow, a Prefect
API (prefect_test_harness) whose deployment schedule creates the runs."""

from __future__ import annotations

import json
import math
import os
import shutil
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples"))
sys.path.insert(0, str(ROOT / "tests"))
from monthly_snapshots import write_snapshots

DEPLOYMENT = "members-publication"
SQL = "SELECT WITH ANONYMIZATION region, ANON_COUNT(*, 1) AS visitors FROM members GROUP BY region"
MONTHLY_EPSILON = 0.1
REGIONS = ["North", "South", "East", "West"]
RUNNING = {"name": "distinct visitors to date", "statistic": "COUNT_DISTINCT", "group_by": "region",
           "groups": REGIONS, "horizon": 12, "epsilon": 1.0, "delta": 1e-6}


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    """A fresh home, 12 monthly files of the same 2,000 people, and a temporary Prefect API."""
    from fresh_home import fresh_home_with_prefect

    files = write_snapshots(tmp_path_factory.mktemp("snapshots"), months=12, rows=2000, same_people=True)
    spec = tmp_path_factory.mktemp("requests") / "members.yaml"
    spec.write_text(f"dataset: members\ntitle: Monthly visitors by region\nsql: |\n  {SQL}\n"
                    f"epsilon: {MONTHLY_EPSILON}\ndelta: 1.0e-8\n")
    with fresh_home_with_prefect(tmp_path_factory.mktemp("home")) as settings:
        yield {"settings": settings, "files": files, "spec": spec}


def ledger(store) -> list[tuple]:
    from sqlmodel import Session, select

    from dprelease.store import LedgerEntry

    with Session(store.engine) as session:
        return sorted((e.release_id, e.epsilon, e.status) for e in session.exec(select(LedgerEntry)).all())


def test_a_year_of_running_totals_released_month_by_month_by_the_schedule(env, tmp_path):
    from prefect.flow_engine import run_flow
    from test_series import _scheduled_runs

    from dprelease import pipeline, running_total, series
    from dprelease.flows.publication import publication_flow
    from dprelease.reporting import signing
    from dprelease.store import series as store_series

    settings, files = env["settings"], env["files"]
    platform = pipeline.Platform.open(settings)
    _, scheduled, parameters = _scheduled_runs(env["spec"], 12, series="members", deployment=DEPLOYMENT)
    documents, spent = [], []
    for i, ((label, path), run) in enumerate(zip(files, scheduled)):
        if i == 0:  # the series and its running total, charged once for the 12 months
            series.register_snapshot(settings, "members", path, label, privacy_unit="person_id",
                                     budget_mode="series_cap", epsilon_cap=1.0 + 12 * MONTHLY_EPSILON + 1e-9,
                                     delta_cap=1e-5, risk_profile={"max_risk": 0.9}, running_total=RUNNING)
            platform.store.add_policy("members-monthly", series.dataset_for_policy(platform.store, "members"),
                                      max_epsilon_per_release=MONTHLY_EPSILON, approval="auto", deployment=DEPLOYMENT)
            assert ledger(platform.store) == [("running-total:members", 1.0, "committed")]
        else:
            series.register_snapshot(settings, "members", path, label)
        before = ledger(platform.store)
        outcome = run_flow(publication_flow, flow_run=run, parameters=parameters)
        assert outcome["status"] == "published" and outcome["snapshot"] == label
        added = sorted(set(ledger(platform.store)) - set(before))
        spent.append(added)
        documents.append(running_total.released(settings, "members"))

    # the running total spent nothing more: each run added only its own monthly release
    assert all(len(a) == 1 and a[0][1] == MONTHLY_EPSILON and a[0][0] != "running-total:members" for a in spent)
    budget = store_series.series_budget(platform.store, "members")
    assert budget["running_total"] == {"epsilon": 1.0, "delta": 1e-6, "status": "committed", "horizon": 12,
                                       "release_id": "running-total:members"}
    assert budget["epsilon_total"] == pytest.approx(1.0 + 12 * MONTHLY_EPSILON)
    assert len(budget["per_period"]) == 12
    assert all(p["epsilon"] == MONTHLY_EPSILON for p in budget["per_period"].values())
    import subprocess

    shown = subprocess.run([sys.executable, "-m", "dprelease.cli.app", "budget"], capture_output=True, text=True, cwd=ROOT,
                           env={**os.environ, "COLUMNS": "200"}, check=False)
    assert shown.returncode == 0 and ("its running total spent epsilon 1, delta 1e-06 once for its horizon of 12 "
                                      "periods") in shown.stdout, shown.stdout + shown.stderr

    # month by month: every earlier value and total unchanged (the node noise drawn once, kept)
    for t, (earlier, later) in enumerate(zip(documents, documents[1:]), start=1):
        assert earlier["periods_released"] == t and later["rows"][: 4 * t] == earlier["rows"]
    final = documents[-1]
    assert [r["snapshot"] for r in final["rows"][::4]] == [label for label, _ in files]
    # a period released again (a retried run) reuses the sealed noise: the same numbers, nothing redrawn
    assert running_total.release_period(platform, "members", files[-1][0]) == final
    assert running_total.release_period(platform, "members", files[5][0])["rows"] == final["rows"][: 4 * 6]
    assert running_total.released(settings, "members") == final  # the page keeps showing all 12 months
    # the target: by month 12 each total's interval is at most 40% as wide as the naive sum's
    for row in final["rows"][-4:]:
        assert row["total_ci_halfwidth"] <= 0.4 * row["naive_ci_halfwidth"], row
    # each total's interval is the tree's: popcount(t) nodes
    cal = running_total.RunningTotal(**{**RUNNING, "per_period": 1.0, "periods": 1}).calibration()
    for row in final["rows"]:
        assert row["total_ci_halfwidth"] == cal.prefix_halfwidth(row["period"])
    # the node noise stated beside them, as an auditor re-derives it: sigma^2 = Delta_2^2 / (2 rho)
    noise = final["node_noise"]
    assert noise["rho"] == final["rho"] == cal.rho and noise["l2_sensitivity"] == cal.sensitivity_l2
    assert noise["sigma"] == pytest.approx(cal.sensitivity_l2 / math.sqrt(2 * cal.rho), rel=1e-12)
    assert noise["variance"] == pytest.approx(noise["sigma"] ** 2, rel=1e-6) and noise["grid"] == cal.grid

    # the signed series page says so, holds the running total and no controller-only value
    page_dir = series.series_directory(settings, "members")
    verified = signing.verify_directory(page_dir, settings.public_key_file)
    assert verified.ok, verified.problems
    assert verified.facts["running_total"]["charged"] == "once, for the whole horizon"
    assert json.loads((page_dir / "running-total.json").read_text()) == final
    html = (page_dir / "index.html").read_text()
    assert "charged once for the whole horizon" in html and "naive sum" in html and "running-total:members" in html
    from dp_core import display

    assert f"discrete Gaussian noise of sigma {display.value(final['node_noise']['sigma'])} per node" in html
    assert not list(page_dir.rglob("*.fernet"))
    assert (settings.archive_dir / "series" / "members" / running_total.NOISE_FILE).exists()
    assert html.count('<figure class="series-chart">') == 4 + 1  # a chart per region, and the monthly statistic's
    from test_reports import screenshot

    png = screenshot(page_dir / "index.html", tmp_path, "running-total.png")
    if os.environ.get("DPRELEASE_SAVE_GUIDE_SCREENSHOTS"):  # the controller guide's picture of the page
        shutil.copyfile(png, ROOT / "docs" / "img" / "running-total.png")


def test_a_running_total_is_refused_with_nothing_written(env, tmp_path):
    """Each refusal in one line, before the series exists; nothing charged."""
    from dprelease import pipeline, running_total, series
    from dprelease.store import series as store_series

    settings, (label, path) = env["settings"], env["files"][0]
    platform = pipeline.Platform.open(settings)
    before = ledger(platform.store)
    common = {"privacy_unit": "person_id", "epsilon_cap": 2.0, "risk_profile": {"max_risk": 0.9}}
    for budget_mode, declared, words in (
            ("per_snapshot", RUNNING, "series_cap"),
            ("series_cap", {**RUNNING, "epsilon": 3.0}, "over the series cap"),
            ("series_cap", {**RUNNING, "delta": 1e-4}, "delta 0.0001 is over the series' delta cap 1e-05"),
            ("series_cap", {**RUNNING, "statistic": "SUM", "value": "visits", "per_period": 1e-300},
             r"a SUM's per_period must be between 2\^-100 and 2\^100"),
            ("series_cap", {**RUNNING, "statistic": "SUM", "value": "visits", "per_period": 1e31},
             r"a SUM's per_period must be between 2\^-100 and 2\^100"),
            ("series_cap", {**RUNNING, "statistic": "COUNT", "per_period": 2**40},
             r"a COUNT's per_period is a whole number of rows from 1 to 2\^31 - 1"),
            ("series_cap", {**RUNNING, "horizon": 0}, "horizon must be a whole number"),
            ("series_cap", {**RUNNING, "statistic": "AVG"}, "statistic must be one of"),
            ("series_cap", {**RUNNING, "colour": "red"}, "unknown field 'colour'"),
            ("series_cap", {**RUNNING, "groups": ["North", "South", "North"]}, "group 'North' is listed twice"),
            ("series_cap", {**RUNNING, "groups": "North"}, r"groups must be a list \(groups: \[North, South\]\)"),
            ("series_cap", {**RUNNING, "group_by": "county"}, "column 'county' is not in the series"),
            ("series_cap", {k: v for k, v in RUNNING.items() if k != "group_by"}, "need their `group_by"),
            ("series_cap", {**RUNNING, "selection_share": 0.2}, "public groups cost nothing"),
            ("series_cap", {**RUNNING, "groups": [], "selection_share": 1.5}, "selection_share must be a number in")):
        with pytest.raises(series.SnapshotRefused, match=words):
            series.register_snapshot(settings, "refused", path, label, budget_mode=budget_mode,
                                     running_total=declared, **common)
        assert store_series.find_series(platform.store, "refused") is None
    with pytest.raises(series.SnapshotRefused, match="'day' holds datetime64"):
        running_total.RunningTotal.from_dict({**RUNNING, "group_by": "day", "groups": []},
                                             {"person_id": "int64", "day": "datetime64[ns]"})
    # the CLI: the same verdict in one line, exit 2, nothing written
    import subprocess

    declaration = tmp_path / "running.yaml"
    declaration.write_text("statistic: COUNT_DISTINCT\nhorizon: 12\nepsilon: 1\ndelta: 1.0e-6\n")
    cli = subprocess.run([sys.executable, "-m", "dprelease.cli.app", "dataset", "register", "refused", str(path), "--snapshot",
                          label, "--unit", "person_id", "--epsilon-cap", "2", "--series-budget", "per_snapshot",
                          "--running-total", str(declaration)], capture_output=True, text=True, cwd=ROOT, check=False)
    assert cli.returncode == 2 and cli.stderr.startswith("error: running total: it spans periods"), cli.stderr
    assert "Traceback" not in cli.stderr and len(cli.stderr.strip().splitlines()) == 1
    declaration.write_text("statistic: [")
    cli = subprocess.run([sys.executable, "-m", "dprelease.cli.app", "dataset", "register", "refused", str(path), "--snapshot",
                          label, "--unit", "person_id", "--epsilon-cap", "2", "--series-budget", "series_cap",
                          "--running-total", str(declaration)], capture_output=True, text=True, cwd=ROOT, check=False)
    assert cli.returncode == 2 and "cannot be read" in cli.stderr, cli.stderr
    assert store_series.find_series(platform.store, "refused") is None
    assert ledger(platform.store) == before


CLUBS = {"name": "members to date", "statistic": "COUNT_DISTINCT", "group_by": "club", "horizon": 4,
         "epsilon": 1.0, "delta": 1e-6, "selection_share": 0.25}


def club_snapshots(directory: Path, clubs: int, size: int) -> list[tuple[str, Path]]:
    """Three monthly files: `clubs` clubs of `size` members each, every month; from the second
    month a club `late` of 300 people that was not there in the first."""
    import pandas as pd

    out = []
    for month in (1, 2, 3):
        rows = [(1000 * c + u, f"club{c:02d}") for c in range(clubs) for u in range(size)]
        rows += [(10**6 + u, "late") for u in range(300)] if month > 1 else []
        path = directory / f"clubs-{month}.csv"
        pd.DataFrame(rows, columns=["person_id", "club"]).to_csv(path, index=False)
        out.append((f"2026-0{month}", path))
    return out


def groups_fixed(documents: list[dict]) -> bool:
    """Every period's release totals the groups the first one chose, in every row."""
    first = documents[0]["groups"]
    return all(d["groups"] == first and {r["group"] for r in d["rows"]} <= set(first) for d in documents)


def test_groups_chosen_at_the_series_start_are_kept_for_the_horizon_and_charged_once(env, tmp_path, monkeypatch):
    """A running total by club without public clubs: the first release chooses the clubs privately on
    the first month's data (a quarter of the budget), seals them with the tree's noise, and every
    later month totals exactly those (the club that appears in month 2 is not in the totals); the
    ledger holds one entry for all of it. Each club has the size whose chance of being chosen is near
    1/2, so a variant that chooses again each month (injected below) shows other clubs at once."""
    from cryptography.fernet import Fernet

    from dp_core.continual_selection import horizon_budget
    from dp_core.partition_selection import discrete_laplace_threshold
    from dp_core.selection_keep import laplace_threshold_keep_probability
    from dprelease import pipeline, running_total, series
    from dprelease.reporting import signing
    from dprelease.store import series as store_series

    settings = env["settings"]
    platform = pipeline.Platform.open(settings)
    budget = horizon_budget(1.0, 1e-6, 0.25)
    share = budget.selection
    size = discrete_laplace_threshold(share.epsilon, share.delta, 1)
    p = float(laplace_threshold_keep_probability([size], share.epsilon, share.delta, 1)[0])
    clubs = 40
    # a variant choosing again in months 2 and 3 picks the same clubs with chance (p^2 + (1-p)^2)^(2 * 40)
    assert (p * p + (1 - p) ** 2) ** (2 * clubs) < 1e-6
    files = club_snapshots(tmp_path, clubs, size)

    def release_three_months(name: str) -> list[dict]:
        for i, (label, path) in enumerate(files):
            first = {"privacy_unit": "person_id", "budget_mode": "series_cap", "epsilon_cap": 1.0,
                     "risk_profile": {"max_risk": 0.9}, "running_total": CLUBS} if i == 0 else {}
            series.register_snapshot(settings, name, path, label, **first)
        return [running_total.release_period(platform, name, label) for label, _ in files]

    before = ledger(platform.store)
    documents = release_three_months("clubs")
    assert groups_fixed(documents) and "late" not in documents[-1]["groups"]
    sealed = json.loads(Fernet(platform.escrow_key()).decrypt(
        (settings.archive_dir / "series" / "clubs" / running_total.NOISE_FILE).read_bytes()))
    assert sealed["selection"]["groups"] == documents[0]["groups"]
    assert running_total.release_period(platform, "clubs", files[0][0]) == documents[0]  # a retry: the same
    # charged once, the selection included: one ledger entry of the declared (epsilon, delta)
    assert sorted(set(ledger(platform.store)) - set(before)) == [("running-total:clubs", 1.0, "committed")]
    assert store_series.series_budget(platform.store, "clubs")["running_total"]["delta"] == 1e-6
    chosen = documents[-1]["groups_chosen"]
    assert (chosen["epsilon"], chosen["delta"], chosen["threshold"]) == (share.epsilon, share.delta, size)
    assert (chosen["tree_epsilon"], chosen["tree_delta"]) == (budget.tree_epsilon, budget.tree_delta)
    assert documents[-1]["rho"] == budget.rho and "not in the totals" in chosen["text"]
    page = series.publish_series_page(platform, "clubs") / "index.html"
    html = page.read_text()
    assert "Groups chosen at the series' start (2026-01)" in html and "not in the totals" in html

    signed = signing.verify_directory(page.parent, settings.public_key_file)
    assert signed.ok and signed.facts["running_total"]["groups_chosen"]["groups"] == documents[0]["groups"]

    # no club chosen (two of one person: chosen with chance below 2 * f delta = 5e-7): nothing totalled, said so
    one_each = tmp_path / "one-each.csv"
    one_each.write_text("person_id,club\n1,a\n2,b\n")
    series.register_snapshot(settings, "tiny", one_each, "2026-01", privacy_unit="person_id", budget_mode="series_cap",
                             epsilon_cap=1.0, risk_profile={"max_risk": 0.9}, running_total=CLUBS)
    empty = running_total.release_period(platform, "tiny", "2026-01")
    assert empty["groups"] == [] and empty["rows"] == [] and empty["groups_chosen"]["threshold"] == size
    assert "No group passed the threshold" in (series.publish_series_page(platform, "tiny") / "index.html").read_text()

    # the broken variant: the sealed state forgotten, the clubs chosen again each month; caught
    monkeypatch.setattr(running_total, "_sealed_state", lambda path, fernet: None)
    assert not groups_fixed(release_three_months("clubs-broken"))


def _people_file(folder: Path, name: str, people: int) -> Path:
    """A period's file: `people` people, all in North."""
    path = folder / f"{name}.csv"
    path.write_text("person_id,region\n" + "".join(f"{i},North\n" for i in range(people)))
    return path


def _start_running_total_series(settings, name: str, path: Path, label: str, epsilon_cap: float = 1.0) -> None:
    """A series of the same people with a 12-period COUNT_DISTINCT running total (epsilon 1), from its
    first snapshot."""
    from dprelease import series

    declared = {"statistic": "COUNT_DISTINCT", "horizon": 12, "epsilon": 1.0, "delta": 1e-6}
    series.register_snapshot(settings, name, path, label, privacy_unit="person_id", budget_mode="series_cap",
                             epsilon_cap=epsilon_cap, risk_profile={"max_risk": 0.9}, running_total=declared)


def test_a_running_total_series_refuses_a_label_whose_numbers_are_not_as_wide_as_its_own(env, tmp_path):
    """2026-2 after 2026-01 sorts after it, but then every later month (2026-02 .. 2026-12) sorts before
    2026-2 and is refused, and no command removes a snapshot: the series was stuck at its second month.
    A label whose numbers are wider or narrower than the newest's is refused at registration, API and
    CLI alike, with the label written as the series writes it; nothing registered."""
    import subprocess

    from dprelease import series
    from dprelease.store import Store
    from dprelease.store import series as store_series

    settings = env["settings"]
    month = tmp_path / "month.csv"
    month.write_text("person_id,region\n" + "".join(f"{i},North\n" for i in range(50)))
    series.register_snapshot(settings, "padded", month, "2026-01", privacy_unit="person_id", budget_mode="series_cap",
                             epsilon_cap=1.0, risk_profile={"max_risk": 0.9},
                             running_total={"statistic": "COUNT_DISTINCT", "horizon": 12, "epsilon": 1.0, "delta": 1e-6})
    store = Store(settings.store_url)
    before = ([s.snapshot for s in store_series.snapshots(store, "padded")], ledger(store))
    for label, written in (("2026-2", "2026-02"), ("2026-010", "2026-10"), ("2026-1", None), ("2027-1", "2027-01"),
                           ("2026-100", None)):
        with pytest.raises(series.SnapshotRefused, match=f"snapshot {label} writes a number with other digits") as err:
            series.register_snapshot(settings, "padded", month, label)
        assert (f"as the series does, {written};" in str(err.value)) if written else "as the series does;" in str(err.value)
        assert ([s.snapshot for s in store_series.snapshots(store, "padded")], ledger(store)) == before
    cli = subprocess.run([sys.executable, "-m", "dprelease.cli.app", "dataset", "register", "padded", str(month),
                          "--snapshot", "2026-2"], capture_output=True, text=True, cwd=ROOT, check=False)
    assert cli.returncode == 2 and cli.stderr.startswith("error: running total of series 'padded': snapshot 2026-2 "
                                                         "writes a number with other digits than 2026-01"), cli.stderr
    assert len(cli.stderr.strip().splitlines()) == 1 and "2026-02" in cli.stderr
    for label in ("2026-02", "2026-10", "2026-11b"):  # as wide as the newest's; another shape is text order's alone
        series.register_snapshot(settings, "padded", month, label)
    assert [s.snapshot for s in store_series.snapshots(store, "padded")] == ["2026-01", "2026-02", "2026-10", "2026-11b"]


def test_a_running_total_series_takes_its_periods_in_label_order_only(env, tmp_path):
    """Period s's sealed node noise is added to period s's data again at every later release, and
    periods are numbered in label order: a snapshot sorting before a released one would take that
    period's place and its noise, and the two published values would differ by the two periods'
    exact difference (seen before the fix: 103 published for February's 100 people, then 133 for a
    back-filled January's 130, the same +3). Every label that does not sort after the newest is
    refused at registration, API and CLI alike, nothing registered; a snapshot put in the store out
    of order another way stops the release, nothing redrawn nor written."""
    import subprocess

    from dprelease import pipeline, running_total, series
    from dprelease.store import series as store_series

    settings = env["settings"]
    platform = pipeline.Platform.open(settings)

    def month(name: str, people: int) -> Path:
        return _people_file(tmp_path, name, people)

    _start_running_total_series(settings, "ordered", month("aug", 100), "2026-8")
    series.register_snapshot(settings, "ordered", month("sep", 120), "2026-9")
    shown = running_total.release_period(platform, "ordered", "2026-9")
    before = ([s.snapshot for s in store_series.snapshots(platform.store, "ordered")], ledger(platform.store))
    # an earlier month, a month written without its zero (sorts first), one between two periods
    for label in ("2026-7", "2026-10", "2026-85"):
        with pytest.raises(series.SnapshotRefused, match=f"snapshot {label} sorts before 2026-9"):
            series.register_snapshot(settings, "ordered", month("late", 130), label)
        assert ([s.snapshot for s in store_series.snapshots(platform.store, "ordered")],
                ledger(platform.store)) == before
    cli = subprocess.run([sys.executable, "-m", "dprelease.cli.app", "dataset", "register", "ordered",
                          str(month("late", 130)), "--snapshot", "2026-10"],
                         capture_output=True, text=True, cwd=ROOT, check=False)
    assert cli.returncode == 2 and cli.stderr.startswith("error: running total of series 'ordered': snapshot "
                                                         "2026-10 sorts before 2026-9"), cli.stderr
    assert len(cli.stderr.strip().splitlines()) == 1
    assert [s.snapshot for s in store_series.snapshots(platform.store, "ordered")] == before[0]

    # out of order in the store by another way (a direct insert, a restored backup): refused at release
    noise_file = settings.archive_dir / "series" / "ordered" / running_total.NOISE_FILE
    sealed = noise_file.read_bytes()
    from dprelease import admin

    inserted = admin.register_dataset(settings, store_series.snapshot_dataset_name("ordered", "2026-0"),
                                      month("jul", 130), "person_id", 1.0, 1e-5, risk_profile={"max_risk": 0.9})
    from sqlmodel import Session

    from dprelease.store.tables import Snapshot

    with Session(platform.store.engine) as session:  # a row put in directly (add_snapshot refuses the label)
        session.add(Snapshot(series="ordered", snapshot="2026-0", dataset=inserted.name))
        session.commit()
    with pytest.raises(running_total.RunningTotalRefused, match="period 1 was 2026-8 when its noise was sealed"):
        running_total.release_period(platform, "ordered", "2026-9")
    assert noise_file.read_bytes() == sealed and running_total.released(settings, "ordered") == shown
    # a state sealed before the periods were recorded in it: the published rows name them
    from cryptography.fernet import Fernet

    fernet = Fernet(platform.escrow_key())
    state = json.loads(fernet.decrypt(sealed))
    assert state.pop("periods") == ["2026-8", "2026-9"]
    noise_file.write_bytes(legacy := fernet.encrypt(json.dumps(state).encode()))
    with pytest.raises(running_total.RunningTotalRefused, match="period 1 was 2026-8 when its noise was sealed"):
        running_total.release_period(platform, "ordered", "2026-9")
    assert noise_file.read_bytes() == legacy and running_total.released(settings, "ordered") == shown


def test_a_running_sum_of_a_real_column_totals_its_values_not_their_whole_units(env, tmp_path):
    """A SUM of a real-valued column: each person's clamped period sum is rounded to the engine's
    fine quantum (fixed at the declaration from the column's type), not to a whole unit, which made
    0.4 hours a month 0 and 1.3 hours 1 (every total 0 when B < 0.5). Each value and total to date,
    at epsilon 10, holds the exact one in its interval at confidence 1 - 1e-8 (12 checks: false
    failure below 1.2e-7); rounded to whole units they were 60 to 160 away, over twice the half-width."""
    from dprelease import pipeline, running_total, series

    settings = env["settings"]
    platform = pipeline.Platform.open(settings)
    for b, hours in ((0.3, 0.4), (1.0, 0.4), (2.5, 1.3)):
        name = f"hours-{b}"
        declared = {"statistic": "SUM", "value": "hours", "per_period": b, "periods": 2, "horizon": 2,
                    "epsilon": 10.0, "delta": 1e-6, "confidence": 1 - 1e-8}
        for month in (1, 2):
            path = tmp_path / f"{name}-{month}.csv"
            path.write_text("person_id,hours\n" + "".join(f"{i},{hours}\n" for i in range(200)))
            first = {"privacy_unit": "person_id", "budget_mode": "series_cap", "epsilon_cap": 10.0,
                     "risk_profile": {"max_risk": 0.9}, "running_total": declared} if month == 1 else {}
            series.register_snapshot(settings, name, path, f"2026-0{month}", **first)
        released = running_total.release_period(platform, name, "2026-02")
        each = 200 * min(b, hours)
        for row in released["rows"]:
            assert abs(row["value"] - each) <= row["value_ci_high"] - row["value"], (b, row)
            assert abs(row["total"] - each * row["period"]) <= row["total_ci_halfwidth"], (b, row)
            assert row["total_ci_halfwidth"] < 30, (b, row)  # a whole-unit total, 60 off or more, is outside


def test_a_month_whose_release_is_not_published_holds_the_running_total_before_it(env, tmp_path):
    """The running total through month t carries month t's data, so it is released only through the
    newest month up to which every month's own release is published: with February's release
    rejected, publishing March releases the running total through January only (February's people
    reached it before, with March's approval alone); once February is published, through March.
    Through the publication flow's own step, in a Prefect flow; the releases are store records."""
    from prefect import flow

    from dprelease import pipeline, running_total, series
    from dprelease.flows.publication import release_running_total
    from dprelease.store import series as store_series

    settings = env["settings"]
    platform = pipeline.Platform.open(settings)
    declared = {"statistic": "COUNT_DISTINCT", "horizon": 12, "epsilon": 1.0, "delta": 1e-6}
    for month in (1, 2, 3):
        path = tmp_path / f"held-{month}.csv"
        path.write_text("person_id,region\n" + "".join(f"{100 * month + i},North\n" for i in range(50)))
        first = {"privacy_unit": "person_id", "budget_mode": "series_cap", "epsilon_cap": 1.0,
                 "risk_profile": {"max_risk": 0.9}, "running_total": declared} if month == 1 else {}
        series.register_snapshot(settings, "held", path, f"2026-0{month}", **first)

    def decided(label: str, status: str) -> None:
        dataset = store_series.snapshot_dataset_name("held", label)
        release_id = f"held-{label}-{status}"
        platform.store.add_release(dataset, {}, release_id=release_id, status=status)
        if status == "published":  # a rejected release's claim is given back with its refund
            store_series.claim(platform.store, "held", label, release_id)

    @flow
    def publication_step(label: str) -> None:
        release_running_total(platform, "held", label)

    decided("2026-01", "published")
    decided("2026-02", "rejected")
    decided("2026-03", "published")
    publication_step("2026-03")
    assert running_total.released(settings, "held")["periods_released"] == 1
    decided("2026-02", "published")
    publication_step("2026-02")
    shown = running_total.released(settings, "held")
    assert shown["periods_released"] == 3 and [r["snapshot"] for r in shown["rows"]] == ["2026-01", "2026-02", "2026-03"]


def test_a_period_published_without_its_signed_folder_is_said_and_what_follows_is_still_done(env, tmp_path):
    """The one step after a series period's publication (dprelease.series_period.period_published), the
    publication run's and the recovery's: a period published in the store whose signed folder is not
    in the publication directory (its release a store record here; a folder removed, or published on
    another host and missing from the shared archive) cannot be shown on the series page, which
    shows signed numbers only. The page is left as it was and one line says why, naming the period,
    its release and the folder; the running total is still released through the newest published
    period and the index still written. Before, the run's path failed with FileNotFoundError after
    the period had been published, and the recovery's skipped the index."""
    from dprelease import pipeline, recovery, running_total, series
    from dprelease.series_period import period_published
    from dprelease.store import series as store_series

    settings = env["settings"]
    platform = pipeline.Platform.open(settings)
    _start_running_total_series(settings, "unsigned", _people_file(tmp_path, "jan", 60), "2026-01")
    series.register_snapshot(settings, "unsigned", _people_file(tmp_path, "feb", 70), "2026-02")
    for label in ("2026-01", "2026-02"):
        release_id = f"unsigned-{label}"
        platform.store.add_release(store_series.snapshot_dataset_name("unsigned", label), {}, release_id=release_id,
                                   status="published")
        store_series.claim(platform.store, "unsigned", label, release_id)
    index = settings.publication_dir / "index.html"
    index.unlink(missing_ok=True)
    notes = period_published(platform, "unsigned", "2026-02")
    folder = settings.publication_dir / "unsigned-2026-01"
    assert notes == ["the series page was not published again (the next period's run publishes it): series "
                     f"'unsigned': period 2026-01's release unsigned-2026-01 is published in the store but its signed "
                     f"folder {folder} is missing, so the series page cannot show it: put the release's signed "
                     "folder back (from a backup or the shared archive)"], notes
    assert running_total.released(settings, "unsigned")["periods_released"] == 2
    assert index.exists() and not series.series_directory(settings, "unsigned").exists()
    assert recovery.finish_series_period(platform, "unsigned@2026-02") == f"; {notes[0]}"


def test_two_registrations_at_once_cannot_both_pass_the_label_check(env, tmp_path):
    """Two snapshots of a running-total series registered at once, 2026-09 and 2026-10 after 2026-08:
    both checked the label against 2026-08 before either was recorded, so both passed, and 2026-09
    landed after 2026-10 had become the newest (a period out of order, refused only at its release).
    The label is checked again where the snapshot is recorded, the series locked: the command paused
    after sealing 2026-09 resumes after 2026-10 is in and is refused in one line, and its dataset and
    sealed blob are gone (nothing half-registered)."""
    import subprocess
    import time

    from patience import PATIENCE_S

    from dprelease import pipeline, series
    from dprelease.store import series as store_series

    settings = env["settings"]
    store = pipeline.Platform.open(settings).store

    def month(name: str, people: int) -> Path:
        return _people_file(tmp_path, name, people)

    _start_running_total_series(settings, "racing", month("aug", 100), "2026-08")
    blobs_before = sorted(p.name for p in settings.escrow_dir.iterdir())
    marker = tmp_path / "paused"
    env_vars = {**os.environ, "DPRELEASE_TEST_PAUSE_AT": "snapshot_sealed", "DPRELEASE_TEST_PAUSE_MARKER": str(marker)}
    late = subprocess.Popen([sys.executable, "-m", "dprelease.cli.app", "dataset", "register", "racing",
                             str(month("sep", 110)), "--snapshot", "2026-09"], env=env_vars, cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + PATIENCE_S
    while not marker.exists():
        assert late.poll() is None, late.communicate()
        assert time.monotonic() < deadline, "the registration never reached its pause"
        time.sleep(0.1)
    assert store.get_dataset("racing@2026-09")  # sealed and recorded as a dataset, not yet a snapshot
    series.register_snapshot(settings, "racing", month("oct", 120), "2026-10")
    marker.unlink()  # the paused registration goes on
    out, err = late.communicate(timeout=PATIENCE_S)
    assert late.returncode == 2 and len(err.strip().splitlines()) == 1, (out, err)
    assert err.startswith("error: running total of series 'racing': snapshot 2026-09 sorts before 2026-10"), err
    assert [s.snapshot for s in store_series.snapshots(store, "racing")] == ["2026-08", "2026-10"]
    assert "racing@2026-09" not in [d.name for d in store.list_datasets()]
    blobs_after = sorted(p.name for p in settings.escrow_dir.iterdir())
    assert len(blobs_after) == len(blobs_before) + 1  # 2026-10's; 2026-09's sealed blob removed


def test_a_period_finished_by_recovery_releases_the_running_total_and_the_series_page(env, tmp_path):
    """The scheduled run of a running-total series killed (SIGKILL) while it moves the approved period
    into place: the recovery finishes the publication and, as the run would have, the running total
    through that period and the series page (before: the period was published and the running total
    never was; for the horizon's last period, nothing would ever publish it)."""
    import signal
    import subprocess
    import time

    from patience import PATIENCE_S
    from prefect.settings import PREFECT_API_URL
    from test_series import _scheduled_runs

    from dprelease import pipeline, recovery, running_total, series

    settings = env["settings"]
    platform = pipeline.Platform.open(settings)
    _start_running_total_series(settings, "crashy", _people_file(tmp_path, "aug", 100), "2026-08", epsilon_cap=1.2)
    spec = tmp_path / "crashy.yaml"
    spec.write_text("dataset: crashy\ntitle: Visitors\nsql: |\n  SELECT WITH ANONYMIZATION region, ANON_COUNT(*, 1) AS n "
                    "FROM crashy GROUP BY region\nepsilon: 0.1\ndelta: 1.0e-8\n")
    platform.store.add_policy("crashy-monthly", series.dataset_for_policy(platform.store, "crashy"),
                              max_epsilon_per_release=0.1, approval="auto", deployment="crashy-publication")
    _, [run], _ = _scheduled_runs(spec, 1, series="crashy", deployment="crashy-publication")
    marker = tmp_path / "paused"
    code = ("import sys\nfrom prefect import get_client\nfrom prefect.flow_engine import run_flow\n"
            "from dprelease.flows.publication import publication_flow\n"
            "with get_client(sync_client=True) as client:\n    run = client.read_flow_run(sys.argv[1])\n"
            "run_flow(publication_flow, flow_run=run, parameters=run.parameters)\n")
    killed = subprocess.Popen([sys.executable, "-c", code, str(run.id)], cwd=ROOT, stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True, env={**os.environ, "PREFECT_API_URL": PREFECT_API_URL.value(),
                                   "DPRELEASE_TEST_PAUSE_AT": "during_publication",
                                                              "DPRELEASE_TEST_PAUSE_MARKER": str(marker)})
    deadline = time.monotonic() + PATIENCE_S
    while not marker.exists():
        assert killed.poll() is None, killed.communicate()[1][-3000:]
        assert time.monotonic() < deadline, "the run never reached its publication"
        time.sleep(0.1)
    killed.send_signal(signal.SIGKILL)
    killed.wait()
    assert running_total.released(settings, "crashy") is None
    [done] = recovery.sweep(platform)
    assert done.outcome == "published" and done.dataset == "crashy@2026-08", done
    document = running_total.released(settings, "crashy")
    assert document is not None and {row["snapshot"] for row in document["rows"]} == {"2026-08"}
    page = json.loads((settings.publication_dir / "series" / "crashy" / "series.json").read_text())
    assert [period["snapshot"] for period in page["periods"]] == ["2026-08"]
    assert recovery.sweep(platform) == []
