"""The trust/sensitivity/risk model (risk.md) against values computed by hand from the seed's
worked example (SIRD states: n = 4; a histogram: m = 2)."""

from __future__ import annotations

import math
import re
from dataclasses import replace

import numpy as np
import pandas as pd
import pytest

import dp_core as dp
from dp_core import InvalidQueryError, accuracy, display, risk
from dp_core.accounting import Share, plan_budget
from dp_core.aggregates import finish, plan_aggregate
from dp_core.release import NoisyStatistic, calibrate

N, M = 4, 2


def test_worked_example_by_hand():
    # sensitivity high (0.7), trust low (0.3): without noise q = 1, risk 0.7 * 0.7 = 0.49, "medium"
    assert risk.risk(risk.level_value("high"), risk.level_value("low"), 1.0) == pytest.approx(0.49)
    assert risk.level_name(0.49) == "medium"
    # a count of 100 with 10% noise at p = 0.9: A = 10, eps = ln(10) / 10 = 0.2303
    eps = risk.laplace_epsilon(10.0, 1.0, 0.9)
    assert eps == pytest.approx(math.log(10) / 10) and round(eps, 2) == 0.23
    # q = 1 / (1 + 3 exp(-2 * 0.2303)) = 1 / (1 + 3 * 0.6310) = 0.3456; risk = 0.49 * q = 0.169
    q = risk.guessing_bound(eps, N, M)
    assert q == pytest.approx(1 / (1 + 3 * math.exp(-2 * math.log(10) / 10)))
    assert q == pytest.approx(0.3456, abs=1e-4)
    assert risk.risk(0.7, 0.3, q) == pytest.approx(0.1694, abs=1e-4)
    assert risk.level_name(risk.risk(0.7, 0.3, q)) == "very low"
    assert risk.guessing_advantage(q, N) == pytest.approx((q - 0.25) / 0.75)


def test_chooser_reproduces_the_example_and_its_sentence():
    c = risk.choose_epsilon(trust="low", sensitivity="high", max_risk=0.2, max_noise=10, n=N, m=M)
    assert c.epsilon == pytest.approx(0.2303, abs=1e-4) and c.risk_level == "very low"
    assert c.epsilon <= c.epsilon_risk
    assert "between 90 and 110 with 90% probability" in c.summary
    acc = risk.choose_epsilon(trust="low", sensitivity="high", max_risk=0.2, max_noise=10, n=N, m=M, prefer="accuracy")
    assert acc.epsilon == pytest.approx(c.epsilon_risk)
    assert risk.risk(0.7, 0.3, risk.guessing_bound(acc.epsilon, N, M)) == pytest.approx(0.2)


def test_epsilon_for_risk_closed_form_and_edges():
    e = risk.epsilon_for_risk(0.3, 0.7, 0.3, N, M)
    assert risk.risk(0.7, 0.3, risk.guessing_bound(e, N, M)) == pytest.approx(0.3)
    assert risk.epsilon_for_risk(0.7 * 0.7 / N, 0.7, 0.3, N) is None  # at the floor: impossible
    assert risk.epsilon_for_risk(0.49, 0.7, 0.3, N) == risk.EPSILON_CAP  # never exceeded: capped
    with pytest.raises(InvalidQueryError, match="even without any release"):
        risk.choose_epsilon(trust=0.3, sensitivity=0.7, max_risk=0.1, max_noise=10, n=N)
    with pytest.raises(InvalidQueryError, match="accept more noise or more risk"):
        risk.choose_epsilon(trust=0.3, sensitivity=0.7, max_risk=0.15, max_noise=1, n=N, m=M)


@pytest.mark.parametrize("eps,delta", [(0.1, 1e-6), (1.0, 2**-40), (3.0, 1e-3)])
def test_truncated_laplace_inverse_round_trips(eps, delta):
    bound = risk.truncated_laplace_bound(eps, 2.0, delta)
    assert bound == pytest.approx(2.0 / eps * math.log(1 + (math.exp(eps) - 1) / (2 * delta)))
    assert risk.truncated_laplace_epsilon(bound, 2.0, delta) == pytest.approx(eps, rel=1e-9)


def test_truncated_laplace_edges_and_per_output_delta():
    with pytest.raises(InvalidQueryError, match="at most the sensitivity"):
        risk.truncated_laplace_epsilon(1.0, 1.0, 1e-6)
    d = risk.per_output_delta(1e-6, 2)
    assert 1 - (1 - d) ** 2 == pytest.approx(1e-6)
    c = risk.choose_epsilon(trust="low", sensitivity="high", max_risk=0.3, max_noise=40, n=N, m=M, bounded_delta=1e-6)
    assert risk.truncated_laplace_bound(c.epsilon, 1.0, d) == pytest.approx(40, rel=1e-9)
    assert c.summary.endswith("always.")


def test_a_noise_bound_equal_to_df_over_two_delta_is_refused_as_met_by_any_epsilon():
    """df / (2 delta) is the truncated-Laplace bound's limit as epsilon -> 0, never reached: a bound
    exactly there (2 for df 1, delta 1/4) is met by every epsilon, so none is chosen for it."""
    with pytest.raises(InvalidQueryError) as caught:
        risk.truncated_laplace_epsilon(2.0, 1.0, 0.25)
    assert str(caught.value) == "a noise bound of 2 is above df / (2 delta): any epsilon meets it"


