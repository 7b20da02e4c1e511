"""The selection's keep probability as a function of group size (dp_core.selection_keep), checked
exactly: the Laplace threshold's closed form against the discrete Laplace law summed term by term
(in exact rationals of its q), a one-person group within delta's share, and the truncated geometric's
curve being the mechanism's own."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest

import dp_core as dp
from dp_core.partition_selection import (
    discrete_laplace_threshold,
    per_partition_delta,
    truncated_geometric_keep_probability,
)
from dp_core.selection_keep import keep_probability, laplace_threshold_keep_probability


def summed(n: int, epsilon: float, delta: float, cu: int) -> Fraction:
    """P(n + K >= T), K discrete Laplace: 1 - sum of P(K = k) for k < T - n, exactly in q."""
    q = Fraction(math.exp(-epsilon / cu))
    threshold = discrete_laplace_threshold(epsilon, delta, cu)
    c = (1 - q) / (1 + q)
    below = threshold - n - 1  # the largest k with n + k < T
    # P(K <= below) = sum over k <= below of c q^|k|; a geometric tail sum_{j >= a} q^j = q^a / (1 - q)
    if below >= 0:  # k = -inf..-1, then 0..below
        total = c * q / (1 - q) + sum((c * q**k for k in range(0, below + 1)), Fraction(0))
    else:  # k = -inf..below < 0: j = |k| from |below| on
        total = c * q ** (-below) / (1 - q)
    return 1 - total


@pytest.mark.parametrize("epsilon,delta,cu", [(0.5, 1e-6, 1), (1.0, 1e-5, 3), (0.1, 1e-6, 2), (3.0, 1e-9, 1)])
def test_the_laplace_threshold_s_keep_probability_is_the_summed_law(epsilon, delta, cu):
    threshold = discrete_laplace_threshold(epsilon, delta, cu)
    sizes = sorted({1, 2, threshold - 1, threshold, threshold + 1, 2 * threshold, threshold + 40})
    got = laplace_threshold_keep_probability(np.array(sizes), epsilon, delta, cu)
    for n, p in zip(sizes, got):
        assert p == pytest.approx(float(summed(n, epsilon, delta, cu)), rel=1e-9, abs=1e-15)
    # a group of one person appears with probability at most delta's per-group share
    assert got[0] <= per_partition_delta(delta, cu)
    assert np.all(np.diff(got) >= 0)


def test_a_query_s_curve_is_its_strategy_s():
    from dp_core.accounting import plan_budget

    units = dp.Query([dp.count_units()], privacy_unit="id", group_by=("g",), epsilon=1.0)
    strategy, p, _ = keep_probability(units, 1.0, [1, 10, 100])
    share = plan_budget(units).selection_share
    assert strategy == "laplace-threshold"
    assert list(p) == list(laplace_threshold_keep_probability(np.array([1, 10, 100]), share.epsilon, share.delta, 1))
    rows = dp.Query([dp.count()], privacy_unit="id", group_by=("g",), epsilon=2.0, max_partitions_contributed=2)
    strategy, p, _ = keep_probability(rows, 2.0, [1, 10, 100])
    share = plan_budget(rows).selection_share
    assert strategy == "truncated-geometric"
    assert list(p) == list(truncated_geometric_keep_probability(np.array([1, 10, 100]), share.epsilon, share.delta, 2))
    public = dp.Query([dp.count()], privacy_unit="id", epsilon=1.0)
    assert keep_probability(public, 1.0, [1, 5])[1].tolist() == [1.0, 1.0]
