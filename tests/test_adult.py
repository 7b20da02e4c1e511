"""Accuracy on real data: the UCI Adult extract shipped under examples/data."""

from __future__ import annotations

import numpy as np

import dp_core as dp


def test_median_age_within_two_years_at_epsilon_one(adult):
    q = dp.Query([dp.median("age", 0, 120)], privacy_unit="person_id", epsilon=1.0)
    for _ in range(20):  # each draw fails with probability far below 1e-9 (exponential mechanism)
        r = dp.execute(q, adult)
        assert abs(r.table["median_age"].iloc[0] - adult["age"].median()) <= 2.0


def test_count_by_education_within_its_interval(adult):
    truth = adult.groupby("education").size()
    q = dp.Query([dp.count(upper=1, name="n")], privacy_unit="person_id", group_by=("education",), epsilon=1.0)
    r = dp.execute(q, adult).table.set_index("education")
    assert set(r.index) <= set(truth.index) and len(r) >= 14  # "Preschool" (51 people) may be dropped
    inside = (r["n_ci_low"] <= truth[r.index]) & (truth[r.index] <= r["n_ci_high"])
    # 95% intervals: P(9 or more of 16 miss) < 1e-7
    assert (~inside).sum() <= 8
    # at level 1 - 1e-9 every interval covers (a union bound over 16 partitions: miss < 2e-8)
    strict = dp.execute(dp.Query(q.aggregates, privacy_unit="person_id", group_by=("education",), epsilon=1.0,
                                 confidence=1 - 1e-9), adult).table.set_index("education")
    t = truth[strict.index]
    assert ((strict["n_ci_low"] <= t) & (t <= strict["n_ci_high"])).all()


def test_demo_release_has_every_column_and_a_sound_split(adult):
    q = dp.Query(
        [dp.count(upper=1), dp.avg("age", 17, 90), dp.sum_("capital_gain", 0, 20_000), dp.median("age", 17, 90)],
        privacy_unit="person_id", group_by=("education", "sex"), epsilon=1.0, delta=1e-6,
    )
    r = dp.execute(q, adult)
    assert r.epsilon_spent <= 1.0 + 1e-12 and r.delta_spent <= 1e-6
    for name in ("count", "avg_age", "sum_capital_gain"):
        assert np.all(r.table[f"{name}_ci_low"] <= r.table[name])
        assert np.all(r.table[name] <= r.table[f"{name}_ci_high"])
    assert r.table["avg_age"].between(17, 90).all()
