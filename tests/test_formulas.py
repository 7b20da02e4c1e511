"""Formulas against their derivations (dp-engine.md): thresholds, keep probabilities, zCDP,
and the sensitivity and scale of every aggregate for C_u = 1 and C_u > 1."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

import dp_core as dp
from dp_core import partition_selection as ps
from dp_core.accounting import eps_from_rho, plan_budget, rho_from_eps_delta, zcdp_delta
from dp_core.intervals import laplace_mixture_tail, laplace_sum_halfwidth
from dp_core.pld_accounting import gaussian_rho


@pytest.mark.parametrize("eps,delta,cu", [(1.0, 1e-6, 1), (1 / 3, 1e-6, 4), (0.1, 1e-9, 10), (2.0, 1e-3, 3)])
def test_laplace_tau_matches_its_derivation(eps, delta, cu):
    tau = ps.laplace_tau(eps, delta, cu)
    b = cu / eps
    per_partition = math.exp(-(tau - 1) / b) / 2  # P[1 + Lap(b) >= tau]
    assert 1 - (1 - per_partition) ** cu == pytest.approx(delta, rel=1e-9)


@pytest.mark.parametrize("eps,delta,cu", [(1.0, 1e-6, 1), (1 / 3, 1e-6, 4), (0.1, 1e-9, 10), (5.0, 1e-2, 2)])
def test_discrete_threshold_is_the_smallest_safe_integer(eps, delta, cu):
    T = ps.discrete_laplace_threshold(eps, delta, cu)
    q = math.exp(-eps / cu)
    p_keep_single = lambda t: q ** (t - 1) / (1 + q) if t > 1 else 1.0
    assert 1 - (1 - p_keep_single(T)) ** cu <= delta * (1 + 1e-12)
    assert 1 - (1 - p_keep_single(T - 1)) ** cu > delta
    assert abs(T - ps.laplace_tau(eps, delta, cu)) < 1 + 1 / (1 - q)  # close to the continuous tau


def test_per_partition_delta_keeps_its_digits():
    d = ps.per_partition_delta(1e-12, 7)
    assert 1 - (1 - d) ** 7 == pytest.approx(1e-12, rel=1e-3)
    assert d == pytest.approx(1e-12 / 7, rel=1e-9)


@pytest.mark.parametrize("eps,delta,cu", [(1.0, 1e-6, 1), (1 / 3, 1e-6, 4), (0.05, 1e-8, 2), (3.0, 1e-5, 1)])
def test_truncated_geometric_meets_the_dp_constraints(eps, delta, cu):
    n = np.arange(0, 5000)
    p = ps.truncated_geometric_keep_probability(n, eps, delta, cu)
    e, d = eps / cu, ps.per_partition_delta(delta, cu)
    assert p[0] == 0 and p[1] == pytest.approx(d, rel=1e-9)
    assert np.all(np.diff(p) >= -1e-15) and p.max() <= 1
    # (e, d)-DP for neighbouring counts n, n+1, both directions (Desfontaines et al. 2022, eq. 1-2)
    tol = 1e-12
    assert np.all(p[1:] <= math.exp(e) * p[:-1] + d + tol)
    assert np.all(1 - p[:-1] <= math.exp(e) * (1 - p[1:]) + d + tol)
    assert p[-1] == 1.0  # large partitions are always kept


def test_truncated_geometric_is_tight_where_it_grows_fastest():
    """Optimality: below n1 the first constraint holds with equality (p(n+1) = e^e p(n) + d)."""
    e, d = 0.25, 1e-6
    p = ps.truncated_geometric_keep_probability(np.arange(0, 20), e, d, 1)
    assert np.allclose(p[1:8], math.exp(e) * p[0:7] + d, rtol=1e-9)


def test_zcdp_conversion_round_trips():
    for eps, delta in [(1.0, 1e-6), (0.1, 1e-9), (5.0, 1e-3)]:
        rho = rho_from_eps_delta(eps, delta)
        assert eps_from_rho(rho, delta) == pytest.approx(eps, rel=1e-12)


def test_laplace_sum_tail_formula_matches_monte_carlo_free_integration():
    """P(|X1 + X2| > x) from partial fractions equals numerical convolution of the densities."""
    from scipy import integrate

    b1, b2, x = 1.0, 2.5, 3.0
    f = lambda y, b: math.exp(-abs(y) / b) / (2 * b)
    tail = lambda t: integrate.quad(lambda y: f(y, b1) * (math.exp(-(t - y) / b2) / 2 if t - y >= 0 else 1 - math.exp((t - y) / b2) / 2), -60, 60, limit=400)[0]
    two_sided = 2 * tail(x)
    assert laplace_mixture_tail(np.array([x]), np.array([[b1, b2]]))[0] == pytest.approx(two_sided, rel=1e-6)
    # one component: the plain Laplace quantile b ln(1/alpha)
    assert laplace_sum_halfwidth(np.array([[2.0, 0.0]]), 0.05)[0] == pytest.approx(2 * math.log(20), rel=1e-6)


def test_each_partition_s_interval_scales_with_its_own_noise_only():
    """Partitions are independent: a partition whose noise scales are 1e-12 of another's gets an interval
    1e-12 as wide, exactly as if it were computed alone (not floored at the other partition's scale)."""
    base = np.array([2.0, 0.5, 1.0])
    both = laplace_sum_halfwidth(np.vstack([base, base * 1e-12]), 0.05)
    alone = laplace_sum_halfwidth(np.atleast_2d(base * 1e-12), 0.05)
    assert both[0] > 0
    assert both[1] == pytest.approx(alone[0], rel=1e-9)
    assert both[1] == pytest.approx(both[0] * 1e-12, rel=1e-6)


def test_a_partition_s_interval_is_its_own_beside_one_whose_noise_is_1e20_times_larger():
    """Per-partition bounds can differ by 2^90: each partition's half-width is searched from its own
    bracket, so a partition beside one 1e20 times noisier gets exactly the half-width it gets alone."""
    base = np.array([2.0, 0.5, 1.0])
    both = laplace_sum_halfwidth(np.vstack([base * 1e20, base]), 0.05)
    alone = laplace_sum_halfwidth(np.atleast_2d(base), 0.05)
    assert both[1] == alone[0] and both[0] == pytest.approx(alone[0] * 1e20, rel=1e-12)


def test_the_laplace_half_width_is_the_smallest_whose_tail_is_at_most_alpha():
    """The half-width h of a sum of Laplace noises is the smallest with P(|sum| > h) <= alpha: when
    alpha is exactly the tail at some x (as the tail function computes it), h is x or below, never
    above (a wider interval than promised). Checked for one, two and three scales at several x."""
    for scales in ([1.0], [0.5, 2.0], [0.3, 1.0, 4.0]):
        s = np.array([scales])
        for x in (0.7, 3.0, 11.0):
            alpha = float(laplace_mixture_tail(np.array([x]), s)[0])
            h = float(laplace_sum_halfwidth(s, alpha)[0])
            assert h <= x, (scales, x, h)
            assert laplace_mixture_tail(np.array([h]), s)[0] <= alpha
            assert h == pytest.approx(x, rel=1e-12)


def _records(result):
    return {m.target: m for m in result.mechanisms}


@pytest.mark.parametrize("cu", [1, 3])
def test_every_aggregate_states_its_sensitivity_and_scale(cu):
    df = pd.DataFrame({"u": [1, 1, 2, 3], "g": ["a", "b", "a", "b"], "x": [1.0, 2.0, 3.0, 4.0], "i": [1, 2, 3, 4]})
    aggs = [
        dp.count(upper=5, name="c"), dp.count(upper=2, column="x", name="cx"), dp.count_units(name="cu"),
        dp.sum_("i", -10, 4, name="s"), dp.avg("x", 0, 8, name="a"), dp.var("x", 2, 6, name="v"),
        dp.stddev("x", -1, 1, name="sd"), dp.median("x", 0, 10, name="m"),
    ]
    q = dp.Query(aggs, privacy_unit="u", group_by=("g",), epsilon=2.0, delta=1e-5,
                 max_partitions_contributed=cu, public_partitions=["a", "b"])
    r = dp.execute(q, df)
    rec = _records(r)
    eps_each = 2.0 / len(aggs)  # public partitions: no selection share
    expected = {  # target -> (per-partition D, epsilon of the component)
        "c.count": (5, eps_each), "cx.count": (2, eps_each), "cu.count": (1, eps_each), "s.sum": (10, eps_each),
        "a.N": (1, eps_each / 2), "a.S": (4, eps_each / 2),
        "v.N": (1, eps_each / 3), "v.S": (2, eps_each / 3), "v.Q": (4, eps_each / 3),
        "sd.N": (1, eps_each / 3), "sd.S": (1, eps_each / 3), "sd.Q": (1, eps_each / 3),
    }
    for target, (d, eps) in expected.items():
        m = rec[target]
        assert m.sensitivity_per_partition == d and m.max_partitions == cu and m.sensitivity == cu * d
        assert m.epsilon == pytest.approx(eps)
        # Laplace scale C_u * ceil(D / g) * g / eps, which is C_u D / eps whenever g divides D
        assert m.scale == pytest.approx(cu * math.ceil(d / m.grid) * m.grid / eps, rel=1e-12)
        assert m.scale >= cu * d / eps
    med = rec["m"]
    assert med.mechanism.startswith("exponential") and med.sensitivity_per_partition == 0.5
    assert med.epsilon == pytest.approx(eps_each)
    assert sum(s.epsilon for s in r.budget) == pytest.approx(2.0) and r.delta_spent == 0.0


def test_gaussian_scale_follows_the_pools_rho():
    df = pd.DataFrame({"u": range(100), "g": ["a", "b"] * 50, "x": np.linspace(0, 1, 100)})
    q = dp.Query([dp.sum_("x", 0, 3, name="s"), dp.count(name="c")], privacy_unit="u", group_by=("g",),
                 epsilon=1.0, delta=1e-6, max_partitions_contributed=4, noise="gaussian", public_partitions=["a", "b"])
    r = dp.execute(q, df)
    rho = gaussian_rho(1.0, 1e-6)  # both aggregates pool the whole budget (the exact Gaussian curve)
    rec = _records(r)
    s = rec["s.sum"]
    assert s.mechanism == "discrete Gaussian" and s.rho == pytest.approx(rho / 2)
    assert s.sensitivity == pytest.approx(2 * 3)  # L2: sqrt(C_u) * D
    assert s.scale == pytest.approx(math.sqrt(4) * math.ceil(3 / s.grid) * s.grid / math.sqrt(2 * rho / 2))
    c = rec["c.count"]
    assert c.grid == 1 and c.scale == pytest.approx(2 * 1 / math.sqrt(rho))


def test_the_gaussian_pool_is_converted_tightly_and_validly():
    """The zCDP accountant (the fallback of the exact one, tests/test_pld_accounting.py) converts the
    Gaussian aggregates' pooled share by Canonne-Kamath-Steinke, not the simple bound: on the L workload's plan (COUNT + SUM, C_u 4, epsilon 1, delta 1e-6, private partitions)
    sigma is at least 15% below the simple conversion's, and the pool's rho still implies its
    (epsilon, delta) share by the conversion's own formula."""
    q = dp.Query([dp.count(upper=10), dp.sum_("x", 0, 1000)], privacy_unit="u", group_by=("g",),
                 epsilon=1.0, delta=1e-6, max_partitions_contributed=4, noise="gaussian")
    plan = plan_budget(q, accountant="zcdp")
    pool = [plan.aggregate_shares[i] for i in (0, 1)]
    eps_g, delta_g, rho_g = sum(s.epsilon for s in pool), sum(s.delta for s in pool), sum(s.rho for s in pool)
    assert (eps_g, delta_g) == pytest.approx((2 / 3, 2e-6 / 3))
    assert zcdp_delta(rho_g, eps_g) <= delta_g
    sigma_ratio = math.sqrt(rho_from_eps_delta(eps_g, delta_g) / rho_g)  # sigma ~ 1 / sqrt(rho)
    assert sigma_ratio <= 0.85
    assert "Canonne, Kamath and Steinke" in plan.accountant
    assert plan_budget(dp.Query([dp.count()], privacy_unit="u", group_by=("g",), epsilon=1.0)).accountant.startswith(
        "basic composition")


def test_budget_split_sums_to_the_query_budget():
    q = dp.Query([dp.count(), dp.sum_("x", 0, 1, weight=2.0), dp.avg("x", 0, 1)], privacy_unit="u",
                 group_by=("g",), epsilon=1.2, delta=1e-6, noise="gaussian")
    plan = plan_budget(q)
    assert plan.selection == "truncated-geometric"
    assert plan.epsilon == pytest.approx(1.2) and plan.delta == pytest.approx(1e-6)
    weights = {"partition selection": 1, "count": 1, "sum_x": 2, "avg_x": 1}
    for s in plan.shares:
        assert s.epsilon == pytest.approx(1.2 * weights[s.part] / 5)
    # only the count of units, private partitions: the threshold's count is the release (no double spend)
    only = plan_budget(dp.Query([dp.count_units()], privacy_unit="u", group_by=("g",), epsilon=1.0))
    assert only.selection == "laplace-threshold" and only.reused == {0}
    assert [s.part for s in only.shares] == ["partition selection"] and only.epsilon == 1.0


def test_a_sum_of_gaussians_half_width_is_z_975_times_the_root_of_their_variances():
    from dp_core.intervals import gaussian_sum_halfwidth

    assert gaussian_sum_halfwidth(np.array([[3.0, 4.0], [1.0, 0.0]]), 0.05) == pytest.approx(
        [1.959963984540054 * 5, 1.959963984540054], rel=1e-12)


def test_a_sum_s_standard_deviation_from_integer_scales_is_computed_in_floats_without_overflow():
    """sum_sd takes any array of scales: integer ones (here 3e9 and 4e9, whose int64 squares would
    overflow) are read as floats, so the root of the summed variances is exact, not wrapped around."""
    from dp_core.intervals import sum_sd

    scales = np.array([[3_000_000_000, 4_000_000_000]], dtype=np.int64)
    assert sum_sd("gaussian", scales).tolist() == [5e9]
    assert sum_sd("laplace", scales).tolist() == [math.sqrt(2.0) * 5e9]


def test_a_small_variance_s_interval_reaches_down_below_it_towards_zero_not_up_to_one():
    """VAR (and STDDEV) of values in [0, 1] (20,000 units, one row each): the released variance (about
    1/12) lies inside its interval, whose lower end is clipped at 0, the least a variance can be, and not
    higher (clipped at 1 it came out at the cap 1/4, above the value); at epsilon 1 the interval is a few
    thousandths wide, and a variance as large as the cap is hundreds of noise SDs away."""
    values = (np.arange(20_000) % 1000) / 999.0
    df = pd.DataFrame({"uid": np.arange(20_000), "x": values})
    for kind in ("var", "stddev"):
        q = dp.Query([dp.Aggregate(kind, column="x", lower=0.0, upper=1.0, name="v")], privacy_unit="uid",
                     epsilon=1.0)
        row = dp.execute(q, df).table.iloc[0]
        assert row["v_ci_low"] <= row["v"] <= row["v_ci_high"] and row["v_ci_high"] - row["v_ci_low"] < 0.05


def test_a_sum_with_several_noiseless_components_has_the_half_width_of_its_one_noisy_component():
    """Components of scale zero add no noise, however many: a Laplace of scale 2 beside two of them has
    the plain Laplace half-width 2 ln(1/alpha), not an interval collapsed to nothing."""
    assert laplace_sum_halfwidth(np.array([[2.0, 0.0, 0.0]]), 0.05)[0] == pytest.approx(2 * math.log(20), rel=1e-6)
