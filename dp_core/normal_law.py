"""The standard normal law's upper tail and its inverse, from the standard library.

The Gaussian mechanisms need only two functions of N(0, 1): the tail P(Z > x), for the weighted
Gaussian partition selection's threshold (an upper bound on a lone unit's chance to pass, so its
delta holds) and the selection advice, and its inverse, for confidence intervals and first
guesses. scipy.stats gives both but takes about half a second to import, which every release
paid on its way to the summary.

    sf(x)  = P(Z > x) = erfc(x / sqrt 2) / 2      (no cancellation in the upper tail, unlike 1 - Phi;
                                                   scipy's norm.sf computes the same erfc)
    isf(p) = -Phi^-1(p)                           (by symmetry; Phi^-1 is statistics.NormalDist.inv_cdf,
                                                   Wichura's algorithm AS 241 (1988), relative
                                                   error about 1e-16 over (0, 1))
"""

from __future__ import annotations

import math
from statistics import NormalDist

import numpy as np

_STANDARD = NormalDist()
_erfc = np.frompyfunc(math.erfc, 1, 1)
_SQRT_HALF = math.sqrt(0.5)  # x / sqrt 2 as x * sqrt(1/2), as scipy.special.ndtr computes it


def normal_sf(x):
    """P(Z > x) for a standard normal Z: a float for a number, an array of floats for an array."""
    if np.ndim(x) == 0:
        return 0.5 * math.erfc(float(x) * _SQRT_HALF)
    return 0.5 * _erfc(np.asarray(x, dtype=np.float64) * _SQRT_HALF).astype(np.float64)


def normal_isf(p: float) -> float:
    """The z with P(Z > z) = p: +inf for p <= 0, -inf for p >= 1 (as scipy's norm.isf)."""
    p = float(p)
    if math.isnan(p):
        return math.nan
    if p <= 0.0:
        return math.inf
    if p >= 1.0:
        return -math.inf
    return -_STANDARD.inv_cdf(p)
