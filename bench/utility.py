"""Utility benchmark (issue 39, `python bench/engine.py --utility`): what a release says at a given
budget, for the L workload and Adult, per accountant, split and selection, beside PipelineDP.

Measured (medians over SEEDS runs of the real engine, one run of the script): groups released and
each statistic's median interval half-width. Data-free (no noise drawn, so no seeds): the intervals
under each accountant of the Gaussian pool (simple zCDP, Canonne-Kamath-Steinke, privacy loss
distributions), and the total epsilon the risk chooser needs for the
demo's tolerances under the equal and the need split.

PipelineDP's figures are computed from its documented parameters, without running it (it is not a
dependency): its naive budget accountant gives each of the three mechanisms (partition selection,
COUNT, SUM) epsilon / 3 and the whole delta to the selection when the noise is Laplace; its COUNT
adds Laplace noise of scale b = C_u * max_contributions_per_partition / (epsilon / 3), its SUM of
scale C_u * max(|lower|, |upper|) / (epsilon / 3) (per-partition bounds on the unit's sum), and its
confidence half-width is b ln(1 / alpha); its partition selection (truncated geometric, Desfontaines
et al.) keeps a partition of n units with the same p(n) as this engine's default, so its expected
number of groups is the sum of p(n) over the benchmark's partitions (the engine's default is
measured on the same file).
"""

from __future__ import annotations

import math
import time
from dataclasses import replace

import numpy as np
import pandas as pd

import dp_core as dp
from dp_core import accounting, accuracy, risk
from dp_core.partition_selection import truncated_geometric_keep_probability
from dp_core.split import GroupNeed, need_split, needed_epsilon

SEEDS = 5
SELECTIONS = ("truncated-geometric", "weighted_gaussian", "mad", "mad_damped")


def l_query(cu: int, row_bound: int, sum_bound: int, epsilon: float, delta: float, **kw) -> dp.Query:
    return dp.Query([dp.count(upper=row_bound, name="count"), dp.sum_("val", 0, sum_bound, name="sum")],
                    privacy_unit="uid", group_by=("part",), epsilon=epsilon, delta=delta,
                    max_partitions_contributed=cu, **kw)


def pipelinedp_l(n_units: np.ndarray, cu: int, row_bound: int, sum_bound: int, epsilon: float, delta: float,
                 confidence: float = 0.95) -> dict:
    """PipelineDP's groups (expected) and 95% half-widths at these parameters (module docstring)."""
    share = epsilon / 3.0
    alpha = 1.0 - confidence
    return {"groups": float(truncated_geometric_keep_probability(n_units, share, delta, cu).sum()),
            "count": cu * row_bound / share * math.log(1.0 / alpha),
            "sum": cu * sum_bound / share * math.log(1.0 / alpha)}


def run_l(path, cu: int, row_bound: int, sum_bound: int, epsilon: float, delta: float, seeds: int = SEEDS) -> None:
    """Groups and intervals per selection (Laplace noise, the engine's default), medians over seeds."""
    runs = {s: {"groups": [], "count": [], "sum": [], "time": []} for s in SELECTIONS}
    for seed in range(seeds):
        for sel in SELECTIONS:  # interleaved: the machine's load hits every selection alike
            start = time.perf_counter()
            result = dp.execute(l_query(cu, row_bound, sum_bound, epsilon, delta, selection=sel), path)
            runs[sel]["time"].append(time.perf_counter() - start)
            runs[sel]["groups"].append(len(result.table))
            for stat in ("count", "sum"):
                half = (result.table[f"{stat}_ci_high"] - result.table[stat]).to_numpy()
                runs[sel][stat].append(float(np.median(half)) if half.size else float("nan"))
            print(f"  seed {seed} {sel:20s} groups {len(result.table):6,d}  {runs[sel]['time'][-1]:6.1f} s", flush=True)
    pdp = pipelinedp_l(bounded_units(path, cu), cu, row_bound, sum_bound, epsilon, delta)
    base = float(np.median(runs["truncated-geometric"]["groups"]))
    print(f"L workload, Laplace noise, epsilon {epsilon}, delta {delta:g}, C_u {cu} (medians over {seeds} seeds; "
          "95% half-widths):")
    for sel in SELECTIONS:
        m = {k: float(np.median(v)) for k, v in runs[sel].items()}
        print(f"  {sel:20s} groups {m['groups']:7,.0f} ({m['groups'] / base:.2f}x)  COUNT +-{m['count']:.4g}  "
              f"SUM +-{m['sum']:.4g}  release {m['time']:.1f} s")
    print(f"  PipelineDP (computed)  groups {pdp['groups']:7,.0f} (expected: its truncated geometric on the bounded "
          f"units)  COUNT +-{pdp['count']:.4g}  SUM +-{pdp['sum']:.4g}")


