"""Confidence intervals for released values (usability.md, "Measures of accuracy").

Direct statistics (COUNT, SUM) get exact intervals from the discrete noise law (noise.py).
AVG, VAR and STDDEV are ratios of noisy sums: their error is linearised around the released
components (first-order delta method, plug-in estimates), which makes it a weighted sum of
independent Laplace (or Gaussian) noises whose two-sided quantile is computed exactly:
for independent Laplace scales b_1..b_k (distinct), the characteristic function
prod 1/(1 + b_i^2 t^2) splits into partial fractions, so

    P(|sum X_i| > x) = sum_i c_i exp(-x / b_i),   c_i = prod_{j != i} b_i^2 / (b_i^2 - b_j^2).

These ratio intervals are approximate (first order) and widen to [L, U] when the noisy count is
too small for the linearisation to hold. No interval covers clamping bias or dropped partitions.
"""

from __future__ import annotations

import numpy as np

from .normal_law import normal_isf

_MIN_SCALE_RATIO = 1.01  # scales closer than this are spread apart upwards (conservative)


def laplace_mixture_tail(x: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """P(|sum_i X_i| > x) for independent Laplace X_i with the given (distinct) scales.

    x has shape (P,), scales (P, k) sorted ascending with ratio >= 1.01 between neighbours.
    """
    b2 = scales**2
    k = scales.shape[1]
    total = np.zeros_like(x, dtype=np.float64)
    for i in range(k):
        c = np.ones_like(x, dtype=np.float64)
        for j in range(k):
            if j != i:
                c = c * b2[:, i] / (b2[:, i] - b2[:, j])
        total = total + c * np.exp(-x / scales[:, i])
    return total


def _spread(scales: np.ndarray) -> np.ndarray:
    """Sort each row and raise near-equal scales so neighbours differ by >= 1%."""
    s = np.sort(scales, axis=1)
    for i in range(1, s.shape[1]):
        s[:, i] = np.maximum(s[:, i], s[:, i - 1] * _MIN_SCALE_RATIO)
    return s


def laplace_sum_halfwidth(scales: np.ndarray, alpha: float) -> np.ndarray:
    """Half-width h with P(|sum X_i| > h) = alpha, per row of `scales` (shape (P, k)).

    Zero scales are ignored; a row of zeros gets 0. Solved by bisection (monotone tail).
    """
    scales = np.atleast_2d(np.asarray(scales, dtype=np.float64))
    top = scales.max(axis=1)
    out = np.zeros(scales.shape[0])
    live = top > 0
    if not live.any():
        return out
    s = scales[live]
    tiny = s < s.max(axis=1, keepdims=True) * 1e-9
    # a negligible component cannot matter: replace it by a small distinct positive scale
    s = np.where(tiny, s.max(axis=1, keepdims=True) * 1e-9, s)
    s = _spread(s)
    k = s.shape[1]
    lo = np.zeros(s.shape[0])
    hi = (s * np.log(k / alpha)).sum(axis=1)  # union bound: tail(hi) <= alpha
    for _ in range(80):
        mid = 0.5 * (lo + hi)
        over = laplace_mixture_tail(mid, s) > alpha
        lo = np.where(over, mid, lo)
        hi = np.where(over, hi, mid)
    out[live] = hi
    return out


def gaussian_sum_halfwidth(sigmas: np.ndarray, alpha: float) -> np.ndarray:
    """Half-width for a sum of independent Gaussians: z_(1 - alpha/2) * sqrt(sum sigma_i^2)."""
    sigmas = np.atleast_2d(np.asarray(sigmas, dtype=np.float64))
    return normal_isf(alpha / 2.0) * np.sqrt((sigmas**2).sum(axis=1))


def sum_halfwidth(noise: str, scales: np.ndarray, alpha: float) -> np.ndarray:
    """Half-width of a linear combination of independent noises (scales already weighted)."""
    if noise == "gaussian":
        return gaussian_sum_halfwidth(scales, alpha)
    return laplace_sum_halfwidth(scales, alpha)


def sum_sd(noise: str, scales: np.ndarray) -> np.ndarray:
    """Standard deviation of a sum of independent noises with these (weighted) scales:
    a Laplace of scale b has variance 2 b^2, a Gaussian of sigma s has s^2."""
    scales = np.atleast_2d(np.asarray(scales, dtype=np.float64))
    factor = 1.0 if noise == "gaussian" else 2.0
    return np.sqrt(factor * (scales**2).sum(axis=1))
