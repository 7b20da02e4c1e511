"""Privacy risk indicators and Find-epsilon-from-PRI (pri.md)."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from scipy import stats
from stats_helpers import discrete_laplace_jittered_cdf

import dp_core as dp
from dp_core import pri
from dp_core.accounting import plan_budget
from dp_core.engine import exact_statistics, release

SEED = 4242


# ---------------------------------------------------------------- PRIs against brute force


def brute_force_pris(query, df, r, units, partitions: pd.DataFrame):
    """PRI_i = ||r - q(x_-i)||_1, re-running the engine's exact SQL without unit i.
    `partitions`: the keys in the order of r's entries."""
    keys = list(query.group_by)
    out = {}
    for u in units:
        rest = df[df["uid"] != u]
        if rest.empty:
            continue
        st_ = exact_statistics(query, rest, bounding_seed=SEED)
        q_minus = pri.exact_outputs(query, st_)
        total = 0.0
        for i, agg in enumerate(query.aggregates):
            if keys:  # align x_-i's partitions to x's; a vanished partition is empty
                frame = st_.rows[keys].assign(_v=q_minus[i])
                merged = partitions[keys].merge(frame, on=keys, how="left")
                empty = (float(agg.lower) + float(agg.upper)) / 2 if agg.kind == "avg" else 0.0
                values = merged["_v"].fillna(empty).to_numpy()
            else:
                values = q_minus[i]
            total += float(np.abs(r[i] - values).sum())
        out[u] = total
    return out


datasets = st.lists(
    st.tuples(st.integers(0, 7), st.sampled_from(["a", "b", "c"]), st.integers(-5, 30)), min_size=2, max_size=25
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rows=datasets, grouped=st.booleans(), kind=st.sampled_from(["count", "sum", "avg", "var"]),
       cu=st.integers(1, 2), real=st.booleans())
def test_pris_equal_brute_force_leave_one_out(rows, grouped, kind, cu, real):
    df = pd.DataFrame(rows, columns=["uid", "g", "x"])
    if real:  # real values: sums of quantised per-unit values
        df["x"] = df["x"] * 0.37
    df = pd.concat([df, pd.DataFrame({"uid": [99], "g": ["a"], "x": [1]})])  # >= 1 partition
    agg = {"count": dp.count(upper=2), "sum": dp.sum_("x", -3, 20), "avg": dp.avg("x", 0, 25),
           "var": dp.var("x", 0, 25)}[kind]
    query = dp.Query([agg], privacy_unit="uid", epsilon=1.0, group_by=("g",) if grouped else (),
                     max_partitions_contributed=cu, where="x <> 7")  # unit rows with x = 7 are filtered out
    c = pri.contributions(query, df, bounding_seed=SEED)
    r = pri.probe(c, 0.7)
    fast, base = pri.pris_for_probe(c, r)
    units = pd.factorize(c.stats.units["uid"])[1]
    brute = brute_force_pris(query, df, r, list(units), c.stats.rows)
    for idx, u in enumerate(units):
        assert fast[idx] == pytest.approx(brute[u], rel=1e-9, abs=1e-9)
    # units outside the filter change nothing: their PRI is the base
    outside = set(df["uid"]) - set(units)
    if outside:
        b = brute_force_pris(query, df, r, outside, c.stats.rows)
        assert all(v == pytest.approx(base, rel=1e-9, abs=1e-9) for v in b.values())


# ---------------------------------------------------------------- the seed's five queries


def seed_queries():
    kw = dict(privacy_unit="person_id", epsilon=1.0)
    return {
        "Q1": dp.Query([dp.count()], where="income = '>50K' AND education_num = 13 AND age = 25", **kw),
        "Q2": dp.Query([dp.count()], group_by=("marital_status",),
                       where="race = 'Asian-Pac-Islander' AND age BETWEEN 30 AND 40", **kw),
        "Q3": dp.Query([dp.count()], where="native_country <> 'United-States' AND sex = 'Female'", **kw),
        "Q4": dp.Query([dp.avg("hours_per_week", 1, 99)], where="workclass IN ('Federal-gov', 'Local-gov', 'State-gov')", **kw),
        "Q5": dp.Query([dp.sum_("fnlwgt", 0, 1_500_000)], where="capital_gain > 0 AND income = '<=50K' AND occupation = 'Sales'", **kw),
    }


