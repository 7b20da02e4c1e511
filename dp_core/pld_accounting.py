"""Exact accounting of the Gaussian aggregates with privacy loss distributions (Google's dp-accounting).

The Gaussian aggregates of a plan (every component of COUNT, SUM, AVG, VAR, STDDEV under Gaussian
noise) share one budget, the pool's (epsilon_g, delta_g) (accounting.plan_budget). Two steps, both
computed by `dp_accounting` (no privacy loss distribution is written here):

1. Calibration: the continuous Gaussian's exact curve. A Gaussian mechanism of L2 sensitivity D and
   noise sigma is mu-GDP with mu = D / sigma, whose privacy curve is exactly (Balle and Wang, ICML
   2018, the analytic Gaussian mechanism; Dong, Roth and Su, JRSS-B 2022, Gaussian DP)

       delta(eps) = Phi(-eps / mu + mu / 2) - e^eps Phi(-eps / mu - mu / 2),

   and Gaussian mechanisms compose exactly, adaptively too: mu^2 adds up (Dong, Roth and Su's
   composition of Gaussian DP; results named, not numbered: the papers' texts were not at hand).
   The engine's part i has sigma_i = sqrt(C_u) D_i / sqrt(2 rho_i), so mu_i^2 = 2 rho_i and the
   pool is mu-GDP with mu = sqrt(2 rho_pool): `gaussian_rho` is the largest rho_pool whose curve at
   epsilon_g is at most (1 - DISCRETE_MARGIN) delta_g (dp_accounting's GaussianPrivacyLoss, regula
   falsi). The rest of the pool's delta pays for step 2's differences.

2. Certificate: the discrete Gaussian actually sampled, exactly. The engine draws discrete
   Gaussians on a grid (noise.py). Canonne, Kamath and Steinke (NeurIPS 2020) prove the discrete
   Gaussian rho-zCDP exactly like the continuous one and give its one-dimensional (eps, delta)
   curve, delta = P[K >= m] - e^eps P[K >= m + s] for a lattice threshold m. The continuous curve
   does not dominate it: the privacy loss (s^2 - 2 k s) / (2 sigma^2) takes lattice values, and for
   a sensitivity of one grid step the discrete delta exceeds the continuous one by up to 16% (sigma
   4, epsilon 1.95: tests/test_pld_accounting.py), so the continuous curve is not a valid
   certificate of what is sampled. `discrete_pool_delta` accounts the sampled mechanism itself:
   for each noisy component, `copies` = C_u coordinates each shifted by its sensitivity s in grid
   steps with the variance the sampler really uses (noise.gaussian_parameters: rounded up).
   That pair is the worst case of a neighbouring pair: the discrete Gaussian shift family has a
   monotone likelihood ratio, so for |v| <= s the pair (N_Z(0), N_Z(v)) is dominated (its tradeoff
   curve is above) by (N_Z(0), N_Z(s)), and products of dominated pairs are dominated; a unit moves at
   most C_u coordinates, each by at most s steps (release.add_noise). The pairs' privacy loss
   distributions (`from_discrete_gaussian_mechanism`, pessimistic rounding: an upper bound) are
   composed and read at epsilon_g. dp_accounting truncates the noise at +-ceil(11.6 sigma), mass
   below 1e-30 per coordinate; the sampler does not truncate, which moves delta by at most
   (1 + e^eps) * 1e-30 per coordinate, added here.

The engine certifies before any noise is drawn (engine.release); a pool whose certificate exceeds
delta_g, or is too large to compute (a component over MAX_CERTIFIED_SIGMA grid steps: its support is
enumerated), is released with the zCDP accountant instead (Canonne-Kamath-Steinke's conversion, valid
for the discrete Gaussian), and the release says so.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from functools import lru_cache

#: the part of the pool's delta the continuous calibration leaves to the discrete certificate
DISCRETE_MARGIN = 0.25
#: the largest discrete Gaussian (sigma in grid steps) the certificate enumerates (about 6e6 points)
MAX_CERTIFIED_SIGMA = float(2**18)
#: dp_accounting's bound on the mass its discrete Gaussian leaves out (per coordinate)
TRUNCATED_MASS = 1e-30
#: the privacy loss grid of the certificate's distributions (dp_accounting's default)
LOSS_GRID = 1e-4


def gaussian_delta(mu: float, epsilon: float) -> float:
    """delta(epsilon) of mu-GDP (a Gaussian mechanism with D / sigma = mu), exactly (module docstring)."""
    from dp_accounting.pld.privacy_loss_mechanism import GaussianPrivacyLoss

    if mu <= 0:
        return 0.0
    return float(GaussianPrivacyLoss(standard_deviation=1.0 / mu, sensitivity=1.0).get_delta_for_epsilon(epsilon))


@lru_cache(maxsize=512)
def gaussian_rho(epsilon: float, delta: float, margin: float = DISCRETE_MARGIN) -> float:
    """The largest rho (to 1e-9 relative) with gaussian_delta(sqrt(2 rho), epsilon) <= (1 - margin) delta.

    delta(eps) of mu-GDP increases with mu, so the boundary is bracketed (doubling or halving from
    mu about eps / sqrt(2 ln(1 / delta))) and narrowed by regula falsi on (log rho, log delta) with
    the Illinois step (superlinear: about ten curve evaluations, where bisection needs thirty); the
    value returned is always one whose curve was checked (0 when none is)."""
    target = (1.0 - margin) * delta
    if not (epsilon > 0 and target > 0):
        return 0.0

    def gap(log_rho: float) -> float:  # <= 0: the curve is within the target
        d = gaussian_delta(math.sqrt(2.0 * math.exp(log_rho)), epsilon)
        return (math.log(d) if d > 0 else -1e300) - math.log(target)

    # the start: mu ~ eps / sqrt(2 ln(1/delta)), or mu ~ delta when eps is tiny (in logs: eps^2 underflows)
    lo = hi = max(2.0 * math.log(epsilon) - math.log(4.0 * math.log(1.0 / target)), 2.0 * math.log(target))
    g_lo = g_hi = gap(lo)
    step = math.log(2.0)
    while g_lo > 0:  # widening steps: a bracket in a few evaluations from any start
        if lo < -690:  # rho below 1e-300: nothing fits
            return 0.0
        hi, g_hi, lo, step = lo, g_lo, lo - step, step * 2.0
        g_lo = gap(lo)
    while g_hi <= 0:
        if hi > 28:  # rho above 1e12
            return math.exp(hi)
        lo, g_lo, hi, step = hi, g_hi, hi + step, step * 2.0
        g_hi = gap(hi)
    side = 0
    while hi - lo > 1e-9:
        x = hi - g_hi * (hi - lo) / (g_hi - g_lo) if g_hi != g_lo and g_lo > -1e299 else (lo + hi) / 2.0
        x = min(max(x, lo + (hi - lo) * 1e-3), hi - (hi - lo) * 1e-3)  # strictly inside the bracket
        g = gap(x)
        if g <= 0:
            lo, g_lo = x, g
            g_hi, side = (g_hi / 2.0 if side == -1 else g_hi), -1
        else:
            hi, g_hi = x, g
            g_lo, side = (g_lo / 2.0 if side == 1 else g_lo), 1
    return math.exp(lo)


@dataclass(frozen=True)
class DiscretePart:
    """One noisy component as sampled: `copies` coordinates (C_u), each moved by at most `steps`
    grid steps by one unit, with discrete Gaussian noise of exact variance `variance` (grid steps^2)."""

    steps: int
    variance: Fraction
    copies: int

    @property
    def sigma(self) -> float:
        return math.sqrt(self.variance)


@lru_cache(maxsize=256)
def _part_pld(part: DiscretePart):
    from dp_accounting.pld.privacy_loss_distribution import from_discrete_gaussian_mechanism

    one = from_discrete_gaussian_mechanism(part.sigma, sensitivity=part.steps, value_discretization_interval=LOSS_GRID)
    return one.self_compose(part.copies) if part.copies > 1 else one


def discrete_pool_delta(parts: tuple[DiscretePart, ...], epsilon: float) -> float | None:
    """delta(epsilon) of the discrete Gaussian components composed, as sampled (module docstring,
    step 2); None when a component is too large to enumerate (over MAX_CERTIFIED_SIGMA steps)."""
    if not parts or any(p.sigma > MAX_CERTIFIED_SIGMA for p in parts):
        return None
    pld = None
    for part in parts:
        one = _part_pld(part)
        pld = one if pld is None else pld.compose(one)
    truncation = (1.0 + math.exp(epsilon)) * TRUNCATED_MASS * sum(p.copies for p in parts)
    return float(pld.get_delta_for_epsilon(epsilon)) + truncation
