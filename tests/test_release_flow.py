"""The release flow on a real Prefect API (prefect_test_harness), real SQLite store, real escrow:
the platform invariants (platform.md) each with a test that fails if it breaks."""

from __future__ import annotations

import json
import os
import re
import tempfile
import threading
import time
import types
from pathlib import Path

import pytest
from patience import PATIENCE_S
from run_watchdog import wait_gone, watchdog_of

SQL = ("SELECT WITH ANONYMIZATION education, ANON_COUNT(*, 1) AS people, ANON_AVG(age, 17, 90) AS avg_age "
       "FROM adult GROUP BY education")
RAW_FRAGMENT = b"State-gov,77516,Bachelors"  # the first row of Adult as it sits in the CSV
#: its tests share one Prefect harness: one worker (tests/xdist_groups.py), 3 min or more, started first (conftest.py)
pytestmark = pytest.mark.runs_first


@pytest.fixture(scope="module")
def platform_env(tmp_path_factory):
    """A fresh home with Adult registered (cap 10) and a temporary Prefect API for the module."""
    home = tmp_path_factory.mktemp("home")
    os.environ["DPRELEASE_TEST_STARTED"] = str(time.time())
    saved = {k: os.environ.get(k) for k in ("DPRELEASE_HOME", "PREFECT_SERVER_ANALYTICS_ENABLED")}
    os.environ["DPRELEASE_HOME"] = str(home)
    os.environ["PREFECT_SERVER_ANALYTICS_ENABLED"] = "false"
    from prefect_harness import prefect_harness

    from dprelease import admin
    from dprelease.settings import Settings

    settings = Settings.from_env()
    admin.init(settings)
    data = Path(__file__).resolve().parents[1] / "examples" / "data" / "adult.csv.gz"
    admin.register_dataset(settings, "adult", data, "person_id", epsilon_cap=10, add_row_id=True,
                           risk_profile={"max_risk": 0.5})  # epsilon 1 is within this tolerance
    from dprelease import decisions

    keys = tmp_path_factory.mktemp("controller-keys")
    decisions.create_controller(settings, "alice", keys / "alice.pem")
    decisions.create_controller(settings, "bob", keys / "bob.pem")
    os.environ["DPRELEASE_TEST_CONTROLLER_KEYS"] = str(keys)
    admin.register_dataset(settings, "strict", data, "person_id", epsilon_cap=10, add_row_id=True,
                           expectations=[{"type": "expect_column_values_to_be_in_set",
                                          "kwargs": {"column": "sex", "value_set": ["Male"]}}])
    with prefect_harness():
        yield settings
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


def start_release(**params):
    """Run the flow in a thread (as a worker would); returns (thread, box with result or error)."""
    from dprelease.flows.release import outcome, release_flow

    box: dict = {}

    def run():
        try:
            box["state"] = release_flow(**{"dataset": "adult", "sql": SQL, "epsilon": 1.0,
                                           "approval_timeout": PATIENCE_S, **params}, return_state=True)
            box["result"] = outcome(box["state"])
        except BaseException as err:  # noqa: BLE001
            box["error"] = err

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, box


def wait_for_approval(store, known: set, timeout=PATIENCE_S, thread=None, box=None):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if thread is not None and not thread.is_alive():
            raise AssertionError(f"the flow ended before asking for approval: {box}")
        for rel in store.list_releases(status="awaiting_approval"):
            if rel.id not in known:
                return rel
        time.sleep(0.3)
    raise AssertionError("no release reached the approval step")


def controller_key(name="alice") -> Path:
    return Path(os.environ["DPRELEASE_TEST_CONTROLLER_KEYS"]) / f"{name}.pem"


def decide(platform_env, decision, override="", **params):
    """Start a release and answer it as the controller alice (her signed decision)."""
    from dprelease.cli.deciding import decide as send
    from dprelease.flows.approvals import wait_until_paused
    from dprelease.pipeline import Platform

    platform = Platform.open(platform_env)
    known = {r.id for r in platform.store.list_releases()}
    thread, box = start_release(**params)
    if decision is None:  # nobody answers: a short approval timeout may expire before any look sees the pause
        thread.join(PATIENCE_S)
        (rel,) = [r for r in platform.store.list_releases() if r.id not in known]
        return platform, rel, box
    rel = wait_for_approval(platform.store, known, thread=thread, box=box)
    box["watchdog"] = watchdog_of(os.getpid(), rel.id)  # the run's, started when it recorded the release
    wait_until_paused(rel.flow_run_id, timeout=PATIENCE_S)
    send(platform_env, rel.id, decision, controller_key(), "checked", override, timeout=PATIENCE_S)
    thread.join(PATIENCE_S)
    return platform, rel, box


@pytest.fixture(scope="module")
def approved(platform_env):
    """One approved release of the module's request, for the tests that only read what it published,
    archived and left (each ran its own: 2.5-3 CPU-seconds a release): the platform, the release, the
    run's box, and the dataset's budget before it and right after it."""
    from dprelease import pipeline

    before = pipeline.Platform.open(platform_env).store.budget("adult")
    platform, rel, box = decide(platform_env, "approve")
    return types.SimpleNamespace(platform=platform, rel=rel, box=box, before=before,
                                 after=platform.store.budget("adult"))


def test_approve_publishes_a_verifiable_report_and_commits_once(platform_env, approved):
    from dprelease.reporting import signing

    before, platform, rel, box = approved.before, approved.platform, approved.rel, approved.box
    assert box["result"]["status"] == "published", box
    directory = Path(box["result"]["directory"])
    assert directory.parent == platform_env.publication_dir
    report = signing.verify_directory(directory, platform_env.public_key_file)
    assert report.ok, report
    assert report.facts["approved_by"] == "alice" and report.facts["epsilon"] == pytest.approx(1.0)
    after = approved.after
    assert after["epsilon_committed"] == pytest.approx(before["epsilon_committed"] + 1.0)
    assert after["epsilon_reserved"] == pytest.approx(before["epsilon_reserved"])
    assert platform.store.get_release(rel.id).status == "published"
    assert rel.id in (platform_env.publication_dir / "index.html").read_text()
    # the controller report is signed too, and kept in the archive, never in the publication directory
    controller = platform_env.archive_dir / rel.id / "controller"
    assert signing.verify_directory(controller, platform_env.public_key_file).ok
    # whatever chose epsilon, the controller sees what it means in the risk model (dataset profile)
    assert "risk at this epsilon" in (platform_env.archive_dir / rel.id / "summary.md").read_text()
    assert "tolerable risk" in (controller / "controller.html").read_text()
    assert not list(platform_env.publication_dir.rglob("controller*"))


def test_a_run_that_completes_ends_its_watchdog_which_changes_nothing(platform_env, approved):
    """The run's hooks tell its watchdog (dprelease.flows.watchdog) that the release ended: it exits
    while the run's process lives on, leaving the release, the ledger and the run's state as they were
    (the budget as right after the release: no release of this module runs in between)."""
    from prefect import get_client

    platform, rel, box = approved.platform, approved.rel, approved.box
    assert box["result"]["status"] == "published", box
    committed = approved.after
    wait_gone(box["watchdog"], "the watchdog of a run that completed")
    assert platform.store.get_release(rel.id).status == "published"
    assert [e.status for e in platform.store.ledger_entries("adult") if e.release_id == rel.id] == ["committed"]
    assert platform.store.budget("adult") == committed and platform.store.get_lease(rel.id) is None
    with get_client(sync_client=True) as client:
        assert client.read_flow_run(rel.flow_run_id).state.is_completed()


#: labels under which the controller report shows raw-data numbers (case-insensitive)
CONTROLLER_LABELS = ("controller only", "not differentially private", "partition loss", "clamping loss",
                     "contribution bounding", "exact against released", "raw against private", "pri range",
                     "controller_only", "controller report")


def _published_text(directory: Path) -> str:
    return "\n".join(p.read_bytes().decode("utf-8", "replace") for p in sorted(directory.rglob("*")) if p.is_file())


