"""The chance that a group made of one unit is released, computed exactly for every partition-selection
mechanism and held to its delta share, over a grid of (epsilon, delta, C_u, weights).

That chance is a delta-sized event (1e-12 to 1e-3): no sampling sees it (a threshold computed
without the unit's own weight passed the whole suite, the neighbour audit included). So the
probability is computed here from each mechanism's definition, independently of the selection
modules: the noise laws' masses are summed in `decimal` arithmetic at 100 digits, with the laws the
samplers actually draw (noise.laplace_parameters / gaussian_parameters round a scale or a variance
up, never down: the samplers' exactness is tested in test_noise.py). What is taken from the code
under test is only its decision: the threshold, the keep probability, the budget share.

Expected budget shares (accounting.plan_budget, derived here from the weights): the selection gets
epsilon * w_sel / (w_sel + sum of the other parts' weights) and delta * w_sel / (w_sel + sum of the
Gaussian aggregates' weights). Its delta is the bound for the Laplace threshold and the truncated
geometric; for the weighted Gaussian and MAD the threshold's part is delta_sel / 2 * e^(-epsilon of
the query), summed over the rounds (selection_weighted.py's proof sketch, step 3); for damped MAD it
is delta_sel / 2 * e^(-epsilon of the selection) (selection_damped.py, step 3).
"""

from __future__ import annotations

import math
from decimal import Decimal, localcontext
from fractions import Fraction

import numpy as np
import pandas as pd
import pytest

import dp_core as dp
from dp_core import partition_selection as ps
from dp_core import selection_damped as sd
from dp_core import selection_weighted as sw
from dp_core.accounting import plan_budget, rho_from_eps_delta_tight
from dp_core.noise import gaussian_parameters, laplace_parameters

PRECISION = 100
ONE_WEIGHT = 2**16  # a unit's L2 weight in integer steps (the weighted selections' quantisation)

EPSILONS = (0.1, 1.0, 5.0)
DELTAS = (1e-12, 1e-6, 1e-3)
CUS = (1, 2, 5, 16)
#: (selection_weight, noise of the aggregate): the selection's share of epsilon and of delta
WEIGHTS = ((1.0, "laplace"), (3.0, "laplace"), (1.0, "gaussian"), (0.5, "gaussian"))
GRID = [(e, d, c, w, n) for e in EPSILONS for d in DELTAS for c in CUS for w, n in WEIGHTS]


# --- exact arithmetic ------------------------------------------------------------------------------


def dec(x) -> Decimal:
    """An exact Decimal of a float or a Fraction (a Fraction's division rounds at PRECISION digits)."""
    if isinstance(x, Fraction):
        return Decimal(x.numerator) / Decimal(x.denominator)
    return Decimal(x)


def pi() -> Decimal:
    """pi by Machin's formula, 16 arctan(1/5) - 4 arctan(1/239)."""
    def arctan_inverse(n: int) -> Decimal:
        total, k, power = Decimal(0), 0, Decimal(1) / n
        while power > Decimal(10) ** -(PRECISION + 5):
            total += (-1) ** k * power / (2 * k + 1)
            power /= n * n
            k += 1
        return total
    return 16 * arctan_inverse(5) - 4 * arctan_inverse(239)


def erfc(x: Decimal) -> Decimal:
    """erfc(x) = 1 - 2/sqrt(pi) e^(-x^2) sum_n 2^n x^(2n+1) / (1 * 3 * ... * (2n+1)) (all terms positive)."""
    term, total, n = x, x, 0
    while term > total * Decimal(10) ** -(PRECISION + 5):
        n += 1
        term = term * 2 * x * x / (2 * n + 1)
        total += term
    return 1 - 2 / pi().sqrt() * (-x * x).exp() * total


def laplace_tail(scale: Fraction, m: int) -> Decimal:
    """P[K >= m] for P[K = k] proportional to q^|k|, q = e^(-1/scale): the masses sum to
    (1 + q) / (1 - q) and those from m >= 1 to q^m / (1 - q); below 1 by symmetry."""
    q = (-1 / dec(scale)).exp()
    if m >= 1:
        return q**m / (1 + q)
    return 1 - laplace_tail(scale, 1 - m)


