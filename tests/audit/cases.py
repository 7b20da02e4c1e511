"""The audited mechanisms: for each, a pair of neighbouring datasets that stresses it, the query,
and the epsilon (and delta) it claims. Shared by tests/audit/ (CI) and bench/audit.py (long runs).

Neighbours: D1 is a small base population (600 units, 1-3 rows each in partitions p0..p5); D2 adds
ONE unit, `star`, with 12 rows in each of 8 partitions (p0..p4 and three that only it has,
n0..n2), and extreme values (10^6, far above every upper bound; 2^20 for APPROX_BOUNDS, which
moves the inferred upper bound). The bounding key is fixed, so both neighbours bound alike.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import harness
import numpy as np
import pandas as pd

import dp_core as dp
from dp_core import pri
from dp_core.accounting import plan_budget
from dp_core.backend import DuckDBBackend
from dp_core.sql import Table, compile_for

STAR_PARTITIONS = ("p0", "p1", "p2", "p3", "p4", "n0", "n1", "n2")
BASE_PARTITIONS = tuple(f"p{i}" for i in range(6))


def base_frame(units: int = 600) -> pd.DataFrame:
    """Deterministic base data: unit u has 1-3 rows in one or two partitions, values in [0, 59]
    (about 130 units per partition, so that private partitions are selected)."""
    rows = []
    for u in range(units):
        for r in range(1 + u % 3):
            part = BASE_PARTITIONS[(u + r * (u % 2)) % len(BASE_PARTITIONS)]
            rows.append({"uid": u, "part": part, "value": (u * 37 + r * 11) % 60})
    return pd.DataFrame(rows)


def with_star(frame: pd.DataFrame, value: float = 1e6, partitions=STAR_PARTITIONS, rows_each: int = 12) -> pd.DataFrame:
    star = pd.DataFrame([{"uid": 10_000, "part": p, "value": value} for p in partitions for _ in range(rows_each)])
    out = pd.concat([frame.astype({"value": "float64"}), star], ignore_index=True)
    return out


def bounds_neighbours(query: dp.Query) -> tuple[pd.DataFrame, pd.DataFrame]:
    """A bin exactly at APPROX_BOUNDS' threshold K: D1 has K units with value 2^20 (in p0, or in each
    of p0..p4 for per-partition bounds, so
    that bin passes with probability P(noise > 0)), D2 adds the star, whose value 2^20 adds up to
    C_u more: it moves the inferred upper bound. 100 units at 5 keep a lower bin always above.
    Unsigned integers: 64 bins."""
    from dp_core.bounds import bin_layout, discrete_threshold

    share = plan_budget(query).bounds_shares[0]
    k = discrete_threshold(share.epsilon, query.effective_max_partitions, len(bin_layout(True, False)),
                           query.bounds_failure)
    rows = [{"uid": u, "part": f"p{p}", "value": 5} for p in range(5) for u in range(1000 * p, 1000 * p + 100)]
    filled = range(5) if query.bounds_scope == "partition" else range(1)  # K values in each histogram
    rows += [{"uid": u, "part": f"p{p}", "value": 2**20} for p in filled for u in range(1000 * p + 100, 1000 * p + 100 + k)]
    d1 = pd.DataFrame(rows).astype({"value": "uint32"})
    star = pd.DataFrame([{"uid": 99_999, "part": p, "value": 2**20} for p in STAR_PARTITIONS]).astype({"value": "uint32"})
    return d1, pd.concat([d1, star], ignore_index=True)


ALL_KEYS = tuple(sorted(set(BASE_PARTITIONS) | set(STAR_PARTITIONS)))


@dataclass(frozen=True)
class Case:
    """One audited path: the query, the neighbours, the claim."""

    name: str
    query: dp.Query
    kind: str = "release"  # release | bounds | sql
    sql: str | None = None
    claimed: float | None = None  # default: the query's epsilon
    base_units: int = 600

    def data(self):
        d1 = base_frame(self.base_units)
        if self.kind == "bounds":
            return bounds_neighbours(self.query)
        return d1.astype({"value": "float64"}), with_star(d1)

    @property
    def claim(self) -> tuple[float, float]:
        if self.kind == "bounds":
            return plan_budget(self.query).bounds_shares[0].epsilon, 0.0
        return (self.claimed if self.claimed is not None else self.query.epsilon), self.query.delta


def q(aggs, **kw) -> dp.Query:
    base = {"privacy_unit": "uid", "group_by": ("part",), "epsilon": 1.0, "delta": 1e-5, "max_partitions_contributed": 2}
    base.update(kw)
    return dp.Query(list(aggs), **base)


PUBLIC = tuple((k,) for k in ALL_KEYS)


def pri_chosen_query() -> tuple[dp.Query, float]:
    """COUNT over public partitions at the epsilon the PRI (public mode, p = 50) chooses."""
    query = q([dp.count(5)], public_partitions=PUBLIC)
    choice = pri.choose_epsilon_public(query, 50)
    from dataclasses import replace

    return replace(query, epsilon=choice.epsilon), choice.epsilon


SQL_TEXT = ("SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS (epsilon = 1, delta = 1e-5, max_groups_contributed = 2, "
            "privacy_unit_column = uid) part, COUNT(*, contribution_bounds_per_group => (0, 5)) AS c, "
            "SUM(value, contribution_bounds_per_group => (0, 100)) AS s FROM t GROUP BY part")


@lru_cache(maxsize=1)
def cases() -> dict[str, Case]:
    pri_query, pri_eps = pri_chosen_query()
    items = [
        Case("COUNT, private partitions (truncated geometric)", q([dp.count(5)])),
        Case("COUNT(DISTINCT unit), Laplace threshold (reused count)", q([dp.count_units()], epsilon=1.0)),
        Case("COUNT, weighted Gaussian selection", q([dp.count(5)], selection="weighted_gaussian")),
        Case("COUNT, MaxAdaptiveDegree selection", q([dp.count(5)], selection="mad")),
        Case("COUNT, damped MaxAdaptiveDegree selection", q([dp.count(5)], selection="mad_damped")),
        Case("SUM, public partitions", q([dp.sum_("value", 0, 100)], public_partitions=PUBLIC)),
        Case("SUM, no GROUP BY", q([dp.sum_("value", 0, 100)], group_by=(), max_partitions_contributed=1, delta=0.0)),
        Case("COUNT, C_u = 1, public partitions", q([dp.count(5)], public_partitions=PUBLIC,
                                                    max_partitions_contributed=1, epsilon=2.0)),
        Case("AVG, private partitions", q([dp.avg("value", 0, 100)], epsilon=2.0)),
        Case("VAR, public partitions", q([dp.var("value", 0, 100)], public_partitions=PUBLIC, epsilon=2.0)),
        # public partitions that all hold data (an empty public partition breaks MEDIAN today:
        # dense_histograms meets pd.NA), a small base and 64 bins: the histograms are dense (runs x bins)
        Case("MEDIAN, public partitions", q([dp.median("value", 0, 100)], epsilon=2.0, quantile_bins=64,
                                            public_partitions=tuple((k,) for k in BASE_PARTITIONS)), base_units=60),
        Case("COUNT + SUM, Gaussian (pooled)", q([dp.count(5), dp.sum_("value", 0, 100)], noise="gaussian",
                                                       public_partitions=PUBLIC, epsilon=2.0)),
        Case("APPROX_BOUNDS, dataset", q([dp.sum_("value", 0, None)], public_partitions=PUBLIC, epsilon=2.0),
             kind="bounds"),
        Case("APPROX_BOUNDS, per partition", q([dp.sum_("value", 0, None)], bounds_scope="partition", epsilon=2.0),
             kind="bounds"),
        Case("SQL front end: COUNT + SUM", q([]), kind="sql", sql=SQL_TEXT, claimed=1.0),
        Case(f"PRI-chosen epsilon (public mode, p = 50: eps = {pri_eps:g})", pri_query, claimed=pri_eps),
    ]
    return {c.name: c for c in items}


def samples(case: Case, runs: int) -> tuple[np.ndarray, np.ndarray, tuple[str, ...]]:
    """Runs of the case's release on both neighbours: (x1, x2, notes)."""
    d1, d2 = case.data()
    if case.kind == "release" and case.query.selection in ("mad", "mad_damped"):
        x1, x2, _ = harness.mad_release_samples(case.query, d1, d2, runs)
        return x1, x2, ("MAD round 1 drawn per run; round 2's weights by the product's SQL per round-1 outcome",)
    if case.kind == "release":
        x1, x2, _ = harness.release_samples(case.query, d1, d2, runs)
        return x1, x2, ()
    if case.kind == "sql":
        def compiled(frame):
            return compile_for(case.sql, {"t": Table(frame, "uid")})

        def backend(frame):
            b = DuckDBBackend.for_tables({"t": frame})
            b.define_input(compiled(frame).source_sql("duckdb"))
            return b

        query = compiled(d1).query
        x1, x2, _ = harness.release_samples(query, backend(d1), backend(d2), runs)
        return x1, x2, ("compiled by dp_core.sql, run on the compiled source view",)
    # APPROX_BOUNDS
    h1, integer, signed = harness.exact_histograms(case.query, d1, 0)
    h2, _, _ = harness.exact_histograms(case.query, d2, 0)
    keys = sorted([k for k in set(h1) | set(h2) if h1.get(k) != h2.get(k)], key=repr)  # as differing_partitions
    harness.check_bounds_conformance(case.query, 0, h2, integer, signed)
    x1 = harness.bounds_samples(case.query, 0, h1, keys, integer, signed, runs)
    x2 = harness.bounds_samples(case.query, 0, h2, keys, integer, signed, runs)
    return x1, x2, ("conformance: the real infer_bounds follows its noisy counts",)


def audit(case: Case, runs: int) -> harness.AuditResult:
    """Sample, then estimate; a failed conformance check is a violation (infinite lower bound)."""
    eps, delta = case.claim
    try:
        x1, x2, notes = samples(case, runs)
    except AssertionError as err:
        return harness.AuditResult(case.name, eps, delta, runs, float("inf"), float("inf"),
                                   f"conformance failed: {err}")
    return harness.estimate(case.name, x1, x2, eps, delta, notes)