@pytest.mark.parametrize("name", ["Q1", "Q2", "Q3", "Q4", "Q5"])
def test_larger_p_chooses_larger_epsilon_on_adult(adult, name):
    """As in the seed's Figure 10. Medians over 11 runs; measured here the p = 10 and p = 90
    choices barely overlap (e.g. Q2: at most 0.9 against at least 2), so the medians never cross."""
    q = seed_queries()[name]

    def median_eps(p):
        return float(np.median([pri.choose_epsilon_data(q, adult, p, ranges_for_all=False).epsilon for _ in range(11)]))

    assert median_eps(10) < median_eps(90)


# ---------------------------------------------------------------- public mode


def test_public_mode_reproduces_the_spec_numbers_for_a_count():
    """pri.md: for a count at p = 50 the single-test rule gives 0.5, the search median 2."""
    q = dp.Query([dp.count(upper=1)], privacy_unit="u", epsilon=1.0)
    assert pri.choose_epsilon_public(q, 50, rule="single").epsilon == 0.5
    assert pri.choose_epsilon_public(q, 50).epsilon == 2.0
    # the exact pass probability at 0.5: Z in (-inf, -2] U [-2/3, -1/3] U [1, inf), Z ~ Laplace(2)
    c = pri.choose_epsilon_public(q, 50)
    e = 0.5
    exact = (math.exp(-2 * e) + math.exp(-e) + math.exp(-e / 3) - math.exp(-2 * e / 3)) / 2
    assert c.pass_probability[c.candidates.index(0.5)] == pytest.approx(exact, abs=1e-4)
    summary = c.public_summary()  # what the published page states of the choice
    assert (summary["pass_probability"], summary["stop_probability"]) == (list(c.pass_probability),
                                                                          list(c.stop_probability))


def test_public_mode_chooses_the_same_epsilon_on_two_datasets(adult):
    q = dp.Query([dp.count(upper=1), dp.sum_("capital_gain", 0, 5000)], privacy_unit="person_id", epsilon=1.0,
                 group_by=("sex",), public_partitions=["Female", "Male"])
    other = adult.sample(frac=0.3, random_state=1).assign(capital_gain=0)
    a = pri.release_with_pri(q, adult, 50)
    b = pri.release_with_pri(q, other, 50)
    assert a.epsilon_choice.epsilon == b.epsilon_choice.epsilon
    assert a.epsilon_spent == pytest.approx(a.epsilon_choice.epsilon)
    assert a.epsilon_choice.mode == "public" and "end to end" in a.epsilon_choice.guarantee


def test_public_mode_refuses_what_needs_the_data():
    with pytest.raises(dp.InvalidQueryError, match="public mode"):
        pri.choose_epsilon_public(dp.Query([dp.avg("x", 0, 1)], privacy_unit="u", epsilon=1.0), 50)
    with pytest.raises(dp.InvalidQueryError, match="public mode"):
        pri.choose_epsilon_public(dp.Query([dp.count()], privacy_unit="u", epsilon=1.0, group_by=("g",)), 50)
    with pytest.raises(dp.InvalidQueryError, match="quantiles"):
        pri.choose_epsilon_public(dp.Query([dp.median("x", 0, 1)], privacy_unit="u", epsilon=1.0), 50)