def test_a_noise_bound_just_above_the_sensitivity_needs_an_epsilon_beyond_any_risk_and_is_refused():
    """A bound within 0.06% of the sensitivity needs epsilon above e^10 (the bisection's top); the
    bound is computed without overflow there (exp(eps) overflows past 709, the formula's other form
    does not: 1 + ln(1 / 2d) / eps at eps 800), and the chooser refuses with its reason."""
    assert risk.truncated_laplace_bound(800.0, 1.0, 1e-6) == pytest.approx(1 + math.log(1 / 2e-6) / 800, rel=1e-12)
    assert risk.truncated_laplace_bound(700.0, 1.0, 1e-6) == pytest.approx(1 + math.log(1 / 2e-6) / 700, rel=1e-12)
    assert risk.truncated_laplace_epsilon(1.0000001, 1.0, 1e-6) == pytest.approx(math.exp(10.0))
    with pytest.raises(InvalidQueryError) as caught:
        risk.choose_epsilon(trust="low", sensitivity="high", max_risk=0.3, max_noise=1.0000001, n=N, m=M,
                            bounded_delta=1e-6)
    assert str(caught.value).startswith("the tolerable noise (1) needs epsilon >= 2.203e+04, but the tolerable risk")


def test_bounded_noise_needs_delta_strictly_between_0_and_one_half():
    """The truncated Laplace bound (Geng et al. 2018) holds for 0 < delta < 1/2 only: 1/2 and 0 are refused."""
    assert risk.truncated_laplace_bound(1.0, 1.0, 0.4999) > 0
    for delta in (0.5, 0.0, 0.7):
        with pytest.raises(InvalidQueryError, match=r"bounded noise needs 0 < delta < 1/2, got"):
            risk.truncated_laplace_bound(1.0, 1.0, delta)


def test_the_plan_chooser_names_the_level_of_the_risk_it_carries():
    """The chosen plan's risk is named in words, on the same scale as the tolerable risk."""
    for max_risk, level in ((0.1, "very low"), (0.3, "low")):
        c = risk.choose_epsilon_for_plan(PLAN, trust="low", sensitivity="high", max_risk=max_risk, n=16, m=2,
                                         max_noise=1000, prefer="accuracy")
        assert c.risk == pytest.approx(max_risk) and c.risk_level == level


def test_levels_map_to_numbers_and_back():
    assert [risk.level_value(x) for x in risk.LEVELS] == [0.1, 0.3, 0.5, 0.7, 0.9]
    assert [risk.level_name(x) for x in (0.0, 0.19, 0.2, 0.5, 0.79, 0.8, 1.0)] == [
        "very low", "very low", "low", "medium", "high", "very high", "very high"]
    with pytest.raises(InvalidQueryError):
        risk.level_value("extreme")


def test_relative_noise_uses_the_vector_norm():
    assert risk.relative_noise(10, [100.0]) == pytest.approx(0.1)
    assert risk.relative_noise(10, [100.0, 100.0]) == pytest.approx(0.1)  # sqrt(2)*10 / (sqrt(2)*100)
    assert risk.relative_noise(10, [100.0, 0.0]) == pytest.approx(math.sqrt(2) * 10 / 100)


# -- the chooser for a whole plan (issue 17): the promise is what the report shows ------------------

GROUPS = ("a", "b", "c", "d")
#: the statistics a plan takes from, in order, with the tolerance asked of each (None: no tolerance;
#: an AVG's interval is promised for a reference group only, see dp_core.accuracy)
POOL = [(dp.count(upper=2, name="rows"), 25.0), (dp.sum_("x", 0, 20, name="total_x"), 400.0),
        (dp.sum_("y", -5.0, 5.0, name="total_y"), 150.5), (dp.avg("x", 0, 20, name="mean_x"), None)]


@pytest.fixture(scope="module")
def people() -> pd.DataFrame:
    """600 people, each with 1 to 3 rows in one to three groups (so C_u > 1 matters)."""
    rng = np.random.default_rng(17)  # test data only; the noise comes from the CSPRNG
    rows = []
    for unit in range(600):
        for _ in range(int(rng.integers(1, 4))):
            rows.append({"unit": unit, "g": GROUPS[int(rng.integers(0, 4))], "x": int(rng.integers(0, 21)),
                         "y": float(rng.normal(0, 3))})
    return pd.DataFrame(rows)


def _plan(k: int, cu: int, noise: str, selection: bool) -> dp.Query:
    return dp.Query([a for a, _ in POOL[:k]], privacy_unit="unit", epsilon=1.0, delta=1e-6, group_by=("g",),
                    max_partitions_contributed=cu, noise=noise, confidence=0.9,
                    public_partitions=None if selection else GROUPS)


@pytest.mark.parametrize("selection", [True, False], ids=["selection", "public"])
@pytest.mark.parametrize("noise", ["laplace", "gaussian"])
@pytest.mark.parametrize("cu", [1, 3, 8])
@pytest.mark.parametrize("k", [1, 2, 3, 4])
def test_report_shows_the_promised_interval_at_the_chosen_epsilon(people, k, cu, noise, selection):
    query = _plan(k, cu, noise, selection)
    tolerances = {a.label: t for a, t in POOL[:k] if t is not None}
    ints = {"unit", "x"}
    eps = accuracy.smallest_epsilon(query, tolerances, integer_columns=ints)
    promise = {s.name: s for s in accuracy.statistic_intervals(query, eps, integer_columns=ints)}
    result = dp.execute(replace(query, epsilon=eps), people)
    assert result.epsilon_spent == pytest.approx(eps, rel=1e-12)
    ratios = []
    for name, tol in tolerances.items():
        shown = ((result.table[f"{name}_ci_high"] - result.table[f"{name}_ci_low"]) / 2.0).max()
        assert shown == pytest.approx(promise[name].halfwidth, rel=1e-9), name  # one computation
        assert shown <= tol * (1 + 1e-12), name
        ratios.append(shown / tol)
    assert max(ratios) >= 0.99  # not more than 1% inside: the binding statistic is tight
    below = {s.name: s.halfwidth for s in accuracy.statistic_intervals(query, eps * (1 - 1e-6), integer_columns=ints)}
    assert any(below[n] > t for n, t in tolerances.items())  # and a hair less epsilon fails: the smallest


