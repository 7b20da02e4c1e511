"""Exact samplers: the right law (chi-square against the exact pmf, tails pooled), the grid.

Every statistical assertion has a false-failure probability of SIGNIFICANCE = 1e-7 (below 1e-6),
and each law test is shown to reject the same sampler at half the scale (it has power).
"""

from __future__ import annotations

import math
from decimal import ROUND_FLOOR, Decimal, getcontext
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

from dp_core import noise
from dp_core.accounting import Share
from dp_core.release import add_noise

N = 300_000
SIGNIFICANCE = 1e-7


def test_uniforms_are_in_half_open_unit_interval_and_fresh():
    u = noise.secure_uniform(N)
    assert u.min() > 0.0 and u.max() <= 1.0
    assert abs(u.mean() - 0.5) < 6 * math.sqrt(1 / 12 / N)
    assert not np.array_equal(noise.secure_uniform(16), noise.secure_uniform(16))


def test_small_uniforms_keep_their_precision():
    high = np.array([0, 5, 2**32 - 1, 2**32, 2**53 - 1], dtype=np.uint64)
    low = np.array([0, 7, 2**53 - 1, 123, 0], dtype=np.uint64)
    u = noise.uniform_from_words(high, low)
    assert u[0] == 2.0**-106  # the smallest value: the tail reaches 73 scales, not 37
    assert u[1] == (5 * 2**53 + 8) / 2**106
    assert u[3] == (2**32 + 1) / 2**53 and u[4] == 1.0
    assert np.all(np.diff(u) > 0)


def test_grid_is_fine_against_noise_and_sensitivity_and_absurd_epsilon_is_refused():
    def noisy(eps, sens, quantum=1.0):
        return add_noise(np.array([3, 10**9 + 1]), target="t", quantum=quantum, sensitivity_quanta=sens,
                         max_partitions=1, share=Share("x", epsilon=eps), noise="laplace", confidence=0.95)

    counts = noisy(1e-4, 1)  # scale 1e4: still integers, and exactly scale 1e4
    assert counts.record.grid == 1 and counts.scale == 1e4
    big = noisy(0.5, 10**12)  # sensitivity 1e12: a coarse grid, but at most 2^-12 of D
    g = big.record.grid
    assert g > 1 and g <= 1e12 / 2**11 and np.all(big.values / g == np.round(big.values / g))
    assert big.scale == pytest.approx(2e12, rel=2**-11)  # rounding D up to whole steps costs < 0.05%
    with pytest.raises(noise.DPError, match="epsilon is too small"):
        noisy(1e-9, 1)


def test_what_the_grid_cannot_carry_and_pure_noise_are_refused_with_their_reason():
    """A released value is exact value + noise in grid steps, held exactly up to 2^53 in a double:
    an exact value of 2^52 steps or more (either sign) is refused, one step less is released on the
    grid. Noise over 2^20 times the sensitivity is refused as pure noise, saying what to change."""
    def noisy(values, eps=1.0):
        return add_noise(np.array(values, dtype=np.int64), target="t", quantum=1.0, sensitivity_quanta=1,
                         max_partitions=1, share=Share("x", epsilon=eps), noise="laplace", confidence=0.95)

    released = noisy([2**52 - 1, -(2**52) + 1]).values
    assert abs(released[0] - (2**52 - 1)) < 200 and released[0] == np.round(released[0])
    for value in (2**52, -(2**52)):
        with pytest.raises(noise.DPError) as caught:
            noisy([value])
        assert str(caught.value) == "t: the exact value is too large for its noise grid (over 2^52 steps)"
    with pytest.raises(noise.DPError) as caught:
        noisy([3], eps=1e-9)
    assert str(caught.value) == ("t: epsilon is too small for its sensitivity (noise 1e+09 is over 2^20 times the "
                                 "sensitivity): the result would be pure noise; raise epsilon or lower "
                                 "max_partitions_contributed")
    # Gaussian noise is judged by its own scale, sqrt(C_u) D / sqrt(2 rho): at epsilon 1e-6 (delta 1e-5)
    # that is about 4.8e6 sensitivities, refused, where Laplace noise at that epsilon (1e6) is not
    from dp_core.accounting import rho_from_eps_delta

    rho = rho_from_eps_delta(1e-6, 1e-5)
    with pytest.raises(noise.DPError) as caught:
        add_noise(np.array([3], dtype=np.int64), target="t", quantum=1.0, sensitivity_quanta=1, max_partitions=1,
                  share=Share("x", epsilon=1e-6, delta=1e-5, rho=rho), noise="gaussian", confidence=0.95)
    assert str(caught.value).startswith(f"t: epsilon is too small for its sensitivity (noise {1 / math.sqrt(2 * rho):.3g} "
                                        "is over 2^20 times the sensitivity)"), str(caught.value)
    assert noisy([3], eps=1e-6).values.shape == (1,)


