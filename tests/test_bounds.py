"""APPROX_BOUNDS (usability.md): bounds inferred from a noisy log histogram."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pandas as pd
import pytest

import dp_core as dp
from dp_core import bounds


@pytest.mark.parametrize("eps,cu,bins,failure", [(0.5, 1, 64, 1e-9), (1.0, 4, 192, 1e-9), (0.1, 2, 128, 1e-6)])
def test_threshold_matches_its_derivation(eps, cu, bins, failure):
    k = bounds.continuous_threshold(eps, cu, bins, failure)
    e = eps / cu
    p_empty_passes = math.exp(-k * e) / 2  # P[Lap(C_u / eps) > K]
    assert (1 - p_empty_passes) ** (bins - 1) == pytest.approx(1 - failure, abs=1e-12)
    kd = bounds.discrete_threshold(eps, cu, bins, failure)
    q = math.exp(-e)
    passes = lambda t: q ** (t + 1) / (1 + q)
    assert (1 - passes(kd)) ** (bins - 1) >= 1 - failure
    assert kd == 0 or (1 - passes(kd - 1)) ** (bins - 1) < 1 - failure
    assert abs(kd - k) <= 1 + 1 / e


def test_bin_layout_covers_64_bit_integers_and_small_reals():
    ints = bounds.bin_layout(integer=True, signed=False)
    assert len(ints) == 64 and ints[0][2:] == (0.0, 2.0) and ints[1][2:] == (2.0, 4.0) and ints[-1][3] == 2.0**64
    reals = bounds.bin_layout(integer=False, signed=True)
    assert len(reals) == 2 * (64 + 32)
    edges = [(lo, hi) for _, _, lo, hi in reals]
    assert all(a[1] == b[0] for a, b in zip(edges, edges[1:]))  # contiguous, ascending
    assert (0.0, 2.0**-31) in edges and (-(2.0**-31), -0.0) in edges


@pytest.mark.parametrize("column", ["capital_gain", "hours_per_week"])
def test_inferred_bounds_cover_95_percent_of_adult(adult, column):
    q = dp.Query([dp.Aggregate("sum", column=column, name="s")], privacy_unit="person_id", epsilon=1.0)
    for _ in range(5):
        r = dp.execute(q, adult)
        (b,) = r.inferred_bounds
        values = adult[column]
        assert ((values >= b.lower) & (values <= b.upper)).mean() >= 0.95
        assert b.outside_share < 0.05
        # the split: half of the aggregate's epsilon to the bounds, stated in the result
        shares = {s.part: s.epsilon for s in r.budget}
        assert shares["bounds of s"] == pytest.approx(0.5) and shares["s"] == pytest.approx(0.5)
        d = r.to_dict()
        assert d["inferred_bounds"][0]["upper"] == b.upper and len(d["inferred_bounds"][0]["bins"]) == 128


def test_the_share_outside_the_inferred_bounds_counts_the_bins_left_out():
    """10,000 values at 100 and 40 far above, two in each of 20 bins (2^20 .. 2^39): the bounds keep
    [64, 128], and the stated share of values outside them is the 40 left out (0.4%), not zero.
    Epsilon 5 for the bounds: a left-out bin passes the threshold (5) only with noise >= 4, each
    empty bin with noise >= 6: together below 1e-7."""
    x = np.concatenate([np.full(10_000, 100.0), np.repeat(2.0 ** np.arange(20, 40), 2)])
    df = pd.DataFrame({"uid": np.arange(x.size), "x": x})
    r = dp.execute(dp.Query([dp.Aggregate("sum", column="x", name="s")], privacy_unit="uid", epsilon=10.0), df)
    (b,) = r.inferred_bounds
    assert (b.lower, b.upper, b.threshold) == (64.0, 128.0, 5)
    assert b.outside_share == pytest.approx(40 / x.size, abs=0.002)  # 20 units of noise off: below 1e-12


def test_tiny_data_gives_the_clear_error_and_releases_nothing():
    df = pd.DataFrame({"uid": range(20), "x": np.arange(20.0)})
    with pytest.raises(dp.BoundsError, match="more epsilon, use more data, or set the bounds by hand"):
        dp.execute(dp.Query([dp.Aggregate("avg", column="x")], privacy_unit="uid", epsilon=1.0), df)


def test_signed_and_fractional_values_get_sensible_bounds():
    x = np.linspace(-0.3, 0.7, 20_000)
    df = pd.DataFrame({"uid": np.arange(x.size), "x": x})
    r = dp.execute(dp.Query([dp.Aggregate("avg", column="x", name="a")], privacy_unit="uid", epsilon=2.0), df)
    (b,) = r.inferred_bounds
    assert -0.5 <= b.lower <= -0.25 and 0.5 <= b.upper <= 1.0  # powers of two around the data
    assert abs(r.table["a"].iloc[0] - 0.2) < 0.05
    ints = pd.DataFrame({"uid": np.arange(10_000), "x": np.arange(10_000) % 100 - 50})
    r = dp.execute(dp.Query([dp.Aggregate("sum", column="x", name="s")], privacy_unit="uid", epsilon=1.0), ints)
    (b,) = r.inferred_bounds
    assert b.lower == -63 and b.upper == 63  # integer bins (-64, -32] and [32, 64), inclusive integer edges


def test_only_the_missing_bound_is_inferred_and_counts_start_at_zero():
    df = pd.DataFrame({"uid": np.repeat(np.arange(3000), 3), "x": 5.0})
    r = dp.execute(dp.Query([dp.Aggregate("sum", column="x", lower=0, name="s"), dp.Aggregate("count", name="n")],
                            privacy_unit="uid", epsilon=2.0), df)
    by_name = {b.aggregate: b for b in r.inferred_bounds}
    assert by_name["s"].lower is None and by_name["s"].upper >= 15  # per-unit sums are 15
    assert by_name["n"].upper == 3 and r.query.aggregates[1].upper == 3  # [2, 4) holds 3 rows


def _magnitudes(rng, small=20_000, big=19_990):
    return pd.DataFrame({
        "uid": np.arange(small + big),
        "g": np.repeat(["small", "big"], [small, big]),
        "x": np.concatenate([rng.uniform(0, 3, small), rng.uniform(0, 3e5, big)]),
    })


def test_per_partition_bounds_fit_each_partition_and_its_noise():
    df = _magnitudes(np.random.default_rng(5))
    q = dp.Query([dp.Aggregate("sum", column="x", name="s"), dp.Aggregate("avg", column="x", name="a")],
                 privacy_unit="uid", group_by=("g",), epsilon=2.0, bounds_scope="partition")
    r = dp.execute(q, df)
    by = {(b.aggregate, b.partition["g"]): b for b in r.inferred_bounds}
    assert by[("s", "small")].upper == 4.0 and by[("s", "big")].upper == 524288.0
    t = r.table.set_index("g")
    truth = df.groupby("g")["x"].sum()
    # the small partition's noise is sized for its own bounds: its interval is narrow
    assert t.loc["small", "s_ci_high"] - t.loc["small", "s_ci_low"] < 1000
    assert abs(t.loc["small", "s"] - truth["small"]) < 1000
    assert abs(t.loc["small", "a"] - df[df.g == "small"].x.mean()) < 0.05
    scales = {m.target: m for m in r.mechanisms if m.target.startswith("s.sum")}
    small = next(m for k, m in scales.items() if "[0.015625, 4]" in k)
    assert small.sensitivity_per_partition == pytest.approx(4.0, rel=1e-6)
    # dataset-wide bounds size the small partition's noise for the widest values (its interval,
    # clipped at 0, can even collapse): compare the noise itself
    whole = dp.execute(replace_scope(q, "dataset"), df).table.set_index("g")
    assert whole.loc["small", "s_noise_sd"] > 100 * t.loc["small", "s_noise_sd"]


def test_per_partition_bounds_with_two_group_keys_are_inferred_for_each_pair_of_keys():
    """bounds_scope="partition" with GROUP BY two columns: one histogram per (g, h) pair, each pair
    released with bounds that fit its own values (epsilon 8: the histogram's noise is far below the
    2,000 rows per pair). group_by given as one column name is that one column."""
    rows = []
    for g, h, high in (("a", "x", 3.0), ("a", "y", 300.0), ("b", "x", 3000.0)):
        rows += [{"g": g, "h": h, "v": high * (i % 10 + 1) / 10} for i in range(2000)]
    df = pd.DataFrame(rows).assign(uid=range(len(rows)))
    q = dp.Query([dp.Aggregate("sum", column="v", name="s")], privacy_unit="uid", group_by=("g", "h"),
                 epsilon=8.0, bounds_scope="partition")
    r = dp.execute(q, df)
    uppers = {(b.partition["g"], b.partition["h"]): b.upper for b in r.inferred_bounds}
    assert uppers == {("a", "x"): 4.0, ("a", "y"): 512.0, ("b", "x"): 4096.0}
    one = dp.Query([dp.count(upper=1)], privacy_unit="uid", group_by="g", epsilon=1.0, public_partitions=["a", "b"])
    assert one.group_by == ("g",)
    assert sorted(dp.execute(one, df).table["g"]) == ["a", "b"]


def test_per_partition_bounds_apply_to_partitions_keyed_by_floats():
    """A float group key (0.5, 1.5) keys its partition's bounds like any other value: both
    partitions are released, each with the bounds of its own values."""
    rows = []
    for g, high in ((0.5, 3.0), (1.5, 3000.0)):
        rows += [{"g": g, "v": high * (i % 10 + 1) / 10} for i in range(2000)]
    df = pd.DataFrame(rows).assign(uid=range(len(rows)))
    q = dp.Query([dp.Aggregate("sum", column="v", name="s")], privacy_unit="uid", group_by=("g",),
                 epsilon=8.0, bounds_scope="partition")
    r = dp.execute(q, df)
    assert sorted((b.partition["g"], b.upper) for b in r.inferred_bounds) == [(0.5, 4.0), (1.5, 4096.0)]
    released = r.table.set_index("g")["s"]
    assert sorted(released.index) == [0.5, 1.5]
    assert released[0.5] == pytest.approx(3300, rel=0.05) and released[1.5] == pytest.approx(3.3e6, rel=0.05)


def test_inferred_bounds_skip_a_nan_computed_by_a_dp_select():
    """NaN computed in a DP SELECT's source (a derived input: not checked like a table's values) is
    missing for the histograms of automatic bounds, per partition or not: half the units of each
    partition have NaN, and the bounds stay those of the other half's values (1 to 3: [1, 4]), not
    the top bin's 2^64 (noise of sd 1e19). Epsilon 8: an empty bin passes with probability 1e-9
    (bounds_failure), the 1,000 values of each partition stand far out of the noise."""
    from dp_core.sql import Table, run_sql

    n = 4000
    df = pd.DataFrame({"uid": range(n), "g": ["a", "b"] * (n // 2), "x": [float(1 + i % 3) for i in range(n)]})
    sql = ("SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS (epsilon = 8, privacy_unit_column = uid) g, "
           "SUM(CASE WHEN uid % 4 < 2 THEN x ELSE 'NaN'::DOUBLE END) AS s FROM people GROUP BY g")
    r = run_sql(sql, {"people": Table(df, "uid")}, bounds_scope="partition")
    found = sorted((b.partition["g"], b.lower, b.upper) for b in r.inferred_bounds)
    assert found == [("a", 1.0, 4.0), ("b", 1.0, 4.0)]
    whole = run_sql(sql, {"people": Table(df, "uid")})  # one histogram for the dataset: the same
    assert [(b.lower, b.upper) for b in whole.inferred_bounds] == [(1.0, 4.0)]


def test_only_the_missing_bound_is_inferred():
    """A sum given its upper bound but not its lower: the lower bound is inferred (a power of two
    below the data, epsilon 8 making the histogram's noise negligible next to 2,000 rows), the upper
    one is kept as given."""
    df = pd.DataFrame({"uid": range(2000), "x": [-40.0 + (i % 5) for i in range(2000)]})
    q = dp.Query([dp.Aggregate("sum", column="x", name="s", upper=10)], privacy_unit="uid", epsilon=8.0)
    r = dp.execute(q, df)
    (inferred,) = r.inferred_bounds
    assert (inferred.lower, inferred.upper) == (-64.0, None)
    assert (r.query.aggregates[0].lower, r.query.aggregates[0].upper) == (-64, 10)


def replace_scope(q, scope):
    from dataclasses import replace

    return replace(q, bounds_scope=scope)


def test_per_partition_bounds_limit_one_units_influence_to_its_partitions_bounds():
    from dataclasses import replace

    from dp_core.aggregates import component_sensitivity
    from dp_core.backend import DuckDBBackend
    from dp_core.bounding import build_plan

    rng = np.random.default_rng(6)
    base = _magnitudes(rng, 2000, 2000).assign(x=lambda d: d.x.round(3))
    heavy = pd.DataFrame({"uid": 10**7, "g": ["small", "big"] * 50, "x": 1e9})
    bounds = {0: pd.DataFrame({"g": ["small", "big"], "lo": [0.0, 2048.0], "hi": [4.0, 524288.0]})}
    q = dp.Query([dp.sum_("x", 0, 1, name="s")], privacy_unit="uid", group_by=("g",), epsilon=1.0,
                 max_partitions_contributed=2)

    def sums(df):
        plan = build_plan(q, set(), 77, partition_bounds=bounds)
        out = DuckDBBackend.for_input(df).run(plan.sql).set_index("g").sort_index()
        return out, plan

    before, plan = sums(base)
    after, _ = sums(pd.concat([base, heavy], ignore_index=True))
    comp = plan.aggregates[0].components[0]
    for g, lo, hi in [("small", 0.0, 4.0), ("big", 2048.0, 524288.0)]:
        d = component_sensitivity(replace(q.aggregates[0], lower=lo, upper=hi), comp)
        assert abs(after.loc[g, "_a0_sum"] - before.loc[g, "_a0_sum"]) <= d
        assert d * comp.quantum == pytest.approx(max(abs(lo), abs(hi)), rel=1e-6)


def test_a_sum_with_per_partition_bounds_counts_a_unit_below_its_partition_s_lower_bound_as_that_bound():
    """SUM with per-partition bounds: a unit far below every partition's lower bound is clamped up to
    each partition's own lower bound, so it adds exactly that bound (in quanta) to each partition's sum."""
    from dp_core.aggregates import _quantise_py
    from dp_core.backend import DuckDBBackend
    from dp_core.bounding import build_plan

    base = _magnitudes(np.random.default_rng(6), 2000, 2000).assign(x=lambda d: d.x.round(3))
    light = pd.DataFrame({"uid": 10**7, "g": ["small", "big"] * 50, "x": -1e9})
    bounds = {0: pd.DataFrame({"g": ["small", "big"], "lo": [1.0, 2048.0], "hi": [4.0, 524288.0]})}
    q = dp.Query([dp.sum_("x", 0, 1, name="s")], privacy_unit="uid", group_by=("g",), epsilon=1.0,
                 max_partitions_contributed=2)
    plan = build_plan(q, set(), 77, partition_bounds=bounds)
    (comp,) = plan.aggregates[0].components

    def sums(df):
        return DuckDBBackend.for_input(df).run(plan.sql).set_index("g")["_a0_sum"]

    before, after = sums(base), sums(pd.concat([base, light], ignore_index=True))
    for g, lo in [("small", 1.0), ("big", 2048.0)]:
        assert after[g] - before[g] == _quantise_py(lo, comp.quantum), g


@pytest.mark.parametrize("kind", ["avg", "var", "stddev"])
def test_per_partition_bounds_limit_a_units_influence_on_every_component_of_a_ratio(kind):
    """AVG, VAR and STDDEV with per-partition bounds: a unit far below or far above its
    partition's bounds moves each summed component (N, S, Q) of each partition by exactly that
    partition's own sensitivity: the noise calibrated for it covers the unit, and is no larger."""
    from dataclasses import replace

    from dp_core.aggregates import component_sensitivity
    from dp_core.backend import DuckDBBackend
    from dp_core.bounding import build_plan

    base = _magnitudes(np.random.default_rng(8), 2000, 2000).assign(x=lambda d: d.x.round(3))
    bounds = {0: pd.DataFrame({"g": ["small", "big"], "lo": [1.0, 2048.0], "hi": [4.0, 524288.0]})}
    q = dp.Query([dp.Aggregate(kind, column="x", lower=0.0, upper=1.0, name="r")], privacy_unit="uid",
                 group_by=("g",), epsilon=1.0, max_partitions_contributed=2)
    plan = build_plan(q, set(), 77, partition_bounds=bounds)
    components = plan.aggregates[0].components
    assert {c.key for c in components} == ({"N", "S"} if kind == "avg" else {"N", "S", "Q"})

    def sums(df):
        return DuckDBBackend.for_input(df).run(plan.sql).set_index("g").sort_index()

    before = sums(base)
    for value in (-1e9, 1e9):
        heavy = pd.DataFrame({"uid": 10**7, "g": ["small", "big"] * 50, "x": value})
        after = sums(pd.concat([base, heavy], ignore_index=True))
        for g, lo, hi in [("small", 1.0, 4.0), ("big", 2048.0, 524288.0)]:
            for c in components:
                d = component_sensitivity(replace(q.aggregates[0], lower=lo, upper=hi), c)
                # the unit clamped to a bound moves each component by exactly d: no noise is wasted either
                assert abs(after.loc[g, c.column] - before.loc[g, c.column]) == d, (value, g, c.key)


def test_a_partition_without_inferable_bounds_is_not_released():
    rng = np.random.default_rng(7)
    spread = pd.DataFrame({"uid": np.arange(300) + 10**6, "g": "spread", "x": 2.0 ** (np.arange(300) % 30)})
    df = pd.concat([_magnitudes(rng, 5000, 5000), spread], ignore_index=True)
    r = dp.execute(dp.Query([dp.Aggregate("sum", column="x", name="s")], privacy_unit="uid", group_by=("g",),
                            epsilon=1.0, bounds_scope="partition"), df)
    assert set(r.table["g"]) == {"small", "big"}  # 300 units spread over 30 bins: no bin stands out
    assert r.controller_only.partitions_dropped >= 1
    assert all(b.partition["g"] != "spread" for b in r.inferred_bounds)


def test_per_partition_scope_is_refused_where_it_cannot_work():
    df = pd.DataFrame({"uid": [1, 2], "g": ["a", "b"], "x": [1.0, 2.0]})
    with pytest.raises(dp.InvalidQueryError) as refused:
        dp.execute(dp.Query([dp.Aggregate("sum", column="x")], privacy_unit="uid", group_by=("g",), epsilon=1.0,
                            public_partitions=["a", "b"], bounds_scope="partition"), df)
    assert str(refused.value) == ("per-partition bounds need a GROUP BY with private partitions (public partitions "
                                  "may be empty: use bounds_scope='dataset')")
    with pytest.raises(dp.InvalidQueryError, match="quantiles"):
        dp.execute(dp.Query([dp.Aggregate("quantile", column="x", q=0.5)], privacy_unit="uid", group_by=("g",),
                            epsilon=1.0, bounds_scope="partition"), df)


def test_inferred_bounds_serialise_with_their_histogram():
    """to_dict (what the release's JSON carries) has every field under its name, one entry per bin."""
    df = pd.DataFrame({"uid": np.arange(3000), "x": np.linspace(1.0, 100.0, 3000)})
    r = dp.execute(dp.Query([dp.Aggregate("sum", column="x", name="s")], privacy_unit="uid", epsilon=2.0), df)
    (b,) = r.inferred_bounds
    d = b.to_dict()
    assert set(d) == {"aggregate", "partition", "lower", "upper", "threshold", "outside_share", "bins", "mechanism"}
    assert (d["aggregate"], d["partition"], d["lower"], d["upper"]) == ("s", None, b.lower, b.upper)
    assert (d["threshold"], d["outside_share"], d["mechanism"]) == (b.threshold, b.outside_share, b.record.to_dict())
    assert d["bins"][0] == {"low": b.bin_edges[0][0], "high": b.bin_edges[0][1], "noisy_count": b.noisy_counts[0]}
    assert len(d["bins"]) == len(b.bin_edges) == len(b.noisy_counts)


def test_a_count_with_per_partition_bounds_is_noised_for_each_partition_s_own_bound():
    """COUNT with bounds inferred per partition: a unit adds at most U rows to a partition whose bound is
    [0, U], so that partition's noise is calibrated to sensitivity U exactly (not more, and never less)."""
    small = pd.DataFrame({"uid": np.repeat(np.arange(3000), 2), "g": "small"})
    big = pd.DataFrame({"uid": np.repeat(np.arange(3000, 6000), 12), "g": "big"})
    q = dp.Query([dp.Aggregate("count", upper=None, name="c")], privacy_unit="uid", group_by=("g",), epsilon=2.0,
                 bounds_scope="partition")
    r = dp.execute(q, pd.concat([small, big], ignore_index=True))
    counts = [m for m in r.mechanisms if m.target.startswith("c.count [")]
    assert len(counts) == 2  # the partitions' inferred bounds differ (2 rows per unit against 12)
    for m in counts:
        lower, upper = (float(v) for v in m.target.split("[")[1].rstrip("]").split(","))
        assert lower == 0 and upper >= 1
        assert m.sensitivity_per_partition == upper, m.to_dict()
        assert m.scale == pytest.approx(upper / m.epsilon, rel=1e-12), m.to_dict()


def test_the_discrete_threshold_is_the_smallest_safe_integer_where_the_closed_form_falls_just_short():
    """Failure probabilities chosen so that the closed form lands within 1e-9 above an integer K (the
    float can then round it to a threshold that is one short): the threshold is still the smallest
    integer whose empty-bin pass probability q^(K+1) / (1 + q) is at most the allowed one, never more."""
    bins = 64
    for eps in (0.1, 0.5, 1.0, 2.0):
        q = math.exp(-eps)
        for k in (3, 10, 25):
            allowed = q ** (k + 1) / (1 + q) * (1 - 1e-12)  # just below: K itself does not pass
            failure = -math.expm1((bins - 1) * math.log1p(-allowed))
            r = -math.expm1(math.log1p(-failure) / (bins - 1))  # the allowed probability as the code sees it
            smallest = next(t for t in range(200) if q ** (t + 1) / (1 + q) <= r)
            assert bounds.discrete_threshold(eps, 1, bins, failure) == smallest, (eps, k)


def test_the_bounds_mechanism_is_recorded_as_the_release_publishes_it():
    """The automatic bounds' record in the release: a discrete Laplace on the integer grid (grid 1), scale
    C_u / epsilon of its share, with the histogram's size, threshold and failure probability."""
    df = pd.DataFrame({"uid": np.arange(3000), "x": np.linspace(1.0, 100.0, 3000)})
    r = dp.execute(dp.Query([dp.Aggregate("sum", column="x", name="s")], privacy_unit="uid", epsilon=2.0), df)
    (b,) = r.inferred_bounds
    d = b.record.to_dict()
    assert d == {"target": "bounds of s", "mechanism": "discrete Laplace on a log histogram (APPROX_BOUNDS)",
                 "sensitivity_per_partition": 1.0, "max_partitions": 1, "sensitivity": 1.0, "epsilon": 1.0,
                 "delta": 0.0, "rho": None, "scale": 1.0, "grid": 1.0, "note": d["note"]}
    assert d["note"].startswith(f"{len(b.bin_edges)} bins, threshold {b.threshold}, failure probability ")


#: the 64 bins of a per-unit count (never below zero): [0, 2), [2, 4), ... [2^63, 2^64)
COUNT_BINS = tuple((0.0 if e == 0 else 2.0 ** e, 2.0 ** (e + 1)) for e in range(64))


def test_a_count_s_per_partition_bounds_are_searched_over_counts_of_zero_and_up():
    """A COUNT without its per-unit bound, bounds_scope="partition": each partition's histogram has
    the 64 bins a count can fall in, [0, 2), [2, 4), ... [2^63, 2^64), none below zero, and its
    threshold is that of 64 bins (24 at the bounds' epsilon 1, failure 1e-9). Units of "few" have 3
    rows, of "many" 20: upper bounds 3 and 31 (the integer tops of [2, 4) and [16, 32)); the 2,000
    units of each bin stand far out of noise of scale 1 (an empty bin passes with probability 1e-9)."""
    units = np.arange(4000)
    df = pd.DataFrame({"uid": np.repeat(units, np.where(units < 2000, 3, 20)),
                       "g": np.repeat(np.where(units < 2000, "few", "many"), np.where(units < 2000, 3, 20))})
    q = dp.Query([dp.count(upper=None, name="n")], privacy_unit="uid", group_by=("g",), epsilon=4.0,
                 bounds_scope="partition")
    r = dp.execute(q, df)
    found = {b.partition["g"]: b for b in r.inferred_bounds}
    assert sorted(found) == ["few", "many"]
    for b in found.values():
        assert b.bin_edges == COUNT_BINS and b.threshold == 24 and b.lower is None
        assert b.record.note == "64 bins, threshold 24, failure probability 1e-09"
    assert (found["few"].upper, found["many"].upper) == (3.0, 31.0)


def test_per_partition_bounds_show_the_widest_of_the_partitions_bounds_in_the_released_query():
    """The released query states, for a statistic bounded per partition, the widest bounds its
    partitions used: the least inferred lower and the greatest upper (values 1 to 3: [1, 4]; 100 to
    300: [64, 512]); a COUNT's lower stays unset. Epsilon 8: 2,000 units per partition stand far out
    of the histograms' noise."""
    rows = []
    for g, low in (("small", 1.0), ("large", 100.0)):
        rows += [{"g": g, "v": low * (1 + i % 3)} for i in range(2000)]
    df = pd.DataFrame(rows).assign(uid=range(len(rows)))
    q = dp.Query([dp.Aggregate("sum", column="v", name="s"), dp.count(upper=None, name="n")], privacy_unit="uid",
                 group_by=("g",), epsilon=8.0, bounds_scope="partition")
    released = dp.execute(q, df).query.aggregates
    assert [(a.label, a.lower, a.upper) for a in released] == [("s", 1, 512), ("n", None, 1)]


def test_per_partition_bounds_are_inferred_for_the_partition_of_a_missing_key_too():
    """Rows whose group key is missing form a partition like any other: it gets its own bounds and is
    released with them (values up to 3: [.., 4]; up to 300: [.., 512]; epsilon 8)."""
    rows = []
    for g, high in (("a", 3.0), (None, 300.0)):
        rows += [{"g": g, "v": high * (i % 10 + 1) / 10} for i in range(2000)]
    df = pd.DataFrame(rows).assign(uid=range(len(rows)))
    q = dp.Query([dp.Aggregate("sum", column="v", name="s")], privacy_unit="uid", group_by=("g",), epsilon=8.0,
                 bounds_scope="partition")
    r = dp.execute(q, df)
    uppers = [(b.partition["g"], b.upper) for b in r.inferred_bounds]
    assert uppers[0] == ("a", 4.0) and pd.isna(uppers[1][0]) and uppers[1][1] == 512.0 and len(uppers) == 2
    assert r.table["g"].iloc[0] == "a" and pd.isna(r.table["g"].iloc[1]) and len(r.table) == 2
    assert r.table["s"].iloc[1] == pytest.approx(330_000, rel=0.01)


def test_the_controller_sees_the_values_clamped_to_each_partition_s_own_bounds():
    """A SUM bounded per partition reports its clamping loss to the controller like one bounded once:
    the values outside their own partition's released bounds (3 far above "a"'s [0.25, 4], 3 far below
    "b"'s [16, 512]) and the distance they moved. Three units in a bin pass its threshold of 12 with
    probability below 1e-8, so the outliers stay out of the bounds."""
    rows = []
    for g, high, outlier in (("a", 3.0, 1e6), ("b", 300.0, -1e6)):
        rows += [{"g": g, "v": high * (i % 10 + 1) / 10} for i in range(2000)] + [{"g": g, "v": outlier}] * 3
    df = pd.DataFrame(rows).assign(uid=range(len(rows)))
    q = dp.Query([dp.Aggregate("sum", column="v", name="s")], privacy_unit="uid", group_by=("g",), epsilon=8.0,
                 bounds_scope="partition")
    r = dp.execute(q, df)
    clamped, shift = 0, 0.0
    for b in r.inferred_bounds:
        v = df.loc[df["g"] == b.partition["g"], "v"]
        clamped += int(((v < b.lower) | (v > b.upper)).sum())
        shift += float((b.lower - v).clip(lower=0).sum() + (v - b.upper).clip(lower=0).sum())
    assert len(r.inferred_bounds) == 2 and clamped == 6
    loss = r.controller_only.clamping["s"]
    assert (loss.values, loss.clamped) == (len(df), 6) and loss.total_shift == pytest.approx(shift, rel=1e-12)


def test_the_bounds_of_a_partition_that_is_not_released_are_not_published():
    """A partition left out of the release keeps its inferred bounds to itself: "b" has bounds for SUM(x) but
    none for SUM(y) (y is missing on all its rows), so "b" is not released, and only "a"'s bounds are
    published; publishing "b"'s would tell that "b" exists. Epsilon 8: 2,000 units per partition stand far
    out of the histograms' noise, and an empty histogram passes with probability 1e-9."""
    rows = []
    for g in ("a", "b"):
        rows += [{"g": g, "x": 3.0 * (i % 10 + 1) / 10, "y": 300.0 * (i % 10 + 1) / 10 if g == "a" else None}
                 for i in range(2000)]
    df = pd.DataFrame(rows).assign(uid=range(len(rows)))
    q = dp.Query([dp.Aggregate("sum", column="x", name="sx"), dp.Aggregate("sum", column="y", name="sy")],
                 privacy_unit="uid", group_by=("g",), epsilon=8.0, bounds_scope="partition")
    r = dp.execute(q, df)
    assert list(r.table["g"]) == ["a"]
    assert [(b.aggregate, b.partition, b.upper) for b in r.inferred_bounds] == [("sx", {"g": "a"}, 4.0),
                                                                                ("sy", {"g": "a"}, 512.0)]


def test_a_count_s_dataset_wide_bound_is_searched_over_counts_of_zero_and_up():
    """A COUNT without its per-unit bound (bounds_scope="dataset"): one histogram of the 64 bins a count can
    fall in, none below zero, with the threshold of 64 bins; units of 3 and of 20 rows give the upper bound
    31, the integer top of [16, 32) (2,000 units per bin against noise of scale 1; an empty bin passes with
    probability 1e-9)."""
    units = np.arange(4000)
    df = pd.DataFrame({"uid": np.repeat(units, np.where(units < 2000, 3, 20))})
    q = dp.Query([dp.count(upper=None, name="n")], privacy_unit="uid", epsilon=4.0)
    r = dp.execute(q, df)
    (b,) = r.inferred_bounds
    assert b.bin_edges == COUNT_BINS and b.lower is None and b.upper == 31.0
    assert b.threshold == bounds.discrete_threshold(b.record.epsilon, 1, 64, q.bounds_failure)
    assert r.query.aggregates[0].upper == 31


def test_an_integer_column_s_sum_bounded_per_partition_gets_the_integer_tops_of_its_bins():
    """SUM of an integer column with bounds inferred per partition: each partition's histogram has the
    integer bins [0, 2), [2, 4), ..., and an upper bound is the largest whole number of its bin (per-unit
    sums 5 and 20: [4, 7] and [16, 31], not the real bins' [4, 8] and [16, 32]); 2,000 units per bin at
    epsilon 4 stand far out of the noise."""
    units = np.arange(4000)
    df = pd.DataFrame({"uid": units, "g": np.where(units < 2000, "few", "many"),
                       "x": np.where(units < 2000, 5, 20).astype(np.int64)})
    q = dp.Query([dp.Aggregate("sum", column="x", name="s")], privacy_unit="uid", group_by=("g",), epsilon=4.0,
                 bounds_scope="partition")
    found = {b.partition["g"]: b for b in dp.execute(q, df).inferred_bounds}
    assert {g: (b.lower, b.upper) for g, b in found.items()} == {"few": (4.0, 7.0), "many": (16.0, 31.0)}
    assert all(len(b.bin_edges) == 128 and b.bin_edges[64] == (0.0, 2.0) for b in found.values())  # 64 each side of 0


def test_real_values_just_above_two_to_the_minus_33_are_counted_in_the_lowest_bin():
    """A real column's lowest bins are [0, 2^-31) and (-2^-31, 0]: every value nearer zero than 2^-31
    is counted there, so per-unit sums of 1.5e-10 (between 2^-33 and 2^-32) give the bounds [0, 2^-31]
    rather than falling in no bin. Epsilon 8: the 2,000 units stand far out of the histogram's noise,
    and an empty bin passes with probability 1e-9 (bounds_failure)."""
    df = pd.DataFrame({"uid": np.arange(2000), "x": np.full(2000, 1.5e-10)})
    r = dp.execute(dp.Query([dp.Aggregate("sum", column="x", name="s")], privacy_unit="uid", epsilon=8.0), df)
    (b,) = r.inferred_bounds
    assert (b.lower, b.upper) == (0.0, 2.0**-31)
    assert (r.query.aggregates[0].lower, r.query.aggregates[0].upper) == (0, 2.0**-31)


def test_an_integer_sum_of_minus_one_per_unit_gets_the_bounds_minus_one_to_zero():
    """Integer bins move their open edge in by one; the bin (-2, 0] holding -1 has no positive top to
    move, so per-unit sums of -1 get the bounds [-1, 0] (not the empty [-1, -1], which is refused).
    Epsilon 8: the 2,000 units stand far out of the noise; an empty bin passes with probability 1e-9."""
    df = pd.DataFrame({"uid": np.arange(2000), "x": np.full(2000, -1, dtype=np.int64)})
    r = dp.execute(dp.Query([dp.Aggregate("sum", column="x", name="s")], privacy_unit="uid", epsilon=8.0), df)
    (b,) = r.inferred_bounds
    assert (b.lower, b.upper) == (-1.0, 0.0)
    assert (r.query.aggregates[0].lower, r.query.aggregates[0].upper) == (-1, 0)
    assert r.controller_only.exact["s"].iloc[0] == -2000


def test_the_released_query_s_bounds_are_the_widest_of_the_released_partitions_bounds_only():
    """The released query states, for a statistic bounded per partition, bounds that come from the
    published partitions' bounds alone: the least lower and the greatest upper of those. A partition held
    by one person ("lone", value 10^6) gets its own bounds ([2^19, 2^20]: its one value passes the
    histogram's threshold 0 with probability 1 - 5e-5 at this epsilon and bounds_failure) but the selection leaves it out;
    showing its upper in the query (1048576) would tell that the person exists and their value's range,
    which no share of delta pays for. Epsilon 60, delta 1e-9: "lone" is released with probability at most
    1e-9; 2,000 units in each other partition stand far out of the noise."""
    rows = []
    for g, low in (("small", 1.0), ("large", 100.0)):
        rows += [{"g": g, "v": low * (1 + i % 3)} for i in range(2000)]
    rows.append({"g": "lone", "v": 1e6})
    df = pd.DataFrame(rows).assign(uid=range(len(rows)))
    q = dp.Query([dp.Aggregate("sum", column="v", name="s"), dp.count(upper=None, name="n")], privacy_unit="uid",
                 group_by=("g",), epsilon=60.0, delta=1e-9, bounds_scope="partition", bounds_failure=1e-2)
    r = dp.execute(q, df)
    assert sorted(r.table["g"]) == ["large", "small"]
    published = {a.label: [b for b in r.inferred_bounds if b.aggregate == a.label] for a in r.query.aggregates}
    assert all({b.partition["g"] for b in found} == {"large", "small"} for found in published.values())
    s, n = r.query.aggregates
    assert s.lower == min(b.lower for b in published["s"]) and s.upper == max(b.upper for b in published["s"])
    assert n.lower is None and n.upper == max(b.upper for b in published["n"])
    assert r.to_dict()["aggregates"][0]["upper"] == s.upper < 2**19


def test_the_bounds_histogram_s_noise_and_threshold_are_sized_for_a_unit_s_c_u_values():
    """A unit adds one value to the histogram in each of its <= C_u partitions: L1 sensitivity C_u, so the
    noise's scale is C_u / epsilon of the share, the threshold is the one for that noise, and the record
    says so (C_u = 4, public groups: the bounds get half of epsilon 2; the record test above has C_u = 1,
    where a missing C_u shows nowhere)."""
    units = np.arange(1000)
    df = pd.DataFrame({"uid": np.repeat(units, 4), "g": np.tile(list("abcd"), 1000), "x": np.linspace(1.0, 100.0, 4000)})
    q = dp.Query([dp.Aggregate("sum", column="x", name="s")], privacy_unit="uid", group_by=("g",),
                 public_partitions=list("abcd"), epsilon=2.0, max_partitions_contributed=4)
    (b,) = dp.execute(q, df).inferred_bounds
    d = b.record.to_dict()
    assert (d["max_partitions"], d["sensitivity"], d["epsilon"], d["scale"]) == (4, 4.0, 1.0, 4.0)
    assert b.threshold == bounds.discrete_threshold(1.0, 4, len(b.bin_edges), q.bounds_failure)
    assert b.threshold > bounds.discrete_threshold(1.0, 1, len(b.bin_edges), q.bounds_failure)


@pytest.mark.parametrize("kind", ["sum", "avg", "count", "quantile"])
def test_with_the_fallback_no_bin_standing_out_clamps_to_the_whole_range_and_says_so(kind):
    """Query.bounds_fallback (the platform's releases): where the engine refuses ("no histogram bin
    stands out"), the bounds are the histogram's whole range (a count's per-unit bound at most
    2^31 - 1) and the mechanism's note says so: whether bounds are found is a noisy fact about the
    data that must reach a controller, not the analyst as a refusal (bounds.py, "Falling back")."""
    from dp_core.bounds import FALLBACK_NOTE

    df = pd.DataFrame({"uid": range(20), "x": np.arange(20.0)})
    agg = dp.Aggregate(kind, column=None if kind == "count" else "x", name="v", q=0.5 if kind == "quantile" else None)
    query = dp.Query([agg], privacy_unit="uid", epsilon=1.0)
    with pytest.raises(dp.BoundsError):
        dp.execute(query, df)
    result = dp.execute(replace(query, bounds_fallback=True), df)
    (b,) = result.inferred_bounds
    assert FALLBACK_NOTE in b.record.note and len(result.table) == 1
    assert b.upper == 2.0**64 if kind != "count" else b.upper >= 2**31 - 1
    assert result.query.aggregates[0].upper == (2**31 - 1 if kind == "count" else 2.0**64)


def test_with_the_fallback_partitions_without_bounds_are_not_released_even_when_none_has_any():
    """Per partition, a partition whose histogram has no bin above the threshold is not released; with
    the fallback, none having one releases the empty table (the engine alone refuses)."""
    df = pd.DataFrame({"uid": range(30), "g": np.arange(30) % 3, "x": np.arange(30.0)})
    query = dp.Query([dp.Aggregate("sum", column="x", name="s")], privacy_unit="uid", group_by=("g",), epsilon=1.0,
                     bounds_scope="partition")
    with pytest.raises(dp.BoundsError):
        dp.execute(query, df)
    assert len(dp.execute(replace(query, bounds_fallback=True), df).table) == 0
