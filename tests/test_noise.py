"""Secure samplers: the right law (KS / chi-square at fixed significance), the right spread, the grid.

Every statistical assertion has a false-failure probability below 1e-6 and would fail for a
sampler with half the intended scale (shown with a deliberately broken sampler).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats
from stats_helpers import discrete_laplace_jittered_cdf

from dp_core import noise
from dp_core.accounting import Share
from dp_core.release import add_noise

N = 200_000
SIGNIFICANCE = 1e-7


def laplace_ks_pvalue(samples: np.ndarray, scale: float) -> float:
    return stats.kstest(samples, stats.laplace(scale=scale).cdf).pvalue


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


@pytest.mark.parametrize("scale", [1000.0, 37.5])
def test_discrete_laplace_follows_its_law(scale):
    x = noise.discrete_laplace(scale, N)
    assert np.all(x == np.round(x))  # integers
    # KS against the exact discrete law, made continuous by a uniform jitter on [-1/2, 1/2)
    jittered = x + noise.secure_uniform(N) - 0.5
    assert stats.kstest(jittered, discrete_laplace_jittered_cdf(scale)).pvalue > SIGNIFICANCE
    halved = noise.discrete_laplace(scale / 2, N) + noise.secure_uniform(N) - 0.5
    assert stats.kstest(halved, discrete_laplace_jittered_cdf(scale)).pvalue < SIGNIFICANCE
    # spread: E|K| = 2q / (1 - q^2), Var K = 2q / (1 - q)^2
    q = math.exp(-1.0 / scale)
    mean_abs = 2 * q / (1 - q * q)
    sd_abs = math.sqrt(2 * q / (1 - q) ** 2 - mean_abs**2)
    assert abs(np.abs(x).mean() - mean_abs) < 6 * sd_abs / math.sqrt(N)


def test_ks_detects_a_sampler_with_half_the_scale():
    broken = noise.discrete_laplace(500.0, N)  # half of the intended 1000
    assert laplace_ks_pvalue(broken, 1000.0) < SIGNIFICANCE
    good = noise.discrete_laplace(1000.0, N)
    assert laplace_ks_pvalue(good, 1000.0) > SIGNIFICANCE


@pytest.mark.parametrize("sigma", [800.0, 3.3])
def test_discrete_gaussian_follows_its_law(sigma):
    x = noise.discrete_gaussian(sigma, N)
    assert np.all(x == np.round(x))
    if sigma > 100:
        assert stats.kstest(x, stats.norm(scale=sigma).cdf).pvalue > SIGNIFICANCE
        assert stats.kstest(noise.discrete_gaussian(sigma / 2, N), stats.norm(scale=sigma).cdf).pvalue < SIGNIFICANCE
    else:  # small sigma: chi-square against the exact pmf
        k = np.arange(-25, 26)
        pmf = np.exp(-(k**2) / (2 * sigma**2))
        pmf /= pmf.sum()
        observed = np.array([(x == v).sum() for v in k])
        assert observed.sum() == N
        keep = pmf * N >= 5
        chi = stats.chisquare(observed[keep], pmf[keep] * N * observed[keep].sum() / (pmf[keep] * N).sum())
        assert chi.pvalue > SIGNIFICANCE


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