def gaussian_tail(variance: Fraction, m: int, side: int = 1) -> Decimal:
    """P[K >= m] for P[K = k] proportional to f(k) = e^(-k^2 / (2 variance)), side=+1 an upper and
    side=-1 a lower bound. The normaliser by Poisson summation (sum_k f(k) = s sqrt(pi) sum_n
    e^(-pi^2 s^2 n^2), s = sqrt(2 variance)); the tail by Euler-Maclaurin with three Bernoulli terms,
    f^(n)(x) = (-1/s)^n H_n(x/s) f(x), whose remainder is below s^-5: at most 2 zeta(6) / (2 pi)^6
    (3.3e-5) times the integral of |f^(6)|, which is s^-5 times that of |H_6(y)| e^(-y^2), below
    sqrt(2^6 6! pi) (380) by Cauchy-Schwarz."""
    if m < 1:
        return 1 - gaussian_tail(variance, 1 - m, -side)
    s = (2 * dec(variance)).sqrt()
    p = pi()
    y = dec(m) / s
    f = (-y * y).exp()
    h1, h3, h5 = 2 * y, 8 * y**3 - 12 * y, 32 * y**5 - 160 * y**3 + 120 * y
    d1, d3, d5 = -h1 / s * f, -h3 / s**3 * f, -h5 / s**5 * f
    tail = s * p.sqrt() / 2 * erfc(y) + f / 2 - (d1 / 12 - d3 / 720 + d5 / 30240)
    tail += side * s**-5
    normaliser = s * p.sqrt() * (1 + 2 * sum((-(p * s * n) ** 2).exp() for n in (1, 2, 3)))
    return tail / normaliser


def unit_weight(k: int) -> int:
    """floor(2^16 / sqrt(k)): the largest integer w with k w^2 <= 4^16."""
    w = int(dec(ONE_WEIGHT) / dec(k).sqrt())
    while k * (w + 1) ** 2 <= 4**16:
        w += 1
    while k * w * w > 4**16:
        w -= 1
    return w


def any_of(p: Decimal, k: int) -> Decimal:
    """The chance that at least one of k independent events of chance p happens."""
    return 1 - (1 - p) ** k


# --- the engine's decisions ------------------------------------------------------------------------


def query(strategy: str, eps: float, delta: float, cu: int, selection_weight: float, noise: str) -> dp.Query:
    aggregates = [dp.count_units()] if strategy == "laplace-threshold" and noise == "laplace" else [dp.count()]
    return dp.Query(aggregates, privacy_unit="u", group_by=("g",), epsilon=eps, delta=delta,
                    max_partitions_contributed=cu, selection=strategy, selection_weight=selection_weight,
                    noise=noise)


def selection_share(q: dp.Query):
    """The engine's share for the selection, checked against the one the weights give."""
    share = plan_budget(q).selection_share
    reused = q.selection == "laplace-threshold" and all(a.kind == "count_units" for a in q.aggregates)
    others = 0.0 if reused else sum(a.weight for a in q.aggregates)
    gaussian = sum(a.weight for a in q.aggregates) if q.noise == "gaussian" else 0.0
    assert share.epsilon == pytest.approx(q.epsilon * q.selection_weight / (q.selection_weight + others), rel=1e-12)
    assert share.delta == pytest.approx(q.delta * q.selection_weight / (q.selection_weight + gaussian), rel=1e-12)
    return share


def laplace_threshold_chance(q: dp.Query) -> tuple[Decimal, Decimal, Decimal]:
    """(chance at the engine's threshold, chance one step lower, the delta share)."""
    share = selection_share(q)
    cu = q.max_partitions_contributed
    chosen = ps.STRATEGIES["laplace-threshold"](np.array([1]), share, cu, query=q)
    threshold = int(chosen.threshold)
    assert chosen.keep.dtype == bool and chosen.noisy_units.values.size == 1
    # the law drawn: discrete Laplace of scale C_u / eps_sel in count units, rounded up by the sampler
    scale = laplace_parameters(Fraction(cu) / Fraction(share.epsilon)).scale
    assert scale >= Fraction(cu) / Fraction(share.epsilon)
    # a group of one unit has count 1 and is kept when 1 + K >= T; the unit alone in k <= C_u groups
    at = any_of(laplace_tail(scale, threshold - 1), cu)
    below = any_of(laplace_tail(scale, threshold - 2), cu)
    return at, below, dec(share.delta)


def truncated_geometric_chance(q: dp.Query) -> tuple[Decimal, Decimal]:
    share = selection_share(q)
    cu = q.max_partitions_contributed
    keep = ps.truncated_geometric_keep_probability(np.array([1.0]), share.epsilon, share.delta, cu)
    # kept when a uniform on (0, 1] is <= p(1): chance p(1) (secure_uniform's grid only rounds it down)
    return any_of(dec(float(keep[0])), cu), dec(share.delta)


