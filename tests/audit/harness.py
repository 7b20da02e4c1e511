"""Empirical DP audit: many runs of the real release on two neighbouring datasets, and a lower
confidence bound on the epsilon those runs reveal.

What runs end to end, and what is fixed (docs/privacy.md, "Empirical audit"):
- The data-dependent part of a release is deterministic once the bounding key is fixed: the
  engine's `exact_statistics` (check, bound, clamp, aggregate in DuckDB) runs ONCE per dataset,
  with the same `bounding_seed` on both neighbours.
- The random part runs R times through the product's own `engine.release` (partition selection,
  noise, quantile mechanism, finishing of AVG/VAR, per-partition-bound groups), vectorised by
  tiling: the per-partition exact rows are repeated R times under an extra key `_run`, and one call
  releases all R copies. Every mechanism draws independently per partition, so the R copies are R
  independent releases.
- APPROX_BOUNDS: the exact histograms come from the product's statement
  (`engine.exact_bounds_histograms`) once per dataset; the noise is the product's `add_noise` as
  `dp_core.bounds` calls it, on R tiled copies; bins above the product's `discrete_threshold` give
  the bounds. The reading rule is restated here (first and last bin above the threshold), and a
  conformance check runs the real `infer_bounds` on recorded noise and requires the same bounds:
  a release whose bins do not follow its noisy counts fails the audit.

The estimator: event search on a training half (threshold events on each output coordinate and on
an aligned sum of coordinates, both neighbour orders), then on the test half one Clopper-Pearson
bound per side: eps_lb = ln((p_lower(E | D1) - delta) / p_upper(E | D2)). Reported at 99%
(each side at 0.5%); the CI gate uses 1 - 1e-7 (each side 5e-8), so a sound mechanism fails with
probability below 1e-7 whatever its true loss, and every broken variant must still be caught.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field, replace

import numpy as np
import pandas as pd
from scipy import stats

import dp_core.bounds as bounds_module
from dp_core import aggregates, bounding, engine, selection_damped, selection_mad
from dp_core.accounting import plan_budget
from dp_core.backend import DuckDBBackend
from dp_core.query import Query

REPORT_ALPHA = 0.005  # each side: the pair holds at 99%
GATE_ALPHA = 5e-8  # each side: the pair holds at 1 - 1e-7
TRAIN_ALPHA = GATE_ALPHA  # ranks events on the training half as the gate will judge them (favours events with mass)
CHUNK = 50_000  # releases tiled into one engine call
#: the bounding key, fixed for both neighbours; with it the star (C_u = 2) keeps one existing
#: partition (p0) and one that only it has (n2), so values and selection are both stressed
SEED = 1


@dataclass(frozen=True)
class AuditResult:
    """One audit: what was claimed, what the runs show, on how many samples."""

    name: str
    claimed_epsilon: float
    delta: float
    runs: int  # per dataset (half for training, half for testing)
    lower_bound_99: float
    lower_bound_gate: float
    event: str
    notes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def violated(self) -> bool:
        return self.lower_bound_gate > self.claimed_epsilon

    def line(self) -> str:
        return (f"{self.name}: claimed eps {self.claimed_epsilon:.4g} (delta {self.delta:.2g}); lower bound "
                f"{self.lower_bound_99:.3f} at 99% ({self.lower_bound_gate:.3f} at 1-1e-7), {self.runs:,} runs per "
                f"dataset; event {self.event}")


# ---------------------------------------------------------------------------------------------
# sampling the release
# ---------------------------------------------------------------------------------------------


def exact_rows(query: Query, data, seed: int = SEED) -> engine.ExactStatistics:
    """The deterministic, data-dependent part of the release (bounding key fixed). The quantile's
    choice of a unit's row uses DuckDB's random(): it is coupled across the neighbours too (one
    thread, a fixed DuckDB seed, D2's extra rows last), so common units read the same rows."""
    backend = data if isinstance(data, DuckDBBackend) else DuckDBBackend.for_input(data, threads=1)
    backend.connection.execute("SET threads = 1").fetchall()
    backend.connection.execute(f"SELECT setseed({(seed % 1000) / 1000.0})").fetchall()
    return engine.exact_statistics(query, backend, bounding_seed=seed, budget=plan_budget(query))


def tile(rows: pd.DataFrame, runs: int) -> pd.DataFrame:
    """`rows` repeated `runs` times, run by run, under a leading `_run` column."""
    tiled = rows.iloc[np.tile(np.arange(len(rows)), runs)].reset_index(drop=True)
    tiled.insert(0, "_run", np.repeat(np.arange(runs), len(rows)))
    return tiled


def tiled_release(stats: engine.ExactStatistics, runs: int, tiled: pd.DataFrame | None = None) -> pd.DataFrame:
    """R independent releases of these exact rows through `engine.release`, as one table with
    a `_run` column (partitions not selected in a run are absent from it). `tiled`: the R copies
    already made (MAD, whose rows differ per run)."""
    query = stats.query
    budget = plan_budget(query)
    if tiled is None:
        tiled = tile(stats.rows, runs)
    tiled_query = replace(query, group_by=("_run", *query.group_by))
    real_bounds, real_halfwidth = engine._released_bounds, aggregates.sum_halfwidth
    if not stats.bounds:  # it would return () anyway, after a per-row Python loop over R copies
        engine._released_bounds = lambda bounds, kept, keys: ()
    # ratio CIs (AVG, VAR) are post-processing of the noisy values and public scales, and their
    # bisection would dominate the run time: not audited, replaced by 0 while sampling
    aggregates.sum_halfwidth = lambda noise, weights, alpha: np.zeros(len(weights))
    try:
        result = engine.release(tiled_query, stats.plan, budget, tiled, stats.bounds)
    finally:
        engine._released_bounds, aggregates.sum_halfwidth = real_bounds, real_halfwidth
    return result.table


def differing_partitions(s1: engine.ExactStatistics, s2: engine.ExactStatistics) -> list[tuple]:
    """Partitions whose exact rows differ between the neighbours (or exist in one only). The
    others have the same output law on both sides and are independent of these (every mechanism
    draws per partition), so they cannot change any event's probability ratio: leaving them out
    loses nothing and saves time."""
    cols = list(s1.query.group_by)
    if not cols:
        return [()]
    compared = [c for c in s1.rows.columns if c not in cols and c != "_dropped_pairs"]

    def table(s):
        return {tuple(r[:len(cols)]): tuple(map(repr, r[len(cols):]))
                for r in s.rows[cols + compared].itertuples(index=False)}

    t1, t2 = table(s1), table(s2)
    return sorted([k for k in set(t1) | set(t2) if t1.get(k) != t2.get(k)], key=repr)


def restrict(stats: engine.ExactStatistics, keys: list[tuple]) -> engine.ExactStatistics:
    cols = list(stats.query.group_by)
    if not cols:
        return stats
    wanted = set(keys)
    mask = np.array([tuple(r) in wanted for r in stats.rows[cols].itertuples(index=False)], dtype=bool)
    return replace(stats, rows=stats.rows.loc[mask].reset_index(drop=True))


def features(table: pd.DataFrame, query: Query, keys: list[tuple], runs: int) -> tuple[np.ndarray, list[str]]:
    """(runs, partitions x aggregates) matrix of released values, NaN where not released."""
    labels = [a.label for a in query.aggregates]
    key_cols = list(query.group_by)
    out = np.full((runs, len(keys) * len(labels)), np.nan)
    names = [f"{k}:{label}" for k in keys for label in labels]
    if key_cols:
        index = pd.MultiIndex.from_tuples(keys, names=key_cols)
        part = index.get_indexer(pd.MultiIndex.from_frame(table[key_cols])).astype(np.int64)
    else:
        part = np.zeros(len(table), dtype=np.int64)
    runs_col = table["_run"].to_numpy()
    ok = part >= 0
    for j, label in enumerate(labels):
        out[runs_col[ok], part[ok] * len(labels) + j] = table[label].to_numpy(dtype=np.float64)[ok]
    return out, names


def partition_keys(*all_stats: engine.ExactStatistics) -> list[tuple]:
    keys: set[tuple] = set()
    for s in all_stats:
        cols = list(s.query.group_by)
        if not cols:
            return [()]
        keys |= {tuple(r) for r in s.rows[cols].itertuples(index=False)}
    return sorted(keys, key=repr)


def release_samples(query: Query, d1, d2, runs: int) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """Released values of `runs` releases on each neighbour (same feature layout)."""
    s1, s2 = exact_rows(query, d1), exact_rows(query, d2)
    keys = differing_partitions(s1, s2)
    r1, r2 = restrict(s1, keys), restrict(s2, keys)
    names = features(tiled_release(r1, 1), s1.query, keys, 1)[1]
    x1 = np.vstack([features(tiled_release(r1, n), s1.query, keys, n)[0] for n in chunks(runs)])
    x2 = np.vstack([features(tiled_release(r2, n), s2.query, keys, n)[0] for n in chunks(runs)])
    return x1, x2, names


def mad_release_samples(query: Query, d1, d2, runs: int) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """MaxAdaptiveDegree (and its damped form): round 1's noise is drawn in the data engine step (its
    outcome decides round 2's weights, computed by SQL), so the engine's exact rows carry ONE round-1
    draw. Each run needs its own: round 1 is drawn per run with the product's `first_round` on the
    tiled `_w1` (released and damped partitions), and each distinct round-1 outcome gets its round-2
    weights from the product's `round_two_sql` on the dataset's own connection (`round_two_weights`,
    once per outcome: memoised); then `engine.release` runs round 2, the noise and the rest on the
    R copies. Features are the differing partitions' values (a marginal of the output: a valid lower
    bound); all partitions are released, since round 2's weights of one partition depend on the
    others' round-1 outcomes."""
    budget = plan_budget(query)
    share, cu = budget.selection_share, query.effective_max_partitions
    sides = []
    for data in (d1, d2):
        backend = DuckDBBackend.for_input(data, threads=1)
        close, backend.close = backend.close, lambda: None  # kept open for round 2's SQL
        try:
            stats = engine.exact_statistics(query, backend, bounding_seed=SEED, budget=budget)
            base = stats.rows.drop(columns=["_mad_r1", "_w2"])
            with_clause = bounded_with_clause(backend, stats.plan, cu)
            memo: dict[tuple, np.ndarray] = {}
            out = []
            for n in chunks(runs):
                tiled = tile(base, n)
                r1, damped = (a.reshape(n, len(base)) for a in selection_damped.first_round(
                    tiled["_w1"].to_numpy(dtype=np.int64), query.selection, share, cu, query.epsilon))
                # each run's outcome as one row of 2 x partitions flags; its distinct rows and, per run, which
                seen, which = np.unique(np.hstack([r1, damped]).astype(bool), axis=0, return_inverse=True)
                outcomes = [(tuple(np.flatnonzero(row[:len(base)])), tuple(np.flatnonzero(row[len(base):])))
                            for row in seen]
                new = [o for o in outcomes if o not in memo]
                memo.update(zip(new, round_two_weights(backend, query, base, with_clause, new)))
                tiled["_mad_r1"] = r1.ravel()
                tiled["_w2"] = np.vstack([memo[o] for o in outcomes])[which.reshape(-1)].ravel()
                out.append(tiled_release(stats, n, tiled))
            sides.append((stats, out))
        finally:
            close()
    keys = differing_partitions(sides[0][0], sides[1][0])
    names = features(sides[0][1][0].iloc[:0], sides[0][0].query, keys, 0)[1]
    x1, x2 = (np.vstack([features(t, stats.query, keys, n)[0] for t, n in zip(out, chunks(runs))])
              for stats, out in sides)
    return x1, x2, names


def bounded_with_clause(backend: DuckDBBackend, plan, cu: int) -> str:
    """The plan's WITH clause over its bounded rows made once (a temp table), as the product's
    `mad_rows` does (same seed: the same rows): what round 2's statements run on."""
    at = next(i for i, cte in enumerate(plan.ctes) if cte.startswith("_bounded AS ("))
    backend.connection.execute("CREATE TEMP TABLE _audit_bounded AS WITH "
                               f"{', '.join(plan.ctes[: at + 1])} SELECT * FROM _bounded")
    return "WITH " + ",\n".join(["_bounded AS (SELECT * FROM _audit_bounded)", bounding.cut_from_bounded_cte(cu),
                                  *plan.ctes[at + 1:]])


def round_two_weights(backend: DuckDBBackend, query: Query, base: pd.DataFrame, with_clause: str,
                      outcomes: list[tuple[tuple, tuple]]) -> list[np.ndarray]:
    """Round 2's weights, aligned with `base`'s rows, for each round-1 outcome (the row positions
    released, the row positions damped): the product's `round_two_sql` of each outcome, its rows
    read back as plain tuples and matched to `base` by key (a pandas frame, a merge and key lookups
    through .loc per outcome were most of the audit's time; batching the statements by UNION ALL
    gained nothing measurable). No partition released or damped: round 2 weighs as round 1 (`_w1`),
    as the product does; a partition absent from an outcome's result (released in round 1) weighs 0."""
    keys = list(query.group_by)
    schema = backend.schema()
    key_rows = [tuple(bounding._plain(v) for v in row) for row in base[keys].itertuples(index=False)]
    weights = []
    for chosen in outcomes:
        released, damped = ([key_rows[i] for i in rows] for rows in chosen)
        if not released and not damped:
            weights.append(base["_w1"].to_numpy(dtype=np.int64))
            continue
        sql = selection_mad.round_two_sql(with_clause, query, released, schema, damped_keys=damped)
        by_key = {tuple(bounding._plain(v) for v in key): w2
                  for *key, w2 in backend.connection.execute(sql).fetchall()}
        weights.append(np.array([by_key.get(k, 0) for k in key_rows], dtype=np.int64))
    return weights


def chunks(runs: int, size: int = CHUNK) -> list[int]:
    """Run counts of at most `size` adding up to `runs` (bounded memory for long runs)."""
    return [size] * (runs // size) + ([runs % size] if runs % size else [])


# ---------------------------------------------------------------------------------------------
# APPROX_BOUNDS
# ---------------------------------------------------------------------------------------------


def exact_histograms(query: Query, data, index: int, seed: int = SEED) -> tuple[dict, bool, bool]:
    """The exact log-histogram(s) APPROX_BOUNDS noises for aggregate `index`: {partition key (or
    ()): {(neg, e): n}}, from the engine's own statement (`engine.exact_bounds_histograms`)."""
    backend = DuckDBBackend.for_input(data)
    try:
        schema = backend.schema()
        integer_columns = engine.check_columns(query, schema)
        counts, integer, signed = engine.exact_bounds_histograms(query, backend, schema, integer_columns, seed)[index]
        keys = list(query.group_by) if query.bounds_scope == "partition" else []
        out: dict = {}
        for r in counts.itertuples(index=False):
            d = r._asdict()
            out.setdefault(tuple(d[k] for k in keys), {})[(bool(d["neg"]), int(d["e"]))] = int(d["n"])
        return out, integer, signed
    finally:
        backend.close()


def read_bounds(noisy: np.ndarray, threshold: int) -> tuple[np.ndarray, np.ndarray]:
    """First and last bin index above the threshold per row (-1 where none: no bounds)."""
    above = noisy > threshold
    anyone = above.any(axis=1)
    first = np.where(anyone, above.argmax(axis=1), -1)
    last = np.where(anyone, above.shape[1] - 1 - above[:, ::-1].argmax(axis=1), -1)
    return first, last


def bounds_value(layout, first: int, last: int, integer: bool) -> tuple[float, float]:
    """(lower, upper) as `infer_bounds` states them for these bins."""
    lower, upper = layout[first][2], layout[last][3]
    if integer:
        upper = upper - 1.0 if upper > 0 else upper
        lower = lower + 1.0 if lower < 0 else lower
    return lower, upper


def bounds_samples(query: Query, index: int, hists: dict, keys: list, integer: bool, signed: bool,
                   runs: int) -> np.ndarray:
    """(runs, 2 x partitions): first and last bin above the threshold (-1: none), R releases."""
    return np.vstack([_bounds_chunk(query, index, hists, keys, integer, signed, n) for n in chunks(runs)])


def _bounds_chunk(query: Query, index: int, hists: dict, keys: list, integer: bool, signed: bool,
                  runs: int) -> np.ndarray:
    share = plan_budget(query).bounds_shares[index]
    cu = query.effective_max_partitions
    layout = bounds_module.bin_layout(integer, signed)
    exact = np.array([[hists.get(k, {}).get((neg, e), 0) for neg, e, _, _ in layout] for k in keys], dtype=np.int64)
    noisy = bounds_module.add_noise(np.tile(exact.ravel(), runs), target="audit", quantum=1.0, sensitivity_quanta=1,
                                    max_partitions=cu, share=share, noise="laplace", confidence=0.95).values
    noisy = noisy.reshape(runs * len(keys), len(layout))
    k = bounds_module.discrete_threshold(share.epsilon, cu, len(layout), query.bounds_failure)
    first, last = read_bounds(noisy, k)
    return np.stack([first.reshape(runs, len(keys)), last.reshape(runs, len(keys))], axis=2).reshape(runs, -1).astype(float)


def check_bounds_conformance(query: Query, index: int, hists: dict, integer: bool, signed: bool,
                             calls: int = 100) -> None:
    """The real `infer_bounds`, run `calls` times with its noise recorded, must give the bounds
    that its noisy counts give under the reading rule (bins follow the noisy counts)."""
    share = plan_budget(query).bounds_shares[index]
    cu = query.effective_max_partitions
    layout = bounds_module.bin_layout(integer, signed)
    k = bounds_module.discrete_threshold(share.epsilon, cu, len(layout), query.bounds_failure)
    agg = query.aggregates[index]
    real_add_noise = bounds_module.add_noise
    recorded = []

    def recording_add_noise(*args, **kwargs):
        out = real_add_noise(*args, **kwargs)
        recorded.append(np.array(out.values))
        return out

    bounds_module.add_noise = recording_add_noise
    try:
        for hist in list(hists.values())[:3]:
            for _ in range(calls):
                recorded.clear()
                try:
                    got = bounds_module.infer_bounds(
                        hist, label=agg.label, integer=integer, signed=signed, share=share, max_partitions=cu,
                        failure=query.bounds_failure, need_lower=agg.kind != "count" and agg.lower is None,
                        need_upper=agg.upper is None)
                except bounds_module.BoundsError:
                    got = None
                assert len(recorded) == 1, "infer_bounds must draw its histogram noise exactly once"
                first, last = read_bounds(recorded[0][None, :], k)
                if first[0] < 0:
                    assert got is None, "bounds released although no noisy bin is above the threshold"
                    continue
                assert got is not None, "no bounds although a noisy bin is above the threshold"
                lower, upper = bounds_value(layout, int(first[0]), int(last[0]), integer)
                if got.lower is not None:
                    assert got.lower == lower, f"lower bound {got.lower} does not follow the noisy counts ({lower})"
                if got.upper is not None:
                    assert got.upper == upper, f"upper bound {got.upper} does not follow the noisy counts ({upper})"
                assert np.array_equal(np.array(got.noisy_counts), recorded[0]), "published counts are not the noisy ones"
    finally:
        bounds_module.add_noise = real_add_noise


# ---------------------------------------------------------------------------------------------
# the estimator
# ---------------------------------------------------------------------------------------------


def _cp_lower(k, n, alpha):
    k = np.asarray(k, dtype=np.float64)
    return np.where(k > 0, stats.beta.ppf(alpha, np.maximum(k, 1), n - k + 1), 0.0)


def _cp_upper(k, n, alpha):
    k = np.asarray(k, dtype=np.float64)
    return np.where(k < n, stats.beta.ppf(1 - alpha, k + 1, np.maximum(n - k, 1)), 1.0)


def _eps_bound(k1, k2, n, delta, alpha):
    with np.errstate(divide="ignore", invalid="ignore"):
        num = _cp_lower(k1, n, alpha) - delta
        return np.where(num > 0, np.log(np.maximum(num, 1e-300) / _cp_upper(k2, n, alpha)), -np.inf)


def _statistics(x: np.ndarray, train1: np.ndarray, train2: np.ndarray) -> tuple[list[np.ndarray], list[str]]:
    """Scalar statistics of each run: every coordinate (absent = below everything), the count of
    present coordinates, and a sum of standardised coordinates signed by the training difference."""
    stats_, names = [], []
    fill_low = -1e300
    both = np.vstack([train1, train2])
    present_any = ~np.isnan(both)
    for j in range(x.shape[1]):
        col = x[:, j]
        if np.all(np.isnan(both[:, j])):
            continue
        stats_.append(np.where(np.isnan(col), fill_low, col))
        names.append(f"coordinate {j}")
    if np.isnan(both).any():
        stats_.append((~np.isnan(x)).sum(axis=1).astype(float))
        names.append("released partitions")
    with warnings.catch_warnings():  # coordinates never released on one side: NaN, left out below
        warnings.simplefilter("ignore", RuntimeWarning)
        m1, m2 = np.nanmean(train1, axis=0), np.nanmean(train2, axis=0)
        sd = np.nanstd(both, axis=0)
    usable = np.isfinite(m1) & np.isfinite(m2) & (sd > 0) & present_any.all(axis=0)
    if usable.sum() > 1:
        sign = np.sign(m2 - m1)
        z = (x[:, usable] - np.nanmean(both[:, usable], axis=0)) / sd[usable]
        stats_.append(np.nansum(z * sign[usable], axis=1))
        names.append("aligned sum")
    return stats_, names


def estimate(name: str, x1: np.ndarray, x2: np.ndarray, claimed: float, delta: float,
             notes: tuple[str, ...] = ()) -> AuditResult:
    """Event search on the first half of the runs, Clopper-Pearson on the second half."""
    runs = min(len(x1), len(x2))
    half = runs // 2
    t1, t2, v1, v2 = x1[:half], x2[:half], x1[half:runs], x2[half:runs]
    n_test = runs - half
    all1, names = _statistics(np.vstack([t1, v1]), t1, t2)
    all2, _ = _statistics(np.vstack([t2, v2]), t1, t2)
    levels = np.unique(np.concatenate([np.linspace(0.0, 1.0, 101), [1e-4, 1e-3, 3e-3, 0.997, 0.999, 0.9999]]))
    best = (-np.inf, None)
    for s1, s2, sname in zip(all1, all2, names):
        a1, a2 = s1[:half], s2[:half]
        taus = np.unique(np.quantile(np.concatenate([a1, a2]), levels))
        s1_sorted, s2_sorted = np.sort(a1), np.sort(a2)
        for side in ("ge", "le"):
            if side == "ge":
                k1 = half - np.searchsorted(s1_sorted, taus, side="left")
                k2 = half - np.searchsorted(s2_sorted, taus, side="left")
            else:
                k1 = np.searchsorted(s1_sorted, taus, side="right")
                k2 = np.searchsorted(s2_sorted, taus, side="right")
            for order, (ka, kb) in (("D1 vs D2", (k1, k2)), ("D2 vs D1", (k2, k1))):
                lb = _eps_bound(ka, kb, half, delta, TRAIN_ALPHA)
                i = int(np.argmax(lb))
                if lb[i] > best[0]:
                    best = (lb[i], (sname, side, taus[i], order))
    if best[1] is None:
        return AuditResult(name, claimed, delta, runs, -np.inf, -np.inf, "none", notes)
    sname, side, tau, order = best[1]
    j = names.index(sname)
    b1, b2 = all1[j][half:], all2[j][half:]
    hit1 = int((b1 >= tau).sum() if side == "ge" else (b1 <= tau).sum())
    hit2 = int((b2 >= tau).sum() if side == "ge" else (b2 <= tau).sum())
    ka, kb = (hit1, hit2) if order == "D1 vs D2" else (hit2, hit1)
    lb99 = float(_eps_bound(ka, kb, n_test, delta, REPORT_ALPHA))
    lbg = float(_eps_bound(ka, kb, n_test, delta, GATE_ALPHA))
    event = f"{sname} {'>=' if side == 'ge' else '<='} {tau:.6g} ({order}: {ka} vs {kb} of {n_test})"
    return AuditResult(name, claimed, delta, runs, lb99, lbg, event, notes)


def finite(x: float) -> float:
    return x if math.isfinite(x) else float("-inf")
