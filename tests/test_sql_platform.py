"""DP SQL on the platform (issue 16): a statement is charged its total (the sum over its DP
SELECTs), a refused statement charges nothing, public datasets are joinable and never charged."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import dp_core as dp

DP = "SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS (epsilon = {e}, delta = 1e-7, privacy_unit_column = person_id)"
TWO = (f"WITH a AS ({DP.format(e=0.3)} education, COUNT(*, contribution_bounds_per_group => (0, 1)) AS n "
       "FROM adult GROUP BY education), "
       f"b AS ({DP.format(e=0.4)} education, AVG(age, contribution_bounds_per_group => (17, 90)) AS mean_age "
       "FROM adult GROUP BY education) "
       "SELECT a.education, level, n, mean_age FROM a JOIN b USING (education) JOIN levels USING (education)")


@pytest.fixture(scope="module")
def platform(tmp_path_factory):
    home = tmp_path_factory.mktemp("home")
    saved = os.environ.get("DPRELEASE_HOME")
    os.environ["DPRELEASE_HOME"] = str(home)
    from dprelease import admin, pipeline
    from dprelease.settings import Settings

    settings = Settings.from_env()
    admin.init(settings)
    data = Path(__file__).resolve().parents[1] / "examples" / "data" / "adult.csv.gz"
    admin.register_dataset(settings, "adult", data, "person_id", epsilon_cap=10, add_row_id=True)
    levels = home / "levels.csv"
    education = pd.read_csv(data, usecols=["education"])["education"].dropna().unique()
    pd.DataFrame({"education": education, "level": range(len(education))}).to_csv(levels, index=False)
    admin.register_dataset(settings, "levels", levels, None, epsilon_cap=1.0)
    yield pipeline.Platform.open(settings)
    if saved is None:
        os.environ.pop("DPRELEASE_HOME", None)
    else:
        os.environ["DPRELEASE_HOME"] = saved


def spent(platform) -> float:
    b = platform.store.budget("adult")
    return b["epsilon_committed"] + b["epsilon_reserved"]


def test_a_statement_with_two_dp_selects_is_charged_exactly_their_sum(platform):
    from dprelease import pipeline
    from dprelease.requests import parse_request

    before = spent(platform)
    planned = pipeline.plan(platform, parse_request({"dataset": "adult", "sql": TWO, "epsilon": 1.0}))
    decision = pipeline.choose_epsilon(platform, planned)
    assert decision.epsilon == pytest.approx(0.7) and planned.query.delta == pytest.approx(2e-7)
    pipeline.reserve(platform, "two-selects", "adult", decision.epsilon, planned.query.delta)
    assert spent(platform) - before == pytest.approx(0.7)
    result = pipeline.compute_sealed(platform, "two-selects", planned, decision)
    assert result.epsilon_spent == pytest.approx(0.7)
    assert {"education", "level", "n", "mean_age"} <= set(result.table.columns) and len(result.table) > 5
    # the public table the SQL joins is marked public (not charged) in the release JSON and the report
    assert result.to_dict()["tables"] == [
        {"name": "adult", "public": False, "charged": True, "privacy_unit": "person_id"},
        {"name": "levels", "public": True, "charged": False}]
    from dprelease.reporting import pages

    ctx = pipeline.report_context("two-selects", planned, decision, "ctl", None)
    html = pages.render_analyst_report(result, ctx)
    assert "<code>levels</code> (public: no one's rows, not charged)" in html
    assert "<code>adult</code> (protected, privacy unit <code>person_id</code>: charged)" in html
    assert platform.store.budget("levels")["epsilon_committed"] + platform.store.budget("levels")["epsilon_reserved"] == 0


def test_a_refused_statement_charges_nothing(platform):
    from dprelease import pipeline
    from dprelease.requests import parse_request

    before = spent(platform)
    for sql in ("SELECT * FROM adult", f"{DP.format(e=1)} SUM(*) FROM adult",
                f"SELECT * FROM ({DP.format(e=1)} COUNT(*) AS n FROM adult) x JOIN adult ON true"):
        with pytest.raises(dp.DPError):
            pipeline.plan(platform, parse_request({"dataset": "adult", "sql": sql, "epsilon": 1.0}))
    assert spent(platform) == before


def test_a_public_dataset_is_listed_public_and_cannot_be_released(platform):
    from dprelease import pipeline
    from dprelease.requests import parse_request

    levels = platform.store.get_dataset("levels")
    assert levels.privacy_unit == ""
    with pytest.raises(pipeline.ReleaseError, match="public"):
        pipeline.plan(platform, parse_request({"dataset": "levels", "sql": "SELECT * FROM levels", "epsilon": 1.0}))


def test_public_groups_on_the_platform_release_every_public_level(platform):
    """OPTIONS (group_selection_strategy = PUBLIC_GROUPS) through plan, reservation and compute: the
    groups are the public dataset's rows (read at compute time, not charged), every one released."""
    from dprelease import pipeline
    from dprelease.requests import parse_request

    sql = ("SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS (epsilon = 0.2, group_selection_strategy = PUBLIC_GROUPS) "
           "education, COUNT(*, contribution_bounds_per_group => (0, 1)) AS n FROM adult "
           "RIGHT OUTER JOIN (SELECT DISTINCT education FROM levels) USING (education) GROUP BY education")
    before = spent(platform)
    planned = pipeline.plan(platform, parse_request({"dataset": "adult", "sql": sql, "epsilon": 0.2}))
    decision = pipeline.choose_epsilon(platform, planned)
    pipeline.reserve(platform, "public-groups", "adult", decision.epsilon, planned.query.delta)
    assert spent(platform) - before == pytest.approx(0.2)
    result = pipeline.compute_sealed(platform, "public-groups", planned, decision)
    levels = pd.read_csv(platform.settings.home / "levels.csv")  # written by the fixture
    assert "no selection" in result.partition_selection and result.epsilon_spent == pytest.approx(0.2)
    assert sorted(result.table["education"]) == sorted(levels["education"])
    assert [t["name"] for t in result.to_dict()["tables"] if t["public"]] == ["levels"]


