"""The accuracy preview (before any budget is reserved) agrees with the intervals the engine
states after the release, and reads no data."""

from __future__ import annotations

import pytest

from dp_core.sql import Table, compile_for, run_sql

SQL = ("SELECT WITH ANONYMIZATION education, ANON_COUNT(*, 1) AS people, ANON_AVG(age, 17, 90) AS avg_age "
       "FROM adult GROUP BY education")


def test_preview_matches_the_released_intervals(adult):
    from dprelease.preview import accuracy_preview, preview_markdown

    empty = adult.iloc[:0]  # the plan needs the columns only: the preview never sees a row
    query = compile_for(SQL, {"adult": Table(empty, "person_id")}, epsilon=1.0, delta=1e-6,
                        max_partitions_contributed=1).query
    rows = {r["statistic"]: r for r in accuracy_preview(query, 1.0)}
    result = run_sql(SQL, {"adult": Table(adult, "person_id")}, epsilon=1.0, delta=1e-6, max_partitions_contributed=1)
    stated = ((result.table["people_ci_high"] - result.table["people_ci_low"]) / 2).median()
    assert rows["people"]["halfwidth"] == pytest.approx(stated, rel=0.1)
    # an AVG's half-width for a group of n people bounds (to first order) the stated one
    t = result.table
    big = t[t["people"] > 1000]
    for _, row in big.iterrows():
        n = row["people"]
        bound = rows["avg_age"]["by_group_size"][1000] * 1000 / n
        assert (row["avg_age_ci_high"] - row["avg_age_ci_low"]) / 2 <= bound * 1.05
    text = preview_markdown(query, 1.0)
    assert "before any budget is spent" in text and "people" in text and "avg_age" in text


@pytest.mark.parametrize("noise", ["laplace", "gaussian"])
def test_the_preview_writes_the_interval_the_release_reports_to_the_last_digit(noise):
    """For counts (of rows and of people) and a sum of an integer column, at several epsilons and
    confidences, the preview's half-width is the released one exactly (not a continuous
    approximation: a count's `± 10.5` where the release says `[52, 72]`), and it is written as the
    summary and the reports write numbers (`display.halfwidth`: `±10` for a count)."""
    import numpy as np
    import pandas as pd

    import dp_core as dp
    from dp_core import display
    from dprelease.preview import accuracy_preview, preview_markdown

    rng = np.random.default_rng(20261129)
    df = pd.DataFrame({"uid": np.arange(6000), "g": rng.choice(["a", "b", "c"], 6000),
                       "x": rng.integers(0, 50, 6000)})
    for epsilon, confidence in ((0.3, 0.9), (1.0, 0.95), (2.5, 0.99)):
        q = dp.Query([dp.count(upper=1, name="rows"), dp.count_units(name="people"), dp.sum_("x", 0, 50, name="total")],
                     privacy_unit="uid", group_by=("g",), epsilon=epsilon, confidence=confidence, noise=noise,
                     delta=1e-6 if noise == "gaussian" else 0.0, public_partitions=("a", "b", "c"))
        previewed = {r["statistic"]: r for r in accuracy_preview(q, epsilon, integer_columns={"x"})}
        text = preview_markdown(q, epsilon, integer_columns={"x"})
        table = dp.execute(q, df).table
        for name, kind in (("rows", "count"), ("people", "count_units"), ("total", "sum")):
            unclipped = table[table[f"{name}_ci_low"] > 0]  # an interval is clipped at 0 only
            halves = (set(unclipped[f"{name}_ci_high"] - unclipped[name])
                      | set(unclipped[name] - unclipped[f"{name}_ci_low"]))
            assert len(unclipped) == 3 and len(halves) == 1, (name, halves)
            (half,) = halves
            assert previewed[name]["halfwidth"] == half, (noise, epsilon, confidence, name)
            assert f"| {name} | {display.halfwidth(half, display.is_integer_kind(kind))} |" in text, text
