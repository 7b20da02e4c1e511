"""MaxAdaptiveDegree, damped (`mad_damped`): MAD's two rounds (selection_weighted.py) with a second
round that takes weight off the partitions round 1 already saw far above round 2's threshold, and
the threshold's delta charged at the selection's own epsilon. More groups from the same share.

Why. On the L workload (bench/utility.py) MAD's round 2 still spends each unit's weight evenly on
its partitions left, and many of them are far above round 2's threshold (round 1 sees them but,
with 8% of rho, its own threshold is 3.5 times higher): that weight is wasted. Here round 1's noisy
weights, a DP output, mark such partitions *damped*; in round 2 a unit gives a damped partition
half the weight of an undamped one, so its other partitions get more. Three budget settings were
sized on L beside it (each about +2 to +4% groups): round 1 gets 5% of rho, the threshold's delta
goes 5% to round 1 and 95% to round 2 (round 1's threshold barely matters), and that delta is
delta_sel / 2 * e^(-eps_sel), not e^(-eps_query) (step 3 below).

The mechanism (weights in integer steps of 2^-16, noise the exact discrete Gaussian, noise.py):
  rho = rho_from_eps_delta_tight(eps_sel, delta_sel / 2): the selection's own, never pooled with
        the Gaussian aggregates (it composes with them by basic composition);
  round 1: W1 = the weighted histogram (each unit q_t = floor(2^16 / sqrt(t)) in each of its t kept
        partitions), Y1 = W1 + K1, K1 ~ N_Z(0, s1^2) per partition, s1^2 = 4^16 / (2 * 0.05 rho);
        released R1 = {Y1 >= T1}; damped D = {A <= Y1 < T1}, A = T2 + s1 (public numbers);
  round 2: a unit with a undamped and b damped kept partitions outside R1 (m = 4a + b) gives an
        undamped one F_m = floor(2^17 / sqrt(m)) = floor(2^16 / sqrt(a + b/4)) and a damped one
        G_m = floor(2^16 / sqrt(m)) (half, before rounding down); W2 their sum per partition,
        Y2 = W2 + K2, s2^2 = 4^16 / (2 * 0.95 rho); released R2 = {Y2 >= T2} outside R1.
  Release: R1 + R2.

Sensitivity (add or remove one unit u, D' = D + u; the keyed-hash bounding keeps each unit's C_u
partitions from its own rows only, so no other unit's kept partitions change):
  round 1 changes only in u's t kept partitions, by q_t each: L2 = sqrt(t q_t^2) <= 2^16;
  round 2, given round 1's output (R1, D are then fixed, public sets): every other unit's a, b and
  weights are functions of its own kept partitions and (R1, D) only, so W2 changes only in u's
  partitions, by u's weights: a F_m^2 + b G_m^2 <= a 4^17 / m + b 4^16 / m = 4^16 (4a + b) / m = 4^16,
  L2 <= 2^16 again (isqrt(4^17 // m)^2 <= 4^17 / m). Tested exhaustively for every (a, b) in
  tests/test_selection_damped.py, and the SQL's W2 against a reference written from this text.

Privacy (user level; N = the partitions where u is the only unit, empty in D):
  (1) Gaussian part: on the partitions of both D and D', each round is the discrete Gaussian
      mechanism of L2 sensitivity 2^16 with rho_k = f_k rho, i.e. rho_k-zCDP (Canonne, Kamath,
      Steinke 2020), and round 2 is chosen from round 1's output: adaptive zCDP composition adds
      (Bun and Steinke 2016): rho-zCDP, hence (eps_sel, delta_sel / 2)-DP by the tight conversion.
  (2) Threshold part: a new partition is released only if it crosses a threshold. In round 1 u
      weighs q_t on its t <= C_u partitions; in round 2, whatever round 1 did, u's weights on its
      new partitions are a vector (F_m x a, G_m x b) with a + b <= C_u (more kept partitions,
      released or old, only lower them): P[some new partition crosses T2] <= max over (a, b) of
      1 - (1 - P[K2 >= T2 - F_m])^a (1 - P[K2 >= T2 - G_m])^b = delta_new_2, and likewise delta_new_1
      with the vectors (q_t x t); P[K >= m] <= Phi_bar((m - 1) / s) for the discrete Gaussian
      (selection_weighted.gaussian_tail_bound). The union over both rounds: delta_new =
      delta_new_1 + delta_new_2 <= 0.05 delta_t + 0.95 delta_t, delta_t = delta_sel / 2 * e^(-eps_sel).
  (3) Couple Sel(D') with Sel'(D'), which never releases a partition of N: they differ with
      probability <= delta_new, and Sel'(D') is (eps_sel, delta_sel / 2)-close to Sel(D) by (1). So
      Sel is (eps_sel, delta_sel / 2 + e^eps_sel delta_new) = (eps_sel, delta_sel)-DP on its own.
      The aggregates of the released partitions, for any fixed set of partitions (one absent from
      the data is an empty group: u's contribution to it is within the aggregates' sensitivity),
      are (eps_agg, delta_agg)-DP, so the release is (eps_sel + eps_agg, delta_sel + delta_agg)-DP
      by adaptive basic composition: the selection costs its share and no more. MAD proper charges
      e^(-eps_query) because its rho is pooled with the Gaussian aggregates' and its coupling runs
      over the whole release; this selection is not pooled.
The one-unit group's release chance is computed exactly (100-digit decimals, from this text and not
from this module) in tests/test_selection_delta.py; the neighbour audit runs the engine's own noise
(tests/audit; its broken variant, both thresholds at one unit's weight, is caught).
"""