def test_what_pris_cannot_choose_for_is_refused_whole_in_both_modes():
    """Bounds to be inferred, Gaussian noise, a quantile: each refused with its whole reason, by the public
    and the data-dependent chooser alike, before anything is read or spent."""
    df = pd.DataFrame({"u": range(20), "x": [1.0] * 20})
    cases = [
        (dp.Query([dp.Aggregate("sum", column="x", name="s")], privacy_unit="u", epsilon=1.0),
         "Find-epsilon-from-PRI needs the bounds set: PRIs are defined for fixed sensitivities"),
        (dp.Query([dp.count(upper=1)], privacy_unit="u", epsilon=1.0, noise="gaussian", delta=1e-6),
         "Find-epsilon-from-PRI assumes Laplace noise (as the seed does): use noise='laplace'"),
        (dp.Query([dp.median("x", 0, 1)], privacy_unit="u", epsilon=1.0),
         "PRIs are defined for additive noise on COUNT, SUM, AVG, VAR, STDDEV; not for ['median_x'] (quantiles use "
         "the exponential mechanism): fix epsilon or choose it by risk"),
    ]
    for q, message in cases:
        for choose in (lambda: pri.choose_epsilon_public(q, 50), lambda: pri.choose_epsilon_data(q, df, 50)):
            with pytest.raises(dp.InvalidQueryError) as caught:
                choose()
            assert str(caught.value) == message


def test_an_epsilon_grid_holding_zero_or_less_is_refused_as_it_was_given():
    q = dp.Query([dp.count(upper=1)], privacy_unit="u", epsilon=1.0)
    for grid, shown in (([0.0, 1.0], "[1.0, 0.0]"), ([-1.0], "[-1.0]"), ([float("inf")], "[inf]")):
        with pytest.raises(dp.InvalidQueryError) as caught:
            pri.choose_epsilon_public(q, 50, grid=grid)
        assert str(caught.value) == f"the epsilon grid must hold positive numbers, got {shown}"


def test_odometer_and_cap_limit_the_candidates(adult):
    q = seed_queries()["Q3"]
    choice = pri.choose_epsilon_data(q, adult, 100, spent=0.35, cap=1.0)  # p = 100 always passes
    assert all(0.35 < e <= 0.65 + 1e-12 for e in choice.candidates)
    assert choice.epsilon == max(choice.candidates)
    with pytest.raises(pri.NoEpsilonError, match="odometer"):
        pri.choose_epsilon_data(q, adult, 50, spent=10.0)
    with pytest.raises(pri.NoEpsilonError, match="nothing is released"):
        pri.choose_epsilon_data(q, adult, 0, grid=[5.0])  # p = 0: PRIs must all be equal


# ---------------------------------------------------------------- never release the probe


def test_released_noise_is_not_conditioned_on_the_test():
    """pri.md's counterexample: a count, p = 50, one candidate (0.5). The probes that pass are
    confined to Z in (-inf, -2] U [-2/3, -1/3] U [1, inf); the released fresh draws must follow the
    plain (discrete) Laplace of scale 2. KS at significance 1e-7 on both: the passing probes fail it,
    the releases pass it."""
    n = 400
    df = pd.DataFrame({"uid": np.arange(n), "inside": np.arange(n) % 2})
    q = dp.Query([dp.count(upper=1, name="c")], privacy_unit="uid", epsilon=0.5, where="inside = 1")
    c = pri.contributions(q, df)
    truth = float(c.exact[0][0])
    budget = plan_budget(q)
    released, probes = [], []
    for _ in range(3000):
        r = pri.probe(c, 0.5)
        pris, base = pri.pris_for_probe(c, r)
        lo, hi = min(pris.min(), base), max(pris.max(), base)
        if not pri.passes(lo, hi, 50):
            continue
        probes.append(r[0][0] - truth)
        out = release(q, c.stats.plan, budget, c.stats.rows)  # the engine's fresh draw
        released.append(out.table["c"].iloc[0] - truth)
    assert len(released) > 1200  # passes with probability ~0.55

    def jittered_ks(x):
        u = np.asarray(x) + (np.arange(len(x)) + 0.5) / len(x) - 0.5  # deterministic jitter
        return stats.kstest(u, discrete_laplace_jittered_cdf(2.0)).pvalue

    assert jittered_ks(released) > 1e-7
    assert jittered_ks(probes) < 1e-7


