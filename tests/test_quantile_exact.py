"""The quantiles' exponential mechanism is eps-DP as implemented: its exact output law, on pairs of
neighbouring histograms, never moves by more than the recorded epsilon allows; its sampler draws
that law; the integer steps it rests on are exact.

The law is the one `bin_exponents` gives (P(j) proportional to exp(-X_j / 2^b)); its exponents are
checked against a recomputation from the definition in Fractions, and the ratios are computed in
`decimal` at 60 digits (exp and ln correctly rounded): each log-ratio is within 1e-55 of its true
value, and is asserted below the bound by a margin of 1e-50. Statistical assertions have a
false-failure probability of 1e-7 each.
"""

from __future__ import annotations

import math
from decimal import ROUND_FLOOR, Decimal, localcontext
from fractions import Fraction

import numpy as np
import pytest
from scipy import stats

from dp_core import noise
from dp_core.accounting import Share
from dp_core.exponential_mechanism import level_cap, sample_exponential
from dp_core.quantiles import bin_exponents, exponential_quantile

SIGNIFICANCE = 1e-7
PRECISION = 60
MARGIN = Decimal("1e-50")


def _exponents_from_the_definition(row: list[int], q: Fraction, scale) -> list[int]:
    """X_j = min(ceil(S d_j), M 2^b), d_j = max(C_(j-1) - q n, q n - C_j, 0), in Fractions."""
    cum, total = [], 0
    for c in row:
        total += c
        cum.append(total)
    rank = q * total
    out = []
    for j, c_j in enumerate(cum):
        before = cum[j - 1] if j else 0
        distance = max(before - rank, rank - c_j, Fraction(0))
        out.append(min(math.ceil(scale.s * distance), scale.cap << scale.fraction_bits))
    return out


def _law_exponents(row: list[int], q: float, share: Share, cu: int) -> tuple[list[int], int]:
    """The exponents the mechanism draws from for one histogram, checked against the definition."""
    exponents, scale = bin_exponents(np.array([row], dtype=np.int64), q, share, cu)
    assert exponents[0].tolist() == _exponents_from_the_definition(row, Fraction(q), scale)
    return exponents[0].tolist(), scale.fraction_bits


def _log_normaliser(exponents: list[int], bits: int) -> Decimal:
    """ln sum_j exp(-X_j / 2^b) at PRECISION digits (each distinct exponent's exp computed once)."""
    values, multiplicity = np.unique(np.array(exponents, dtype=np.int64), return_counts=True)
    with localcontext() as ctx:
        ctx.prec = PRECISION
        total = sum(int(m) * (-Decimal(int(x)) / Decimal(2**bits)).exp() for x, m in zip(values, multiplicity))
        return total.ln()


def _max_log_ratio(first: list[int], second: list[int], bits: int) -> Decimal:
    """max_j ln(P(j | first) / P(j | second)) = max_j (X'_j - X_j) / 2^b + ln Z' - ln Z."""
    with localcontext() as ctx:
        ctx.prec = PRECISION
        shift = max(b - a for a, b in zip(first, second))
        return Decimal(shift) / Decimal(2**bits) + _log_normaliser(second, bits) - _log_normaliser(first, bits)


