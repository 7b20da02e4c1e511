"""The Gaussian aggregates' pool certified as sampled, before any noise is drawn.

With the "pld" accountant the pool's rho comes from the continuous Gaussian's exact curve
(pld_accounting.gaussian_rho); what the release draws are discrete Gaussians on each statistic's
grid. `certify` lists every noisy component as the sampler will draw it (its grid steps of
sensitivity and the variance `noise.gaussian_parameters` rounds up to, C_u coordinates each) and
asks pld_accounting.discrete_pool_delta for the exact delta at the pool's epsilon. The plan keeps
the "pld" accountant, with its certified delta, when that delta is within the pool's delta share;
otherwise (or when a component cannot be certified: per-partition bounds, a noise too wide to
enumerate) the pool alone is converted again with the zCDP accountant, valid for the discrete
Gaussian (Canonne, Kamath and Steinke 2020), every share of the plan kept as it is (the plan is
not made again: APPROX_BOUNDS may have spent its shares already, and the query the release sees
has its inferred bounds filled in, which would give the aggregates those shares a second time).
"""

from __future__ import annotations

from dataclasses import replace
from fractions import Fraction

from .accounting import BudgetPlan
from .noise import gaussian_parameters
from .pld_accounting import DiscretePart, discrete_pool_delta
from .release import calibrate


def discrete_parts(query, plan, budget: BudgetPlan, per_partition=frozenset()) -> tuple[DiscretePart, ...] | None:
    """Every Gaussian aggregate component of the pool as sampled; None when one cannot be listed
    (its sensitivity differs per partition: the aggregates in `per_partition`, or its share underflowed)."""
    cu = query.effective_max_partitions
    parts = []
    for i, (agg, aplan) in enumerate(zip(query.aggregates, plan.aggregates)):
        if i in budget.reused or agg.kind == "quantile" or (i, aplan.components[0].key) not in budget.component_shares:
            continue
        for c in aplan.components:
            share = budget.component_shares[(i, c.key)]
            if share.rho is None:
                continue
            if i in per_partition or not share.rho > 0:
                return None
            cal = calibrate(quantum=c.quantum, sensitivity_quanta=c.sensitivity_quanta, max_partitions=cu,
                            share=share, noise="gaussian", confidence=query.confidence)
            variance = gaussian_parameters(Fraction(cu * cal.steps * cal.steps) / (2 * Fraction(share.rho))).variance
            parts.append(DiscretePart(int(cal.steps), variance, cu))
    return tuple(parts)


def certify(query, plan, budget: BudgetPlan, per_partition=frozenset()) -> BudgetPlan:
    """The budget the release runs with: the "pld" plan with its certified delta, or the zCDP plan
    (module docstring). Plans with another accountant are returned as they are."""
    if budget.pool_accountant != "pld":
        return budget
    eps_g, delta_g, _ = budget.pool_figures()
    parts = discrete_parts(query, plan, budget, per_partition)
    delta = discrete_pool_delta(parts, eps_g) if parts else None
    if delta is None or delta > delta_g:
        return budget.with_zcdp_pool()
    return replace(budget, certified_delta=delta)
