"""Periodic publication (issue 21): a year of monthly snapshots released by the schedule, exactly
once each, the series budget as stated, and the signed series page. Real parts: SQLite (and
PostgreSQL when DPRELEASE_TEST_PG_URL is set) stores, the escrow, a Prefect API
(prefect_test_harness) with a deployment whose schedule creates the runs, headless Chromium."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples"))
from monthly_snapshots import write_snapshots
from patience import PATIENCE_S

DEPLOYMENT = "dp-series-publication"
SQL = ("SELECT WITH ANONYMIZATION region, ANON_COUNT(*, 1) AS people, ANON_AVG(visits, 0, 20) AS avg_visits "
       "FROM visits GROUP BY region")
EPSILON = 0.5


@pytest.fixture(scope="module")
def series_env(tmp_path_factory):
    """A fresh home, 12 monthly snapshot files and a temporary Prefect API for the module."""
    home = tmp_path_factory.mktemp("home")
    saved = {k: os.environ.get(k) for k in ("DPRELEASE_HOME", "PREFECT_SERVER_ANALYTICS_ENABLED")}
    os.environ["DPRELEASE_HOME"] = str(home)
    os.environ["PREFECT_SERVER_ANALYTICS_ENABLED"] = "false"
    from prefect_harness import prefect_harness

    from dprelease import admin
    from dprelease.settings import Settings

    settings = Settings.from_env()
    admin.init(settings)
    files = write_snapshots(tmp_path_factory.mktemp("snapshots"), months=12, rows=1500)
    spec = tmp_path_factory.mktemp("requests") / "visits.yaml"
    spec.write_text(f"dataset: visits\ntitle: Monthly visits by region\nsql: |\n  {SQL}\nepsilon: {EPSILON}\n"
                    "delta: 1.0e-7\n")
    with prefect_harness():
        yield {"settings": settings, "files": files, "spec": spec}
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


def _scheduled_runs(spec: Path, count: int, series: str = "visits", deployment: str = DEPLOYMENT):
    """A deployment of the publication flow naming the series, whose schedule (the server's
    scheduler endpoint) creates `count` runs with the snapshot rule `latest`."""
    from datetime import timedelta

    from prefect import get_client
    from prefect.client.schemas.actions import DeploymentScheduleCreate
    from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterId
    from prefect.client.schemas.schedules import IntervalSchedule

    parameters = {"request_file": str(spec), "series": series, "snapshot": "latest", "approval_timeout": 30}
    with get_client(sync_client=True) as client:
        flow_id = client.create_flow_from_name("dp-scheduled-publication")
        deployment_id = client.create_deployment(
            flow_id=flow_id, name=deployment, parameters=parameters,
            schedules=[DeploymentScheduleCreate(schedule=IntervalSchedule(interval=timedelta(seconds=1)))])
        client._client.post(f"/deployments/{deployment_id}/schedule",
                            json={"min_runs": count, "max_runs": count}).raise_for_status()
        runs = client.read_flow_runs(deployment_filter=DeploymentFilter(id=DeploymentFilterId(any_=[deployment_id])))
    scheduled = sorted((r for r in runs if r.auto_scheduled and r.state.is_scheduled()),  # not run yet
                       key=lambda r: r.expected_start_time)[:count]
    assert len(scheduled) == count and all(r.created_by.type == "SCHEDULE" for r in scheduled)
    return deployment_id, scheduled, parameters


def _ledger(store) -> list[tuple]:
    """Every ledger entry (dataset, release, epsilon, status): what 'nothing spent' compares."""
    from sqlmodel import Session, select

    from dprelease.store import LedgerEntry

    with Session(store.engine) as session:
        return sorted((e.dataset, e.release_id, e.epsilon, e.status) for e in session.exec(select(LedgerEntry)).all())


def test_a_year_of_monthly_releases_once_each_with_the_signed_series_page(series_env, tmp_path):
    from prefect.flow_engine import run_flow

    from dprelease import pipeline, series
    from dprelease.flows.publication import publication_flow
    from dprelease.reporting import signing
    from dprelease.store import series as store_series

    settings, files, spec = series_env["settings"], series_env["files"], series_env["spec"]
    platform = pipeline.Platform.open(settings)
    _, scheduled, parameters = _scheduled_runs(spec, len(files))
    started = time.monotonic()
    outcomes = []
    for i, ((label, path), run) in enumerate(zip(files, scheduled)):
        if i == 0:  # the first snapshot creates the series; the standing policy covers every period
            series.register_snapshot(settings, "visits", path, label, privacy_unit="person_id",
                                     budget_mode="per_snapshot", epsilon_cap=EPSILON,
                                     risk_profile={"max_risk": 0.5})  # epsilon 0.5 is within this tolerance
            platform.store.add_policy("monthly-visits", series.dataset_for_policy(platform.store, "visits"),
                                      max_epsilon_per_release=EPSILON, approval="auto", deployment=DEPLOYMENT)
        else:
            series.register_snapshot(settings, "visits", path, label)
        outcomes.append(run_flow(publication_flow, flow_run=run, parameters=parameters))
    elapsed = time.monotonic() - started
    print(f"12 scheduled releases: {elapsed:.1f} s ({elapsed / 12:.2f} s each)")

    assert [o["status"] for o in outcomes] == ["published"] * 12
    assert [o["snapshot"] for o in outcomes] == [label for label, _ in files]
    for o in outcomes:  # 12 signed releases, each approved by the standing policy
        report = signing.verify_directory(Path(o["directory"]), settings.public_key_file)
        assert report.ok and report.facts["approved_by"].startswith("policy:monthly-visits")
    # budget as stated: each snapshot charged EPSILON once (parallel composition), total = EPSILON
    ledger = _ledger(platform.store)
    assert len(ledger) == 12 and all(e[2] == EPSILON and e[3] == "committed" for e in ledger)
    budget = store_series.series_budget(platform.store, "visits")
    assert budget["composition"] == "parallel" and budget["epsilon_total"] == EPSILON
    assert list(budget["per_period"]) == [label for label, _ in files]

    # the series page: signed, verifiable, its values exactly the released ones
    page_dir = series.series_directory(settings, "visits")
    verified = signing.verify_directory(page_dir, settings.public_key_file)
    assert verified.ok, verified.problems
    assert [p["release_id"] for p in verified.facts["periods"]] == [o["release_id"] for o in outcomes]
    document = json.loads((page_dir / "series.json").read_text())
    for period, o in zip(document["periods"], outcomes):
        released = json.loads((Path(o["directory"]) / "results.json").read_text())["rows"]
        assert period["rows"] == released and period["epsilon"] == EPSILON
    html = (page_dir / "index.html").read_text()
    assert html.count("<svg") == 2 and "parallel composition" in html
    for o in outcomes:
        assert f"../../{o['release_id']}/index.html" in html
    cli = subprocess.run([sys.executable, "-m", "dprelease.cli.app", "verify", str(page_dir), "--key",
                          str(settings.public_key_file)], check=False, capture_output=True, text=True, cwd=ROOT)
    assert cli.returncode == 0, cli.stdout + cli.stderr
    assert "series/visits/index.html" in (settings.publication_dir / "index.html").read_text()
    _check_no_controller_only_fields(page_dir)
    png = _render_in_chromium(page_dir / "index.html", tmp_path)
    if os.environ.get("DPRELEASE_SAVE_GUIDE_SCREENSHOTS"):  # the controller guide's picture of the page
        shutil.copyfile(png, ROOT / "docs" / "img" / "series-page.png")

    # a second run for a published snapshot (a back-fill of 2026-03), a missing snapshot: refused, nothing spent
    before = _ledger(platform.store)
    from prefect import get_client

    with get_client(sync_client=True) as client:
        again = client.create_flow_run_from_deployment(scheduled[0].deployment_id,
                                                       parameters={**parameters, "snapshot": "2026-03"})
        missing = client.create_flow_run_from_deployment(scheduled[0].deployment_id,
                                                         parameters={**parameters, "snapshot": "2027-01"})
        no_new = client.create_flow_run_from_deployment(scheduled[0].deployment_id, parameters=parameters)
    for run, words in ((again, "already published"), (no_new, "no new snapshot"), (missing, "is missing")):
        state = run_flow(publication_flow, flow_run=run, parameters={**parameters, "snapshot": run.parameters["snapshot"]},
                         return_type="state")
        assert state.is_failed() and words in state.message, state.message  # the Prefect UI's run state
    assert _ledger(platform.store) == before
    index = (settings.publication_dir / "index.html").read_text()
    assert "2027-01" in index and "is missing" in index
    assert "2027-01" in (page_dir / "index.html").read_text()
    assert signing.verify_directory(page_dir, settings.public_key_file).ok


def _new_series(series_env, name: str, labels: list[str], tmp_path: Path, **budget):
    """A series `name` with the snapshots `labels` (the fixture's monthly files), its request file,
    and a standing policy for its own scheduled deployment."""
    from dprelease import pipeline, series

    settings, files = series_env["settings"], dict(series_env["files"])
    platform = pipeline.Platform.open(settings)
    spec = tmp_path / f"{name}.yaml"
    spec.write_text(series_env["spec"].read_text().replace("FROM visits", f"FROM {name}")
                    .replace("dataset: visits", f"dataset: {name}"))
    first, *later = labels  # the policy, given with the first snapshot, is carried over to the later ones
    series.register_snapshot(settings, name, files[first], first, privacy_unit="person_id",
                             risk_profile={"max_risk": 0.5}, **budget)
    platform.store.add_policy(f"{name}-policy", series.dataset_for_policy(platform.store, name),
                              max_epsilon_per_release=EPSILON, approval="auto", deployment=f"{name}-publication")
    for label in later:
        series.register_snapshot(settings, name, files[label], label)
    return platform, spec


def _run_scheduled(spec: Path, name: str):
    """One run created by the schedule of the series' deployment, executed as a worker would."""
    from prefect.flow_engine import run_flow

    from dprelease.flows.publication import publication_flow

    _, (run,), parameters = _scheduled_runs(spec, 1, series=name, deployment=f"{name}-publication")
    return run, run_flow(publication_flow, flow_run=run, parameters=parameters, return_type="state")


def assert_index_reaches_every_page(settings) -> None:
    """The publication index links every page of the published folder (each release's report, each
    series page), and every link in it resolves to a file inside that folder."""
    import re

    root = settings.publication_dir.resolve()
    links = re.findall(r'(?:href|src)="([^"#?]+)', (root / "index.html").read_text())
    for link in links:
        target = (root / link).resolve()
        assert target.is_file() and target.is_relative_to(root), f"the index links {link!r}: no such file"
    pages = {p.relative_to(root).as_posix() for p in [*root.glob("*/index.html"), *root.glob("series/*/index.html")]}
    assert pages and pages <= set(links), f"pages the index does not link: {sorted(pages - set(links))}"


def test_latest_publishes_every_unpublished_snapshot_oldest_first_and_the_index_links_the_series_page(series_env,
                                                                                                     tmp_path):
    """Issue 35: with 2026-01 and 2026-02 registered and only 2026-02 published, `latest` skipped
    2026-01; and the index did not link a series page published after it. Each snapshot not yet
    published is released, oldest first, each its own release charged to the series; the index
    reaches every page after each run."""
    from dprelease import series
    from dprelease.store import series as store_series

    settings = series_env["settings"]
    platform, spec = _new_series(series_env, "clinic", ["2026-01"], tmp_path, budget_mode="per_snapshot",
                                 epsilon_cap=EPSILON)
    run, state = _run_scheduled(spec, "clinic")
    assert state.is_completed() and state.result()["snapshot"] == "2026-01"
    assert_index_reaches_every_page(settings)  # the first publication of a series: its page is linked
    for label in ("2026-02", "2026-03"):  # two periods registered before the next scheduled run
        series.register_snapshot(settings, "clinic", dict(series_env["files"])[label], label)
    run, state = _run_scheduled(spec, "clinic")
    result = state.result()
    assert state.is_completed() and result["snapshots"] == {"2026-02": "published", "2026-03": "published"}
    claims = store_series.claims(platform.store, "clinic")
    assert [claims["2026-02"], claims["2026-03"]] == [str(run.id), f"{run.id}@2026-03"]
    releases = platform.store.releases_of_run(str(run.id))
    assert [r.id for r in releases] == [str(run.id), f"{run.id}@2026-03"]  # oldest first
    assert all(r.status == "published" for r in releases) and result["release_id"] == f"{run.id}@2026-03"
    assert [p.snapshot for p in series.published_periods(platform, "clinic")] == ["2026-01", "2026-02", "2026-03"]
    assert_index_reaches_every_page(settings)


def test_a_series_budget_short_of_every_snapshot_publishes_the_oldest_and_names_those_left(series_env, tmp_path):
    """The series cap covers two of three waiting snapshots: the two oldest are published, the run
    fails naming the one left and why, and nothing is spent on it (its snapshot is free again)."""
    from dprelease.store import series as store_series

    platform, spec = _new_series(series_env, "ward", ["2026-01", "2026-02", "2026-03"], tmp_path,
                                 budget_mode="series_cap", epsilon_cap=2 * EPSILON)
    run, state = _run_scheduled(spec, "ward")
    assert state.is_failed()
    assert "released 2026-01 published, 2026-02 published" in state.message, state.message
    assert "left unpublished, oldest first: 2026-03" in state.message and "budget exceeded for series" in state.message
    assert {r.id: r.status for r in platform.store.releases_of_run(str(run.id))} == {
        str(run.id): "published", f"{run.id}@2026-02": "published", f"{run.id}@2026-03": "failed"}
    assert "2026-03" not in store_series.claims(platform.store, "ward")
    assert store_series.series_budget(platform.store, "ward")["epsilon_total"] == pytest.approx(2 * EPSILON)
    assert_index_reaches_every_page(series_env["settings"])
    # the UI's Retry of this run: it ends at once, naming each release, and runs nothing again
    from prefect import get_client
    from prefect.flow_engine import run_flow
    from prefect.states import AwaitingRetry

    from dprelease.flows.publication import publication_flow

    before = _ledger(platform.store)
    with get_client(sync_client=True) as client:
        assert client.set_flow_run_state(run.id, AwaitingRetry(message="Retry from the UI")).status.value == "ACCEPT"
        again = client.read_flow_run(run.id)
    state = run_flow(publication_flow, flow_run=again, parameters=again.parameters, return_type="state")
    assert state.is_failed() and "This retry ran nothing again" in state.message, state.message
    assert f"release {run.id}@2026-03 failed" in state.message and _ledger(platform.store) == before


def _check_no_controller_only_fields(page_dir: Path) -> None:
    """The series folder holds released values and public parameters only (as the release folders)."""
    from test_release_flow import CONTROLLER_LABELS

    text = "\n".join(p.read_text(errors="replace") for p in page_dir.rglob("*") if p.is_file()).lower()
    for label in CONTROLLER_LABELS:
        assert label not in text, f"controller-only label {label!r} on the series page"
    for field in ("exact", "partitions_dropped", "clamping", "pri_", "raw"):
        assert f'"{field}' not in text, field


def _render_in_chromium(page: Path, tmp_path: Path) -> Path:
    """The page as a browser draws it (the report test's way): no console message, the DOM after
    rendering holds both charts, and the screenshot is a real picture."""
    from test_reports import CHROMIUM, screenshot

    png = screenshot(page, tmp_path, "series.png")
    dom = subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", f"--user-data-dir={tmp_path / 'dom'}",
                          "--dump-dom", page.resolve().as_uri()], check=False, capture_output=True, text=True,
                         timeout=PATIENCE_S)
    assert dom.stdout.count('<figure class="series-chart">') == 2 and dom.stdout.count("<svg") == 2
    return png


