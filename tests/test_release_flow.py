"""The release flow on a real Prefect API (prefect_test_harness), real SQLite store, real escrow:
the platform invariants (platform.md) each with a test that fails if it breaks."""

from __future__ import annotations

import json
import os
import tempfile
import threading
import time
from pathlib import Path

import pytest
from patience import PATIENCE_S

SQL = ("SELECT WITH ANONYMIZATION education, ANON_COUNT(*, 1) AS people, ANON_AVG(age, 17, 90) AS avg_age "
       "FROM adult GROUP BY education")
RAW_FRAGMENT = b"State-gov,77516,Bachelors"  # the first row of Adult as it sits in the CSV


@pytest.fixture(scope="module")
def platform_env(tmp_path_factory):
    """A fresh home with Adult registered (cap 10) and a temporary Prefect API for the module."""
    home = tmp_path_factory.mktemp("home")
    os.environ["DPRELEASE_TEST_STARTED"] = str(time.time())
    saved = {k: os.environ.get(k) for k in ("DPRELEASE_HOME", "PREFECT_SERVER_ANALYTICS_ENABLED")}
    os.environ["DPRELEASE_HOME"] = str(home)
    os.environ["PREFECT_SERVER_ANALYTICS_ENABLED"] = "false"
    from prefect.testing.utilities import prefect_test_harness

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
    with prefect_test_harness(server_startup_timeout=PATIENCE_S):
        yield settings
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


def start_release(**params):
    """Run the flow in a thread (as a worker would); returns (thread, box with result or error)."""
    from flows.release import outcome, release_flow

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
    from cli.deciding import decide as send
    from dprelease.pipeline import Platform
    from flows.approvals import wait_until_paused

    platform = Platform.open(platform_env)
    known = {r.id for r in platform.store.list_releases()}
    thread, box = start_release(**params)
    if decision is None:  # nobody answers: a short approval timeout may expire before any look sees the pause
        thread.join(PATIENCE_S)
        (rel,) = [r for r in platform.store.list_releases() if r.id not in known]
        return platform, rel, box
    rel = wait_for_approval(platform.store, known, thread=thread, box=box)
    wait_until_paused(rel.flow_run_id, timeout=PATIENCE_S)
    send(platform_env, rel.id, decision, controller_key(), "checked", override, timeout=PATIENCE_S)
    thread.join(PATIENCE_S)
    return platform, rel, box


def test_approve_publishes_a_verifiable_report_and_commits_once(platform_env):
    from dprelease import pipeline
    from dprelease.reporting import signing

    before = pipeline.Platform.open(platform_env).store.budget("adult")
    platform, rel, box = decide(platform_env, "approve")
    assert box["result"]["status"] == "published", box
    directory = Path(box["result"]["directory"])
    assert directory.parent == platform_env.publication_dir
    report = signing.verify_directory(directory, platform_env.public_key_file)
    assert report.ok, report
    assert report.facts["approved_by"] == "alice" and report.facts["epsilon"] == pytest.approx(1.0)
    after = platform.store.budget("adult")
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


#: labels under which the controller report shows raw-data numbers (case-insensitive)
CONTROLLER_LABELS = ("controller only", "not differentially private", "partition loss", "clamping loss",
                     "contribution bounding", "exact against released", "raw against private", "pri range",
                     "controller_only", "controller report")


def _published_text(directory: Path) -> str:
    return "\n".join(p.read_bytes().decode("utf-8", "replace") for p in sorted(directory.rglob("*")) if p.is_file())


def test_analyst_outputs_hold_no_controller_only_numbers(platform_env):
    """The folder that is actually published (every file, not the renderer's output) holds no
    controller-only label, field or exact value; the controller report stays in the archive."""
    from dprelease.reporting import pages

    platform, rel, box = decide(platform_env, "approve")
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

    before = pipeline.Platform.open(platform_env).store.budget("adult")
    platform, rel, box = decide(platform_env, "reject")
    assert box["result"]["status"] == "rejected"
    assert box["state"].name == "Rejected" and not box["state"].is_completed()  # not a green Completed
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
    from tasks import release_steps as steps

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

    from cli.deciding import decide as send
    from dprelease import admin, decisions, pipeline
    from dprelease.reporting import signing
    from flows.approvals import wait_until_paused
    from flows.publication import publication_flow
    from flows.release import outcome

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


def test_deployments_in_prefect_yaml_point_at_flows_with_typed_forms():
    import importlib

    import yaml

    spec = yaml.safe_load((Path(__file__).resolve().parents[1] / "prefect.yaml").read_text())
    names = {d["name"]: d for d in spec["deployments"]}
    assert set(names) == {"dp-release", "dp-monthly-publication"}
    assert names["dp-monthly-publication"]["schedules"][0]["cron"] == "0 6 1 * *"
    for d in spec["deployments"]:
        module, func = d["entrypoint"].split(":")
        flow_obj = getattr(importlib.import_module(module.replace("/", ".").removesuffix(".py")), func)
        props = flow_obj.parameters.model_dump()["properties"]
        assert set(d["parameters"]) <= set(props)
    release_props = names["dp-release"]
    assert release_props["work_pool"]["name"] == "dprelease-pool"


