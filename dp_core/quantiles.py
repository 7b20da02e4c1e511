"""DP quantiles (MIN, MAX, MEDIAN, NTILE) by the exponential mechanism over a fine histogram.

Each unit contributes one value per partition (chosen at random in SQL), clamped to [L, U] and
placed in one of B equal bins. Bin j holds the ranks [C_(j-1), C_j] (C_j = values in bins <= j,
n = all values); its utility is minus the distance from the target rank q n to that range,
u_j = -max(C_(j-1) - q n, q n - C_j, 0), so a bin holding the quantile (even as a repeated value)
scores 0. Removing one unit's value moves C_(j-1), C_j by 0 or 1 and q n by q; each of the three
terms then moves by at most max(q, 1 - q), the utility's sensitivity. The exponential
mechanism (McSherry-Talwar 2007; Smith 2011 for quantiles) picks bin j with probability
proportional to exp(eps_p u_j / (2 max(q, 1-q))) (equal widths), then a uniform point in it.
A unit is in at most C_u partitions, so each partition uses eps_p = eps / C_u. No confidence
interval is given (the mechanism has no simple one). Sampling uses CSPRNG uniforms on float64
probabilities (the float exponential mechanism; Ilvento, CCS 2020, discusses exact variants).
"""

from __future__ import annotations

import numpy as np

from .accounting import Share
from .noise import secure_uniform
from .release import MechanismRecord


def _present(m) -> bool:
    """A partition's {bin: count} map holds counts (None or pandas NA: a partition with no rows,
    e.g. a public partition absent from the data)."""
    try:
        return bool(m)
    except TypeError:  # pandas NA is neither true nor false
        return False


def dense_histograms(maps: list, bins: int) -> np.ndarray:
    """Per-partition {bin: count} maps (None when empty) to a dense (P, bins) count matrix."""
    out = np.zeros((len(maps), bins), dtype=np.float64)
    for row, m in enumerate(maps):
        if _present(m):
            items = m.items() if isinstance(m, dict) else m if isinstance(m, list) else zip(m["key"], m["value"])
            for b, c in items:
                out[row, int(b)] += c
    return out


def exponential_quantile(
    counts: np.ndarray,
    q: float,
    lower: float,
    upper: float,
    *,
    target: str,
    share: Share,
    max_partitions: int,
) -> tuple[np.ndarray, MechanismRecord]:
    """One DP q-quantile per row of `counts` (shape (P, B) histogram over [lower, upper])."""
    parts, bins = counts.shape
    cum = np.cumsum(counts, axis=1)
    before = cum - counts
    rank = q * cum[:, -1:]
    sens = max(q, 1.0 - q)
    eps_p = share.epsilon / max_partitions
    distance = np.maximum(np.maximum(before - rank, rank - cum), 0.0)
    log_w = -eps_p * distance / (2.0 * sens)
    log_w -= log_w.max(axis=1, keepdims=True)
    w = np.exp(log_w)
    cdf = np.cumsum(w, axis=1)
    cdf /= cdf[:, -1:]
    u = secure_uniform(parts)
    chosen = np.minimum((cdf < u[:, None]).sum(axis=1), bins - 1)
    width = (upper - lower) / bins
    values = lower + (chosen + secure_uniform(parts) * (1.0 - 1e-12)) * width
    record = MechanismRecord(
        target=target,
        mechanism="exponential mechanism (quantile)",
        sensitivity_per_partition=sens,
        max_partitions=max_partitions,
        sensitivity=sens * max_partitions,
        epsilon=share.epsilon,
        delta=0.0,
        rho=None,
        scale=None,
        grid=width,
        note=f"{bins} bins over [{lower}, {upper}]; output uniform within the chosen bin; no CI",
    )
    return np.clip(values, lower, upper), record