def test_the_exact_avg_var_and_stddev_are_those_of_the_units_values():
    """q(x) of a ratio, from the summed components N, S (centred) and Q: per partition the mean,
    the population variance and its square root of the units' values (one row per unit, within the
    bounds, so nothing is clamped)."""
    rng = np.random.default_rng(11)
    df = pd.DataFrame({"uid": np.arange(60), "g": np.repeat(["a", "b", "c"], 20), "x": rng.integers(0, 26, 60)})
    query = dp.Query([dp.avg("x", 0, 25), dp.var("x", 0, 25), dp.stddev("x", 0, 25)], privacy_unit="uid",
                     epsilon=1.0, group_by=("g",))
    stats = exact_statistics(query, df, bounding_seed=SEED)
    out = pri.exact_outputs(query, stats)
    x = df.groupby("g")["x"]
    order = stats.rows["g"].tolist()
    assert sorted(order) == ["a", "b", "c"]
    for i, expected in enumerate([x.mean(), x.var(ddof=0), x.std(ddof=0)]):
        assert out[i] == pytest.approx(expected[order].to_numpy(), rel=1e-9, abs=1e-9), query.aggregates[i].kind


def test_public_mode_simulates_a_sum_bounded_above_by_zero_over_its_own_bounds():
    """A SUM with bounds [-5, 0] is simulated over exactly those contributions: by the noise's
    symmetry its pass probabilities and choice equal those of its mirror [0, 5], and are not those
    of [-5, 1] (an upper bound of 0 was once read as a missing bound, i.e. 1)."""
    def choice(lower, upper):
        return pri.choose_epsilon_public(dp.Query([dp.sum_("x", lower, upper)], privacy_unit="u", epsilon=1.0), 50)

    below, mirror, wider = choice(-5, 0), choice(0, 5), choice(-5, 1)
    assert below.pass_probability == mirror.pass_probability and below.epsilon == mirror.epsilon
    assert below.pass_probability != wider.pass_probability


def test_the_public_domain_s_extremes_are_each_output_s_own():
    """For each output's noise z, the smallest and largest |z + c| - |z| over the contributions c a unit
    can make (a SUM: any c in [L, U], or 0 when absent), checked against a fine grid of c, output by
    output (one output's extremes never come from another's noise)."""
    z = np.array([[-7.5, 0.3, 12.0], [2.0, -0.4, -30.0]])
    lower, upper = -2.0, 5.0
    low, high = pri._domain_extremes(z, "sum", lower, upper)
    grid = np.concatenate([np.linspace(lower, upper, 7001), [0.0]])
    moved = np.abs(z[..., None] + grid) - np.abs(z)[..., None]
    assert np.allclose(low, moved.min(axis=-1), atol=1e-9) and np.allclose(high, moved.max(axis=-1), atol=1e-9)


def test_the_public_dict_carries_the_epsilon_choice_s_public_summary():
    """A release whose epsilon PRI chose states the choice in its public dict (and so in results.json),
    the public mode's beta included; a release at a given epsilon states none."""
    df = pd.DataFrame({"u": np.arange(3000), "x": np.arange(3000) % 7 * 1.0})
    q = dp.Query([dp.sum_("x", 0, 6, name="s")], privacy_unit="u", epsilon=1.0)
    chosen = pri.release_with_pri(q, df, 50, mode="public")
    assert chosen.to_dict()["epsilon_choice"] == chosen.epsilon_choice.public_summary()
    assert (chosen.to_dict()["epsilon_choice"]["mode"], chosen.to_dict()["epsilon_choice"]["beta"]) == ("public", 0.5)
    assert dp.execute(q, df).to_dict()["epsilon_choice"] is None


