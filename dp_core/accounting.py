"""Budget accounting: how a query's (epsilon, delta) is split, and the zCDP conversion.

Basic composition (dp-engine.md "Budget"): the shares of all parts add up to at most the query's
(epsilon, delta). Gaussian aggregates are accounted together in zero-concentrated DP: their pooled
(epsilon, delta) share is converted once to rho, and rho is split between them (zCDP composes by
adding rho; Bun and Steinke, TCC 2016). The conversion is Canonne, Kamath and Steinke's
(`rho_from_eps_delta_tight`), valid for any rho-zCDP mechanism, the discrete Gaussian of any
dimension included; on the peers' L workload (COUNT + SUM, epsilon 1, delta 1e-6, the pool's share
(2/3, 6.7e-7)) its sigma is 16.6% below the simple conversion's (`rho_from_eps_delta`).

Gaussian partition selection (weighted Gaussian, MAD: selection_weighted.py) has two parts: the
Gaussian noise on the weighted histogram (zCDP) and the threshold's failure probability (a plain
delta). Half of the selection's delta goes to each: the Gaussian half converts (with the
selection's epsilon) to the selection's rho with the tighter conversion of Canonne, Kamath and
Steinke (`rho_from_eps_delta_tight`), pooled with the Gaussian aggregates' when the query's
noise is Gaussian (the whole query is then one zCDP budget plus the threshold's delta); the
threshold half is multiplied by e^(-epsilon of the query) before use, which pays for the e^eps
factor of the coupling argument in selection_weighted.py's proof sketch.

The accountant of the Gaussian aggregates' pool (`POOL_ACCOUNTANT`): "pld" by default, the exact
privacy curve of the Gaussian pool (pld_accounting.py: mu-GDP calibration with dp-accounting, and
the discrete Gaussians actually sampled certified exactly by the engine before it draws); on the L
workload's plan its sigma is 22% below the simple zCDP conversion's, 7% below the zCDP pool's.
"zcdp" is the zCDP pool above (the engine's fallback when the certificate fails). Plans with a
Gaussian partition selection keep the zCDP pool (the selection's rounds are pooled with the
aggregates in rho; their exact discrete accounting is not built).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from functools import lru_cache

from .errors import InvalidQueryError
from .pld_accounting import gaussian_delta, gaussian_rho

#: the Gaussian aggregates' pool accountant when the query has no Gaussian selection: "pld" (exact
#: privacy curve, pld_accounting.py) or "zcdp" (Canonne-Kamath-Steinke's conversion); bench/utility.py
#: sets it to compare them
POOL_ACCOUNTANT = "pld"


@dataclass(frozen=True)
class Share:
    """One part's slice of the query budget (epsilon, delta; rho for Gaussian parts)."""

    part: str
    epsilon: float
    delta: float = 0.0
    rho: float | None = None


def rho_from_eps_delta(epsilon: float, delta: float) -> float:
    """Largest rho whose zCDP guarantee implies (epsilon, delta)-DP via
    eps = rho + 2 sqrt(rho ln(1/delta)) (Bun-Steinke 2016, Prop. 1.3):
    rho = (sqrt(ln(1/delta) + eps) - sqrt(ln(1/delta)))^2."""
    if not (epsilon > 0 and 0 < delta < 1):
        raise InvalidQueryError(
            f"a Gaussian mechanism needs epsilon > 0 and 0 < delta < 1, got ({epsilon}, {delta})"
        )
    log_term = math.log(1.0 / delta)
    return (math.sqrt(log_term + epsilon) - math.sqrt(log_term)) ** 2


