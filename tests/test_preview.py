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
