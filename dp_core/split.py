"""The budget split that meets each statistic's need with the smallest total epsilon.

The default split gives every part (the partition selection, each aggregate) the same weight, so
the total epsilon a set of tolerances needs is set by the neediest part, and every other part gets
as much although it needs less. Given a tolerable noise per statistic (a half-width at a
confidence) and, for the selection, a group of N units that must be released with probability at
least p, the *need split* gives each part what it needs:

  * each part's need is found through the functions the release itself uses (plan_budget with the
    weights, release.calibrate through accuracy's intervals, the selection's own keep
    probabilities), so the promised interval is the report's interval to the last digit;
  * with basic composition (Laplace noise, a non-Gaussian selection) a part's interval depends on
    its own epsilon only, so the smallest total is the sum of the parts' needs, reached by weights
    proportional to the needs. Gaussian parts share one zCDP pool (and the delta is split by the
    same weights): the weights are found by the fixed point x_k <- x_k E_k(x) / sum(x), E_k(x) the
    smallest total at which part k meets its need under the weights x (exact in one step for the
    Laplace case, a few steps otherwise), and the total is then the smallest that meets every need;
  * a part given no tolerance (among them the statistics that cannot have a data-free interval:
    quantiles, VAR/STDDEV, inferred bounds) keeps the epsilon the query's own split gives it at the
    total that split needs (at least that: with a Gaussian pool the total is the fixed point's, a
    hair above the sum of the parts), and the need split never needs a larger total (the query's own
    split is kept when the fixed point does not do better). A Gaussian part's rho is its slice of
    the pool, whose conversion depends on the pool's total: the rule keeps its epsilon, not its rho.

With a fixed total (the risk chooser's prefer='accuracy') the same weights equalise the tolerated
parts' ratios of interval to tolerance (each interval shrinks as its share grows, in the same
proportion for every Laplace part), which is the split of their epsilon that minimises the worst
ratio, the untolerated parts keeping their share: `ratios` gives them at any total.

The selection's need (`GroupNeed`): a group of `units` units, each in at most C_u groups after
contribution bounding, is released with probability at least `probability`. The probability is a
lower bound computed from the mechanism's own law (`group_release_probability`): exact for the
Laplace threshold and the truncated geometric; for the weighted Gaussian and MAD each unit weighs
q_{C_u} (the least weight, as if every unit had C_u groups) and the discrete Gaussian's tail is
bounded below (see `discrete_gaussian_at_least`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from .accounting import part_weights, plan_budget
from .accuracy import _intervals, smallest_epsilon, smallest_meeting, statistic_intervals
from .errors import InvalidQueryError
from .normal_law import normal_sf
from .partition_selection import discrete_laplace_threshold, truncated_geometric_keep_probability
from .release import calibrate
from .selection_damped import damped_weights, rounds_of
from .selection_weighted import gaussian_tail_bound, unit_weights

#: how many fixed-point steps the Gaussian pool's weights may take (each step refines all weights)
FIXED_POINT_STEPS = 8


@dataclass(frozen=True)
class GroupNeed:
    """The selection's need: a group of `units` units released with probability >= `probability`."""

    units: int
    probability: float

    def check(self) -> None:
        if isinstance(self.units, bool) or not isinstance(self.units, int) or self.units < 1:
            raise InvalidQueryError(f"groups.units must be a whole number of units >= 1, got {self.units!r}")
        if isinstance(self.probability, bool) or not isinstance(self.probability, (int, float)) \
                or not 0.0 < self.probability < 1.0:
            raise InvalidQueryError(f"groups.probability must be in (0, 1), got {self.probability!r}")


def group_need(spec, probability: float) -> GroupNeed | None:
    """A GroupNeed from a request's `groups` ({units: N, probability: p}; p defaults to the
    intervals' confidence), a GroupNeed, or None; refuses any other field in one line."""
    if spec is None or isinstance(spec, GroupNeed):
        return spec
    if not isinstance(spec, dict) or "units" not in spec or set(spec) - {"units", "probability"}:
        raise InvalidQueryError(f"groups must be {{units: N, probability: p}} (a group of N units released with "
                                f"probability at least p), got {spec!r}")
    need = GroupNeed(spec["units"], spec.get("probability", probability))
    need.check()
    return need