def gaussian_rounds_chance(q: dp.Query, side: int = 1) -> tuple[Decimal, Decimal]:
    """(the chance summed over the rounds, each at its worst k <= C_u, the threshold's delta)."""
    share = selection_share(q)
    cu = q.max_partitions_contributed
    rounds = sw.selection_rounds(q.selection, share, cu, q.epsilon)
    assert sum(r["rho"] for r in rounds) <= share.rho * (1 + 1e-12)
    total = Decimal(0)
    for rnd in rounds:
        # the law noisy_pass draws: the variance it is given, as the sampler rounds it (never below 4^16 / (2 rho))
        variance = gaussian_parameters(rnd["variance"]).variance
        assert variance >= Fraction(4**16) / (2 * Fraction(rnd["rho"]))
        threshold = int(rnd["threshold"])
        # a unit alone in k <= C_u groups weighs floor(2^16 / sqrt(k)) in each; kept when w + K >= T
        total += max(any_of(gaussian_tail(variance, threshold - unit_weight(k), side), k) for k in range(1, cu + 1))
    rows = pd.DataFrame({"_w1": [ONE_WEIGHT], "_w2": [ONE_WEIGHT], "_mad_r1": [False]})
    used = ps.STRATEGIES[q.selection](np.array([1]), share, cu, rows=rows, query=q)
    assert used.threshold == rounds[-1]["threshold"] / ONE_WEIGHT  # the rounds are the mechanism's own
    return total, dec(share.delta) / 2 * (-dec(q.epsilon)).exp()


def damped_weight(a: int, b: int, damped: bool) -> int:
    """Damped MAD's round-2 weight (selection_damped.py's docstring): floor(2^16 / sqrt(a + b/4)) in
    an undamped partition, floor(2^15 / sqrt(a + b/4)) in a damped one: the largest integer w with
    (a + b/4) w^2 <= 4^16 (resp. 4^15)."""
    top = 4**15 if damped else 4**16
    w = int(dec(ONE_WEIGHT) / (2 if damped else 1) / (dec(a) + dec(b) / 4).sqrt())
    while (4 * a + b) * (w + 1) ** 2 <= 4 * top:
        w += 1
    while (4 * a + b) * w * w > 4 * top:
        w -= 1
    return w


def damped_rounds_chance(q: dp.Query, side: int = 1) -> tuple[Decimal, Decimal]:
    """(damped MAD's chance of releasing any group of a unit alone, over both rounds, the threshold's
    delta: delta_sel / 2 * e^(-epsilon of the selection)). Round 1: q_k in each of k <= C_u groups.
    Round 2, whatever round 1 did: a undamped and b damped groups, 1 <= a + b <= C_u, each of its
    weights; the chance is the worst (a, b)."""
    share = selection_share(q)
    cu = q.max_partitions_contributed
    rounds = sd.damped_rounds(share, cu)
    # its own rho, from epsilon and half the delta (never pooled), split between the rounds
    assert sum(r["rho"] for r in rounds) <= rho_from_eps_delta_tight(share.epsilon, share.delta / 2) * (1 + 1e-12)
    laws = []
    for rnd in rounds:
        variance = gaussian_parameters(rnd["variance"]).variance
        assert variance >= Fraction(4**16) / (2 * Fraction(rnd["rho"]))
        laws.append((variance, int(rnd["threshold"])))
    (v1, t1), (v2, t2) = laws
    first = max(any_of(gaussian_tail(v1, t1 - unit_weight(k), side), k) for k in range(1, cu + 1))
    second = Decimal(0)
    for a in range(cu + 1):
        for b in range(cu + 1 - a):
            if a + b:
                none = ((1 - gaussian_tail(v2, t2 - damped_weight(a, b, False), side)) ** a
                        * (1 - gaussian_tail(v2, t2 - damped_weight(a, b, True), side)) ** b)
                second = max(second, 1 - none)
    rows = pd.DataFrame({"_w1": [ONE_WEIGHT], "_w2": [ONE_WEIGHT], "_mad_r1": [False]})
    used = ps.STRATEGIES[q.selection](np.array([1]), share, cu, rows=rows, query=q)
    assert used.threshold == t2 / ONE_WEIGHT  # the rounds are the mechanism's own
    return first + second, dec(share.delta) / 2 * (-dec(share.epsilon)).exp()