@pytest.mark.parametrize("p, beta, refusal", [
    (50, 0.0, "beta must be in (0, 1), got 0.0"), (50, 1.0, "beta must be in (0, 1), got 1.0"),
    (50, 1.5, "beta must be in (0, 1), got 1.5"), (50, math.nan, "beta must be in (0, 1), got nan"),
    (101, 0.5, "the percentage p must be in [0, 100], got 101"),
    (-1, 0.5, "the percentage p must be in [0, 100], got -1"),
])
def test_a_public_choice_with_p_or_beta_out_of_range_is_refused_naming_the_value(p, beta, refusal):
    """Public mode's p is a percentage and beta a probability strictly between 0 and 1 (the quantile of
    the simulated stop): anything else is refused before any simulation, in one sentence with the value."""
    q = dp.Query([dp.count(upper=1, name="people")], privacy_unit="person_id", epsilon=1.0)
    with pytest.raises(dp.InvalidQueryError) as caught:
        pri.choose_epsilon_public(q, p, beta=beta)
    assert str(caught.value) == refusal


def test_the_public_mode_s_refusal_and_its_simulated_uniforms():
    """Public mode: when no candidate passes, the refusal says so in full with its remedy; the data-free
    simulation's uniforms (SHAKE-256 of a public tag) spread over (0, 1), not a part of it."""
    q = dp.Query([dp.count(upper=1, name="people")], privacy_unit="person_id", epsilon=1.0)
    with pytest.raises(pri.NoEpsilonError) as caught:
        pri.choose_epsilon_public(q, 0, grid=[5.0])
    assert str(caught.value) == ("no candidate epsilon passes the PRI test at p = 0 with probability beta = 0.5 "
                                 "(public mode): nothing is released; raise p, lower beta, or allow smaller epsilons")
    u = pri._public_uniforms((100, 100), "a public tag")
    assert 0 < u.min() < 0.001 and 0.999 < u.max() < 1 and abs(u.mean() - 0.5) < 0.01


def test_a_data_mode_release_never_chooses_an_epsilon_above_the_dataset_s_cap():
    """release_with_pri in data mode passes the budget cap (and what is spent) to the choice: with p = 100
    every candidate passes, and the largest one within the cap is chosen and spent, not the grid's top."""
    df = pd.DataFrame({"uid": np.arange(500), "g": np.arange(500) % 2})
    q = dp.Query([dp.count(upper=1, name="n")], privacy_unit="uid", group_by=("g",), epsilon=1.0,
                 public_partitions=[0, 1])
    res = pri.release_with_pri(q, df, 100, mode="data", spent=0.2, cap=0.7)
    assert res.epsilon_choice.candidates and max(res.epsilon_choice.candidates) <= 0.5 + 1e-12
    assert res.epsilon_spent == res.epsilon_choice.epsilon == max(res.epsilon_choice.candidates)


def test_a_public_mode_release_never_chooses_an_epsilon_above_the_dataset_s_cap():
    """release_with_pri in public mode passes the budget cap (and what is spent) to the data-free choice too:
    with p = 100 every candidate passes, and the largest one within the cap is chosen and spent."""
    df = pd.DataFrame({"uid": np.arange(500), "g": np.arange(500) % 2})
    q = dp.Query([dp.count(upper=1, name="n")], privacy_unit="uid", group_by=("g",), epsilon=1.0,
                 public_partitions=[0, 1])
    res = pri.release_with_pri(q, df, 100, mode="public", spent=0.2, cap=0.7, controller_ranges=False)
    assert res.epsilon_choice.candidates and max(res.epsilon_choice.candidates) <= 0.5 + 1e-12
    assert res.epsilon_spent == res.epsilon_choice.epsilon == max(res.epsilon_choice.candidates)