def test_release_flow_never_auto_approves_and_later_steps_never_recompute(platform_env):
    """A standing auto policy approves schedules only: an on-demand release with every form field
    set as a user could still waits for the controller. And after the compute step, a missing
    seal is an error, not a new draw."""
    from dprelease import pipeline
    from dprelease.requests import parse_request
    from flows.release import release_flow

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


def test_publication_is_staged_and_shows_only_a_keyed_fingerprint(platform_env):
    platform, rel, box = decide(platform_env, "approve")
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
    from flows.approvals import answer, looks, wait_until_paused

    before = _refusals(platform_env, rel.id)
    answer(rel.flow_run_id, decision, reviewer, "", signed_decision=token, timeout=PATIENCE_S)
    for _ in looks(PATIENCE_S, 0.05, 0.5):
        if _refusals(platform_env, rel.id) != before:
            break
    assert _refusals(platform_env, rel.id) == before + 1
    wait_until_paused(rel.flow_run_id, timeout=PATIENCE_S)


def test_only_a_registered_controllers_signed_decision_publishes(platform_env, tmp_path):
    """No identity, another controller's identity, an analyst's key: refused, nothing published,
    the run still waits; then alice's signed decision publishes and the archive records it."""
    from prefect.flow_runs import resume_flow_run

    from cli.deciding import decide as send
    from dprelease import decisions, pipeline
    from dprelease.reporting import signing
    from flows.approvals import wait_until_paused

    platform = pipeline.Platform.open(platform_env)
    known = {r.id for r in platform.store.list_releases()}
    thread, box = start_release(approval_timeout=PATIENCE_S, title="Education, checked by alice")
    rel = wait_for_approval(platform.store, known, thread=thread, box=box)
    wait_until_paused(rel.flow_run_id, timeout=PATIENCE_S)
    # the paused run says an approval is waiting, links the summary, previews the accuracy
    from prefect import get_client

    from cli.interactive import _pause_description

    message = _pause_description(rel.flow_run_id)
    assert "An approval is waiting" in message and "/artifacts/key/release-" in message
    assert "Accuracy preview" in message and "before any budget is spent" in message
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
    from flows import approvals

    assert rel.id not in approvals._awaiting_here  # a process that runs many flows keeps no event of this one


def test_a_pause_s_event_forgotten_late_never_takes_the_next_wait_s():
    """The utility command decides three times for one release: its next wait may take a new event
    before the flow's thread forgets the one it set for the pause just answered. Each side forgets
    only its own event, so the next pause still wakes the command at once."""
    from flows import approvals

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
    from cli.deciding import decide as send
    from dprelease import admin, decisions, pipeline
    from flows.approvals import wait_until_paused

    data = Path(__file__).resolve().parents[1] / "examples" / "data" / "adult.csv.gz"
    admin.register_dataset(platform_env, "risky", data, "person_id", epsilon_cap=10, add_row_id=True)
    platform = pipeline.Platform.open(platform_env)
    known = {r.id for r in platform.store.list_releases()}
    thread, box = start_release(dataset="risky", sql=SQL.replace("FROM adult", "FROM risky"))
    rel = wait_for_approval(platform.store, known, thread=thread, box=box)
    wait_until_paused(rel.flow_run_id, timeout=PATIENCE_S)
    assert "Above your tolerable risk" in (platform_env.archive_dir / rel.id / "summary.md").read_text()
    controller_html = (platform_env.archive_dir / rel.id / "controller" / "controller.html").read_text()
    assert "risk-above" in controller_html and "Above your tolerable risk" in controller_html
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