def test_analyst_outputs_hold_no_controller_only_numbers(platform_env, approved):
    """The folder that is actually published (every file, not the renderer's output) holds no
    controller-only label, field or exact value; the controller report stays in the archive."""
    from dprelease.reporting import pages

    platform, rel, box = approved.platform, approved.rel, approved.box
    directory = Path(box["result"]["directory"])
    sealed = _sealed_result(platform, rel.id)
    published = _published_text(directory).lower() + "\n" + (platform_env.publication_dir / "index.html").read_text().lower()
    for label in CONTROLLER_LABELS:
        assert label not in published, f"controller-only label {label!r} published"
    for key in sealed.controller_only.summary():  # field names (their plain-words labels are above)
        assert "_" not in key or key.lower() not in published, key
    # the archived controller report is what a leak would look like: no published file equals it or
    # shares its controller-only section
    controller_page = (platform_env.archive_dir / rel.id / "controller" / "controller.html").read_text()
    assert "controller only" in controller_page.lower()  # the scan above looks for the right thing
    for path in directory.rglob("*"):
        if path.is_file():
            assert path.read_bytes() != controller_page.encode(), f"{path.name} is the controller report"
    # exact values: every exact aggregate of a released group, as the controller report prints it and
    # at full precision, where it differs from what was released
    exact = sealed.controller_only.exact
    released = sealed.table
    keys = list(sealed.query.group_by)
    merged = exact.merge(released[keys], on=keys)
    assert len(merged) == len(released)
    leaked = []
    for column in ("avg_age",):  # exact means have many digits: a coincidence is negligible
        for value in merged[column]:
            if round(value, 3) == value:
                continue  # a round mean (tiny group) could coincide with another number
            for shown in (f"{value:.6f}", repr(float(value))):
                if shown.lower() in published:
                    leaked.append(shown)
    assert not leaked, f"exact values published: {leaked[:5]}"
    # what is published is the sealed DP result itself (not the exact values in its place)
    import pandas as pd

    pd.testing.assert_frame_equal(pd.read_csv(directory / "results.csv"), released.reset_index(drop=True),
                                  check_dtype=False)
    page = (directory / "index.html").read_text()
    assert all(pages.fmt_number(v) in page for v in released["avg_age"])
    assert pages.fmt_number(merged["avg_age"].iloc[0]) in controller_page  # the controller does see them


def _sealed_result(platform, release_id):
    import pickle

    from cryptography.fernet import Fernet

    from dprelease import pipeline

    blob = pipeline.sealed_path(platform, release_id).read_bytes()
    return pickle.loads(Fernet(platform.escrow_key()).decrypt(blob))[1]


def test_reject_publishes_nothing_and_refunds(platform_env):
    from dprelease import pipeline
    from dprelease.flows.outcomes import is_rejected

    before = pipeline.Platform.open(platform_env).store.budget("adult")
    platform, rel, box = decide(platform_env, "reject")
    assert box["result"]["status"] == "rejected"
    assert box["state"].name == "Rejected" and is_rejected(box["state"])  # not "Completed": told apart
    assert not (platform_env.publication_dir / rel.id).exists()
    after = platform.store.budget("adult")
    assert after["epsilon_committed"] == before["epsilon_committed"] and after["epsilon_reserved"] == before["epsilon_reserved"]
    assert platform.store.ledger_entry(rel.id).status == "refunded"
    assert platform.store.get_release(rel.id).status == "rejected"


def test_timeout_expires_refunds_and_fails(platform_env):
    platform, rel, box = decide(platform_env, None, approval_timeout=3)
    assert "error" in box  # the run ends Failed when nobody answers
    assert platform.store.get_release(rel.id).status == "expired"
    assert platform.store.ledger_entry(rel.id).status == "refunded"
    assert not (platform_env.publication_dir / rel.id).exists()


def test_failing_data_checks_spend_and_publish_nothing(platform_env):
    from dprelease import pipeline

    platform = pipeline.Platform.open(platform_env)
    before = platform.store.budget("strict")
    thread, box = start_release(dataset="strict", sql=SQL.replace("FROM adult", "FROM strict"))
    thread.join(PATIENCE_S)
    assert "error" in box and "Data checks FAILED" in str(box["error"])
    assert "expect_column_values_to_be_in_set [sex]" in str(box["error"])
    assert platform.store.budget("strict") == before
    failed = [r for r in platform.store.list_releases(status="failed") if r.dataset == "strict"]
    assert failed and not (platform_env.publication_dir / failed[-1].id).exists()


def test_a_fixed_epsilon_beyond_the_remaining_budget_is_refused_before_the_data_is_read(platform_env):
    """The strict dataset's data checks fail: a release asking more than its cap (10) is refused for
    the budget, so its data was never decrypted nor checked; nothing reserved, the release failed."""
    from dprelease import pipeline

    platform = pipeline.Platform.open(platform_env)
    before = platform.store.budget("strict")
    thread, box = start_release(dataset="strict", sql=SQL.replace("FROM adult", "FROM strict"), epsilon=10.5)
    thread.join(PATIENCE_S)
    assert "error" in box and str(box["error"]).startswith("budget: budget exceeded for dataset 'strict'"), box
    assert "Data checks" not in str(box["error"])
    assert platform.store.budget("strict") == before
    failed = [r for r in platform.store.list_releases(status="failed") if r.dataset == "strict"]
    assert failed[-1].decision_comment.startswith("budget: budget exceeded")


def test_an_aggregate_of_a_text_column_is_refused_by_the_flows_plan_before_the_data_is_read(platform_env):
    """A flow started without the CLI's preflight (the Prefect UI's run form, a deployment) refuses an
    average of a text column at its data-free plan step, with the engine's words: the strict
    dataset's data checks (which would fail) never ran, nothing was reserved, no ledger entry."""
    from dprelease import pipeline

    platform = pipeline.Platform.open(platform_env)
    before = platform.store.budget("strict")
    entries = len(platform.store.ledger_entries("strict"))
    sql = ("SELECT WITH ANONYMIZATION sex, ANON_AVG(level, 0, 1) AS v FROM (SELECT person_id, sex, education AS "
           "level FROM strict) GROUP BY sex")
    thread, box = start_release(dataset="strict", sql=sql, epsilon=1.0)
    thread.join(PATIENCE_S)
    assert "error" in box and "aggregate 'v' needs a numeric column, but 'level' has type VARCHAR" in str(box["error"])
    assert "Data checks" not in str(box["error"])
    assert platform.store.budget("strict") == before
    assert len(platform.store.ledger_entries("strict")) == entries
    failed = [r for r in platform.store.list_releases(status="failed") if r.dataset == "strict"]
    assert "has type VARCHAR" in failed[-1].decision_comment


def test_noise_is_drawn_once_per_release(platform_env):
    """A retried or resumed compute step returns the sealed numbers, byte for byte."""
    from dprelease import pipeline
    from dprelease.requests import parse_request

    platform = pipeline.Platform.open(platform_env)
    request = parse_request({"dataset": "adult", "sql": SQL, "epsilon": 1.0})
    planned = pipeline.plan(platform, request)
    decision = pipeline.choose_epsilon(platform, planned)
    first = pipeline.compute_sealed(platform, "replay-test", planned, decision)
    sealed = pipeline.sealed_path(platform, "replay-test").read_bytes()
    again = pipeline.compute_sealed(platform, "replay-test", planned, decision)
    assert first.table.to_csv() == again.table.to_csv()
    assert pipeline.sealed_path(platform, "replay-test").read_bytes() == sealed
    fresh = pipeline.compute_sealed(platform, "another-release", planned, decision)
    assert fresh.table.to_csv() != first.table.to_csv()  # a new release draws new noise
    other = pipeline.plan(platform, parse_request({"dataset": "adult", "sql": SQL, "epsilon": 2.0}))
    with pytest.raises(pipeline.ReleaseError, match="sealed for another request"):
        pipeline.compute_sealed(platform, "replay-test", other, pipeline.choose_epsilon(platform, other))