def test_unknown_column_types_promise_the_wider_interval():
    q = _plan(2, 2, "laplace", True)
    known = {s.name: s.halfwidth for s in accuracy.statistic_intervals(q, 0.7, integer_columns={"x"})}
    unknown = {s.name: s.halfwidth for s in accuracy.statistic_intervals(q, 0.7)}
    assert unknown["total_x"] >= known["total_x"] and unknown["rows"] == known["rows"]


@pytest.mark.parametrize("noise", ["laplace", "gaussian"])
def test_avg_promise_is_finish_at_the_reference_count(noise):
    """AVG: the promise is the engine's own first-order interval for a group of the reference count
    whose mean sits at a bound (the widest case), computed by `finish` from noisy N and S."""
    agg = dp.avg("x", 0, 20, name="mean_x")
    q = dp.Query([agg], privacy_unit="unit", epsilon=0.8, group_by=("g",), public_partitions=GROUPS,
                 noise=noise, confidence=0.9)
    (promised,) = accuracy.statistic_intervals(q, reference_count=250)
    budget = plan_budget(q)
    comps = {c.key: c for c in plan_aggregate(0, agg, set(), "", 2).components}
    half = 10.0
    values = {"N": 250.0, "S": 250.0 * half}
    noisy = {}
    for key, comp in comps.items():
        cal = calibrate(quantum=comp.quantum, sensitivity_quanta=comp.sensitivity_quanta, max_partitions=1,
                        share=budget.component_shares[(0, key)], noise=noise, confidence=0.9)
        noisy[key] = NoisyStatistic(np.array([values[key]]), cal.halfwidth, cal.scale, cal.sd, None)
    value, lo, hi, _ = finish(agg, noisy, noise, 0.1)
    assert value[0] == 20.0 and hi[0] == 20.0  # the mean at the upper bound; the interval clipped above
    assert value[0] - lo[0] == pytest.approx(promised.halfwidth, rel=1e-12)
    assert promised.reference_count == 250 and "for a group of 250 people" in promised.describe()
    # a count and a sum need no group size: their line says so by saying nothing of one
    q2 = dp.Query([dp.count(upper=1, name="people"), dp.sum_("x", 0, 10, name="total")], privacy_unit="u",
                  epsilon=1.0, confidence=0.9)
    assert [s.describe() for s in accuracy.statistic_intervals(q2)] == [
        "people: +-5 at 90% (discrete Laplace, epsilon 0.5)", "total: +-46.05 at 90% (discrete Laplace, epsilon 0.5)"]


def test_statistics_without_a_data_free_interval_are_named_and_refused():
    q = dp.Query([dp.count(name="n"), dp.var("x", 0, 20), dp.median("x", 0, 20), dp.sum_("x", 0, None)],
                 privacy_unit="unit", epsilon=1.0, group_by=("g",))
    got = {s.name: s for s in accuracy.statistic_intervals(q)}
    assert got["n"].promised and not got["var_x"].promised and not got["median_x"].promised
    assert "APPROX_BOUNDS" in got["sum_x"].note and "spread" in got["var_x"].note
    with pytest.raises(InvalidQueryError, match="no tolerable noise can be promised for 'var_x'"):
        accuracy.smallest_epsilon(q, {"var_x": 1.0})
    with pytest.raises(InvalidQueryError, match="not a statistic of the query"):
        accuracy.smallest_epsilon(q, {"people": 1.0})


def test_a_tolerance_for_a_name_the_query_lacks_is_refused_listing_the_query_s_statistics():
    """The refusal of an unknown name lists the query's statistics, comma-separated, so the analyst sees the
    names to choose from."""
    q = dp.Query([dp.count(upper=1, name="people"), dp.sum_("x", 0, 10, name="total")], privacy_unit="u", epsilon=1.0)
    with pytest.raises(InvalidQueryError) as caught:
        accuracy.smallest_epsilon(q, {"peeple": 1.0})
    assert str(caught.value) == ("the tolerable noise names 'peeple', which is not a statistic of the query "
                                 "(statistics: people, total)")


def test_reused_distinct_count_is_the_selection_count():
    q = dp.Query([dp.count_units(name="people")], privacy_unit="unit", epsilon=1.0, group_by=("g",),
                 max_partitions_contributed=2, confidence=0.9)
    (s,) = accuracy.statistic_intervals(q, 2.0)
    # Laplace threshold selection gets all of epsilon; scale C_u / eps = 1 -> discrete Laplace t = 1
    assert s.epsilon == pytest.approx(2.0) and s.scale == pytest.approx(1.0)
    assert s.halfwidth == calibrate(quantum=1.0, sensitivity_quanta=1, max_partitions=2,
                                    share=Share("s", 2.0, 1e-6), noise="laplace",
                                    confidence=0.9).halfwidth


# -- the risk side: the plan's total epsilon, and the message when nothing can be released ---------

PLAN = dp.Query([dp.count(name="people"), dp.avg("age", 17, 90, name="average_age"),
                 dp.avg("hours", 1, 99, name="weekly_hours")], privacy_unit="id", epsilon=1.0, group_by=("education",))


