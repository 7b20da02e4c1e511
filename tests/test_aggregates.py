"""Aggregate semantics: missing values, repeated values in quantiles, exactness of integer sums."""

from __future__ import annotations

import datetime as dt

import numpy as np
import pandas as pd
import pytest

import dp_core as dp


def test_units_with_only_missing_values_contribute_nothing():
    """Half the units have no value: they must not count as L (DuckDB's least/greatest skip NULL)."""
    n = 4000
    x = pd.array([None] * (n // 2) + [80.0] * (n // 2), dtype="Float64")
    df = pd.DataFrame({"uid": np.arange(n), "x": x})
    q = dp.Query([dp.avg("x", 0, 100, name="a"), dp.sum_("x", 10, 100, name="s"), dp.var("x", 0, 100, name="v")],
                 privacy_unit="uid", epsilon=3.0)
    exact = dp.execute(q, df).controller_only.exact.iloc[0]
    assert exact["a"] == pytest.approx(80.0)
    assert exact["s"] == pytest.approx(80.0 * n / 2)
    assert exact["v"] == pytest.approx(0.0, abs=1e-9)
    r = dp.execute(q, df).table.iloc[0]
    assert abs(r["a"] - 80) < 2  # noise at epsilon 1 per aggregate over 2,000 units is far smaller


def test_a_count_of_a_column_counts_only_the_rows_where_it_is_present():
    """COUNT(x) counts the rows whose x is not missing, COUNT(*) every row (the controller's exact table
    shows both); an unnamed COUNT(x) is released as count_x."""
    x = pd.array([1.0, None, None, 2.0, 3.0, None], dtype="Float64")
    df = pd.DataFrame({"uid": [1, 1, 2, 3, 4, 4], "x": x})
    q = dp.Query([dp.count(upper=5, column="x", name="present"), dp.count(upper=5, name="rows")],
                 privacy_unit="uid", epsilon=1.0)
    exact = dp.execute(q, df).controller_only.exact.iloc[0]
    assert (exact["present"], exact["rows"]) == (3, 6)
    assert dp.count(column="x").label == "count_x"


def test_median_of_a_repeated_value_is_found():
    df = pd.DataFrame({"uid": np.arange(2000), "x": 42.0})
    q = dp.Query([dp.median("x", 0, 100, name="m"), dp.min_("x", 0, 100, name="lo")], privacy_unit="uid", epsilon=10.0)
    for _ in range(5):
        t = dp.execute(q, df).table.iloc[0]
        # the bin holding the 2000 copies is the only one with utility 0; the next bins are 1000 ranks off
        assert abs(t["m"] - 42) < 100 / 1024 + 1e-9
        assert t["lo"] <= 42 + 100 / 1024


def test_min_and_max_search_the_bounds_given_under_their_names():
    """MIN and MAX are the 0- and 1-quantiles over the bounds the caller gives: nothing of the budget
    goes to inferring bounds, the outputs carry the names given, and each lies on the data's side
    of its extreme (every bin below the smallest value is as good a minimum: no rank is skipped)."""
    df = pd.DataFrame({"uid": np.arange(2000), "x": np.linspace(20.0, 60.0, 2000)})
    q = dp.Query([dp.min_("x", 0, 100, name="lowest"), dp.max_("x", 0, 100, name="highest")],
                 privacy_unit="uid", epsilon=10.0)
    r = dp.execute(q, df)
    assert not r.inferred_bounds and [s.part for s in r.budget] == ["lowest", "highest"]
    t = r.table.iloc[0]
    # a bin 10 bins (~1) inside the data is 50 ranks off: weight exp(-125) against the bins outside
    assert 0 <= t["lowest"] < 21 and 59 < t["highest"] <= 100


def test_column_names_and_key_values_are_data_never_sql_text():
    """Every name and value reaches the engine's SQL quoted: a double quote inside a column or output
    name stays part of the name, boolean keys stay TRUE and FALSE; an empty or non-text column name
    is refused. At epsilon 100 the counts' noise is 0 and the sums' (scale 0.04) is below 1 except
    with probability e^-25."""
    from dp_core.errors import InvalidQueryError
    from dp_core.sql_text import ident

    df = pd.DataFrame({"uid": np.arange(4000), "flag": np.arange(4000) % 4 == 0, 'we"ird': 1.0})
    q = dp.Query([dp.count(upper=1, name="n"), dp.sum_('we"ird', 0, 2, name='s"um')], privacy_unit="uid",
                 group_by=("flag",), public_partitions=[True, False], epsilon=100.0)
    t = dp.execute(q, df).table.set_index("flag")
    assert t.loc[True, "n"] == 1000 and t.loc[False, "n"] == 3000
    assert abs(t.loc[True, 's"um'] - 1000) < 1 and abs(t.loc[False, 's"um'] - 3000) < 1
    for bad in ("", 5):
        with pytest.raises(InvalidQueryError, match="column names must be non-empty strings"):
            ident(bad)
    # keys given as numpy scalars (a column's unique values, say) are the same keys
    df = pd.DataFrame({"uid": np.arange(4000), "k": np.arange(4000) % 4})
    q = dp.Query([dp.count(upper=1, name="n")], privacy_unit="uid", group_by=("k",), epsilon=100.0,
                 public_partitions=list(np.array([0, 2, 7], dtype=np.int64)))
    t = dp.execute(q, df).table.set_index("k")
    assert sorted(t.index) == [0, 2, 7] and t.loc[0, "n"] == 1000 and t.loc[2, "n"] == 1000


def test_quantile_picks_each_row_of_a_unit_alike():
    """A unit's value for a quantile is one of its rows at random: with rows {10, 10, 10, 10, 90},
    about 80% of units contribute 10, so the median is near 10 (a by-value pick would give 90)."""
    units = 3000
    df = pd.DataFrame({"uid": np.repeat(np.arange(units), 5), "x": np.tile([10.0, 10.0, 10.0, 10.0, 90.0], units)})
    q = dp.Query([dp.median("x", 0, 100, name="m")], privacy_unit="uid", epsilon=5.0)
    assert abs(dp.execute(q, df).table["m"].iloc[0] - 10) < 1


def test_integer_sums_are_exact_and_released_as_integers():
    df = pd.DataFrame({"uid": np.arange(10), "g": ["a"] * 10, "x": np.arange(10, dtype=np.int64)})
    q = dp.Query([dp.sum_("x", 0, 9, name="s"), dp.count(name="n")], privacy_unit="uid", epsilon=1.0,
                 group_by=("g",), public_partitions=["a"])
    r = dp.execute(q, df)
    assert r.controller_only.exact["s"].iloc[0] == 45
    assert float(r.table["s"].iloc[0]).is_integer() and float(r.table["n"].iloc[0]).is_integer()
    assert {m.grid for m in r.mechanisms} == {1.0}


def test_public_keys_are_compared_in_the_column_type():
    df = pd.DataFrame({"uid": [1, 2], "g": [1, 2]})
    with pytest.raises(dp.InvalidQueryError, match="twice"):
        dp.execute(dp.Query([dp.count()], privacy_unit="uid", group_by=("g",), epsilon=1.0, public_partitions=[1, "1"]), df)
    with pytest.raises(dp.InvalidQueryError, match="do not fit"):
        dp.execute(dp.Query([dp.count()], privacy_unit="uid", group_by=("g",), epsilon=1.0, public_partitions=["x"]), df)
    # keys listed as text are released as the column's values (an integer, a date), not as the text given
    days = pd.to_datetime(["2024-01-01", "2024-01-02"] * 15).date
    df = pd.DataFrame({"uid": range(30), "g": [1, 2, 3] * 10, "d": days})
    for key, listed, released in (("g", ["1", "2"], [1, 2]), ("d", ["2024-01-01"], [pd.Timestamp("2024-01-01")])):
        r = dp.execute(dp.Query([dp.count(upper=1)], privacy_unit="uid", group_by=(key,), epsilon=1.0,
                                public_partitions=listed), df)
        assert r.table[key].tolist() == released, r.table[key].tolist()


def test_quantile_over_a_public_partition_with_no_rows_is_released():
    """A public partition absent from the data still gets its quantile (the exponential mechanism
    over an empty histogram: uniform over [L, U]), instead of failing on the missing histogram."""
    import dp_core as dp

    df = pd.DataFrame({"u": range(100), "g": ["a"] * 100, "x": range(100)})
    query = dp.Query([dp.median("x", 0, 100)], privacy_unit="u", group_by=("g",), epsilon=1.0,
                     public_partitions=["a", "b"])
    table = dp.execute(query, df).table.set_index("g")
    assert set(table.index) == {"a", "b"}
    assert 0 <= table.loc["b", "median_x"] <= 100


def test_a_quantile_is_drawn_uniformly_within_the_bin_the_mechanism_chose():
    """All the mass in bin 5 of 10 over [0, 10) and a budget that leaves no doubt: every release lies in
    [5, 6), the bin chosen, spread over it (not in the bin below, nor at one point of it)."""
    from dp_core.accounting import Share
    from dp_core.quantiles import exponential_quantile

    counts = np.zeros((2000, 10))
    counts[:, 5] = 1_000_000
    values, record = exponential_quantile(counts, 0.5, 0.0, 10.0, target="q", share=Share("q", epsilon=50.0),
                                          max_partitions=1)
    assert ((values >= 5.0) & (values < 6.0)).all()
    assert np.histogram(values, bins=4, range=(5.0, 6.0))[0].min() > 400  # each quarter holds about 500
    assert record.grid == 1.0


@pytest.mark.parametrize("cu", [1, 3])
def test_the_quantile_s_bin_is_drawn_with_the_exponential_mechanism_s_probabilities(cu):
    """A q = 0.9 quantile over 6 bins whose rank distances are 9, 8, 7, 6, 5 and 0: each bin is chosen with
    probability proportional to exp(-(epsilon / C_u) d / (2 max(q, 1 - q))), the exponential mechanism at its
    sensitivity with a unit's epsilon split over its C_u partitions (a sharper law would spend more than
    epsilon; the share is C_u times 0.5, so the law is the same for every C_u). 300,000 draws, chi-square,
    false-failure rate 1e-7 per C_u."""
    from scipy.stats import chisquare

    from dp_core.accounting import Share
    from dp_core.quantiles import exponential_quantile

    counts = np.tile([0.0, 1.0, 1.0, 1.0, 1.0, 6.0], (300_000, 1))  # rank 0.9 * 10 = 9: inside the last bin
    cum = np.cumsum(counts[0])
    distance = np.maximum(np.maximum(cum - counts[0] - 9.0, 9.0 - cum), 0.0)
    assert distance.tolist() == [9.0, 8.0, 7.0, 6.0, 5.0, 0.0]
    epsilon = 0.5  # per partition
    law = np.exp(-epsilon * distance / (2 * 0.9))
    law /= law.sum()
    values, record = exponential_quantile(counts, 0.9, 0.0, 6.0, target="q", share=Share("q", epsilon=epsilon * cu),
                                          max_partitions=cu)
    assert (record.epsilon, record.sensitivity_per_partition, record.sensitivity) == (epsilon * cu, 0.9, 0.9 * cu)
    observed = np.bincount(np.floor(values).astype(int), minlength=6)
    assert chisquare(observed, law * len(values)).pvalue > 1e-7


def test_a_single_group_by_column_may_be_given_as_its_name():
    """group_by="dept" is the one column dept (not the letters of its name), as group_by=("dept",) is."""
    df = pd.DataFrame({"uid": np.arange(400), "dept": np.where(np.arange(400) % 4 == 0, "hr", "it")})
    q = dp.Query([dp.count(name="n")], privacy_unit="uid", group_by="dept", epsilon=50.0, public_partitions=["hr", "it"])
    assert q.group_by == ("dept",)
    released = dp.execute(q, df).table.set_index("dept")["n"]
    assert released.to_dict() == pytest.approx({"hr": 100, "it": 300}, abs=2)


def test_public_partitions_taken_from_a_frame_s_float_column_are_the_numbers_they_hold():
    """`df["g"].unique()` gives NumPy float64 keys: each is the number it holds (its SQL was written
    "np.float64(0.5)", a DuckDB catalog error, until 2026-11-25). Epsilon 100: the noise is far below 0.5."""
    df = pd.DataFrame({"uid": np.arange(400), "g": np.where(np.arange(400) % 4 == 0, 0.5, 1.25)})
    q = dp.Query([dp.count_units(name="n")], privacy_unit="uid", group_by=("g",), epsilon=100.0,
                 public_partitions=list(df["g"].unique()) + [np.float64(2.75)])
    released = dp.execute(q, df).table.set_index("g")["n"].round()
    assert released.to_dict() == {0.5: 100.0, 1.25: 300.0, 2.75: 0.0}


def test_a_public_key_sql_cannot_hold_is_refused_naming_it_and_its_type():
    df = pd.DataFrame({"uid": [1, 2], "g": ["a", "b"]})
    for key, shown in ((1 + 2j, "(1+2j) (complex)"), (dt.timedelta(days=1), "datetime.timedelta(days=1) (timedelta)")):
        with pytest.raises(dp.InvalidQueryError) as refused:
            dp.execute(dp.Query([dp.count()], privacy_unit="uid", group_by=("g",), epsilon=1.0,
                                public_partitions=[key]), df)
        assert str(refused.value) == f"cannot use {shown} as a partition key or bound"


def test_every_statistic_keeps_the_budget_weight_it_is_given():
    """Each statistic's constructor passes its weight on (the share of the budget it is given)."""
    made = [dp.count(weight=3.0), dp.count_units(weight=3.0), dp.sum_("x", 0, 1, weight=3.0),
            dp.avg("x", 0, 1, weight=3.0), dp.var("x", 0, 1, weight=3.0), dp.stddev("x", 0, 1, weight=3.0),
            dp.quantile("x", 0.9, 0, 1, weight=3.0), dp.median("x", 0, 1, weight=3.0), dp.min_("x", 0, 1, weight=3.0),
            dp.max_("x", 0, 1, weight=3.0)]
    assert [a.weight for a in made] == [3.0] * len(made)


def test_the_controller_s_exact_variance_and_standard_deviation_are_the_data_s():
    """The controller's exact values of VAR and STDDEV are the population variance of each partition
    and its square root: a: 20 and 60 alike (variance 400, sd 20); b: 10, 20, 30, 40 (variance 125)."""
    df = pd.DataFrame({"uid": np.arange(2000), "g": np.repeat(["a", "b"], 1000),
                       "x": np.concatenate([np.tile([20.0, 60.0], 500), np.tile([10.0, 20.0, 30.0, 40.0], 250)])})
    q = dp.Query([dp.var("x", 0, 100, name="v"), dp.stddev("x", 0, 100, name="sd")], privacy_unit="uid",
                 group_by=("g",), public_partitions=["a", "b"], epsilon=1.0)
    exact = dp.execute(q, df).controller_only.exact.set_index("g")
    assert exact.loc["a", "v"] == pytest.approx(400.0) and exact.loc["a", "sd"] == pytest.approx(20.0)
    assert exact.loc["b", "v"] == pytest.approx(125.0) and exact.loc["b", "sd"] == pytest.approx(125.0 ** 0.5)


def test_a_standard_deviation_s_noise_sd_is_first_order_capped_by_the_root_of_its_variance_s():
    """sd of sqrt(V') around sqrt(V): s / (2 sqrt(V)) to first order, never above sqrt(s) (for a, b >= 0,
    |sqrt(a) - sqrt(b)| <= sqrt(|a - b|)); at V = 0, where the first order is infinite, sqrt(s)."""
    from dp_core.aggregates import stddev_noise_sd

    sd = stddev_noise_sd(np.array([0.0, 1e-12, 4.0]), np.array([0.01, 0.01, 0.01]))
    assert sd.tolist() == pytest.approx([0.1, 0.1, 0.0025])


def test_a_standard_deviation_whose_noisy_variance_is_clipped_to_zero_has_a_finite_noise_sd():
    """Every unit's value is 5: each partition's true variance is 0 and its noisy one is clipped to 0
    about half the time (P(no partition of 200 is) ~ 2^-200); each such partition gets sqrt(s) for a
    noise sd, not NaN."""
    df = pd.DataFrame({"uid": np.arange(4000), "g": np.repeat(np.arange(200), 20), "x": 5.0})
    q = dp.Query([dp.stddev("x", 0, 10, name="sd")], privacy_unit="uid", group_by=("g",),
                 public_partitions=list(range(200)), epsilon=1.0)
    table = dp.execute(q, df).table
    zero = table["sd"] == 0.0
    assert zero.sum() > 0
    assert np.isfinite(table["sd_noise_sd"]).all() and (table.loc[zero, "sd_noise_sd"] > 0).all()


def test_a_sum_of_values_never_above_zero_is_released_at_or_below_zero():
    """With bounds [-10, 0] a sum cannot be positive: the released value and its interval are capped
    at 0. Forty partitions whose true sum is 0: without the cap each interval's top would lie above 0
    with probability 0.975 (the noise is symmetric), all forty below it with probability 0.025^40."""
    keys = list(range(40))
    df = pd.DataFrame({"uid": np.arange(4000), "k": np.arange(4000) % 40, "x": 0.0})
    q = dp.Query([dp.sum_("x", -10, 0, name="s")], privacy_unit="uid", group_by=("k",), public_partitions=keys,
                 epsilon=1.0)
    t = dp.execute(q, df).table
    assert len(t) == 40
    assert (t["s"] <= 0).all() and (t["s_ci_high"] <= 0).all() and (t["s_ci_low"] <= t["s"]).all()


def test_a_missing_key_listed_among_the_public_partitions_is_released_as_its_own_partition():
    """A public partition None is the group of rows whose key is missing, released beside the others
    (epsilon 100: the counts' noise is 0); a listed key no row has is released as 0."""
    df = pd.DataFrame({"uid": np.arange(3000), "g": ["a", None, "b"] * 1000})
    q = dp.Query([dp.count(upper=1, name="n")], privacy_unit="uid", group_by=("g",), epsilon=100.0,
                 public_partitions=[None, "a", "c"])
    t = dp.execute(q, df).table
    assert t["g"].tolist()[:2] == ["a", "c"] and pd.isna(t["g"].iloc[2]) and len(t) == 3
    assert t["n"].tolist() == [1000.0, 0.0, 1000.0]


def test_a_released_average_lies_within_its_bounds_whatever_the_noise():
    """AVG releases its noisy mean clamped to [lower, upper] (post-processing: the true mean lies there).
    60 public partitions of 5 people each, half of them all at the lower bound, half at the upper, at a
    small epsilon: about half of each half comes out past its bound before clamping, so some land exactly
    on each bound (each fails to with probability about 2^-30) and none beyond it."""
    keys = [f"p{i:02d}" for i in range(60)]
    df = pd.DataFrame({"uid": np.arange(300), "g": np.repeat(keys, 5), "x": np.repeat([0.0, 10.0], 150)})
    q = dp.Query([dp.avg("x", 0, 10, name="m")], privacy_unit="uid", group_by=("g",), epsilon=0.5,
                 public_partitions=keys)
    released = dp.execute(q, df).table.set_index("g")["m"]
    low, high = released[keys[:30]], released[keys[30:]]
    assert released.between(0.0, 10.0).all(), released.describe()
    assert (low == 0.0).any() and (high == 10.0).any()


def test_an_empty_list_of_public_partitions_releases_an_empty_table():
    """public_partitions=[] names no partition: the release is a table of the key and statistic columns
    without rows (its SQL was `(VALUES )`, a syntax error, until 2026-11-25)."""
    df = pd.DataFrame({"uid": np.arange(50), "g": ["a", "b"] * 25, "x": 1.0})
    q = dp.Query([dp.count_units(name="n"), dp.sum_("x", 0, 2, name="s")], privacy_unit="uid", group_by=("g",),
                 epsilon=1.0, public_partitions=[])
    table = dp.execute(q, df).table
    assert len(table) == 0 and {"g", "n", "s"} <= set(table.columns)


def test_a_quantile_over_no_partition_releases_an_empty_table():
    """Quantiles over public_partitions=[] (no partition to release) give a table with the key and
    quantile columns and no rows: the exponential mechanism runs over zero histograms without failing."""
    df = pd.DataFrame({"uid": np.arange(50), "g": ["a", "b"] * 25, "x": np.arange(50) % 7 * 1.0})
    q = dp.Query([dp.median("x", 0, 10, name="m"), dp.quantile("x", 0.9, 0, 10, name="p90")], privacy_unit="uid",
                 group_by=("g",), epsilon=1.0, public_partitions=[])
    table = dp.execute(q, df).table
    assert len(table) == 0 and {"g", "m", "p90"} <= set(table.columns)


def test_an_empty_release_of_public_partitions_keeps_each_key_column_s_type():
    """With public_partitions=[] the released table's key columns have the types of the input's keys
    (an integer key stays integer, a real one real), as in a release that names a partition."""
    df = pd.DataFrame({"uid": np.arange(40), "k": np.arange(40) % 3, "r": (np.arange(40) % 2) / 2.0})
    types = {}
    for public in ([], [(0, 0.5)]):
        q = dp.Query([dp.count_units(name="n")], privacy_unit="uid", group_by=("k", "r"), epsilon=1.0,
                     public_partitions=public)
        table = dp.execute(q, df).table
        types[len(public)] = (str(table["k"].dtype), str(table["r"].dtype))
    assert types[0] == types[1] == ("int64", "float64")


def test_an_integer_sum_of_units_near_two_to_the_53_is_released_not_overflowed():
    """An integer SUM was summed exactly (quantum 1) in BIGINT whatever its bounds: 3,000 units of
    2^53 each (2.7e19, past 2^63) failed with the engine's conversion error. Bounds past 2^33 are now
    quantised as a real SUM's are (quantum 2^21 here, which 2^53 is a multiple of), so the release
    runs, its exact value is exactly 3,000 x 2^53 and its sensitivity is still the bound."""
    units = 3000
    df = pd.DataFrame({"uid": np.repeat(np.arange(units), 2), "v": np.full(2 * units, 2**53, dtype=np.int64)})
    result = dp.execute(dp.Query([dp.sum_("v", 0, 2**53, name="s")], privacy_unit="uid", epsilon=1.0), df)
    assert result.controller_only.exact["s"].iloc[0] == units * 2.0**53
    assert [m.sensitivity for m in result.mechanisms] == [2.0**53]
    assert np.isfinite(result.table["s"].iloc[0])