def test_a_data_mode_release_searches_the_epsilon_grid_it_is_given():
    """release_with_pri in data mode searches the caller's grid, not the default one: with p = 100 every
    candidate passes, so the largest one given is chosen and spent."""
    df = pd.DataFrame({"uid": np.arange(500), "g": np.arange(500) % 2})
    q = dp.Query([dp.count(upper=1, name="n")], privacy_unit="uid", group_by=("g",), epsilon=1.0,
                 public_partitions=[0, 1])
    res = pri.release_with_pri(q, df, 100, mode="data", grid=[0.3, 0.7])
    assert res.epsilon_choice.candidates == (0.7, 0.3)
    assert res.epsilon_spent == res.epsilon_choice.epsilon == 0.7


def test_a_data_mode_choice_is_stated_as_data_mode_in_the_release_s_public_dict():
    """A release whose epsilon the data's PRIs chose says so in its public dict (results.json): mode "data",
    the data mode's guarantee, and no beta or pass probabilities (those belong to the public mode)."""
    df = pd.DataFrame({"uid": np.arange(500), "g": np.arange(500) % 2})
    q = dp.Query([dp.count(upper=1, name="n")], privacy_unit="uid", group_by=("g",), epsilon=1.0,
                 public_partitions=[0, 1])
    res = pri.release_with_pri(q, df, 100, mode="data", grid=[0.5], controller_ranges=False)
    assert res.to_dict()["epsilon_choice"] == {"epsilon": 0.5, "mode": "data", "p": 100.0, "rule": "search",
                                               "candidates": [0.5], "guarantee": pri.GUARANTEE["data"]}


@pytest.mark.parametrize("mode", ["public", "data"])
def test_the_controller_s_pri_ranges_come_from_the_release_s_own_engine_options(monkeypatch, mode):
    """The PRI ranges the controller sees are those of the rows the release bounds with its options (here
    the bounding seed, which picks the one partition each unit keeps of its four): with the probes' noise
    replayed, they equal the ranges computed from `contributions` at the same seed, draw for draw. Options
    dropped on the way would bound with a fresh seed from the OS and give other ranges."""
    from noise_replay import replay_noise

    df = pd.DataFrame({"uid": np.repeat(np.arange(400), 4), "g": np.tile(np.arange(4), 400)})
    df["x"] = (df["uid"] * 7 + df["g"] * 3) % 10 * 1.0
    q = dp.Query([dp.sum_("x", 0, 9, name="s")], privacy_unit="uid", group_by=("g",), epsilon=1.0,
                 public_partitions=[0, 1, 2, 3], max_partitions_contributed=1)
    replay_noise(monkeypatch, 11)
    chosen = pri.release_with_pri(q, df, 50, mode=mode, bounding_seed=SEED)
    candidates = chosen.epsilon_choice.candidates
    replay_noise(monkeypatch, 11)
    c = pri.contributions(q, df, bounding_seed=SEED)
    cache: dict = {}
    expected = tuple(pri.pri_range(c, e, 50, cache) for e in candidates)
    assert len(expected) == len(chosen.controller_only.pri_ranges) >= 3
    assert chosen.controller_only.pri_ranges == expected
    other = pri.contributions(q, df, bounding_seed=SEED + 1)  # the seed matters: other rows, other sums
    assert not np.array_equal(other.values[0], c.values[0])