def test_plan_chooser_uses_the_total_epsilon_for_the_risk_and_quotes_the_real_noise():
    c = risk.choose_epsilon_for_plan(PLAN, trust="low", sensitivity="high", max_risk=0.2, max_noise=10, n=16, m=2)
    # four equal shares (selection and three aggregates): people gets eps / 4
    assert [e for _, e in c.shares] == pytest.approx([c.epsilon / 4] * 4)
    assert sum(e for _, e in c.shares) == pytest.approx(c.epsilon)
    assert c.promised("people").halfwidth == 10 and c.tolerances == {"people": 10.0}
    # one count of sensitivity 1 with the whole epsilon would need only ~ln(10)/10 = 0.23: the plan needs ~4x
    assert 3.5 * math.log(10) / 10 < c.epsilon < 4.1 * math.log(10) / 10
    assert c.guessing_probability == pytest.approx(risk.guessing_bound(c.epsilon, 16, 2))
    assert c.risk == pytest.approx(0.49 * c.guessing_probability)
    assert "a count of 100 would be released as 100 +- 10, i.e. between 90 and 110 with 90% probability" in c.summary
    assert "people (count)" in c.summary and "for a group of 100 people" in c.summary
    # every epsilon as every page writes it (dp_core.display.budget): the DPP tool's headline beside this summary
    # once read 0.4757 above "Epsilon 0.476"
    assert f"guesses a person's value (one of 16; a changed value: exponent 2 x {display.budget(c.epsilon)})" in c.summary
    assert c.summary.startswith(f"Epsilon {display.budget(c.epsilon)} for the whole plan (" + ", ".join(
        f"{part} {display.budget(e)}" for part, e in c.shares) + ");")
    relative = risk.choose_epsilon_for_plan(PLAN, trust="low", sensitivity="high", max_risk=0.2, max_noise="5%",
                                            reference_value=200, n=16, m=2)
    assert relative.epsilon == pytest.approx(c.epsilon)  # 5% of 200 = 10
    accurate = risk.choose_epsilon_for_plan(PLAN, trust="low", sensitivity="high", max_risk=0.2, max_noise=10, n=16,
                                            m=2, prefer="accuracy")
    assert accurate.epsilon == pytest.approx(accurate.epsilon_risk) and accurate.risk == pytest.approx(0.2)


def test_every_tolerated_statistic_is_met():
    c = risk.choose_epsilon_for_plan(PLAN, trust="low", sensitivity="high", max_risk=0.3, n=16, m=2,
                                     max_noise={"people": 20, "average_age": 2.5}, reference_count=500)
    assert c.promised("people").halfwidth <= 20 and c.promised("average_age").halfwidth <= 2.5
    assert max(c.promised("people").halfwidth / 20, c.promised("average_age").halfwidth / 2.5) > 0.99


def test_no_epsilon_meets_both_says_which_tolerance_to_relax_and_by_how_much():
    kw = {"trust": "low", "sensitivity": "high", "n": 16, "m": 2}
    with pytest.raises(InvalidQueryError) as err:
        risk.choose_epsilon_for_plan(PLAN, max_risk=0.2, max_noise=3, **kw)
    text = str(err.value)
    assert "nothing is released" in text
    noise = float(text.split("accept noise of people +-")[1].split(" ")[0])
    needed_risk = float(text.split("accept a risk of ")[1].split(" ")[0])
    # each way out works on its own, and is the least relaxation: one step less fails again
    assert risk.choose_epsilon_for_plan(PLAN, max_risk=0.2, max_noise=noise, **kw).epsilon <= \
        risk.epsilon_for_risk(0.2, 0.7, 0.3, 16, 2) * (1 + 1e-9)
    with pytest.raises(InvalidQueryError):
        risk.choose_epsilon_for_plan(PLAN, max_risk=0.2, max_noise=noise - 1, **kw)
    assert risk.choose_epsilon_for_plan(PLAN, max_risk=needed_risk * 1.001, max_noise=3, **kw).promised(
        "people").halfwidth <= 3
    with pytest.raises(InvalidQueryError, match="even without any release"):
        risk.choose_epsilon_for_plan(PLAN, max_risk=0.02, max_noise=10, **kw)


# -- the platform: the demo's request through the pipeline's own functions ------------------------


@pytest.fixture(scope="module")
def platform(tmp_path_factory):
    """A fresh home with Adult registered, as the demo does (no Prefect: the pipeline's functions)."""
    from pathlib import Path

    from dprelease import admin, pipeline
    from dprelease.settings import Settings

    home = tmp_path_factory.mktemp("risk-home")
    settings = Settings.from_env({"DPRELEASE_HOME": str(home)})
    admin.init(settings)
    data = Path(__file__).resolve().parents[1] / "examples" / "data" / "adult.csv.gz"
    admin.register_dataset(settings, "adult", data, "person_id", epsilon_cap=5.0, delta_cap=1e-5, add_row_id=True)
    return pipeline.Platform.open(settings)


