"""Choosing epsilon from trust, sensitivity and tolerable risk (risk.md; the seed's decision-support
tool for lay data owners). Plain functions of public parameters: no data is read here.

Attacker: knows every record but the target's; the target's sensitive attribute takes one of `n`
values (uniform prior). After `m` outputs the target can change, an epsilon-DP release bounds the
attacker's posterior guessing probability by

    q = 1 / (1 + (n - 1) exp(-m eps dv / df)),

`df` the query's sensitivity and `dv` the largest output difference the attacker considers
possible (dv/df = 1 for categorical data; a histogram has m = 2). Risk = s (1 - t) q, with `s`
the data's sensitivity and `t` the trust in the recipient, all in [0, 1].
"""

from __future__ import annotations

import math
from collections.abc import Set
from dataclasses import dataclass, replace
from typing import Any

from . import display
from .accounting import plan_budget
from .accuracy import StatisticInterval, smallest_epsilon, statistic_intervals
from .errors import InvalidQueryError
from .query import Query
from .split import NeedSplit, group_need, need_split, needed_epsilon

#: the one place where qualitative levels map to numbers (risk.md); a number maps back to the
#: level of its band of width 0.2
LEVELS = {"very low": 0.1, "low": 0.3, "medium": 0.5, "high": 0.7, "very high": 0.9}
#: the largest epsilon offered when the risk never exceeds the tolerance (the PRI grid's largest)
EPSILON_CAP = 10.0


def level_value(level: str | float) -> float:
    """A level name ('high') or a number in [0, 1] as a number."""
    if isinstance(level, str):
        key = level.strip().lower().replace("_", " ")
        if key not in LEVELS:
            raise InvalidQueryError(f"unknown level {level!r}: use one of {list(LEVELS)} or a number in [0, 1]")
        return LEVELS[key]
    if not (isinstance(level, (int, float)) and 0.0 <= level <= 1.0):
        raise InvalidQueryError(f"a level must be in [0, 1], got {level!r}")
    return float(level)


def level_name(x: float) -> str:
    """The level of a number: very low [0, 0.2), low [0.2, 0.4), ..., very high [0.8, 1]."""
    names = list(LEVELS)
    return names[min(int(x / 0.2 + 1e-12), len(names) - 1)] if x >= 0 else names[0]


def risk_words(rk: float, tolerable: float | None = None) -> str:
    """The one way a risk is put in words: its value, its level name only when it is within the
    tolerable risk (a risk above the tolerable one is never called "low"), and the tolerable risk.
    0.14 within 0.2: "0.14 (very low; within your tolerable 0.2)"; 0.31 above 0.2: "0.31 (above
    your tolerable 0.2)"."""
    if tolerable is None:
        return f"{rk:.2f} ({level_name(rk)})"
    if rk > tolerable + 1e-12:
        return f"{rk:.2f} (above your tolerable {tolerable:g})"
    return f"{rk:.2f} ({level_name(rk)}; within your tolerable {tolerable:g})"


def guessing_bound(eps: float, n: int, m: int = 1, dv_over_df: float = 1.0) -> float:
    """Posterior guessing probability bound q after m outputs (uniform prior over n values)."""
    if n < 2:
        raise InvalidQueryError(f"the sensitive attribute needs at least 2 possible values, got n = {n}")
    return 1.0 / (1.0 + (n - 1) * math.exp(-m * eps * dv_over_df))


def guessing_advantage(q: float, n: int) -> float:
    """Normalised advantage (q - 1/n) / (1 - 1/n): 0 nothing learned, 1 full disclosure."""
    return (q - 1.0 / n) / (1.0 - 1.0 / n)


def risk(sensitivity: float, trust: float, q: float) -> float:
    """Data-sharing risk s (1 - t) q."""
    return sensitivity * (1.0 - trust) * q


def laplace_error(eps: float, df: float, p: float) -> float:
    """With probability p, |Laplace noise| <= A = df ln(1 / (1 - p)) / eps."""
    return df * math.log(1.0 / (1.0 - p)) / eps