def discrete_gaussian_at_least(m: float, sigma: float) -> float:
    """A lower bound on P[K >= m], K discrete Gaussian of parameter sigma, m an integer.

    m <= 0: P[K >= m] = 1 - P[K >= 1 - m] (symmetry) >= 1 - Phi_bar(-m / sigma) (gaussian_tail_bound).
    m >= 1: the mass exp(-k^2 / 2 sigma^2) decreases on k >= m, so its sum is at least the integral
    from m, sqrt(2 pi) sigma Phi_bar(m / sigma), and the normaliser is at most 1 + sqrt(2 pi) sigma."""
    if m <= 0:
        return 1.0 - gaussian_tail_bound(1.0 - m, sigma)
    c = math.sqrt(2.0 * math.pi) * sigma
    return c / (1.0 + c) * normal_sf(m / sigma)


def group_release_probability(query, budget, units: int) -> float:
    """A lower bound on the probability that a group of `units` units (each in at most C_u groups
    after bounding) is released by the query's selection with its share in `budget`."""
    share, cu = budget.selection_share, query.effective_max_partitions
    if budget.selection == "truncated-geometric":
        return float(truncated_geometric_keep_probability([units], share.epsilon, share.delta, cu)[0])
    if budget.selection == "laplace-threshold":  # P[n + K >= T], K discrete Laplace as the release draws it
        t = calibrate(quantum=1.0, sensitivity_quanta=1, max_partitions=cu, share=share, noise="laplace",
                      confidence=query.confidence).scale_steps
        q, gap = math.exp(-1.0 / t), discrete_laplace_threshold(share.epsilon, share.delta, cu) - units
        return q**gap / (1.0 + q) if gap > 0 else 1.0 - q ** (1 - gap) / (1.0 + q)
    missed = 1.0
    for k, rnd in enumerate(rounds_of(budget.selection, share, cu, query.epsilon)):
        # MAD: a group not released in round 1 weighs at least as much in round 2 (its units' weight
        # only moves off released groups), and the rounds' noises are independent; damped MAD's
        # round 2 may halve it: a damped group of a unit whose other C_u - 1 are not (m = 4 C_u - 3)
        least = damped_weights(cu)[4 * cu - 4] if k and budget.selection == "mad_damped" else unit_weights(cu)[-1]
        missed *= 1.0 - discrete_gaussian_at_least(rnd["threshold"] - units * least, rnd["sigma"])
    return 1.0 - missed


@dataclass(frozen=True)
class NeedSplit:
    """The split chosen by need: each part's weight, the total it needs, and the reasons."""

    part_weights: tuple[tuple[str, float], ...]  # (part, fraction of the total): 'selection' or a label
    epsilon: float  # the smallest total epsilon at which every need is met with these weights
    equal_epsilon: float  # the same with the query's own split (equal weights by default)
    reasons: tuple[tuple[str, str], ...]  # (part, why it gets its share)

    @property
    def saving(self) -> float:
        """The fraction of the query's own split's total that the need split saves."""
        return 1.0 - self.epsilon / self.equal_epsilon

    def explain(self) -> str:
        """One paragraph for the controller summary and the result's notes."""
        parts = "; ".join(f"{part} {w:.1%} ({why})" for (part, w), (_, why) in zip(self.part_weights, self.reasons))
        return (f"Budget split by need: {parts}. Every need is met at a total epsilon of {self.epsilon:.4g}, "
                f"against {self.equal_epsilon:.4g} with the equal split ({self.saving:.0%} less): each part gets the "
                "share its own tolerance needs, computed with the release's own noise functions.")


def _group_meets(query, groups: GroupNeed | None):
    def meets(q) -> bool:
        return groups is None or group_release_probability(q, plan_budget(q), groups.units) >= groups.probability
    return meets