def test_demo_promise_is_what_its_report_shows(platform):
    from dprelease import pipeline
    from dprelease.cli.demo import REQUEST
    from dprelease.reporting import pages
    from dprelease.requests import parse_request

    planned = pipeline.plan(platform, parse_request(REQUEST))
    assert planned.query.confidence == 0.9  # the report states its intervals at the promise's confidence
    decision = pipeline.choose_epsilon(platform, planned)
    choice = decision.risk_choice
    assert choice.promised("people").halfwidth == 10.0 and choice.epsilon > 0.8  # 4 shares: not 0.23
    result = pipeline.compute_sealed(platform, "demo-promise", planned, decision)
    assert result.epsilon_spent == pytest.approx(decision.epsilon, rel=1e-12)
    for s in choice.promise:  # counts: exactly the promise; averages: the reference group's worst case
        shown = (result.table[f"{s.name}_ci_high"] - result.table[f"{s.name}_ci_low"]) / 2.0
        if s.kind == "count":
            assert shown.max() == pytest.approx(s.halfwidth, rel=1e-12)
    summary = pipeline.controller_summary("demo-promise", planned, decision, result)
    assert "- people: promised ±10 at 90%; tolerance asked ±10; delivered ±10 at 90%" in summary
    assert "a count of 100 would be released as 100 +- 10, i.e. between 90 and 110 with 90% probability" in summary
    ctx = pipeline.report_context("demo-promise", planned, decision, approved_by="alice", decided_at=None)
    page = pages.render_analyst_report(result, ctx)
    assert 'id="promise"' in page and "±10 at 90%; tolerance asked ±10" in page
    assert "90% confidence intervals" in page
    charts = pipeline._controller_charts(platform, planned, decision)
    assert "people (count)" in charts["noise against risk"]


def test_no_solution_releases_nothing_and_says_what_to_relax(platform):
    from dprelease import pipeline
    from dprelease.cli.demo import REQUEST
    from dprelease.requests import parse_request

    request = dict(REQUEST, epsilon={"risk": dict(REQUEST["epsilon"]["risk"], max_noise=2)})
    planned = pipeline.plan(platform, parse_request(request))
    before = platform.store.budget("adult")
    with pytest.raises(pipeline.ReleaseError) as err:
        pipeline.choose_epsilon(platform, planned)
    text = str(err.value)
    assert "accept noise of people +-" in text and "or accept a risk of" in text and "nothing is released" in text
    assert platform.store.budget("adult") == before  # refused before any reservation


def test_a_misspelt_risk_field_is_refused_by_name(platform):
    from dprelease.cli.demo import REQUEST
    from dprelease.requests import RequestError, parse_request

    request = dict(REQUEST, epsilon={"risk": dict(REQUEST["epsilon"]["risk"], headine="people")})
    with pytest.raises(RequestError, match=r"unknown field\(s\) \['headine'\]"):  # refused as the request is read
        parse_request(request)


def test_sql_options_epsilon_and_the_risk_model_are_refused_together(platform):
    from dprelease import pipeline
    from dprelease.cli.demo import REQUEST
    from dprelease.requests import parse_request

    sql = ("SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS (epsilon = 2, privacy_unit_column = person_id) education, "
           "COUNT(*) AS people FROM adult GROUP BY education")
    planned = pipeline.plan(platform, parse_request(dict(REQUEST, sql=sql)))
    with pytest.raises(pipeline.ReleaseError, match="fixes epsilon in its OPTIONS, so the risk model"):
        pipeline.choose_epsilon(platform, planned)
    # the PRI cannot choose it either: it would charge its own choice while the SQL spends the OPTIONS'
    # (also when OPTIONS happen to say 1, the request's default, and in one of two DP SELECTs)
    one = sql.replace("epsilon = 2", "epsilon = 1")
    shared = ("WITH a AS (SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS (privacy_unit_column = person_id) education, "
              "COUNT(*) AS n FROM adult GROUP BY education), b AS (" + sql.replace("epsilon = 2", "epsilon = 0.5")
              + ") SELECT * FROM a JOIN b USING (education)")
    before = platform.store.budget("adult")
    for text in (sql, one, shared):
        planned = pipeline.plan(platform, parse_request(dict(REQUEST, sql=text, epsilon={"pri": {"p": 50}})))
        with pytest.raises(pipeline.ReleaseError, match="fixes epsilon in its OPTIONS, so the privacy risk indicator"):
            pipeline.choose_epsilon(platform, planned)
    assert platform.store.budget("adult") == before


def test_promise_holds_beside_an_aggregate_with_inferred_bounds(people):
    """APPROX_BOUNDS takes part of its aggregate's share: the count's promise still equals the report."""
    query = dp.Query([dp.count(name="rows", upper=2), dp.sum_("x", 0, None, name="total_x")], privacy_unit="unit",
                     epsilon=1.0, group_by=("g",), max_partitions_contributed=2, confidence=0.9)
    eps = accuracy.smallest_epsilon(query, {"rows": 12})
    promise = {s.name: s for s in accuracy.statistic_intervals(query, eps)}
    assert not promise["total_x"].promised
    result = dp.execute(replace(query, epsilon=eps), people)
    shown = ((result.table["rows_ci_high"] - result.table["rows_ci_low"]) / 2.0).max()
    assert shown == pytest.approx(promise["rows"].halfwidth, rel=1e-12) and shown == 12


def test_a_statistic_without_a_promised_interval_says_why():
    """The promise lists every statistic; one without a data-free half-width (a quantile, bounds to
    infer, a variance) says why, and a unit count reused from the partition selection says it is
    that noisy count, with the selection's half-width."""
    q = dp.Query([dp.count_units(name="people"), dp.median("x", 0, 20, name="mid"),
                  dp.Aggregate("sum", column="x", name="auto"), dp.var("x", 0, 20, name="spread")], privacy_unit="unit", epsilon=1.0, delta=1e-6, group_by=("g",),
                 selection="laplace-threshold")
    by_name = {s.name: s for s in accuracy.statistic_intervals(q)}
    assert by_name["people"].halfwidth > 0 and by_name["people"].note == (
        "the partition selection's noisy count of units, released as is")
    assert {n: (by_name[n].halfwidth, by_name[n].note) for n in ("mid", "auto", "spread")} == {
        "mid": (None, "quantiles (exponential mechanism) have no interval"),
        "auto": (None, "bounds inferred from the data (APPROX_BOUNDS): the noise is known only once they are; give "
                       "the bounds to get a promise"),
        "spread": (None, "its first-order interval depends on the data's spread")}