def test_prefect_caches_the_compute_task_by_release_id(platform_env):
    from prefect import flow

    from dprelease import pipeline
    from dprelease.requests import parse_request
    from dprelease.tasks import release_steps as steps

    platform = pipeline.Platform.open(platform_env)
    planned = pipeline.plan(platform, parse_request({"dataset": "adult", "sql": SQL, "epsilon": 1.0}))
    decision = pipeline.choose_epsilon(platform, planned)

    @flow
    def twice():
        a = steps.compute(platform_env, "cache-test", planned, decision, return_state=True)
        b = steps.compute(platform_env, "cache-test", planned, decision, return_state=True)
        return a, b

    a, b = twice()
    assert b.name == "Cached" and b.result() == a.result()


def test_twenty_concurrent_releases_never_commit_more_than_the_cap(platform_env):
    """20 releases of epsilon 0.5 at once on a fresh dataset whose cap (5) allows 10."""
    from dprelease import admin, pipeline
    from dprelease.requests import parse_request

    data = Path(__file__).resolve().parents[1] / "examples" / "data" / "adult.csv.gz"
    admin.register_dataset(platform_env, "race", data, "person_id", epsilon_cap=5.0, add_row_id=True)
    request = parse_request({"dataset": "race", "sql": SQL.replace("FROM adult", "FROM race"), "epsilon": 0.5})
    barrier = threading.Barrier(20)
    outcomes: list[str] = []

    def one(i):
        platform = pipeline.Platform.open(platform_env)
        planned = pipeline.plan(platform, request)
        decision = pipeline.choose_epsilon(platform, planned)
        barrier.wait()
        try:
            pipeline.reserve(platform, f"race-{i}", "race", decision.epsilon, planned.query.delta)
        except pipeline.ReleaseError:
            outcomes.append("refused")
            return
        result = pipeline.compute_sealed(platform, f"race-{i}", planned, decision)
        platform.store.add_release("race", request.to_json(), release_id=f"race-{i}")
        pipeline.publish(platform, f"race-{i}", planned, decision, result, "alice")
        outcomes.append("published")

    threads = [threading.Thread(target=one, args=(i,)) for i in range(20)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(PATIENCE_S)
    budget = pipeline.Platform.open(platform_env).store.budget("race")
    assert outcomes.count("published") == 10 and outcomes.count("refused") == 10
    assert budget["epsilon_committed"] == pytest.approx(5.0) and budget["epsilon_reserved"] == 0


def test_no_plaintext_copy_of_the_dataset_on_disk(platform_env, tmp_path_factory):
    """Invariant 6: after all the runs above, no file under the home or the Prefect home, nor any
    file written to the temporary directory since the module started, holds a row of the raw data.
    Other tests' own folders (pytest's, under the temporary directory) are skipped there: their
    source files are plaintext on purpose (e.g. an external dataset's lake); this home is scanned."""
    started = float(os.environ["DPRELEASE_TEST_STARTED"])
    prefect_home = os.environ.get("PREFECT_HOME")
    base = tmp_path_factory.getbasetemp().resolve()
    tests_own = next((p for p in (base, *base.parents) if p.name.startswith("pytest-of-")), base)
    roots = [(platform_env.home, 0.0), (Path(prefect_home) if prefect_home else Path.home() / ".prefect", 0.0),
             (Path(tempfile.gettempdir()), started)]
    for root, since in roots:
        for path in _files_under(root):
            try:
                if since and path.resolve().is_relative_to(tests_own):
                    continue
                if not path.is_file() or path.stat().st_size > 50_000_000 or path.stat().st_mtime < since:
                    continue
                data = path.read_bytes()
            except OSError:
                continue
            assert RAW_FRAGMENT not in data, path  # a CSV copy
            assert not (data.startswith(b"PAR1") and b"Bachelors" in data), path  # a Parquet copy
    blobs = list(platform_env.escrow_dir.iterdir())
    assert blobs and all(b.suffix == ".escrow" for b in blobs)


def _files_under(root: Path):
    """Every file below `root`, as the walk finds them: a folder another process removes meanwhile
    (a Spark test's block manager under /tmp) is skipped, not an error."""
    for folder, _, names in os.walk(root, onerror=lambda err: None):
        for name in names:
            yield Path(folder) / name


def _scheduled_and_manual_runs(spec: Path):
    """A deployment of the publication flow with a schedule, one run created by that schedule (the
    server's scheduler endpoint) and one created on demand from the same deployment."""
    from datetime import timedelta

    from prefect import get_client
    from prefect.client.schemas.actions import DeploymentScheduleCreate
    from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterId
    from prefect.client.schemas.schedules import IntervalSchedule

    with get_client(sync_client=True) as client:
        flow_id = client.create_flow_from_name("dp-scheduled-publication")
        deployment_id = client.create_deployment(
            flow_id=flow_id, name="dp-monthly-publication", parameters={"request_file": str(spec)},
            schedules=[DeploymentScheduleCreate(schedule=IntervalSchedule(interval=timedelta(seconds=1)))])
        client._client.post(f"/deployments/{deployment_id}/schedule", json={"max_runs": 1}).raise_for_status()
        runs = client.read_flow_runs(deployment_filter=DeploymentFilter(id=DeploymentFilterId(any_=[deployment_id])))
        scheduled = next(r for r in runs if r.auto_scheduled)
        manual = client.create_flow_run_from_deployment(deployment_id, parameters={"request_file": str(spec)})
    assert scheduled.created_by.type == "SCHEDULE" and not manual.auto_scheduled
    return scheduled, manual


def test_only_scheduled_runs_of_the_named_deployment_are_approved_automatically(platform_env, tmp_path):
    """The scheduled run of the deployment a standing auto policy names publishes by itself; a run
    of the same deployment started on demand waits for a controller (and is rejected here)."""
    from prefect.flow_engine import run_flow

    from dprelease import admin, decisions, pipeline
    from dprelease.cli.deciding import decide as send
    from dprelease.flows.approvals import wait_until_paused
    from dprelease.flows.publication import publication_flow
    from dprelease.flows.release import outcome
    from dprelease.reporting import signing

    data = Path(__file__).resolve().parents[1] / "examples" / "data" / "adult.csv.gz"
    admin.register_dataset(platform_env, "monthly", data, "person_id", epsilon_cap=10, add_row_id=True)
    platform = pipeline.Platform.open(platform_env)
    spec = tmp_path / "monthly.yaml"
    spec.write_text("dataset: monthly\ntitle: monthly\nsql: |\n  SELECT WITH ANONYMIZATION sex, ANON_COUNT(*, 1) AS n "
                    "FROM monthly GROUP BY sex\nepsilon: 0.1\n")
    platform.store.add_policy("monthly", "monthly", max_epsilon_per_release=0.1, approval="auto",
                              deployment="dp-monthly-publication")
    scheduled, manual = _scheduled_and_manual_runs(spec)
    out = run_flow(publication_flow, flow_run=scheduled, parameters={"request_file": str(spec)})
    assert out["status"] == "published"
    report = signing.verify_directory(Path(out["directory"]), platform_env.public_key_file)
    assert report.ok and report.facts["approved_by"] == "policy:monthly"
    (entry,) = decisions.recorded(platform_env, out["release_id"])
    assert entry["controller"] == "policy:monthly" and "dp-monthly-publication" in entry["reason"]

    known = {r.id for r in platform.store.list_releases()}
    box: dict = {}
    thread = threading.Thread(target=lambda: box.update(result=outcome(run_flow(
        publication_flow, flow_run=manual, parameters={"request_file": str(spec)}, return_type="state"))),
        daemon=True)
    thread.start()
    rel = wait_for_approval(platform.store, known, thread=thread, box=box)
    wait_until_paused(rel.flow_run_id, timeout=PATIENCE_S)
    send(platform_env, rel.id, "reject", controller_key(), "on demand: not this month", timeout=PATIENCE_S)
    thread.join(PATIENCE_S)
    assert box["result"]["status"] == "rejected"
    assert not (platform_env.publication_dir / rel.id).exists()

    # the UI's Retry of either run (the release is its subflow): it ends at once, nothing run again
    from prefect import get_client
    from prefect.states import AwaitingRetry

    for run, expected in ((scheduled, "is already published at"), (manual, "was rejected by alice")):
        before, releases = _ledger_rows(platform), len(platform.store.list_releases())
        with get_client(sync_client=True) as client:
            assert client.set_flow_run_state(run.id, AwaitingRetry(message="Retry from the UI")).status.value == "ACCEPT"
            again = client.read_flow_run(run.id)
        state = run_flow(publication_flow, flow_run=again, parameters={"request_file": str(spec)}, return_type="state")
        said = state.message or ""
        assert expected in said and "This retry ran nothing again" in said, (state, _ledger_rows(platform))
        assert _ledger_rows(platform) == before and len(platform.store.list_releases()) == releases


def test_deployments_in_prefect_yaml_point_at_flows_with_typed_forms(monkeypatch):
    """Each entrypoint loads as a worker loads it (Prefect's loader, from the directory the pull step
    sets: the repository's root), and is the flow its module dprelease.flows.* defines."""
    import importlib

    import yaml
    from prefect.flows import load_flow_from_entrypoint

    root = Path(__file__).resolve().parents[1]
    spec = yaml.safe_load((root / "prefect.yaml").read_text())
    names = {d["name"]: d for d in spec["deployments"]}
    assert set(names) == {"dp-release", "dp-monthly-publication"}
    assert names["dp-monthly-publication"]["schedules"][0]["cron"] == "0 6 1 * *"
    monkeypatch.chdir(root)
    for d in spec["deployments"]:
        path, func = d["entrypoint"].split(":")
        flow_obj = load_flow_from_entrypoint(d["entrypoint"], use_placeholder_flow=False)
        defined = getattr(importlib.import_module("dprelease." + path.replace("/", ".").removesuffix(".py")), func)
        assert flow_obj.name == defined.name
        props = flow_obj.parameters.model_dump()["properties"]
        assert set(d["parameters"]) <= set(props) and props == defined.parameters.model_dump()["properties"]
    release_props = names["dp-release"]
    assert release_props["work_pool"]["name"] == "dprelease-pool"


def test_release_flow_never_auto_approves_and_later_steps_never_recompute(platform_env):
    """A standing auto policy approves schedules only: an on-demand release with every form field
    set as a user could still waits for the controller. And after the compute step, a missing
    seal is an error, not a new draw."""
    from dprelease import pipeline
    from dprelease.flows.release import release_flow
    from dprelease.requests import parse_request

    props = release_flow.parameters.model_dump()["properties"]
    assert not {"auto_approve_policy", "require_policy", "poll_interval"} & set(props)
    platform = pipeline.Platform.open(platform_env)
    platform.store.add_policy("auto-any", "adult", max_epsilon_per_release=5.0, approval="auto",
                              deployment="dp-release")
    every_field = {"title": "all fields", "delta": 1e-6, "max_partitions_contributed": 1, "requested_by": "mallory",
                   "approval_timeout": PATIENCE_S}
    platform, rel, box = decide(platform_env, "reject", **every_field)
    assert box["result"]["status"] == "rejected"  # it paused and the controller decided
    planned = pipeline.plan(platform, parse_request({"dataset": "adult", "sql": SQL, "epsilon": 1.0}))
    decision = pipeline.choose_epsilon(platform, planned)
    with pytest.raises(pipeline.ReleaseError, match="no sealed result"):
        pipeline.open_sealed(platform, "never-computed", planned, decision)


def test_publication_is_staged_and_shows_only_a_keyed_fingerprint(platform_env, approved):
    platform, box = approved.platform, approved.box
    directory = Path(box["result"]["directory"])
    assert not list(platform_env.publication_dir.glob(".staging-*")) and not list(platform_env.publication_dir.glob(".old-*"))
    raw_fingerprint = platform.store.get_dataset("adult").fingerprint
    text = "".join(p.read_text(errors="ignore") for p in directory.rglob("*") if p.is_file())
    assert raw_fingerprint not in text
    assert (platform_env.publication_dir / "public_key.pem").read_bytes() == platform_env.public_key_file.read_bytes()


def test_epsilon_chosen_by_the_pri_in_public_mode(platform_env):
    from dprelease import admin
    from dprelease.reporting import signing

    data = Path(__file__).resolve().parents[1] / "examples" / "data" / "adult.csv.gz"
    admin.register_dataset(platform_env, "fresh", data, "person_id", epsilon_cap=10, add_row_id=True)
    # a fresh dataset (the odometer only lets candidates above what is spent through) whose cap
    # keeps the whole grid: the search then stops at 2 in the median, the spec's figure
    sql = "SELECT WITH ANONYMIZATION ANON_COUNT(*, 1) AS people FROM fresh WHERE age > 60"
    platform, rel, box = decide(platform_env, "approve", dataset="fresh", sql=sql, epsilon={"pri": {"p": 50}},
                                override="the spec's figure, accepted for the test")
    report = signing.verify_directory(Path(box["result"]["directory"]), platform_env.public_key_file)
    assert report.ok and report.facts["epsilon_mode"] == "pri"
    assert report.facts["epsilon"] == pytest.approx(2.0)  # the spec's figure for a count at p = 50
    text = (Path(box["result"]["directory"]) / "index.html").read_text()
    assert "end to end" in text  # the guarantee of public mode is stated to the analyst


def _refusals(platform_env, release_id) -> int:
    from dprelease import decisions

    path = platform_env.archive_dir / release_id / decisions.REFUSED_FILE
    return len(path.read_text().splitlines()) if path.exists() else 0


def _send_raw(platform_env, rel, token, decision="approve", reviewer="alice"):
    """Resume the paused run with a hand-made answer, as anyone with the console could; wait
    until the run has refused it and paused again."""
    from dprelease.flows.approvals import answer, looks, wait_until_paused

    before = _refusals(platform_env, rel.id)
    answer(rel.flow_run_id, decision, reviewer, "", signed_decision=token, timeout=PATIENCE_S)
    for _ in looks(PATIENCE_S, 0.05, 0.5):
        if _refusals(platform_env, rel.id) != before:
            break
    assert _refusals(platform_env, rel.id) == before + 1
    wait_until_paused(rel.flow_run_id, timeout=PATIENCE_S)
    assert_refusal_shown(platform_env, rel)


def assert_refusal_shown(platform_env, rel) -> None:
    """The last refusal is on the run's page (its artifact refused-<release>) by the time the run
    is Paused again, and at the top of the next Resume dialog: not only in the logs."""
    from prefect import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey, FlowRunFilter, FlowRunFilterId

    from dprelease import decisions
    from dprelease.cli.interactive import _pause_description
    from dprelease.flows.release import refusal_artifact_key

    path = platform_env.archive_dir / rel.id / decisions.REFUSED_FILE
    why = json.loads(path.read_text().splitlines()[-1])["why"]
    with get_client(sync_client=True) as client:
        shown = client.read_artifacts(
            artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=[refusal_artifact_key(rel.id)])),
            flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[rel.flow_run_id])))
    assert any(why in str(a.data) for a in shown), (why, [a.data for a in shown])
    dialog = _pause_description(rel.flow_run_id)
    assert dialog.index("Your last decision was refused") < dialog.index("The controller summary is below")
    assert why.split(" (")[0] in dialog


