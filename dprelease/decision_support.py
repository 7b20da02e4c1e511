"""The DPP tool's numbers (the decision-support seed, risk.md): for a request and a controller's
trust, sensitivity, tolerable risk and tolerable noise, the total epsilon the release would choose,
the noise-against-risk curve, the trust x sensitivity risk surface, every statistic's interval and
the share of groups released, all from public facts (the plan, its bounds, C_u, the split; never
the data, nor the escrow key).

The chosen epsilon is the release's own: the request is rewritten with `epsilon: {risk: {...}}` and
chosen by `pipeline.choose_epsilon_from_risk` (dp_core.risk.choose_epsilon_for_plan, for the whole
plan), the function the release flow calls, with the dataset's integer columns; the intervals are
its promise (dp_core.accuracy.statistic_intervals at the release's confidence p), which the report
delivers to the last bit for counts and sums. So the page, the controller summary and the signed
reports show one set of numbers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

import dp_core as dp
from dp_core import accuracy, display, risk
from dp_core.accounting import plan_budget
from dp_core.selection_keep import keep_probability

from . import pipeline
from .requests import ReleaseRequest
from .store import StoreError

#: the epsilons the noise-against-risk curve is drawn at (log-spaced; risk.md's usual range)
CURVE_EPSILONS = tuple(float(x) for x in np.geomspace(0.01, risk.EPSILON_CAP, 61))
#: the trust and sensitivity grid of the 3D surface (the seed's [0, 1] scales)
SURFACE_STEPS = tuple(round(x, 2) for x in np.linspace(0.0, 1.0, 21))
#: the group sizes the selection's keep probability is given for
GROUP_SIZES = (1, 2, 3, 4, 5, 6, 8, 10, 12, 15, 20, 25, 30, 40, 50, 60, 80, 100, 150, 200, 300, 500, 1000)


class ToolError(dp.DPError):
    """A slider value, a request or a what-if the tool cannot use: one line saying which and why."""


@dataclass(frozen=True)
class Sliders:
    """What the controller chose on the page (risk.md's parameters; levels are numbers in [0, 1])."""

    trust: float
    sensitivity: float
    max_risk: float
    max_noise: float  # the tolerable half-width of `headline` at confidence p
    n: int = 2  # values the target's sensitive attribute can take
    m: int = 1  # 1: presence in the data; 2: a changed value (a histogram)
    p: float = 0.9  # the intervals' confidence, the report's when the risk model chooses epsilon
    headline: str | None = None

    @classmethod
    def from_json(cls, body: dict) -> Sliders:
        """The page's values, checked: each number in its range, or ToolError naming the field."""
        def number(name, low, high, default=None):
            value = body.get(name, default)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
                    or not low <= value <= high:
                raise ToolError(f"{name} must be a number from {low:g} to {high:g}, got {value!r}")
            return float(value)

        levels = [number(name, 0, 1) for name in ("trust", "sensitivity", "max_risk")]
        noise = body.get("max_noise")
        if isinstance(noise, bool) or not isinstance(noise, (int, float)) or not (math.isfinite(noise) and noise > 0):
            raise ToolError(f"max_noise must be a number > 0 (the tolerable half-width), got {noise!r}")
        n, m = number("n", 2, 1e9, 2), number("m", 1, 2, 1)
        if n != int(n) or m != int(m):
            raise ToolError("n and m must be whole numbers (n >= 2 values, m 1 or 2)")
        p = number("p", 0.5, 0.999, 0.9)
        headline = body.get("headline") or None
        return cls(*levels, float(noise), int(n), int(m), p, str(headline) if headline is not None else None)

    def risk_fields(self, headline: str) -> dict:
        """The request's `epsilon: {risk: {...}}` for these values (what "use this epsilon" writes)."""
        return {"trust": self.trust, "sensitivity": self.sensitivity, "max_risk": self.max_risk,
                "max_noise": self.max_noise, "n": self.n, "m": self.m, "p": self.p, "headline": headline}


def with_risk(request: ReleaseRequest, risk_fields: dict) -> ReleaseRequest:
    """The request with its epsilon chosen by the risk model from `risk_fields`."""
    return replace(request, epsilon=None, epsilon_mode="risk", pri={}, risk=dict(risk_fields))


def planned(platform: pipeline.Platform, request: ReleaseRequest) -> pipeline.Plan:
    """The request's plan, as the release makes it (no data read); ToolError with the release's words."""
    try:
        return pipeline.plan(platform, request)
    except (dp.DPError, StoreError, ValueError, KeyError) as err:
        raise ToolError(str(err).splitlines()[0] if str(err) else repr(err)) from None


def headlines(platform: pipeline.Platform, request: ReleaseRequest) -> list[str]:
    """The statistics a tolerable noise can be asked of (those with a data-free interval)."""
    plan = planned(platform, request)
    return [s.name for s in accuracy.statistic_intervals(plan.query, 1.0) if s.promised]


def interval_rows(intervals) -> list[dict]:
    """Each statistic's interval as the page shows it: the number, its written form, a note."""
    rows = []
    for s in intervals:
        integer = display.is_integer_kind(s.kind)
        finite = s.halfwidth is not None and math.isfinite(s.halfwidth)
        rows.append({"name": s.name, "kind": s.kind, "halfwidth": s.halfwidth if finite else None,
                     "written": display.halfwidth(s.halfwidth, integer) if s.halfwidth is not None else "—",
                     "confidence": s.confidence, "epsilon": s.epsilon, "mechanism": s.mechanism,
                     "reference_count": s.reference_count, "note": s.note or (s.describe(ascii=False) if s.promised else "")})
    return rows


def selection_curve(query: dp.Query, epsilon: float) -> dict:
    """The share of groups released as a function of their size (people after bounding)."""
    strategy, p, note = keep_probability(query, epsilon, GROUP_SIZES)
    half = None if p is None else next((n for n, x in zip(GROUP_SIZES, p) if x >= 0.5), None)
    return {"strategy": strategy, "sizes": list(GROUP_SIZES), "keep": None if p is None else [float(x) for x in p],
            "note": note, "half_from": half}


def numbers(platform: pipeline.Platform, request: ReleaseRequest, sliders: Sliders,
            whatif: dict | None = None) -> dict:
    """Everything the page shows for these slider values (see the module's docstring)."""
    base = planned(platform, request)
    ints = pipeline.integer_columns(platform.store.get_dataset(request.dataset))
    names = [s.name for s in accuracy.statistic_intervals(base.query, 1.0) if s.promised]
    if not names:
        raise ToolError("no statistic of this request has a data-free interval (count, sum, or avg with bounds): "
                        "the risk model cannot promise a noise; fix epsilon instead")
    headline = sliders.headline if sliders.headline in names else names[0]
    chosen_request = with_risk(request, sliders.risk_fields(headline))
    plan = planned(platform, chosen_request)
    t, s = sliders.trust, sliders.sensitivity

    def halfwidth_at(eps: float) -> float:
        return next(x.halfwidth for x in accuracy.statistic_intervals(plan.query, eps, integer_columns=ints)
                    if x.name == headline)

    def risk_at(eps: float) -> float:
        return risk.risk(s, t, risk.guessing_bound(eps, sliders.n, sliders.m))

    out = {"headline": headline, "headlines": names, "confidence": sliders.p, "tolerable": sliders.max_risk,
           "curve": {"epsilon": list(CURVE_EPSILONS), "noise": [halfwidth_at(e) for e in CURVE_EPSILONS],
                     "risk": [risk_at(e) for e in CURVE_EPSILONS]},
           }
    drawn = [h for h in out["curve"]["noise"] if 0 < h < math.inf]
    out["noise_range"] = [min(drawn), max(drawn)] if drawn else [sliders.max_noise, sliders.max_noise]
    try:
        decision = pipeline.choose_epsilon_from_risk(platform, plan)
        choice = decision.risk_choice
        eps, feasible, message = choice.epsilon, True, ""
        summary, promise, shares = choice.summary, choice.promise, choice.shares
        out.update(epsilon_noise=choice.epsilon_noise, epsilon_risk=choice.epsilon_risk, explanation=decision.explanation)
    except pipeline.ReleaseError as err:
        feasible, message = False, str(err)
        try:  # the point the tolerable noise needs, drawn above the line
            eps = accuracy.smallest_epsilon(plan.query, {headline: sliders.max_noise}, integer_columns=ints)
        except dp.InvalidQueryError:
            eps = None
        summary, promise, shares = message, (), ()
        if eps is not None:
            promise = accuracy.statistic_intervals(plan.query, eps, integer_columns=ints)
            shares = tuple((sh.part, sh.epsilon) for sh in plan_budget(replace(plan.query, epsilon=eps)).shares)
        out.update(epsilon_noise=eps, epsilon_risk=risk.epsilon_for_risk(sliders.max_risk, s, t, sliders.n, sliders.m))
    bounds = {a.label: [a.lower, a.upper] for a in plan.query.aggregates
              if a.kind in ("sum", "avg") and a.lower is not None and a.upper is not None}
    rows = [{**row, "bounds": bounds.get(row["name"])} for row in interval_rows(promise)]
    out.update(feasible=feasible, message=message, epsilon=eps, summary=summary,
               epsilon_written=None if eps is None else display.budget(eps),
               shares=[{"part": part, "epsilon": e, "written": display.budget(e)} for part, e in shares],
               intervals=rows, risk_fields=sliders.risk_fields(headline),
               levels={name: risk.level_name(getattr(sliders, name)) for name in ("trust", "sensitivity", "max_risk")})
    if eps is not None:
        rk = risk_at(eps)
        q = risk.guessing_bound(eps, sliders.n, sliders.m)
        out.update(point={"noise": halfwidth_at(eps), "risk": rk}, risk=rk, risk_level=risk.level_name(rk),
                   guessing_probability=q, selection=selection_curve(plan.query, eps),
                   surface={"trust": list(SURFACE_STEPS), "sensitivity": list(SURFACE_STEPS),
                            "risk": [[risk.risk(sv, tv, q) for tv in SURFACE_STEPS] for sv in SURFACE_STEPS]})
        if whatif:
            out["whatif"] = what_if(plan.query, eps, whatif, ints)
    return out


def what_if(query: dp.Query, epsilon: float, changes: dict, integer_columns) -> dict:
    """The intervals and the selection curve at the same epsilon if C_u, an aggregate's bounds or
    the split (the selection's weight) were changed: {max_partitions, bounds: {name: [lo, hi]},
    selection_weight}. Only shown: the request is not changed by it."""
    q = query
    try:
        if changes.get("max_partitions") is not None:
            cu = changes["max_partitions"]
            if isinstance(cu, bool) or not isinstance(cu, int) or cu < 1:
                raise ToolError(f"C_u (groups per person) must be a whole number >= 1, got {cu!r}")
            q = replace(q, max_partitions_contributed=cu)
        if changes.get("selection_weight") is not None:
            w = changes["selection_weight"]
            if isinstance(w, bool) or not isinstance(w, (int, float)) or not (math.isfinite(w) and w > 0):
                raise ToolError(f"the selection's weight in the split must be a number > 0, got {w!r}")
            q = replace(q, selection_weight=float(w))
        bounds = changes.get("bounds") or {}
        aggs = list(q.aggregates)
        for name, pair in bounds.items():
            at = next((i for i, a in enumerate(aggs) if a.label == name), None)
            if at is None:
                raise ToolError(f"the what-if names {name!r}, which is not a statistic of the request")
            if not (isinstance(pair, list) and len(pair) == 2 and all(isinstance(x, (int, float)) for x in pair)):
                raise ToolError(f"the bounds of {name!r} must be two numbers [lower, upper]")
            aggs[at] = replace(aggs[at], lower=float(pair[0]), upper=float(pair[1]))
        q = replace(q, aggregates=tuple(aggs))
        intervals = accuracy.statistic_intervals(q, epsilon, integer_columns=integer_columns)
    except dp.InvalidQueryError as err:
        raise ToolError(f"what-if: {err}") from None
    return {"intervals": interval_rows(intervals), "selection": selection_curve(q, epsilon),
            "max_partitions": q.max_partitions_contributed, "selection_weight": q.selection_weight}


def defaults(platform: pipeline.Platform, request: ReleaseRequest) -> dict:
    """The sliders' starting values: the request's own risk fields, else the dataset's registered
    risk profile (risk.md), the headline's noise at epsilon 1 (or the request's fixed epsilon)."""
    import json

    plan = planned(platform, request)
    profile = json.loads(platform.store.get_dataset(request.dataset).risk_json or "{}")
    given = dict(request.risk) if request.epsilon_mode == "risk" else {}
    r = {**profile, **given}
    names = [s.name for s in accuracy.statistic_intervals(plan.query, 1.0) if s.promised]
    headline = r.get("headline") if r.get("headline") in names else (names[0] if names else None)
    ints = pipeline.integer_columns(platform.store.get_dataset(request.dataset))
    eps = request.epsilon or 1.0
    p = float(r.get("p", 0.9))
    noise = r.get("max_noise") if isinstance(r.get("max_noise"), (int, float)) else None
    if noise is None and headline is not None:
        noise = next(x.halfwidth for x in accuracy.statistic_intervals(plan.query, eps, confidence=p,
                                                                      integer_columns=ints) if x.name == headline)
    return {"trust": risk.level_value(r.get("trust", "low")), "sensitivity": risk.level_value(r.get("sensitivity", "medium")),
            "max_risk": risk.level_value(r.get("max_risk", 0.2)), "max_noise": noise, "n": int(r.get("n", 2)),
            "m": int(r.get("m", 2 if plan.query.group_by else 1)), "p": p, "headline": headline, "headlines": names}


def analyst_preview(platform: pipeline.Platform, request: ReleaseRequest, analyst: str) -> dict:
    """What an analyst's request would get, before it is submitted: the epsilon it asks for (or the
    risk model's choice), within the largest their policy allows, and every statistic's interval at
    the request's confidence. Data-free; nothing here is derived from the data."""
    plan = planned(platform, request)
    mine = [p for p in platform.store.all_policies(request.dataset) if p.analyst in (None, analyst)]
    limit = max((p.max_epsilon_per_release for p in mine), default=None)
    note = ""
    if request.epsilon_mode == "fixed" and request.epsilon is not None:
        eps = pipeline.statement_epsilon(platform, plan, request.epsilon) if plan.sql else request.epsilon
    elif request.epsilon_mode == "risk":
        try:
            eps = pipeline.choose_epsilon_from_risk(platform, plan).epsilon
        except pipeline.ReleaseError as err:
            raise ToolError(str(err)) from None
    else:
        eps, note = limit, "epsilon is chosen when the release runs: shown at your policy's largest epsilon"
    if eps is None:
        raise ToolError("give an epsilon (your dataset has no policy that says how much a release may spend)")
    if limit is not None and eps > limit * (1 + 1e-12):
        note = (f"your request asks for epsilon {display.budget(eps)}, above your policy's limit {limit:g} per release (it would be "
                f"refused): shown at {limit:g}")
        eps = limit
    ints = pipeline.integer_columns(platform.store.get_dataset(request.dataset))
    intervals = accuracy.statistic_intervals(plan.query, eps, integer_columns=ints)
    return {"epsilon": eps, "epsilon_written": display.budget(eps), "limit": limit, "note": note,
            "confidence": plan.query.confidence, "intervals": interval_rows(intervals),
            "selection": selection_curve(plan.query, eps)}