def zcdp_delta(rho: float, epsilon: float) -> float:
    """A delta with which rho-zCDP implies (epsilon, delta)-DP, by the conversion of Canonne, Kamath
    and Steinke ("The discrete Gaussian for differential privacy", NeurIPS 2020, arXiv 2004.00010,
    their zCDP-to-approximate-DP proposition):

        delta = inf over a > 1 of exp((a - 1)(a rho - epsilon)) / a * (1 - 1/a)^(a - 1).

    Every a > 1 gives a valid delta, so a search that misses the infimum is only loose, never
    wrong. The search: a log-spaced grid, then golden-section refinement around its best point."""
    def log_delta(a: float) -> float:
        return (a - 1.0) * (a * rho - epsilon) + (a - 1.0) * math.log1p(-1.0 / a) - math.log(a)

    grid = [1.0 + 10.0 ** (k / 16.0) for k in range(-96, 113)]  # a - 1 from 1e-6 to ~1e7
    best = min(range(len(grid)), key=lambda k: log_delta(grid[k]))
    lo, hi = grid[max(best - 1, 0)], grid[min(best + 1, len(grid) - 1)]
    golden = (math.sqrt(5.0) - 1.0) / 2.0
    for _ in range(80):
        a1, a2 = hi - golden * (hi - lo), lo + golden * (hi - lo)
        if log_delta(a1) < log_delta(a2):
            hi = a2
        else:
            lo = a1
    return math.exp(min(log_delta(grid[best]), log_delta((lo + hi) / 2.0)))


@lru_cache(maxsize=256)
def rho_from_eps_delta_tight(epsilon: float, delta: float) -> float:
    """The largest rho (to 1e-9 relative) whose zCDP implies (epsilon, delta)-DP by `zcdp_delta`;
    never below `rho_from_eps_delta` (the simple conversion, also valid). At (1/3, 5e-7): 0.00289
    against 0.00189, a Gaussian sigma 19% smaller."""
    simple = rho_from_eps_delta(epsilon, delta)
    lo, hi = simple, max(simple, 1e-12)
    while zcdp_delta(hi * 2.0, epsilon) <= delta and hi < 1e6:
        hi *= 2.0
    hi *= 2.0
    if zcdp_delta(lo, epsilon) > delta:  # the search could not confirm anything above the simple rho
        return simple
    while hi - lo > 1e-9 * lo:
        mid = (lo + hi) / 2.0
        if zcdp_delta(mid, epsilon) <= delta:
            lo = mid
        else:
            hi = mid
    return lo


def eps_from_rho(rho: float, delta: float) -> float:
    """The (epsilon, delta)-DP implied by rho-zCDP: eps = rho + 2 sqrt(rho ln(1/delta))."""
    return rho + 2.0 * math.sqrt(rho * math.log(1.0 / delta))


def split_weights(total: float, weights: dict[str, float]) -> dict[str, float]:
    """Split `total` in proportion to positive weights (equal weights: equal shares)."""
    if not weights:
        return {}
    bad = {k: w for k, w in weights.items() if not (w > 0 and math.isfinite(w))}
    if bad:
        raise InvalidQueryError(f"budget weights must be positive finite numbers, got {bad}")
    norm = sum(weights.values())
    return {k: total * w / norm for k, w in weights.items()}