def test_only_a_registered_controllers_signed_decision_publishes(platform_env, tmp_path):
    """No identity, another controller's identity, an analyst's key: refused, nothing published,
    the run still waits; then alice's signed decision publishes and the archive records it."""
    from prefect.flow_runs import resume_flow_run

    from dprelease import decisions, pipeline
    from dprelease.cli.deciding import decide as send
    from dprelease.flows.approvals import wait_until_paused
    from dprelease.reporting import signing

    platform = pipeline.Platform.open(platform_env)
    known = {r.id for r in platform.store.list_releases()}
    thread, box = start_release(approval_timeout=PATIENCE_S, title="Education, checked by alice")
    rel = wait_for_approval(platform.store, known, thread=thread, box=box)
    wait_until_paused(rel.flow_run_id, timeout=PATIENCE_S)
    # the paused run says an approval is waiting, links the summary, previews the accuracy
    from prefect import get_client

    from dprelease.cli.interactive import _pause_description

    message = _pause_description(rel.flow_run_id)
    assert "An approval is waiting" in message and "/artifacts/key/release-" in message
    assert "Accuracy preview" in message and "before any budget is spent" in message
    from dprelease.flows.release import preview_text

    preview = preview_text(rel.id)  # its intervals' "±" and dashes, as the terminal shows them (not "Â±")
    assert "±" in preview and preview in message
    with get_client(sync_client=True) as client:
        assert client.read_flow_run(rel.flow_run_id).name == "Education, checked by alice"
    # no identity: the form refuses a missing signature and a blank reviewer
    with pytest.raises(RuntimeError, match="Cannot resume"):
        resume_flow_run(rel.flow_run_id, run_input={"decision": "approve", "reviewer": "alice", "comment": ""})
    with pytest.raises(RuntimeError, match="Cannot resume"):
        resume_flow_run(rel.flow_run_id, run_input={"decision": "approve", "reviewer": " ", "comment": "",
                                                     "signed_decision": "x"})
    _send_raw(platform_env, rel, "approved, trust me")  # a token that is no signature at all
    # another controller's identity: a decision naming alice, signed with bob's key
    context = decisions.read_context(platform_env, rel.id)
    forged = decisions.Decision(release_id=rel.id, question=context["question"], decision="approve",
                                controller="alice", report_fingerprint=context["report_fingerprint"],
                                decided_at=pipeline.now())
    _send_raw(platform_env, rel, decisions.sign(forged, signing.load_private_key(controller_key("bob"))))
    # an analyst: their own key, registered nowhere
    signing.generate_keypair(tmp_path / "ana.pem", tmp_path / "ana.pub.pem")
    with pytest.raises(decisions.DecisionRefused, match="no registered controller"):
        send(platform_env, rel.id, "approve", tmp_path / "ana.pem", timeout=PATIENCE_S)
    as_ana = decisions.Decision(**{**forged.__dict__, "controller": "ana"})
    _send_raw(platform_env, rel, decisions.sign(as_ana, signing.load_private_key(tmp_path / "ana.pem")), reviewer="ana")
    refused = (platform_env.archive_dir / rel.id / decisions.REFUSED_FILE).read_text()
    assert "does not verify with the registered key of 'alice'" in refused and "not a registered controller" in refused
    assert not (platform_env.publication_dir / rel.id).exists()
    assert platform.store.get_release(rel.id).status == "awaiting_approval"
    assert platform.store.ledger_entry(rel.id).status == "reserved"
    # alice decides
    send(platform_env, rel.id, "approve", controller_key("alice"), "numbers look right", timeout=PATIENCE_S)
    thread.join(PATIENCE_S)
    assert box["result"]["status"] == "published", box
    (entry,) = decisions.recorded(platform_env, rel.id)
    assert entry["controller"] == "alice" and entry["decision"] == "approve" and entry["reason"] == "numbers look right"
    assert entry["report_fingerprint"] == decisions.report_fingerprint(platform_env, rel.id) and entry["decided_at"]
    assert platform.store.get_release(rel.id).decision_by == "alice"
    from dprelease.flows import approvals

    assert rel.id not in approvals._awaiting_here  # a process that runs many flows keeps no event of this one