def test_retry_after_expiry_asks_again_with_its_own_reservation(platform_env):
    """Retry (the UI's button: the failed run is set to AwaitingRetry and run again) of a release
    that expired and was refunded: the retry reserves afresh, waits for a decision, and ends in
    its own Rejected state when rejected; the refunded attempt stays refunded."""
    from prefect import get_client
    from prefect.flow_engine import run_flow
    from prefect.states import AwaitingRetry

    from cli.deciding import decide as send
    from flows.approvals import wait_until_paused
    from flows.release import outcome, release_flow

    platform, rel, _ = decide(platform_env, None, approval_timeout=3)
    assert platform.store.get_release(rel.id).status == "expired"
    params = {"dataset": "adult", "sql": SQL, "epsilon": 1.0, "approval_timeout": PATIENCE_S}
    with get_client(sync_client=True) as client:
        client.set_flow_run_state(rel.flow_run_id, AwaitingRetry(), force=True)
        again = client.read_flow_run(rel.flow_run_id)
    known = {r.id for r in platform.store.list_releases()}
    retry: dict = {}
    thread = threading.Thread(target=lambda: retry.update(result=outcome(run_flow(
        release_flow, flow_run=again, parameters=params, return_type="state"))), daemon=True)
    thread.start()
    second = wait_for_approval(platform.store, known, thread=thread, box=retry)
    assert second.id.startswith(rel.id) and second.id != rel.id
    assert platform.store.ledger_entry(second.id).status == "reserved"
    wait_until_paused(second.flow_run_id, timeout=PATIENCE_S)
    send(platform_env, second.id, "reject", controller_key(), "retried, still no", timeout=PATIENCE_S)
    thread.join(PATIENCE_S)
    assert retry["result"]["status"] == "rejected"
    assert platform.store.ledger_entry(rel.id).status == "refunded"
    assert platform.store.ledger_entry(second.id).status == "refunded"


def test_forged_and_replayed_decisions_are_refused_and_spend_nothing(platform_env, tmp_path):
    """Genuine signatures used where they do not belong: alice's approval of another release
    replayed here, her approval of an older version of this report, her signed *reject* sent as an
    approve, a key no controller holds, an analyst's own key. Each is refused and recorded; nothing
    is published and the budget holds exactly this release's reservation; then alice's reject
    refunds it to the last digit."""
    import hashlib

    from cli.deciding import decide as send
    from dprelease import decisions, pipeline
    from dprelease.reporting import signing
    from flows.approvals import answer, wait_until_paused

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
    refused ("Run input schema not found"; seen under load in a 5-CLI round). Waiting for the pause
    returns only once the form's schema is on the server."""
    from prefect import flow, get_client
    from prefect.input.run_input import keyset_from_base_key
    from prefect.states import Paused, Running

    from flows.approvals import wait_until_paused

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
        assert done.wait(PATIENCE_S), "did not return once the form was saved"


@pytest.mark.parametrize("lose", [("state",), ("schema",), ("state", "schema")])
def test_a_pause_whose_reply_was_lost_still_waits_for_the_answer(platform_env, monkeypatch, lose):
    """The client retries a request whose reply it lost. When the server had committed the Paused
    state, the retry is refused as a duplicate transition and Prefect 3.8 raises `Pause` (seen in
    CI's 5-command round on a busy SQLite server); when it had saved the form's schema, the retry is
    refused with 409 Conflict (and the controller may resume the run before the retry). Either
    way, the pause still ends in the submitted answer."""
    import httpx
    from prefect import flow
    from prefect.flow_runs import resume_flow_run
    from prefect.input import RunInput
    from prefect.runtime import flow_run

    from flows.approvals import wait_until_paused
    from flows.pausing import pause_for_input

    lost: list[str] = []
    real_send = httpx.Client.send

    def send_losing_the_pause_reply(self, request, *args, **kwargs):
        response = real_send(self, request, *args, **kwargs)
        path = request.url.path
        which = ("state" if path.endswith("/set_state") and b'"PAUSED"' in request.content else
                 "schema" if path.endswith("/input") and request.method == "POST" and b"schema" in request.content
                 else None)
        if which in lose and which not in lost:
            lost.append(which)  # the server committed it; the reply never arrives
            raise httpx.ReadTimeout("reply lost", request=request)
        return response

    monkeypatch.setattr(httpx.Client, "send", send_losing_the_pause_reply)

    class Answer(RunInput):
        word: str

    box: dict = {}

    @flow
    def asks() -> str:
        box["run_id"] = str(flow_run.id)
        return pause_for_input(Answer, timeout=PATIENCE_S, poll_interval=0.2, key="asked").word

    thread = threading.Thread(target=lambda: box.update(state=asks(return_state=True)), daemon=True)
    thread.start()
    deadline = time.monotonic() + PATIENCE_S
    while "run_id" not in box and time.monotonic() < deadline:
        time.sleep(0.1)
    wait_until_paused(box["run_id"], timeout=PATIENCE_S)
    resume_flow_run(box["run_id"], run_input={"word": "approved"})
    thread.join(PATIENCE_S)
    assert "state" in box, "the flow did not end after the answer"
    assert sorted(lost) == sorted(lose), "the fault was not injected: the test proves nothing"
    assert box["state"].is_completed(), box["state"]
    assert box["state"].result() == "approved"


def test_a_decision_for_a_run_that_died_before_its_pause_is_refused_saying_so(platform_env):
    """A decision waits for the run's pause as long as the run lives (at load a busy server takes
    minutes to show it), and no longer: a release awaiting approval whose process ended before its
    run paused is refused in words, not waited for until a deadline."""
    import subprocess
    import sys

    from prefect import flow, get_client

    from cli.deciding import decide as send
    from dprelease import decisions, pipeline, recovery

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
