"""Partition selection by weighted Gaussian and MaxAdaptiveDegree (two-round adaptive reweighting).

Both mechanisms replace "count each unit once in each of its partitions" by a *weighted histogram*
in which every unit spreads an L2 weight of at most 1 over the (at most C_u) partitions it kept
after contribution bounding, then add Gaussian noise and keep partitions above a threshold.

Weighted Gaussian (Gopi, Gulhane, Kulkarni, Shen, Shokouhi, Yekhanin, "Differentially Private Set
Union", ICML 2020, arXiv 2002.09745, Algorithm "weighted Gaussian"): a unit with t kept partitions
gives each of them the weight 1/sqrt(t), so its weight vector has L2 norm exactly 1 whatever t is.
Summing per partition gives W_i = sum over units u in i of t_u^(-1/2). A unit that touches one
partition weighs 1 there (the plain count), a unit that touches four weighs 1/2 in each, against
1/C_u-th of the budget each in truncated-geometric or Laplace selection: the weight goes where
units are concentrated.

Sensitivity of the weighted histogram (add/remove one unit u with any rows). Contribution bounding
keeps at most C_u partitions per unit and the choice depends on u's own rows only (keyed hash, see
bounding.py), so the other units' kept partitions and degrees t_v do not change. W changes only in
u's own kept partitions, by exactly u's weights: ||W(D) - W(D')||_2 = sqrt(t_u * (1/t_u)) = 1.
Weights are integers here: q_t = floor(2^16 / sqrt(t)) computed exactly (isqrt(4^16 // t)), so
t q_t^2 <= 4^16 and the L2 sensitivity in weight steps is at most 2^16 (`WEIGHT_ONE`): the
quantisation only rounds weights down, never up.

MaxAdaptiveDegree (Chen, Cohen-Addad, Epasto, Zadimoghaddam, "Scalable Private Partition Selection
via Adaptive Weighting", ICML 2025, arXiv 2502.08878): partitions whose weight is far above the
threshold waste the weight of their units, which could lift the units' other partitions over the
threshold; MAD reroutes that excess weight to partitions with less weight, and the paper's two-round
form (MAD2R) uses the result of a first round to bias the weighting of the second. What is built
here is that two-round form, with the adaptive step done on *public* information so that each
round's sensitivity is exactly 1 and the proof is short and self-contained:

  round 1: the weighted Gaussian above with a share `MAD_ROUND_ONE_SHARE` of the selection's rho;
           partitions above threshold T1 are released (they are far above what round 2 needs);
  round 2: each unit moves all its weight off its partitions released in round 1 and spreads its
           whole L2 budget over its r_u remaining kept partitions: 1/sqrt(r_u) each; Gaussian noise
           with the rest of rho; partitions above T2 are released. Release = round 1 + round 2.

A partition released in round 1 needs no more weight; a tail partition whose units also hold
popular partitions (the usual case under Zipf-like popularity) gets up to sqrt(C_u) times its
weighted-Gaussian weight in round 2. Round 2's reweighting depends on each unit's own kept
partitions and on the round-1 output only (post-processing of a DP release), so given round 1 the
round-2 histogram changes by u's round-2 weights alone: L2 sensitivity 1 again (tested, with
hypothesis, in tests/test_selection_sensitivity.py). The deterministic one-round rerouting of the
paper (excess weight computed from the exact histogram) was not built: its sensitivity argument
could not be checked against the paper's text here, and a naive version's sensitivity grows with
C_u (the rerouted weight of every unit sharing a partition with u changes when u is added).

Citations name papers and their results, not lemma numbers: neither paper's full text could be
retrieved while this was written, and a wrong number is worse than none. The proof below is
self-contained.

Privacy proof sketch (user level, add/remove one unit u; D' = D + u). Let N be the partitions in
which u is the only unit ("new" partitions: empty in D, never released on D).
  (1) Gaussian part. On the partitions that exist in both D and D', each round is a Gaussian
      mechanism of L2 sensitivity 1 (weights in steps: 2^16) with independent discrete Gaussian
      noise of sigma = 1 / sqrt(2 rho_k) (in weight units) per partition. An integer shift m of
      one coordinate costs Renyi divergence alpha m^2 / (2 sigma^2) (Canonne, Kamath, Steinke,
      "The discrete Gaussian for differential privacy", NeurIPS 2020), independent coordinates add
      up, so a round is rho_k-zCDP; zCDP composes adaptively by adding rho (Bun and Steinke, TCC
      2016), so both rounds are rho-zCDP, which is (eps, delta_g)-DP by the conversion in
      accounting.rho_from_eps_delta_tight (Canonne, Kamath, Steinke 2020).
  (2) Threshold part. u's weights in N are at most 1/sqrt(k) on each of k <= C_u new partitions in
      either round, so a new partition shows up with probability at most
      delta_new(T) = max_k 1 - (1 - P[K >= T - q_k])^k per round (the threshold rule of Gopi et
      al.'s weighted Gaussian, with the exact integer weights), with P[K >= m] <= Phi_bar((m - 1) / sigma) for the discrete
      Gaussian K (compare its mass with the integral from m - 1 and its normaliser with
      sqrt(2 pi) sigma). Both rounds together: delta_new_1 + delta_new_2.
  (3) Couple M(D') with M'(D'), which never releases a new partition: they differ only when a new
      partition crosses its threshold, probability <= delta_new. M'(D') and M(D) are
      (eps, delta_g)-close by (1) (and so is everything computed from them, the aggregates of the
      released partitions included, under basic composition with their own shares). Hence
      P[M(D') in S] <= e^eps P[M(D) in S] + delta_g + delta_new and
      P[M(D) in S] <= e^eps P[M(D') in S] + delta_g + e^eps delta_new.
      The engine gives delta_new = (delta_sel / 2) e^(-eps_query) and delta_g = delta_sel / 2, so
      the selection never costs more than its (eps_sel, delta_sel) share, whatever eps the rest of
      the query spends (accounting.plan_budget).
"""

