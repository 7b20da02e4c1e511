"""Helpers for the statistical tests."""

from __future__ import annotations

import math

import numpy as np


def discrete_laplace_jittered_cdf(scale: float):
    """CDF of K + V, K discrete Laplace, V uniform on [-1/2, 1/2): continuous, so KS applies."""
    q = math.exp(-1.0 / scale)

    def cdf(y):
        k = np.floor(np.asarray(y) + 0.5)
        frac = np.asarray(y) + 0.5 - k
        pmf = (1 - q) / (1 + q) * q ** np.abs(k)
        # P(K <= k - 1): q^(|k|+1)/(1+q) for k <= 0, 1 - q^k/(1+q) for k >= 1
        below = np.where(k <= 0, q ** (np.abs(k) + 1) / (1 + q), 1 - q ** np.maximum(k, 0) / (1 + q))
        return below + frac * pmf

    return cdf
