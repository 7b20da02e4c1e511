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


@dataclass(frozen=True)
class Calibration:
    """The noise of one statistic, from public parameters only: what `add_noise` draws and the
    half-width of the interval it reports (the chooser of epsilon and the accuracy preview call
    this too, so a promised interval and a reported one are one computation)."""

    grid: float  # g, the noise grid step in the statistic's units
    shift: int  # log2(g / quantum)
    steps: int  # D in grid steps, ceil(D / g)
    scale_steps: float  # Laplace t or Gaussian sigma, in grid steps
    scale: float  # the same in the statistic's units
    halfwidth: float  # the confidence interval's half-width, in the statistic's units
    sd: float  # the noise's standard deviation, in the statistic's units
    mechanism: str
    sensitivity: float  # L1 (Laplace) or L2 (Gaussian) over all partitions
    nominal: float  # the continuous scale before grid rounding (C_u D / eps, or sqrt(C_u) D / sqrt(2 rho))


def calibrate(*, quantum: float, sensitivity_quanta: int, max_partitions: int, share: Share, noise: str,
              confidence: float) -> Calibration:
    """The grid, scale and interval half-width of `add_noise` for these public parameters (see
    `add_noise` for the derivation). Reads no data; raises nothing (`add_noise` checks the limits):
    noise over MAX_SCALE_PER_SENSITIVITY gets an infinite scale and half-width."""
    sensitivity = sensitivity_quanta * quantum
    alpha = 1.0 - confidence
    budget = share.rho if noise == "gaussian" else share.epsilon
    if not budget or budget <= 0:  # a share that underflowed to 0: infinite noise, refused by add_noise
        nominal = math.inf
    elif noise == "gaussian":
        nominal = math.sqrt(max_partitions) * sensitivity / math.sqrt(2.0 * share.rho)
    else:
        nominal = max_partitions * sensitivity / share.epsilon
    grid = max(real_grid(min(nominal, sensitivity)), quantum)
    shift = round(math.log2(grid / quantum))
    steps = -(-sensitivity_quanta >> shift)  # ceil(D / 2^shift)
    if nominal > MAX_SCALE_PER_SENSITIVITY * sensitivity:  # pure noise (refused): no float of it is computed
        l_sensitivity = (math.sqrt(max_partitions) if noise == "gaussian" else max_partitions) * sensitivity
        return Calibration(grid, shift, steps, math.inf, math.inf, math.inf, math.inf,
                           "discrete Gaussian" if noise == "gaussian" else "discrete Laplace", l_sensitivity, nominal)
    if noise == "gaussian":
        sigma = math.sqrt(max_partitions) * steps / math.sqrt(2.0 * share.rho)
        half_steps = discrete_gaussian_halfwidth(sigma, alpha)
        scale = sigma * grid
        sd = scale  # the discrete Gaussian's variance is at most sigma^2 (CKS 2020)
        return Calibration(grid, shift, steps, sigma, scale, half_steps * grid, sd, "discrete Gaussian",
                           math.sqrt(max_partitions) * sensitivity, nominal)
    t = max_partitions * steps / share.epsilon
    half_steps = discrete_laplace_halfwidth(t, alpha)
    q = math.exp(-1.0 / t)
    sd = math.sqrt(2.0 * q) / (1.0 - q) * grid  # Var K = 2q / (1 - q)^2
    return Calibration(grid, shift, steps, t, t * grid, half_steps * grid, sd, "discrete Laplace",
                       max_partitions * sensitivity, nominal)


def grid_steps(exact_quanta: np.ndarray, shift: int) -> np.ndarray:
    """The exact values (integers in quanta) rounded to the nearest step of a grid 2^shift quanta wide,
    half up: floor(x / 2^shift + 1/2), in integer arithmetic (an arithmetic shift floors toward minus
    infinity), so no float rounding moves a value by a step."""
    return exact_quanta if shift == 0 else (exact_quanta + (1 << (shift - 1))) >> shift


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
    cal = calibrate(quantum=quantum, sensitivity_quanta=sensitivity_quanta, max_partitions=max_partitions,
                    share=share, noise=noise, confidence=confidence)
    grid, shift, nominal = cal.grid, cal.shift, cal.nominal
    units = grid_steps(exact_quanta, shift)
    if units.size and np.abs(units).max() >= 2**52:  # draws stay below 80 t < 2^19 steps
        raise DPError(f"{target}: the exact value is too large for its noise grid (over 2^52 steps)")
    if nominal > MAX_SCALE_PER_SENSITIVITY * sensitivity:
        raise DPError(
            f"{target}: epsilon is too small for its sensitivity (noise {nominal:.3g} is over 2^20 times "
            "the sensitivity): the result would be pure noise; raise epsilon or lower max_partitions_contributed"
        )
    if noise == "gaussian":
        # the exact variance C_u steps^2 / (2 rho): the sampler rounds it up, never down
        draws = discrete_gaussian(cal.scale_steps, units.size,
                                  variance=Fraction(max_partitions * cal.steps * cal.steps) / (2 * Fraction(share.rho)))
    else:
        draws = discrete_laplace(Fraction(max_partitions * cal.steps) / Fraction(share.epsilon), units.size)  # exact t
    scale, sd, mechanism, l_sens = cal.scale, cal.sd, cal.mechanism, cal.sensitivity
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
    return NoisyStatistic(values, cal.halfwidth, scale, sd, record)