from __future__ import annotations

import math
from fractions import Fraction
from functools import lru_cache

import numpy as np

from .accounting import Share
from .noise import discrete_gaussian, gaussian_parameters
from .normal_law import normal_isf, normal_sf

#: weights are integers in units of 2^-16 (a unit of weight 1 is 65,536 steps)
WEIGHT_BITS = 16
WEIGHT_ONE = 1 << WEIGHT_BITS
#: the share of the selection's rho spent in MAD's first round (the rest goes to the second)
MAD_ROUND_ONE_SHARE = 0.08
#: the selections that read the plan's per-partition weights `_w1` (MAD's damped form: selection_damped.py)
WEIGHTED_SELECTIONS = ("weighted_gaussian", "mad", "mad_damped")


def unit_weights(max_partitions: int) -> tuple[int, ...]:
    """q_t = floor(2^16 / sqrt(t)) for t = 1..C_u, exactly (t q_t^2 <= 4^16: L2 norm <= 2^16)."""
    return tuple(math.isqrt((WEIGHT_ONE * WEIGHT_ONE) // t) for t in range(1, max_partitions + 1))


def weight_sql(degree_column: str, max_partitions: int, at: str = "list_extract({arr}, {i})",
               weights: tuple[int, ...] | None = None) -> str:
    """SQL for the integer weight of one (unit, partition) row of a unit with `degree_column` kept
    partitions (1 <= degree <= C_u): `weights[degree - 1]`, by default the table q_t."""
    arr = "[" + ", ".join(str(q) for q in (weights or unit_weights(max_partitions))) + "]"
    return f"CAST({at.format(arr=arr, i=f'CAST({degree_column} AS INTEGER)')} AS BIGINT)"  # Spark indexes by INT


def gaussian_tail_bound(m: float, sigma: float) -> float:
    """An upper bound on P[K >= m] for the discrete Gaussian K of parameter sigma (m an integer):
    Phi_bar((m - 1) / sigma) when m >= 1 (see the module docstring), 1 otherwise."""
    return normal_sf((m - 1.0) / sigma) if m >= 1 else 1.0


def lone_unit_weights(max_partitions: int) -> tuple[tuple[int, ...], ...]:
    """The weight vectors a unit alone in its k <= C_u partitions can give them: q_k in each."""
    return tuple((q,) * k for k, q in enumerate(unit_weights(max_partitions), start=1))


def new_partition_probability(threshold: int, sigma: float, max_partitions: int,
                              configurations: tuple[tuple[int, ...], ...] | None = None) -> float:
    """The largest probability that a unit alone in its partitions, weighing them as one of
    `configurations` (default: q_k in each of k <= C_u, `lone_unit_weights`), gets any of them over
    `threshold` (all in weight steps): max over vectors w of 1 - prod_i (1 - P[K >= T - w_i])."""
    worst = 0.0
    for vector in configurations or lone_unit_weights(max_partitions):
        log_none = sum(math.log1p(-min(gaussian_tail_bound(threshold - w, sigma), 1.0 - 1e-300)) for w in vector)
        worst = max(worst, -math.expm1(log_none))
    return worst


@lru_cache(maxsize=256)
def gaussian_threshold(sigma: float, delta_new: float, max_partitions: int,
                       configurations: tuple[tuple[int, ...], ...] | None = None) -> int:
    """The smallest integer threshold T (weight steps) with new_partition_probability <= delta_new
    (no single weight above 2^16: every configuration has L2 norm <= 2^16)."""
    guess = WEIGHT_ONE + 1 + sigma * normal_isf(delta_new / max_partitions)
    hi = math.ceil(guess) + 1
    while new_partition_probability(hi, sigma, max_partitions, configurations) > delta_new:
        hi = math.ceil(hi * 1.01) + 1
    lo = WEIGHT_ONE  # below 1 the single-unit partition is released with probability >= 1/2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if new_partition_probability(mid, sigma, max_partitions, configurations) <= delta_new:
            hi = mid
        else:
            lo = mid
    return hi


def selection_rounds(strategy: str, share: Share, max_partitions: int, epsilon_query: float) -> list[dict]:
    """The public parameters of each Gaussian round: rho, sigma and threshold in weight steps,
    delta_new. `share.rho` is the selection's zCDP budget (set by accounting.plan_budget)."""
    fractions = [1.0] if strategy == "weighted_gaussian" else [MAD_ROUND_ONE_SHARE, 1.0 - MAD_ROUND_ONE_SHARE]
    delta_new = share.delta / 2.0 * math.exp(-epsilon_query) / len(fractions)
    rounds = []
    for f in fractions:
        rho = share.rho * f
        # the law the sampler draws: its variance is the exact 4^16 / (2 rho) rounded up (noise.py);
        # the threshold is set for that (wider) noise, so delta_new is not understated
        law = gaussian_parameters(Fraction(WEIGHT_ONE * WEIGHT_ONE) / (2 * Fraction(rho)))
        variance = Fraction(law.a * 4**law.j, 1 << law.r)
        sigma = math.sqrt(variance)
        rounds.append({"rho": rho, "sigma": sigma, "variance": variance, "delta_new": delta_new,
                       "threshold": gaussian_threshold(sigma, delta_new, max_partitions)})
    return rounds


def noisy_pass(weights: np.ndarray, rnd: dict) -> np.ndarray:
    """One Gaussian round: integer weights plus discrete Gaussian noise, kept when >= threshold."""
    return weights + discrete_gaussian(rnd["sigma"], weights.size, variance=rnd["variance"]) >= rnd["threshold"]