def laplace_epsilon(error: float, df: float, p: float) -> float:
    """The smallest eps whose Laplace noise stays within `error` with probability p."""
    if error <= 0:
        raise InvalidQueryError(f"the tolerable noise must be > 0, got {error!r}")
    return df * math.log(1.0 / (1.0 - p)) / error


def relative_noise(error: float, outputs: list[float]) -> float:
    """A' = ||(A, ..., A)||_2 / ||y||_2 over all k outputs (the vector definition; the seed's
    shortcut A = A' ||y|| drops a sqrt(k)). Needs the true outputs: controller side only."""
    norm = math.sqrt(sum(y * y for y in outputs))
    return error * math.sqrt(len(outputs)) / norm if norm > 0 else math.inf


def truncated_laplace_bound(eps: float, df: float, delta: float) -> float:
    """Truncated Laplace (Geng et al. 2018), (eps, delta)-DP, 0 < delta < 1/2: the noise never
    exceeds A = (df / eps) ln(1 + (exp(eps) - 1) / (2 delta))."""
    if not 0.0 < delta < 0.5:
        raise InvalidQueryError(f"bounded noise needs 0 < delta < 1/2, got {delta!r}")
    grow = math.expm1(eps) / (2.0 * delta) if eps < 709.0 else math.inf
    if math.isinf(grow):  # past the largest float: ln(1 + (e^eps - 1) / 2d) = eps + ln(e^-eps + (1 - e^-eps) / 2d)
        return df / eps * (eps + math.log(math.exp(-eps) - math.expm1(-eps) / (2.0 * delta)))
    return df / eps * math.log1p(grow)


def truncated_laplace_epsilon(bound: float, df: float, delta: float) -> float:
    """The eps whose truncated-Laplace bound is `bound` (no closed form: bisection on log eps).

    A(eps) decreases from df / (2 delta) (eps -> 0) towards df (eps -> inf), so a bound <= df has
    no solution, and one >= df / (2 delta) allows any eps: both are refused with the reason."""
    if bound <= df:
        raise InvalidQueryError(
            f"a noise bound of {bound:g} is at most the sensitivity {df:g}: no epsilon achieves it with bounded noise"
        )
    if bound >= df / (2.0 * delta):
        raise InvalidQueryError(f"a noise bound of {bound:g} is above df / (2 delta): any epsilon meets it")
    lo, hi = -40.0, 10.0  # log eps
    for _ in range(200):
        mid = (lo + hi) / 2.0
        if truncated_laplace_bound(math.exp(mid), df, delta) > bound:
            lo = mid
        else:
            hi = mid
    return math.exp(hi)


def per_output_delta(delta: float, m: int) -> float:
    """delta' = 1 - (1 - delta)^(1/m): each of m outputs, so that all m hold with 1 - delta."""
    return -math.expm1(math.log1p(-delta) / m)


def check_attacker(n: int, m: int, dv_over_df: float = 1.0) -> None:
    """The attacker model's numbers (risk.md), refused in one line when meaningless: n, the values a
    person's secret can take, a whole number >= 2 (among fewer there is nothing to guess); m, the
    outputs (1: whether a person is in the data; 2: a person's value), a whole number >= 1; dv / df > 0.
    (n = 0 or m = 0 in a request once ended in ZeroDivisionError.)"""
    if not (n >= 2 and float(n).is_integer()):
        raise InvalidQueryError(f"n (the values a person's secret can take) must be a whole number >= 2, got {n!r}")
    if not (m >= 1 and float(m).is_integer()):
        raise InvalidQueryError(f"m (what the attacker learns: 1 whether a person is in the data, 2 a person's "
                                f"value) must be a whole number >= 1, got {m!r}")
    if not (dv_over_df > 0 and math.isfinite(dv_over_df)):
        raise InvalidQueryError(f"dv_over_df must be a finite number > 0, got {dv_over_df!r}")