def test_an_aggregate_inside_an_expression_is_named_as_written_in_a_releases_files(platform):
    """`ROUND(AVG(age, ...), 1) AS a` in the second DP SELECT: its budget line, mechanisms and the
    controller's clamping line read `DP SELECT 2: a (AVG(age))` (they read `__agg0` until
    2026-11-24) in the published results.json and report, and in the controller's summary and
    report; what it computes is unchanged (its exact value is the plain mean)."""
    import json

    from dprelease import pipeline
    from dprelease.requests import parse_request

    sql = (f"WITH c AS ({DP.format(e=0.5)} education, COUNT(*, contribution_bounds_per_group => (0, 1)) AS n "
           "FROM adult GROUP BY education), "
           f"m AS ({DP.format(e=2)} education, ROUND(AVG(age, contribution_bounds_per_group => (17, 90)), 1) AS a "
           "FROM adult GROUP BY education) "
           "SELECT education, n, a FROM c JOIN m USING (education)")
    planned = pipeline.plan(platform, parse_request({"dataset": "adult", "sql": sql, "epsilon": 2.5}))
    decision = pipeline.choose_epsilon(platform, planned)
    platform.store.add_release("adult", planned.request.to_json(), release_id="inner-names")  # as the flow does
    pipeline.reserve(platform, "inner-names", "adult", decision.epsilon, planned.query.delta)
    result = pipeline.compute_sealed(platform, "inner-names", planned, decision)
    summary = pipeline.controller_summary("inner-names", planned, decision, result)
    controller = pipeline.write_controller_report(platform, "inner-names", planned, decision, result)
    directory = pipeline.publish(platform, "inner-names", planned, decision, result, approved_by="alice")
    published = json.loads((directory / "results.json").read_text())
    name = "DP SELECT 2: a (AVG(age))"
    assert name in [b["part"] for b in published["budget"]]
    assert {f"{name}.N", f"{name}.S"} <= {m["target"] for m in published["mechanisms"]}
    assert f"- {name}: " in summary and name in (controller / "controller.html").read_text()
    assert "a (AVG(age))" in (directory / "index.html").read_text()
    for text in (summary, (controller / "controller.html").read_text(),
                 *(p.read_text() for p in directory.iterdir() if p.suffix in (".json", ".html", ".csv"))):
        assert "__agg" not in text
    ages = pd.read_csv(Path(__file__).resolve().parents[1] / "examples" / "data" / "adult.csv.gz",
                       usecols=["education", "age"]).groupby("education")["age"].mean()  # ages in [17, 90]
    exact = result.parts[1].controller_only.exact.set_index("education")["a (AVG(age))"]
    assert np.allclose(exact.to_numpy(dtype=float), ages.loc[exact.index].to_numpy(dtype=float), rtol=1e-9)


