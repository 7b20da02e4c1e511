"""Rows a query selects are never refused (docs/engine.md, "Data rules"): whether a release happens,
and every message it gives, must not depend on the rows a requester's FROM/WHERE picks out, or one
person's row decides between a release and a refusal outside the mechanism. An empty DP input
releases what the mechanism gives for it, an infinite value a query computes is clamped, a row of
no unit is dropped; the whole tables handed over are still checked (a protected table that is
empty or has rows without a unit id is refused, whatever the query selects)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from scipy import stats
from stats_helpers import discrete_laplace_jittered_cdf

import dp_core as dp
from dp_core.sql import Table, run_sql

H = "SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS (epsilon = 1, delta = 1e-6, max_groups_contributed = 1) "
ALICE = "WHERE name = 'Alice' AND diagnosis = 'X'"


def people(diagnosis: str) -> pd.DataFrame:
    """40 people; the first is Alice, whose diagnosis is the only difference between neighbours."""
    return pd.DataFrame({"uid": range(1, 41), "name": ["Alice"] + [f"p{i}" for i in range(2, 41)],
                         "diagnosis": [diagnosis] + ["Y"] * 39, "g": ["a", "b"] * 20, "x": np.arange(40.0),
                         "k": np.arange(40) % 7})


NEIGHBOURS = {"Alice has X": people("X"), "Alice has Y": people("Y")}


def sql(query: str, data: pd.DataFrame, **request):
    return run_sql(query, {"t": Table(data, "uid")}, **request)


def test_neighbours_whose_filter_selects_one_row_or_none_both_release_alike():
    """The example of the issue: refused ("the input has no rows") for one neighbour and released
    for the other until 2026-11-24. Both now release one noisy count, with the same noise."""
    query = H + f"COUNT(*, contribution_bounds_per_group => (0, 1)) AS n FROM t {ALICE}"
    results = {case: sql(query, data) for case, data in NEIGHBOURS.items()}
    assert [int(r.controller_only.exact["n"].iloc[0]) for r in results.values()] == [1, 0]
    for r in results.values():
        assert len(r.table) == 1 and r.epsilon_spent == pytest.approx(1.0)
    first, second = (r.to_dict() for r in results.values())
    assert first["mechanisms"] == second["mechanisms"] and first["budget"] == second["budget"]


def test_neighbours_through_automatic_bounds_are_refused_alike():
    """A COUNT(*) without bounds infers them from a noisy histogram: with at most one unit selected
    no bin passes the threshold (a bin of count 1 passes with probability q^48 < 1e-10), and the
    refusal reads the same for both neighbours (it was "no rows" for the empty one)."""
    messages = []
    for data in NEIGHBOURS.values():
        with pytest.raises(dp.BoundsError) as info:
            sql(H + f"COUNT(*) AS n FROM t {ALICE}", data)
        messages.append(str(info.value))
    assert messages[0] == messages[1] and "no histogram bin stands out of the noise" in messages[0]


def test_neighbours_through_execute_with_a_row_filter_both_release():
    """The typed query's row filter (`where`) selects inside the plan; the whole-input checks read
    the caller's whole input before it (this held before 2026-11-24 too)."""
    query = dp.Query([dp.count(upper=1, name="n")], privacy_unit="uid", epsilon=1.0,
                     where="name = 'Alice' AND diagnosis = 'X'")
    for data in NEIGHBOURS.values():
        assert len(dp.execute(query, data).table) == 1


@pytest.mark.parametrize("selection", ["auto", "laplace-threshold", "truncated-geometric", "weighted_gaussian", "mad"])
def test_an_empty_input_through_private_selection_releases_nothing(selection):
    """Private partitions: with no rows there is no partition to select; the release is the empty
    table (the DP outcome of every strategy on an empty input), not a refusal."""
    query = H + ("g, COUNT(*, contribution_bounds_per_group => (0, 1)) AS n, "
                 f"AVG(x, contribution_bounds_per_group => (0, 40)) AS a FROM t {ALICE} GROUP BY g")
    for data in NEIGHBOURS.values():
        result = sql(query, data, selection=selection)
        assert result.epsilon_spent == pytest.approx(1.0) and result.partition_selection
        if data is NEIGHBOURS["Alice has Y"]:
            assert result.table.empty and list(result.table.columns[:1]) == ["g"]


def test_an_empty_input_through_public_partitions_releases_noise_of_the_stated_scale():
    """Public partitions: every listed key is released, empty or not. With an empty input each sum
    (bounds [-10, 10], so never clipped) is pure discrete Laplace noise of the scale its mechanism
    record states, sensitivity / epsilon: 3,000 keys against that law (Kolmogorov-Smirnov on the
    jittered values, failing at p < 1e-7: a false failure rate of 1e-7)."""
    keys = [(f"k{i}",) for i in range(3000)]
    query = H + f"g, SUM(k, contribution_bounds_per_group => (-10, 10)) AS s FROM t {ALICE} GROUP BY g"
    result = sql(query, NEIGHBOURS["Alice has Y"], public_partitions=keys)
    assert sorted(result.table["g"]) == sorted(k for (k,) in keys)
    (record,) = [m for m in result.mechanisms if m.target.startswith("s.")]
    assert record.scale == pytest.approx(record.sensitivity / record.epsilon) and record.sensitivity == 10
    values = result.table["s"].to_numpy(dtype=float)
    assert np.all(values == np.round(values))  # the integer grid of an integer column
    jitter = np.random.default_rng(11).uniform(-0.5, 0.5, len(values))  # test-only, not release noise
    assert stats.kstest(values + jitter, discrete_laplace_jittered_cdf(record.scale)).pvalue > 1e-7
    assert np.allclose(result.table["s_noise_sd"], np.sqrt(2) * record.scale, rtol=0.05)