def bounded_units(path, cu: int) -> np.ndarray:
    """Distinct units per partition after keeping C_u partitions per unit at random (as PipelineDP
    and this engine bound contributions before selecting)."""
    sql = (f"WITH p AS (SELECT DISTINCT uid, part FROM read_parquet('{path}')), b AS (SELECT part, row_number() "
           f"OVER (PARTITION BY uid ORDER BY hash(uid, part, 11)) AS rn FROM p) SELECT count(*) AS n FROM b "
           f"WHERE rn <= {cu} GROUP BY part")
    return _quiet_duckdb().sql(sql).fetchnumpy()["n"].astype(np.float64)


def _quiet_duckdb():
    import duckdb

    con = duckdb.connect()
    con.execute("SET enable_progress_bar = false")
    return con


def accountants_l(cu: int, row_bound: int, sum_bound: int, epsilon: float, delta: float) -> None:
    """The Gaussian pool's COUNT and SUM half-widths under each accountant, side by side (data-free):
    the simple zCDP conversion (before 2026-11-29), Canonne-Kamath-Steinke's (the zCDP pool), and the
    exact privacy curve (privacy loss distributions, the default since 2026-11-29)."""
    q = l_query(cu, row_bound, sum_bound, epsilon, delta, noise="gaussian")
    saved = accounting.POOL_ACCOUNTANT, accounting.rho_from_eps_delta_tight
    figures = {}
    try:
        for name, pool, convert in (("simple zCDP", "zcdp", accounting.rho_from_eps_delta),
                                    ("Canonne-Kamath-Steinke zCDP", "zcdp", saved[1]),
                                    ("PLD (exact curve)", "pld", saved[1])):
            accounting.POOL_ACCOUNTANT, accounting.rho_from_eps_delta_tight = pool, convert
            figures[name] = {s.name: s for s in accuracy.statistic_intervals(q)}
    finally:
        accounting.POOL_ACCOUNTANT, accounting.rho_from_eps_delta_tight = saved
    print("L workload, Gaussian noise (data-free, 95% half-widths), per accountant of the Gaussian pool:")
    for stat in ("count", "sum"):
        simple = figures["simple zCDP"][stat].scale
        print(f"  {stat:6s} " + ";  ".join(
            f"{name} +-{f[stat].halfwidth:.4g} (sigma {f[stat].scale:.4g}, {1 - f[stat].scale / simple:.1%} below simple)"
            for name, f in figures.items()))


DEMO_RISK = {"trust": "low", "sensitivity": "high", "max_risk": 0.2, "n": 16, "m": 2, "p": 0.9}
DEMO_TOLERANCES = {"people": 10, "average_age": 6, "weekly_hours": 8}
DEMO_GROUPS = {"units": 100, "probability": 0.9}


def adult_query(epsilon: float = 1.0, **kw) -> dp.Query:
    """The demo's query (cli/demo.py SQL) as a Query: ANON_COUNT(*, 1), two ANON_AVGs, by education."""
    return dp.Query([dp.count(upper=1, name="people"), dp.avg("age", 17, 90, name="average_age"),
                     dp.avg("hours_per_week", 1, 99, name="weekly_hours")], privacy_unit="person_id",
                    group_by=("education",), epsilon=epsilon, delta=1e-6, confidence=0.9, **kw)