def test_noise_of_exactly_two_to_the_twenty_sensitivities_is_released_and_more_is_refused():
    """The pure-noise limit refuses noise OVER 2^20 times the sensitivity (as the accuracy planner
    counts it): at epsilon 2^-20 the Laplace scale is exactly 2^20 sensitivities and the value is released;
    at the next smaller epsilon it is refused."""
    def noisy(eps):
        return add_noise(np.array([3], dtype=np.int64), target="t", quantum=1.0, sensitivity_quanta=1,
                         max_partitions=1, share=Share("x", epsilon=eps), noise="laplace", confidence=0.95)

    at_limit = noisy(2.0**-20)
    assert at_limit.scale == 2.0**20 and at_limit.values.shape == (1,)
    with pytest.raises(noise.DPError, match="over 2\\^20 times the sensitivity"):
        noisy(math.nextafter(2.0**-20, 0.0))


def discrete_laplace_cdf(scale):
    """P(K <= k) of the discrete Laplace with this scale (vectorised over integer k)."""
    q = math.exp(-1.0 / float(scale))

    def cdf(k):
        k = np.asarray(k, dtype=np.float64)
        return np.where(k >= 0, 1.0 - q ** (np.abs(k) + 1) / (1.0 + q), q ** np.abs(k) / (1.0 + q))

    return cdf


def discrete_gaussian_cdf(sigma2):
    """P(K <= k) of the discrete Gaussian with variance parameter sigma^2: summed from the pmf up to
    sigma = 2^12; beyond, the normal CDF at k + 1/2 (the two agree to exp(-2 pi^2 sigma^2), CKS)."""
    sigma = math.sqrt(float(sigma2))
    if sigma > 2**12:
        return lambda k: stats.norm.cdf((np.asarray(k, dtype=np.float64) + 0.5) / sigma)
    span = int(40 * sigma) + 40
    support = np.arange(-span, span + 1)
    pmf = np.exp(-(support.astype(np.float64) ** 2) / (2.0 * float(sigma2)))
    cum = np.cumsum(pmf / pmf.sum())
    return lambda k: np.interp(np.asarray(k, dtype=np.float64), support, cum, left=0.0, right=1.0)


def chi_square_pvalue(samples: np.ndarray, cdf, bins: int = 60) -> float:
    """Chi-square of integer samples against a law given by its CDF: about `bins` bins of equal
    probability on the law's own quantiles (single integers where the law is concentrated), the
    tails pooled into the two end bins; every expected count is checked to be at least 5."""
    n = samples.size
    levels = np.linspace(0.0, 1.0, bins + 1)[1:-1]
    lo, hi = int(samples.min()) - 1, int(samples.max()) + 1
    grid = np.unique(np.linspace(lo, hi, 200_001).round().astype(np.int64))
    cuts = np.unique(grid[np.minimum(np.searchsorted(cdf(grid), levels), grid.size - 1)])
    probs = np.diff(np.concatenate([[0.0], cdf(cuts), [1.0]]))  # bins (-inf, c0], (c0, c1], ..., (c_last, inf)
    observed = np.bincount(np.searchsorted(cuts, samples, side="left"), minlength=cuts.size + 1)
    keep = probs > 0
    expected = probs[keep] * n
    assert expected.min() >= 5, "a bin with too few expected samples"
    assert observed[~keep].sum() == 0, "samples where the law has no mass"
    return stats.chisquare(observed[keep], expected * observed[keep].sum() / expected.sum()).pvalue


