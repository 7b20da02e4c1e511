"""Nominal 95% confidence intervals cover the true (bounded) value 93-97% of the time.

One release of 10,000 public partitions gives 10,000 independent repetitions at once (C_u = 1, so
each partition's noise is independent). Binomial sd at 95% is 0.22%: the 93-97% band is 9 sd wide
on each side (false failure far below 1e-6), and an interval half as wide (coverage ~75%) or twice
as wide (~99.8%) fails it. The true values are computed here with pandas, not by the engine."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

import dp_core as dp

PARTS, UNITS_PER_PART = 10_000, 100


@pytest.fixture(scope="module")
def data() -> pd.DataFrame:
    rng = np.random.default_rng(7)  # test data only; the engine's noise is CSPRNG
    n = PARTS * UNITS_PER_PART
    return pd.DataFrame({
        "uid": np.arange(n),
        "part": np.repeat(np.arange(PARTS), UNITS_PER_PART),
        "x": rng.integers(0, 11, size=n),  # mean 5, inside the bounds: no clamping
        "y": rng.uniform(0.0, 10.0, size=n),
    })


def coverage(table: pd.DataFrame, truth: pd.Series, name: str) -> float:
    t = table.set_index("part")
    inside = (t[f"{name}_ci_low"] <= truth) & (truth <= t[f"{name}_ci_high"])
    return float(inside.mean())


@pytest.mark.parametrize("noise", ["laplace", "gaussian"])
def test_ci_coverage_for_count_sum_avg_var_stddev(data, noise):
    # weights chosen so that every noise is well resolved (a count's noise of scale ~1 is so
    # discrete that its exact 95% interval covers 97%) and AVG/VAR have little clamping
    q = dp.Query(
        [dp.count(upper=1, name="c", weight=0.1), dp.sum_("x", 0, 10, name="s", weight=0.1),
         dp.avg("x", 0, 20, name="a", weight=2.0), dp.sum_("y", 0, 10, name="sy", weight=0.1),
         dp.var("y", 0, 10, name="v", weight=3.0), dp.stddev("y", 0, 10, name="sd", weight=3.0)],
        privacy_unit="uid", group_by=("part",), epsilon=8.3, delta=1e-6, noise=noise,
        public_partitions=list(range(PARTS)),
    )
    r = dp.execute(q, data)
    assert len(r.table) == PARTS
    g = data.groupby("part")
    truths = {"c": g.size(), "s": g["x"].sum(), "a": g["x"].mean(), "sy": g["y"].sum(),
              "v": g["y"].var(ddof=0), "sd": g["y"].std(ddof=0)}
    t = r.table.set_index("part")
    for name, truth in truths.items():
        cov = coverage(r.table, truth.astype(float), name)
        assert 0.93 <= cov <= 0.97, (name, cov)
        # the stated noise sd matches the spread of the errors (relative se of an sd estimate from
        # 10,000 draws is about 1.1% for Laplace errors; 8% is over 6 se, and a factor sqrt(2) fails)
        errors = t[name] - truth.astype(float)
        assert abs(errors.std() / t[f"{name}_noise_sd"].mean() - 1) < 0.08, name


def test_a_broken_interval_fails_the_same_check(data):
    q = dp.Query([dp.sum_("x", 0, 10, name="s")], privacy_unit="uid", group_by=("part",), epsilon=0.1,
                 public_partitions=list(range(PARTS)))
    r = dp.execute(q, data)
    truth = data.groupby("part")["x"].sum().astype(float)
    t = r.table.set_index("part")
    half = (t["s_ci_high"] - t["s"]) / 2
    narrow = ((t["s"] - half <= truth) & (truth <= t["s"] + half)).mean()
    assert not 0.93 <= narrow <= 0.97
    assert 0.93 <= coverage(r.table, truth, "s") <= 0.97
