"""Utility signaling and analyst policies (issue 6), on a real Prefect API and store."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import pandas as pd
import pytest
from patience import PATIENCE_S

from dprelease.evaluators import registry as evaluators

SQL = ("SELECT WITH ANONYMIZATION education, sex, ANON_COUNT(*, 1) AS people, ANON_AVG(hours_per_week, 1, 99) AS hours "
       "FROM adult GROUP BY education, sex")
RANK = {"column": "people", "other": "hours"}
DATA = Path(__file__).resolve().parents[1] / "examples" / "data" / "adult.csv.gz"


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    home = tmp_path_factory.mktemp("utility-home")
    saved = os.environ.get("DPRELEASE_HOME")
    os.environ["DPRELEASE_HOME"] = str(home)
    os.environ["PREFECT_SERVER_ANALYTICS_ENABLED"] = "false"
    from prefect_harness import prefect_harness

    from dprelease import admin
    from dprelease.settings import Settings
    from dprelease.store import Store

    settings = Settings.from_env()
    admin.init(settings)
    admin.register_dataset(settings, "adult", DATA, "person_id", epsilon_cap=20, add_row_id=True,
                           risk_profile={"max_risk": 0.5})
    from dprelease import decisions

    decisions.create_controller(settings, "carla", home / "carla.pem")
    Store(settings.store_url).add_policy("analysts", "adult", max_epsilon_per_release=2.0, analyst="ana",
                                        evaluators=["spearman_rank", "top_k_groups"])
    with prefect_harness():
        yield settings
    if saved is None:
        os.environ.pop("DPRELEASE_HOME", None)
    else:
        os.environ["DPRELEASE_HOME"] = saved


def run_utility(env, answers, **params):
    """Start the utility flow and give the answers in order (approve/reject), one per pause."""
    from dprelease.cli.deciding import decide
    from dprelease.cli.interactive import _pause_description
    from dprelease.flows.approvals import wait_until_paused
    from dprelease.flows.utility import utility_flow
    from dprelease.pipeline import Platform

    platform = Platform.open(env)
    known = {r.id for r in platform.store.list_releases()}
    box: dict = {}
    kwargs = {"dataset": "adult", "sql": SQL, "epsilon": 1.0, "evaluator": "spearman_rank", "evaluator_params": RANK,
              "requested_by": "ana", "poll_interval": 1, "approval_timeout": PATIENCE_S, **params}

    def target():
        try:
            box["result"] = utility_flow(**kwargs)
        except BaseException as err:  # noqa: BLE001
            box["error"] = err

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    snapshots, questions = [], []
    for decision in answers:
        rel = _wait_awaiting(platform, known, thread)
        if rel is None:
            break
        wait_until_paused(rel.flow_run_id, timeout=PATIENCE_S)  # this pause (resuming sets the run Running at once)
        snapshots.append(_analyst_text(env, rel.id))
        questions.append(_pause_description(rel.flow_run_id))
        decide(env, rel.id, decision, env.home / "carla.pem", f"step {len(snapshots)}", timeout=PATIENCE_S)
    thread.join(PATIENCE_S)
    box["questions"] = questions  # the text above each pause's form, in order
    return box, snapshots


def _wait_awaiting(platform, known, thread, timeout=PATIENCE_S):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and thread.is_alive():
        for rel in platform.store.list_releases(status="awaiting_approval"):
            if rel.id not in known:
                return rel
        time.sleep(0.2)
    return None


def _analyst_text(env, release_id) -> str:
    directory = env.publication_dir / release_id
    if not directory.exists():
        return ""
    return "".join(p.read_text(errors="ignore") for p in directory.rglob("*") if p.is_file())


def _raw_value(env, release_id) -> str:
    return f"{json.loads((env.archive_dir / release_id / 'utility.json').read_text())['f_raw']:.6g}"


def test_all_three_approvals_release_the_utility_signal(env):
    from dprelease.reporting import signing

    box, snapshots = run_utility(env, ["approve", "approve", "approve"])
    result = box["result"]
    assert result["utility"] == "released", box
    rid = result["release_id"]
    raw = _raw_value(env, rid)
    # before the last approval, f(raw) was in no analyst output; after it, it is
    assert all(raw not in s for s in snapshots)
    text = _analyst_text(env, rid)
    assert "Utility signal" in text and raw in text and "spearman_rank" in text
    report = signing.verify_directory(Path(result["directory"]), env.public_key_file)
    assert report.ok and report.facts["utility_signal"]["evaluator"] == "spearman_rank"
    assert (Path(result["directory"]) / "utility.json").exists()
    # the accuracy preview ("before any budget is spent") is shown with the release's approval only:
    # the questions after it are asked once its budget is spent
    first, run_it, release_it = box["questions"]
    assert "Accuracy preview" in first and "before any budget is spent" in first
    assert all("Accuracy preview" not in q and "before any budget" not in q for q in (run_it, release_it))
    assert "Run the evaluation" in run_it


@pytest.mark.parametrize("stop", [1, 2, 3])
def test_a_rejection_at_each_approval_stops_the_flow_there(env, stop):
    answers = ["approve"] * (stop - 1) + ["reject"]
    box, _ = run_utility(env, answers)
    result = box["result"]
    rid = result["release_id"]
    assert result["stopped_at"] == stop
    published = env.publication_dir / rid
    if stop == 1:
        assert result["status"] == "rejected" and not published.exists()
        from dprelease.pipeline import Platform

        assert Platform.open(env).store.ledger_entry(rid).status == "refunded"
        return
    assert published.exists() and not (published / "utility.json").exists()
    text = _analyst_text(env, rid)
    assert "Utility signal" not in text
    utility_file = env.archive_dir / rid / "utility.json"
    if stop == 2:
        assert not utility_file.exists()  # never computed
    else:
        assert _raw_value(env, rid) not in text  # computed, withheld for good


def test_an_evaluator_that_is_not_enabled_is_refused_before_anything_is_computed(env):
    from dprelease.pipeline import Platform

    platform = Platform.open(env)
    before = platform.store.budget("adult")
    box, _ = run_utility(env, [], evaluator="l2_distance", evaluator_params={"column": "people", "reference": [1]})
    assert "error" in box and "not enabled" in str(box["error"])
    assert platform.store.budget("adult") == before
    box, _ = run_utility(env, [], evaluator="spearman_rank", evaluator_params={"column": "people", "colour": "x"})
    assert "error" in box and "unknown parameter" in str(box["error"])


def test_policy_violations_are_refused_with_nothing_computed(env):
    from dprelease.pipeline import Platform

    platform = Platform.open(env)
    before = platform.store.budget("adult")
    sealed_before = set(env.archive_dir.glob("*/sealed-result.fernet"))
    box, _ = run_utility(env, [], epsilon=5.0)  # above the policy's 2.0 per release
    assert "error" in box and "above the policy limit 2" in str(box["error"])
    box, _ = run_utility(env, [], requested_by="mallory")  # no policy for this analyst
    assert "error" in box and "no policy lets mallory" in str(box["error"])
    assert platform.store.budget("adult") == before
    assert set(env.archive_dir.glob("*/sealed-result.fernet")) == sealed_before


def test_the_catalogue_documents_what_raw_values_reveal_and_loads_entry_points(monkeypatch):
    for ev in evaluators.BUILTIN.values():
        assert ev.reveals.startswith("on raw data") and ev.description
    table = pd.DataFrame({"g": ["a", "b", "c", "d"], "n": [10.0, 20.0, 30.0, 40.0], "m": [1.0, 2.0, 3.0, 5.0]})
    assert evaluators.BUILTIN["spearman_rank"](table, {"column": "n", "other": "m"}) == pytest.approx(1.0)
    assert evaluators.BUILTIN["top_k_groups"](table, {"column": "n", "k": 2, "key": "g", "expected": ["d", "a"]}) == 0.5
    assert evaluators.BUILTIN["threshold_share"](table, {"column": "n", "threshold": 25}) == 0.5
    assert evaluators.BUILTIN["l1_distance"](table, {"column": "n", "reference": [10, 20, 30, 30]}) == 10
    votes = pd.DataFrame({"sex": ["F", "F", "M", "M"], "income": ["hi", "lo", "hi", "lo"], "n": [5.0, 9.0, 8.0, 3.0]})
    test = [{"sex": "F", "income": "lo"}, {"sex": "M", "income": "lo"}]
    assert evaluators.BUILTIN["majority_classifier_accuracy"](
        votes, {"label": "income", "count": "n", "features": ["sex"], "test": test}) == 0.5

    class FakeEntryPoint:
        name = "custom_gap"

        def load(self):
            return evaluators.Evaluator("custom_gap", lambda t, column: float(t[column].max() - t[column].min()),
                                        {"column": (str, True)}, "on raw data: the true range", "range of a column")

    monkeypatch.setattr(evaluators, "entry_points", lambda group: [FakeEntryPoint()] if group == evaluators.GROUP else [])
    assert evaluators.enabled_evaluator("custom_gap", ["custom_gap"])(table, {"column": "n"}) == 30
    with pytest.raises(Exception, match="not enabled"):
        evaluators.enabled_evaluator("custom_gap", ["spearman_rank"])


def _verdict_on(env, rel, token: str, decision: str = "approve", reviewer: str = "carla") -> str:
    """Hand the paused run a signed token (as anyone with the console could) and read what it made
    of it: "refused: why" or "accepted" (from the archive, as `dprelease approve` does)."""
    from dprelease import decisions
    from dprelease.flows.approvals import answer, looks

    refused_file = env.archive_dir / rel.id / decisions.REFUSED_FILE
    refused_before = len(refused_file.read_text().splitlines()) if refused_file.exists() else 0
    accepted_before = len(decisions.recorded(env, rel.id))
    answer(rel.flow_run_id, decision, reviewer, "", signed_decision=token, timeout=PATIENCE_S)
    for _ in looks(PATIENCE_S, 0.05, 0.5):
        refused = refused_file.read_text().splitlines() if refused_file.exists() else []
        if len(refused) > refused_before:
            return "refused: " + json.loads(refused[-1])["why"]
        if len(decisions.recorded(env, rel.id)) > accepted_before:
            return "accepted"
    raise AssertionError("the run neither took nor refused the decision")


def _asking(env, platform, release_id: str, question: str):
    """The release once its run pauses on `question` (the context is written before each pause)."""
    from dprelease import decisions
    from dprelease.flows.approvals import looks, wait_until_paused

    for _ in looks(PATIENCE_S, 0.05, 0.5):
        rel = platform.store.get_release(release_id)
        context = env.archive_dir / release_id / decisions.CONTEXT_FILE
        if rel.status == "awaiting_approval" and context.exists() and \
                decisions.read_context(env, release_id)["question"] == question:
            wait_until_paused(rel.flow_run_id, timeout=PATIENCE_S)
            return rel
    raise AssertionError(f"release {release_id} never asked {question}")


def test_an_approval_replayed_as_the_approval_to_compute_or_release_the_utility_signal_is_refused(env):
    """The three pauses of one release are about the same controller report, so only the question a
    decision is signed for tells them apart: carla's approval of the DP release replayed at the
    second pause would compute f(raw output), and her approval to compute it replayed at the third
    would publish it. Each replay is refused and recorded, nothing is computed or released by it,
    the run keeps waiting; her own decision for each question is what moves the run on."""
    from dprelease import decisions
    from dprelease.cli.deciding import decide
    from dprelease.flows.utility import utility_flow
    from dprelease.pipeline import Platform

    platform = Platform.open(env)
    known = {r.id for r in platform.store.list_releases()}
    box: dict = {}

    def target():
        try:
            box["result"] = utility_flow(dataset="adult", sql=SQL, epsilon=1.0, evaluator="spearman_rank",
                                         evaluator_params=RANK, requested_by="ana", poll_interval=1,
                                         approval_timeout=PATIENCE_S)
        except BaseException as err:  # noqa: BLE001
            box["error"] = err

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    rel = _wait_awaiting(platform, known, thread)
    assert rel is not None, box
    rid, carla = rel.id, env.home / "carla.pem"
    rel = _asking(env, platform, rid, f"approval-{rid}")
    fingerprint = decisions.read_context(env, rid)["report_fingerprint"]
    decide(env, rid, "approve", carla, "the DP release", timeout=PATIENCE_S)
    release_approval = decisions.recorded(env, rid)[-1]["signed_decision"]

    rel = _asking(env, platform, rid, f"utility-run-{rid}")
    assert decisions.read_context(env, rid)["report_fingerprint"] == fingerprint  # the same report: only the question
    # tells the pauses apart
    why = _verdict_on(env, rel, release_approval)
    assert why.startswith("refused:") and f"not for {rid} (utility-run-{rid})" in why, why
    assert not (env.archive_dir / rid / "utility.json").exists()  # f(raw output) not computed
    decide(env, rid, "approve", carla, "run it", timeout=PATIENCE_S)
    run_approval = decisions.recorded(env, rid)[-1]["signed_decision"]

    rel = _asking(env, platform, rid, f"utility-release-{rid}")
    assert decisions.read_context(env, rid)["report_fingerprint"] == fingerprint
    raw = _raw_value(env, rid)
    for replayed in (release_approval, run_approval):
        why = _verdict_on(env, rel, replayed)
        assert why.startswith("refused:") and f"not for {rid} (utility-release-{rid})" in why, why
        rel = _asking(env, platform, rid, f"utility-release-{rid}")
    assert not (env.publication_dir / rid / "utility.json").exists() and raw not in _analyst_text(env, rid)
    assert [d["question"] for d in decisions.recorded(env, rid)] == [f"approval-{rid}", f"utility-run-{rid}"]
    decide(env, rid, "reject", carla, "keep it withheld", timeout=PATIENCE_S)
    thread.join(PATIENCE_S)
    assert box["result"]["utility"] == "withheld", box
    assert raw not in _analyst_text(env, rid)