@pytest.mark.parametrize("scale", [0.3, 1.0, 37.5, 1000.0, 2.0**20 + 0.5])
def test_discrete_laplace_follows_its_exact_law(scale):
    x = noise.discrete_laplace(scale, N)
    assert x.dtype == np.int64
    exact_scale = noise.laplace_parameters(scale).scale  # rounded up by < 2^-19
    assert exact_scale >= Fraction(scale) and float(exact_scale) / scale - 1 < 2**-19
    assert chi_square_pvalue(x, discrete_laplace_cdf(exact_scale)) > SIGNIFICANCE
    # the same test rejects the law at half the scale (it has power)
    assert chi_square_pvalue(noise.discrete_laplace(scale / 2, N), discrete_laplace_cdf(exact_scale)) < SIGNIFICANCE


# 200: the Laplace proposal has T = 2^8, whose U and sign share one 16-bit word (8 bits would not hold both)
@pytest.mark.parametrize("sigma", [0.5, 3.3, 200.0, 800.0, 2.0**16 + 3])
def test_discrete_gaussian_follows_its_exact_law(sigma):
    x = noise.discrete_gaussian(sigma, N)
    assert x.dtype == np.int64
    variance = noise.gaussian_parameters(Fraction(sigma) ** 2).variance
    assert variance >= Fraction(sigma) ** 2 and float(variance) / sigma**2 - 1 < 2**-19
    assert chi_square_pvalue(x, discrete_gaussian_cdf(variance)) > SIGNIFICANCE
    assert chi_square_pvalue(noise.discrete_gaussian(sigma / 2, N), discrete_gaussian_cdf(variance)) < SIGNIFICANCE


def test_huge_sigma_takes_the_python_integer_path_and_keeps_its_law():
    sigma = 2.0**30  # w^2 overflows int64: exact Python integers for the rejection step
    x = noise.discrete_gaussian(sigma, 20_000)
    assert chi_square_pvalue(x, discrete_gaussian_cdf(Fraction(sigma) ** 2), bins=20) > SIGNIFICANCE


