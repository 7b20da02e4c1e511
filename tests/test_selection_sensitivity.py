"""The weighted histograms of the Gaussian selections: adding or removing one unit, with any rows,
changes them by at most the claimed L2 sensitivity (1, i.e. 2^16 weight steps), for the weighted
Gaussian's histogram and for MAD's second round given any public round-1 outcome. Computed by the
engine's own SQL (bounding plan, round-2 statement) on DuckDB, with a fixed bounding seed so that
the other units are bounded alike in both datasets (privacy does not rest on the seed)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
from hypothesis import given, settings
from hypothesis import strategies as st

import dp_core as dp
from dp_core.backend import DuckDBBackend
from dp_core.bounding import build_plan
from dp_core.selection_mad import round_two_sql
from dp_core.selection_weighted import WEIGHT_ONE, unit_weights

SEED = 987654321
KEY_TYPES = {"uid": "BIGINT", "part": "BIGINT", "x": "BIGINT"}

rows_of_a_unit = st.lists(st.tuples(st.integers(0, 7), st.integers(1, 3)), min_size=1, max_size=12)
datasets = st.lists(rows_of_a_unit, min_size=1, max_size=12)


def frame(units: list[list[tuple[int, int]]]) -> pd.DataFrame:
    """Unit i's rows: (partition, number of rows)."""
    records = [(u, p) for u, rows in enumerate(units) for p, k in rows for _ in range(k)]
    return pd.DataFrame(records, columns=["uid", "part"]).assign(x=1).astype("int64")


def histograms(df: pd.DataFrame, cu: int, released: tuple[int, ...]) -> tuple[dict, dict]:
    """(round-1 weights, round-2 weights given the released partitions) per partition."""
    q = dp.Query([dp.count()], privacy_unit="uid", group_by=("part",), epsilon=1.0, max_partitions_contributed=cu,
                 selection="mad")
    plan = build_plan(q, {"uid", "part", "x"}, seed=SEED, key_types=KEY_TYPES)
    backend = DuckDBBackend.for_input(df)
    try:
        rows = backend.run(plan.sql)
        w1 = dict(zip(rows["part"], rows["_w1"]))
        if released:
            w2_rows = backend.run(round_two_sql(plan.with_clause, q, [(p,) for p in released], KEY_TYPES))
            w2 = dict(zip(w2_rows["part"], w2_rows["_w2"]))
        else:
            w2 = w1
    finally:
        backend.close()
    return w1, w2


def l2_change(a: dict, b: dict) -> float:
    return math.sqrt(sum((int(a.get(k, 0)) - int(b.get(k, 0))) ** 2 for k in set(a) | set(b)))


@settings(max_examples=30, deadline=None)
@given(datasets, st.integers(0, 11), st.integers(1, 4), st.sets(st.integers(0, 7), max_size=5))
def test_one_unit_moves_each_weighted_histogram_by_at_most_one(units, drop, cu, released):
    drop = drop % len(units)
    with_unit = frame(units)
    without = with_unit[with_unit["uid"] != drop]
    w1, w2 = histograms(with_unit, cu, tuple(sorted(released)))
    if len(without):
        v1, v2 = histograms(without, cu, tuple(sorted(released)))
    else:
        v1 = v2 = {}
    assert l2_change(w1, v1) <= WEIGHT_ONE
    assert l2_change(w2, v2) <= WEIGHT_ONE
    # released partitions carry no round-2 weight
    assert all(w2.get(p, 0) == 0 for p in released) or not released


def test_integer_weights_never_exceed_unit_norm():
    for cu in range(1, 65):
        for t, q in enumerate(unit_weights(cu), start=1):
            assert t * q * q <= WEIGHT_ONE * WEIGHT_ONE < t * (q + 1) * (q + 1)


def test_weights_follow_the_degree_after_bounding():
    # unit 0 in 6 partitions (bounded to C_u = 3, weight 1/sqrt(3) each), unit 1 in one partition
    df = frame([[(p, 1) for p in range(6)], [(0, 2)]])
    w1, _ = histograms(df, 3, ())
    q3, q1 = unit_weights(3)[2], unit_weights(3)[0]
    assert sum(int(v) for v in w1.values()) == 3 * q3 + q1
    assert int(w1.get(0, 0)) in (q1, q1 + q3)
    assert np.isclose(q3 / WEIGHT_ONE, 1 / math.sqrt(3), atol=2 / WEIGHT_ONE)