def epsilon_for_risk(max_risk: float, sensitivity: float, trust: float, n: int, m: int = 1,
                     dv_over_df: float = 1.0, cap: float = EPSILON_CAP) -> float | None:
    """The largest eps whose risk stays within max_risk (closed form); None when no eps can
    (max_risk <= s (1 - t) / n: the floor without any release), `cap` when every eps can."""
    check_attacker(n, m, dv_over_df)
    exposure = sensitivity * (1.0 - trust)
    if max_risk <= exposure / n:
        return None
    if max_risk >= exposure:
        return cap
    q_star = max_risk / exposure
    return min(math.log((n - 1) * q_star / (1.0 - q_star)) / (m * dv_over_df), cap)


@dataclass(frozen=True)
class RiskChoice:
    """The chosen epsilon with the numbers that explain it (all public parameters)."""

    epsilon: float
    epsilon_noise: float
    epsilon_risk: float | None
    risk: float
    risk_level: str
    guessing_probability: float
    guessing_advantage: float
    noise_bound: float
    confidence: float
    prefer: str
    summary: str


def choose_epsilon(*, trust: str | float, sensitivity: str | float, max_risk: str | float, max_noise: float, n: int, df: float = 1.0, m: int = 1,
                   p: float = 0.9, dv_over_df: float = 1.0, prefer: str = "privacy", example_value: float = 100.0,
                   bounded_delta: float | None = None) -> RiskChoice:
    """Epsilon from trust, sensitivity, tolerable risk and tolerable (absolute) noise, for ONE
    output of sensitivity df that receives the whole epsilon (the seed's model). A release is a
    plan that splits epsilon: use `choose_epsilon_for_plan` for it.

    Default (the seed's): the most private epsilon that meets the accuracy, eps_noise, checked
    against the risk (eps_noise <= eps_risk). prefer='accuracy' takes eps_risk instead. When the two
    cannot both hold, it refuses and says which tolerance to relax. bounded_delta: use truncated
    Laplace noise (its bound holds always, not with probability p)."""
    t, s, r = level_value(trust), level_value(sensitivity), level_value(max_risk)
    if prefer not in ("privacy", "accuracy"):
        raise InvalidQueryError(f"prefer must be 'privacy' or 'accuracy', got {prefer!r}")
    if not 0.0 < p < 1.0:
        raise InvalidQueryError(f"the confidence p must be in (0, 1), got {p!r}")
    if bounded_delta is not None:
        eps_noise = truncated_laplace_epsilon(max_noise, df, per_output_delta(bounded_delta, m))
    else:
        eps_noise = laplace_epsilon(max_noise, df, p)
    eps_risk = epsilon_for_risk(r, s, t, n, m, dv_over_df)
    if eps_risk is None:
        raise InvalidQueryError(
            f"no epsilon keeps the risk within {r:g}: even without any release the risk is "
            f"s (1 - t) / n = {s * (1 - t) / n:.3g}. Raise the tolerable risk, or share with a more trusted recipient"
        )
    if eps_noise > eps_risk:
        raise InvalidQueryError(
            f"the tolerable noise ({max_noise:g}) needs epsilon >= {display.budget(eps_noise)}, but the tolerable risk "
            f"({r:g}) allows at most {display.budget(eps_risk)}: accept more noise or more risk; nothing is released"
        )
    eps = eps_noise if prefer == "privacy" else eps_risk
    q = guessing_bound(eps, n, m, dv_over_df)
    rk = risk(s, t, q)
    bound = truncated_laplace_bound(eps, df, per_output_delta(bounded_delta, m)) if bounded_delta else laplace_error(eps, df, p)
    summary = (
        f"With epsilon = {display.budget(eps)}, an attacker who knows everyone else's data guesses a person's "
        f"value (one of {n}) with probability at most {q:.0%}; the risk of sharing is "
        f"{risk_words(rk, r)}. For a count of {example_value:g}, the shared value would be between "
        f"{example_value - bound:.3g} and {example_value + bound:.3g}"
        + (" always." if bounded_delta else f" with {p:.0%} probability.")
    )
    return RiskChoice(eps, eps_noise, eps_risk, rk, level_name(rk), q, guessing_advantage(q, n), bound, p, prefer, summary)


