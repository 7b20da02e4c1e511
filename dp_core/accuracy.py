"""How accurate a planned release will be, before any data is read: the confidence interval of
each statistic at a given epsilon, and the smallest epsilon that meets a tolerable noise.

Data-free and exact: each interval comes from the same functions the release uses to report it
(`accounting.plan_budget` for the shares, `aggregates.plan_aggregate` for each component's quantum
and sensitivity, `release.calibrate` for the grid, the scale and the half-width). So the interval
promised here is, to the last bit, the one a release at that epsilon reports for COUNT, COUNT
(DISTINCT unit) and SUM (the same in every partition; a partition's interval is only ever
narrower, when it is clipped at a bound such as 0 for counts).

AVG's interval is first order (delta method) and depends on the partition's noisy count N and sum
S. Its promise is stated for a *reference count* (a group of `reference_count` people, default
100) in the worst case for the mean (at a bound: |S| = N (U - L) / 2): every released partition
with a noisy count at least the reference count and a released mean within the bounds reports an
interval no wider. VAR and STDDEV depend on the data's spread at first order, quantiles have no
interval, and aggregates whose bounds are inferred from the data (APPROX_BOUNDS) have no known
sensitivity before the data is read: none of these get a data-free interval (`halfwidth` None,
with the reason in `note`), and a tolerance cannot be asked of them.

    from dp_core import Query, count, avg, accuracy
    q = Query([count(), avg("age", 17, 90)], privacy_unit="id", group_by=("education",), epsilon=1.0)
    for s in accuracy.statistic_intervals(q, epsilon=1.0):
        print(s.describe())        # "count: +-9 at 95% (discrete Laplace, epsilon 0.3333)" ...
    accuracy.smallest_epsilon(q, {"count": 10})   # 0.853: the smallest total epsilon with count +-10
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Set
from dataclasses import dataclass, replace
from numbers import Real
from typing import Any

import numpy as np

from . import display
from .accounting import BudgetPlan, Share, plan_budget
from .aggregates import avg_noise_weights, plan_aggregate
from .errors import InvalidQueryError
from .intervals import sum_halfwidth
from .pld_accounting import MAX_CERTIFIED_SIGMA
from .query import Aggregate, Query
from .release import MAX_SCALE_PER_SENSITIVITY, calibrate

#: the group size for which AVG's interval is stated by default (the seed's "a count of 100")
REFERENCE_COUNT = 100.0
#: the largest group size an AVG's interval may be stated for (no group of people is larger)
MAX_REFERENCE_COUNT = 1e12
#: the search range of `smallest_epsilon` (total epsilon)
EPSILON_SEARCH = (1e-9, 100.0)


@dataclass(frozen=True)
class StatisticInterval:
    """The data-free confidence interval of one planned statistic at one total epsilon."""

    name: str  # the aggregate's label (the output column)
    kind: str
    halfwidth: float | None  # the interval is value +- halfwidth; None: no data-free interval
    confidence: float
    epsilon: float  # the statistic's share of the budget (all its components)
    mechanism: str | None
    scale: float | None  # the noise scale (Laplace b or Gaussian sigma) in the statistic's units
    reference_count: float | None = None  # AVG: the group size the half-width is stated for
    note: str = ""

    @property
    def promised(self) -> bool:
        """True when the interval is known before the data is read (a tolerance can be asked)."""
        return self.halfwidth is not None

    def describe(self, ascii: bool = True) -> str:
        """One line: `name: +-h at 90% (...)` (h as every page writes it; `±h` with ascii=False, for a
        web page), or why there is no data-free interval."""
        if self.halfwidth is None:
            return f"{self.name}: no data-free interval ({self.note})"
        group = f" for a group of {self.reference_count:g} people" if self.reference_count else ""
        return (f"{self.name}: {self.halfwidth_text(ascii=ascii)} at {self.confidence:.0%}{group} "
                f"({self.mechanism}, epsilon {display.budget(self.epsilon)})")

    def halfwidth_text(self, ascii: bool = False) -> str:
        """The half-width as every page writes it (`display.halfwidth`: `±10` for a count; `+-10` in
        the engine's plain text)."""
        width = math.nan if self.halfwidth is None else self.halfwidth  # none: written as missing ('—')
        return display.halfwidth(width, display.is_integer_kind(self.kind), ascii)


def statistic_intervals(query: Query, epsilon: float | None = None, *, confidence: float | None = None,
                        integer_columns: set[str] | frozenset[str] | None = None,
                        reference_count: float = REFERENCE_COUNT) -> tuple[StatisticInterval, ...]:
    """The interval of every aggregate of `query` released at total `epsilon` (default: the
    query's), at `confidence` (default: the query's). Reads no data.

    integer_columns: the integer-typed columns of the input (a SUM of an integer column with whole
    bounds is noised on the integers, otherwise on a fine real grid); None when unknown: the larger
    of the two half-widths is given (a promise that holds either way). A statistic whose noise
    would exceed 2^20 times its sensitivity (the engine refuses to release it) gets an infinite
    half-width."""
    _check_reference_count(reference_count)
    return _intervals(query, epsilon, confidence, integer_columns, reference_count, None)


def _check_reference_count(reference_count: object) -> None:
    """Refuses a group size no AVG promise can be stated for: below one person, NaN or huge, it gave
    NaN or negative half-widths, hence a nonsense epsilon, with NumPy's warnings in the terminal."""
    if isinstance(reference_count, bool) or not isinstance(reference_count, Real) or \
            not 1.0 <= float(reference_count) <= MAX_REFERENCE_COUNT:
        raise InvalidQueryError("the reference count (the group size an average's interval is stated for) must "
                                f"be a number of people from 1 to {MAX_REFERENCE_COUNT:g}, got {reference_count!r}")


def _intervals(query: Query, epsilon: float | None, confidence: float | None, integer_columns: Set[str] | None,
               reference_count: float, names: Collection[str] | None) -> tuple[StatisticInterval, ...]:
    """`statistic_intervals`, for the aggregates named in `names` only (None: all)."""
    q = replace(query, epsilon=float(epsilon if epsilon is not None else query.epsilon),
                confidence=float(confidence if confidence is not None else query.confidence))
    q.validate(noise_floor=False)  # a part that would be pure noise gets an infinite interval (_calibration)
    budget = plan_budget(q)
    if budget.pool_accountant == "pld" and _beyond_certificate(q, budget, integer_columns):
        budget = budget.with_zcdp_pool()  # what the release will fall back to (pool_certificate.py)
    return tuple(_interval(q, budget, i, integer_columns, reference_count) for i, a in enumerate(q.aggregates)
                 if names is None or a.label in names)


def _statistic(q: Query, agg: Aggregate, **fields: Any) -> StatisticInterval:
    """The interval of `agg` in `q` with the given fields (halfwidth, epsilon, mechanism, ...)."""
    return StatisticInterval(name=agg.label, kind=agg.kind, confidence=q.confidence, **fields)


def _interval(q: Query, budget: BudgetPlan, i: int, integer_columns: Set[str] | None,
              reference_count: float) -> StatisticInterval:
    agg = q.aggregates[i]
    if i in budget.reused:  # COUNT(DISTINCT unit) released from the selection's noisy count
        cal = _calibration(budget.selection_budget, 1.0, 1, q.effective_max_partitions, "laplace", q.confidence)
        return _statistic(q, agg, halfwidth=cal[0], epsilon=budget.selection_budget.epsilon,
                                 mechanism=cal[1], scale=cal[2],
                                 note="the partition selection's noisy count of units, released as is")
    share = budget.aggregate_shares[i]
    if agg.kind == "quantile":
        return _statistic(q, agg, halfwidth=None, epsilon=share.epsilon, mechanism="exponential mechanism",
                                 scale=None, note="quantiles (exponential mechanism) have no interval")
    if agg.needs_bounds:
        return _statistic(q, agg, halfwidth=None, epsilon=share.epsilon, mechanism=None, scale=None,
                                 note="bounds inferred from the data (APPROX_BOUNDS): the noise is known only "
                                      "once they are; give the bounds to get a promise")
    if agg.kind in ("var", "stddev"):
        return _statistic(q, agg, halfwidth=None, epsilon=share.epsilon, mechanism=None, scale=None,
                                 note="its first-order interval depends on the data's spread")
    cu = q.effective_max_partitions
    variants = _column_typings(agg, integer_columns)
    best: StatisticInterval | None = None
    best_h = -math.inf
    for ints in variants:  # unknown column type: the larger half-width of integer and real noising
        comps = {c.key: c for c in plan_aggregate(i, agg, set(ints), "", 2).components}
        cals = {k: _calibration(budget.component_shares[(i, k)], c.quantum, c.sensitivity_quanta, cu, q.noise,
                                q.confidence) for k, c in comps.items()}
        if agg.kind == "avg":
            n_ref = float(reference_count)
            if agg.lower is None or agg.upper is None:  # needs_bounds is False: both are given
                raise InvalidQueryError(f"aggregate {agg.label!r}: an average needs both bounds for a promise")
            half = (float(agg.upper) - float(agg.lower)) / 2.0
            scale_n, scale_s = cals["N"][2], cals["S"][2]
            if not (math.isfinite(scale_n) and math.isfinite(scale_s)):
                h = math.inf
            else:  # the worst case for the mean: at a bound, |S| = N half
                weights = avg_noise_weights(np.array([n_ref]), np.array([n_ref * half]), scale_n, scale_s)
                h = float(sum_halfwidth(q.noise, weights, 1.0 - q.confidence)[0])
            found = _statistic(q, agg, halfwidth=h, epsilon=share.epsilon, mechanism=cals["S"][1],
                                      scale=scale_s, reference_count=n_ref,
                                      note=f"first order, for a group of {n_ref:g} people whose mean is within the bounds")
        else:
            (h, mechanism, scale), = cals.values()
            found = _statistic(q, agg, halfwidth=h, epsilon=share.epsilon, mechanism=mechanism, scale=scale)
        if best is None or h > best_h:
            best, best_h = found, h
    assert best is not None  # variants holds one or two column-type cases
    return best


def _column_typings(agg: Aggregate, integer_columns: Set[str] | None) -> list:
    """The integer-column sets to state an interval for: the input's, or when it is unknown both
    typings of the aggregate's column (integer and not), so that a promise holds either way."""
    return [integer_columns] if integer_columns is not None else [{agg.column} if agg.column else set(), set()]


def _beyond_certificate(q: Query, budget: BudgetPlan, integer_columns: Set[str] | None) -> bool:
    """True when the release will not be able to certify the Gaussian pool as sampled and will use
    the zCDP pool (pool_certificate.py): a pooled aggregate with per-partition bounds, or a component
    whose noise is over MAX_CERTIFIED_SIGMA grid steps (in either column typing when it is unknown,
    so that the promise holds either way)."""
    cu = q.effective_max_partitions
    for i, agg in enumerate(q.aggregates):
        share = budget.aggregate_shares.get(i)
        if share is None or share.rho is None or agg.kind == "quantile":
            continue
        if agg.needs_bounds:
            if q.bounds_scope == "partition":
                return True
            continue  # its sensitivity is known once the bounds are: the release decides
        for ints in _column_typings(agg, integer_columns):
            for c in plan_aggregate(i, agg, set(ints), "", 2).components:
                cal = calibrate(quantum=c.quantum, sensitivity_quanta=c.sensitivity_quanta, max_partitions=cu,
                                share=budget.component_shares[(i, c.key)], noise="gaussian", confidence=q.confidence)
                if cal.scale_steps > MAX_CERTIFIED_SIGMA:
                    return True
    return False


def _calibration(share: Share, quantum: float, sensitivity_quanta: int, cu: int, noise: str,
                 confidence: float) -> tuple[float, str, float]:
    """(half-width, mechanism, scale) of one noisy component; inf where the engine would refuse."""
    cal = calibrate(quantum=quantum, sensitivity_quanta=sensitivity_quanta, max_partitions=cu, share=share,
                    noise=noise, confidence=confidence)
    if cal.nominal > MAX_SCALE_PER_SENSITIVITY * sensitivity_quanta * quantum:
        return math.inf, cal.mechanism, math.inf
    return cal.halfwidth, cal.mechanism, cal.scale


def smallest_epsilon(query: Query, tolerances: dict[str, float], *, confidence: float | None = None,
                     integer_columns: set[str] | frozenset[str] | None = None,
                     reference_count: float = REFERENCE_COUNT) -> float:
    """The smallest total epsilon at which every named statistic's interval half-width is at most
    its tolerance (name -> absolute half-width), at `confidence` (default: the query's).

    Every half-width is non-increasing in epsilon (each share grows with it; the grid only gets
    finer), so the set of epsilons that meet the tolerances is an interval [eps*, inf): eps* is
    found by bisection on log epsilon to a relative precision of 1e-12. Integer statistics have
    whole-number half-widths, so a tolerance of 10.5 on a count is met as +-10."""
    if not tolerances:
        raise InvalidQueryError("no tolerable noise given: name at least one statistic and its tolerance")
    # the intervals at epsilon 1 also check the query and the reference count
    at_one = {s.name: s for s in statistic_intervals(query, 1.0, confidence=confidence,
                                                      integer_columns=integer_columns,
                                                      reference_count=reference_count)}
    for name, tol in tolerances.items():
        if name not in at_one:
            raise InvalidQueryError(f"the tolerable noise names {name!r}, which is not a statistic of the query "
                                    f"(statistics: {', '.join(at_one)})")
        if not at_one[name].promised:
            raise InvalidQueryError(f"no tolerable noise can be promised for {name!r}: {at_one[name].note}")
        if not (isinstance(tol, (int, float)) and math.isfinite(tol) and tol > 0):
            raise InvalidQueryError(f"the tolerable noise of {name!r} must be a number > 0, got {tol!r}")

    def intervals(eps: float) -> dict[str, StatisticInterval]:
        return {s.name: s for s in _intervals(query, eps, confidence, integer_columns, reference_count, tolerances)}

    def meets(eps: float) -> bool:
        got = intervals(eps)
        return all(_width(got[name]) <= tol for name, tol in tolerances.items())

    hi = EPSILON_SEARCH[1]
    at_hi = intervals(hi)
    unmet = [at_hi[name] for name, tol in tolerances.items() if _width(at_hi[name]) > tol]
    if unmet:  # the noise at the largest epsilon searched: what the tolerance must at least allow
        raise InvalidQueryError(
            f"no epsilon up to {hi:g} meets the tolerable noise {_tolerance_text(tolerances)}: even at epsilon "
            f"{hi:g} the noise is {', '.join(f'{s.name} {s.halfwidth_text(ascii=True)}' for s in unmet)} "
            f"(at {100 * unmet[0].confidence:g}%); tolerate at least that, or lower the sensitivity (narrower "
            "bounds, a smaller max_partitions_contributed)"
        )
    return smallest_meeting(meets, what=_tolerance_text(tolerances))


def _width(interval: StatisticInterval) -> float:
    """The half-width, infinite for a statistic without a data-free interval (never within a tolerance)."""
    return math.inf if interval.halfwidth is None else interval.halfwidth


def smallest_meeting(meets: Callable[[float], bool], *, what: str) -> float:
    """The smallest total epsilon in EPSILON_SEARCH at which `meets(epsilon)` holds, by bisection on
    log epsilon to a relative 1e-12 (meets must hold from some epsilon on; the result always meets).
    `what` names the need in the refusal when even the largest epsilon searched does not meet it."""
    lo, hi = EPSILON_SEARCH
    if not meets(hi):
        raise InvalidQueryError(f"no epsilon up to {hi:g} meets {what}: relax it")
    log_lo, log_hi = math.log(lo), math.log(hi)
    while log_hi - log_lo > 1e-12:
        mid = 0.5 * (log_lo + log_hi)
        if meets(math.exp(mid)):
            log_hi = mid
        else:
            log_lo = mid
    return math.exp(log_hi)


def _tolerance_text(tolerances: dict[str, float]) -> str:
    return ", ".join(f"{name} +-{tol:g}" for name, tol in tolerances.items())