def run_adult(adult: pd.DataFrame, seeds: int = SEEDS) -> None:
    """The demo's tolerances: total epsilon per split, then the release at the need split's epsilon."""
    q = adult_query()
    groups_need = GroupNeed(DEMO_GROUPS["units"], DEMO_GROUPS["probability"])
    eq = needed_epsilon(q, DEMO_TOLERANCES, groups_need, confidence=0.9)
    chosen = need_split(q, DEMO_TOLERANCES, groups_need, confidence=0.9)
    need = chosen.epsilon
    print(f"Adult, the demo's tolerances ({DEMO_TOLERANCES}, a group of 100 released with 90%; risk model "
          f"{DEMO_RISK}):")
    print(f"  total epsilon needed: equal split {eq:.4g}, need split {need:.4g} ({1 - need / eq:.1%} less); the risk "
          f"allows {risk.epsilon_for_risk(0.2, 0.7, 0.3, 16, 2):.4g}")
    weights = chosen.part_weights
    for split, eps, w in (("equal", eq, ()), ("need", need, weights)):
        halves: dict[str, list] = {k: [] for k in DEMO_TOLERANCES}
        groups = []
        for _ in range(seeds):
            result = dp.execute(replace(q, epsilon=eps, part_weights=w), adult)
            groups.append(len(result.table))
            big = result.table["people"] >= 100
            for k in DEMO_TOLERANCES:
                half = (result.table[f"{k}_ci_high"] - result.table[f"{k}_ci_low"]) / 2.0
                halves[k].append(float(half[big].max()))
        print(f"  {split} split at epsilon {eps:.4g}: groups {np.median(groups):.0f}; widest 90% half-width in a group "
              "of >= 100: " + ", ".join(f"{k} +-{np.median(v):.4g} (asked {DEMO_TOLERANCES[k]})"
                                        for k, v in halves.items()))
    share = need / 4.0
    print(f"  PipelineDP (computed, equal split of the need split's epsilon {need:.4g}): COUNT +-"
          f"{1 / share * math.log(10):.4g} at 90% (Laplace b = 1 / (epsilon / 4)); it has no split by need")