# -- the chooser for a whole plan (risk.md, "In this platform") ---------------------------------
#
# The formulas above are for one output of sensitivity df that receives the whole epsilon. A
# release is a plan: epsilon is split over partition selection, inferred bounds and each aggregate
# (and inside an aggregate over its components), and each statistic's noise grows with its
# contribution bounds (C_u partitions, the clamping range). The chooser below asks the plan itself
# (dp_core.accuracy: the same interval functions the reports use) for the smallest total epsilon
# at which every statistic given a tolerance meets it, and checks the risk with that total: the
# whole plan is epsilon-DP for one person's data (every share they touch adds up to it), so the
# attacker's exponent is m * epsilon_total (m = 1 for presence in the data, 2 for a changed value:
# remove then add), never one share's epsilon.


@dataclass(frozen=True)
class PlanRiskChoice:
    """The total epsilon chosen for a plan, the promise it keeps and the risk it carries (all from
    public parameters; `promise` holds every statistic's data-free interval at `epsilon`)."""

    epsilon: float  # total, for the whole plan
    epsilon_noise: float  # the smallest total epsilon that meets the tolerable noise
    epsilon_risk: float  # the largest total epsilon within the tolerable risk
    risk: float
    risk_level: str
    guessing_probability: float
    guessing_advantage: float
    confidence: float
    prefer: str
    tolerances: dict  # statistic name -> tolerable half-width (absolute, at `confidence`)
    promise: tuple  # accuracy.StatisticInterval per aggregate, at `epsilon` and `confidence`
    shares: tuple  # (part, epsilon) of the plan at `epsilon`: what one person can affect, summed
    summary: str
    split: object = None  # split.NeedSplit when the split was chosen by need (its part_weights go to the release)

    def promised(self, name: str) -> StatisticInterval:
        """The promised interval of one statistic (accuracy.StatisticInterval)."""
        return next(s for s in self.promise if s.name == name)


def plan_tolerances(query: Query, max_noise: object, *, headline: str | None = None,
                    reference_value: float = 100.0) -> dict[str, float]:
    """The tolerable half-width per statistic, from the request's `max_noise`.

    max_noise: a number (absolute half-width) or a percentage string ('10%' of `reference_value`,
    the seed's "10% noise on a count of 100" = +-10), for the `headline` statistic (default: the
    first aggregate that has a data-free interval); or a mapping statistic name -> number or
    percentage, each of which must be met."""
    if isinstance(reference_value, bool) or not isinstance(reference_value, (int, float)) \
            or not math.isfinite(reference_value) or reference_value <= 0:
        # a percentage of 0 once read as a bad tolerable noise: "got '10%'"
        raise InvalidQueryError(f"reference_value (what a percentage tolerable noise is a percentage of, and the "
                                f"count the summary's example uses) must be a finite number > 0, got {reference_value!r}")

    def absolute(name: object, value: object) -> float:
        given = value  # a refusal quotes what the request said ('-5%'), not the number it came to
        if isinstance(value, str) and value.strip().endswith("%"):
            try:
                pct = float(value.strip()[:-1])
            except ValueError:
                raise InvalidQueryError(f"tolerable noise of {name!r}: {value!r} is not a percentage") from None
            value = pct / 100.0 * float(reference_value)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
            raise InvalidQueryError(f"the tolerable noise of {name!r} must be a number > 0 or a percentage "
                                    f"such as '10%', got {given!r}")
        return float(value)

    if isinstance(max_noise, dict):
        if not max_noise:
            raise InvalidQueryError("max_noise names no statistic: give {statistic: tolerable noise}")
        return {str(k): absolute(k, v) for k, v in max_noise.items()}
    if headline is None:
        candidates = [s.name for s in statistic_intervals(query, 1.0) if s.promised]
        if not candidates:
            raise InvalidQueryError("no statistic of the query has a data-free interval (count, sum, avg with "
                                    "bounds given): a tolerable noise cannot be promised; fix epsilon instead")
        headline = candidates[0]
    return {headline: absolute(headline, max_noise)}