@dataclass(frozen=True)
class BudgetPlan:
    """A query's budget split: the selection's share, each aggregate's, each component's."""

    selection: str | None  # strategy name; None with public partitions or no GROUP BY
    selection_share: Share | None
    aggregate_shares: dict[int, Share]  # index -> share; absent when reusing the selection count
    component_shares: dict[tuple[int, str], Share]
    reused: frozenset[int]  # COUNT(DISTINCT unit) aggregates released from the selection's count
    bounds_shares: dict[int, Share] = field(default_factory=dict)  # APPROX_BOUNDS, per aggregate
    pool_accountant: str | None = None  # the Gaussian aggregates' pool: "pld", "zcdp", None (no pool)
    certified_delta: float | None = None  # "pld": the sampled discrete Gaussians' delta(eps_g), set by the engine

    @property
    def selection_budget(self) -> Share:
        """The partition selection's share: a plan whose `selection` names a strategy has one."""
        if self.selection_share is None:
            raise RuntimeError(f"the budget plan has no share for its selection {self.selection!r}")
        return self.selection_share

    @property
    def shares(self) -> tuple[Share, ...]:
        top = [self.selection_share] if self.selection_share else []
        bounds = [self.bounds_shares[i] for i in sorted(self.bounds_shares)]
        return tuple(top + bounds + [self.aggregate_shares[i] for i in sorted(self.aggregate_shares)])

    @property
    def epsilon(self) -> float:
        return sum(s.epsilon for s in self.shares)

    @property
    def delta(self) -> float:
        return sum(s.delta for s in self.shares)

    @property
    def gaussian_pool(self) -> tuple[Share, ...]:
        """The Gaussian aggregates' shares (the pool; a Gaussian selection's share is not in it)."""
        return tuple(s for s in self.shares if s.rho is not None and s is not self.selection_share)

    def pool_figures(self) -> tuple[float, float, float]:
        """The pool's (epsilon_g, delta_g, rho_g)."""
        pool = self.gaussian_pool
        return sum(s.epsilon for s in pool), sum(s.delta for s in pool), sum(s.rho for s in pool)

    def with_zcdp_pool(self) -> BudgetPlan:
        """The same plan, every share kept, with the Gaussian aggregates' pool converted by the zCDP
        accountant instead (`rho_from_eps_delta_tight`): each pooled share's rho scaled by the new
        pool's rho over the old. The release's fallback when the "pld" certificate refuses: the plan
        may already have been spent on (APPROX_BOUNDS' shares), so it is never made again."""
        if self.pool_accountant != "pld":
            return self
        eps_g, delta_g, rho_g = self.pool_figures()
        factor = _share_rho(rho_from_eps_delta_tight, eps_g, delta_g) / rho_g if rho_g > 0 else 0.0

        def scaled(shares: dict) -> dict:
            return {k: replace(s, rho=s.rho * factor) if s.rho is not None else s for k, s in shares.items()}

        return replace(self, aggregate_shares=scaled(self.aggregate_shares), component_shares=scaled(self.component_shares),
                       pool_accountant="zcdp", certified_delta=None)

    @property
    def accountant(self) -> str:
        """Which accounting certifies the plan's (epsilon, delta), with its figures, in words for the release."""
        if self.pool_accountant == "pld":
            eps_g, delta_g, rho_g = self.pool_figures()
            mu = math.sqrt(2.0 * rho_g)
            certified = ("" if self.certified_delta is None else
                         f"; the discrete Gaussians sampled, accounted exactly: delta {self.certified_delta:.3g}")
            return (f"privacy loss distributions (dp-accounting) for the Gaussian aggregates: together {mu:.6g}-GDP "
                    f"(mu^2 = 2 rho adds up), whose exact delta at epsilon {eps_g:.6g} is {gaussian_delta(mu, eps_g):.3g}"
                    f"{certified}, within their delta {delta_g:.3g}; basic composition with the other parts")
        if any(s.rho is not None for s in self.shares):
            return ("zCDP for the Gaussian parts (rho adds up; converted to (epsilon, delta) by Canonne, Kamath "
                    "and Steinke 2020), basic composition with the other parts")
        return "basic composition (the epsilons and deltas of the parts add up)"


def _share_rho(convert, epsilon: float, delta: float) -> float:
    """rho of a share of a positive epsilon; 0 (infinite noise, refused as pure noise by
    noise_floor.py and release.add_noise) when the share underflowed to 0 (a weight of 1e-300)."""
    return convert(epsilon, delta) if epsilon > 0 else 0.0


GAUSSIAN_SELECTIONS = ("weighted_gaussian", "mad")  # the selections of selection_weighted.py


def _gaussian_selection_share(eps: dict, dlt: dict, weights: dict, gaussian: set, rho_pool: float | None):
    """The selection's share when it is Gaussian: rho from its epsilon and half its delta, pooled
    with the Gaussian aggregates when there are any (returns the share and the aggregates' new
    rho pool; the pool's rho is split in proportion to the weights, the selection's included)."""
    if not gaussian:
        return Share("partition selection", eps["selection"], dlt["selection"],
                     _share_rho(rho_from_eps_delta_tight, eps["selection"], dlt["selection"] / 2.0)), rho_pool
    pool = gaussian | {"selection"}
    total = _share_rho(rho_from_eps_delta_tight, sum(eps[k] for k in pool),
                                     sum(dlt[k] for k in gaussian) + dlt["selection"] / 2.0)
    pool_w = sum(weights[k] for k in pool)
    sel_rho = total * weights["selection"] / pool_w
    # the aggregates keep rho_pool * w / gauss_w: give them the pool's rest in the same proportions
    aggregates_rho = total - sel_rho
    return Share("partition selection", eps["selection"], dlt["selection"], sel_rho), aggregates_rho


def part_weights(query, selection: bool, reused=frozenset()) -> dict[str, float]:
    """Each part's weight ('selection', 'agg<i>'): the aggregates' weights and selection_weight, or
    the query's part_weights where it names the part (by 'selection' or the aggregate's label)."""
    given = dict(query.part_weights)
    weights = {f"agg{i}": given.get(a.label, a.weight) for i, a in enumerate(query.aggregates) if i not in reused}
    if selection:
        weights["selection"] = given.get("selection", query.selection_weight)
    return weights


