"""The Spark backend runs the same plan as DuckDB: for every aggregate kind, on the same data and
bounding key, Spark's pre-noise partials (per-partition sums, APPROX_BOUNDS histograms, quantile
histograms, selection weights) equal DuckDB's, exactly for integers and to 1e-9 relative for
floats; the same randomness gives the same release on both; bad input gets one line on Spark too.

One local[2] SparkSession serves the whole suite (conftest `spark`); skipped without Java."""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd
import pytest
from noise_replay import replay_noise
from patience import PATIENCE_S

import dp_core as dp
from dp_core.bounding import build_plan
from dp_core.bounds import histograms_sql
from dp_core.engine import check_columns, exact_statistics, execute
from dp_core.engine_backend import open_backend
from dp_core.errors import InvalidDataError
from dp_core.quantiles import dense_histograms
from dp_core.selection_mad import round_two_sql

pytestmark = [pytest.mark.xdist_group("spark"),  # one worker, one SparkSession (pyproject: --dist loadgroup)
              pytest.mark.runs_first]  # the Spark group: minutes on one worker, started first (conftest.py)

SEED = 424242
CU = 3


def make_data(seed: int = 7, units: int = 400) -> pd.DataFrame:
    """Units in 1-6 partitions with 1-3 rows each; `x` real (some NaN), `k` integer, `q` one value
    per (unit, partition) so that the quantile's per-unit draw has a single candidate."""
    rng = np.random.default_rng(seed)
    rows = []
    for u in range(units):
        for p in rng.choice(12, size=rng.integers(1, 7), replace=False):
            q = float(rng.normal(50, 20))  # `age`: one value per unit
            for _ in range(rng.integers(1, 4)):
                x = float(rng.lognormal(2, 1.5)) * (1 if rng.random() < 0.8 else -1)
                rows.append((f"u{u}", f"p{p:02d}", int(p % 3), x if rng.random() > 0.05 else np.nan,
                             int(rng.integers(-5, 60)), q, 20 + u % 60))
    return pd.DataFrame(rows, columns=["uid", "part", "grp", "x", "k", "q", "age"])


@pytest.fixture(scope="module")
def data() -> pd.DataFrame:
    return make_data()


@pytest.fixture(scope="module")
def frames(spark, data):
    return data, spark.createDataFrame(data)


def _run_both(frames, build, spark):
    """`build(backend)` -> DataFrame on each backend (same data, same key)."""
    out = []
    for data in frames:
        backend = open_backend(data)
        try:
            out.append(build(backend))
        finally:
            backend.close()
    return out


def assert_same_frame(duck: pd.DataFrame, spark_rows: pd.DataFrame, keys: list[str]) -> None:
    """Same rows (matched on keys), integers exactly, floats to 1e-9 relative, maps as counts."""
    assert sorted(duck.columns) == sorted(spark_rows.columns)
    assert len(duck) == len(spark_rows)
    if keys:
        duck = duck.sort_values(keys, na_position="last").reset_index(drop=True)
        spark_rows = spark_rows.sort_values(keys, na_position="last").reset_index(drop=True)
    for col in duck.columns:
        a, b = duck[col], spark_rows[col]
        if col.endswith("_hist"):
            np.testing.assert_array_equal(dense_histograms(list(a), 1024), dense_histograms(list(b), 1024), col)
        elif col in keys or a.dtype == object or str(a.dtype).startswith(("str", "string")):
            assert [None if pd.isna(v) else v for v in a] == [None if pd.isna(v) else v for v in b], col
        elif pd.api.types.is_integer_dtype(a.dtype) and pd.api.types.is_integer_dtype(b.dtype):
            np.testing.assert_array_equal(a.to_numpy(), b.to_numpy(), col)
        else:
            np.testing.assert_allclose(a.to_numpy(dtype=float), b.to_numpy(dtype=float), rtol=1e-9, atol=0, err_msg=col)


