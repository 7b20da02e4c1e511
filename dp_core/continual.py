"""Running totals over a horizon of T periods: the binary-tree mechanism for continual counting.

A series publishes, each period t = 1..T, the period's value x_t and every prefix total
S_s = x_1 + ... + x_s (year to date), per group. Summing the periods' own noisy releases gives S_t
noise that grows like t; releasing S_t afresh each period spends budget every period. The tree
(Dwork, Naor, Pitassi, Rothblum, STOC 2010; Chan, Shi, Song, TISSEC 2011) adds noise to dyadic
blocks instead: node (h, e) is the sum of the 2^h periods ending at period e (e a multiple of
2^h), h = 0..m-1 with m = bit_length(T) levels (the blocks a prefix <= T can need). Node (h, e) is
completed, and its noise drawn, at period e: once, from the engine's discrete Gaussian (the OS
CSPRNG), then kept and reused; a node's noise is never drawn again (`TreeNoise.extend` draws
only the nodes not drawn yet).
S_t is the sum of popcount(t) nodes (t's binary digits), so an earlier total never changes, and
the period value x_t is the leaf node (0, t).

User-level sensitivity. Each unit contributes at most B (per_period) to one period's value of one
group, in at most k periods of the horizon (`periods`) and at most C_u groups (`max_groups`), so
its contribution vector c over the periods of one group has c_t in [-B, B], at most k non-zero:
||c||_1 <= k B = B_total. At level h the blocks are disjoint, so the level's node changes by a
vector of L1 norm <= B_total whose entries are each at most c_h = min(2^h, k) B (a block holds
2^h periods) over N_h = floor(T / 2^h) blocks; the largest sum of squares under those constraints
fills floor(B_total / c_h) blocks (at most N_h) and puts the rest r in one more, and is at most
B_total c_h (v^2 <= c_h v). Over the m levels and C_u groups (the discrete Gaussian is calibrated
to L2, zCDP; `l2_sensitivity_squared`, reached by a unit in the first k periods):

    Delta_2^2 = C_u * sum_{h < m} (min(floor(B_total / c_h), N_h) c_h^2 + r_h^2)
             <= C_u * B_total * sum_{h < m} min(2^h, k) B                   (L1: C_u m B_total)

(k = 1: Delta_2^2 = m C_u B^2; k = T = 12, C_u = 1: 148 B^2, levels 0..3 giving 12 + 24 + 48 + 64.)
Every node gets noise N_Z(0, sigma^2), sigma^2 = Delta_2^2 / (2 rho): the whole horizon is
rho-zCDP, charged once. S_t's noise is the sum of popcount(t) independent node noises: its variance
is exactly popcount(t) Var(N_Z(0, sigma^2)) (`prefix_variance`), and its interval is read from the
exact law of that sum (the node law convolved popcount(t) times, `sum_halfwidth`).

When the tree wins, and against what (docs/continual-release.md has the numbers). The naive
running total sums the periods' own releases. Charged to the series one by one at rho / T each
(the platform's monthly releases under one series cap), month t has sigma_n^2 = C_u B^2 T / (2 rho)
and S_t the variance t sigma_n^2: at t = T, T^2 C_u B^2 / (2 rho). The tree's S_T has variance
popcount(T) Delta_2^2 / (2 rho) (times the discrete law's factor below 1). With k = 1 (a unit
counts in one period: COUNT(DISTINCT unit) year to date, where a unit counts in the period it first
appears; new registrations) Delta_2^2 = m C_u B^2 and at T = 12 the tree's standard deviation is
sqrt(2 * 4 / 144) = 24% of the naive one's (its 95% interval 23% at epsilon 1, delta 1e-6). With
the same people counted in every period (k = T), S_T's own sensitivity is T B and no mechanism
beats the naive sum there: the tree's Delta_2^2 = 148 B^2 at T = 12 makes its S_12 interval
sqrt(2 * 148 / 144) = 143% of the naive one. A naive release that knows the horizon bound k
(all T period values as one Gaussian release of L2 sensitivity sqrt(C_u k) B)
gives S_T the variance T k C_u B^2 / (2 rho): against it the tree's S_T interval is
sqrt(popcount(T) m / T) as wide at k = 1 (82% at T = 12, 56% at T = 16), and at T = 12 it loses
from k = 2 on (108%). The 40% target is met at k = 1 against the naive sum charged rho / T a month,
from month 4 on (months 1-3: 58%, 41%, 47%; month 12: 23%).

Not used here: the matrix-mechanism square-root factorisation (Fichtenberger, Henzinger,
Upadhyay, ICML 2023) releases C x + z with C = A^(1/2), whose entries are not integers; with the
engine's lattice noise the release would reveal C x mod 1 exactly, so it needs continuous noise,
which the engine does not draw (Mironov, CCS 2012). Honaker's variance reduction (2015) needs
nodes that complete after period t and would revise published totals; not done.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from fractions import Fraction

import numpy as np

from .errors import DPError
from .noise import discrete_gaussian, discrete_gaussian_halfwidth, gaussian_parameters, real_grid
from .normal_law import normal_isf
from .release import grid_steps

#: the largest horizon: 2^12 periods (a node id and the exact law's convolutions stay small)
MAX_HORIZON = 4096


# ---------------------------------------------------------------------------------------------
# the tree's shape: public, from T only
# ---------------------------------------------------------------------------------------------


def levels(horizon: int) -> int:
    """m = bit_length(T): the levels h with 2^h <= T, the only ones a prefix total t <= T uses."""
    return int(horizon).bit_length()


def nodes_completed_at(period: int, horizon: int) -> list[tuple[int, int]]:
    """The nodes (h, e) whose block of 2^h periods ends at `period` (h up to its trailing zeros)."""
    low = (period & -period).bit_length() - 1  # 2^low divides the period
    return [(h, period) for h in range(min(low, levels(horizon) - 1) + 1)]


def prefix_nodes(period: int) -> list[tuple[int, int]]:
    """The nodes whose sum is S_t: one per binary digit 1 of t, the largest block first."""
    out, end = [], 0
    for h in range(int(period).bit_length() - 1, -1, -1):
        if period >> h & 1:
            end += 1 << h
            out.append((h, end))
    return out


def all_nodes(horizon: int) -> list[tuple[int, int]]:
    """Every node of a horizon, in the order they complete (period, then level)."""
    return [node for t in range(1, horizon + 1) for node in nodes_completed_at(t, horizon)]


# ---------------------------------------------------------------------------------------------
# calibration: public parameters only
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ContributionBound:
    """What one unit may contribute over the whole horizon, per group: at most `per_period` (B, in
    the statistic's units) to one period, in at most `periods` (k) periods, in at most
    `max_groups` (C_u) groups."""

    per_period: float
    periods: int
    max_groups: int = 1

    def check(self, horizon: int) -> None:
        if not (math.isfinite(self.per_period) and self.per_period > 0):
            raise DPError(f"the per-period contribution bound must be a positive number, got {self.per_period!r}")
        if not (isinstance(self.periods, int) and 1 <= self.periods):
            raise DPError(f"the periods a unit may count in must be an integer >= 1, got {self.periods!r}")
        if not (isinstance(self.max_groups, int) and self.max_groups >= 1):
            raise DPError(f"max_groups must be an integer >= 1, got {self.max_groups!r}")


def l2_sensitivity_squared(horizon: int, per_period: int | float, periods: int, max_groups: int):
    """Delta_2^2: the largest squared L2 change of all tree nodes when one unit is added or
    removed (module docstring), in the units of `per_period`. Level h has N_h = floor(T / 2^h)
    disjoint blocks, each changing by at most c_h = min(2^h, k) B, all by at most k B together:
    the sum of squares is largest with as many blocks full as k B allows and the rest in one more,
    and C_u groups add their squares. A unit in the first k periods reaches it."""
    k = min(periods, horizon)
    total, squares = k * per_period, 0
    for h in range(levels(horizon)):
        blocks, cap = horizon >> h, min(1 << h, k) * per_period
        full = min(int(total // cap), blocks)
        rest = total - full * cap
        squares += full * cap * cap + (rest * rest if full < blocks else 0)
    return max_groups * squares


def discrete_gaussian_variance(variance) -> float:
    """The exact variance of the discrete Gaussian N_Z(0, s^2) the engine samples for parameter
    `variance` (rounded up as `gaussian_parameters` does): sum k^2 e^(-k^2/2s^2) / sum e^(-k^2/2s^2),
    summed to 40 s (the rest is below 1e-300); for s >= 1e4 it equals s^2 to float precision."""
    s2 = float(gaussian_parameters(variance).variance)
    if s2 >= 1e8:
        return s2
    k = np.arange(0, math.ceil(40 * math.sqrt(s2)) + 2, dtype=np.float64)
    w = np.exp(-(k * k) / (2.0 * s2))
    return float(2.0 * (k * k * w).sum() / (w[0] + 2.0 * w[1:].sum()))


def sum_halfwidth(variance, count: int, alpha: float) -> int:
    """Smallest integer m with P(|K_1 + ... + K_count| > m) <= alpha, K_i iid N_Z(0, s^2) as the
    engine samples them: the law of the sum computed exactly (the node law convolved `count` times
    by FFT); for s >= 1e3 the normal quantile of the sum's variance plus `count` steps."""
    s2 = float(gaussian_parameters(variance).variance)
    sigma = math.sqrt(s2)
    if count == 1:
        return discrete_gaussian_halfwidth(sigma, alpha)
    if sigma >= 1e3:
        return math.ceil(math.sqrt(count * s2) * normal_isf(alpha / 2.0)) + count
    width = math.ceil(40 * sigma) + 2
    k = np.arange(-width, width + 1, dtype=np.float64)
    node = np.exp(-(k * k) / (2.0 * s2))
    node /= node.sum()
    size = count * (2 * width) + 1
    law = np.fft.irfft(np.fft.rfft(node, size) ** count, size)[:size]
    law = np.clip(law, 0.0, None)
    law /= law.sum()
    centre = count * width
    # P(|S| > m) = 1 - sum_{|j| <= m} law[centre + j]
    inside = np.concatenate([[law[centre]], law[centre + 1:] + law[centre - 1::-1][: size - centre - 1]])
    outside = 1.0 - np.cumsum(inside)
    return int(np.argmax(outside <= alpha))


@dataclass(frozen=True)
class TreeCalibration:
    """The noise of every node, from public parameters only."""

    horizon: int
    bound: ContributionBound
    rho: float
    confidence: float
    quantum: float  # the statistic's unit (1 for counts)
    grid: float  # g: node values and noise in steps of g
    shift: int  # log2(g / quantum)
    per_period_steps: int  # B in grid steps, ceil(B / g)
    node_variance_parameter: Fraction  # sigma^2 in grid steps^2: Delta_2^2 / (2 rho)
    node_variance: float  # the sampled law's exact variance, in the statistic's units^2
    sensitivity_l2: float  # Delta_2 in the statistic's units

    @property
    def levels(self) -> int:
        return levels(self.horizon)

    def prefix_variance(self, period: int) -> float:
        """Var(noise of S_t) = popcount(t) * node variance: S_t is a sum of independent nodes."""
        return len(prefix_nodes(period)) * self.node_variance

    def prefix_halfwidth(self, period: int) -> float:
        """The half-width of S_t's interval at `confidence`, from the exact law of its noise."""
        return sum_halfwidth(self.node_variance_parameter, len(prefix_nodes(period)), 1.0 - self.confidence) * self.grid

    def period_halfwidth(self) -> float:
        """The half-width of a period value's interval (the leaf node: one noise draw)."""
        return sum_halfwidth(self.node_variance_parameter, 1, 1.0 - self.confidence) * self.grid

    def naive_prefix_variance(self, period: int) -> float:
        """The naive running total's variance at t: the sum of t monthly releases, each charged
        rho / T and calibrated to one period's L2 sensitivity sqrt(C_u) B (on the same grid)."""
        return period * discrete_gaussian_variance(self.naive_variance_parameter)

    @property
    def naive_variance_parameter(self) -> Fraction:
        b = self.per_period_steps
        return Fraction(self.bound.max_groups * b * b * self.horizon) / (2 * Fraction(self.rho))

    def naive_prefix_halfwidth(self, period: int) -> float:
        """The naive running total's interval half-width at t (the exact law of t monthly noises)."""
        return sum_halfwidth(self.naive_variance_parameter, period, 1.0 - self.confidence) * self.grid


def calibrate_tree(*, horizon: int, bound: ContributionBound, rho: float, confidence: float,
                   quantum: float = 1.0) -> TreeCalibration:
    """The grid and the node noise for a horizon of T periods under rho-zCDP for all of it.

    The grid is a power of two times the quantum, chosen from the public B and sigma as the engine
    chooses it (`real_grid` of min(sigma, B), never finer than the quantum); a period's exact value
    is rounded to it once (the leaf), and each node is the sum of its rounded leaves, so one unit
    moves a leaf by at most ceil(B / g) steps and the sensitivity is computed in steps."""
    if not (isinstance(horizon, int) and 1 <= horizon <= MAX_HORIZON):
        raise DPError(f"the horizon must be a whole number of periods from 1 to {MAX_HORIZON}, got {horizon!r}")
    bound.check(horizon)
    if not (math.isfinite(rho) and rho > 0):
        raise DPError(f"rho must be a positive number, got {rho!r}")
    if not 0 < confidence < 1:
        raise DPError(f"confidence must be in (0, 1), got {confidence!r}")
    if not (math.isfinite(quantum) and quantum > 0 and math.frexp(quantum)[0] == 0.5):
        raise DPError(f"the quantum must be a power of two (the grid is one), got {quantum!r}")
    per_period_quanta = math.ceil(bound.per_period / quantum - 1e-9)
    nominal = math.sqrt(l2_sensitivity_squared(horizon, bound.per_period, bound.periods, bound.max_groups)
                        / (2.0 * rho))
    grid = max(real_grid(min(nominal, bound.per_period)), quantum)
    shift = round(math.log2(grid / quantum))
    steps = -(-per_period_quanta >> shift)
    delta2 = l2_sensitivity_squared(horizon, steps, bound.periods, bound.max_groups)
    parameter = Fraction(delta2) / (2 * Fraction(rho))
    return TreeCalibration(horizon=horizon, bound=bound, rho=rho, confidence=confidence, quantum=quantum, grid=grid,
                           shift=shift, per_period_steps=steps, node_variance_parameter=parameter,
                           node_variance=discrete_gaussian_variance(parameter) * grid * grid,
                           sensitivity_l2=math.sqrt(delta2) * grid)


# ---------------------------------------------------------------------------------------------
# the noise: drawn once per node, kept
# ---------------------------------------------------------------------------------------------


@dataclass
class TreeNoise:
    """The noise of every node drawn so far, in grid steps, one value per group: node (h, e) ->
    int64 array. Drawn once when the node completes and never again: the platform seals it."""

    groups: int
    nodes: dict[tuple[int, int], np.ndarray] = field(default_factory=dict)

    def extend(self, calibration: TreeCalibration, period: int) -> list[tuple[int, int]]:
        """Draw the noise of the nodes that complete by `period` and are not drawn yet (a period
        whose release was skipped gets its nodes now); a drawn node's noise is never drawn again
        (a period released twice reuses it). Returns the new nodes."""
        if not 1 <= period <= calibration.horizon:
            raise DPError(f"period {period} is outside the horizon 1..{calibration.horizon}")
        new = [n for t in range(1, period + 1) for n in nodes_completed_at(t, calibration.horizon)
               if n not in self.nodes]
        draws = discrete_gaussian(None, len(new) * self.groups, variance=calibration.node_variance_parameter)
        for i, node in enumerate(new):
            self.nodes[node] = draws[i * self.groups:(i + 1) * self.groups].copy()
        return new

    def to_dict(self) -> dict:
        return {"groups": self.groups, "nodes": {f"{h},{e}": v.tolist() for (h, e), v in self.nodes.items()}}

    @classmethod
    def from_dict(cls, data: dict) -> TreeNoise:
        nodes = {tuple(int(x) for x in key.split(",")): np.asarray(v, dtype=np.int64)
                 for key, v in data["nodes"].items()}
        return cls(groups=int(data["groups"]), nodes=nodes)


# ---------------------------------------------------------------------------------------------
# the release of one period
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PeriodRelease:
    """What period t publishes: its own value and every prefix total S_1..S_t, per group, each
    with the half-width of its interval (the same for every group)."""

    period: int
    values: np.ndarray  # (t, groups): x_s, the leaf node of period s
    totals: np.ndarray  # (t, groups): S_s
    value_halfwidth: float
    total_halfwidths: list[float]  # per s
    total_variances: list[float]  # per s: the exact noise variance


def leaf_steps(calibration: TreeCalibration, exact_quanta: np.ndarray) -> np.ndarray:
    """Each period's exact value (integers in quanta, shape (periods, groups)) rounded to the grid."""
    return grid_steps(np.asarray(exact_quanta, dtype=np.int64), calibration.shift)


def node_value(leaves: np.ndarray, node: tuple[int, int]) -> np.ndarray:
    """The exact value of node (h, e) in grid steps: the sum of its 2^h rounded leaves."""
    h, end = node
    return leaves[end - (1 << h):end].sum(axis=0)


def release_period(calibration: TreeCalibration, noise: TreeNoise, exact_quanta: np.ndarray) -> PeriodRelease:
    """Period t = len(exact_quanta): the noise of its new nodes drawn (once), then x_1..x_t and
    S_1..S_t from the nodes. `exact_quanta`: (t, groups) integers, each period's bounded exact
    value per group in quanta (`dp_core.continual_bounding`)."""
    exact_quanta = np.asarray(exact_quanta, dtype=np.int64).reshape(-1, noise.groups)
    period = exact_quanta.shape[0]
    noise.extend(calibration, period)
    leaves = leaf_steps(calibration, exact_quanta)
    g = calibration.grid

    def noisy(node):
        return (node_value(leaves, node) + noise.nodes[node]).astype(np.float64) * g

    values = np.vstack([noisy((0, s)) for s in range(1, period + 1)])
    totals = np.vstack([sum(noisy(n) for n in prefix_nodes(s)) for s in range(1, period + 1)])
    return PeriodRelease(period=period, values=values, totals=totals, value_halfwidth=calibration.period_halfwidth(),
                         total_halfwidths=[calibration.prefix_halfwidth(s) for s in range(1, period + 1)],
                         total_variances=[calibration.prefix_variance(s) for s in range(1, period + 1)])