def test_the_monthly_deployment_names_the_series_and_the_snapshot_rule_typed_and_described():
    import yaml

    from dprelease.flows.publication import publication_flow

    spec = yaml.safe_load((ROOT / "prefect.yaml").read_text())
    monthly = next(d for d in spec["deployments"] if d["name"] == "dp-monthly-publication")
    assert monthly["parameters"] == {"request_file": "examples/requests/visits.yaml", "series": "visits",
                                     "snapshot": "latest"}
    props = publication_flow.parameters.model_dump()["properties"]
    for name in ("request_file", "series", "snapshot"):
        assert props[name].get("description"), name
    assert props["snapshot"]["default"] == "latest" and props["snapshot"]["pattern"]


def test_the_series_page_escapes_names_and_draws_a_band_per_drawn_group(tmp_path):
    """Rendering alone (no Prefect): group names are text, never markup; each chart draws the same
    groups in the same colours, each with its interval band; the CSV neutralises formula cells."""
    from dprelease.reporting.series_page import Period, render_series_page
    from dprelease.series import _write_series_data

    rows = [{"region": "<script>alert(1)</script>", "n": 10.0, "n_ci_low": 8.0, "n_ci_high": 12.0},
            {"region": "=HYPERLINK(\"x\")", "n": 20.0, "n_ci_low": 18.0, "n_ci_high": 22.0}]
    periods = [Period(snapshot=f"2026-0{i}", release_id=f"r{i}", path=f"../../r{i}/index.html", epsilon=0.5,
                      delta=0.0, published_at="2026-01-01", approved_by="policy:p", manifest_sha256="0" * 64,
                      rows=rows) for i in (1, 2, 3)]
    budget = {"composition": "sequential", "epsilon_cap": 2.0, "epsilon_total": 1.5, "delta_total": 0.0,
              "epsilon_remaining": 0.5, "per_period": {}}
    html = render_series_page("visits", "Visits", periods, ["region"], ["n"], budget, [], 0.95, "dprelease verify x")
    assert "<script>alert" not in html and "&lt;script&gt;" in html
    assert html.count("<svg") == 1 and "sequential composition" in html and "Remaining" in html
    svg = html[html.index("<svg"):html.index("</svg>")]
    assert svg.count("<path") >= 4  # two lines and two bands at least
    _write_series_data(tmp_path, "visits", "Visits", periods, ["region"], ["n"], budget)
    assert "'=HYPERLINK" in (tmp_path / "series.csv").read_text()
    assert json.loads((tmp_path / "series.json").read_text())["periods"][0]["rows"] == rows


