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



@pytest.mark.parametrize("epsilon", [0.1, 1.0, 5.0, 25.0, 50.0, 100.0])
@pytest.mark.parametrize("delta", [1e-100, 1e-12, 1e-6, 1e-3])
@pytest.mark.parametrize("cu", [1, 2, 5, 16])
def test_the_truncated_geometric_keeps_each_partition_within_its_epsilon_and_delta_share(epsilon, delta, cu):
    """The keep probabilities the selection draws, P(n) / 2^128, are (e, d)-DP between neighbouring sizes n
    and n + 1, with e = epsilon / C_u and d = 1 - (1 - delta)^(1/C_u) (Desfontaines et al. 2022, the
    optimal mechanism's constraints): p(n + 1) <= e^e p(n) + d and 1 - p(n) <= e^e (1 - p(n + 1)) + d, and p
    never decreases; a unit in C_u partitions then costs (epsilon, delta) by composition (Kairouz, Oh,
    Viswanath 2015: (k e, 1 - (1 - d)^k)). Exact, in 200-digit decimals, at every size until p = 1. The
    closed form in floats broke the second constraint where 1 - p(n + 1) is near e^-e (by 5e-15 at e = 5,
    above the whole delta at e = 25, and at e = 50 p(2) = 1.0: a partition of one unit dropped with
    chance 1 - d, of two never). MIN_DELTA (1e-100) included: its d needs a finer grid than 2^-128. The
    delta test (tests/test_selection_delta.py) sees only p(1) = d."""
    from decimal import Decimal, localcontext

    from dp_core.selection_geometric import keep_grid

    with localcontext() as ctx:
        ctx.prec = 600  # P(n) / 2^K exactly (K <= 128 + 333 bits)
        e = Decimal(epsilon) / cu
        d = 1 - (1 - Decimal(delta)) ** (Decimal(1) / cu)
        growth = e.exp()
        grid, one = keep_grid(10**7, epsilon, cu, per_partition_delta(delta, cu))
        assert grid[0] == 0 and grid[-1] == one  # the curve reaches 1
        p = [Decimal(x) / Decimal(one) for x in grid]
        for n in range(len(p) - 1):
            assert p[n] <= p[n + 1], n
            assert p[n + 1] <= growth * p[n] + d, (n, float(p[n]), float(p[n + 1]))
            assert 1 - p[n] <= growth * (1 - p[n + 1]) + d, (n, float(p[n]), float(p[n + 1]))
        assert p[1] >= d * (1 - Decimal(2) ** -40)  # the first step spends the whole d, not less


def test_the_truncated_geometric_selection_keeps_with_the_exact_probabilities():
    """The selection draws U < P(n) with U uniform on [0, 2^128), P the grid checked above for its share's
    epsilon / C_u and per-partition delta: P(n) = 0 never keeps, 2^128 always, and a partition of a size
    whose p is near 1/2 is kept about p of the time (200,000 draws: within 6 sd, false-failure rate
    2e-9; a selection that drew p for another epsilon or C_u is off by far more)."""
    from dp_core.accounting import Share
    from dp_core.partition_selection import STRATEGIES
    from dp_core.selection_geometric import keep_numerators

    share, cu = Share("partition selection", 3.0, 1e-6), 3
    numerators, one = keep_numerators(np.arange(0, 200), share.epsilon, cu, per_partition_delta(share.delta, cu))
    middle = int(np.argmin([abs(p / one - 0.5) for p in numerators]))
    big = next(n for n, p in enumerate(numerators) if p == one)
    sizes = np.array([0] * 1000 + [big] * 1000 + [middle] * 200_000)
    kept = STRATEGIES["truncated-geometric"](sizes, share, cu).keep
    assert not kept[:1000].any() and kept[1000:2000].all()
    p = numerators[middle] / one
    assert abs(kept[2000:].sum() - 200_000 * p) < 6 * math.sqrt(200_000 * p * (1 - p))


def test_a_missing_or_infinite_size_estimate_has_a_keep_probability_of_0_or_1():
    """The selection advice reads sizes from released noisy counts: a missing one counts as no units, an
    infinite one as a group always kept, a negative one as none (none of them fails the release)."""
    p = truncated_geometric_keep_probability(np.array([np.nan, np.inf, -3.0, 0.0]), 1.0, 1e-6, 2)
    assert p.tolist() == [0.0, 1.0, 0.0, 0.0]


def test_the_keep_draw_compares_the_whole_uniform_with_the_whole_probability(monkeypatch):
    """draw_keep compares U's top 64-bit word with P(n)'s and, only on a tie, the rest of their bits: with
    the CSPRNG replaced by a source handing out chosen U (its top word through os.urandom, its rest through
    secrets.randbelow, the two dp_core.noise draws), the decision is U < P(n) for U just below, at and just
    above P(n) (the same top word: the tie path), a word apart, and the ends of [0, 2^K)."""
    import sys
    import types

    from dp_core import noise
    from dp_core.selection_geometric import draw_keep, keep_numerators

    eps, cu, d = 3.0, 3, per_partition_delta(1e-6, 3)
    numerators, one = keep_numerators(np.arange(0, 50), eps, cu, d)
    size = next(n for n, p in enumerate(numerators) if one // 4 < p < 3 * one // 4)
    p, low_bits = numerators[size], one.bit_length() - 1 - 64
    mask = (1 << low_bits) - 1
    assert 1 < (p & mask) < mask - 1  # so that P - 1, P and P + 1 share P's top word
    for u in (p - 1, p, p + 1, p - (1 << low_bits), p + (1 << low_bits), 0, one - 1):
        top, rest = u >> low_bits, u & mask
        source = types.SimpleNamespace(urandom=lambda n, top=top: top.to_bytes(8, sys.byteorder) * (n // 8),
                                       randbelow=lambda bound, rest=rest: rest, randbits=lambda k: 0)
        monkeypatch.setattr(noise, "os", source)
        monkeypatch.setattr(noise, "secrets", source)
        assert draw_keep(np.array([size]), eps, cu, d).tolist() == [u < p], (u - p)
