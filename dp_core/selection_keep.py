"""The share of groups a release keeps, as a function of a group's size: the probability that
partition selection releases a group of n people (after contribution bounding), before any data is
read (the accuracy preview's "which groups will appear").

Laplace threshold (partition_selection.select_laplace_threshold): the noisy count n + K is kept
when n + K >= T, K discrete Laplace with q = exp(-eps / C_u), P(K = k) = (1 - q) / (1 + q) q^|k|.
Summing the geometric tail, P(K >= k) = q^k / (1 + q) for k >= 1, and P(K >= k) = 1 - q^(1 - k) /
(1 + q) for k <= 0 (symmetry); so p(n) = P(K >= T - n). Truncated geometric: p(n) is the
mechanism's own keep probability (partition_selection.truncated_geometric_keep_probability).
The weighted strategies (weighted Gaussian, MaxAdaptiveDegree) keep a group by its per-person
weights, which depend on the data: no data-free curve. Public partitions are all released.
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np

from .accounting import plan_budget
from .partition_selection import discrete_laplace_threshold, truncated_geometric_keep_probability

#: the strategies whose keep probability depends on the group's size alone
SIZE_ONLY = ("laplace-threshold", "truncated-geometric")


def laplace_threshold_keep_probability(n: np.ndarray, epsilon: float, delta: float, max_partitions: int) -> np.ndarray:
    """P(n + K >= T) for the discrete Laplace threshold of `epsilon`, `delta` and C_u (derivation above)."""
    n = np.asarray(n, dtype=np.float64)
    q = math.exp(-epsilon / max_partitions)
    k = discrete_laplace_threshold(epsilon, delta, max_partitions) - n  # K must reach T - n
    upper = np.power(q, np.maximum(k, 1.0)) / (1.0 + q)
    lower = 1.0 - np.power(q, np.maximum(1.0 - k, 1.0)) / (1.0 + q)
    return np.where(n <= 0, 0.0, np.where(k >= 1, upper, lower))


def keep_probability(query, epsilon: float, sizes) -> tuple[str | None, np.ndarray | None, str]:
    """(strategy, p(n) for each size in `sizes`, a note) of `query` released at total `epsilon`:
    the probability a group of n people appears. None for p when it depends on more than n."""
    budget = plan_budget(replace(query, epsilon=float(epsilon)))
    sizes = np.asarray(sizes, dtype=np.float64)
    if budget.selection is None:
        return None, np.ones_like(sizes), "every group is released (public groups, or no GROUP BY)"
    share, cu = budget.selection_share, query.effective_max_partitions
    if budget.selection == "laplace-threshold":
        return budget.selection, laplace_threshold_keep_probability(sizes, share.epsilon, share.delta, cu), (
            f"kept when the noisy count of people reaches the threshold "
            f"{discrete_laplace_threshold(share.epsilon, share.delta, cu)}")
    if budget.selection == "truncated-geometric":
        return budget.selection, truncated_geometric_keep_probability(sizes, share.epsilon, share.delta, cu), (
            "each group kept with the near-optimal probability p(n) of its size")
    return budget.selection, None, "depends on each person's weights in the data: no curve before the release"