def _histogram(n: int, bins: int, seed: int) -> list[int]:
    """n values over `bins` bins: a peak and a long flat tail (test data, not noise)."""
    rng = np.random.default_rng(seed)
    values = np.concatenate([rng.normal(0.4, 0.05, n - n // 5), rng.uniform(0, 1, n // 5)])
    return np.histogram(np.clip(values, 0, 1), bins=bins, range=(0, 1))[0].tolist()


def _neighbours(row: list[int], q: float):
    """Histograms one unit away: a value added to or removed from the first, last, quantile and
    nearby bins (the count of that bin and n move by 1)."""
    cum = np.cumsum(row)
    at_rank = int(np.searchsorted(cum, q * cum[-1]))
    for j in sorted({0, len(row) - 1, at_rank, max(at_rank - 1, 0), min(at_rank + 1, len(row) - 1), len(row) // 3}):
        for step in (1, -1):
            if row[j] + step >= 0:
                yield [c + step if i == j else c for i, c in enumerate(row)]


@pytest.mark.parametrize("bins", [8, 1024])
@pytest.mark.parametrize("n", [300, 100_000])
@pytest.mark.parametrize("q", [0.0, 0.5, 0.9, 1.0])
@pytest.mark.parametrize("epsilon, cu", [(0.01, 1), (1.0, 1), (1.0, 3), (30.0, 1)])
def test_the_exact_law_of_neighbouring_histograms_moves_by_at_most_the_recorded_epsilon(bins, n, q, epsilon, cu):
    """For every bin j and both orders of each neighbouring pair, P(j | x) / P(j | x') <= exp(eps / C_u),
    on the law as implemented. At n = 100,000 and eps_p = 1 the float mechanism's weights underflowed
    to 0 on one side only (an infinite ratio); MIN and MAX are q = 0 and 1 (sensitivity 1)."""
    share = Share("q", epsilon=epsilon)
    with localcontext() as ctx:  # eps / C_u rounded down: the comparison can only be stricter
        ctx.prec, ctx.rounding = PRECISION, ROUND_FLOOR
        bound = Decimal(Fraction(epsilon).numerator) / (Decimal(Fraction(epsilon).denominator) * cu)
    row = _histogram(n, bins, seed=n + bins)
    base, bits = _law_exponents(row, q, share, cu)
    for other in _neighbours(row, q):
        neighbour, _ = _law_exponents(other, q, share, cu)
        for first, second in ((base, neighbour), (neighbour, base)):
            assert _max_log_ratio(first, second, bits) + MARGIN <= bound


def _secure_uniform_cdf(x: Fraction) -> Fraction:
    """P(u <= x) for noise.secure_uniform: k / 2^106 (each 2^-106) up to 2^-21, (h + 1) / 2^53 above."""
    if x <= Fraction(1, 2**21):
        return Fraction(math.floor(x * 2**106), 2**106)
    return Fraction(1, 2**21) + Fraction(min(math.floor(x * 2**53), 2**53) - 2**32, 2**53)


def _float_mechanism_law(row: list[int], q: float, epsilon_per_partition: float) -> list[Fraction]:
    """The exact law of the float mechanism this module replaced (until 2026-11-29): float64 weights
    exp(-eps_p d / (2 Delta)), their normalised cumulative sums, and the first bin whose sum
    reaches a secure_uniform draw."""
    counts = np.array(row, dtype=np.float64)
    cum = np.cumsum(counts)
    rank = q * cum[-1]
    distance = np.maximum(np.maximum(cum - counts - rank, rank - cum), 0.0)
    weights = np.exp(-epsilon_per_partition * distance / (2.0 * max(q, 1.0 - q)))
    cdf = np.cumsum(weights) / weights.sum()
    edges = [Fraction(0)] + [_secure_uniform_cdf(Fraction(float(c))) for c in cdf[:-1]] + [Fraction(1)]
    return [edges[j + 1] - edges[j] for j in range(len(row))]


def test_the_same_check_finds_the_float_mechanism_s_infinite_loss():
    """The check has power: on one of the cases above (a MEDIAN, 1,024 bins, n = 300, eps_p = 1) the
    float mechanism's law gives a bin probability 0 on one histogram and more on its neighbour."""
    row = _histogram(300, 1024, seed=300 + 1024)
    base = _float_mechanism_law(row, 0.5, 1.0)
    impossible_on_one_side = 0
    for other in _neighbours(row, 0.5):
        neighbour = _float_mechanism_law(other, 0.5, 1.0)
        impossible_on_one_side += sum((a == 0) != (b == 0) for a, b in zip(base, neighbour))
    assert impossible_on_one_side > 0


def test_the_recorded_epsilon_is_the_share_and_the_law_spends_close_to_it():
    """The record states the share's epsilon; the exponent's scale is below eps_p / (2 Delta) by a
    relative 2^-29 at most (the utility lost to exactness)."""
    for epsilon, cu, q in ((1.0, 1, 0.5), (0.3, 7, 0.9), (1e-6, 1, 0.0), (100.0, 1, 1.0)):
        counts = np.array([[3, 0, 5, 1]])
        _, record = exponential_quantile(counts, q, 0.0, 4.0, target="q", share=Share("q", epsilon=epsilon),
                                         max_partitions=cu)
        assert record.epsilon == epsilon and record.delta == 0.0
        _, scale = bin_exponents(counts, q, Share("q", epsilon=epsilon), cu)
        ideal = Fraction(epsilon) / cu / (2 * max(Fraction(q), 1 - Fraction(q)))
        used = Fraction(scale.s, 2**scale.fraction_bits)
        assert used <= ideal and (ideal - used) / ideal < Fraction(1, 2**29)


def _pooled_chisquare(observed: np.ndarray, expected: np.ndarray) -> float:
    """Chi-square p-value with the cells expecting fewer than 5 draws pooled into one."""
    small = expected < 5
    observed = np.append(observed[~small], observed[small].sum())
    expected = np.append(expected[~small], expected[small].sum())
    if expected[-1] < 5:  # the pooled cell too small: merge it into the smallest kept cell
        smallest = int(np.argmin(expected[:-1]))
        observed[smallest] += observed[-1]
        expected[smallest] += expected[-1]
        observed, expected = observed[:-1], expected[:-1]
    return stats.chisquare(observed, expected * observed.sum() / expected.sum()).pvalue


def _exact_probabilities(exponents: np.ndarray, bits: int) -> np.ndarray:
    with localcontext() as ctx:
        ctx.prec = 40
        weights = [(-Decimal(int(x)) / Decimal(2**bits)).exp() for x in exponents]
        total = sum(weights)
        return np.array([float(w / total) for w in weights])


def test_the_sampler_draws_the_exponential_law_of_its_exponents():
    """A row over every kind of exponent (0, fractions only, each integer level up to the cap, the
    cap itself): 1,000,000 draws follow exp(-X_j / 2^b) / Z (chi-square); the same draws reject the
    law of exponents half as large (the test has power)."""
    bits = 40
    cap = level_cap(16)
    unit = 1 << bits
    exponents = np.array([0, unit // 3, unit - 1, unit + 5, 2 * unit + unit // 2, 3 * unit, 4 * unit + 77,
                          unit // 7, 5 * unit, 7 * unit + unit // 5, 9 * unit, 12 * unit, 20 * unit,
                          cap * unit, cap * unit, 0], dtype=np.int64)
    draws = 1_000_000
    observed = np.zeros(exponents.size, dtype=np.int64)
    for _ in range(10):  # batches of 100,000 rows (13 MB)
        observed += np.bincount(sample_exponential(np.tile(exponents, (draws // 10, 1)), bits), minlength=exponents.size)
    assert _pooled_chisquare(observed, _exact_probabilities(exponents, bits) * draws) > SIGNIFICANCE
    assert _pooled_chisquare(observed, _exact_probabilities(exponents // 2, bits) * draws) < SIGNIFICANCE


def test_a_quantile_s_bins_follow_the_exact_law_at_1024_bins():
    """The mechanism's own exponents for a MEDIAN over 1,024 bins at eps_p = 0.05: 20,000 draws of
    `exponential_quantile` (in batches of 2,000 rows) land in the bins with the exact law's
    frequencies (chi-square, pooled)."""
    row = _histogram(2_000, 1024, seed=7)
    share = Share("q", epsilon=0.05)
    exponents, scale = bin_exponents(np.array([row]), 0.5, share, 1)
    observed = np.zeros(1024, dtype=np.int64)
    for _ in range(10):
        values, _ = exponential_quantile(np.tile(row, (2_000, 1)), 0.5, 0.0, 1024.0, target="q", share=share,
                                         max_partitions=1)
        observed += np.bincount(np.floor(values).astype(np.int64), minlength=1024)
    expected = _exact_probabilities(exponents[0], scale.fraction_bits) * observed.sum()
    assert _pooled_chisquare(observed, expected) > SIGNIFICANCE


def test_the_envelope_holds_65536_bins_at_both_ends_of_its_range():
    """The envelope's sums stay in int64 at the largest histogram (65,536 bins, every exponent 0:
    the largest weights; every exponent at the cap: the smallest), and equal exponents give equal
    chances (2,000 draws over 1,024 bins, counted in 16 groups of 64)."""
    from dp_core.exponential_mechanism import _envelope_weights

    bins = 1 << 16
    weights = _envelope_weights(bins)
    assert int(weights[0]) * bins <= 2**62 and int(weights[-1]) >= 1
    for level in (0, level_cap(bins)):
        assert sample_exponential(np.full((8, bins), level << 20, dtype=np.int64), 20).max() < bins
        chosen = sample_exponential(np.full((2_000, 1024), level << 20, dtype=np.int64), 20)
        assert stats.chisquare(np.bincount(chosen // 64, minlength=16)).pvalue > SIGNIFICANCE


def test_the_envelope_s_level_is_exact_and_its_acceptance_draws_exp_neg_v_times_two_to_the_t():
    """t(v) = floor(v log2 e) exactly for v = 0..64; Bernoulli(exp(-v) 2^t(v)) has that frequency."""
    for v in range(65):
        t = noise.exp_neg_octave(v)
        with localcontext() as ctx:
            ctx.prec = 50
            assert Decimal(2) ** -(t + 1) < (-Decimal(v)).exp() <= Decimal(2) ** -t
    trials = 300_000
    for v in (1, 2, 17, 36, 64):
        hits = int(noise.bernoulli_pow2_exp_neg(np.full(trials, v)).sum())
        assert stats.binomtest(hits, trials, math.exp(-v) * 2.0 ** noise.exp_neg_octave(v)).pvalue > SIGNIFICANCE
    assert noise.bernoulli_pow2_exp_neg(np.zeros(1000, dtype=np.int64)).all()


@pytest.mark.parametrize("v", [1, 5, 36])
def test_a_tie_with_the_envelope_s_threshold_is_refined_with_the_next_bits(monkeypatch, v):
    """A 32-bit word equal to floor(exp(-v) 2^(t+32)) decides nothing: the next 64 bits all 0 put U
    below exp(-v) 2^t (an irrational, so above its truncation), all 1 above it, exactly as the
    expansion's next 64 bits say."""
    t = noise.exp_neg_octave(v)
    tie = noise.exp_neg_floor(v, t + 32)
    monkeypatch.setattr(noise, "random_halfwords", lambda n: np.full(n, tie, dtype=np.uint32))
    following = noise.exp_neg_floor(v, t + 96) - (tie << 64)  # the expansion's next 64 bits
    for rest, expected in ((0, True), (2**64 - 1, False), (following - 1, True), (following + 1, False)):
        monkeypatch.setattr(noise.secrets, "randbits", lambda k, r=rest: r)
        assert noise.bernoulli_pow2_exp_neg(np.array([v])).tolist() == [expected]


def test_uniforms_below_per_entry_bounds_reach_every_value_equally():
    """Bounds of 1, 2, 3, 5, 6 and 7 side by side: each value below a bound equally likely; bit
    lengths are exact where float64 rounds (2^53 +- 1, 2^62, 2^63 - 1)."""
    bounds = np.tile(np.array([1, 2, 3, 5, 6, 7], dtype=np.int64), 60_000)
    draws = noise.uniform_below_each(bounds)
    assert (draws >= 0).all() and (draws < bounds).all()
    for bound in (2, 3, 5, 6, 7):
        observed = np.bincount(draws[bounds == bound], minlength=bound)
        assert stats.chisquare(observed).pvalue > SIGNIFICANCE
    edges = np.array([0, 1, 2**53 - 1, 2**53, 2**53 + 1, 2**62 - 1, 2**62, 2**63 - 1], dtype=np.int64)
    assert noise._bit_lengths(edges).tolist() == [int(x).bit_length() for x in edges]
    with pytest.raises(ValueError, match="positive"):
        noise.uniform_below_each(np.array([3, 0]))


def test_a_histogram_that_is_not_integer_counts_is_refused():
    with pytest.raises(ValueError, match="non-negative integer counts"):
        exponential_quantile(np.array([[1.5, 2.0]]), 0.5, 0.0, 1.0, target="q", share=Share("q", epsilon=1.0),
                             max_partitions=1)


def test_partitions_drawn_a_block_at_a_time_each_get_their_own_draw(monkeypatch):
    """The engine draws the quantiles of a block of partitions at a time (memory bounded by
    BLOCK_CELLS, not by partitions x bins). With blocks of 3 partitions, partition i's 100 values all
    in bin i at epsilon 1000, every released median lies in its own partition's bin: a block shifted
    or dropped would put it elsewhere (chance of a wrong bin per partition below 1e-12: every other
    bin's exponent is clipped at level 36 or beyond, mass < 16 exp(-36))."""
    from dp_core import quantiles

    bins, parts = 16, 10
    monkeypatch.setattr(quantiles, "BLOCK_CELLS", 3 * bins)
    maps = [{i % bins: 100} for i in range(parts)] + [None]  # and a partition without values
    values, record = quantiles.exponential_quantile_of_maps(
        maps, bins, 0.5, 0.0, 16.0, target="m", share=Share("q", epsilon=1000.0), max_partitions=1)
    assert values.shape == (parts + 1,) and record.epsilon == 1000.0
    assert [int(v) for v in values[:parts]] == [i % bins for i in range(parts)]