COMPONENTS = {"count": ("count",), "count_units": ("count",), "sum": ("sum",), "avg": ("N", "S"),
              "var": ("N", "S", "Q"), "stddev": ("N", "S", "Q"), "quantile": ("quantile",)}


def plan_budget(query, accountant: str | None = None) -> BudgetPlan:
    """Split (epsilon, delta) between partition selection and the aggregates (dp-engine.md, "Budget").

    Epsilon: in proportion to weights (selection_weight, each aggregate's weight, or the query's
    part_weights; equal by default, which is PipelineDP's split; split.py chooses them by need).
    Delta: between the parts that need it (selection, Gaussian
    aggregates), in proportion to the same weights. Inside an aggregate the share is split equally
    between its components (AVG: N, S; VAR/STDDEV: N, S, Q). Gaussian aggregates pool their
    (epsilon, delta), convert once to rho, and split rho: by the exact Gaussian curve
    (`pld_accounting.gaussian_rho`) with accountant "pld" (default: POOL_ACCOUNTANT), by
    `rho_from_eps_delta_tight` with "zcdp" and whenever the selection is Gaussian. An aggregate
    whose bounds are inferred gives `bounds_fraction` (default half) of its epsilon to APPROX_BOUNDS.
    """
    aggs = query.aggregates
    selection = None
    if query.private_partitions:
        selection = query.selection
        if selection == "auto":
            only_units = all(a.kind == "count_units" for a in aggs)
            selection = "laplace-threshold" if only_units else "truncated-geometric"
    reused = frozenset(
        i for i, a in enumerate(aggs) if a.kind == "count_units" and selection == "laplace-threshold"
    )
    weights = part_weights(query, selection is not None, reused)
    eps = split_weights(query.epsilon, weights)
    bounds_eps = {}
    for i, a in enumerate(aggs):
        if i not in reused and a.needs_bounds:
            bounds_eps[i] = eps[f"agg{i}"] * query.bounds_fraction
            eps[f"agg{i}"] -= bounds_eps[i]
    gaussian = {f"agg{i}" for i, a in enumerate(aggs) if query.noise == "gaussian" and a.kind != "quantile"} & set(weights)
    needs_delta = gaussian | ({"selection"} if selection else set())
    dlt = split_weights(query.delta, {k: weights[k] for k in needs_delta})
    rho_pool = None
    pool_accountant = None
    if gaussian:
        pool_accountant = "zcdp" if selection in GAUSSIAN_SELECTIONS else (accountant or POOL_ACCOUNTANT)
        if pool_accountant not in ("pld", "zcdp"):
            raise InvalidQueryError(f"unknown accountant {pool_accountant!r}: use 'pld' or 'zcdp'")
        convert = gaussian_rho if pool_accountant == "pld" else rho_from_eps_delta_tight
        rho_pool = _share_rho(convert, sum(eps[k] for k in gaussian), sum(dlt[k] for k in gaussian))
        gauss_w = sum(weights[k] for k in gaussian)

    sel_share = Share("partition selection", eps["selection"], dlt["selection"]) if selection else None
    if selection in GAUSSIAN_SELECTIONS:
        sel_share, rho_pool = _gaussian_selection_share(eps, dlt, weights, gaussian, rho_pool)
    agg_shares: dict[int, Share] = {}
    comp_shares: dict[tuple[int, str], Share] = {}
    for i, a in enumerate(aggs):
        if i in reused:
            continue
        key = f"agg{i}"
        rho = rho_pool * weights[key] / gauss_w if key in gaussian else None
        share = Share(a.label, eps[key], dlt.get(key, 0.0), rho)
        agg_shares[i] = share
        parts = COMPONENTS[a.kind]
        for c in parts:
            comp_shares[(i, c)] = Share(
                f"{a.label}.{c}", share.epsilon / len(parts), share.delta / len(parts),
                rho / len(parts) if rho is not None else None,
            )
    bounds = {i: Share(f"bounds of {aggs[i].label}", e) for i, e in bounds_eps.items()}
    return BudgetPlan(selection, sel_share, agg_shares, comp_shares, reused, bounds, pool_accountant)