def need_split(query, tolerances: dict[str, float], groups: GroupNeed | None = None, *, confidence=None,
               integer_columns=None, reference_count: float = 100.0) -> NeedSplit:
    """The weights that meet every tolerance (statistic name -> half-width at `confidence`) and the
    group need with the smallest total epsilon (the module docstring gives the method and the rule
    for the parts given no tolerance)."""
    kw = {"confidence": confidence, "integer_columns": integer_columns, "reference_count": reference_count}
    if groups is not None:
        groups.check()
        if not query.private_partitions:
            raise InvalidQueryError("a group need applies to partition selection: this query selects no groups "
                                    "(no GROUP BY, or public partitions); drop `groups`")
    equal = needed_epsilon(query, tolerances, groups, **kw)
    labels = [a.label for a in query.aggregates]
    base = plan_budget(replace(query, epsilon=equal))
    name = {f"agg{i}": labels[i] for i in range(len(labels))} | {"selection": "selection"}
    reused = {labels[i] for i in base.reused}
    needs: dict[str, list[str]] = {}  # part -> the tolerated statistics released from its share
    for stat in tolerances:
        part = "selection" if stat in reused else stat
        needs.setdefault(part, []).append(stat)
    if groups is not None:
        needs.setdefault("selection", [])
    weights0 = part_weights(query, base.selection is not None, base.reused)
    total0 = sum(weights0.values())
    x = {name[k]: equal * w / total0 for k, w in weights0.items()}  # absolute epsilons, the own split's

    def weighted(xs):
        return replace(query, part_weights=tuple(xs.items()))

    def part_total(xs, part) -> float:
        q = weighted(xs)
        stats = {s: tolerances[s] for s in needs[part]}
        group = _group_meets(q, groups if part == "selection" else None)

        def meets(eps: float) -> bool:
            at = replace(q, epsilon=eps)
            got = {s.name: s.halfwidth for s in _intervals(at, eps, confidence, integer_columns, reference_count,
                                                           stats)} if stats else {}
            return all(got[s] <= t for s, t in stats.items()) and group(at)
        return smallest_meeting(meets, what=f"the need of {part}")

    for _ in range(FIXED_POINT_STEPS):
        total = sum(x.values())
        new = dict(x)
        for part in needs:
            new[part] = x[part] * part_total(x, part) / total
        change = max(abs(new[p] / x[p] - 1.0) for p in needs)
        x = new
        if change < 1e-9:
            break
    found = max(part_total(x, part) for part in needs)
    if found > equal:  # never worse than the query's own split
        x = {name[k]: w / total0 for k, w in weights0.items()}
        found = equal
    total = sum(x.values())
    fractions = tuple((p, w / total) for p, w in x.items())
    reasons = tuple((p, _reason(p, needs, tolerances, groups)) for p in x)
    return NeedSplit(fractions, found, equal, reasons)


def _reason(part, needs, tolerances, groups) -> str:
    if part not in needs:
        return "no tolerance given: the share the equal split gives it"
    asked = [f"+-{tolerances[s]:g}" + (f" on {s}" if s != part else "") for s in needs[part]]
    if part == "selection" and groups is not None:
        asked.append(f"a group of {groups.units} units released with probability >= {groups.probability:g}")
    return "needs " + " and ".join(asked)


def needed_epsilon(query, tolerances: dict[str, float], groups: GroupNeed | None = None, *, confidence=None,
                   integer_columns=None, reference_count: float = 100.0) -> float:
    """The smallest total epsilon at which the query's own split meets every tolerance and the group need."""
    eps = smallest_epsilon(query, tolerances, confidence=confidence, integer_columns=integer_columns,
                           reference_count=reference_count) if tolerances else 0.0
    if groups is None:
        return eps
    group = _group_meets(query, groups)
    return max(eps, smallest_meeting(lambda e: group(replace(query, epsilon=e)), what=_group_text(groups)))


def _group_text(groups: GroupNeed) -> str:
    return f"a group of {groups.units} units released with probability >= {groups.probability:g}"


def ratios(query, split: NeedSplit, tolerances: dict[str, float], total: float, **kw) -> dict[str, float]:
    """Each tolerated statistic's ratio of interval to tolerance at a fixed `total` with the split's
    weights (the worst of them is the smallest any split gives for Laplace parts)."""
    q = replace(query, epsilon=total, part_weights=split.part_weights)
    got = {s.name: s.halfwidth for s in statistic_intervals(q, total, **kw)}
    return {name: got[name] / tol for name, tol in tolerances.items()}


__all__ = ["GroupNeed", "group_need", "NeedSplit", "discrete_gaussian_at_least", "group_release_probability", "need_split",
           "needed_epsilon", "ratios"]