def test_the_refusal_below_the_risk_floor_quotes_the_floor():
    """The floor is s (1 - t) / n: 0.7 * 0.7 / 4 = 0.1225 for these numbers, above the 0.1 asked."""
    with pytest.raises(InvalidQueryError) as caught:
        risk.choose_epsilon(trust=0.3, sensitivity=0.7, max_risk=0.1, max_noise=10, n=4)
    assert str(caught.value) == ("no epsilon keeps the risk within 0.1: even without any release the risk is "
                                 "s (1 - t) / n = 0.122. Raise the tolerable risk, or share with a more trusted "
                                 "recipient")


def test_the_plan_chooser_ignores_the_plan_s_own_epsilon():
    """The plan's epsilon is what the chooser replaces: 0 (not yet chosen), 1 or 50 give the same choice."""

    kw = {"trust": "low", "sensitivity": "high", "max_risk": 0.2, "max_noise": 10, "n": 16, "m": 2}
    chosen = [risk.choose_epsilon_for_plan(replace(PLAN, epsilon=e), **kw) for e in (0.0, 1.0, 50.0)]
    assert {c.epsilon for c in chosen} == {chosen[1].epsilon}
    assert all(c.tolerances == {"people": 10.0} for c in chosen)


def test_levels_and_tolerances_are_refused_with_their_whole_reason():
    for level, message in [(1.5, "a level must be in [0, 1], got 1.5"), (-0.1, "a level must be in [0, 1], got -0.1"),
                           ("extreme", "unknown level 'extreme': use one of ['very low', 'low', 'medium', 'high', "
                                       "'very high'] or a number in [0, 1]")]:
        with pytest.raises(InvalidQueryError) as err:
            risk.level_value(level)
        assert str(err.value) == message
    median_only = dp.Query([dp.median("age", 0, 100, name="m")], privacy_unit="id", epsilon=1.0)
    with pytest.raises(InvalidQueryError) as err:
        risk.choose_epsilon_for_plan(median_only, trust="low", sensitivity="high", max_risk=0.2, max_noise=10, n=16, m=2)
    assert str(err.value) == ("no statistic of the query has a data-free interval (count, sum, avg with bounds given): "
                              "a tolerable noise cannot be promised; fix epsilon instead")


@pytest.mark.parametrize("n,m,words", [
    (0, 2, "n (the values a person's secret can take) must be a whole number >= 2, got 0"),
    (1, 2, "n (the values a person's secret can take) must be a whole number >= 2, got 1"),
    (-3, 1, "n (the values a person's secret can take) must be a whole number >= 2, got -3"),
    (2.5, 1, "must be a whole number >= 2, got 2.5"),
    (float("nan"), 1, "must be a whole number >= 2, got nan"),
    (16, 0, "m (what the attacker learns: 1 whether a person is in the data, 2 a person's value) must be a whole "
            "number >= 1, got 0"),
    (16, -1, "must be a whole number >= 1, got -1"),
    (16, 1.5, "must be a whole number >= 1, got 1.5"),
])
@pytest.mark.parametrize("chooser", ["plan", "one output", "risk alone"])
def test_an_attacker_model_that_means_nothing_is_refused_naming_it(n, m, words, chooser):
    """n values a secret can take (>= 2) and m outputs (>= 1) are refused in one sentence by every chooser:
    n = 0 or m = 0 in a request ended in ZeroDivisionError, n = -3 in a math domain error (issue 35's class:
    a bad number crashes instead of refusing)."""
    kw = {"trust": "low", "sensitivity": "high", "max_risk": 0.2, "n": n, "m": m}
    with pytest.raises(InvalidQueryError) as err:
        if chooser == "plan":
            risk.choose_epsilon_for_plan(PLAN, max_noise=10, **kw)
        elif chooser == "one output":
            risk.choose_epsilon(max_noise=10, **kw)
        else:
            risk.epsilon_for_risk(0.2, 0.7, 0.3, n, m)
    assert words in str(err.value)


@pytest.mark.parametrize("reference_value", [0, -5, float("nan"), float("inf"), True])
@pytest.mark.parametrize("max_noise", ["10%", 10, {"people": "5%"}])
def test_a_reference_value_that_is_not_a_positive_number_is_refused_naming_it(reference_value, max_noise):
    """reference_value is refused by name, whatever the tolerable noise: with a percentage the refusal once
    blamed the tolerance ("the tolerable noise of 'people' must be ... got '10%'"), with a number the summary
    spoke of "a count of nan"."""
    with pytest.raises(InvalidQueryError) as err:
        risk.choose_epsilon_for_plan(PLAN, trust="low", sensitivity="high", max_risk=0.2, max_noise=max_noise, n=16,
                                     m=2, reference_value=reference_value)
    assert str(err.value).startswith("reference_value (what a percentage tolerable noise is a percentage of, and "
                                     f"the count the summary's example uses) must be a finite number > 0, got "
                                     f"{reference_value!r}")


@pytest.mark.parametrize("tolerance", [0, -1.5, float("nan"), "ten"])
def test_a_tolerable_noise_that_is_not_a_positive_number_is_refused_naming_it(tolerance):
    """smallest_epsilon's tolerances must be numbers above 0: anything else is refused in one sentence
    naming the statistic and the value given."""
    q = dp.Query([dp.count(upper=1, name="n")], privacy_unit="u", epsilon=1.0)
    with pytest.raises(InvalidQueryError) as err:
        accuracy.smallest_epsilon(q, {"n": tolerance})
    assert str(err.value) == f"the tolerable noise of 'n' must be a number > 0, got {tolerance!r}"