@pytest.mark.parametrize("bound", [5, 1 << 20, 3 * 2**40 + 1, 2**62 + 7, 2**70, 3**50])
def test_uniform_below_covers_its_range_evenly_up_to_python_integers(bound):
    """n draws on {0, ..., bound - 1}, past 2^62 too (Python integers): each in range, and each third
    of the range hit as a uniform law says (chi-square against the thirds' exact sizes, false-failure
    rate 1e-9 per bound). A bound below 1 is refused."""
    n = 6000
    values = noise.uniform_below(bound, n)
    assert len(values) == n and all(0 <= int(v) < bound for v in values)
    edges = [-(-k * bound // 3) for k in range(4)]  # third k holds the v with 3v // bound == k
    expected = np.array([(edges[k + 1] - edges[k]) / bound * n for k in range(3)])
    observed = np.bincount([int(v) * 3 // bound for v in values], minlength=3)
    assert stats.chisquare(observed, expected).pvalue > 1e-9, observed
    with pytest.raises(ValueError, match="^bound must be positive$"):
        noise.uniform_below(0, 1)


def test_exp_expansions_are_exact():
    getcontext().prec = 200
    for v in (1, 2, 7, 22, 23, 45, 80):
        for bits in (32, 64, 200):
            exact = int((Decimal(-v).exp() * (Decimal(2) ** bits)).to_integral_value(rounding=ROUND_FLOOR))
            assert noise.exp_neg_floor(v, bits) == exact


def test_bernoulli_and_geometric_building_blocks():
    for v in (1, 3, 30):
        hits = noise.bernoulli_exp_neg_int(np.full(N, v)).sum()
        assert stats.binomtest(int(hits), N, math.exp(-v)).pvalue > SIGNIFICANCE
    # odd, power-of-two, 2^e * odd (one division) and large odd (chunked long division) denominators
    for num, den in ((3, 7), (5, 8), (0, 5), (2**40 - 1, 2**40), (2**45 + 1, 3 * 2**44), (10**15, 10**15 + 7)):
        hits = noise.bernoulli_exp_neg_ratio(np.full(N, num, dtype=np.int64), den).sum()
        assert stats.binomtest(int(hits), N, math.exp(-num / den)).pvalue > SIGNIFICANCE
    v = noise.geometric_exp_neg_one(N)
    observed = np.bincount(np.minimum(v, 8), minlength=9)
    expected = np.exp(-np.arange(9.0)) - np.exp(-np.arange(1.0, 10.0))
    expected[-1] = math.exp(-8)  # pooled tail P(V >= 8)
    assert stats.chisquare(observed, expected * N).pvalue > SIGNIFICANCE


def test_word_thresholds_and_one_in_k_are_exact():
    rng = np.random.default_rng(7)  # test inputs only; the samplers never use numpy.random
    for den in (3, 6, 7 * 2**40, 3 * 2**33, (2**21 + 1) * 2**20, 10**15 + 7, 2**61 - 1):
        nums = np.concatenate([rng.integers(0, den, 3_000, dtype=np.int64), [0, den - 1]])
        assert noise._floor_times_pow2_over(nums, den, 32).tolist() == [(int(x) << 32) // den for x in nums]
    for k in (2, 3, 200, 257, 40_000, 70_000):  # 8-, 16- and 32-bit words
        hits = int(noise._one_in(k, N).sum())
        assert stats.binomtest(hits, N, 1 / k).pvalue > SIGNIFICANCE


def test_ratio_ties_are_refined_with_an_exact_draw(monkeypatch):
    """A word equal to floor(num 2^32 / den) decides nothing: the rest of U is compared exactly."""
    num, den = 5, 7
    tie = (num << 32) // den
    monkeypatch.setattr(noise, "random_halfwords", lambda n: np.full(n, tie, dtype=np.uint32))
    hits = int(noise.bernoulli_ratio(np.full(4_000, num, dtype=np.int64), den).sum())
    p_rest = ((num << 32) % den) / den  # P(U < 5/7 | U's first 32 bits equal 5/7's)
    assert stats.binomtest(hits, 4_000, p_rest).pvalue > SIGNIFICANCE


def test_ties_with_the_expansion_are_refined_not_rounded(monkeypatch):
    """A 32-bit word equal to a threshold (or 0) must be resolved with more bits: force such words."""
    monkeypatch.setattr(noise, "random_halfwords", lambda n: np.zeros(n, dtype=np.uint32))
    v = noise.geometric_exp_neg_one(2_000)  # U < 2^-32 < exp(-22): V >= 22; P(V = 22 | U < 2^-32) = 0.55
    assert v.min() >= 22 and 0.4 < (v == 22).mean() < 0.7
    assert noise.bernoulli_exp_neg_int(np.full(2_000, 30)).mean() < 0.2  # exp(-30) < 2^-32 / 4
    tie = noise.exp_neg_floor(1, 32)
    monkeypatch.setattr(noise, "random_halfwords", lambda n: np.full(n, tie, dtype=np.uint32))
    hits = int(noise.bernoulli_exp_neg_int(np.ones(4_000, dtype=np.int64)).sum())
    p_next = (noise.exp_neg_floor(1, 96) - (tie << 64)) / 2**64  # P(U < exp(-1) | its first 32 bits)
    assert stats.binomtest(hits, 4_000, p_next).pvalue > SIGNIFICANCE


def test_no_numpy_random_in_the_engine():
    for path in Path(noise.__file__).parent.rglob("*.py"):
        code = "\n".join(line.split("#")[0] for line in path.read_text().splitlines())
        assert "np.random" not in code and "numpy.random" not in code.replace("`numpy.random`", ""), path


def test_released_values_lie_on_the_power_of_two_grid():
    share = Share("x", epsilon=0.7)
    s = add_noise(np.array([123, 2**40 + 7, -42 * 2**30]), target="t", quantum=2.0**-30, sensitivity_quanta=int(3.5 * 2**30), max_partitions=2, share=share, noise="laplace",
                  confidence=0.95)
    g = s.record.grid
    assert g == 2.0 ** (math.ceil(math.log2(min(2 * 3.5 / 0.7, 3.5))) - noise.GRID_STEPS_PER_SCALE_LOG2)
    assert np.all(s.values / g == np.round(s.values / g))
    ints = add_noise(np.array([10, 20]), target="c", quantum=1.0, sensitivity_quanta=1, max_partitions=1, share=share,
                     noise="laplace", confidence=0.95)
    assert ints.record.grid == 1.0 and np.all(ints.values == np.round(ints.values))


def test_exact_values_round_to_the_nearest_grid_step_half_up():
    """floor(x / 2^shift + 1/2) for values on both sides of zero, halves included (a step's bias, at most
    1/4096 of the noise scale, is too small for a test of released values to see)."""
    from dp_core.release import grid_steps

    x = np.array([-9, -8, -7, -6, -5, -4, -3, -2, -1, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 2**60 + 3], dtype=np.int64)
    expected = [math.floor(v / 4 + 0.5) for v in x[:-1].tolist()] + [2**58 + 1]
    assert grid_steps(x, 2).tolist() == expected
    assert grid_steps(x, 0) is x
    assert grid_steps(np.array([-1, 0, 1, 2, 3]), 1).tolist() == [0, 0, 1, 1, 2]


def test_halfwidths_are_the_smallest_with_miss_probability_at_most_alpha():
    for scale in (0.3, 1.0, 7.0, 120.0):
        q = math.exp(-1 / scale)
        m = noise.discrete_laplace_halfwidth(scale, 0.05)
        miss = lambda mm: 2 * q ** (mm + 1) / (1 + q)
        assert miss(m) <= 0.05 and (m == 0 or miss(m - 1) > 0.05)
    for sigma in (0.8, 5.0, 60.0):
        m = noise.discrete_gaussian_halfwidth(sigma, 0.05)
        k = np.arange(-2000, 2001)
        pmf = np.exp(-(k**2) / (2 * sigma**2))
        pmf /= pmf.sum()
        miss = lambda mm: pmf[np.abs(k) > mm].sum()
        assert miss(m) <= 0.05 + 1e-12 and (m == 0 or miss(m - 1) > 0.05)


def test_bad_scales_are_refused():
    with pytest.raises(noise.DPError):
        noise.discrete_laplace(0.0, 3)
    with pytest.raises(noise.DPError):
        noise.discrete_gaussian(float("nan"), 3)


@pytest.mark.parametrize("k", [1, 2, 3, 7, 20])
def test_exact_refinements_follow_the_uniform_they_are_given(k):
    """The rare-path helpers decide from the uniform's known bits exactly: U just below exp(-k)
    is a Bernoulli(exp(-k)) success and a geometric draw of k; just above, a failure and k - 1;
    bits equal to exp(-k)'s expansion (a tie) are refined with CSPRNG bits into one of the two."""
    getcontext().prec = 80
    t = noise.exp_neg_floor(k, 32)
    assert t == int((Decimal(-k).exp() * 2**32).to_integral_value(rounding=ROUND_FLOOR))
    assert noise._geometric_slow(t - 1, 32) == k and noise._uniform_below_exp_neg(k, t - 1, 32)
    assert noise._geometric_slow(t + 1, 32) == k - 1 and not noise._uniform_below_exp_neg(k, t + 1, 32)
    assert {noise._geometric_slow(t, 32) for _ in range(40)} <= {k - 1, k}
    # the 64 refined bits decide by exp(-k)'s next bits: compare with the decimal expansion
    wide = int((Decimal(-k).exp() * 2**96).to_integral_value(rounding=ROUND_FLOOR))
    assert noise.exp_neg_floor(k, 96) == wide and wide >> 64 == t


def test_a_single_draw_past_int64_denominators_keeps_its_law():
    """sigma = 2^31 grid steps: the rejection step's denominator 2^(r+1) A is 2^63, past int64, while
    every w^2 of a small batch often fits int64 (|w| < 1.42 * 2^31 for 91% of the proposals). One value
    at a time (a release of one partition draws n = 1: a batch of 33 proposals, all of them small in
    about 1 call of 20): no overflow, and the law is the discrete Gaussian's (chi-square on 20 bins,
    false-failure rate 1e-7)."""
    sigma = 2.0**31
    params = noise.gaussian_parameters(Fraction(sigma) ** 2)
    assert (1 << (params.r + 1)) * params.a >= 2**63
    x = np.concatenate([noise.discrete_gaussian(sigma, 1) for _ in range(4000)])
    assert chi_square_pvalue(x, discrete_gaussian_cdf(params.variance), bins=20) > SIGNIFICANCE


@pytest.mark.parametrize("high, low, expected", [
    (2**64 - 1, None, 1.0),  # the top 53 bits all ones: (2^53 - 1 + 1) / 2^53
    (5 << 11, 2**64 - 1, 6 / 2**53),  # below 2^-21: 53 more bits, all ones, (5 2^53 + 2^53 - 1 + 1) / 2^106
    (5 << 11, 1 << 11, (5 * 2**53 + 2) / 2**106),
])
def test_a_secure_uniform_is_its_words_top_bits_over_two_to_the_53_or_106(monkeypatch, high, low, expected):
    """secure_uniform: (W >> 11 + 1) / 2^53 from one CSPRNG word, and where that is below 2^-21 the
    finer (high 2^53 + low + 1) / 2^106 with the top 53 bits of a second word. The words are handed in."""
    words = iter([high] + ([] if low is None else [low]))
    monkeypatch.setattr(noise, "random_words", lambda n: np.array([next(words) for _ in range(n)], dtype=np.uint64))
    assert noise.secure_uniform(1).tolist() == [expected]


@pytest.mark.parametrize("u_bit, accepted", [(190, False), (300, True)])
def test_a_far_proposal_of_the_discrete_gaussian_is_accepted_with_its_own_tiny_probability(monkeypatch, u_bit, accepted):
    """CKS Algorithm 3 keeps a proposal Y with probability exp(-(|Y| - sigma^2/t)^2 / (2 sigma^2)),
    however far in the tail Y lies. sigma = 1 (t = 1): Y = 21 is kept with probability exp(-200),
    about 2^-288.5. The proposal and its uniform are handed in: U = 2^-190 (the 2^-32-rare zero first
    word, refined with more words) lies above exp(-200) and rejects it; U = 2^-300 lies below and
    keeps it. A rejected 21 leaves the next proposal, 0."""
    import secrets

    params = noise.gaussian_parameters(Fraction(1))
    assert (params.j, params.r, params.a) == (0, 20, 2**20)  # the exponent of Y = 21 is exactly 200
    proposals = iter([np.array([21])])
    monkeypatch.setattr(noise, "_discrete_laplace_exact",
                        lambda p, n: np.concatenate([next(proposals, np.zeros(1, np.int64)), np.zeros(n - 1, np.int64)]))
    real_halfwords, first = noise.random_halfwords, [True]

    def halfwords(n):  # the first: the far proposal's 32-bit word, zero (a tie with exp(-200)'s 0)
        if first[0]:
            first[0] = False
            return np.zeros(n, dtype=np.uint32)
        return real_halfwords(n)

    monkeypatch.setattr(noise, "random_halfwords", halfwords)
    word, bit = divmod(u_bit - 33, 64)  # U's bits after the first 32, 64 at a time
    words = iter([0] * word + [1 << (63 - bit)])
    real_randbits = secrets.randbits
    monkeypatch.setattr(noise.secrets, "randbits", lambda k: next(words) if k == 64 else real_randbits(k))
    assert noise.discrete_gaussian(1.0, 1).tolist() == ([21] if accepted else [0])


@pytest.mark.parametrize("x_high", [0x8000_0001, 0x8000_0000])  # odd and even high halves
def test_a_dyadic_bernoulli_compares_every_bit_of_its_uniform(monkeypatch, x_high):
    """Bernoulli(x / 2^52) is W < x for a uniform 52-bit W: with W's high 32 bits equal to x's (the
    2^-32-rare tie) the low 20 bits decide, W's against x's alone. The uniform is handed in."""
    x_low, low_bits = 5, 20
    x = np.array([(x_high << low_bits) | x_low], dtype=np.int64)
    cases = [(x_high, 4, True), (x_high, 5, False), (x_high, 6, False), (x_high, (1 << low_bits) - 1, False),
             (x_high, 0, True), (x_high - 1, (1 << low_bits) - 1, True), (x_high + 1, 0, False)]
    for high, low, below in cases:
        monkeypatch.setattr(noise, "random_halfwords", lambda n, h=high: np.full(n, h, dtype=np.uint32))
        monkeypatch.setattr(noise, "random_words", lambda n, w=low << (64 - low_bits): np.full(n, w, dtype=np.uint64))
        assert noise.bits_below(x, 32 + low_bits).tolist() == [below], (high, low)


@pytest.mark.parametrize("whole", [3, np.int64(3)])
def test_a_whole_number_scale_is_the_same_exact_scale_as_its_float(whole):
    """A scale, variance or sigma given as a Python or numpy integer is read exactly, as 3.0 is: the same parameters,
    so the same law."""
    assert noise.laplace_parameters(whole) == noise.laplace_parameters(3.0)
    assert noise.gaussian_parameters(whole) == noise.gaussian_parameters(3.0)
    assert noise.discrete_laplace(whole, 5).dtype == noise.discrete_gaussian(whole, 5).dtype == np.int64


def test_a_noise_variance_of_zero_or_less_is_refused_naming_it():
    """No noise at all (a zero variance) or a negative one is never drawn from: refused, saying what was given."""
    for variance, shown in ((0, "0.0"), (Fraction(0), "0.0"), (Fraction(-1, 4), "-0.25")):
        with pytest.raises(noise.DPError) as caught:
            noise.gaussian_parameters(variance)
        assert str(caught.value) == f"noise variance must be positive, got {shown}"


def test_a_noise_scale_over_two_to_the_48_grid_steps_is_refused_naming_it():
    """2^48 steps is the largest scale the Laplace sampler draws exactly; 2^49 is refused, with the scale."""
    assert noise.laplace_parameters(2.0**48).s == 1
    with pytest.raises(noise.DPError) as caught:
        noise.laplace_parameters(2.0**49)
    assert str(caught.value) == "noise scale 5.629e+14 is over 2^48 grid steps: refused"


def test_a_scale_below_two_to_the_minus_24_steps_is_sampled_as_1_over_s_and_below_2_to_the_minus_62_refused():
    """The other end of the sampler's range: below 2^-24 steps the numerator 2^b stays 1 (b is capped at 0)
    and S = floor(1 / scale) carries the scale, rounded up by less than 1 / S; a scale whose S would pass
    2^62 is refused, naming it."""
    for scale in (Fraction(1, 2**30), Fraction(3, 2**40), Fraction(1, 3 * 2**25)):
        params = noise.laplace_parameters(scale)
        assert (params.t_bits, params.s) == (0, math.floor(1 / scale))
        assert scale <= params.scale < scale * (1 + Fraction(1, params.s))
    with pytest.raises(noise.DPError) as caught:
        noise.laplace_parameters(Fraction(1, 2**63))
    assert str(caught.value) == "noise scale 1.084e-19 is below 2^-62 grid steps: refused"


def test_a_geometric_draw_past_the_int64_range_is_refused_not_wrapped(monkeypatch):
    """The discrete Laplace sampler refuses a geometric draw whose product with the scale would not
    fit an int64 (probability below e^-16384: the geometric stage is handed such a draw here)."""
    monkeypatch.setattr(noise, "geometric_exp_neg_one", lambda n: np.full(n, 1 << 40, dtype=np.int64))
    with pytest.raises(noise.DPError) as caught:
        noise.discrete_laplace(2.0**30, 5)
    assert str(caught.value) == "discrete Laplace sampler: geometric draw out of range (probability < 1e-7000)"


def test_a_bernoulli_of_one_in_two_to_the_31_or_more_is_drawn_exactly_as_a_uniform_below_k():
    """Bernoulli(1 / k) for k at or past 2^31 (no 32-bit word holds k - 1) is an exact uniform draw below k
    that equals 0: n draws of booleans, almost surely all False (each True with probability 1 / k: any of
    the 3,000 draws at k = 2^40 and 2^62 + 3 with probability below 3e-9)."""
    for k in (2**40, 2**62 + 3):
        drawn = noise._one_in(k, 1500)
        assert drawn.dtype == bool and drawn.shape == (1500,) and not drawn.any()


def test_a_bernoulli_of_one_in_k_past_two_to_the_31_is_true_exactly_where_the_uniform_draw_is_zero(monkeypatch):
    """The other half of the test above (which a sampler that is never True would pass): the draw is True
    where the uniform integer below k is 0 and only there, and the uniform is asked for that k."""
    asked = []

    def uniform(bound, n):
        asked.append(bound)
        return np.array([0, 5, 0, bound - 1], dtype=object)[:n]

    monkeypatch.setattr(noise, "uniform_below", uniform)
    assert noise._one_in(2**40, 4).tolist() == [True, False, True, False] and asked == [2**40]


def test_the_gaussian_noise_is_drawn_at_the_exact_variance_of_its_calibration(monkeypatch):
    """add_noise hands the sampler the variance C_u steps^2 / (2 rho) as an exact fraction, never a float
    sigma squared: at rho = 1/4 and one step the variance is exactly 2, which sqrt(2) squared in floats
    overshoots (2.0000000000000004), and the sampler's parameters would round up from there."""
    seen = []
    real = noise.gaussian_parameters
    monkeypatch.setattr(noise, "gaussian_parameters", lambda variance: seen.append(variance) or real(variance))
    share = Share("x", epsilon=1.0, delta=1e-6, rho=0.25)
    add_noise(np.array([5, 7]), target="t", quantum=1.0, sensitivity_quanta=1, max_partitions=1, share=share,
              noise="gaussian", confidence=0.95)
    assert seen == [Fraction(2)] and real(Fraction(2)) != real(Fraction(math.sqrt(2)) ** 2)


def test_a_gaussian_s_nominal_scale_and_grid_grow_with_its_sensitivity():
    """The Gaussian's nominal scale is sqrt(C_u) * D / sqrt(2 rho) and its grid 2^(ceil(log2 min(nominal, D))
    - 12), as the Laplace's is C_u * D / epsilon: at rho = 1/2, C_u = 4 and D = 1,000 quanta of 1 the
    nominal scale is 2,000 and the grid 2^(10 - 12) = 1/4, raised to the quantum 1; at D = 2^20 it is
    2^21 and the grid 2^8, so the released sum moves in steps of 256 and sigma is counted in those steps."""
    from dp_core.release import calibrate

    share = Share("s.sum", epsilon=1.0, delta=1e-6, rho=0.5)
    small = calibrate(quantum=1.0, sensitivity_quanta=1000, max_partitions=4, share=share, noise="gaussian",
                      confidence=0.95)
    assert small.nominal == 2000.0 and small.grid == 1.0 and small.scale_steps == 2000.0
    large = calibrate(quantum=1.0, sensitivity_quanta=2**20, max_partitions=4, share=share, noise="gaussian",
                      confidence=0.95)
    assert large.nominal == 2.0**21 and large.grid == 2.0**8 and large.scale_steps == 2.0 * 2**12
