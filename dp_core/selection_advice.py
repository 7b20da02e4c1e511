"""Which partition selection to use next time: expected releases of each mechanism at this budget.

Computed from the *released, noisy* numbers only (post-processing: no privacy cost, fit for the
public note): for every released partition an estimate n of its distinct units (a released
COUNT(DISTINCT unit), else the Laplace selection's noisy count, else a released COUNT(*) divided
by its per-unit row bound, a lower bound), then the probability that each mechanism would release
a partition of n units with this query's selection share (epsilon, delta) and C_u:

  laplace-threshold   P[n + K >= T], K discrete Laplace of scale C_u / eps (partition_selection.py)
  truncated-geometric p(n) (Desfontaines et al. 2022)
  weighted_gaussian   P[w + Z >= T], w = n / sqrt(C_u) (every unit at the full C_u partitions: a
                      lower bound; units in fewer partitions weigh more), Z the round's Gaussian
  mad                 not predictable from counts (round 2 depends on which partitions the units
                      share); on skewed data it releases more than weighted Gaussian (bench/engine.py)

The sums cover the partitions released now only: partitions that were not released leave no noisy
number to work from, and the mechanisms differ most on those, so read the figures as a ranking.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from .accounting import Share, rho_from_eps_delta_tight
from .normal_law import normal_sf
from .partition_selection import discrete_laplace_threshold, truncated_geometric_keep_probability
from .selection_weighted import WEIGHT_ONE, selection_rounds


def estimated_units(query, table: pd.DataFrame, selection) -> np.ndarray | None:
    """Noisy distinct units per released partition (None when no released number gives them)."""
    for agg in query.aggregates:
        if agg.kind == "count_units":
            return table[agg.label].to_numpy(dtype=np.float64)
    if selection is not None and selection.noisy_units is not None:
        return None  # (reused as the count_units column above when released)
    for agg in query.aggregates:
        if agg.kind == "count" and agg.column is None and agg.upper:
            return table[agg.label].to_numpy(dtype=np.float64) / float(agg.upper)
    return None


def expected_releases(n: np.ndarray, share: Share, max_partitions: int, epsilon_query: float) -> dict[str, float]:
    """Expected number of these partitions (n units each) each mechanism would release."""
    n = np.clip(np.asarray(n, dtype=np.float64), 0.0, None)
    eps, delta, cu = share.epsilon, share.delta, max_partitions
    t = discrete_laplace_threshold(eps, delta, cu)
    q = math.exp(-eps / cu)
    gap = t - np.round(n)  # P(n + K >= T) for the discrete Laplace K
    p_lap = np.where(gap <= 0, 1 - q ** (1 - gap) / (1 + q), q ** np.maximum(gap, 0) / (1 + q))
    gauss = Share(share.part, eps, delta, rho_from_eps_delta_tight(eps, delta / 2.0))
    (rnd,) = selection_rounds("weighted_gaussian", gauss, cu, epsilon_query)
    weight = n / math.sqrt(cu) * WEIGHT_ONE
    return {
        "laplace-threshold": float(p_lap.sum()),
        "truncated-geometric": float(truncated_geometric_keep_probability(n, eps, delta, cu).sum()),
        "weighted_gaussian": float(normal_sf((rnd["threshold"] - weight) / rnd["sigma"]).sum()),
    }


def selection_advice(query, budget, table: pd.DataFrame, selection) -> tuple[str, ...]:
    """A note for the release: expected partitions per mechanism at this selection budget."""
    if selection is None or budget.selection_share is None or not len(table):
        return ()
    n = estimated_units(query, table, selection)
    if n is None:
        return (("Selection advice: add COUNT(DISTINCT unit) or COUNT(*) to the query to see how many groups each "
                "partition selection would release at this budget."),)
    expected = expected_releases(n, budget.selection_share, query.effective_max_partitions, query.epsilon)
    listed = ", ".join(f"{name} {value:,.0f}" for name, value in expected.items())
    return (
        (f"Selection advice (from the released noisy counts, no extra privacy cost): of the {len(table):,} groups "
        f"released by {budget.selection}, the expected number each mechanism would release at this budget is "
        f"{listed}; mad (MaxAdaptiveDegree) releases at least about as many as weighted_gaussian when units share "
        "popular groups. Groups not released leave no number to judge from, so this ranks the mechanisms; it "
        "does not count the extra groups the better ones would find."),
    )