QUERIES = {
    "every sum-like aggregate, laplace": dp.Query(
        [dp.count(), dp.count(upper=2, column="x"), dp.count_units(), dp.sum_("k", -5, 40), dp.sum_("x", -10, 30),
         dp.avg("x", -10, 30), dp.var("k", 0, 50), dp.stddev("x", -10, 30)],
        privacy_unit="uid", group_by=("part",), epsilon=1.0, max_partitions_contributed=CU),
    "quantiles (MEDIAN, MIN, MAX, NTILE), two keys": dp.Query(
        [dp.median("q", 0, 100), dp.min_("q", 0, 100), dp.max_("q", 0, 100), dp.quantile("q", 0.9, 0, 100)],
        privacy_unit="uid", group_by=("part", "grp"), epsilon=1.0, max_partitions_contributed=CU),
    "public partitions (one absent), gaussian, row filter": dp.Query(
        [dp.count(), dp.sum_("k", 0, 50), dp.median("q", 0, 100), dp.avg("x", 0, 20)],
        privacy_unit="uid", group_by=("part",), epsilon=1.0, delta=1e-6, max_partitions_contributed=CU,
        public_partitions=[f"p{i:02d}" for i in range(10)] + ["nowhere"], noise="gaussian", where="k >= 0"),
    "weighted gaussian selection (its weighted histogram)": dp.Query(
        [dp.count_units(), dp.sum_("k", 0, 50)], privacy_unit="uid", group_by=("part",), epsilon=1.0,
        max_partitions_contributed=CU, noise="gaussian", selection="weighted_gaussian"),
    "COUNT(DISTINCT unit) only, ungrouped": dp.Query(
        [dp.count_units(), dp.median("age", 0, 100), dp.var("x", -10, 30)], privacy_unit="uid", epsilon=1.0),
}


@pytest.mark.parametrize("name", list(QUERIES))
def test_plan_partials_equal_duckdb(spark, frames, name):
    query = QUERIES[name]

    def partials(backend):
        schema = backend.schema()
        integer_columns = check_columns(query, schema)
        plan = build_plan(query, integer_columns, SEED, key_types=schema, dialect=backend.dialect, transpile=False,
                          portable_hash=True)
        return backend.run(plan.sql)

    duck, on_spark = _run_both(frames, partials, spark)
    assert len(duck) > 0 and "_n_units" in duck
    assert_same_frame(duck, on_spark, list(query.group_by))


def test_hash_ties_keep_the_same_rows_on_spark_as_the_cutoff_on_duckdb(spark, frames, monkeypatch):
    """Every hash collides (a constant): Spark's window rule (bounding.window_bounding_ctes) keeps
    exactly the rows DuckDB's cutoff keeps (units over C_u keep none of the tied rows). The
    dropped pairs then differ (the window's per-unit carrier is itself dropped): documented as
    understated on a 64-bit collision, a controller-only diagnostic."""
    from dp_core import bounding

    monkeypatch.setitem(bounding.DIALECT_PIECES, "duckdb", dict(bounding.DIALECT_PIECES["duckdb"], hash="CAST(7 AS UBIGINT)"))
    monkeypatch.setitem(bounding.DIALECT_PIECES, "spark", dict(bounding.DIALECT_PIECES["spark"], hash="CAST(7 AS BIGINT)"))
    query = QUERIES["weighted gaussian selection (its weighted histogram)"]

    def partials(backend):
        schema = backend.schema()
        plan = build_plan(query, check_columns(query, schema), SEED, key_types=schema, dialect=backend.dialect,
                          transpile=False)
        return backend.run(plan.sql).drop(columns="_dropped_pairs")

    duck, on_spark = _run_both(frames, partials, spark)
    assert len(duck) > 0
    assert_same_frame(duck, on_spark, list(query.group_by))


