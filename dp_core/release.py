"""The one place where noise is added to released numbers, and the record of how.

Every noisy statistic (and the selection count) goes through `add_noise`, which returns the noisy
values, their confidence half-widths and a `MechanismRecord` stating the mechanism, the
sensitivity, the scale and the budget share: the release's explanation is built while computing.
Derivations: dp-engine.md ("Sensitivities and noise scales"), docs/noise.md.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from fractions import Fraction

import numpy as np

from .accounting import Share
from .errors import DPError
from .noise import (
    discrete_gaussian,
    discrete_gaussian_halfwidth,
    discrete_laplace,
    discrete_laplace_halfwidth,
    real_grid,
)

#: the largest noise scale per unit of sensitivity: with at most 2^13 grid steps per unit of
#: sensitivity, the scale stays below 2^33 steps, inside the exact samplers' int64 range
#: (docs/noise.md). Beyond it the output would be pure noise anyway.
MAX_SCALE_PER_SENSITIVITY = float(2**20)


@dataclass(frozen=True)
class MechanismRecord:
    """How one released statistic was protected (public: derived from public parameters only)."""

    target: str
    mechanism: str
    sensitivity_per_partition: float
    max_partitions: int
    sensitivity: float  # L1 (Laplace, selection, EM) or L2 (Gaussian) over all partitions
    epsilon: float
    delta: float
    rho: float | None
    scale: float | None  # Laplace b or Gaussian sigma in the statistic's units
    grid: float | None
    note: str = ""

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class NoisyStatistic:
    """Noisy values per partition, the confidence half-widths and the mechanism record."""

    values: np.ndarray
    halfwidth: float
    scale: float
    sd: float  # standard deviation of the noise, in the statistic's units
    record: MechanismRecord


def add_noise(
    exact_quanta: np.ndarray,
    *,
    target: str,
    quantum: float,
    sensitivity_quanta: int,
    max_partitions: int,
    share: Share,
    noise: str,
    confidence: float,
) -> NoisyStatistic:
    """Release one exact value per partition, given as integers in units of `quantum`.

    sensitivity_quanta: D in quanta, how much one unit can change one partition's value; a unit
    touches at most `max_partitions` (C_u) partitions. Laplace: L1 sensitivity C_u D, scale
    C_u D / eps. Gaussian: L2 sensitivity sqrt(C_u) D, sigma = sqrt(C_u) D / sqrt(2 rho) (rho-zCDP).
    The grid is a power of two, g = 2^(ceil(log2 min(scale, D)) - 12) and never finer than the
    quantum (so integer statistics stay on integers): it depends on public parameters only, and is
    fine against both the noise and the sensitivity (a coarse grid would round D up to one whole
    step). The exact value is rounded to the grid in integer arithmetic (floor(x / g + 1/2)),
    which turns D into ceil(D / g) grid steps.
    """
    exact_quanta = np.asarray(exact_quanta, dtype=np.int64)
    sensitivity = sensitivity_quanta * quantum
    alpha = 1.0 - confidence
    if noise == "gaussian":
        nominal = math.sqrt(max_partitions) * sensitivity / math.sqrt(2.0 * share.rho)
    else:
        nominal = max_partitions * sensitivity / share.epsilon
    grid = max(real_grid(min(nominal, sensitivity)), quantum)
    shift = round(math.log2(grid / quantum))
    steps = -(-sensitivity_quanta >> shift)  # ceil(D / 2^shift)
    units = exact_quanta if shift == 0 else (exact_quanta + (1 << (shift - 1))) >> shift
    if units.size and np.abs(units).max() >= 2**52:  # draws stay below 80 t < 2^19 steps
        raise DPError(f"{target}: the exact value is too large for its noise grid (over 2^52 steps)")
    if nominal > MAX_SCALE_PER_SENSITIVITY * sensitivity:
        raise DPError(
            f"{target}: epsilon is too small for its sensitivity (noise {nominal:.3g} is over 2^20 times "
            "the sensitivity): the result would be pure noise; raise epsilon or lower max_partitions_contributed"
        )
    if noise == "gaussian":
        sigma = math.sqrt(max_partitions) * steps / math.sqrt(2.0 * share.rho)
        # the exact variance C_u steps^2 / (2 rho): the sampler rounds it up, never down
        draws = discrete_gaussian(sigma, units.size,
                                  variance=Fraction(max_partitions * steps * steps) / (2 * Fraction(share.rho)))
        half_steps = discrete_gaussian_halfwidth(sigma, alpha)
        scale = sigma * grid
        sd = scale  # the discrete Gaussian's variance is at most sigma^2 (CKS 2020)
        mechanism, l_sens = "discrete Gaussian", math.sqrt(max_partitions) * sensitivity
    else:
        t = max_partitions * steps / share.epsilon
        draws = discrete_laplace(Fraction(max_partitions * steps) / Fraction(share.epsilon), units.size)  # exact t
        half_steps = discrete_laplace_halfwidth(t, alpha)
        scale = t * grid
        q = math.exp(-1.0 / t)
        sd = math.sqrt(2.0 * q) / (1.0 - q) * grid  # Var K = 2q / (1 - q)^2
        mechanism, l_sens = "discrete Laplace", max_partitions * sensitivity
    values = (units.astype(np.float64) + draws) * grid
    record = MechanismRecord(
        target=target,
        mechanism=mechanism,
        sensitivity_per_partition=float(sensitivity),
        max_partitions=max_partitions,
        sensitivity=float(l_sens),
        epsilon=share.epsilon,
        delta=share.delta,
        rho=share.rho,
        scale=scale,
        grid=grid,
    )
    return NoisyStatistic(values, half_steps * grid, scale, sd, record)