from __future__ import annotations

import math
from fractions import Fraction
from functools import lru_cache

import numpy as np

from .accounting import Share, rho_from_eps_delta_tight
from .noise import discrete_gaussian, gaussian_parameters
from .selection_weighted import WEIGHT_ONE, gaussian_threshold, lone_unit_weights, selection_rounds

#: the share of the selection's rho spent in round 1 (sized on L: bench/utility.py)
DAMPED_ROUND_ONE_SHARE = 0.05
#: the share of the threshold's delta given to round 1's threshold (round 2's matters more)
DAMPED_ROUND_ONE_DELTA = 0.05
#: a partition is damped when round 1's noisy weight is at least T2 + this many round-1 sigmas
DAMPING_CUT_SIGMAS = 1.0


def undamped_weights(max_partitions: int) -> tuple[int, ...]:
    """F_m = floor(2^17 / sqrt(m)) for m = 4a + b = 1..4 C_u (an undamped partition's weight)."""
    return tuple(math.isqrt(4 * WEIGHT_ONE * WEIGHT_ONE // m) for m in range(1, 4 * max_partitions + 1))


def damped_weights(max_partitions: int) -> tuple[int, ...]:
    """G_m = floor(2^16 / sqrt(m)) for m = 1..4 C_u (a damped partition's weight: half, rounded down)."""
    return tuple(math.isqrt(WEIGHT_ONE * WEIGHT_ONE // m) for m in range(1, 4 * max_partitions + 1))


@lru_cache(maxsize=64)
def lone_unit_damped_weights(max_partitions: int) -> tuple[tuple[int, ...], ...]:
    """Every weight vector round 2 can give a unit alone in its partitions: a undamped and b damped,
    1 <= a + b <= C_u (step 2 of the module docstring)."""
    full, half = undamped_weights(max_partitions), damped_weights(max_partitions)
    return tuple((full[4 * a + b - 1],) * a + (half[4 * a + b - 1],) * b
                 for a in range(max_partitions + 1) for b in range(max_partitions + 1 - a) if a + b >= 1)


def selection_rho(share: Share) -> float:
    """The selection's own rho: from its epsilon and half its delta (not pooled, step 1)."""
    return rho_from_eps_delta_tight(share.epsilon, share.delta / 2.0) if share.epsilon > 0 else 0.0


def _sigma(rho: float) -> tuple[float, Fraction]:
    """(sigma, exact variance) of the law the sampler draws for a round of zCDP `rho` in weight
    steps: 4^16 / (2 rho) rounded up by the sampler (noise.gaussian_parameters), never down."""
    law = gaussian_parameters(Fraction(WEIGHT_ONE * WEIGHT_ONE) / (2 * Fraction(rho)))
    variance = Fraction(law.a * 4**law.j, 1 << law.r)
    return math.sqrt(variance), variance


def damped_rounds(share: Share, max_partitions: int) -> list[dict]:
    """The public parameters of both rounds: rho, sigma, variance and threshold (weight steps),
    delta_new; round 1 also carries the damping cut A."""
    rho = selection_rho(share)
    delta_t = share.delta / 2.0 * math.exp(-share.epsilon)
    rounds = []
    for fraction, delta_new, vectors in (
        (DAMPED_ROUND_ONE_SHARE, delta_t * DAMPED_ROUND_ONE_DELTA, lone_unit_weights(max_partitions)),
        (1.0 - DAMPED_ROUND_ONE_SHARE, delta_t * (1.0 - DAMPED_ROUND_ONE_DELTA), lone_unit_damped_weights(max_partitions)),
    ):
        sigma, variance = _sigma(rho * fraction)
        rounds.append({"rho": rho * fraction, "sigma": sigma, "variance": variance, "delta_new": delta_new,
                       "threshold": gaussian_threshold(sigma, delta_new, max_partitions, vectors)})
    rounds[0]["damping_cut"] = rounds[1]["threshold"] + math.ceil(DAMPING_CUT_SIGMAS * rounds[0]["sigma"])
    return rounds


def rounds_of(strategy: str, share: Share, max_partitions: int, epsilon_query: float) -> list[dict]:
    """The Gaussian rounds of a weighted selection, damped MAD's or selection_weighted's."""
    if strategy == "mad_damped":
        return damped_rounds(share, max_partitions)
    return selection_rounds(strategy, share, max_partitions, epsilon_query)


def first_round(weights: np.ndarray, strategy: str, share: Share, max_partitions: int,
                epsilon_query: float) -> tuple[np.ndarray, np.ndarray]:
    """Round 1 of a two-round selection on the plan's `_w1`: (released, damped). The noise is drawn
    once; MAD damps nothing."""
    rnd = rounds_of(strategy, share, max_partitions, epsilon_query)[0]
    noisy = weights + discrete_gaussian(rnd["sigma"], weights.size, variance=rnd["variance"])
    released = noisy >= rnd["threshold"]
    if strategy != "mad_damped":
        return released, np.zeros_like(released)
    return released, (noisy >= rnd["damping_cut"]) & ~released