def test_a_run_of_several_waiting_snapshots_asks_a_controller_about_each(series_env, tmp_path):
    """A run that is not the policy's scheduled one (the UI's Run, `prefect deployment run`) asks a
    controller about each waiting snapshot, oldest first. The second snapshot's release id is
    `<run>@<label>`, and its pause key was `approval-<run>@<label>`, which Prefect refuses (a key holds
    lowercase letters, digits and dashes only): the run failed with a pydantic validation error
    instead of asking, for any label. Both are asked now, each decision bound to its own release."""
    import threading

    from test_release_flow import wait_for_approval

    from dprelease import decisions, series
    from dprelease.cli.deciding import decide
    from dprelease.flows.approvals import wait_until_paused
    from dprelease.flows.publication import publication_flow

    settings = series_env["settings"]
    platform, spec = _new_series(series_env, "wing", ["2026-01", "2026-02"], tmp_path, budget_mode="per_snapshot",
                                 epsilon_cap=EPSILON)
    key = tmp_path / "carol.pem"
    decisions.create_controller(settings, "carol", key)
    box: dict = {}

    def run():
        try:
            box["state"] = publication_flow(request_file=str(spec), series="wing", snapshot="latest",
                                            approval_timeout=PATIENCE_S, return_state=True)
        except BaseException as err:  # noqa: BLE001 - the test reads it
            box["error"] = err

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    asked = []
    for decision in ("reject", "approve"):
        rel = wait_for_approval(platform.store, set(asked), thread=thread, box=box)
        wait_until_paused(rel.flow_run_id, timeout=PATIENCE_S)
        decide(settings, rel.id, decision, key, "checked", "", timeout=PATIENCE_S)
        asked.append(rel.id)
    thread.join(PATIENCE_S)
    assert asked[1] == f"{asked[0]}@2026-02", asked
    assert [platform.store.get_release(r).status for r in asked] == ["rejected", "published"]
    # each snapshot keeps its own controller summary in the Prefect UI (one key for both showed only the newest)
    from prefect import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    from dprelease.flows.release import summary_artifact_key

    keys = [summary_artifact_key(r) for r in asked]
    assert len(set(keys)) == 2 and all(re.fullmatch(r"[a-z0-9-]+", k) for k in keys), keys
    with get_client(sync_client=True) as client:
        for rid, k in zip(asked, keys):
            found = client.read_artifacts(artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=[k])))
            assert [("@2026-02" in a.data) for a in found] == [rid.endswith("@2026-02")], (k, len(found))
    assert [p.snapshot for p in series.published_periods(platform, "wing")] == ["2026-02"]