def test_approx_bounds_histograms_equal_duckdb_global_and_per_partition(spark, frames):
    """The APPROX_BOUNDS inputs (log histograms of bounded per-unit values), for integer and
    real columns and for COUNT, dataset-wide and per partition."""
    query = dp.Query([dp.count(upper=1), dp.sum_("k", 0, 1), dp.avg("x", 0, 1)], privacy_unit="uid",
                     group_by=("part",), epsilon=1.0, max_partitions_contributed=CU)

    def histograms(backend):
        schema = backend.schema()
        plan = build_plan(query, check_columns(query, schema), SEED, key_types=schema, dialect=backend.dialect,
                          transpile=False, portable_hash=True)
        overall = backend.run(histograms_sql(plan.with_clause, [(0, "_a0_raw", True), (2, "_a2_raw", False)]))
        by_part = backend.run(histograms_sql(plan.with_clause, [(1, "_a1_raw", True)], ("part",)))
        out = pd.concat([overall.assign(part="*"), by_part], ignore_index=True).rename(columns={"_agg": "agg"})
        out["neg"] = out["neg"].astype(bool)
        return out.astype({"e": "int64", "n": "int64"})

    duck, on_spark = _run_both(frames, histograms, spark)
    assert duck["n"].sum() > 0
    assert_same_frame(duck, on_spark, ["agg", "part", "neg", "e"])


@pytest.mark.parametrize("selection", ["mad", "mad_damped"])
def test_mad_second_round_weights_equal_duckdb(spark, frames, selection):
    query = dp.Query([dp.count_units()], privacy_unit="uid", group_by=("part",), epsilon=1.0,
                     max_partitions_contributed=CU, noise="gaussian", selection=selection)
    released = [("p00",), ("p03",), ("p07",)]
    damped = [("p01",), ("p05",)]  # damped MAD's round 2 halves these (MAD's ignores them)

    def round_two(backend):
        schema = backend.schema()
        plan = build_plan(query, set(), SEED, key_types=schema, dialect=backend.dialect, transpile=False,
                          portable_hash=True)
        return backend.run(round_two_sql(plan.with_clause, query, released, schema, backend.dialect,
                                         damped_keys=damped))

    duck, on_spark = _run_both(frames, round_two, spark)
    assert len(duck) == 12 - len(released)
    assert_same_frame(duck, on_spark, ["part"])


def test_per_partition_bounds_plan_equals_duckdb(spark, frames):
    query = dp.Query([dp.sum_("k", 0, 1), dp.avg("x", 0, 1)], privacy_unit="uid", group_by=("part",), epsilon=1.0,
                     max_partitions_contributed=CU)
    bounds = pd.DataFrame({"part": [f"p{i:02d}" for i in range(0, 12, 2)], "lo": 0.0, "hi": [10.0, 20, 30, 40, 5, 60]})
    per_partition = {0: bounds, 1: bounds.assign(lo=-4.5)}

    def partials(backend):
        schema = backend.schema()
        plan = build_plan(query, check_columns(query, schema), SEED, key_types=schema, partition_bounds=per_partition,
                          dialect=backend.dialect, transpile=False,
                          portable_hash=True)
        return backend.run(plan.sql)

    duck, on_spark = _run_both(frames, partials, spark)
    assert_same_frame(duck, on_spark, ["part"])


@pytest.mark.parametrize("selection,noise_kind", [("auto", "laplace"), ("mad", "gaussian"), ("mad_damped", "laplace")])
def test_same_randomness_same_release_on_both(spark, frames, monkeypatch, selection, noise_kind):
    """With the noise source replayed identically, the whole release (automatic bounds, selection
    with MAD's second round, noise, quantiles) is the same table on DuckDB and Spark, and so is the
    bounds' noisy histogram (per-partition bounds: tests/test_spark_platform.py)."""
    query = dp.Query([dp.count(), dp.sum_("k", None, None), dp.avg("x", 0, 30)], privacy_unit="uid",
                     group_by=("part",), epsilon=5.0, max_partitions_contributed=CU, noise=noise_kind,
                     selection=selection)
    results = []
    for data in frames:
        replay_noise(monkeypatch, 99)
        results.append(execute(query, data, bounding_seed=SEED, portable_hash=True))
    monkeypatch.undo()
    assert len(results[0].table) > 0
    assert_same_frame(results[0].table, results[1].table, ["part"])
    (histogram,) = [b.noisy_counts for b in results[0].inferred_bounds]
    assert [b.noisy_counts for b in results[1].inferred_bounds] == [histogram]