def test_a_tolerance_no_epsilon_up_to_the_search_limit_meets_is_refused_with_the_noise_at_that_limit():
    """A unit in up to 100 groups (C_u) leaves a count +-6 and a sum +-30 of noise even at epsilon 100:
    tolerances of 2 and 3 are refused with the noise each statistic still has there (what to tolerate
    instead) and the knobs that lower it; a met tolerance (the count's 7) is not named."""
    q = dp.Query([dp.count(upper=1, name="n"), dp.sum_("x", 0, 5, name="s")], privacy_unit="u", epsilon=1.0,
                 group_by=("g",), max_partitions_contributed=100, public_partitions=["a"])
    for tolerances, asked, noise in (({"n": 2, "s": 3}, "n +-2, s +-3", "n +-6, s +-30"),
                                     ({"n": 7, "s": 3}, "n +-7, s +-3", "s +-30")):
        with pytest.raises(InvalidQueryError) as err:
            accuracy.smallest_epsilon(q, tolerances)
        assert str(err.value) == (
            f"no epsilon up to 100 meets the tolerable noise {asked}: even at epsilon "
            f"100 the noise is {noise} (at 95%); tolerate at least that, or lower the sensitivity (narrower bounds, "
            "a smaller max_partitions_contributed)")
    assert accuracy.smallest_epsilon(q, {"n": 6, "s": 30}) <= 100


@pytest.mark.parametrize("max_noise, shown", [(0, "0"), (-2.5, "-2.5"), (float("inf"), "inf"), (True, "True"),
                                              ("ten", "'ten'"), ("-5%", "'-5%'"), ({"n": "0%"}, "'0%'")])
def test_a_plan_s_tolerable_noise_that_is_not_a_positive_number_or_percentage_is_refused_naming_it(max_noise, shown):
    """The plan's tolerable noise (alone or per statistic) must be a number above 0 or a percentage of the
    reference value: anything else is refused in one sentence naming the statistic, the two accepted forms
    and the value as given (a percentage as written, not the number it comes to)."""
    q = dp.Query([dp.count(upper=1, name="n")], privacy_unit="u", epsilon=1.0)
    with pytest.raises(InvalidQueryError) as err:
        risk.choose_epsilon_for_plan(q, trust="low", sensitivity="high", max_risk=0.2, max_noise=max_noise, n=16, m=2)
    assert str(err.value) == ("the tolerable noise of 'n' must be a number > 0 or a percentage such as '10%', "
                              f"got {shown}")


def test_an_average_s_promised_interval_names_the_mechanism_of_its_noise():
    """An AVG's line names the noise of its sum (discrete Laplace here, Gaussian under noise="gaussian")."""
    for noise, mechanism in (("laplace", "discrete Laplace"), ("gaussian", "discrete Gaussian")):
        q = dp.Query([dp.avg("x", 0, 20, name="mean")], privacy_unit="u", epsilon=1.0, delta=1e-6, noise=noise)
        (line,) = [s.describe() for s in accuracy.statistic_intervals(q, reference_count=250)]
        assert line.startswith("mean: +-") and line.endswith(f"for a group of 250 people ({mechanism}, epsilon 1)"), line


def test_a_statistic_the_engine_would_refuse_at_that_epsilon_promises_an_infinite_interval():
    """At an epsilon so small that the noise would be over 2^20 times the sensitivity, the engine refuses
    to release (pure noise); the promised half-width of a count, a sum and an average is then infinite,
    a number every comparison with a tolerance handles, and the line says so."""
    q = dp.Query([dp.count(upper=1, name="n"), dp.sum_("x", 0, 20, name="s"), dp.avg("x", 0, 20, name="mean")],
                 privacy_unit="u", epsilon=1.0)
    far = accuracy.statistic_intervals(q, epsilon=1e-9, reference_count=250)
    assert [s.halfwidth for s in far] == [math.inf] * 3
    assert all(s.describe().startswith(f"{s.name}: +-inf") for s in far), [s.describe() for s in far]
    assert all(math.isfinite(s.halfwidth) for s in accuracy.statistic_intervals(q, epsilon=1.0, reference_count=250))


def test_a_plan_whose_risk_no_epsilon_can_meet_is_refused_with_the_floor_and_the_remedy():
    """The risk without any release, s (1 - t) / n = 0.7 x 0.7 / 4, is above the tolerable 0.05: the
    plan chooser refuses, naming that floor and what to change."""
    with pytest.raises(InvalidQueryError) as caught:
        risk.choose_epsilon_for_plan(PLAN, trust="low", sensitivity="high", max_risk=0.05, max_noise=10, n=4, m=2)
    assert str(caught.value) == (
        "no epsilon keeps the risk within 0.05: even without any release the risk is s (1 - t) / n = 0.122. Raise "
        "the tolerable risk above that, or share with a more trusted recipient; nothing is released")


def test_a_negative_level_is_the_lowest_level():
    assert [risk.level_name(x) for x in (-0.1, -0.3, -0.5, -5.0)] == ["very low"] * 4


def test_the_plan_summary_quotes_each_tolerance_asked_beside_its_promise():
    c = risk.choose_epsilon_for_plan(PLAN, trust="low", sensitivity="high", max_risk=0.2, max_noise=10, n=16, m=2)
    assert ("people (count): a count of 100 would be released as 100 +- 10, i.e. between 90 and 110 with 90% "
            "probability (tolerance asked: +-10).") in c.summary
    assert "average_age (avg): +- " in c.summary and "(tolerance asked" not in c.summary.split("average_age (avg)")[1]


