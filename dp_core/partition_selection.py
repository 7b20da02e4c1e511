"""Private partition selection: which groups of the data may appear in the release.

A partition that exists only because of one unit must appear with probability at most delta
(over all of that unit's <= C_u partitions together). Strategies share one interface so that new
ones (weighted or policy Gaussian, Gopi et al. ICML 2020) can be added; each needs only the number
of distinct units per partition, after contribution bounding. Derivations: dp-engine.md,
"Partition selection".
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .accounting import Share
from .noise import secure_uniform
from .release import NoisyStatistic, add_noise


def per_partition_delta(delta: float, max_partitions: int) -> float:
    """d = 1 - (1 - delta)^(1/C_u), computed as -expm1(log1p(-delta) / C_u) to keep its digits."""
    return -math.expm1(math.log1p(-delta) / max_partitions)


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
    q^(T-1) / (1 + q), q = exp(-eps / C_u). T is the smallest integer with that <= d.
    """
    scale = max_partitions / epsilon
    q = math.exp(-1.0 / scale)
    d = per_partition_delta(delta, max_partitions)
    m = max(math.ceil(math.log(d * (1.0 + q)) / math.log(q) - 1e-9), 1)
    while q**m / (1.0 + q) > d:  # guard against float rounding
        m += 1
    return 1 + m


def truncated_geometric_keep_probability(n: np.ndarray, epsilon: float, delta: float, max_partitions: int) -> np.ndarray:
    """Keep probability p(n) of the near-optimal selection (Desfontaines, Voss, Gipson, Mandayam,
    PoPETs 2022, arXiv 2006.03684), with e = eps/C_u and d = 1 - (1 - delta)^(1/C_u):

        p(n) = d (exp(n e) - 1) / (exp(e) - 1)                              n <= n1
        p(n) = p(n1) - (1 - p(n1) + d / (exp(e) - 1)) (exp(-(n - n1) e) - 1) n > n1
        n1 = 1 + floor(ln(1 + tanh(e/2) (1/d - 1)) / e),   p = min(p, 1), p(0) = 0.
    """
    n = np.asarray(n, dtype=np.float64)
    e = epsilon / max_partitions
    d = per_partition_delta(delta, max_partitions)
    em1 = math.expm1(e)
    n1 = 1.0 + math.floor(math.log1p(math.tanh(e / 2.0) * (1.0 / d - 1.0)) / e)
    p_n1 = d * math.expm1(n1 * e) / em1
    low = d * np.expm1(np.minimum(n, n1) * e) / em1
    high = p_n1 - (1.0 - p_n1 + d / em1) * np.expm1(-(n - n1) * e)
    p = np.where(n <= n1, low, high)
    return np.clip(np.where(n <= 0, 0.0, p), 0.0, 1.0)


@dataclass(frozen=True)
class Selection:
    """What a strategy decided: which partitions to keep, and the noisy unit counts it drew (the
    Laplace threshold's counts may be released as COUNT(DISTINCT unit); other strategies: None)."""

    strategy: str
    keep: np.ndarray
    noisy_units: NoisyStatistic | None
    threshold: float | None
    description: str


def select_laplace_threshold(n_units: np.ndarray, share: Share, max_partitions: int, confidence: float = 0.95) -> Selection:
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


def select_truncated_geometric(n_units: np.ndarray, share: Share, max_partitions: int, confidence: float = 0.95) -> Selection:
    """Keep each partition independently with probability p(n) (CSPRNG uniforms)."""
    p = truncated_geometric_keep_probability(n_units, share.epsilon, share.delta, max_partitions)
    keep = secure_uniform(n_units.size) <= p
    # secure_uniform is on (0, 1]: a uniform equal to 1 keeps only when p == 1, so p(n) is exact
    return Selection(
        "truncated-geometric",
        keep,
        None,
        None,
        "each partition kept with the near-optimal probability p(n) of its unit count "
        "(truncated geometric, Desfontaines et al. 2022)",
    )


STRATEGIES = {
    "laplace-threshold": select_laplace_threshold,
    "truncated-geometric": select_truncated_geometric,
}