def test_execute_on_spark_table_name_and_parquet_folder(spark, data, tmp_path):
    """The public API: a table name or a Parquet folder with backend='spark' (session given or active)."""
    spark.createDataFrame(data).createOrReplaceTempView("people_visits")
    folder = tmp_path / "visits"  # a folder of Parquet files, as a lake table is laid out
    folder.mkdir()
    data.iloc[: len(data) // 2].to_parquet(folder / "part-0.parquet")
    data.iloc[len(data) // 2:].to_parquet(folder / "part-1.parquet")
    query = dp.Query([dp.count_units(), dp.median("q", 0, 100)], privacy_unit="uid", group_by=("part",), epsilon=2.0,
                     max_partitions_contributed=CU)
    by_name = exact_statistics(query, "people_visits", backend="spark", spark=spark, bounding_seed=SEED)
    by_path = exact_statistics(query, str(folder), backend="spark", bounding_seed=SEED)
    assert_same_frame(by_name.rows, by_path.rows, ["part"])  # Spark's own hash: deterministic given the key
    public = dataclasses.replace(query, public_partitions=["p00", "p01", "nowhere"])  # keys checked on Spark too
    result = execute(public, "people_visits", backend="spark", spark=spark)
    assert list(result.table.columns[:2]) == ["part", query.aggregates[0].label]
    assert list(result.table["part"]) == ["nowhere", "p00", "p01"]
    assert not [v for v in spark.catalog.listTables() if v.name.startswith("dp_input_")]  # views dropped


@pytest.mark.parametrize("data_arg,fix,message", [
    ("no_such_table", {}, "no table or view 'no_such_table'"),
    ("people_visits", {"privacy_unit": "person"}, "privacy unit column 'person' is not in the input"),
    ("people_visits", {"column": "part"}, "needs a numeric column, but 'part' has type VARCHAR"),
    ("/nowhere/visits.parquet", {}, "input file not found: /nowhere/visits.parquet"),
])
def test_bad_input_on_spark_one_line_nothing_spent(spark, data, data_arg, fix, message):
    spark.createDataFrame(data).createOrReplaceTempView("people_visits")
    query = dp.Query([dp.sum_(fix.get("column", "k"), 0, 10)], privacy_unit=fix.get("privacy_unit", "uid"),
                     group_by=("part",), epsilon=1.0)
    with pytest.raises(InvalidDataError) as err:
        execute(query, data_arg, backend="spark", spark=spark)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_unknown_backend_is_refused(data):
    with pytest.raises(dp.InvalidQueryError, match="unknown backend 'oracle'"):
        execute(dp.Query([dp.count()], privacy_unit="uid", epsilon=1.0), data, backend="oracle")


def test_the_engine_imports_and_runs_without_pyspark(tmp_path):
    """pyspark is an optional extra: dp_core (engine, backend choice) imports and runs on DuckDB
    with pyspark unimportable, and backend='spark' then says how to install it."""
    import subprocess
    import sys
    from pathlib import Path

    code = (
        "import sys; sys.modules['pyspark'] = None\n"
        "import pandas as pd, dp_core as dp\n"
        "from dp_core.engine import execute\n"
        "q = dp.Query([dp.count()], privacy_unit='u', epsilon=1.0)\n"
        "execute(q, pd.DataFrame({'u': [1, 2, 3]}))\n"
        "try:\n    execute(q, 'some_table', backend='spark')\nexcept dp.InvalidDataError as e:\n    print(e)\n"
    )
    root = Path(__file__).resolve().parents[1]
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path,
                         env={"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin"}, timeout=PATIENCE_S)
    assert out.returncode == 0, out.stderr
    assert "pip install 'dprelease[spark]'" in out.stdout


def test_sql_front_end_on_spark_tables_with_a_public_join(spark):
    """sql(..., backend="spark"): two DP SELECTs over Spark tables (one joined to a public table
    inside, one outer join), compiled against their schemas, each run on Spark; at epsilon 100 the
    numbers are the plain SQL's to well under one unit."""
    from dp_core.sql import Table, run_sql

    rng = np.random.default_rng(3)  # test data only
    people = pd.DataFrame({"uid": np.arange(600), "dept": rng.choice(["a", "b", "c"], 600), "age": rng.integers(20, 60, 600)})
    depts = pd.DataFrame({"dept": ["a", "b", "c"], "region": ["N", "S", "N"]})
    spark.createDataFrame(people).createOrReplaceTempView("people_sql")
    tables = {"people": Table("people_sql", "uid"), "depts": Table(spark.createDataFrame(depts))}
    dp_select = "SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS (epsilon = 100, delta = 1e-6, privacy_unit_column = uid)"
    sql = (f"WITH a AS ({dp_select} region, COUNT(*, contribution_bounds_per_group => (0, 1)) AS n FROM people p "
           "JOIN depts d ON p.dept = d.dept GROUP BY region) SELECT a.region, n FROM a ORDER BY a.region")
    result = run_sql(sql, tables, backend="spark", spark=spark, public_partitions=[("N",), ("S",)])
    expected = people.merge(depts, on="dept").groupby("region").size()
    got = result.table.set_index("region")["n"]
    assert list(got.index) == ["N", "S"]
    assert np.allclose(got.to_numpy(dtype=float), expected.to_numpy(dtype=float), atol=1.0)
    with pytest.raises(dp.InvalidQueryError, match="nosuch"):
        run_sql(f"{dp_select} COUNT(*, contribution_bounds_per_group => (0, 1)) AS n FROM people WHERE nosuch > 1",
                tables, backend="spark", spark=spark)


def test_rows_a_query_selects_are_never_refused_on_spark(spark):
    """As tests/test_derived_inputs.py on Spark: neighbours whose WHERE selects one row or none both
    release; an infinite value the query computes is clamped and a NaN one is missing (isnan
    transpiled); a protected table without a unit id on a row is refused whatever the WHERE keeps."""
    from dp_core.sql import Table, run_sql

    dp_select = "SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS (epsilon = 1, delta = 1e-6, max_groups_contributed = 1)"
    base = pd.DataFrame({"uid": range(1, 41), "name": ["Alice"] + [f"p{i}" for i in range(2, 41)],
                         "x": np.arange(40.0)})
    query = (f"{dp_select} COUNT(*, contribution_bounds_per_group => (0, 1)) AS n, "
             "SUM(1e308 * x, contribution_bounds_per_group => (0, 10)) AS s FROM t WHERE name = 'Alice' AND x < {x}")
    tables = {"t": Table(spark.createDataFrame(base), "uid")}
    exact = []
    for x in (1, 0):  # Alice's x is 0: selected, then not
        result = run_sql(query.format(x=x), tables, backend="spark", spark=spark)
        assert len(result.table) == 1
        exact.append(int(result.controller_only.exact["n"].iloc[0]))
    assert exact == [1, 0]
    wild = f"{dp_select} SUM(1e308 * x, contribution_bounds_per_group => (0, 10)) AS s, COUNT(0 * (1e308 * x * 10), " \
           "contribution_bounds_per_group => (0, 1)) AS numbers FROM t"
    exact = run_sql(wild, tables, backend="spark", spark=spark).controller_only.exact.iloc[0]
    assert exact["s"] == 390 and exact["numbers"] == 1  # 0 * inf is NaN: x = 0 is the only number
    bad = spark.createDataFrame(base.assign(uid=[None] + list(range(2, 41))))
    with pytest.raises(InvalidDataError, match=r"^table 't': 1 row\(s\) have no privacy unit id"):
        run_sql(query.format(x=0), {"t": Table(bad, "uid")}, backend="spark", spark=spark)


def test_inferred_bounds_on_spark_read_partials_computed_once_and_equal_duckdb(spark, frames):
    """On Spark too the partials are kept (a cached temporary view) for APPROX_BOUNDS' histograms
    and the release's plan: the exact histograms and per-partition rows equal DuckDB's, and a
    release with two inferred bounds aggregates per (unit, partition) in one statement."""
    from dataclasses import replace

    from dp_core.engine import exact_bounds_histograms
    from dp_core.shared_partials import SharedPartials

    query = dp.Query([dp.count(upper=None), dp.sum_("k", None, None)], privacy_unit="uid", group_by=("part",),
                     epsilon=50.0, delta=1e-6, max_partitions_contributed=CU)

    def histograms_and_rows(backend):
        schema = backend.schema()
        integer_columns = check_columns(query, schema)
        partials = SharedPartials(backend)
        hist = exact_bounds_histograms(query, backend, schema, integer_columns, SEED, True, partials)
        assert partials.table is not None
        fixed = replace(query, aggregates=(dp.count(upper=2), dp.sum_("k", -3, 40)))
        plan = build_plan(fixed, integer_columns, SEED, key_types=schema, dialect=backend.dialect, transpile=False,
                          portable_hash=True)
        rows = backend.run(partials.reading(plan).sql)
        partials.close()
        counts = pd.concat([h.assign(agg=i) for i, (h, _, _) in hist.items()]).sort_values(["agg", "neg", "e"])
        return counts.reset_index(drop=True), rows

    (duck_counts, duck_rows), (spark_counts, spark_rows) = _run_both(frames, histograms_and_rows, spark)
    assert len(duck_counts) > 2
    pd.testing.assert_frame_equal(duck_counts, spark_counts, check_dtype=False)
    assert_same_frame(duck_rows, spark_rows, ["part"])

    backend = open_backend(frames[1])
    sent = []
    for name in ("run", "keep"):
        method = getattr(backend, name)
        setattr(backend, name, lambda *args, _m=method, _n=name: sent.append((_n, args[-1])) or _m(*args))
    stats = exact_statistics(query, backend, portable_hash=True)
    assert len(stats.rows) > 0
    assert [name for name, sql in sent if 'GROUP BY "uid", "part"' in sql] == ["keep"]
    assert not [v for v in spark.catalog.listTables() if v.name.startswith("_partial_")]


@pytest.mark.parametrize("kept_for", ["inferred bounds", "PRIs"])
def test_a_keep_failing_on_a_value_of_the_data_leaves_nothing_cached_on_spark(spark, tmp_path, kept_for):
    """The statement that keeps the partials (a cached view) fails on a value of the data: the
    error is one line without the value, and the session's cache keeps neither the plan nor what
    was computed of it (it did until 2026-11-29: persisted before the failing count, never unpersisted).
    What fails is the input's own plan (a cast its owner wrote under ANSI mode): a query's own
    expressions no longer fail on a value (tests/test_spark_value_errors.py)."""
    from pyspark import StorageLevel
    from pyspark.sql import functions as F

    path = tmp_path / "named.parquet"
    pd.DataFrame({"uid": range(200), "g": ["a", "b"] * 100, "name": ["12"] * 199 + ["x-secret-7"]}).to_parquet(path)
    count = dp.count(upper=None) if kept_for == "inferred bounds" else dp.count(upper=2)
    query = dp.Query([count], privacy_unit="uid", group_by=("g",), epsilon=1.0, delta=1e-6, where="code > 3")
    assert spark.conf.get("spark.sql.ansi.enabled") == "true"  # the session's default: the owner's cast fails
    backend = open_backend(spark.read.parquet(str(path)).withColumn("code", F.col("name").cast("int")))
    close, backend.close = backend.close, lambda: None  # the input's view kept to look its plan up afterwards
    kept = []
    keep = backend.keep
    backend.keep = lambda name, sql: kept.append(sql) or keep(name, sql)
    try:
        with pytest.raises(InvalidDataError) as caught:
            exact_statistics(query, backend, with_units=kept_for == "PRIs")
        assert "x-secret-7" not in str(caught.value) and "CAST_INVALID_INPUT" in str(caught.value)
        assert len(kept) == 1 and not backend.kept
        assert spark.sql(backend.spark_sql(kept[0])).storageLevel == StorageLevel.NONE
        assert not [v for v in spark.catalog.listTables() if v.name.startswith("_partial_")]
    finally:
        close()