def test_the_plan_summary_states_a_failure_probability_only_for_a_plan_that_spends_delta():
    """A plan with delta 0 (one count, no partition selection) states its guessing bound as certain,
    with no "may fail" clause; a plan whose partition selection spends delta states that delta."""
    count = dp.Query([dp.count(upper=1, name="people")], privacy_unit="id", epsilon=1.0)
    c = risk.choose_epsilon_for_plan(count, trust="low", sensitivity="high", max_risk=0.2, max_noise=10, n=16, m=2)
    assert c.summary == (
        "Epsilon 0.2187 for the whole plan (people 0.2187); one person's data can affect all of it. An attacker who "
        "knows everyone else's data guesses a person's value (one of 16; a changed value: exponent 2 x 0.2187) with "
        "probability at most 9%; the risk of sharing is 0.05 (very low; within your tolerable 0.2). people (count): a "
        "count of 100 would be "
        "released as 100 +- 10, i.e. between 90 and 110 with 90% probability (tolerance asked: +-10).")
    selected = risk.choose_epsilon_for_plan(PLAN, trust="low", sensitivity="high", max_risk=0.2, max_noise=10, n=16,
                                            m=2)
    assert ("(one of 16; a changed value: exponent 2 x 0.8749) with probability at most 28% (the bound may fail with "
            "probability delta = 1e-06); the risk of sharing is ") in selected.summary


def test_the_refusal_for_two_tolerances_lists_each_as_asked_and_each_noise_the_risk_allows():
    """Two statistics given a tolerable noise: the refusal lists both as asked, comma-separated, then the
    noise each would have at the epsilon the risk allows (a count's half-width whole, an average's as the
    pages write it, dp_core.display), word for word."""
    with pytest.raises(InvalidQueryError) as err:
        risk.choose_epsilon_for_plan(PLAN, trust="low", sensitivity="high", n=16, m=2, max_risk=0.2,
                                     max_noise={"people": 3, "average_age": 0.5}, reference_count=500)
    assert str(err.value) == (
        "the tolerable noise (people +-3, average_age +-0.5 at 90%) needs a total epsilon of at least 3.841 for this "
        "plan, but the tolerable risk (0.2) allows at most 1.168. Relax one: accept noise of people +-8 (asked +-3); "
        "average_age +-1.64 (asked +-0.5) at 90% (the noise at epsilon 1.168), or accept a risk of 0.487 instead of "
        "0.2 (the risk at epsilon 3.841); nothing is released")


def test_the_refusal_quotes_the_risk_of_the_bound_the_attacker_model_gives():
    """With dv / df = 2 (an attacker twice as good at telling values apart), the risk the tolerable noise
    needs is that of the weaker bound, in both halves of the refusal: the risk allows half the epsilon
    (0.584 against 1.17 at dv / df = 1) and the noise's epsilon carries a risk of 0.49 (0.487 at 1)."""
    with pytest.raises(InvalidQueryError) as err:
        risk.choose_epsilon_for_plan(PLAN, trust="low", sensitivity="high", n=16, m=2, max_risk=0.2,
                                     max_noise={"people": 3, "average_age": 0.5}, reference_count=500, dv_over_df=2.0)
    assert str(err.value) == (
        "the tolerable noise (people +-3, average_age +-0.5 at 90%) needs a total epsilon of at least 3.841 for this "
        "plan, but the tolerable risk (0.2) allows at most 0.5841. Relax one: accept noise of people +-16 (asked +-3); "
        "average_age +-3.29 (asked +-0.5) at 90% (the noise at epsilon 0.5841), or accept a risk of 0.49 instead of "
        "0.2 (the risk at epsilon 3.841); nothing is released")


@pytest.mark.parametrize("prefer", ["privacy", "accuracy"])
def test_the_plan_choice_records_which_epsilon_was_preferred(prefer):
    """The choice says which rule chose its epsilon (the platform's explanation quotes it): "privacy", the
    smallest that meets the noise, or "accuracy", the largest within the risk."""
    c = risk.choose_epsilon_for_plan(PLAN, trust="low", sensitivity="high", max_risk=0.2, max_noise=10, n=16, m=2,
                                     prefer=prefer)
    assert c.prefer == prefer
    assert c.epsilon == (c.epsilon_noise if prefer == "privacy" else c.epsilon_risk)


@pytest.mark.parametrize("count", [0, -5, 0.5, math.nan, math.inf, 1e13])
def test_an_average_s_promise_for_a_group_of_no_sensible_size_is_refused(count):
    """A reference count below one person, NaN or beyond 10^12 states no promise: it gave an average's
    half-width of NaN or of a negative group, hence an epsilon of 7.6e-6 "meeting" +-2.5 for a count of 0."""
    refused = f"must be a number of people from 1 to 1e+12, got {count!r}"
    with pytest.raises(InvalidQueryError, match=re.escape(refused)):
        risk.choose_epsilon_for_plan(PLAN, trust="low", sensitivity="high", max_risk=0.3, n=16, m=2,
                                     max_noise={"average_age": 2.5}, reference_count=count)
    with pytest.raises(InvalidQueryError, match=re.escape(refused)):
        accuracy.smallest_epsilon(PLAN, {"average_age": 2.5}, reference_count=count)
    with pytest.raises(InvalidQueryError, match=re.escape(refused)):
        accuracy.statistic_intervals(PLAN, reference_count=count)