def test_a_pause_s_event_forgotten_late_never_takes_the_next_wait_s():
    """The utility command decides three times for one release: its next wait may take a new event
    before the flow's thread forgets the one it set for the pause just answered. Each side forgets
    only its own event, so the next pause still wakes the command at once."""
    from dprelease.flows import approvals

    release = "utility-release"
    first = approvals.awaiting_here(release)  # the flow asks (the command waits on the same event)
    first.set()
    approvals.forget_awaiting(release, first)  # the command got its answer in and stops waiting
    second = approvals.awaiting_here(release)  # the command waits for the next decision at once
    approvals.forget_awaiting(release, first)  # only then does the flow's first pause end
    assert approvals.awaiting_here(release) is second  # the flow's next ask sets what the command waits on
    approvals.forget_awaiting(release, second)
    assert release not in approvals._awaiting_here


def test_risk_above_tolerance_needs_an_override_with_a_reason(platform_env):
    """The default profile tolerates 0.2; epsilon 1 gives about 0.31: the summary says so in
    words, approving without an override is refused, with one the reason is archived."""
    from dprelease import admin, decisions, pipeline
    from dprelease.cli.deciding import decide as send
    from dprelease.flows.approvals import wait_until_paused

    data = Path(__file__).resolve().parents[1] / "examples" / "data" / "adult.csv.gz"
    admin.register_dataset(platform_env, "risky", data, "person_id", epsilon_cap=10, add_row_id=True)
    platform = pipeline.Platform.open(platform_env)
    known = {r.id for r in platform.store.list_releases()}
    thread, box = start_release(dataset="risky", sql=SQL.replace("FROM adult", "FROM risky"))
    rel = wait_for_approval(platform.store, known, thread=thread, box=box)
    wait_until_paused(rel.flow_run_id, timeout=PATIENCE_S)
    summary = (platform_env.archive_dir / rel.id / "summary.md").read_text()
    assert summary.startswith("**WARNING: above your tolerable risk.**")
    assert "(above your tolerable 0.2)" in summary and "low;" not in summary  # 0.31 is not called low
    controller_html = (platform_env.archive_dir / rel.id / "controller" / "controller.html").read_text()
    assert "risk-above" in controller_html and "WARNING: above your tolerable risk" in controller_html
    assert_risk_dialog_says_it_once(rel)
    assert_warned_before_reserving(platform, rel)
    with pytest.raises(decisions.DecisionRefused, match="override"):
        send(platform_env, rel.id, "approve", controller_key(), "fine", timeout=PATIENCE_S)
    # a decision signed without the override (bypassing the CLI's check) is refused by the run
    context = decisions.read_context(platform_env, rel.id)
    from dprelease.reporting import signing

    bare = decisions.Decision(release_id=rel.id, question=context["question"], decision="approve", controller="alice",
                              report_fingerprint=context["report_fingerprint"], decided_at=pipeline.now())
    _send_raw(platform_env, rel, decisions.sign(bare, signing.load_private_key(controller_key())))
    assert not (platform_env.publication_dir / rel.id).exists()
    send(platform_env, rel.id, "approve", controller_key(), "fine", "aggregate table, recipient under contract",
         timeout=PATIENCE_S)
    thread.join(PATIENCE_S)
    assert box["result"]["status"] == "published", box
    (entry,) = decisions.recorded(platform_env, rel.id)
    assert entry["risk_override"] == "aggregate table, recipient under contract"


def assert_warned_before_reserving(platform, rel) -> None:
    """A fixed epsilon above the tolerable risk is said on the run's page (artifact risk-<release>)
    before its budget is reserved, not first at the approval."""
    from prefect import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    with get_client(sync_client=True) as client:
        (warning,) = client.read_artifacts(
            artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=[f"risk-{rel.id[:12].lower()}"])))
    assert "WARNING: above your tolerable risk" in warning.data and str(warning.flow_run_id) == rel.flow_run_id
    reserved_at = platform.store.ledger_entry(rel.id).created_at
    assert warning.created <= reserved_at.replace(tzinfo=warning.created.tzinfo), (warning.created, reserved_at)


def assert_risk_dialog_says_it_once(rel) -> None:
    """The Resume dialog warns once, in words (no symbol a font may lack), and its instruction to
    override names only what exists: the form's Signed Decision field and `decision sign`'s option."""
    import re

    from typer.testing import CliRunner

    from dprelease.cli.app import app
    from dprelease.cli.interactive import _pause_description
    from dprelease.flows.release import ReleaseDecision

    dialog = _pause_description(rel.flow_run_id)
    assert dialog.count("above your tolerable risk") == 1, dialog
    assert all(ord(ch) < 0x2190 or ch in "±–—→…" for ch in dialog), sorted({ch for ch in dialog if ord(ch) >= 0x2190})
    shown_as = ReleaseDecision.model_json_schema()["properties"]["signed_decision"]["title"]  # the UI's label
    assert f"paste into {shown_as} the output of" in dialog, dialog
    named = set(re.findall(r"--[a-z][a-z-]+", dialog))
    sign_help = CliRunner().invoke(app, ["decision", "sign", "--help"], terminal_width=200).output
    approve_help = CliRunner().invoke(app, ["approve", "--help"], terminal_width=200).output
    assert named and all(option in sign_help or option in approve_help for option in named), named
    assert "--override-risk" in sign_help