def test_the_summary_shows_the_first_rows_and_says_the_controller_report_holds_them_all(platform):
    """A release of many groups: the approval summary (form, terminal, artifact) lists the first
    SUMMARY_ROWS rows and says how many there are; the controller report lists every one."""
    from dprelease import pipeline
    from dprelease.requests import parse_request

    request = {"dataset": "adult", "epsilon": 0.5, "max_partitions_contributed": 1,
               "query": {"group_by": ["age"], "aggregates": [{"kind": "count", "upper": 1, "name": "people"}]}}
    planned = pipeline.plan(platform, parse_request(request))
    decision = pipeline.choose_epsilon(platform, planned)
    platform.store.add_release("adult", planned.request.to_json(), release_id="many-groups")
    pipeline.reserve(platform, "many-groups", "adult", decision.epsilon, planned.query.delta)
    result = pipeline.compute_sealed(platform, "many-groups", planned, decision)
    released = len(result.table)
    assert released > pipeline.SUMMARY_ROWS
    summary = pipeline.controller_summary("many-groups", planned, decision, result)
    table_rows = [line for line in summary.splitlines() if line.startswith("| ") and not line.startswith("| age")]
    assert len(table_rows) == pipeline.SUMMARY_ROWS
    assert f"(the first {pipeline.SUMMARY_ROWS} of {released:,} rows; the controller report holds all of them)" in summary
    assert "partitions dropped by selection" in summary  # the controller-only lines still follow
    report = pipeline.write_controller_report(platform, "many-groups", planned, decision, result)
    html = (report / "controller.html").read_text()
    assert all(f">{age}<" in html for age in result.table["age"].astype(int))


def test_a_cast_aimed_at_one_person_computes_whatever_her_row_holds(platform):
    """The analyst's attack through the platform's own compute step (escrow, DuckDB): a cast that
    fails on one value, put on person 7's row only when her education is the one guessed. Until
    2026-11-29 the right guess failed the compute (the release Failed, refunded: the analyst read her
    education), the wrong one ran; now both compute (tests/test_sql_value_errors.py: the class)."""
    from dprelease import pipeline
    from dprelease.requests import parse_request

    data = Path(__file__).resolve().parents[1] / "examples" / "data" / "adult.csv.gz"
    hers = pd.read_csv(data, usecols=["education"])["education"].iloc[7]
    for n, guess in enumerate((hers, "no such education")):
        sql = (f"{DP.format(e=1)} COUNT(*, contribution_bounds_per_group => (0, 1)) AS n FROM adult "
               f"WHERE CAST(CASE WHEN person_id = 7 AND education = '{guess}' THEN 'x' ELSE '1' END AS INTEGER) = 1")
        planned = pipeline.plan(platform, parse_request({"dataset": "adult", "sql": sql, "epsilon": 1.0}))
        decision = pipeline.choose_epsilon(platform, planned)
        result = pipeline.compute_sealed(platform, f"aimed-cast-{n}", planned, decision)
        assert list(result.table.columns)[:1] == ["n"]


def test_whether_bounds_are_found_for_one_person_never_fails_the_release(platform):
    """APPROX_BOUNDS' refusal ("no histogram bin stands out") is a noisy fact about the data. Aimed: a
    filter selecting 4 known people and person 7 if her education is the one guessed, at epsilon 10:
    the histogram's bin passes its threshold when she is in, not when she is out. The refusal reached
    the analyst as "Failed (refunded)" before any approval, free to ask again (until 2026-11-29);
    now the compute step falls back to the histogram's whole range, noted, either way."""
    from dp_core.bounds import FALLBACK_NOTE
    from dprelease import pipeline
    from dprelease.requests import parse_request

    data = Path(__file__).resolve().parents[1] / "examples" / "data" / "adult.csv.gz"
    hers = pd.read_csv(data, usecols=["education"])["education"].iloc[7]
    notes = []
    for n, guess in enumerate((hers, "no such education")):
        sql = (f"{DP.format(e=10)} COUNT(*) AS n FROM adult WHERE person_id BETWEEN 100 AND 103 "
               f"OR (person_id = 7 AND education = '{guess}')")
        planned = pipeline.plan(platform, parse_request({"dataset": "adult", "sql": sql, "epsilon": 10.0}))
        decision = pipeline.choose_epsilon(platform, planned)
        result = pipeline.compute_sealed(platform, f"aimed-bounds-{n}", planned, decision)  # raised until the fix
        assert len(result.table) == 1
        notes.append(FALLBACK_NOTE in result.inferred_bounds[0].record.note)
    assert notes[1], "no bin stood out without her, so the bounds fell back"
    assert any(FALLBACK_NOTE in note for note in result.notes)  # said in the summary and the report