def selection_levers(path, cu: int, epsilon: float, delta: float) -> None:
    """Issue 39's levers for twice the groups, as expected numbers of groups on L (no noise drawn:
    each partition's release probability from its weighted count W_i after bounding, one weighting;
    MAD's round 2 by simulation of round 1, 3 draws; the noise as continuous Gaussian, which the
    discrete Gaussian at sigma ~ 10^6 weight steps matches to far below these digits). The selection
    keeps its third of epsilon and the whole delta (Laplace aggregates). Not a mechanism of the engine:
    the analytic Gaussian (Balle and Wang, ICML 2018) is exact for the *continuous* Gaussian only, and
    policy Gaussian (Gopi et al. 2020) is a sequential pass over units; both are here to size them.
    Damped MAD (the engine's `mad_damped`) is sized under today's zCDP calibration, the analytic one
    and a plan-level privacy-loss-distribution accountant (`plan_pld_mu`), none of them built for it."""
    from dp_core.normal_law import normal_sf
    from dp_core.selection_weighted import WEIGHT_ONE, gaussian_threshold

    sql = (f"WITH p AS (SELECT DISTINCT uid, part FROM read_parquet('{path}')), b AS (SELECT uid, part, row_number() "
           f"OVER (PARTITION BY uid ORDER BY hash(uid, part, 7)) AS rn FROM p) SELECT uid, part FROM b "
           f"WHERE rn <= {cu} ORDER BY uid")
    pairs = _quiet_duckdb().sql(sql).fetchnumpy()
    uid, part = pairs["uid"].astype(np.int64), pairs["part"].astype(np.int64)
    parts = int(part.max()) + 1
    degree = np.bincount(uid)[uid]
    weight = np.bincount(part, weights=1.0 / np.sqrt(degree), minlength=parts)
    eps = epsilon / 3.0
    base = truncated_geometric_keep_probability(np.bincount(part, minlength=parts).astype(float), eps, delta, cu).sum()
    sf = np.vectorize(normal_sf)
    rng = np.random.default_rng(1)  # a simulation of round 1's outcome for the estimate, not a release

    def pass_at(sigma: float, delta_new: float) -> float:
        return gaussian_threshold(sigma * WEIGHT_ONE, delta_new, cu) / WEIGHT_ONE

    def expected(sigma_of, gaussian_fraction: float, round_one: float) -> tuple[float, float]:
        delta_new = delta * (1 - gaussian_fraction) * math.exp(-epsilon)
        sigma = sigma_of(eps, delta * gaussian_fraction)
        t = pass_at(sigma, delta_new)
        wg = float(sf((t - weight) / sigma).sum())
        s1, s2 = sigma / math.sqrt(round_one), sigma / math.sqrt(1 - round_one)
        t1, t2 = pass_at(s1, delta_new / 2), pass_at(s2, delta_new / 2)
        mads = []
        for _ in range(3):
            first = weight + rng.normal(0.0, s1, parts) >= t1
            left = ~first[part]
            r = np.bincount(uid, weights=left.astype(float))[uid]
            w2 = np.bincount(part[left], weights=1.0 / np.sqrt(r[left]), minlength=parts)
            mads.append(first.sum() + float(np.where(first, 0.0, sf((t2 - w2) / s2)).sum()))
        return wg / base, float(np.mean(mads)) / base

    def zcdp(e, d):
        return 1.0 / math.sqrt(2.0 * accounting.rho_from_eps_delta_tight(e, d))

    def analytic(e, d):  # the smallest sigma with Balle-Wang's exact delta(sigma) <= d, sensitivity 1
        lo, hi = 0.1, 1e4
        for _ in range(200):
            mid = (lo + hi) / 2.0
            exact = (1 - normal_sf(1 / (2 * mid) - e * mid)) - math.exp(e) * (1 - normal_sf(-1 / (2 * mid) - e * mid))
            lo, hi = (mid, hi) if exact > d else (lo, mid)
        return hi

    print(f"Selection levers on L (expected groups / truncated geometric's {base:,.0f}; C_u {cu}, selection epsilon "
          f"{eps:.4g}, delta {delta:g}):")
    for name, sigma_of in (("zCDP (today)", zcdp), ("analytic Gaussian", analytic)):
        for g in (0.2, 0.5, 0.8):
            for r1 in ((0.03, 0.08, 0.15) if g == 0.5 else (0.08,)):
                wg, mad = expected(sigma_of, g, r1)
                print(f"  {name:18s} delta to the noise {g:.0%}, round 1 {r1:.0%}: weighted Gaussian {wg:.2f}x, "
                      f"MAD {mad:.2f}x")
    sigma = zcdp(eps, delta / 2)
    starts = np.searchsorted(uid, np.arange(int(uid.max()) + 2))
    order = rng.permutation(int(uid.max()) + 1)

    def policy(sig: float, t: float, released: np.ndarray) -> float:
        """Expected groups of policy Gaussian's l2 descent to T + 3 sigma over the groups not yet released."""
        cutoff, h = t + 3 * sig, np.zeros(parts)
        for u in order:
            ps = part[starts[u]:starts[u + 1]]
            ps = ps[~released[ps]]
            v = np.maximum(cutoff - h[ps], 0.0)
            norm = math.sqrt(float(v @ v))
            if norm > 0:
                h[ps] += v / max(norm, 1.0)
        return float(released.sum() + np.where(released, 0.0, sf((t - h) / sig)).sum())

    alone = policy(sigma, pass_at(sigma, delta / 2 * math.exp(-epsilon)), np.zeros(parts, dtype=bool))
    print(f"  policy Gaussian (cutoff T + 3 sigma, zCDP sigma): {alone / base:.2f}x")
    s1, s2 = sigma / math.sqrt(0.08), sigma / math.sqrt(0.92)
    delta_new = delta / 4 * math.exp(-epsilon)
    first = weight + rng.normal(0.0, s1, parts) >= pass_at(s1, delta_new)
    print(f"  MAD round 1 (8%) then policy Gaussian on the rest: {policy(s2, pass_at(s2, delta_new), first) / base:.2f}x")

    def damped(sig: float, delta_t: float) -> float:
        """Expected groups of damped MAD (dp_core/selection_damped.py) at total sigma `sig`."""
        from dp_core import selection_damped as sd

        s1, s2 = sig / math.sqrt(sd.DAMPED_ROUND_ONE_SHARE), sig / math.sqrt(1 - sd.DAMPED_ROUND_ONE_SHARE)
        t1 = pass_at(s1, delta_t * sd.DAMPED_ROUND_ONE_DELTA)
        t2 = gaussian_threshold(s2 * WEIGHT_ONE, delta_t * (1 - sd.DAMPED_ROUND_ONE_DELTA), cu,
                                sd.lone_unit_damped_weights(cu)) / WEIGHT_ONE
        seen = weight + rng.normal(0.0, s1, parts)
        first = seen >= t1
        g = np.where(seen >= t2 + sd.DAMPING_CUT_SIGMAS * s1, 0.5, 1.0)[part] * ~first[part]
        w2 = np.bincount(part, weights=g / np.sqrt(np.bincount(uid, weights=g * g)[uid].clip(1e-30)), minlength=parts)
        return float(first.sum() + np.where(first, 0.0, sf((t2 - w2) / s2)).sum())

    delta_t = delta / 2 * math.exp(-eps)
    print(f"  damped MAD (built: selection='mad_damped'), zCDP: {damped(sigma, delta_t) / base:.2f}x; with the analytic "
          f"calibration: {damped(analytic(eps, delta / 2), delta_t) / base:.2f}x")
    plan_sigma = 1.0 / plan_pld_mu(eps, epsilon, 0.6 * delta)
    print(f"  damped MAD, the selection's Gaussian composed with the two Laplace aggregates by their privacy loss "
          f"distributions (sigma {plan_sigma:.4g} against {sigma:.4g}; 60% of delta to it): "
          f"{damped(plan_sigma, 0.4 * delta * math.exp(-eps)) / base:.2f}x")


