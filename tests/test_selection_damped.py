"""MaxAdaptiveDegree, damped (dp_core/selection_damped.py): its round-2 weights keep every unit's L2
norm within 1 for every mix of undamped and damped partitions; the product's round-2 SQL computes
the weights its docstring defines (a reference written here from that text, Decimal square roots);
one unit moves the round-2 histogram by at most 1 whatever round 1 released or damped; the release
runs through the engine, the SQL front end and the request format. The one-unit group's release
chance is in test_selection_delta.py, the neighbour audit in tests/audit."""

from __future__ import annotations

import math
from decimal import Decimal, localcontext

import numpy as np
import pandas as pd
from hypothesis import given, settings
from hypothesis import strategies as st

import dp_core as dp
from dp_core.backend import DuckDBBackend
from dp_core.bounding import build_plan
from dp_core.selection_damped import damped_weights, lone_unit_damped_weights, undamped_weights
from dp_core.selection_mad import round_two_sql

ONE = 2**16
SEED = 424242
KEY_TYPES = {"uid": "BIGINT", "part": "BIGINT", "x": "BIGINT"}


def floor_of(x: Decimal) -> int:
    return int(x.to_integral_value(rounding="ROUND_FLOOR"))


def reference_weights(a: int, b: int) -> tuple[int, int]:
    """(undamped, damped) weight of a unit with a undamped and b damped partitions left, from the
    docstring: 2^16 / sqrt(a + b/4) and half of it, rounded down to integer steps."""
    with localcontext() as ctx:
        ctx.prec = 60
        full = Decimal(ONE) / (Decimal(a) + Decimal(b) / 4).sqrt()
        return floor_of(full), floor_of(full / 2)


def test_every_mix_of_damped_partitions_keeps_a_unit_within_norm_one():
    for cu in range(1, 33):
        full, half = undamped_weights(cu), damped_weights(cu)
        for a in range(cu + 1):
            for b in range(cu + 1 - a):
                if a + b == 0:
                    continue
                m = 4 * a + b
                assert (full[m - 1], half[m - 1]) == reference_weights(a, b)
                assert a * full[m - 1] ** 2 + b * half[m - 1] ** 2 <= ONE * ONE
                if b == 0:  # nothing damped: MAD's own weight q_a
                    assert full[m - 1] == math.isqrt(ONE * ONE // a)
        # the threshold's configurations: every (a, b) once, each vector within norm one
        vectors = lone_unit_damped_weights(cu)
        assert len(vectors) == (cu + 1) * (cu + 2) // 2 - 1
        assert all(sum(w * w for w in v) <= ONE * ONE and 1 <= len(v) <= cu for v in vectors)


rows_of_a_unit = st.lists(st.tuples(st.integers(0, 7), st.integers(1, 3)), min_size=1, max_size=12)
datasets = st.lists(rows_of_a_unit, min_size=1, max_size=12)


def frame(units: list[list[tuple[int, int]]]) -> pd.DataFrame:
    records = [(u, p) for u, rows in enumerate(units) for p, k in rows for _ in range(k)]
    return pd.DataFrame(records, columns=["uid", "part"]).assign(x=1).astype("int64")


def query(cu: int) -> dp.Query:
    return dp.Query([dp.count()], privacy_unit="uid", group_by=("part",), epsilon=1.0, max_partitions_contributed=cu,
                    selection="mad_damped")


def round_two(df: pd.DataFrame, cu: int, released: tuple, damped: tuple) -> tuple[dict, pd.DataFrame]:
    """(the product's round-2 weights per partition, the bounded (unit, partition) pairs)."""
    q = query(cu)
    plan = build_plan(q, {"uid", "part", "x"}, seed=SEED, key_types=KEY_TYPES)
    backend = DuckDBBackend.for_input(df)
    try:
        w2 = backend.run(round_two_sql(plan.with_clause, q, [(p,) for p in released], KEY_TYPES,
                                       damped_keys=[(p,) for p in damped]))
        pairs = backend.run(f"{plan.with_clause} SELECT DISTINCT uid, part FROM _bounded")
    finally:
        backend.close()
    return {int(p): int(w) for p, w in zip(w2["part"], w2["_w2"])}, pairs


def reference_round_two(pairs: pd.DataFrame, released: set, damped: set) -> dict:
    out: dict[int, int] = {}
    for _, unit in pairs.groupby("uid"):
        left = [int(p) for p in unit["part"] if int(p) not in released]
        b = sum(p in damped for p in left)
        full, half = reference_weights(len(left) - b, b) if left else (0, 0)
        for p in left:
            out[p] = out.get(p, 0) + (half if p in damped else full)
    return out


def l2_change(x: dict, y: dict) -> float:
    return math.sqrt(sum((x.get(k, 0) - y.get(k, 0)) ** 2 for k in set(x) | set(y)))


@settings(max_examples=30, deadline=None)
@given(datasets, st.integers(0, 11), st.integers(1, 4), st.sets(st.integers(0, 7), max_size=4),
       st.sets(st.integers(0, 7), max_size=5))
def test_round_two_is_the_docstring_s_weights_and_one_unit_moves_it_by_at_most_one(units, drop, cu, released,
                                                                                    damped):
    damped = damped - released  # round 1 damps only partitions it did not release
    drop = drop % len(units)
    with_unit = frame(units)
    w2, pairs = round_two(with_unit, cu, tuple(sorted(released)), tuple(sorted(damped)))
    assert w2 == {p: w for p, w in reference_round_two(pairs, released, damped).items()}
    without = with_unit[with_unit["uid"] != drop]
    v2 = round_two(without, cu, tuple(sorted(released)), tuple(sorted(damped)))[0] if len(without) else {}
    assert l2_change(w2, v2) <= ONE


def skewed(units: int = 4000, seed: int = 3) -> pd.DataFrame:
    """Units in 1-4 of 30 partitions of Zipf-like popularity (data, not noise: numpy's seeded PRNG)."""
    rng = np.random.default_rng(seed)
    p = 1.0 / np.arange(1, 31) ** 1.2
    rows = [(u, int(part)) for u in range(units) for part in rng.choice(30, size=rng.integers(1, 5), p=p / p.sum())]
    return pd.DataFrame(rows, columns=["uid", "part"]).assign(x=1)


def test_the_engine_the_sql_front_end_and_the_request_format_release_with_it():
    from dp_core.sql import Table, run_sql
    from dprelease.requests import query_from_spec

    df = skewed()
    q = dp.Query([dp.count(upper=1, name="n")], privacy_unit="uid", group_by=("part",), epsilon=1.0, delta=1e-6,
                 max_partitions_contributed=3, selection="mad_damped")
    result = dp.execute(q, df)
    assert result.partition_selection.startswith("mad_damped: MaxAdaptiveDegree, damped")
    assert 0 < len(result.table) <= 30
    import duckdb

    con = duckdb.connect()
    on_relation = dp.execute(q, con.from_df(df))  # no connection of the engine's own: the plan runs again
    assert on_relation.partition_selection.startswith("mad_damped") and len(on_relation.table) > 0
    sql = ("SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS (epsilon = 1, delta = 1e-6, max_groups_contributed = 3, "
           "partition_selection = 'mad_damped') part, COUNT(*) AS n FROM t GROUP BY part")
    assert run_sql(sql, {"t": Table(df, "uid")}).partition_selection.startswith("mad_damped")
    spec = query_from_spec({"group_by": ["part"], "aggregates": [{"kind": "count", "upper": 1}],
                            "selection": "mad_damped"}, "uid", 1.0)
    assert spec.selection == "mad_damped"