def test_risk_model_fields_left_registered_are_the_datasets_profile(platform_env):
    """The run form's default for trust, sensitivity and max_risk is `registered`: the chosen
    dataset's registered risk profile (adult here: trust low, sensitivity medium, max_risk 0.5),
    the same as giving those values; a value given wins; a dataset without one says so."""
    from dprelease import pipeline
    from dprelease.requests import parse_request

    platform = pipeline.Platform.open(platform_env)

    def request(**risk):
        return parse_request({"dataset": "adult", "sql": SQL, "epsilon": {"risk": {"max_noise": 10, "n": 16, **risk}}})

    registered = {"trust": "low", "sensitivity": "medium", "max_risk": 0.5}
    for left in ({}, {"trust": "registered"}, {"trust": "registered", "sensitivity": "registered",
                                                "max_risk": "registered"}):
        assert {k: v for k, v in pipeline.risk_fields(platform, request(**left)).items() if k in registered} == registered
    assert pipeline.risk_fields(platform, request(trust="high"))["trust"] == "high"
    by_default = pipeline.choose_epsilon(platform, pipeline.plan(platform, request()))
    given = pipeline.choose_epsilon(platform, pipeline.plan(platform, request(**registered)))
    assert by_default.epsilon == given.epsilon and by_default.risk_choice.risk == given.risk_choice.risk


def test_the_run_form_offers_the_registered_datasets_and_their_profiles(platform_env, tmp_path):
    """`dprelease refresh-form` writes the protected datasets (never a public table) into the
    dp-release deployment's form as a list, with each one's registered risk profile beside the
    fields that default to it; a later `dataset register` updates the list by itself."""
    from prefect import get_client
    from typer.testing import CliRunner

    from dprelease.cli.app import app
    from dprelease.flows.release import release_flow

    with get_client(sync_client=True) as client:
        deployment_id = client.create_deployment(flow_id=client.create_flow_from_name(release_flow.name),
                                                 name="dp-release", parameter_openapi_schema=release_flow.parameters.model_dump())

    def form():
        with get_client(sync_client=True) as client:
            return client.read_deployment(deployment_id).parameter_openapi_schema

    levels = tmp_path / "levels.csv"
    levels.write_text("education,level\nBachelors,3\n")
    runner = CliRunner()
    assert runner.invoke(app, ["dataset", "register", "levels", str(levels), "--public"]).exit_code == 0
    result = runner.invoke(app, ["refresh-form"])
    assert result.exit_code == 0 and "run form of dp-release" in result.output, result.output
    offered = form()["properties"]["dataset"]["enum"]
    assert {"adult", "strict"} <= set(offered) and "levels" not in offered and offered == sorted(offered)
    max_risk = form()["definitions"]["RiskEpsilon"]["properties"]["max_risk"]
    assert max_risk["default"] == "registered" and "adult: 0.5" in max_risk["description"]
    sample = tmp_path / "people.csv"
    sample.write_text("person_id,age\n1,30\n2,40\n")
    result = runner.invoke(app, ["dataset", "register", "people", str(sample), "--unit", "person_id",
                                 "--epsilon-cap", "1", "--trust", "high"])
    assert result.exit_code == 0, result.output
    assert "people" in form()["properties"]["dataset"]["enum"]
    assert "people: high" in form()["definitions"]["RiskEpsilon"]["properties"]["trust"]["description"]


@pytest.mark.parametrize("tolerable", [0.05, 0.2, 0.3, 0.5, 0.79])
def test_a_risk_above_the_tolerable_one_is_never_called_low(tolerable):
    """Every summary line that states a risk uses one wording (dp_core.risk.risk_words): a level
    name only when within the tolerable risk, never "low" for a risk above it."""
    from dp_core import risk
    from dprelease import decisions

    for rk in [i / 100 for i in range(0, 100)]:
        words = risk.risk_words(rk, tolerable)
        notice = decisions.risk_notice({"risk": rk, "max_risk": tolerable}, "R")
        if rk > tolerable:
            assert words == f"{rk:.2f} (above your tolerable {tolerable:g})"
            assert not any(level in words + notice for level in risk.LEVELS), (words, notice)
        else:
            assert words == f"{rk:.2f} ({risk.level_name(rk)}; within your tolerable {tolerable:g})"


def run_as_worker(params: dict, box: dict, flow_run=None):
    """A run of the dp-release deployment (the UI's Retry needs one) executed as a worker executes
    it (prefect.engine: run_flow with the run's logger as error_logger, its return value resolved
    from the final state), in a thread; box gets the run and its final state read from the API."""
    from prefect import get_client
    from prefect.flow_engine import flow_run_logger, run_flow
    from prefect_console import deploy_release_flow

    from dprelease.flows.release import release_flow

    with get_client(sync_client=True) as client:
        run = flow_run or client.create_flow_run_from_deployment(deploy_release_flow(), parameters=params)
    box["run"] = run

    def work():
        try:
            run_flow(release_flow, flow_run=run, parameters=params, error_logger=flow_run_logger(run))
        except BaseException as err:  # noqa: BLE001 - the test reads it
            box["error"] = err
        with get_client(sync_client=True) as client:
            box["state"] = client.read_flow_run(run.id).state

    thread = threading.Thread(target=work, daemon=True)
    thread.start()
    return thread


def run_logs(flow_run_id) -> list:
    """The run's logs as the Prefect API holds them (the UI's log tab), after this process sent them."""
    from prefect import get_client
    from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId
    from prefect_console import drain_prefect_workers

    drain_prefect_workers()
    with get_client(sync_client=True) as client:
        return client.read_logs(LogFilter(flow_run_id=LogFilterFlowRunId(any_=[flow_run_id])))


WORKER_PARAMS = {"dataset": "adult", "sql": SQL, "epsilon": {"epsilon": 1.0}, "approval_timeout": 60}  # as the form sends


def worker_release(platform_env, decision, **params):
    """A release run as a worker runs it, answered by alice (or left to expire when decision is None)."""
    from dprelease.cli.deciding import decide as send
    from dprelease.flows.approvals import wait_until_paused
    from dprelease.pipeline import Platform

    platform = Platform.open(platform_env)
    box: dict = {}
    thread = run_as_worker({**WORKER_PARAMS, **params}, box)
    if decision is not None:  # an expiring run is left alone: its short pause may end before anyone sees it
        rel = wait_for_approval(platform.store, {r.id for r in platform.store.list_releases()}, thread=thread, box=box)
        wait_until_paused(rel.flow_run_id, timeout=PATIENCE_S)
        send(platform_env, rel.id, decision, controller_key(), "checked")
    thread.join(PATIENCE_S)
    assert not thread.is_alive()
    return platform, box


def test_a_rejected_run_ends_rejected_without_a_traceback_through_the_api(platform_env):
    """Issue 35: a worker's rejected run logged `TypeError: Unexpected result for failed state`. Its
    final state, read back from the API, is named Rejected, is not a failure (nor a publication to
    any reader), and its logs hold no error and no traceback; the budget is refunded."""
    from dprelease.flows.outcomes import is_rejected, outcome, stored_outcome

    platform, box = worker_release(platform_env, "reject")
    run, state = box["run"], box["state"]
    assert "error" not in box, box
    assert state.name == "Rejected" and state.type.value == "COMPLETED" and is_rejected(state)
    assert "rejected by alice" in state.message
    assert outcome(state, stored=lambda: stored_outcome(platform, str(run.id))) == {
        "release_id": str(run.id), "status": "rejected"}
    logs = run_logs(run.id)
    assert logs and not [log.message for log in logs if log.level >= 40 or "Traceback" in log.message
                         or "TypeError" in log.message]
    assert platform.store.get_release(str(run.id)).status == "rejected"
    assert platform.store.ledger_entry(str(run.id)).status == "refunded"


