"""The per-(unit, partition) partials computed once per release (dp_core/shared_partials.py, issue
41): the plans that read the kept table give the rows of the plans that compute them, and a release
with inferred bounds and PRIs aggregates its input per (unit, partition) once."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

import dp_core as dp
from dp_core.backend import DuckDBBackend
from dp_core.bounding import build_plan
from dp_core.engine import exact_bounds_histograms, exact_statistics
from dp_core.shared_partials import SharedPartials

CU = 3
PARTIAL_AGGREGATION = 'GROUP BY "uid", "part"'  # the text of `_partial`'s aggregation in every plan here


def people(seed: int, units: int = 700) -> pd.DataFrame:
    """Test data (numpy's seeded generator): units in 1-7 partitions, 1-3 rows each, some negative x."""
    rng = np.random.default_rng(seed)
    rows = [(u, f"p{p}", int(rng.integers(-5, 60)), int(rng.integers(0, 3)))
            for u in range(units) for p in rng.choice(25, size=rng.integers(1, 8), replace=False)
            for _ in range(rng.integers(1, 4))]
    return pd.DataFrame(rows, columns=["uid", "part", "x", "k2"])


SHAPES = {  # name -> query keywords
    "count and sum": {"aggregates": [dp.count(upper=None), dp.sum_("x", None, None)]},
    "avg and var": {"aggregates": [dp.avg("x", None, 70), dp.var("x", -10, None), dp.count(upper=2)]},
    "row filter": {"aggregates": [dp.count(upper=None), dp.sum_("x", 0, None)], "where": "x >= 3"},
    "public partitions": {"aggregates": [dp.count(upper=None), dp.sum_("x", None, None)],
                          "public_partitions": [f"p{i}" for i in range(0, 30, 2)]},
    "two keys": {"aggregates": [dp.count(upper=None), dp.sum_("x", None, None)], "group_by": ("part", "k2")},
    "weighted gaussian": {"aggregates": [dp.count(upper=None), dp.sum_("x", None, None)], "noise": "gaussian",
                          "selection": "weighted_gaussian"},
    "partition bounds": {"aggregates": [dp.sum_("x", None, None), dp.count(upper=2)], "bounds_scope": "partition",
                         "epsilon": 50.0},
}


def _query(shape: str) -> dp.Query:
    kw = {"group_by": ("part",), "epsilon": 2.0, "delta": 1e-6, **SHAPES[shape]}
    return dp.Query(kw.pop("aggregates"), privacy_unit="uid", max_partitions_contributed=CU, **kw)


@pytest.mark.parametrize("shape", SHAPES)
def test_plans_reading_the_kept_partials_give_the_rows_of_plans_computing_them(shape):
    """APPROX_BOUNDS' exact histograms and the release's plan (its bounds now set) give the same
    numbers whether each statement aggregates the input itself or reads the kept partials."""
    query = _query(shape)
    for seed in (1, 2):
        df = people(seed)
        schema = {"uid": "BIGINT", "part": "VARCHAR", "x": "BIGINT", "k2": "BIGINT"}
        backend = DuckDBBackend.for_input(df)
        partials = SharedPartials(backend)
        keys = query.group_by if query.bounds_scope == "partition" else ()
        order = list(keys) + ["neg", "e"]
        alone = exact_bounds_histograms(query, backend, schema, {"uid", "x", "k2"}, seed, False, None)
        shared = exact_bounds_histograms(query, backend, schema, {"uid", "x", "k2"}, seed, False, partials)
        assert partials.table is not None and alone.keys() == shared.keys()
        for i in alone:
            left, right = (h[i][0].sort_values(order).reset_index(drop=True) for h in (alone, shared))
            assert len(left) > 0
            pd.testing.assert_frame_equal(left, right)
        fixed = dp.Query([a if not a.needs_bounds else _bounded(a) for a in query.aggregates], privacy_unit="uid",
                         group_by=query.group_by, epsilon=query.epsilon, delta=query.delta, noise=query.noise,
                         selection=query.selection, max_partitions_contributed=CU, where=query.where,
                         public_partitions=query.public_partitions)
        plan = build_plan(fixed, {"uid", "x", "k2"}, seed=seed, key_types=schema)
        read = partials.reading(plan)
        assert read.sql != plan.sql and partials.table in read.sql and PARTIAL_AGGREGATION not in read.sql
        by_keys = f"\nORDER BY {', '.join(query.group_by)} NULLS LAST"
        pd.testing.assert_frame_equal(backend.run(read.sql + by_keys), backend.run(plan.sql + by_keys))
        partials.close()
        backend.close()


def _bounded(agg):
    from dataclasses import replace

    return replace(agg, lower=None if agg.kind == "count" else (agg.lower if agg.lower is not None else -3),
                   upper=agg.upper if agg.upper is not None else 41)


def test_a_plan_of_other_partials_runs_as_written():
    """Another seed (or query) keeps other rows: its plan does not read the kept table."""
    df = people(3)
    backend = DuckDBBackend.for_input(df)
    partials = SharedPartials(backend)
    fixed = dp.Query([dp.count(upper=2), dp.sum_("x", 0, 40)], privacy_unit="uid", group_by=("part",), epsilon=1.0,
                     max_partitions_contributed=CU)
    first = build_plan(fixed, {"uid", "x"}, seed=5)
    assert partials.reading(first).sql != first.sql
    other = build_plan(fixed, {"uid", "x"}, seed=6)
    assert partials.reading(other) == other
    partials.close()
    assert backend.run("SELECT count(*) AS n FROM duckdb_tables() WHERE table_name LIKE '_partial_%'")["n"].iloc[0] == 0
    backend.close()


OUTSIDE_PARTIAL = {  # name -> a change of the query that leaves `_partial`'s text as it is, not its rows
    "another filter": {"where": "x >= 30"},
    "a filter added": {"where": "k2 = 1"},
    "other public partitions": {"public_partitions": ["p1", "p3", "p5"]},
}


@pytest.mark.parametrize("change", OUTSIDE_PARTIAL)
def test_a_plan_whose_partials_read_other_rows_runs_as_written_though_its_partial_cte_is_the_same(change):
    """`_partial` reads `_src`: a plan whose filter or public partitions differ from the kept plan's
    has the same `_partial` text yet other rows, so it must not read the kept table."""
    from dataclasses import replace

    df = people(5)
    backend = DuckDBBackend.for_input(df)
    partials = SharedPartials(backend)
    kept = dp.Query([dp.count(upper=2), dp.sum_("x", 0, 40)], privacy_unit="uid", group_by=("part",), epsilon=1.0,
                    max_partitions_contributed=CU)
    other = replace(kept, **OUTSIDE_PARTIAL[change])
    first, second = (build_plan(q, {"uid", "x", "k2"}, seed=5) for q in (kept, other))
    assert first.ctes[1] == second.ctes[1] and first.ctes[0] != second.ctes[0]  # the case: only `_src` differs
    partials.reading(first)
    read = partials.reading(second)
    by_keys = "\nORDER BY part NULLS LAST"
    assert backend.run(second.sql + by_keys)["_n_units"].sum() != backend.run(first.sql + by_keys)["_n_units"].sum()
    pd.testing.assert_frame_equal(backend.run(read.sql + by_keys), backend.run(second.sql + by_keys))
    partials.close()
    backend.close()


@pytest.mark.parametrize("with_units", [False, True])
@pytest.mark.parametrize("bounds_scope", ["dataset", "partition"])
def test_a_release_with_inferred_bounds_aggregates_its_input_per_unit_and_partition_once(with_units, bounds_scope):
    """Every statement of a release is seen as the engine sends it: with bounds inferred for two
    aggregates (and the PRIs' unit rows), the aggregation per (unit, partition) is in one
    statement, the one that keeps the partials, which are dropped at the end."""
    df = people(4)
    query = dp.Query([dp.count(upper=None), dp.sum_("x", None, None)], privacy_unit="uid", group_by=("part",), epsilon=50.0,
                     delta=1e-6, max_partitions_contributed=CU, bounds_scope=bounds_scope)
    backend = DuckDBBackend.for_input(df)
    sent = []
    for name in ("run", "keep", "drop"):
        method = getattr(backend, name)
        setattr(backend, name, lambda *args, _m=method, _n=name: sent.append((_n, *args)) or _m(*args))
    stats = exact_statistics(query, backend, with_units=with_units)
    assert len(stats.rows) > 0 and all(a.upper is not None for a in stats.query.aggregates)
    assert [call[0] for call in sent if PARTIAL_AGGREGATION in call[-1]] == ["keep"]
    kept = next(call[1] for call in sent if call[0] == "keep")
    assert sent[-1] == ("drop", kept)
    readers = [call for call in sent if call[0] == "run" and kept in call[1]]
    assert len(readers) == 2 + with_units  # the histograms (one statement for both), the plan, the unit rows
