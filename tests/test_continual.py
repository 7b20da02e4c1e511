"""The tree mechanism for running totals (dp_core.continual): its shape, its user-level
sensitivity (checked against every contribution pattern of small horizons), each prefix total's
noise variance against the formula (through the engine's own noise), the sealed node noise, the
exact intervals, and the bounding of units over the horizon (dp_core.continual_bounding)."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pandas as pd
import pytest

from dp_core.continual import (
    ContributionBound,
    TreeNoise,
    all_nodes,
    calibrate_tree,
    l2_sensitivity_squared,
    levels,
    node_value,
    prefix_nodes,
    release_period,
    sum_halfwidth,
)
from dp_core.continual_bounding import bounded_period_values
from dp_core.errors import DPError
from dp_core.noise import discrete_gaussian_halfwidth


def covered(node):
    h, end = node
    return set(range(end - (1 << h) + 1, end + 1))


@pytest.mark.parametrize("horizon", [1, 2, 7, 8, 12, 13, 64])
def test_every_prefix_is_a_disjoint_union_of_nodes_completed_by_then(horizon):
    nodes = all_nodes(horizon)
    assert len(nodes) == len(set(nodes))
    for t in range(1, horizon + 1):
        parts = prefix_nodes(t)
        assert len(parts) == bin(t).count("1")
        union = set().union(*(covered(n) for n in parts))
        assert union == set(range(1, t + 1)) and sum(len(covered(n)) for n in parts) == t
        assert all(n in nodes and n[1] <= t for n in parts)  # released by period t, never later
    assert {h for h, _ in nodes} == set(range(levels(horizon)))


def node_vector(horizon, contribution):
    """Every node's change for a unit's contribution vector over the periods (one group)."""
    leaves = np.asarray(contribution, dtype=np.int64).reshape(-1, 1)
    return np.array([node_value(leaves, n)[0] for n in all_nodes(horizon)])


@pytest.mark.parametrize("horizon", [4, 8, 12])
@pytest.mark.parametrize("k", [1, 2, 3, 12])
def test_the_l2_sensitivity_bounds_every_contribution_pattern_and_is_reached(horizon, k):
    """Every vector with entries in {-B, 0, B} (B = 2) on at most k periods: the nodes' squared
    L2 change is at most the formula, and a unit in the first k periods reaches it."""
    b, bound = 2, l2_sensitivity_squared(horizon, 2, k, 1)
    worst = 0
    for size in range(1, min(k, horizon) + 1):
        for periods in itertools.combinations(range(horizon), size):
            for signs in ([1] * size, [(-1) ** i for i in range(size)]):
                c = np.zeros(horizon, dtype=np.int64)
                c[list(periods)] = b * np.asarray(signs)
                worst = max(worst, int((node_vector(horizon, c) ** 2).sum()))
    assert worst <= bound
    first_k = np.zeros(horizon, dtype=np.int64)
    first_k[: min(k, horizon)] = b
    assert int((node_vector(horizon, first_k) ** 2).sum()) == bound  # reached: the bound is the sensitivity
    assert l2_sensitivity_squared(horizon, 2, k, 3) == 3 * bound  # C_u groups add up in L2^2


def test_each_prefix_total_variance_equals_the_tree_formula():
    """200,000 independent trees (one per group column) through the engine's noise: each S_t's
    sample variance is within 6.5 standard errors of popcount(t) * the node law's exact variance
    (the sample variance of n draws has relative sd sqrt((kurtosis - 1) / n), kurtosis <= 3.05
    here; each of the 12 checks fails with probability below 1e-9 under a normal approximation
    whose error at n = 2e5 is far below that margin). A formula counting one node too many or too
    few (50% off at least) is far outside."""
    n, horizon = 200_000, 12
    cal = calibrate_tree(horizon=horizon, bound=ContributionBound(1, 1), rho=0.5, confidence=0.95)
    noise = TreeNoise(groups=n)
    exact = np.zeros((horizon, n), dtype=np.int64)
    for t in range(1, horizon + 1):
        released = release_period(cal, noise, exact[:t])
    margin = 6.5 * math.sqrt(2.05 / n)
    for t in range(1, horizon + 1):
        totals = released.totals[t - 1]
        expected = cal.prefix_variance(t)
        assert expected == len(prefix_nodes(t)) * cal.node_variance
        assert abs(totals.var() / expected - 1.0) < margin, (t, totals.var(), expected)
        # the total is exactly the sum of its nodes (nothing else added)
        assert np.array_equal(totals, sum((noise.nodes[node]).astype(float) for node in prefix_nodes(t)))
    fourth = np.mean(released.totals[6] ** 4) / np.mean(released.totals[6] ** 2) ** 2
    assert fourth < 3.05  # the kurtosis assumed above
    # the intervals: at most alpha = 5% of totals outside, and one step narrower would leave more out
    # (the binomial's sd at n = 2e5 is 0.05%: 6 sd either side, false failure below 1e-8 per check)
    slack = 6 * math.sqrt(0.05 * 0.95 / n)
    for t in range(1, horizon + 1):
        half = cal.prefix_halfwidth(t)
        assert np.mean(np.abs(released.totals[t - 1]) > half) <= 0.05 + slack
        assert np.mean(np.abs(released.totals[t - 1]) > half - cal.grid) > 0.05 - slack


def test_node_noise_is_drawn_once_and_earlier_totals_never_change():
    cal = calibrate_tree(horizon=8, bound=ContributionBound(1, 1), rho=0.1, confidence=0.9)
    noise = TreeNoise(groups=3)
    exact = np.arange(24).reshape(8, 3)
    releases = [release_period(cal, noise, exact[:t]) for t in range(1, 9)]
    for earlier, later in zip(releases, releases[1:]):
        t = earlier.period
        assert np.array_equal(later.totals[:t], earlier.totals) and np.array_equal(later.values[:t], earlier.values)
    kept = {n: v.copy() for n, v in noise.nodes.items()}
    again = release_period(cal, noise, exact[:5])  # a period released again: the same numbers
    assert np.array_equal(again.totals, releases[4].totals)
    assert all(np.array_equal(noise.nodes[n], v) for n, v in kept.items())
    restored = TreeNoise.from_dict(noise.to_dict())
    assert np.array_equal(release_period(cal, restored, exact).totals, releases[-1].totals)
    skipped = TreeNoise(groups=3)  # periods 1-2 never released: their nodes are drawn with period 3's
    assert skipped.extend(cal, 3) == [(0, 1), (0, 2), (1, 2), (0, 3)] and skipped.extend(cal, 3) == []
    with pytest.raises(DPError, match="outside the horizon"):
        noise.extend(cal, 9)


@pytest.mark.parametrize("variance,count", [(4, 2), (2.5, 3), (30, 4), (0.3, 2)])
def test_the_interval_is_read_from_the_exact_law_of_the_sum(variance, count):
    """The FFT convolution against direct convolution of the node law: the same smallest m."""
    alpha = 0.05
    assert sum_halfwidth(variance, 1, alpha) == discrete_gaussian_halfwidth(math.sqrt(variance), alpha)
    from dp_core.noise import gaussian_parameters

    s2 = float(gaussian_parameters(variance).variance)
    width = math.ceil(40 * math.sqrt(s2)) + 2
    k = np.arange(-width, width + 1)
    node = np.exp(-(k * k) / (2 * s2))
    node /= node.sum()
    law = node
    for _ in range(count - 1):
        law = np.convolve(law, node)
    centre = len(law) // 2
    outside = [1 - law[centre - m: centre + m + 1].sum() for m in range(len(law) // 2)]
    assert sum_halfwidth(variance, count, alpha) == next(m for m, p in enumerate(outside) if p <= alpha)


def test_the_tree_beats_the_naive_sum_where_units_are_bounded_over_the_horizon():
    """T = 12, B = 1: counted in one period (distinct units to date) the tree's month-12 interval
    is at most 40% of the naive sum of monthly releases at rho / 12 each; counted every month it is
    wider (no mechanism beats the naive sum on S_T when S_T's own sensitivity is T B)."""
    for rho in (0.005, 0.05, 0.5):
        once = calibrate_tree(horizon=12, bound=ContributionBound(1, 1), rho=rho, confidence=0.95)
        assert once.prefix_halfwidth(12) <= 0.4 * once.naive_prefix_halfwidth(12)
        assert once.prefix_variance(12) / once.naive_prefix_variance(12) == pytest.approx(8 / 144, rel=0.02)
        always = calibrate_tree(horizon=12, bound=ContributionBound(1, 12), rho=rho, confidence=0.95)
        assert always.prefix_halfwidth(12) > always.naive_prefix_halfwidth(12)


def test_calibration_refuses_bad_parameters_in_one_line():
    for kwargs, words in (({"horizon": 0}, "horizon"), ({"horizon": 5000}, "horizon"), ({"rho": 0.0}, "rho"),
                          ({"bound": ContributionBound(0, 1)}, "per-period"),
                          ({"bound": ContributionBound(1, 0)}, "periods"), ({"quantum": 0.1}, "power of two")):
        args = {"horizon": 12, "bound": ContributionBound(1, 1), "rho": 0.1, "confidence": 0.95, **kwargs}
        with pytest.raises(DPError, match=words):
            calibrate_tree(**args)


# ---------------------------------------------------------------------------------------------
# bounding the units over the horizon
# ---------------------------------------------------------------------------------------------


def frame(rows):
    return pd.DataFrame(rows, columns=["uid", "period", "region", "amount"])


def test_a_unit_counts_in_its_first_k_periods_and_first_groups_only():
    data = frame([(1, 1, "n", 5), (1, 2, "n", 6), (1, 3, "s", 7), (1, 3, "n", 1), (2, 2, "n", 1), (2, 2, "s", 1),
                  (2, 2, "n", 1), (2, 2, "n", 1), (3, 3, "x", 9)])
    common = {"unit": "uid", "period": "period", "groups": ["n", "s"], "group_by": "region", "value": "amount"}
    assert bounded_period_values(data, statistic="COUNT", periods=2, per_period=2, **common).tolist() == \
        [[1, 0], [3, 0], [0, 0]]  # unit 1: periods 1-2 in n; unit 2: 3 rows in n clamped to 2; x not public
    assert bounded_period_values(data, statistic="COUNT", periods=3, per_period=2, max_groups=2, **common).tolist() \
        == [[1, 0], [3, 1], [1, 1]]
    assert bounded_period_values(data, statistic="SUM", periods=1, per_period=4, **common).tolist() == \
        [[4, 0], [3, 0], [0, 0]]
    assert bounded_period_values(data, statistic="COUNT_DISTINCT", periods=1, max_groups=2, **common).tolist() == \
        [[1, 0], [1, 1], [0, 1]]  # unit 1 in s first in period 3


def test_bounding_a_neighbour_changes_only_its_own_contribution_within_the_bound():
    """Adding one unit with rows in every period and group moves the bounded values by a vector
    the tree's sensitivity covers: at most B per (period, group), k periods, C_u groups."""
    rng = np.random.default_rng(7)  # test data only; never noise
    base = frame([(int(u), int(p), str(rng.choice(["a", "b", "c"])), int(rng.integers(0, 9)))
                  for u in range(60) for p in rng.choice(range(1, 9), size=rng.integers(1, 5))])
    star = frame([(999, p, g, 50) for p in range(1, 9) for g in "abc" for _ in range(3)])
    for statistic, k, b, cu in (("COUNT", 2, 2, 2), ("SUM", 3, 10, 1), ("COUNT_DISTINCT", 1, 1, 2)):
        args = {"unit": "uid", "period": "period", "groups": ["a", "b", "c"], "group_by": "region",
                "value": "amount", "statistic": statistic, "periods": k, "per_period": b, "max_groups": cu,
                "horizon": 8}
        diff = bounded_period_values(pd.concat([base, star]), **args) - bounded_period_values(base, **args)
        assert np.abs(diff).max() <= b and (np.abs(diff).sum(axis=1) > 0).sum() <= k
        assert (np.abs(diff).sum(axis=0) > 0).sum() <= cu
        assert np.abs(diff).sum() > 0


# (statistic, T, B, k, C_u): the declarations' forms; a grid of 32 steps (B = 3,125.03 steps), and a
# real column's SUM (B = 0.3: quantum 2^-34, grid 2^-13)
NEIGHBOURS = [("COUNT_DISTINCT", 12, 1, 1, 1), ("COUNT_DISTINCT", 13, 1, 1, 3), ("COUNT", 8, 2, 3, 2),
              ("COUNT", 16, 1, 16, 1), ("SUM", 12, 5, 4, 4), ("SUM", 7, 100_001, 2, 2), ("SUM", 8, 0.3, 2, 2)]


@pytest.mark.parametrize("statistic, horizon, b, k, cu", NEIGHBOURS)
def test_the_worst_neighbour_costs_exactly_the_horizons_rho(statistic, horizon, b, k, cu):
    """The calibration against the privacy loss it must bound, from the released parts only: a unit
    with many rows in every period and group is added to other units' data; both are bounded
    (continual_bounding) and rounded to the grid (leaf_steps) as released, and the unit's change of
    every node of every group, in grid steps, costs sum(change^2) / (2 s^2) in zCDP under the
    discrete Gaussian N_Z(0, s^2) the sampler draws (Canonne, Kamath and Steinke 2020: a shift v of
    N_Z(0, s^2) is v^2 / (2 s^2)-zCDP, and independent coordinates add up). That is at most rho,
    and the unit reaches it (the sampler rounds s^2 up by less than 2^-19): on the grid of 32 the
    other units' sums are 15 (mod 32), where B moves a leaf by ceil(B / g) = 3,126 steps (0 for the
    real column, where 0.3 is 2,457.6 steps, rounded up). A noise
    scale off by any factor, a level or the C_u groups missing from the sensitivity, B's steps
    rounded down, or a unit counted in more periods than declared costs more than rho; a scale too
    wide costs less."""
    from fractions import Fraction

    from dp_core.continual import leaf_steps
    from dp_core.continual_bounding import sum_quantum
    from dp_core.noise import gaussian_parameters

    rho = 0.05
    quantum = sum_quantum(b, float(b).is_integer()) if statistic == "SUM" else 1.0
    cal = calibrate_tree(horizon=horizon, bound=ContributionBound(b, k, cu), rho=rho, confidence=0.95, quantum=quantum)
    groups = ["a", "b", "c", "d"]
    rng = np.random.default_rng(3)  # test data only; never noise
    if quantum < 1:
        assert (quantum, cal.grid) == (2.0**-34, 2.0**-13)
        base = frame([(100 * p + i, p, g, 0.0) for p in range(1, horizon + 1) for i, g in enumerate(groups)])
    elif cal.grid == 1:
        base = frame([(int(u), int(p), str(rng.choice(groups)), int(rng.integers(0, b + 1)))
                      for u in range(40) for p in rng.choice(range(1, horizon + 1), size=3)])
    else:
        assert cal.grid == 32
        base = frame([(100 * p + i, p, g, 15) for p in range(1, horizon + 1) for i, g in enumerate(groups)])
    star = frame([(999, p, g, b) for p in range(1, horizon + 1) for g in groups
                  for _ in range(int(b) + 1 if b < 9 else 2)])
    args = {"unit": "uid", "period": "period", "groups": groups, "group_by": "region", "value": "amount",
            "statistic": statistic, "periods": k, "per_period": b, "max_groups": cu, "horizon": horizon,
            "quantum": quantum}
    with_unit = leaf_steps(cal, bounded_period_values(pd.concat([base, star]), **args))
    without = leaf_steps(cal, bounded_period_values(base, **args))
    change = [node_value(with_unit, n) - node_value(without, n) for n in all_nodes(horizon)]
    squares = sum(int(v) ** 2 for node in change for v in node)
    cost = Fraction(squares) / (2 * gaussian_parameters(cal.node_variance_parameter).variance)
    assert Fraction(rho) * (1 - Fraction(1, 2**19)) <= cost <= Fraction(rho), float(cost / Fraction(rho))


def test_bounding_refuses_what_it_cannot_bound():
    data = frame([(1, 1, "n", 5)])
    with pytest.raises(DPError, match="one of"):
        bounded_period_values(data, unit="uid", period="period", statistic="AVG", periods=1)
    with pytest.raises(DPError, match="value column"):
        bounded_period_values(data, unit="uid", period="period", statistic="SUM", periods=1)
    with pytest.raises(DPError, match="public groups"):
        bounded_period_values(data, unit="uid", period="period", statistic="COUNT", periods=1, group_by="region")