def _task_runs(flow_run_id) -> int:
    from prefect import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    with get_client(sync_client=True) as client:
        return len(client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id]))))


def _ledger_rows(platform) -> list:
    from sqlmodel import Session, select

    from dprelease.store import LedgerEntry

    with Session(platform.store.engine) as session:
        return sorted((e.release_id, e.epsilon, e.status) for e in session.exec(select(LedgerEntry)).all())


@pytest.mark.parametrize(("ending", "words"), [
    ("approve", "is already published at"), ("reject", "was rejected by alice: checked (its budget was refunded)"),
    ("expire", "expired: nobody answered in time (its budget was refunded)"), ("fail", "failed: Data checks FAILED")])
def test_prefect_s_retry_of_an_ended_release_ends_at_once_saying_what_the_release_is(platform_env, ending, words):
    """Issue 35: the UI's Retry (its call: set_state Scheduled named AwaitingRetry, force false; then
    a worker runs the flow again under the same run id) of a published run failed with `StoreError:
    release ... is published`, after decrypting and checking the data again. A retry of a run
    whose release ended (published, rejected, expired, failed) ends at once in the state the
    release gives, saying what it is; no task runs, nothing is spent, sealed, published or drawn."""
    from prefect import get_client
    from prefect.states import AwaitingRetry

    params = {"dataset": "strict", "sql": SQL.replace("FROM adult", "FROM strict")} if ending == "fail" else \
        {"approval_timeout": 3} if ending == "expire" else {}
    decision = {"approve": "approve", "reject": "reject"}.get(ending)
    platform, first = worker_release(platform_env, decision, **params)
    run = first["run"]
    release = platform.store.get_release(str(run.id))
    assert release.status == {"approve": "published", "reject": "rejected", "expire": "expired", "fail": "failed"}[ending]
    with get_client(sync_client=True) as client:
        answer = client.set_flow_run_state(run.id, AwaitingRetry(message="Retry from the UI"), force=False)
        assert answer.status.value == "ACCEPT", answer
        again = client.read_flow_run(run.id)
    tasks, ledger = _task_runs(run.id), _ledger_rows(platform)
    sealed = sorted(p.name for p in platform_env.archive_dir.rglob("*"))
    published = sorted(p.name for p in platform_env.publication_dir.rglob("*"))
    box: dict = {}
    thread = run_as_worker({**WORKER_PARAMS, **params}, box, flow_run=again)
    thread.join(PATIENCE_S)
    state = box["state"]
    assert words in state.message and "This retry ran nothing again" in state.message, state.message
    expected = {"approve": ("COMPLETED", "Completed"), "reject": ("COMPLETED", "Rejected"),
                "expire": ("FAILED", "Failed"), "fail": ("FAILED", "Failed")}[ending]
    assert (state.type.value, state.name) == expected
    assert _task_runs(run.id) == tasks and _ledger_rows(platform) == ledger
    assert sorted(p.name for p in platform_env.archive_dir.rglob("*")) == sealed
    assert sorted(p.name for p in platform_env.publication_dir.rglob("*")) == published
    assert [r.id for r in platform.store.releases_of_run(str(run.id))] == [str(run.id)]
    assert platform.store.get_release(str(run.id)).status == release.status


def test_forged_and_replayed_decisions_are_refused_and_spend_nothing(platform_env, tmp_path):
    """Genuine signatures used where they do not belong: alice's approval of another release
    replayed here, her approval of an older version of this report, her signed *reject* sent as an
    approve, a key no controller holds, an analyst's own key. Each is refused and recorded; nothing
    is published and the budget holds exactly this release's reservation; then alice's reject
    refunds it to the last digit."""
    import hashlib

    from dprelease import decisions, pipeline
    from dprelease.cli.deciding import decide as send
    from dprelease.flows.approvals import answer, wait_until_paused
    from dprelease.reporting import signing

    platform = pipeline.Platform.open(platform_env)
    budget_before = platform.store.budget("adult")
    known = {r.id for r in platform.store.list_releases()}
    other_thread, other_box = start_release(approval_timeout=PATIENCE_S, title="the other release")
    other = wait_for_approval(platform.store, known, thread=other_thread, box=other_box)
    thread, box = start_release(approval_timeout=PATIENCE_S, title="this release")
    rel = wait_for_approval(platform.store, known | {other.id}, thread=thread, box=box)
    wait_until_paused(other.flow_run_id, timeout=PATIENCE_S)
    wait_until_paused(rel.flow_run_id, timeout=PATIENCE_S)
    alice = signing.load_private_key(controller_key("alice"))
    context = decisions.read_context(platform_env, rel.id)

    def signed_by(key, **changes) -> str:
        fields = {"release_id": rel.id, "question": context["question"], "decision": "approve", "controller": "alice",
                  "report_fingerprint": context["report_fingerprint"], "decided_at": pipeline.now(), **changes}
        return decisions.sign(decisions.Decision(**fields), key)

    # 1. alice's genuine approval of the other release, replayed on this one
    replayed = decisions.sign_for_release(platform_env, other.id, "approve", controller_key("alice"), "fine")
    _send_raw(platform_env, rel, replayed)
    # 2. alice's approval of an older version of this controller report
    manifest = (platform_env.archive_dir / rel.id / "controller" / signing.MANIFEST).read_bytes()
    older = hashlib.sha256(manifest.replace(b'"', b"'", 1)).hexdigest()
    _send_raw(platform_env, rel, signed_by(alice, report_fingerprint=older))
    # 3. alice's signed reject, sent as an approve
    reject = decisions.sign_for_release(platform_env, rel.id, "reject", controller_key("alice"), "no")
    _send_raw(platform_env, rel, reject, decision="approve")
    # 4. a key no controller holds, claiming to be alice, and claiming a name of its own
    signing.generate_keypair(tmp_path / "stray.pem", tmp_path / "stray.pub.pem")
    stray = signing.load_private_key(tmp_path / "stray.pem")
    _send_raw(platform_env, rel, signed_by(stray))
    _send_raw(platform_env, rel, signed_by(stray, controller="carol"), reviewer="carol")
    # 5. an analyst: the CLI will not sign with a key that is not a controller's, and the run refuses
    #    a decision the analyst signed by hand
    signing.generate_keypair(tmp_path / "ana.pem", tmp_path / "ana.pub.pem")
    with pytest.raises(decisions.DecisionRefused, match="no registered controller"):
        send(platform_env, rel.id, "approve", tmp_path / "ana.pem", "looks fine to me", timeout=PATIENCE_S)
    _send_raw(platform_env, rel, signed_by(signing.load_private_key(tmp_path / "ana.pem"), controller="ana"),
              reviewer="ana")
    refused = [json.loads(line)["why"] for line in
               (platform_env.archive_dir / rel.id / decisions.REFUSED_FILE).read_text().splitlines()]
    assert len(refused) == 6
    assert f"for release {other.id}" in refused[0]
    assert "another version of the controller report" in refused[1]
    assert "the form says 'approve' but the signed decision says 'reject'" in refused[2]
    assert "does not verify with the registered key of 'alice'" in refused[3]
    assert "not a controller's decision" in refused[4] and "not a controller's decision" in refused[5]
    assert decisions.recorded(platform_env, rel.id) == []
    assert not (platform_env.publication_dir / rel.id).exists()
    assert platform.store.get_release(rel.id).status == "awaiting_approval"
    assert platform.store.ledger_entry(rel.id).status == "reserved"
    held = platform.store.budget("adult")
    assert held["epsilon_committed"] == budget_before["epsilon_committed"]
    assert held["epsilon_reserved"] == budget_before["epsilon_reserved"] + 2.0  # the two releases' 1.0 each, no more
    # the other release was not touched by the replay, and takes the token it was meant for
    assert platform.store.get_release(other.id).status == "awaiting_approval"
    answer(other.flow_run_id, "approve", "alice", "fine", signed_decision=replayed, timeout=PATIENCE_S)
    other_thread.join(PATIENCE_S)
    assert other_box["result"]["status"] == "published", other_box
    # alice rejects this one: refunded, the budget exactly as before plus the other's commitment
    send(platform_env, rel.id, "reject", controller_key("alice"), "forgeries seen", timeout=PATIENCE_S)
    thread.join(PATIENCE_S)
    assert box["result"]["status"] == "rejected", box
    after = platform.store.budget("adult")
    assert after["epsilon_reserved"] == budget_before["epsilon_reserved"]
    assert after["epsilon_committed"] == budget_before["epsilon_committed"] + 1.0
    (entry,) = decisions.recorded(platform_env, rel.id)
    assert entry["controller"] == "alice" and entry["decision"] == "reject"
    assert not (platform_env.publication_dir / rel.id).exists()


