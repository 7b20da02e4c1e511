"""Secure noise: randomness from the OS CSPRNG, discrete samplers on a power-of-two grid.

Why not `numpy.random` floats: textbook Laplace on floats leaks through floating-point artefacts
(Mironov, CCS 2012) and a seeded PRNG is predictable. Here every random bit comes from
`os.urandom`, and noise is an *integer* number of grid steps: the released value is
`(round(x / g) + K) * g` with `K` drawn from a discrete law (discrete Laplace = two-sided geometric,
Ghosh-Roughgarden-Sundararajan 2009; discrete Gaussian, Canonne-Kamath-Steinke 2020), so the output
lies on the grid `g * Z` and carries no trace of `x`'s low bits.

Geometric variables are drawn by inversion from CSPRNG uniforms with 53 significant bits down to
2^-106 (so the tail is resolved to about 73 scales; the mass beyond is below 1e-31). The inversion
runs in float64: see docs/noise.md for what that rounding does to the law, and the derivations.
"""

from __future__ import annotations

import math
import os

import numpy as np

from .errors import DPError

_TWO_POW_53 = float(2**53)
_SMALL = float(2**32)  # below 2^-21, a uniform gets 53 more bits
#: grid steps per noise scale (log2): noise is resolved to 2^-12 of its scale, and a draw stays
#: far below 2^53 steps, where float64 integers stop being exact.
GRID_STEPS_PER_SCALE_LOG2 = 12


def uniform_from_words(high: np.ndarray, low: np.ndarray) -> np.ndarray:
    """Uniforms on (0, 1] from two 53-bit integers each: (high + 1) / 2^53, and where high < 2^32
    (u < 2^-21) the finer (high * 2^53 + low + 1) / 2^106, which keeps 53 significant bits."""
    hi = high.astype(np.float64)
    coarse = (hi + 1.0) / _TWO_POW_53
    fine = (hi * _TWO_POW_53 + low.astype(np.float64) + 1.0) / (_TWO_POW_53 * _TWO_POW_53)
    return np.where(hi < _SMALL, fine, coarse)


def secure_uniform(n: int) -> np.ndarray:
    """`n` floats uniform on (0, 1], from the OS CSPRNG (53 significant bits down to 2^-106)."""
    if n <= 0:
        return np.empty(0, dtype=np.float64)
    words = np.frombuffer(os.urandom(8 * n), dtype=np.uint64) >> np.uint64(11)
    small = np.flatnonzero(words < np.uint64(2**32))
    low = np.zeros(n, dtype=np.uint64)
    if small.size:
        low[small] = np.frombuffer(os.urandom(8 * small.size), dtype=np.uint64) >> np.uint64(11)
    return uniform_from_words(words, low)


def _geometric(scale: float, n: int) -> np.ndarray:
    """`n` draws of G >= 0 with P(G >= k) = exp(-k / scale) (inversion: G = floor(-scale ln U))."""
    return np.floor(-scale * np.log(secure_uniform(n)))


def discrete_laplace(scale: float, n: int) -> np.ndarray:
    """`n` integers K with P(K = k) proportional to exp(-|k| / scale) (difference of two geometrics).

    `scale` is in grid steps; it may be any positive float.
    """
    if not (scale > 0 and math.isfinite(scale)):
        raise DPError(f"noise scale must be a positive finite number, got {scale!r}")
    return _geometric(scale, n) - _geometric(scale, n)


def discrete_gaussian(sigma: float, n: int) -> np.ndarray:
    """`n` integers K with P(K = k) proportional to exp(-k^2 / (2 sigma^2)).

    Rejection sampling from a discrete Laplace of scale floor(sigma) + 1 (Canonne, Kamath, Steinke,
    "The discrete Gaussian for differential privacy", NeurIPS 2020, Algorithm 3), vectorised.
    """
    if not (sigma > 0 and math.isfinite(sigma)):
        raise DPError(f"noise sigma must be a positive finite number, got {sigma!r}")
    t = math.floor(sigma) + 1.0
    var = sigma * sigma
    out = np.empty(n, dtype=np.float64)
    filled = 0
    while filled < n:
        want = n - filled
        batch = max(int(want * 1.6) + 16, 64)
        y = discrete_laplace(t, batch)
        accept_p = np.exp(-((np.abs(y) - var / t) ** 2) / (2.0 * var))
        kept = y[secure_uniform(batch) <= accept_p]
        take = min(kept.size, want)
        out[filled : filled + take] = kept[:take]
        filled += take
    return out


def real_grid(scale: float) -> float:
    """The power-of-two grid step for a statistic whose noise has this scale.

    Depends on the (public) noise scale only, never on the data: 2^(ceil(log2 scale) - 12).
    """
    return math.ldexp(1.0, math.ceil(math.log2(scale)) - GRID_STEPS_PER_SCALE_LOG2)


def discrete_laplace_halfwidth(scale: float, alpha: float) -> int:
    """Smallest integer m with P(|K| > m) <= alpha, i.e. 2 q^(m+1) / (1 + q) <= alpha."""
    q = math.exp(-1.0 / scale)
    # 2 q^(m+1) / (1+q) <= alpha  <=>  m + 1 >= ln(alpha (1+q) / 2) / ln q
    bound = math.log(alpha * (1.0 + q) / 2.0) / math.log(q)
    m = max(math.ceil(bound - 1.0 - 1e-12), 0)
    while 2.0 * q ** (m + 1) / (1.0 + q) > alpha:  # guard against float rounding
        m += 1
    return m


def discrete_gaussian_halfwidth(sigma: float, alpha: float) -> int:
    """Smallest integer m with P(|K| > m) <= alpha under the discrete Gaussian.

    Summed exactly from the probability mass function when sigma < 1e4 grid steps; beyond, the
    discrete and continuous laws agree to far below float precision (CKS 2020, Fact 20), and the
    continuous quantile rounded up plus one step is used.
    """
    from scipy.stats import norm

    if sigma >= 1e4:
        return math.ceil(sigma * norm.isf(alpha / 2.0)) + 1
    k = np.arange(0, math.ceil(40 * sigma) + 2, dtype=np.float64)
    w = np.exp(-(k * k) / (2.0 * sigma * sigma))
    total = w[0] + 2.0 * w[1:].sum()
    # P(|K| > m) = 2 * sum_{k > m} w_k / total
    tail_after = 2.0 * (w[::-1].cumsum()[::-1] - w) / total
    return int(np.argmax(tail_after <= alpha))
