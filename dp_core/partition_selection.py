"""Private partition selection: which groups of the data may appear in the release.

A partition that exists only because of one unit must appear with probability at most delta
(over all of that unit's <= C_u partitions together). Strategies share one interface: the number
of distinct units per partition after contribution bounding, the budget share, C_u; the weighted
ones (weighted Gaussian, MaxAdaptiveDegree: selection_weighted.py, with their derivations) also
read the per-partition weights the bounding plan computed (`rows`); MAD's damped form is
selection_damped.py. Derivations: dp-engine.md,
"Partition selection".
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction

import numpy as np

from .accounting import Share
from .noise import laplace_parameters
from .release import MechanismRecord, NoisyStatistic, add_noise
from .selection_damped import damped_rounds, selection_rho
from .selection_geometric import draw_keep
from .selection_geometric import keep_probability as geometric_keep_probability
from .selection_weighted import WEIGHT_ONE, noisy_pass, selection_rounds

#: the relative amount by which d is lowered: its float computation is off by a few ulps (2^-52 each)
#: either way, and a d one ulp high gave a group of one unit a chance 1e-16 above delta (checked
#: exactly in tests/test_selection_delta.py)
PER_PARTITION_DELTA_MARGIN = 2.0**-48


def per_partition_delta(delta: float, max_partitions: int) -> float:
    """d = 1 - (1 - delta)^(1/C_u), computed as -expm1(log1p(-delta) / C_u) to keep its digits and
    lowered by PER_PARTITION_DELTA_MARGIN, so that 1 - (1 - d)^C_u <= delta holds exactly."""
    return -math.expm1(math.log1p(-delta) / max_partitions) * (1.0 - PER_PARTITION_DELTA_MARGIN)


def laplace_tau(epsilon: float, delta: float, max_partitions: int) -> float:
    """The seed's threshold (Theorem 12) for continuous Laplace noise of scale C_u / eps:

    tau = 1 - (C_u / eps) * ln(2 - 2 (1 - delta)^(1/C_u)) = 1 - b ln(2 d).
    """
    b = max_partitions / epsilon
    return 1.0 - b * math.log(2.0 * per_partition_delta(delta, max_partitions))


def discrete_laplace_threshold(epsilon: float, delta: float, max_partitions: int) -> int:
    """The integer threshold T for the discrete Laplace count this engine draws.

    Derivation as for `laplace_tau`, with the discrete law: a partition whose only unit is one
    unit has exact count 1 and is kept when 1 + K >= T, i.e. K >= T - 1, which has probability
    q^(T-1) / (1 + q), q = exp(-1 / t). T is the smallest integer with that <= d. t is the scale
    the sampler draws (noise.laplace_parameters: C_u / eps rounded up by less than 2^-19), whose
    tail is the heavier one. The tail is computed as exp(-m / t) / (1 + q) (relative error ~1e-14 for
    any m, where q**m's grows with m) and compared with a relative margin of 1e-12.
    """
    scale = float(laplace_parameters(Fraction(max_partitions) / Fraction(epsilon)).scale)
    q = math.exp(-1.0 / scale)
    d = per_partition_delta(delta, max_partitions)
    m = max(math.ceil(math.log(d * (1.0 + q)) / math.log(q) - 1e-9), 1)
    while math.exp(-m / scale) / (1.0 + q) > d * (1.0 - 1e-12):  # guard against float rounding
        m += 1
    return 1 + m


def truncated_geometric_keep_probability(n: np.ndarray, epsilon: float, delta: float, max_partitions: int) -> np.ndarray:
    """Keep probability p(n) of the near-optimal selection (Desfontaines, Voss, Gipson, Mandayam,
    PoPETs 2022, arXiv 2006.03684), with e = eps/C_u and d = 1 - (1 - delta)^(1/C_u): the one the
    selection draws, from the exact recursion of selection_geometric.py, whose closed form is

        p(n) = d (exp(n e) - 1) / (exp(e) - 1)                              n <= n1
        p(n) = p(n1) - (1 - p(n1) + d / (exp(e) - 1)) (exp(-(n - n1) e) - 1) n > n1
        n1 = 1 + floor(ln(1 + tanh(e/2) (1/d - 1)) / e),   p = min(p, 1), p(0) = 0.
    """
    return geometric_keep_probability(n, epsilon, max_partitions, per_partition_delta(delta, max_partitions))


@dataclass(frozen=True)
class Selection:
    """What a strategy decided: which partitions to keep, and the noisy unit counts it drew (the
    Laplace threshold's counts may be released as COUNT(DISTINCT unit); other strategies: None)."""

    strategy: str
    keep: np.ndarray
    noisy_units: NoisyStatistic | None
    threshold: float | None
    description: str
    records: tuple[MechanismRecord, ...] = ()  # the Gaussian rounds of the weighted strategies


def select_laplace_threshold(n_units: np.ndarray, share: Share, max_partitions: int, confidence: float = 0.95,
                             **_context) -> Selection:
    """Noisy distinct-unit count (discrete Laplace, scale C_u / eps) kept when >= T."""
    threshold = discrete_laplace_threshold(share.epsilon, share.delta, max_partitions)
    noisy = add_noise(
        n_units, target="partition selection: distinct units", quantum=1.0, sensitivity_quanta=1,
        max_partitions=max_partitions, share=share, noise="laplace", confidence=confidence,
    )
    return Selection(
        "laplace-threshold",
        noisy.values >= threshold,
        noisy,
        float(threshold),
        f"noisy count of units (discrete Laplace, scale {max_partitions / share.epsilon:.4g}) "
        f">= threshold {threshold}",
    )


def select_truncated_geometric(n_units: np.ndarray, share: Share, max_partitions: int, confidence: float = 0.95,
                               **_context) -> Selection:
    """Keep each partition independently with probability p(n) (CSPRNG uniforms)."""
    keep = draw_keep(n_units, share.epsilon, max_partitions, per_partition_delta(share.delta, max_partitions))
    record = MechanismRecord(
        target="partition selection: truncated geometric", mechanism="keep with probability p(n) of the unit count",
        sensitivity_per_partition=1.0, max_partitions=max_partitions, sensitivity=float(max_partitions),
        epsilon=share.epsilon, delta=share.delta, rho=None, scale=None, grid=None,
        note=(f"each partition's keep decision is (epsilon / C_u = {share.epsilon / max_partitions:.6g}, "
              f"d = {per_partition_delta(share.delta, max_partitions):.3g})-DP in its count of units; a unit in "
              f"<= {max_partitions} partitions: (epsilon, 1 - (1 - d)^C_u <= delta)"),
    )
    return Selection(
        "truncated-geometric",
        keep,
        None,
        None,
        "each partition kept with the near-optimal probability p(n) of its unit count "
        "(truncated geometric, Desfontaines et al. 2022)",
        (record,),
    )


def _round_record(strategy: str, k: int, rnd: dict, share: Share, max_partitions: int) -> MechanismRecord:
    fraction = rnd["rho"] / (share.rho or selection_rho(share))
    name = {"weighted_gaussian": "weighted histogram", "mad": f"MAD round {k} weighted histogram",
            "mad_damped": f"damped MAD round {k} weighted histogram"}[strategy]
    return MechanismRecord(
        target=f"partition selection: {name}", mechanism="discrete Gaussian + threshold",
        sensitivity_per_partition=1.0, max_partitions=max_partitions, sensitivity=1.0,
        epsilon=share.epsilon * fraction, delta=share.delta * fraction, rho=rnd["rho"],
        scale=rnd["sigma"] / WEIGHT_ONE, grid=1.0 / WEIGHT_ONE,
        note=(f"each unit spreads L2 weight <= 1 over its <= {max_partitions} kept partitions; released when the "
              f"noisy weight >= {rnd['threshold'] / WEIGHT_ONE:.6g}; a partition of one unit alone shows with "
              f"probability <= {rnd['delta_new']:.3g}; the round's epsilon and delta are its slice of the "
              "selection's share (rho adds up)"),
    )


def _weights(rows, column: str) -> np.ndarray:
    if rows is None or column not in rows.columns:
        raise RuntimeError(f"the weighted selections need the plan's {column} column (run them through dp_core.execute)")
    return rows[column].to_numpy(dtype=np.int64)


def select_weighted_gaussian(n_units: np.ndarray, share: Share, max_partitions: int, confidence: float = 0.95, *,
                             rows=None, query=None, **_context) -> Selection:
    """Weighted Gaussian (Gopi et al. 2020): noisy weighted histogram `_w1` kept when >= T."""
    (rnd,) = selection_rounds("weighted_gaussian", share, max_partitions, query.epsilon)
    weights = _weights(rows, "_w1")
    keep = noisy_pass(weights, rnd)
    return Selection(
        "weighted_gaussian", keep, None, rnd["threshold"] / WEIGHT_ONE,
        f"noisy weighted count of units (each unit weighs 1/sqrt(its kept partitions), L2 sensitivity 1; discrete "
        f"Gaussian sigma {rnd['sigma'] / WEIGHT_ONE:.4g}) >= threshold {rnd['threshold'] / WEIGHT_ONE:.6g} "
        "(weighted Gaussian, Gopi et al. 2020)",
        (_round_record("weighted_gaussian", 1, rnd, share, max_partitions),),
    )


def select_mad(n_units: np.ndarray, share: Share, max_partitions: int, confidence: float = 0.95, *,
               rows=None, query=None, **_context) -> Selection:
    """MaxAdaptiveDegree, two rounds (Chen et al. 2025): round 1 was drawn when the plan ran
    (`_mad_r1`); round 2 adds noise to the rerouted weights `_w2` of the partitions left."""
    rounds = selection_rounds("mad", share, max_partitions, query.epsilon)
    if rows is None or "_mad_r1" not in rows.columns:
        raise RuntimeError("selection 'mad' needs its first round, drawn while the plan runs (dp_core.execute)")
    first = rows["_mad_r1"].to_numpy(dtype=bool)
    weights = _weights(rows, "_w2")
    second = noisy_pass(weights, rounds[1])
    keep = first | second
    return Selection(
        "mad", keep, None, rounds[1]["threshold"] / WEIGHT_ONE,
        f"MaxAdaptiveDegree, two rounds (Chen et al. 2025): round 1 weighted Gaussian with {rounds[0]['rho'] / share.rho:.0%} "
        f"of the selection's rho released {int(first.sum())} partitions; round 2 moved each unit's weight off those "
        f"onto its other kept partitions and released {int((second & ~first).sum())} more "
        f"(thresholds {rounds[0]['threshold'] / WEIGHT_ONE:.6g} and {rounds[1]['threshold'] / WEIGHT_ONE:.6g})",
        tuple(_round_record("mad", k, rnd, share, max_partitions) for k, rnd in enumerate(rounds, start=1)),
    )


def select_mad_damped(n_units: np.ndarray, share: Share, max_partitions: int, confidence: float = 0.95, *,
                      rows=None, query=None, **_context) -> Selection:
    """MaxAdaptiveDegree, damped (selection_damped.py): round 1 and its damping were drawn when the plan
    ran (`_mad_r1`, and the damped partitions' lower weights in `_w2`); round 2 adds noise to `_w2`."""
    rounds = damped_rounds(share, max_partitions)
    if rows is None or "_mad_r1" not in rows.columns:
        raise RuntimeError("selection 'mad_damped' needs its first round, drawn while the plan runs (dp_core.execute)")
    first = rows["_mad_r1"].to_numpy(dtype=bool)
    second = noisy_pass(_weights(rows, "_w2"), rounds[1])
    return Selection(
        "mad_damped", first | second, None, rounds[1]["threshold"] / WEIGHT_ONE,
        f"MaxAdaptiveDegree, damped (two rounds): round 1 weighted Gaussian with {rounds[0]['rho'] / selection_rho(share):.0%} "
        f"of the selection's rho released {int(first.sum())} partitions and marked those it saw above "
        f"{rounds[0]['damping_cut'] / WEIGHT_ONE:.6g} as damped; round 2 moved each unit's weight off the released ones, "
        f"gave a damped one half an undamped one's, and released {int((second & ~first).sum())} more "
        f"(thresholds {rounds[0]['threshold'] / WEIGHT_ONE:.6g} and {rounds[1]['threshold'] / WEIGHT_ONE:.6g})",
        tuple(_round_record("mad_damped", k, rnd, share, max_partitions) for k, rnd in enumerate(rounds, start=1)),
    )


STRATEGIES = {
    "laplace-threshold": select_laplace_threshold,
    "truncated-geometric": select_truncated_geometric,
    "weighted_gaussian": select_weighted_gaussian,
    "mad": select_mad,
    "mad_damped": select_mad_damped,
}


def _gaussian_selection_note(budget) -> str:
    share = budget.selection_share
    return (
        f"Partition selection ({budget.selection}) is a Gaussian mechanism on a weighted count of units: its "
        f"({share.epsilon:.6g}, {share.delta:.3g}) share is rho = {share.rho:.6g} (zCDP; from epsilon and half the delta, "
        "pooled with the Gaussian aggregates when there are any) plus the threshold's failure probability (the other "
        "half of the delta, times e^-epsilon)."
    )


def _damped_selection_note(budget) -> str:
    share = budget.selection_share
    return (
        f"Partition selection (mad_damped) is a Gaussian mechanism on a weighted count of units: its "
        f"({share.epsilon:.6g}, {share.delta:.3g}) share is rho = {selection_rho(share):.6g} (zCDP; from epsilon and half "
        "the delta, its own, not pooled with the aggregates) plus the threshold's failure probability (the other half of "
        "the delta, times e^-epsilon of the selection)."
    )


SELECTION_NOTES = {"weighted_gaussian": _gaussian_selection_note, "mad": _gaussian_selection_note,
                   "mad_damped": _damped_selection_note}