def test_an_answer_waits_for_the_pause_form_as_well_as_the_pause(platform_env):
    """Prefect sets a run Paused first and saves the form it waits for after: a resume in between is
    refused ("Run input schema not found"; seen under load in a 5-CLI round), and its description
    after that (a Resume dialog read in between lacked the refusal at its top, seen once in the
    suite). Waiting for the pause returns only once the form's schema and description are on the server."""
    from prefect import flow, get_client
    from prefect.input.run_input import keyset_from_base_key
    from prefect.states import Paused, Running

    from dprelease.flows.approvals import wait_until_paused

    @flow
    def paused_by_hand():
        pass

    keyset = keyset_from_base_key("paused-by-hand")
    with get_client(sync_client=True) as client:
        run = client.create_flow_run(paused_by_hand)
        client.set_flow_run_state(run.id, Running(), force=True)
        paused = Paused(pause_key="by-hand")
        paused.state_details.run_input_keyset = keyset
        client.set_flow_run_state(run.id, paused, force=True)
        done = threading.Event()
        waiter = threading.Thread(target=lambda: (wait_until_paused(str(run.id), timeout=PATIENCE_S), done.set()),
                                  daemon=True)
        waiter.start()
        assert not done.wait(2.0), "returned while the run's form was not saved: a resume now is refused"
        client.create_flow_run_input(run.id, keyset["schema"], "{}")
        assert not done.wait(2.0), "returned while the form's description was not saved: the dialog lacks it"
        client.create_flow_run_input(run.id, keyset["description"], '"Decide."')
        assert done.wait(PATIENCE_S), "did not return once the form was saved"


def test_a_pause_whose_reply_was_lost_still_waits_for_the_answer():
    """The client retries a request whose reply it lost. When the server had committed the Paused
    state, the retry is refused as a duplicate transition and Prefect 3.8 raises `Pause` (seen in
    CI's 5-command round on a busy SQLite server); when it had saved the form's schema, the retry is
    refused with 409 Conflict (and the controller may resume the run before the retry). Either
    way, the pause still ends in the submitted answer: losing the first, the second, or both. Run
    in a process of its own with its own Prefect API (tests/lost_reply_pause.py, one flow run per
    case): it patches the HTTP client of the whole process, and in a worker that had run other
    modules first its pause once waited for a resume it had had."""
    import subprocess
    import sys

    script = Path(__file__).with_name("lost_reply_pause.py")
    cases = [("state",), ("schema",), ("state", "schema", "description")]
    done = subprocess.run([sys.executable, str(script), *(",".join(case) for case in cases)], capture_output=True,
                          text=True, timeout=PATIENCE_S, env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])})
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    answers = [line for line in done.stdout.splitlines() if line.startswith("approved after losing")]
    assert answers == [f"approved after losing {sorted(case)}" for case in cases], done.stdout[-2000:]


#: an absolute POSIX path (two segments or more) not inside a URL: a publisher's directory
ABSOLUTE_PATH = re.compile(r"(?<![\w:/.~-])/(?:[\w.-]+/)+[\w.-]*")


def test_the_preview_summary_and_reports_write_each_number_alike_and_analysts_see_no_publisher_path(
        platform_env, approved):
    """One released interval, one string: the accuracy preview's half-width is the one the release
    reports, and every released cell reads the same in the controller summary, the controller
    report and the analyst report (a count as an integer, in results.csv and results.json too).
    The controller report states the dataset fingerprint the analyst report states; no file an
    analyst receives names a directory of the publisher's machine."""
    import csv

    from dp_core import display

    platform, rel, box = approved.platform, approved.rel, approved.box
    directory = Path(box["result"]["directory"])
    archive = platform_env.archive_dir / rel.id
    preview = (archive / "preview.md").read_text()
    summary = (archive / "summary.md").read_text()
    controller = (archive / "controller" / "controller.html").read_text()
    analyst = (directory / "index.html").read_text()
    sealed = _sealed_result(platform, rel.id)
    table = sealed.table
    unclipped = table[table["people_ci_low"] > 0]  # a count's interval is clipped at 0 only
    halves = (set(unclipped["people_ci_high"] - unclipped["people"])
              | set(unclipped["people"] - unclipped["people_ci_low"]))
    assert len(unclipped) and len(halves) == 1, halves
    assert f"| people | {display.halfwidth(halves.pop(), integer=True)} |" in preview
    readable = sealed.readable_table()
    for column in ("people", "avg_age"):
        for cell in readable[column]:
            assert f"| {cell} |" in summary or f"| {cell}\n" in summary, cell
            assert f">{cell}</td>" in analyst and f">{cell}</td>" in controller, cell
    assert all(re.fullmatch(r"[\d,]+ \[[\d,]+, [\d,]+\]", cell) for cell in readable["people"]), readable["people"]
    with (directory / "results.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert all(re.fullmatch(r"\d+", row[c]) for row in rows for c in ("people", "people_ci_low", "people_ci_high"))
    public = json.loads((directory / "results.json").read_text())
    assert all(type(row["people"]) is int for row in public["rows"])
    # the controller report names the dataset as the analyst report does
    fingerprint = re.compile(r'<code class="fp">([^<]*)</code>')
    shown = fingerprint.findall(analyst)
    assert fingerprint.findall(controller) == shown and len(shown) == 1 and len(shown[0]) == 64, shown
    # nothing of the publisher's machine in what analysts receive: the release folder and the index
    shared = [p for p in directory.rglob("*") if p.is_file()] + [platform_env.publication_dir / "index.html"]
    for path in shared:
        text = path.read_bytes().decode("utf-8", "replace")
        assert str(platform_env.home) not in text and str(platform_env.publication_dir) not in text, path.name
        if path.name != "manifest.sig":  # 64 random bytes: any character may appear
            assert not ABSOLUTE_PATH.findall(text), (path.name, ABSOLUTE_PATH.findall(text)[:3])


def test_a_decision_for_a_run_that_died_before_its_pause_is_refused_saying_so(platform_env):
    """A decision waits for the run's pause as long as the run lives (at load a busy server takes
    minutes to show it), and no longer: a release awaiting approval whose process ended before its
    run paused is refused in words, not waited for until a deadline."""
    import subprocess
    import sys

    from prefect import flow, get_client

    from dprelease import decisions, pipeline, recovery
    from dprelease.cli.deciding import decide as send

    @flow
    def never_pauses():
        pass

    platform = pipeline.Platform.open(platform_env)
    with get_client(sync_client=True) as client:
        run = client.create_flow_run(never_pauses)  # Pending: neither paused nor over
    rel = platform.store.add_release("adult", "{}", status="awaiting_approval", flow_run_id=str(run.id))
    ended = subprocess.Popen([sys.executable, "-c", "pass"])
    ended.wait()
    platform.store.take_lease(rel.id, recovery.this_host(), ended.pid, 0.0)  # the run's process, gone
    context = {"release_id": rel.id, "question": f"approval-{rel.id}", "report_fingerprint": "0" * 64,
               "above_tolerance": False}
    (platform_env.archive_dir / rel.id).mkdir(parents=True)
    (platform_env.archive_dir / rel.id / decisions.CONTEXT_FILE).write_text(json.dumps(context))
    try:
        with pytest.raises(decisions.DecisionRefused, match=f"the run of release {rel.id} ended before it paused "
                                                            rf"\(process {ended.pid} on .* has ended\)"):
            send(platform_env, rel.id, "approve", controller_key(), "too late")
    finally:
        platform.store.update_release(rel.id, status="failed")