def choose_epsilon_for_plan(query: Query, *, trust: str | float, sensitivity: str | float, max_risk: str | float,
                            max_noise: object, n: int, m: int = 1,
                            p: float = 0.9, prefer: str = "privacy", headline: str | None = None,
                            reference_value: float = 100.0, reference_count: float | None = None,
                            integer_columns: Set[str] | None = None, dv_over_df: float = 1.0, split: str = "equal",
                            groups: object = None) -> PlanRiskChoice:
    """The total epsilon for the plan `query` (its aggregates, shares, bounds, C_u, selection,
    noise; its own epsilon is ignored) from the tolerable noise and the tolerable risk.

    Default (the seed's): the smallest total epsilon at which every statistic given a tolerance
    has a confidence interval (at confidence p) of at most +-tolerance, checked against the
    largest total epsilon within the risk; prefer='accuracy' takes the latter. When no epsilon
    meets both, nothing is released: the error says which tolerance to relax and by how much.
    reference_count: the group size AVG's interval is stated for (default `reference_value`).
    split: 'equal' (the query's own weights) or 'need' (split.need_split: each part gets what its
    tolerance needs, the plan's weights are replaced by those). groups: the selection's need
    (split.GroupNeed, or {units, probability}), met by either split."""
    t, s, r = level_value(trust), level_value(sensitivity), level_value(max_risk)
    if prefer not in ("privacy", "accuracy"):
        raise InvalidQueryError(f"prefer must be 'privacy' or 'accuracy', got {prefer!r}")
    if not 0.0 < p < 1.0:
        raise InvalidQueryError(f"the confidence p must be in (0, 1), got {p!r}")
    ref_count = float(reference_value if reference_count is None else reference_count)
    tolerances = plan_tolerances(query, max_noise, headline=headline, reference_value=reference_value)
    kw: dict[str, Any] = {"confidence": p, "integer_columns": integer_columns, "reference_count": ref_count}
    query, eps_noise, chosen = _apply_split(query, tolerances, split, groups, kw)
    eps_risk = epsilon_for_risk(r, s, t, n, m, dv_over_df)
    if eps_risk is None:
        raise InvalidQueryError(
            f"no epsilon keeps the risk within {r:g}: even without any release the risk is "
            f"s (1 - t) / n = {s * (1 - t) / n:.3g}. Raise the tolerable risk above that, or share with a more "
            "trusted recipient; nothing is released"
        )
    if eps_noise > eps_risk:
        raise InvalidQueryError(_relax_message(query, tolerances, eps_noise, eps_risk, r, s, t, n, m, dv_over_df, kw))
    eps = eps_noise if prefer == "privacy" else eps_risk
    q = guessing_bound(eps, n, m, dv_over_df)
    rk = risk(s, t, q)
    promise = statistic_intervals(query, eps, **kw)
    budget = plan_budget(replace(query, epsilon=eps))
    shares = tuple((sh.part, sh.epsilon) for sh in budget.shares)
    summary = plan_summary(eps, shares, promise, tolerances, q, rk, n, m, p, reference_value, budget.delta, r)
    if chosen is not None:
        summary += " " + chosen.explain()
    return PlanRiskChoice(eps, eps_noise, eps_risk, rk, level_name(rk), q, guessing_advantage(q, n), p, prefer,
                          tolerances, promise, shares, summary, chosen)


def _apply_split(query: Query, tolerances: dict[str, float], split: str, groups: object,
                 kw: dict[str, Any]) -> tuple[Query, float, NeedSplit | None]:
    """(the query with the chosen split's weights, the smallest total epsilon it needs, the NeedSplit or None)."""
    if split not in ("equal", "need"):
        raise InvalidQueryError(f"split must be 'equal' or 'need', got {split!r}")
    groups = group_need(groups, kw["confidence"])
    if split == "equal":
        return query, (needed_epsilon(query, tolerances, groups, **kw) if groups else
                       smallest_epsilon(query, tolerances, **kw)), None
    chosen = need_split(query, tolerances, groups, **kw)
    return replace(query, part_weights=chosen.part_weights), chosen.epsilon, chosen