# --- the checks ------------------------------------------------------------------------------------


def test_the_exact_laws_agree_with_their_masses_summed_one_by_one():
    """The oracles themselves: the closed forms against a direct sum of the masses."""
    with localcontext() as ctx:
        ctx.prec = 60
        for variance, m in ((Fraction(50), 12), (Fraction(1000, 3), 40), (Fraction(2), 3), (Fraction(50), -4)):
            sigma = math.sqrt(variance)
            ks = range(-int(60 * sigma) - 5, int(60 * sigma) + 6)
            mass = {k: (-dec(Fraction(k * k)) / (2 * dec(variance))).exp() for k in ks}
            direct = sum(mass[k] for k in ks if k >= m) / sum(mass.values())
            assert gaussian_tail(variance, m, -1) <= direct <= gaussian_tail(variance, m, 1)
            assert abs(gaussian_tail(variance, m) - direct) <= Decimal(10) ** -20 * direct + dec(variance) ** -2
        for scale, m in ((Fraction(3), 7), (Fraction(10, 7), 1), (Fraction(5), -3)):
            ks = range(-4000, 4001)
            mass = {k: (-abs(dec(k)) / dec(scale)).exp() for k in ks}
            direct = sum(mass[k] for k in ks if k >= m) / sum(mass.values())
            assert abs(laplace_tail(scale, m) - direct) <= Decimal(10) ** -40
    assert [unit_weight(k) for k in (1, 2, 3, 4, 16)] == [65536, 46340, 37837, 32768, 16384]


@pytest.mark.parametrize("eps, delta, cu, weight, noise", GRID)
def test_laplace_threshold_releases_a_group_of_one_unit_with_at_most_its_delta(eps, delta, cu, weight, noise):
    """At the threshold the chance is within the share; one step lower it is not (the smallest T)."""
    with localcontext() as ctx:
        ctx.prec = PRECISION
        at, below, share = laplace_threshold_chance(query("laplace-threshold", eps, delta, cu, weight, noise))
        assert at <= share, (float(at), float(share))
        assert below > share, (float(below), float(share))


@pytest.mark.parametrize("eps, delta, cu, weight, noise", GRID)
def test_truncated_geometric_releases_a_group_of_one_unit_with_exactly_its_delta(eps, delta, cu, weight, noise):
    with localcontext() as ctx:
        ctx.prec = PRECISION
        chance, share = truncated_geometric_chance(query("truncated-geometric", eps, delta, cu, weight, noise))
        assert chance <= share, (float(chance), float(share))
        assert chance >= share * (1 - Decimal(10) ** -9), (float(chance), float(share))


@pytest.mark.parametrize("strategy", ["weighted_gaussian", "mad"])
@pytest.mark.parametrize("eps, delta, cu, weight, noise", GRID)
def test_weighted_gaussian_selections_release_a_group_of_one_unit_with_at_most_their_delta(strategy, eps, delta, cu,
                                                                                          weight, noise):
    """The unit's own weight counts: a group of one unit has weight q_k, not 0. Within the share,
    and not far below it (a threshold set for a smaller delta would waste the share)."""
    with localcontext() as ctx:
        ctx.prec = PRECISION
        q = query(strategy, eps, delta, cu, weight, noise)
        chance, allowed = gaussian_rounds_chance(q, side=1)
        assert chance <= allowed, (float(chance), float(allowed))
        lower, _ = gaussian_rounds_chance(q, side=-1)
        assert lower >= allowed * Decimal("0.99"), (float(lower), float(allowed))


@pytest.mark.parametrize("eps, delta, cu, weight, noise", GRID)
def test_damped_mad_releases_a_group_of_one_unit_with_at_most_its_delta(eps, delta, cu, weight, noise):
    """Every mix of damped and undamped groups a unit alone can have in round 2 counts (a threshold
    set for MAD's uniform weights alone would not see a + b/4 < a + b); within the share, and not
    far below it."""
    with localcontext() as ctx:
        ctx.prec = PRECISION
        q = query("mad_damped", eps, delta, cu, weight, noise)
        chance, allowed = damped_rounds_chance(q, side=1)
        assert chance <= allowed, (float(chance), float(allowed))
        lower, _ = damped_rounds_chance(q, side=-1)
        assert lower >= allowed * Decimal("0.99"), (float(lower), float(allowed))
