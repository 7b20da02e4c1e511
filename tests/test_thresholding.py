"""Partition selection: a partition that exists because of a single unit is released with
probability at most delta, checked exactly and by simulation (end to end, through the engine).

Simulation bound: with N single-unit partitions and release probability p <= delta, the released
count is Binomial(N, p); the test allows N delta + 6 sd (false failure < 1e-8) and would see a
breach of 2 delta (mean N 2 delta is far beyond that limit)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

import dp_core as dp
from dp_core import noise
from dp_core import partition_selection as ps
from dp_core.accounting import Share


def limit(trials: int, p: float) -> float:
    return trials * p + 6 * math.sqrt(trials * p * (1 - p))


@pytest.mark.parametrize("strategy", ["laplace-threshold", "truncated-geometric"])
@pytest.mark.parametrize("cu", [1, 3])
def test_single_unit_partitions_are_released_at_most_delta(strategy, cu):
    delta, eps = 0.01, 1.0
    units = 100_000
    # every unit alone in its own C_u partitions
    df = pd.DataFrame({"uid": np.repeat(np.arange(units), cu), "part": np.arange(units * cu), "x": 1})
    aggs = [dp.count_units()] if strategy == "laplace-threshold" else [dp.count()]
    q = dp.Query(aggs, privacy_unit="uid", group_by=("part",), epsilon=eps, delta=delta,
                 max_partitions_contributed=cu, selection=strategy)
    r = dp.execute(q, df)
    assert r.partition_selection.startswith(strategy)
    released_parts = r.table["part"].to_numpy()
    units_exposed = len(np.unique(released_parts // cu))  # units with at least one partition out
    share = r.budget[0]
    assert share.part == "partition selection" and share.delta == pytest.approx(delta)
    assert units_exposed <= limit(units, delta)
    assert 2 * delta * units - 6 * math.sqrt(units * 2 * delta) > limit(units, delta)  # a 2x breach is seen
    if strategy == "truncated-geometric":  # exactly d per partition: also not far below
        d = ps.per_partition_delta(delta, cu)
        assert abs(len(released_parts) - units * cu * d) < 6 * math.sqrt(units * cu * d)


def test_laplace_threshold_exact_probability_for_a_single_unit():
    for eps, delta, cu in [(1.0, 1e-6, 1), (0.3, 1e-6, 4), (2.0, 1e-9, 8)]:
        share = Share("partition selection", eps, delta)
        T = ps.discrete_laplace_threshold(eps, delta, cu)
        q = math.exp(-eps / cu)
        p_single = q ** (T - 1) / (1 + q)
        assert 1 - (1 - p_single) ** cu <= delta
        # the engine's own selection uses that threshold
        sel = ps.select_laplace_threshold(np.array([1, 10_000]), share, cu)
        assert sel.threshold == T and sel.keep[1]


def test_large_partitions_survive_and_the_laplace_count_is_released_once():
    df = pd.DataFrame({"uid": np.arange(5000), "part": np.repeat(["a", "b"], 2500)})
    r = dp.execute(dp.Query([dp.count_units(name="n")], privacy_unit="uid", group_by=("part",),
                            epsilon=1.0, delta=1e-6), df)
    assert list(r.table["part"]) == ["a", "b"]
    assert r.budget[0].epsilon == 1.0 and len(r.budget) == 1  # no second spend for the count
    assert r.mechanisms[0].target.startswith("partition selection")
    half = noise.discrete_laplace_halfwidth(1.0, 0.05)  # scale C_u / eps = 1
    assert np.all(r.table["n_ci_high"] - r.table["n"] == half)