def plan_pld_mu(laplace_epsilon: float, epsilon: float, delta: float, bins: int = 4000) -> float:
    """The largest mu for which a mu-GDP Gaussian composed with two Laplace mechanisms of epsilon
    `laplace_epsilon` each (the L release's COUNT and SUM, their 1-D dominating pair) is (epsilon,
    delta)-DP, by their privacy loss distributions: delta(eps) = E[delta_G(eps - L)] over the
    Laplace pair's loss L (atoms +-e_a with masses 1/2 and e^-e_a / 2, a density between), with the
    Gaussian's exact delta_G(x) = Phi(-x/mu + mu/2) - e^x Phi(-x/mu - mu/2) (Balle and Wang 2018). A
    sizing of a plan-level accountant, not the engine's: the losses are rounded up to the grid."""
    from dp_core.normal_law import normal_sf

    e_a = laplace_epsilon
    x = (np.arange(bins) + 0.5) / bins  # the noise's position inside the shift, loss e_a (1 - 2x)
    losses = np.concatenate([[e_a, -e_a], e_a * (1 - 2 * x)])
    masses = np.concatenate([[0.5, math.exp(-e_a) / 2], e_a * np.exp(-e_a * x) / 2 / bins])
    grid = np.linspace(-e_a, e_a, 2 * bins + 1)
    single = np.bincount(np.searchsorted(grid, losses - 1e-12), weights=masses, minlength=grid.size)
    pair = np.convolve(single, single)
    pair_losses = np.linspace(-2 * e_a, 2 * e_a, pair.size)
    sf = np.vectorize(normal_sf)

    def delta_at(mu: float) -> float:
        rest = epsilon - pair_losses
        return float((pair * (sf(rest / mu - mu / 2) - np.exp(rest) * sf(rest / mu + mu / 2))).sum())

    lo, hi = 1e-3, 5.0
    for _ in range(50):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if delta_at(mid) <= delta else (lo, mid)
    return lo


def run(path, adult: pd.DataFrame, cu: int, row_bound: int, sum_bound: int, epsilon: float, delta: float,
        seeds: int = SEEDS) -> None:
    """The whole utility benchmark, in one run (the module docstring)."""
    accountants_l(cu, row_bound, sum_bound, epsilon, delta)
    run_adult(adult, seeds)
    run_l(path, cu, row_bound, sum_bound, epsilon, delta, seeds)
    selection_levers(path, cu, epsilon, delta)
