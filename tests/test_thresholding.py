"""Partition selection: a partition that exists because of a single unit is released with
probability at most delta, checked exactly and by simulation (end to end, through the engine).

Simulation bound: with N single-unit partitions and release probability p <= delta, the released
count is Binomial(N, p); the test allows N delta + 6 sd (false failure < 1e-8) and would see a
breach of 2 delta (mean N 2 delta is far beyond that limit)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

import dp_core as dp
from dp_core import noise
from dp_core import partition_selection as ps
from dp_core.accounting import Share


def limit(trials: int, p: float) -> float:
    return trials * p + 6 * math.sqrt(trials * p * (1 - p))


@pytest.mark.parametrize("strategy", ["laplace-threshold", "truncated-geometric"])
@pytest.mark.parametrize("cu", [1, 3])
def test_single_unit_partitions_are_released_at_most_delta(strategy, cu):
    delta, eps = 1e-3, 1.0  # the largest delta the engine accepts (input_checks.MAX_DELTA)
    units = 400_000
    # every unit alone in its own C_u partitions
    df = pd.DataFrame({"uid": np.repeat(np.arange(units), cu), "part": np.arange(units * cu), "x": 1})
    aggs = [dp.count_units()] if strategy == "laplace-threshold" else [dp.count()]
    q = dp.Query(aggs, privacy_unit="uid", group_by=("part",), epsilon=eps, delta=delta,
                 max_partitions_contributed=cu, selection=strategy)
    r = dp.execute(q, df)
    assert r.partition_selection.startswith(strategy)
    released_parts = r.table["part"].to_numpy()
    units_exposed = len(np.unique(released_parts // cu))  # units with at least one partition out
    share = r.budget[0]
    assert share.part == "partition selection" and share.delta == pytest.approx(delta)
    assert units_exposed <= limit(units, delta)
    assert 2 * delta * units - 6 * math.sqrt(units * 2 * delta) > limit(units, delta)  # a 2x breach is seen
    if strategy == "truncated-geometric":  # exactly d per partition: also not far below
        d = ps.per_partition_delta(delta, cu)
        assert abs(len(released_parts) - units * cu * d) < 6 * math.sqrt(units * cu * d)


def test_laplace_threshold_exact_probability_for_a_single_unit():
    for eps, delta, cu in [(1.0, 1e-6, 1), (0.3, 1e-6, 4), (2.0, 1e-9, 8)]:
        share = Share("partition selection", eps, delta)
        T = ps.discrete_laplace_threshold(eps, delta, cu)
        q = math.exp(-eps / cu)
        p_single = q ** (T - 1) / (1 + q)
        assert 1 - (1 - p_single) ** cu <= delta
        # the engine's own selection uses that threshold
        sel = ps.select_laplace_threshold(np.array([1, 10_000]), share, cu)
        assert sel.threshold == T and sel.keep[1]


def test_large_partitions_survive_and_the_laplace_count_is_released_once():
    df = pd.DataFrame({"uid": np.arange(5000), "part": np.repeat(["a", "b"], 2500)})
    r = dp.execute(dp.Query([dp.count_units(name="n")], privacy_unit="uid", group_by=("part",),
                            epsilon=1.0, delta=1e-6), df)
    assert list(r.table["part"]) == ["a", "b"]
    assert r.budget[0].epsilon == 1.0 and len(r.budget) == 1  # no second spend for the count
    assert r.mechanisms[0].target.startswith("partition selection")
    half = noise.discrete_laplace_halfwidth(1.0, 0.05)  # scale C_u / eps = 1
    assert np.all(r.table["n_ci_high"] - r.table["n"] == half)


def test_laplace_threshold_keeps_a_count_equal_to_the_threshold():
    """Kept means noisy count >= T (the threshold's derivation): at epsilon 60 the discrete Laplace
    noise is 0 except with probability below 1e-25, so counts T - 1, T, T + 5 give drop, keep, keep.
    The public description names the law's scale and the threshold."""
    share = Share("partition selection", 60.0, 1e-6)
    threshold = ps.discrete_laplace_threshold(60.0, 1e-6, 1)
    chosen = ps.select_laplace_threshold(np.array([threshold - 1, threshold, threshold + 5]), share, 1)
    assert chosen.keep.tolist() == [False, True, True] and chosen.threshold == threshold
    assert chosen.noisy_units.record.mechanism.startswith("discrete Laplace")
    assert chosen.description == f"noisy count of units (discrete Laplace, scale {1 / 60:.4g}) >= threshold {threshold}"


def test_mad_selection_outside_the_engine_names_what_is_missing():
    """select_mad needs the first round the plan drew: called without it, one clear error."""
    share = Share("partition selection", 1.0, 1e-6, 0.01)
    q = dp.Query([dp.count()], privacy_unit="uid", group_by=("g",), epsilon=1.0, delta=1e-6, selection="mad")
    for rows in (None, pd.DataFrame({"_w2": [1]})):
        with pytest.raises(RuntimeError, match="needs its first round"):
            ps.select_mad(np.array([1]), share, 1, rows=rows, query=q)


def test_the_mechanisms_listed_account_for_the_whole_budget_with_reused_unit_counts_and_inferred_bounds():
    """Laplace-threshold selection whose noisy unit counts are released as COUNT(DISTINCT unit), beside a
    SUM whose bounds are inferred: the release lists every mechanism that spent budget (the bounds' too),
    and their epsilons add up to the epsilon spent."""
    rng = np.random.default_rng(1)  # test data only
    df = pd.DataFrame({"uid": np.arange(4000), "g": rng.choice(["a", "b"], 4000), "x": rng.uniform(0, 50, 4000)})
    q = dp.Query([dp.count_units(name="people"), dp.Aggregate("sum", column="x", name="s")], privacy_unit="uid",
                 group_by=("g",), epsilon=2.0, delta=1e-6, selection="laplace-threshold")
    r = dp.execute(q, df)
    assert [m.target for m in r.mechanisms] == ["bounds of s", "partition selection: distinct units", "s.sum"]
    assert sum(m.epsilon for m in r.mechanisms) == pytest.approx(r.epsilon_spent) == pytest.approx(2.0)


def test_the_discrete_laplace_threshold_is_one_above_the_smallest_tail_within_the_partition_s_delta():
    """T = 1 + the smallest m with q^m / (1 + q) <= d (q = e^(-eps / C_u), d the per-partition delta):
    checked where log(d (1 + q)) / log(q) lies 5e-10 below the integer 10 (m = 10 fits, 9 does not; a
    threshold one higher drops partitions for nothing) and at ordinary deltas."""
    q = math.exp(-1.0)
    for delta in (math.exp(-(10 - 5e-10)) / (1 + q), 1e-5, 1e-9, 3e-7):
        threshold = ps.discrete_laplace_threshold(1.0, delta, 1)
        d = ps.per_partition_delta(delta, 1)
        assert q ** (threshold - 1) / (1 + q) <= d < q ** (threshold - 2) / (1 + q), (delta, threshold)
    assert ps.discrete_laplace_threshold(1.0, math.exp(-(10 - 5e-10)) / (1 + q), 1) == 11


def test_the_discrete_laplace_threshold_steps_up_where_the_closed_form_lies_just_past_an_integer():
    """Where log(d (1 + q)) / log(q) lies 5e-10 above the integer 10, the closed form's ceiling (its
    1e-9 slack for rounding) gives m = 10, which does not fit (q^10 / (1 + q) > d): the rounding guard
    steps on to m = 11, so T = 12, and m = 11 fits."""
    q = math.exp(-1.0)
    delta = math.exp(-(10 + 5e-10)) / (1 + q)
    d = ps.per_partition_delta(delta, 1)
    assert math.ceil(math.log(d * (1 + q)) / math.log(q) - 1e-9) == 10 and q**10 / (1 + q) > d
    assert ps.discrete_laplace_threshold(1.0, delta, 1) == 12
    assert q**11 / (1 + q) <= d


def test_a_release_says_its_partitions_were_kept_by_the_truncated_geometric_law():
    df = pd.DataFrame({"uid": np.arange(600), "g": np.arange(600) % 3})
    result = dp.execute(dp.Query([dp.count(upper=1, name="n")], privacy_unit="uid", epsilon=1.0, delta=1e-6,
                                 group_by=("g",), selection="truncated-geometric"), df)
    assert result.partition_selection == (
        "truncated-geometric: each partition kept with the near-optimal probability p(n) of its unit count "
        "(truncated geometric, Desfontaines et al. 2022)")


@pytest.mark.parametrize("strategy", ["laplace-threshold", "truncated-geometric", "weighted_gaussian", "mad", "mad_damped"])
def test_every_selection_is_recorded_with_its_share_so_the_mechanisms_account_for_the_whole_budget(strategy):
    """Whatever the strategy, the release lists the partition selection among its mechanisms, with its
    sensitivity over a unit's C_u = 2 partitions and its share: the records' epsilons and deltas add up to
    the (epsilon, delta) spent, so an auditor checks the budget from the records alone (the truncated
    geometric's selection was missing from them: its share was spent but not listed)."""
    units = np.arange(3000)
    df = pd.DataFrame({"uid": np.repeat(units, 2), "g": np.stack([units % 3, 3 + units % 3], axis=1).ravel()})
    q = dp.Query([dp.count(upper=1, name="n")], privacy_unit="uid", group_by=("g",), epsilon=2.0, delta=1e-6,
                 max_partitions_contributed=2, selection=strategy)
    r = dp.execute(q, df)
    chosen = [m for m in r.mechanisms if m.target.startswith("partition selection")]
    assert chosen and all(m.max_partitions == 2 for m in chosen)
    assert sum(m.epsilon for m in r.mechanisms) == pytest.approx(r.epsilon_spent, rel=1e-12)
    assert sum(m.delta for m in r.mechanisms) == pytest.approx(r.delta_spent, rel=1e-12)
    assert sum(m.epsilon for m in chosen) == pytest.approx(r.budget[0].epsilon, rel=1e-12)