def test_an_infinite_value_a_query_computes_is_clamped_to_the_bounds():
    """1e308 * x overflows to +inf for x >= 2 (the refusal used to count them: "column 'expr0' has
    38 infinite value(s)"); each unit's value is clamped to [L, U] like any other."""
    data = NEIGHBOURS["Alice has Y"]
    bounds = "contribution_bounds_per_group => ({lo}, 10)"
    query = H + (f"SUM(1e308 * x, {bounds.format(lo=0)}) AS up, SUM(-1e308 * x, {bounds.format(lo=-10)}) AS down, "
                 f"AVG(1e308 * x, {bounds.format(lo=0)}) AS mean, "
                 "PERCENTILE_CONT(1e308 * x, 0.5, contribution_bounds_per_row => (0, 10)) AS med FROM t")
    result = sql(query, data)
    exact = result.controller_only.exact.iloc[0]
    assert exact["up"] == 390 and exact["down"] == -390 and exact["mean"] == pytest.approx(390 / 40)
    assert 0 <= result.table["med"].iloc[0] <= 10
    assert result.controller_only.clamping["up"].clamped == 39


def test_a_unit_whose_value_is_not_a_number_counts_as_missing():
    """+inf and -inf among one unit's rows make its sum NaN: missing (it adds nothing, and is not
    in AVG's count); a row whose value is NaN (0 * inf) is missing like a NULL, for COUNT too."""
    data = pd.DataFrame({"uid": [1, 1, 2, 3], "v": [1.0, -1.0, 1.0, 2.0]})
    query = H + ("SUM(v * 1e308 * 10, contribution_bounds_per_group => (-10, 10)) AS s, "
                 "AVG(v * 1e308 * 10, contribution_bounds_per_group => (-10, 10)) AS a, "
                 "COUNT(0 * (v * 1e308 * 10), contribution_bounds_per_group => (0, 5)) AS nan_rows, "
                 "COUNT(v * 1e308 * 10, contribution_bounds_per_group => (0, 5)) AS inf_rows FROM t")
    exact = sql(query, data).controller_only.exact.iloc[0]
    assert exact["s"] == 20 and exact["a"] == 10  # units 2 and 3, each clamped to 10; unit 1 missing
    assert exact["nan_rows"] == 0 and exact["inf_rows"] == 4


def test_automatic_bounds_read_an_infinite_value_as_the_top_bin():
    """APPROX_BOUNDS bins each unit's value by its power of two: an infinite one (which failed the
    bin's cast before) is in the top bin [2^63, 2^64)."""
    data = pd.DataFrame({"uid": range(400), "x": np.full(400, 5.0)})
    result = sql(H + "SUM(1e308 * x) AS s FROM t", data)
    (bounds,) = result.inferred_bounds
    assert bounds.upper == 2.0**64 and result.controller_only.exact["s"].iloc[0] == pytest.approx(400 * 2.0**64)


def test_rows_without_a_unit_that_a_query_reads_are_dropped_whatever_it_selects():
    """A public table whose unit the analyst names (privacy_unit_column) may hold rows without one:
    they belong to no unit and are dropped, whether the WHERE keeps them or not (it was a refusal
    naming their count when it kept them)."""
    data = pd.DataFrame({"pid": [1.0, 2.0, None, 4.0], "x": [1.0, 2.0, 3.0, 4.0]})
    options = "OPTIONS (epsilon = 1, delta = 1e-6, privacy_unit_column = pid)"
    counts = []
    for where in ("x > 2.5", "x < 2.5"):
        result = run_sql(f"SELECT WITH DIFFERENTIAL_PRIVACY {options} COUNT(*, contribution_bounds_per_group => "
                         f"(0, 1)) AS n FROM t WHERE {where}", {"t": Table(data)})
        counts.append(int(result.controller_only.exact["n"].iloc[0]))
    assert counts == [1, 2]


@pytest.mark.parametrize("where", [ALICE, "WHERE name = 'p2'", ""])
def test_a_protected_table_is_checked_whole_whatever_the_query_selects(where):
    """A protected table with a row without a unit id, or with no rows, is refused with the same
    line whatever the WHERE keeps (before, only when the WHERE kept that row)."""
    bad = people("X").assign(uid=[None] + list(range(2, 41)))
    with pytest.raises(dp.InvalidDataError) as info:
        sql(H + f"COUNT(*, contribution_bounds_per_group => (0, 1)) AS n FROM t {where}", bad)
    assert str(info.value) == ("table 't': 1 row(s) have no privacy unit id (column 'uid' is null): every row must "
                               "belong to a unit; fix or drop those rows")
    with pytest.raises(dp.InvalidDataError, match="^table 't' has no rows: nothing can be released$"):
        sql(H + f"COUNT(*, contribution_bounds_per_group => (0, 1)) AS n FROM t {where}", people("X").iloc[:0])
