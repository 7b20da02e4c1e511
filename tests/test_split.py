"""The split by need (dp_core/split.py): each part gets what its tolerance needs, the total drops,
and every promise is the released report's interval; the selection's need is checked against
release probabilities computed here from each mechanism's law, independently of the code."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pandas as pd
import pytest

import dp_core as dp
from dp_core import InvalidQueryError, accuracy, risk
from dp_core.accounting import plan_budget
from dp_core.split import GroupNeed, group_release_probability, need_split, needed_epsilon

# the seed's example (risk.md): counts of disease state (S, I, R, D: n = 4) per village, a changed
# state (m = 2); trust low, sensitivity high; +-10 at 90%, a group of 30 residents released with 95%
VILLAGES = dp.Query([dp.count(name="residents")], privacy_unit="resident", group_by=("village", "state"),
                    epsilon=1.0, delta=1e-6, confidence=0.9)
SEED = {"trust": "low", "sensitivity": "high", "max_risk": 0.3, "max_noise": 10, "n": 4, "m": 2, "p": 0.9}
SEED_GROUPS = {"units": 30, "probability": 0.95}


@pytest.fixture(scope="module")
def villages():
    rng = np.random.default_rng(5)  # test data only; the noise comes from the CSPRNG
    sizes = rng.integers(20, 600, size=25)
    rows = [{"resident": f"v{v}-{i}", "village": f"v{v}", "state": str(rng.choice(list("SIRD"), p=[.6, .2, .15, .05]))}
            for v, size in enumerate(sizes) for i in range(int(size))]
    return pd.DataFrame(rows)


def test_the_seed_example_needs_at_least_a_fifth_less_epsilon_and_its_release_keeps_the_promise(villages):
    with pytest.raises(InvalidQueryError, match="needs a total epsilon of at least 0.996"):
        risk.choose_epsilon_for_plan(VILLAGES, **SEED, groups=SEED_GROUPS)  # the equal split: above the risk
    equal = needed_epsilon(VILLAGES, {"residents": 10}, GroupNeed(30, 0.95), confidence=0.9)
    c = risk.choose_epsilon_for_plan(VILLAGES, **SEED, groups=SEED_GROUPS, split="need")
    assert c.epsilon <= 0.8 * equal and c.split.equal_epsilon == equal
    assert "Budget split by need: residents" in c.summary and "a group of 30 units" in c.summary
    query = replace(VILLAGES, epsilon=c.epsilon, part_weights=c.split.part_weights)
    result = dp.execute(query, villages)
    assert result.epsilon_spent == pytest.approx(c.epsilon, rel=1e-12)
    shown = (result.table["residents_ci_high"] - result.table["residents_ci_low"]) / 2.0
    assert shown.max() == c.promised("residents").halfwidth <= 10  # the report's interval is the promise
    assert any("Budget split by the given part weights" in n for n in result.notes)
    sel = plan_budget(query).selection_share
    assert keep_probability_by_recursion(30, sel.epsilon, sel.delta, 1) >= 0.95


def keep_probability_by_recursion(n: int, epsilon: float, delta: float, cu: int) -> float:
    """The truncated geometric keep probability from its defining recursion (Desfontaines et al.
    2022): p(0) = 0, p(k) = min(e^e p(k-1) + d, 1 - e^-e (1 - d - p(k-1)), 1), e = eps / C_u and
    d = 1 - (1 - delta)^(1/C_u): the largest p allowed by (e, d)-DP between k - 1 and k units."""
    e, d = epsilon / cu, 1.0 - (1.0 - delta) ** (1.0 / cu)
    p = 0.0
    for _ in range(n):
        p = min(math.exp(e) * p + d, 1.0 - math.exp(-e) * (1.0 - d - p), 1.0)
    return p


def discrete_laplace_release_by_sum(n: int, threshold: int, scale: float) -> float:
    """P[n + K >= T] for the discrete Laplace K (P(K = k) proportional to exp(-|k| / scale)), by summing its mass."""
    k = np.arange(-4000, 4001)
    mass = np.exp(-np.abs(k) / scale)
    return float(mass[n + k >= threshold].sum() / mass.sum())


@pytest.mark.parametrize("units", [1, 5, 20, 60])
@pytest.mark.parametrize("cu", [1, 3])
def test_release_probabilities_agree_with_each_law_computed_independently(units, cu):
    from dp_core.partition_selection import discrete_laplace_threshold

    q = dp.Query([dp.count(name="c")], privacy_unit="u", group_by=("g",), epsilon=0.7, delta=1e-5,
                 max_partitions_contributed=cu, selection="truncated-geometric")
    sel = plan_budget(q).selection_share
    assert group_release_probability(q, plan_budget(q), units) == pytest.approx(
        keep_probability_by_recursion(units, sel.epsilon, sel.delta, cu), rel=1e-9, abs=1e-15)
    lap = replace(q, aggregates=(dp.count_units(name="c"),), selection="laplace-threshold")
    share = plan_budget(lap).selection_share
    t = discrete_laplace_threshold(share.epsilon, share.delta, cu)
    assert group_release_probability(lap, plan_budget(lap), units) == pytest.approx(
        discrete_laplace_release_by_sum(units, t, cu / share.epsilon), rel=1e-9, abs=1e-15)


@pytest.mark.parametrize("selection", ["weighted_gaussian", "mad", "mad_damped"])
def test_a_gaussian_selection_s_release_probability_is_a_lower_bound_of_the_exact_sum(selection):
    """The weighted selections' bound against the discrete Gaussian's mass summed exactly, each unit
    weighing its least weight in every round: q_{C_u}, or in damped MAD's round 2 half the weight of
    a unit with one damped group and C_u - 1 undamped, floor(2^16 / sqrt(4 C_u - 3))."""
    from dp_core.selection_damped import rounds_of
    from dp_core.selection_weighted import unit_weights

    q = dp.Query([dp.count(name="c")], privacy_unit="u", group_by=("g",), epsilon=1.0, delta=1e-6,
                 max_partitions_contributed=4, selection=selection, noise="gaussian")
    budget = plan_budget(q)
    for units in (10, 40, 80):
        missed = 1.0
        for r, rnd in enumerate(rounds_of(selection, budget.selection_share, 4, q.epsilon)):
            sigma = rnd["sigma"]
            k = np.arange(-math.ceil(12 * sigma), math.ceil(12 * sigma) + 1, dtype=np.float64)
            mass = np.exp(-k * k / (2 * sigma * sigma))
            damped = r == 1 and selection == "mad_damped"
            weight = units * (math.isqrt(4**16 // 13) if damped else unit_weights(4)[-1])  # 4 C_u - 3 = 13
            missed *= 1.0 - float(mass[weight + k >= rnd["threshold"]].sum() / mass.sum())
        bound = group_release_probability(q, budget, units)
        assert bound <= 1.0 - missed + 1e-12 and bound >= 1.0 - missed - 1e-3


ADULT = dp.Query([dp.count(upper=1, name="people"), dp.avg("age", 17, 90, name="average_age"),
                  dp.avg("hours_per_week", 1, 99, name="weekly_hours")], privacy_unit="person_id",
                 group_by=("education",), epsilon=1.0, delta=1e-6, confidence=0.9)


@pytest.mark.parametrize("noise", ["laplace", "gaussian"])
def test_every_need_is_met_and_binding_and_parts_without_one_keep_the_equal_share(noise):
    query = replace(ADULT, noise=noise)
    tolerances = {"people": 10, "average_age": 3}
    split = need_split(query, tolerances, confidence=0.9)
    weighted = replace(query, part_weights=split.part_weights)
    got = {s.name: s.halfwidth for s in accuracy.statistic_intervals(weighted, split.epsilon)}
    assert all(got[n] <= t for n, t in tolerances.items())
    worse = {s.name: s.halfwidth for s in accuracy.statistic_intervals(weighted, split.epsilon * (1 - 1e-6))}
    assert any(worse[n] > t for n, t in tolerances.items())  # the smallest total for these weights
    assert split.epsilon <= split.equal_epsilon
    shares = {s.part: s.epsilon for s in plan_budget(replace(weighted, epsilon=split.epsilon)).shares}
    equal = {s.part: s.epsilon for s in plan_budget(replace(query, epsilon=split.equal_epsilon)).shares}
    for part in ("weekly_hours", "partition selection"):  # no tolerance: the equal split's epsilon (at least:
        # the Gaussian pool's fixed point stops within 1e-3 of the sum of the parts' epsilons)
        assert equal[part] <= shares[part] <= equal[part] * (1 + (1e-3 if noise == "gaussian" else 1e-9))
    reasons = dict(split.reasons)
    assert reasons["weekly_hours"].startswith("no tolerance given") and reasons["people"] == "needs +-10"


@pytest.fixture(scope="module")
def platform(tmp_path_factory):
    """A fresh home with Adult registered, as the demo does (no Prefect: the pipeline's functions)."""
    from pathlib import Path

    from dprelease import admin, pipeline
    from dprelease.settings import Settings

    settings = Settings.from_env({"DPRELEASE_HOME": str(tmp_path_factory.mktemp("split-home"))})
    admin.init(settings)
    data = Path(__file__).resolve().parents[1] / "examples" / "data" / "adult.csv.gz"
    admin.register_dataset(settings, "adult", data, "person_id", epsilon_cap=5.0, delta_cap=1e-5, add_row_id=True)
    return pipeline.Platform.open(settings)


def test_the_demo_request_needs_a_fifth_less_and_its_report_keeps_every_promise(platform):
    from dprelease import pipeline
    from dprelease.cli.demo import REQUEST
    from dprelease.requests import parse_request

    request = parse_request(REQUEST)
    assert request.risk["split"] == "need"
    planned = pipeline.plan(platform, request)
    decision = pipeline.choose_epsilon(platform, planned)
    choice = decision.risk_choice
    tolerances = choice.tolerances
    equal = needed_epsilon(planned.query, tolerances, GroupNeed(100, 0.9), confidence=0.9)
    assert choice.epsilon <= 0.8 * equal  # 1.15 against 1.61
    with pytest.raises(pipeline.ReleaseError, match="the tolerable risk"):  # the equal split is over the risk
        eq = parse_request({**REQUEST, "epsilon": {"risk": {**REQUEST["epsilon"]["risk"], "split": "equal"}}})
        pipeline.choose_epsilon(platform, pipeline.plan(platform, eq))
    result = pipeline.compute_sealed(platform, "split-demo", planned, decision)
    assert result.epsilon_spent == pytest.approx(decision.epsilon, rel=1e-12)
    assert any(n.startswith("Budget split by need") for n in result.notes) and "Budget split by need" in result.explain()
    summary = pipeline.controller_summary("split-demo", planned, decision, result)
    assert "Budget split by need: people 19.0% (needs +-10)" in summary and "(29% less)" in summary
    from dprelease.reporting import pages

    page = pages.render_analyst_report(result, pipeline.report_context("split-demo", planned, decision,
                                                                       approved_by="alice", decided_at=None))
    assert "Budget split by need: people 19.0%" in page and "Accountant: basic composition" in page
    counts = result.table["people"]
    for s in choice.promise:
        shown = (result.table[f"{s.name}_ci_high"] - result.table[f"{s.name}_ci_low"]) / 2.0
        if s.kind == "count":
            assert shown.max() == s.halfwidth <= tolerances[s.name]
        else:  # an average's promise: a group of at least the reference count whose mean is within the bounds
            big = counts >= s.reference_count
            assert big.any() and (shown[big] <= tolerances[s.name] * (1 + 1e-12)).all(), s.name
    sel = plan_budget(replace(planned.query, epsilon=decision.epsilon, part_weights=choice.split.part_weights))
    share = sel.selection_share
    assert keep_probability_by_recursion(100, share.epsilon, share.delta, 1) >= 0.9


@pytest.mark.parametrize("fields,words", [
    ({"split": "needy"}, ("split: Input should be 'equal' or 'need'", "split must be 'equal' or 'need'")),
    ({"groups": {"units": 0}}, ("groups.units must be a whole number of units >= 1",) * 2),
    ({"groups": {"units": 10, "probability": 1.5}}, ("groups.probability must be in (0, 1)",) * 2),
    ({"groups": {"units": 10, "chance": 0.5}}, ("groups: Extra inputs are not permitted", "got {'units': 10, 'chance'")),
])
def test_bad_split_fields_are_refused_by_the_request_and_the_chooser_alike(fields, words):
    from dprelease.cli.demo import REQUEST
    from dprelease.requests import parse_request

    fields_ = {**REQUEST["epsilon"]["risk"], **fields}
    with pytest.raises(InvalidQueryError) as parsed:
        parse_request({**REQUEST, "epsilon": {"risk": fields_}})
    assert words[0] in str(parsed.value)
    with pytest.raises(InvalidQueryError) as chosen:
        risk.choose_epsilon_for_plan(ADULT, **fields_)
    assert words[1] in str(chosen.value)


def test_a_group_need_without_partition_selection_is_refused():
    public = replace(ADULT, public_partitions=("HS-grad", "Bachelors"))
    with pytest.raises(InvalidQueryError, match="selects no groups"):
        need_split(public, {"people": 10}, GroupNeed(10, 0.9))


def test_with_a_fixed_total_the_need_weights_give_the_smallest_worst_ratio_of_interval_to_tolerance():
    """prefer='accuracy' fixes the total (the largest within the risk): the need split's weights then
    equalise the tolerated statistics' ratios, and no other split of their epsilon (the untolerated
    selection keeping its share) has a smaller worst ratio."""
    from dp_core.split import ratios

    tolerances = {"people": 10, "average_age": 6, "weekly_hours": 8}
    c = risk.choose_epsilon_for_plan(ADULT, trust="low", sensitivity="high", max_risk=0.3, max_noise=tolerances, n=16,
                                     m=2, split="need", prefer="accuracy")
    assert c.epsilon == pytest.approx(c.epsilon_risk)
    need = ratios(ADULT, c.split, tolerances, c.epsilon, confidence=0.9)
    assert max(need.values()) <= 1.0  # the total is above the need split's: every tolerance met
    fractions = dict(c.split.part_weights)
    rest = 1.0 - fractions["selection"]  # the selection has no tolerance: it keeps its share (the rule)
    assert max(need.values()) - min(need.values()) < 1e-3  # equalised
    for people, age in ((1, 1), (1, 2), (1, 3), (2, 3), (0.8, 2), (0.9, 1.6)):
        parts = {"people": people, "average_age": age, "weekly_hours": age}
        norm = sum(parts.values())
        weights = ((k, rest * w / norm) for k, w in parts.items())
        other = replace(c.split, part_weights=(*weights, ("selection", fractions["selection"])))
        worst = max(ratios(ADULT, other, tolerances, c.epsilon, confidence=0.9).values())
        assert max(need.values()) <= worst + 1e-9, (people, age)


def test_a_statement_of_two_dp_selects_cannot_be_split_by_need(platform):
    from dprelease import pipeline
    from dprelease.cli.demo import REQUEST
    from dprelease.requests import parse_request

    sql = ("WITH a AS (SELECT WITH ANONYMIZATION sex, ANON_COUNT(*, 1) AS people FROM adult GROUP BY sex), "
           "b AS (SELECT WITH ANONYMIZATION sex, ANON_AVG(age, 17, 90) AS age FROM adult GROUP BY sex) "
           "SELECT a.sex, people, age FROM a JOIN b USING (sex)")
    risk_fields = {**REQUEST["epsilon"]["risk"], "max_noise": 10}
    request = parse_request({**REQUEST, "sql": sql, "epsilon": {"risk": risk_fields}})
    with pytest.raises(pipeline.ReleaseError, match="split: need chooses the shares of one DP SELECT, and this SQL has 2"):
        pipeline.plan(platform, request)


@pytest.mark.parametrize("weights,words", [
    ((("nobody", 1.0),), "part_weights names 'nobody', which is not a part of the query (parts: people, average_age"),
    ((("people", 0.0),), "the weight of 'people' must be a positive number, got 0.0"),
    ((("people", float("nan")),), "the weight of 'people' must be a positive number"),
    ((("people",),), "part_weights must be ((part, weight), ...)"),
])
def test_part_weights_naming_no_part_or_without_a_positive_weight_are_refused(weights, words):
    with pytest.raises(InvalidQueryError) as err:
        replace(ADULT, part_weights=weights).validate()
    assert words in str(err.value)
    with pytest.raises(InvalidQueryError, match="'selection', which is not a part"):
        replace(ADULT, public_partitions=("HS-grad",), part_weights=(("selection", 1.0),)).validate()


def test_part_weights_set_the_shares_and_a_mapping_is_accepted():
    q = replace(ADULT, part_weights={"selection": 1.0, "people": 3.0})
    shares = {s.part: s.epsilon for s in plan_budget(q).shares}
    assert shares == pytest.approx({"partition selection": 1 / 6, "people": 3 / 6, "average_age": 1 / 6,
                                    "weekly_hours": 1 / 6})