def test_the_public_pass_probability_of_two_aggregates_equals_a_brute_force_over_every_unit():
    """Public mode with two aggregates over two public partitions (C_u = 1): for each simulated noise, the
    smallest and largest PRI any unit could have, found by trying every partition the unit could be in and
    every contribution it could make to each aggregate (0..2 rows, present or not), against the same public
    uniforms. The PRI's base is the noise of every output of both aggregates, not of the last one alone."""
    from dp_core.accounting import plan_budget

    q = dp.Query([dp.count(upper=2, name="rows"), dp.count_units(name="people")], privacy_unit="uid",
                 group_by=("g",), public_partitions=["a", "b"], epsilon=1.0, max_partitions_contributed=1)
    eps, p, sims, tag = 0.8, 40.0, 300, "a test tag"
    budget = plan_budget(dataclasses.replace(q, epsilon=eps))
    noise = []
    for i, (agg, top) in enumerate([(q.aggregates[0], 2), (q.aggregates[1], 1)]):
        share = budget.component_shares[(i, "count")]
        b = 1 * top / share.epsilon
        u = pri._public_uniforms((sims, 2), f"{tag}/{i}")
        noise.append((-b * np.sign(u - 0.5) * np.log1p(-2.0 * np.abs(u - 0.5)), top))
    passed = 0
    for s in range(sims):
        base = sum(np.abs(z[s]).sum() for z, _ in noise)
        pris = [base + sum(abs(z[s, j] + c) - abs(z[s, j]) for (z, _), c in zip(noise, (c0, c1)))
                for j in range(2) for c0 in range(noise[0][1] + 1) for c1 in range(noise[1][1] + 1)]
        passed += bool(pri.passes(min(pris), max(pris), p))
    assert pri.public_pass_probability(q, eps, p, sims, tag) == pytest.approx(passed / sims, abs=1e-12)
    assert 0 < passed < sims  # a probability the test can tell from 0 and 1


def test_a_unit_without_a_value_for_one_aggregate_has_no_term_from_it_in_its_pri():
    """Two sums, each with one unit's value (unit 1: x = 3, no y; unit 2: y = 4, no x), against the
    output r = (10, 10): base = |10 - 3| + |10 - 4| = 13; without unit 1 the outputs are (0, 4), PRI
    16; without unit 2 they are (3, 0), PRI 17. A unit with no value for an aggregate adds nothing
    for it, whichever unit comes last in the contributions."""
    df = pd.DataFrame({"uid": [1, 2], "x": [3.0, None], "y": [None, 4.0]})
    query = dp.Query([dp.sum_("x", 0, 5), dp.sum_("y", 0, 5)], privacy_unit="uid", epsilon=1.0)
    c = pri.contributions(query, df, bounding_seed=SEED)
    r = {0: np.array([10.0]), 1: np.array([10.0])}
    found, base = pri.pris_for_probe(c, r)
    units = pd.factorize(c.stats.units["uid"])[1]
    assert base == 13.0
    assert dict(zip(units.tolist(), found.tolist())) == {1: 16.0, 2: 17.0}


def test_the_unit_values_of_a_release_with_per_partition_bounds_are_clamped_to_their_partition_s_bounds():
    """With bounds inferred per partition (bounds_scope="partition") each unit's value, from
    which its PRI is computed, is clamped to its own partition's bounds (it failed to bind
    the per-partition bound columns until 2026-11-29)."""
    rng = np.random.default_rng(8)  # test data only
    rows = [(u, f"p{p}", int(rng.integers(0, 10 + 40 * p))) for u in range(600)
            for p in rng.choice(6, size=rng.integers(1, 4), replace=False) for _ in range(rng.integers(1, 3))]
    df = pd.DataFrame(rows, columns=["uid", "part", "x"])
    query = dp.Query([dp.sum_("x", 0, None)], privacy_unit="uid", group_by=("part",), epsilon=20.0, delta=1e-6,
                     max_partitions_contributed=3, bounds_scope="partition")
    stats = exact_statistics(query, df, with_units=True)
    bounds = stats.partition_bounds[0].set_index("part")
    units = stats.units.join(bounds, on="part", how="inner")
    assert len(units) > 0 and bounds["hi"].nunique() > 1
    assert (units["_u0"] <= units["hi"]).all() and (units["_u0"] >= units["lo"]).all()
    raw = df.groupby(["uid", "part"])["x"].sum().rename("raw")
    clipped = units.join(raw, on=["uid", "part"])
    assert (clipped["_u0"] == np.minimum(clipped["raw"], clipped["hi"])).all()