def _relax_message(query: Query, tolerances: dict[str, float], eps_noise: float, eps_risk: float, r: float, s: float,
                   t: float, n: int, m: int, dv: float, kw: dict[str, Any]) -> str:
    """Which tolerance to relax, and by how much: the noise the risk allows, or the risk the noise needs."""
    at_risk = {x.name: x for x in statistic_intervals(query, eps_risk, **kw)}
    noise = "; ".join(f"{name} {at_risk[name].halfwidth_text(ascii=True)} (asked +-{tol:g})"
                      for name, tol in tolerances.items())
    needed = risk(s, t, guessing_bound(eps_noise, n, m, dv))
    return (
        f"the tolerable noise ({', '.join(f'{k} +-{v:g}' for k, v in tolerances.items())} at {kw['confidence']:.0%}) "
        f"needs a total epsilon of at least {display.budget(eps_noise)} for this plan, but the tolerable risk ({r:g}) allows at "
        f"most {display.budget(eps_risk)}. Relax one: accept noise of {noise} at {kw['confidence']:.0%} (the noise at epsilon "
        f"{display.budget(eps_risk)}), or accept a risk of {needed:.3g} instead of {r:g} (the risk at epsilon "
        f"{display.budget(eps_noise)}); "
        "nothing is released"
    )


def _num(x: float, integer: bool = False) -> str:
    """A number of a sentence as the pages write it (`display.value`), 'inf' for an infinite one."""
    return display.value(x, integer) if math.isfinite(x) else "inf"


_EXAMPLE = {"count": "a count", "count_units": "a count of people", "sum": "a sum"}


def plan_summary(eps: float, shares: tuple[tuple[str, float], ...], promise: tuple[StatisticInterval, ...],
                 tolerances: dict[str, float], q: float, rk: float, n: int, m: int, p: float,
                 reference_value: float = 100.0, delta: float = 0.0, max_risk: float | None = None) -> str:
    """The controller's plain-words summary: the total epsilon and how the plan spends it, the
    attacker's bound at that total, and each statistic's real noise (the tolerated ones first)."""
    split = ", ".join(f"{part} {display.budget(e)}" for part, e in shares)
    change = "a changed value" if m == 2 else f"{m} output(s)" if m != 1 else "their presence"
    head = (
        f"Epsilon {display.budget(eps)} for the whole plan ({split}); one person's data can affect all of it. An attacker "
        f"who knows everyone else's data guesses a person's value (one of {n}; {change}: exponent {m} x {display.budget(eps)}) "
        f"with probability at most {q:.0%}" + (f" (the bound may fail with probability delta = {delta:.2g})"
                                               if delta > 0 else "")
        + f"; the risk of sharing is {risk_words(rk, max_risk)}."
    )
    ordered = sorted(promise, key=lambda x: (x.name not in tolerances, 0))
    parts = [_statistic_sentence(x, tolerances.get(x.name), p, reference_value) for x in ordered]
    return " ".join([head] + parts)


def _statistic_sentence(x: StatisticInterval, tolerance: float | None, p: float, reference_value: float) -> str:
    asked = f" (tolerance asked: +-{tolerance:g})" if tolerance is not None else ""
    if x.halfwidth is None:
        return f"{x.name}: no interval promised ({x.note})."
    whole = display.is_integer_kind(x.kind)
    h = _num(x.halfwidth, whole)
    if x.kind in _EXAMPLE:
        v = float(reference_value)
        return (f"{x.name} ({x.kind}): {_EXAMPLE[x.kind]} of {v:g} would be released as {v:g} +- {h}, "
                f"i.e. between {_num(v - x.halfwidth, whole)} and {_num(v + x.halfwidth, whole)} with {p:.0%} "
                f"probability{asked}.")
    return (f"{x.name} ({x.kind}): +- {h} with {p:.0%} probability for a group of {x.reference_count:g} people "
            f"(first order; a released mean within the bounds){asked}.")
