"""Privacy risk indicators (PRIs) and Find-epsilon-from-PRI (pri.md; Zhu and Castro Fernandez).

PRI_i = || r - q(x_-i) ||_1: how far the released output r lies from the output without unit i
(all its rows, after contribution bounding). PRIs are computed from raw data: controller only.

Fast path: every supported aggregate is a function of per-partition sums (T for COUNT and SUM;
N, S, Q for AVG, VAR, STDDEV), and a unit changes only the partitions it contributes to, at most
C_u. So q(x_-i) differs from q(x) only there, and

    PRI_i = base + sum over unit i's outputs j of (|r_j - q_j(x_-i)| - |r_j - q_j(x)|),
    base  = || r - q(x) ||_1,

O(C_u) per unit per candidate epsilon, vectorised over units. q_j(x_-i) is evaluated once per
distinct (partition, contribution) (memoised). Units of the input that contribute nothing (for
example, filtered out by the row filter) have PRI = base.

Two ways to choose epsilon (docs/privacy.md):
- `data`: the seed's Algorithm 1 on the actual PRIs. The choice depends on the data: the output
  given epsilon is epsilon-DP, but the release as a whole (epsilon, the decision, the output) has no
  end-to-end guarantee.
- `public` (default): the same test over the public domain of contributions, on simulated noise;
  no data is used, so the release is exactly epsilon-DP and the odometer holds.
In both modes the released output is a fresh draw at the chosen epsilon, never the probe.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import pandas as pd

from .accounting import plan_budget
from .aggregates import finish
from .engine import ExactStatistics, exact_statistics, execute
from .errors import DPError, InvalidQueryError
from .query import Query
from .release import add_noise

#: the seed's experiment grid: 10, 9, ..., 1, 0.9, ..., 0.1, 0.09, ..., 0.001 (37 values)
DEFAULT_GRID = (10.0,) + tuple(round(m * 10.0**e, 12) for e in (0, -1, -2, -3) for m in range(9, 0, -1))
PRI_KINDS = ("count", "count_units", "sum", "avg", "var", "stddev")
PUBLIC_KINDS = ("count", "count_units", "sum")

GUARANTEE = {
    "public": (
        "epsilon was chosen without looking at the data (the PRI test over the public domain of "
        "contributions, on simulated noise); the released output is a fresh draw at that epsilon, so "
        "the release is epsilon-DP end to end"
    ),
    "data": (
        "epsilon was chosen from the PRIs of the actual data (the seed's Algorithm 1); the released "
        "output is a fresh draw at that epsilon and is epsilon-DP given epsilon, but epsilon itself and "
        "the decision to release depend on the data: the release as a whole has no end-to-end DP guarantee"
    ),
}


class NoEpsilonError(DPError):
    """No candidate epsilon passes the PRI test within the budget: nothing is released."""


@dataclass(frozen=True)
class PRIRange:
    """Controller only: the spread of PRIs for one probe at one candidate epsilon."""

    epsilon: float
    minimum: float
    median: float
    maximum: float
    passed: bool


@dataclass(frozen=True)
class EpsilonChoice:
    """How epsilon was chosen. Public fields may go into release metadata; `controller_only`
    (PRI ranges from the data) may not."""

    epsilon: float
    mode: str
    p: float
    beta: float | None
    rule: str
    candidates: tuple[float, ...]
    guarantee: str
    pass_probability: tuple[float, ...] | None = None  # public mode: per candidate, data-free
    stop_probability: tuple[float, ...] | None = None  # public mode: P(the search stops there)
    controller_only: tuple[PRIRange, ...] = field(default=(), repr=False, compare=False)

    def public_summary(self) -> dict[str, Any]:
        out = {"epsilon": self.epsilon, "mode": self.mode, "p": self.p, "rule": self.rule,
               "candidates": list(self.candidates), "guarantee": self.guarantee}
        if self.mode == "public":
            out.update(beta=self.beta, pass_probability=list(self.pass_probability or ()),
                       stop_probability=list(self.stop_probability or ()))
        return out


def passes(pri_min: np.ndarray, pri_max: np.ndarray, p: float) -> np.ndarray:
    """The seed's test: min / max >= 1 - p/100 (all PRIs zero: passes)."""
    pri_min, pri_max = np.asarray(pri_min, dtype=float), np.asarray(pri_max, dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(pri_max <= 0, True, pri_min / pri_max >= 1.0 - p / 100.0)


# --------------------------------------------------------------------------------------------
# data: contributions, exact outputs, leave-one-out outputs, PRIs for one probe


@dataclass(frozen=True)
class Contributions:
    """Per-partition sufficient statistics and each unit's bounded contributions (raw data)."""

    query: Query
    stats: ExactStatistics
    exact: dict[int, np.ndarray]  # aggregate index -> q(x) per partition
    unit_index: np.ndarray  # per unit row: which unit (0..n_present-1)
    part_index: np.ndarray  # per unit row: which partition
    values: dict[int, np.ndarray]  # aggregate index -> the unit's bounded value per row (NaN: none)
    n_present: int
    total_units: int


def _components(stats: ExactStatistics, i: int) -> dict[str, np.ndarray]:
    plan = stats.plan.aggregates[i]
    return {c.key: stats.rows[c.column].to_numpy(dtype=np.float64) * c.quantum for c in plan.components}


def exact_outputs(query: Query, stats: ExactStatistics) -> dict[int, np.ndarray]:
    """q(x): the non-private bounded value of every output (partition x aggregate)."""
    out = {}
    for i, agg in enumerate(query.aggregates):
        c = _components(stats, i)
        if agg.kind in ("count", "count_units", "sum"):
            out[i] = c["sum" if agg.kind == "sum" else "count"]
        else:
            out[i] = _ratio(agg, c["N"], c["S"], c.get("Q"))
    return out


def _ratio(agg, n, s, q) -> np.ndarray:
    """AVG / VAR / STDDEV from N, S (centred at mid) and Q; an empty group gives mid (AVG) or 0,
    the values the engine would report for it without noise."""
    mid = (float(agg.lower) + float(agg.upper)) / 2.0
    with np.errstate(divide="ignore", invalid="ignore"):
        mean_c = np.where(n > 0, s / n, 0.0)
        if agg.kind == "avg":
            return mean_c + mid
        variance = np.where(n > 0, np.maximum(q / n - mean_c**2, 0.0), 0.0)
    return np.sqrt(variance) if agg.kind == "stddev" else variance


def _check_supported(query: Query) -> None:
    bad = [a.label for a in query.aggregates if a.kind not in PRI_KINDS]
    if bad:
        raise InvalidQueryError(
            f"PRIs are defined for additive noise on COUNT, SUM, AVG, VAR, STDDEV; not for {bad} "
            "(quantiles use the exponential mechanism): fix epsilon or choose it by risk"
        )
    if query.noise != "laplace":
        raise InvalidQueryError("Find-epsilon-from-PRI assumes Laplace noise (as the seed does): use noise='laplace'")
    if any(a.needs_bounds for a in query.aggregates):
        raise InvalidQueryError("Find-epsilon-from-PRI needs the bounds set: PRIs are defined for fixed sensitivities")


def contributions(query: Query, data, **kwargs) -> Contributions:
    """One pass of the bounding plan: exact outputs and every unit's bounded contributions."""
    _check_supported(query)
    stats = exact_statistics(query, data, with_units=True, **kwargs)
    keys = list(query.group_by)
    units = stats.units
    if keys:
        index = stats.rows[keys].assign(_pidx=np.arange(len(stats.rows)))
        units = units.merge(index, on=keys, how="left")
        part = units["_pidx"].to_numpy(dtype=np.int64)
    else:
        part = np.zeros(len(units), dtype=np.int64)
    unit_idx, uniques = pd.factorize(units[query.privacy_unit])
    values = {i: units[f"_u{i}"].to_numpy(dtype=np.float64) for i in range(len(query.aggregates))}
    return Contributions(query, stats, exact_outputs(query, stats), unit_idx.astype(np.int64), part, values,
                         len(uniques), int(stats.total_units))


def leave_one_out(c: Contributions, i: int) -> tuple[np.ndarray, np.ndarray]:
    """q_j(x_-i) for every unit row of aggregate i (rows without a value: mask False).

    Memoised per distinct (partition, contribution): computed once per pair, then broadcast."""
    agg = c.query.aggregates[i]
    v = c.values[i]
    mask = ~np.isnan(v)
    pairs = np.stack([c.part_index[mask].astype(np.float64), v[mask]], axis=1)
    uniq, inverse = np.unique(pairs, axis=0, return_inverse=True)
    part, val = uniq[:, 0].astype(np.int64), uniq[:, 1]
    comp = _components(c.stats, i)
    quanta = {k.key: k.quantum for k in c.stats.plan.aggregates[i].components}

    def quantised(x, key):  # the unit's term exactly as the SQL summed it (aggregates._real_component)
        return np.floor(x * (1.0 / quanta[key]) + 0.5) * quanta[key]

    if agg.kind in ("count", "count_units", "sum"):
        loo = c.exact[i][part] - (val if agg.kind != "sum" or quanta["sum"] == 1.0 else quantised(val, "sum"))
    else:
        mid = (float(agg.lower) + float(agg.upper)) / 2.0
        centred = val - mid
        n, s = comp["N"][part] - 1.0, comp["S"][part] - quantised(centred, "S")
        q = comp["Q"][part] - quantised(centred * centred, "Q") if "Q" in comp else None
        loo = _ratio(agg, n, s, q)
    return loo[inverse.reshape(-1)], mask


def pris_for_probe(c: Contributions, r: dict[int, np.ndarray], loo_cache: dict | None = None) -> np.ndarray:
    """PRIs of the units present in the query (one per unit, index = unit_index), for output r."""
    base = sum(float(np.abs(r[i] - c.exact[i]).sum()) for i in r)
    delta = np.zeros(c.n_present)
    for i in r:
        if loo_cache is not None and i in loo_cache:
            loo, mask = loo_cache[i]
        else:
            loo, mask = leave_one_out(c, i)
            if loo_cache is not None:
                loo_cache[i] = (loo, mask)
        rp = r[i][c.part_index[mask]]
        d = np.abs(rp - loo) - np.abs(rp - c.exact[i][c.part_index[mask]])
        delta += np.bincount(c.unit_index[mask], weights=d, minlength=c.n_present)
    return base + delta, base


def probe(c: Contributions, epsilon: float) -> dict[int, np.ndarray]:
    """A noisy output r at this epsilon, drawn with the engine's own mechanisms (never released)."""
    query = replace(c.query, epsilon=epsilon)
    budget = plan_budget(query)
    cu = query.effective_max_partitions
    r = {}
    for i, (agg, aplan) in enumerate(zip(query.aggregates, c.stats.plan.aggregates)):
        noisy = {}
        for comp in aplan.components:
            share = budget.selection_share if i in budget.reused else budget.component_shares[(i, comp.key)]
            noisy[comp.key] = add_noise(
                c.stats.rows[comp.column].to_numpy(dtype=np.int64), target=f"probe {agg.label}.{comp.key}",
                quantum=comp.quantum, sensitivity_quanta=comp.sensitivity_quanta, max_partitions=cu, share=share,
                noise="laplace", confidence=query.confidence,
            )
        r[i] = finish(agg, noisy, "laplace", 1.0 - query.confidence)[0]
    return r


def pri_range(c: Contributions, epsilon: float, p: float, loo_cache: dict | None = None) -> PRIRange:
    """Min, median and max PRI over every unit of the input, for one probe at `epsilon`."""
    pris, base = pris_for_probe(c, probe(c, epsilon), loo_cache)
    absent = c.total_units - c.n_present
    if absent > 0:  # units with no contribution: PRI = base
        lo, hi = min(pris.min(initial=base), base), max(pris.max(initial=base), base)
        med = float(np.median(np.concatenate([pris, np.full(absent, base)])))
    else:
        lo, hi, med = float(pris.min()), float(pris.max()), float(np.median(pris))
    return PRIRange(epsilon, float(lo), med, float(hi), bool(passes(lo, hi, p)))


# --------------------------------------------------------------------------------------------
# choosing epsilon


def _candidates(grid, spent: float, cap: float | None) -> tuple[float, ...]:
    grid = sorted({float(e) for e in grid}, reverse=True)
    if not grid or any(not (math.isfinite(e) and e > 0) for e in grid):
        raise InvalidQueryError(f"the epsilon grid must hold positive numbers, got {grid!r}")
    out = tuple(e for e in grid if e > spent and (cap is None or spent + e <= cap + 1e-12))
    if not out:
        raise NoEpsilonError(
            f"no candidate epsilon is above the dataset's odometer ({spent:g}) and within its cap ({cap}): "
            "nothing can be released on this dataset any more"
        )
    return out


def _check_p(p: float, beta: float) -> None:
    if not (isinstance(p, (int, float)) and 0 <= p <= 100):
        raise InvalidQueryError(f"the percentage p must be in [0, 100], got {p!r}")
    if not (0 < beta < 1):
        raise InvalidQueryError(f"beta must be in (0, 1), got {beta!r}")


def choose_epsilon_data(query: Query, data, p: float, *, grid=DEFAULT_GRID, spent: float = 0.0,
                        cap: float | None = None, ranges_for_all: bool = True, **kwargs) -> EpsilonChoice:
    """The seed's Algorithm 1: the largest candidate whose probe passes the test (descending).

    Each candidate's probe is a fresh draw. With `ranges_for_all`, the controller also gets the PRI
    range of a probe at every candidate (the seed's range plot), not only down to the choice."""
    _check_p(p, 0.5)
    candidates = _candidates(grid, spent, cap)
    c = contributions(query, data, **kwargs)
    cache: dict = {}
    ranges, chosen = [], None
    for eps in candidates:
        if chosen is not None and not ranges_for_all:
            break
        rng = pri_range(c, eps, p, cache)
        ranges.append(rng)
        if chosen is None and rng.passed:
            chosen = eps
    if chosen is None:
        raise NoEpsilonError(
            f"no candidate epsilon passes the PRI test at p = {p:g} (data mode): nothing is released; "
            "raise p or allow smaller epsilons in the grid"
        )
    return EpsilonChoice(chosen, "data", float(p), None, "search", candidates, GUARANTEE["data"],
                         controller_only=tuple(ranges))


def _public_uniforms(shape: tuple[int, int], tag: str, stratified: bool = False) -> np.ndarray:
    """Deterministic uniforms on (0, 1) for the data-free simulation: SHAKE-256 of a public tag, or
    (one noise dimension) the midpoints (i + 1/2) / n, which integrate a 1-D law almost exactly.
    Public randomness: the choice must be the same for any dataset, so it cannot use the CSPRNG."""
    n = shape[0] * shape[1]
    if stratified:
        return ((np.arange(n) + 0.5) / n).reshape(shape)
    words = np.frombuffer(hashlib.shake_256(tag.encode()).digest(8 * n), dtype=np.uint64) >> np.uint64(11)
    return ((words.astype(np.float64) + 0.5) / 2.0**53).reshape(shape)


def _domain_extremes(z: np.ndarray, kind: str, lower: float, upper: float) -> tuple[np.ndarray, np.ndarray]:
    """Per output, the smallest and largest |z + c| - |z| over the contributions c a unit can make
    (count: 0..U; distinct units: 0 or 1; sum: [L, U], or 0 when the unit is not in the output)."""
    az = np.abs(z)
    if kind in ("count", "count_units"):
        top = 1.0 if kind == "count_units" else upper
        best = np.clip(np.round(-z), 0.0, top)
        low = np.abs(z + best) - az
        high = np.maximum(np.abs(z + top), az) - az
        return low, high
    cands = np.stack([np.abs(z + lower), np.abs(z + upper), az], axis=0) - az
    inside = (-z >= lower) & (-z <= upper)
    low = np.where(inside, -az, cands.min(axis=0))
    return low, cands.max(axis=0)


def public_pass_probability(query: Query, epsilon: float, p: float, simulations: int, tag: str) -> float:
    """P(the PRI test passes) at `epsilon`, over the public domain of contributions: for each
    simulated noise Z, the smallest and largest PRI any possible unit (contributions within the
    bounds, in at most C_u partitions) could have. Uses no data."""
    budget = plan_budget(replace(query, epsilon=epsilon))
    cu = query.effective_max_partitions
    k = len(query.public_partitions) if query.public_partitions is not None else 1
    base = np.zeros(simulations)
    low = np.zeros((simulations, k))
    high = np.zeros((simulations, k))
    for i, agg in enumerate(query.aggregates):
        share = budget.selection_share if i in budget.reused else budget.component_shares[(i, "sum" if agg.kind == "sum" else "count")]
        d = float(agg.upper) if agg.kind == "count" else 1.0 if agg.kind == "count_units" else max(abs(agg.lower), abs(agg.upper))
        b = cu * d / share.epsilon
        u = _public_uniforms((simulations, k), f"{tag}/{i}", stratified=k * len(query.aggregates) == 1)
        z = -b * np.sign(u - 0.5) * np.log1p(-2.0 * np.abs(u - 0.5))  # Laplace(b) by inversion
        base += np.abs(z).sum(axis=1)
        lo, hi = _domain_extremes(z, agg.kind, float(agg.lower or 0.0), 1.0 if agg.upper is None else float(agg.upper))
        low += lo
        high += hi
    take = min(cu, k)
    most_negative = np.sort(low, axis=1)[:, :take].sum(axis=1)
    most_positive = np.sort(high, axis=1)[:, k - take:].sum(axis=1)
    return float(passes(base + most_negative, base + most_positive, p).mean())


def choose_epsilon_public(query: Query, p: float, *, beta: float = 0.5, grid=DEFAULT_GRID, spent: float = 0.0,
                          cap: float | None = None, rule: str = "search", simulations: int = 4000) -> EpsilonChoice:
    """Data-free choice. rule `search` (default): the beta-quantile of the epsilon at which the
    seed's descending search stops, over simulated noise (P(stop at e_i) = pi_i prod_{j<i}(1 - pi_j));
    rule `single`: the largest candidate whose single test passes with probability >= beta."""
    _check_supported(query)
    _check_p(p, beta)
    query.validate()
    bad = [a.label for a in query.aggregates if a.kind not in PUBLIC_KINDS]
    if bad or query.private_partitions:
        why = f"aggregates {bad} need the data's sums" if bad else "its partitions come from the data"
        raise InvalidQueryError(
            f"public mode needs COUNT/SUM over public or no partitions, but {why}: give public_partitions, "
            "or use mode='data' (its choice depends on the data; see docs/privacy.md)"
        )
    if rule not in ("search", "single"):
        raise InvalidQueryError(f"rule must be 'search' or 'single', got {rule!r}")
    candidates = _candidates(grid, spent, cap)
    tag = f"dprelease/pri-public/v1/p={p!r}"
    pi = np.array([public_pass_probability(query, e, p, simulations, f"{tag}/eps={e!r}") for e in candidates])
    survive = np.concatenate([[1.0], np.cumprod(1.0 - pi)[:-1]])
    stop = pi * survive
    if rule == "single":
        ok = [e for e, prob in zip(candidates, pi) if prob >= beta]
        chosen = ok[0] if ok else None
    else:
        # X = the epsilon the search stops at (0 when it never stops); beta-quantile of X
        values = np.concatenate([[0.0], np.array(candidates)[::-1]])
        probs = np.concatenate([[1.0 - stop.sum()], stop[::-1]])
        cdf = np.cumsum(probs)
        chosen = float(values[np.argmax(cdf >= beta - 1e-12)])
        chosen = chosen if chosen > 0 else None
    if chosen is None:
        raise NoEpsilonError(
            f"no candidate epsilon passes the PRI test at p = {p:g} with probability beta = {beta:g} (public "
            "mode): nothing is released; raise p, lower beta, or allow smaller epsilons"
        )
    return EpsilonChoice(chosen, "public", float(p), float(beta), rule, candidates, GUARANTEE["public"],
                         tuple(float(x) for x in pi), tuple(float(x) for x in stop))


def release_with_pri(query: Query, data, p: float, *, mode: str = "public", beta: float = 0.5,
                     grid=DEFAULT_GRID, spent: float = 0.0, cap: float | None = None, rule: str = "search",
                     controller_ranges: bool = True, **kwargs):
    """Choose epsilon from the PRI, then release a fresh draw at it (never the probe).

    Returns the DPResult with `epsilon_choice` (public metadata) and the PRI ranges in its
    controller-only field."""
    if mode == "public":
        choice = choose_epsilon_public(query, p, beta=beta, grid=grid, spent=spent, cap=cap, rule=rule)
        if controller_ranges:
            c = contributions(query, data, **kwargs)
            cache: dict = {}
            ranges = tuple(pri_range(c, e, p, cache) for e in choice.candidates)
            choice = replace(choice, controller_only=ranges)
    elif mode == "data":
        choice = choose_epsilon_data(query, data, p, grid=grid, spent=spent, cap=cap, ranges_for_all=controller_ranges, **kwargs)
    else:
        raise InvalidQueryError(f"mode must be 'public' or 'data', got {mode!r}")
    result = execute(replace(query, epsilon=choice.epsilon), data, **kwargs)
    controller = replace(result.controller_only, pri_ranges=choice.controller_only)
    return replace(result, epsilon_choice=replace(choice, controller_only=()), controller_only=controller)
