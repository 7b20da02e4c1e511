"""The smallest budget a query's noisy parts accept, checked before any data is read.

Every noise-adding part (each aggregate component, the bounds inference, the partition selection,
each round of a Gaussian selection) refuses noise over MAX_SCALE_PER_SENSITIVITY = 2^20 times its
sensitivity: the output would be pure noise, and beyond it the exact samplers leave their integer
range and the floats of thresholds and half-widths (q = e^(-eps/C_u) rounds to 1, eps/C_u to 0)
divide by zero. A part's noise per unit of sensitivity is

    Laplace (and the truncated geometric's e^(eps/C_u)):   C_u / eps_part
    Gaussian (zCDP):                                       sqrt(C_u) / sqrt(2 rho_part)
    weighted Gaussian / MAD round k (L2 sensitivity 1):    1 / sqrt(2 rho_k)

so a tiny epsilon, or a tiny share of one (a small weight, selection_weight or bounds_fraction, a
large C_u), is refused here in one line that names the part and the smallest total epsilon that
works for this query (each share grows with the total: found by bisection). Quantiles (exponential
mechanism) have no noise scale and no floor.
"""

from __future__ import annotations

import math
from dataclasses import replace

from .accounting import GAUSSIAN_SELECTIONS, BudgetPlan, plan_budget
from .errors import InvalidQueryError
from .input_checks import MAX_EPSILON
from .release import MAX_SCALE_PER_SENSITIVITY

#: bisection steps on log epsilon, between the query's epsilon and MAX_EPSILON (80 halvings: far below a digit)
_SEARCH_STEPS = 80


def _per_sensitivity(c_u: float, epsilon: float) -> float:
    return c_u / epsilon if epsilon > 0 else math.inf


def _gaussian_per_sensitivity(l2: float, rho: float | None) -> float:
    return l2 / math.sqrt(2.0 * rho) if rho and rho > 0 else math.inf


def noisy_parts(query, budget: BudgetPlan) -> list[tuple[str, float, float, str]]:
    """(part, its epsilon, its noise per unit of sensitivity, the setting that sizes its share) for
    every noisy part of the plan."""
    from .selection_damped import DAMPED_ROUND_ONE_SHARE, selection_rho  # the engine's numerics: imported when checked
    from .selection_weighted import MAD_ROUND_ONE_SHARE

    cu = query.effective_max_partitions
    parts = []
    share = budget.selection_share
    if share is not None:
        if budget.selection == "mad_damped":  # its own rho (selection_damped.py), never pooled
            rho = selection_rho(share)
            worst = max(_gaussian_per_sensitivity(1.0, rho * f if rho else None)
                        for f in (DAMPED_ROUND_ONE_SHARE, 1.0 - DAMPED_ROUND_ONE_SHARE))
            parts.append(("the partition selection", share.epsilon, worst, "selection_weight"))
        elif budget.selection in GAUSSIAN_SELECTIONS:
            fractions = [1.0] if budget.selection == "weighted_gaussian" else [MAD_ROUND_ONE_SHARE,
                                                                              1.0 - MAD_ROUND_ONE_SHARE]
            worst = max(_gaussian_per_sensitivity(1.0, share.rho * f if share.rho else None) for f in fractions)
            parts.append(("the partition selection", share.epsilon, worst, "selection_weight"))
        else:
            parts.append(("the partition selection", share.epsilon, _per_sensitivity(cu, share.epsilon),
                          "selection_weight"))
    for i, bounds in budget.bounds_shares.items():
        parts.append((f"the bounds inference of {query.aggregates[i].label!r}", bounds.epsilon,
                      _per_sensitivity(cu, bounds.epsilon), "bounds_fraction"))
    for (i, component), comp in budget.component_shares.items():
        if query.aggregates[i].kind == "quantile":
            continue
        label = query.aggregates[i].label + ("" if component in ("count", "sum") else f" ({component})")
        if comp.rho is not None:
            parts.append((label, comp.epsilon, _gaussian_per_sensitivity(math.sqrt(cu), comp.rho), "its weight"))
        else:
            parts.append((label, comp.epsilon, _per_sensitivity(cu, comp.epsilon), "its weight"))
    return parts


def _worst(query) -> tuple[str, float, float, str] | None:
    """The noisy part with the most noise per unit of sensitivity (None: no noisy part)."""
    parts = noisy_parts(query, plan_budget(query))
    return max(parts, key=lambda p: p[2]) if parts else None


def _works(query, epsilon: float) -> bool:
    worst = _worst(replace(query, epsilon=epsilon))
    return worst is None or worst[2] <= MAX_SCALE_PER_SENSITIVITY


def smallest_epsilon_that_works(query) -> float | None:
    """The smallest total epsilon (to 3 significant digits, rounded up) at which no noisy part of
    `query` is over the floor; None when even MAX_EPSILON is not enough."""
    if not _works(query, MAX_EPSILON):
        return None
    lo, hi = math.log(max(query.epsilon, 5e-324)), math.log(MAX_EPSILON)
    for _ in range(_SEARCH_STEPS):
        mid = 0.5 * (lo + hi)
        if _works(query, math.exp(mid)):
            hi = mid
        else:
            lo = mid
    found = math.exp(hi)
    digits = 10.0 ** (math.floor(math.log10(found)) - 2)
    named = float(f"{math.ceil(found / digits) * digits:.3g}")  # the number the message prints
    while not _works(query, named):  # float rounding of the last digit: one step up
        named = float(f"{named + digits:.3g}")
    return named


def check_noise_floor(query) -> None:
    """Refuse a query one of whose noisy parts would get noise over 2^20 times its sensitivity."""
    worst = _worst(query)
    if worst is None or worst[2] <= MAX_SCALE_PER_SENSITIVITY:
        return
    part, epsilon, ratio, setting = worst
    smallest = smallest_epsilon_that_works(query)
    noise = (f"{part} would get epsilon {epsilon:.3g} and noise {ratio:.3g} times its sensitivity (over 2^20: the "
             "output would be pure noise, so it is refused)")
    if smallest is not None:
        raise InvalidQueryError(f"epsilon = {query.epsilon:.6g} is too small for this query: {noise}; the smallest "
                                f"epsilon that works for this query is {smallest:.3g} (or raise {setting} to give that "
                                "part a larger share)")
    raise InvalidQueryError(f"this query's budget is split too thin: of epsilon = {query.epsilon:.6g}, {noise}; no "
                            f"epsilon up to {MAX_EPSILON:g} is enough: raise {setting} to give that part a larger "
                            "share, or lower max_partitions_contributed")
