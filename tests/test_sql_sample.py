"""TABLESAMPLE BERNOULLI / SYSTEM (p PERCENT) in DP SQL (dp_core/sql/sample.py): the sample is applied
on data (the exact pre-noise counts are a p% binomial draw, not every row), once per release (every
scan of the source, and a sampled public-groups list, read the same rows), on DuckDB and on Spark;
the other samples are refused with their reason."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

import dp_core as dp
from dp_core.backend import DuckDBBackend
from dp_core.engine import exact_statistics
from dp_core.sql import Table, compile_statement_for, run_sql
from dp_core.sql.sample import has_samples, render

N = 100_000
DPS = "SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS (epsilon = 1)"
C1 = "COUNT(*, contribution_bounds_per_group => (0, 1))"
#: a two-sided binomial bound with false-failure probability below 1e-6: 5.5 standard deviations
#: (the normal tail at 5.5 sd is 3.8e-8; n p (1 - p) is large enough here for the normal approximation,
#: and Bernstein's inequality at this width gives < 1e-6 as well)
Z = 5.5


def within_binomial(count: float, n: int, p: float) -> bool:
    return abs(count - n * p) <= Z * math.sqrt(n * p * (1 - p))


@pytest.fixture(scope="module")
def tables():
    rng = np.random.default_rng(5)  # test data only
    people = pd.DataFrame({"uid": np.arange(N), "dept": np.arange(N) % 4, "age": rng.integers(20, 60, N)})
    # every row twice: identical rows must be independent draws (the index among identical rows)
    twice = pd.concat([people.head(N // 2)] * 2, ignore_index=True)
    depts = pd.DataFrame({"dept": np.arange(1000)})
    many = pd.DataFrame({"uid": np.arange(N), "dept": np.arange(N) % 1000})
    return {"people": Table(people, "uid"), "twice": Table(twice, "uid"), "depts": Table(depts),
            "many": Table(many, "uid")}


def exact_n(result) -> float:
    return float(result.controller_only.exact["n"].sum())


@pytest.mark.parametrize("method", ["BERNOULLI", "SYSTEM"])
def test_a_ten_percent_sample_keeps_about_ten_percent_of_the_rows(tables, method):
    result = run_sql(f"{DPS} {C1} AS n FROM people TABLESAMPLE {method} (10 PERCENT)", tables)
    n = exact_n(result)
    assert within_binomial(n, N, 0.10), n  # not 100%: the sample is applied, not dropped
    assert result.epsilon_spent == pytest.approx(1.0)  # charged in full: no amplification claimed


def test_the_sample_is_drawn_afresh_for_each_release(tables):
    sql = f"{DPS} {C1} AS n FROM people TABLESAMPLE BERNOULLI (50 PERCENT)"
    counts = {exact_n(run_sql(sql, tables)) for _ in range(3)}
    assert len(counts) > 1  # a new key per release (two equal counts of 50k draws: ~1e-3 each)


def test_identical_rows_are_independent_draws(tables):
    result = run_sql(f"{DPS} COUNT(*, contribution_bounds_per_group => (0, 2)) AS n FROM twice "
                     "TABLESAMPLE BERNOULLI (50 PERCENT)", tables)
    units = result.controller_only.exact["units"].sum()
    # each unit has 2 identical rows: kept with 1 - 0.25 = 75% (independent), not 50% (one shared draw)
    assert within_binomial(units, N // 2, 0.75), units


def test_a_sample_of_a_subquery_with_a_group_by_and_automatic_bounds(tables):
    sql = (f"{DPS} dept, {C1} AS n, AVG(age) AS a, PERCENTILE_CONT(age, 0.5, contribution_bounds_per_row => (0, 100)) "
           "AS m FROM (SELECT uid, dept, age FROM people WHERE age >= 20) TABLESAMPLE SYSTEM (20 PERCENT) GROUP BY dept")
    result = run_sql(sql, tables, max_partitions_contributed=1)
    exact = result.controller_only.exact
    assert len(exact) == 4 and within_binomial(exact["n"].sum(), N, 0.20)


def test_a_sampled_source_keeps_its_duckdb_syntax(tables):
    """The sampled source is DuckDB SQL and is read back as such when each release draws its sample:
    an integer division (`//`) in its WHERE works, and keeps its meaning (ages 30 to 39: a quarter
    of the people, 10 of the 40 ages)."""
    sql = f"{DPS} {C1} AS n FROM people TABLESAMPLE BERNOULLI (50 PERCENT) WHERE age // 10 = 3"
    truth = int((tables["people"].data["age"] // 10 == 3).sum())
    assert within_binomial(exact_n(run_sql(sql, tables)), truth, 0.5)


def test_every_scan_of_one_release_reads_the_same_sampled_rows(tables):
    """The engine scans its source several times (checks, APPROX_BOUNDS, the plan, the units' rows
    and the COUNT(DISTINCT unit) of the controller-only totals): with one key, the same rows."""
    compiled = compile_statement_for(f"{DPS} {C1} AS n, SUM(age) AS s FROM people TABLESAMPLE BERNOULLI (30 PERCENT)",
                                     tables)
    part = compiled.parts[0]
    assert has_samples(part.source_sql()) and not has_samples(render(part.source_sql(), "duckdb", 7))
    backend = DuckDBBackend.for_tables({n: t.data for n, t in tables.items()})
    backend.define_input(render(part.source_sql(), "duckdb", 12345))
    first = backend.run("SELECT uid FROM dp_input ORDER BY uid")["uid"].tolist()
    again = backend.run("SELECT uid FROM dp_input ORDER BY uid")["uid"].tolist()
    assert first == again and within_binomial(len(first), N, 0.30)
    stats = exact_statistics(part.query, backend, with_units=True)  # automatic bounds for SUM: one more scan
    assert stats.total_units == len(first) == int(stats.rows["_n_units"].iloc[0]) == len(stats.units)
    other = DuckDBBackend.for_tables({"people": tables["people"].data})
    other.define_input(render(part.source_sql(), "duckdb", 54321))
    assert other.run("SELECT uid FROM dp_input ORDER BY uid")["uid"].tolist() != first  # another key, another sample
    other.close()


def test_sql_shown_without_a_key_keeps_its_sample_placeholders(tables):
    """With no key (SQL shown, never run) the sampled source comes back as it is, placeholders and all;
    with a key they are decided (mutants seed 20270160: sample render 1, which failed on the missing key)."""
    compiled = compile_statement_for(f"{DPS} {C1} AS n FROM people TABLESAMPLE BERNOULLI (30 PERCENT)", tables)
    source = compiled.parts[0].source_sql()
    assert has_samples(source) and render(source, "duckdb", None) == source
    assert not has_samples(render(source, "duckdb", 7))


def test_a_sampled_public_groups_list_is_the_same_sample_in_the_key_list_and_the_join(tables):
    sql = ("SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS (epsilon = 1, group_selection_strategy = PUBLIC_GROUPS) dept, "
           f"{C1} AS n FROM many RIGHT OUTER JOIN (SELECT DISTINCT dept FROM depts) TABLESAMPLE BERNOULLI (50 PERCENT) "
           "USING (dept) GROUP BY dept")
    exact = run_sql(sql, tables).controller_only.exact
    assert within_binomial(len(exact), 1000, 0.5)  # about half the groups are listed, not all
    assert (exact["n"] == 100).all()  # each listed group has all of its 100 rows: the join kept the same groups


def test_a_sample_in_the_outer_query_samples_the_released_rows(tables):
    sql = (f"SELECT dept, n FROM ({DPS} dept, {C1} AS n FROM many GROUP BY dept) TABLESAMPLE BERNOULLI (50 PERCENT)")
    result = run_sql(sql, tables, max_partitions_contributed=1)
    assert within_binomial(len(result.table), 1000, 0.5)


def test_a_percentage_in_parentheses_is_read_in_the_dp_select_and_in_the_outer_query(tables):
    # the outer query's sample is run by DuckDB, which reads the percentage bare: it is unwrapped
    inner = exact_n(run_sql(f"{DPS} {C1} AS n FROM people TABLESAMPLE BERNOULLI ((10) PERCENT)", tables))
    assert within_binomial(inner, N, 0.1)
    outer = run_sql(f"SELECT dept, n FROM ({DPS} dept, {C1} AS n FROM many GROUP BY dept) "
                    "TABLESAMPLE BERNOULLI ((50) PERCENT)", tables, max_partitions_contributed=1)
    assert within_binomial(len(outer.table), 1000, 0.5)


def test_one_hundred_percent_is_every_row(tables):
    assert exact_n(run_sql(f"{DPS} {C1} AS n FROM people TABLESAMPLE BERNOULLI (100 PERCENT)", tables)) == N


@pytest.mark.parametrize("sample,message", [
    ("TABLESAMPLE RESERVOIR (10 ROWS)", "per-unit bound breaks"),
    ("TABLESAMPLE BERNOULLI (10)", "n ROWS"),
    ("TABLESAMPLE BERNOULLI (10 PERCENT) REPEATABLE (3)", "REPEATABLE"),
    ("TABLESAMPLE SYSTEM (0 PERCENT)", r"must be in \(0, 100\], got 0"),
    ("TABLESAMPLE BERNOULLI (150 PERCENT)", r"must be in \(0, 100\], got 150"),
    ("TABLESAMPLE BERNOULLI (100.5 PERCENT)", r"must be in \(0, 100\], got 100.5"),
    ("TABLESAMPLE (BUCKET 1 OUT OF 4 ON uid)", r"only TABLESAMPLE BERNOULLI / SYSTEM \(p PERCENT\) is supported"),
    ("TABLESAMPLE BERNOULLI (-5 PERCENT)", r"not valid SQL|must be in \(0, 100\]"),  # sqlglot reads no sign there
    ("TABLESAMPLE BERNOULLI", "the sample's percentage is missing: it must be a number literal"),
    ("TABLESAMPLE ()", "the sample's percentage is missing"),
    ("TABLESAMPLE SYSTEM ('10' PERCENT)", "the sample's percentage must be a number literal, got the string '10'"),
    ("TABLESAMPLE BERNOULLI (NULL PERCENT)", "the sample's percentage must be a number literal, got NULL"),
    ("TABLESAMPLE BERNOULLI (@p PERCENT)", "the sample's percentage must be a number literal, got"),
    ("USING SAMPLE 10%", "USING SAMPLE is not supported"),
    ("USING SAMPLE 10 PERCENT (bernoulli)", "USING SAMPLE is not supported"),
])
def test_other_samples_are_refused_with_their_reason(tables, sample, message):
    for sql in (f"{DPS} {C1} FROM people {sample}",
                f"SELECT * FROM ({DPS} dept, {C1} AS n FROM people GROUP BY dept) {sample}"):
        with pytest.raises(dp.DPError, match=message) as err:
            compile_statement_for(sql, tables, epsilon=1.0)
        assert "\n" not in str(err.value)


def test_a_bucket_sample_with_only_its_bucket_number_is_refused_as_a_bucket_sample(tables):
    """TABLESAMPLE (BUCKET 1), a Hive bucket sample cut short: sqlglot reads its bucket number alone
    (no OUT OF, no ON); it is refused as the unsupported sample it is, not as a missing percentage."""
    for sql, where in ((f"{DPS} {C1} FROM people TABLESAMPLE (BUCKET 1)", "the DP SELECT"),
                       (f"SELECT * FROM ({DPS} dept, {C1} AS n FROM people GROUP BY dept) TABLESAMPLE (BUCKET 1)",
                        "the outer query")):
        with pytest.raises(dp.UnsupportedError) as err:
            compile_statement_for(sql, tables, epsilon=1.0)
        assert str(err.value) == (f"{where}: 'TABLESAMPLE SYSTEM (BUCKET 1 OUT OF )': only TABLESAMPLE BERNOULLI / "
                                  "SYSTEM (p PERCENT) is supported")


def test_a_table_whose_column_names_need_quotes_is_sampled():
    """The sample's rewrite names every column of the sampled rows: names with a space, a keyword and a
    quote are quoted there, so the sample runs and keeps about its share of the units."""
    people = pd.DataFrame({"user id": np.arange(N), "order": np.arange(N) % 4, 'say "hi"': 1})
    result = run_sql(f"{DPS} {C1} AS n FROM t TABLESAMPLE BERNOULLI (10 PERCENT)",
                     {"t": Table(people, "user id")})
    assert within_binomial(exact_n(result), N, 0.10)


def test_a_sample_the_checker_left_in_a_compiled_source_is_refused_not_run():
    """The safety net behind the rewrite: a TABLESAMPLE still in a DP SELECT's compiled source (which the
    checker never leaves: each one above is rewritten or refused first) would be DuckDB's own sample,
    outside the accounting; it is refused, naming which DP SELECT, and a source without one passes."""
    import sqlglot

    from dp_core.sql.statement import refuse_samples_left

    clean = sqlglot.parse_one("SELECT uid FROM people")
    left = sqlglot.parse_one("SELECT uid FROM (SELECT * FROM people TABLESAMPLE BERNOULLI (10 PERCENT)) AS s")
    refuse_samples_left([clean, clean])
    with pytest.raises(dp.UnsupportedError) as err:
        refuse_samples_left([clean, left])
    assert str(err.value) == ("DP SELECT 2: TABLESAMPLE is supported after a table or a subquery in a FROM clause "
                              "only")


def test_a_sample_on_the_first_table_of_a_parenthesized_join(tables):
    result = run_sql(f"{DPS} {C1} AS n FROM (people p TABLESAMPLE BERNOULLI (10 PERCENT) JOIN depts d "
                     "ON p.dept = d.dept) JOIN many m USING (uid)", tables)
    assert within_binomial(exact_n(result), N, 0.10)  # the FROM is flattened in place: the sample is kept


@pytest.mark.xdist_group("spark")  # on the Spark worker, in its session: no JVM of its own here
def test_on_spark_the_same_sample_as_on_duckdb(spark, tables):
    small = {"people": Table(tables["people"].data.head(20_000), "uid")}
    sql = f"{DPS} {C1} AS n FROM people TABLESAMPLE BERNOULLI (10 PERCENT)"
    result = run_sql(sql, small, backend="spark", spark=spark)
    assert within_binomial(exact_n(result), 20_000, 0.10)
    # one key: the portable hash keeps the same rows on both engines
    from dp_core.backend_spark import SparkTables

    source = compile_statement_for(sql, small).parts[0].source_sql()
    views = SparkTables.open({"people": small["people"].data}, spark)
    try:
        backend = views.backend_for(render(source, "spark", 99))
        on_spark = backend.run("SELECT uid FROM dp_input ORDER BY uid")
        backend.close()
    finally:
        views.close()
    duck = DuckDBBackend.for_tables({"people": small["people"].data})
    duck.define_input(render(source, "duckdb", 99))
    on_duck = duck.run("SELECT uid FROM dp_input ORDER BY uid")
    duck.close()
    assert on_spark["uid"].tolist() == on_duck["uid"].tolist()


@pytest.mark.xdist_group("spark")  # on the Spark worker, in its session: no JVM of its own here
def test_on_spark_a_sampled_public_groups_list_matches_the_join(spark, tables):
    """The key list is read by DuckDB (public tables, beside the engine), the source's join runs on
    Spark: the portable hash keeps the same groups on both."""
    small = {"many": Table(tables["many"].data.head(20_000), "uid"), "depts": tables["depts"]}
    sql = ("SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS (epsilon = 1, group_selection_strategy = PUBLIC_GROUPS) dept, "
           f"{C1} AS n FROM many RIGHT OUTER JOIN (SELECT DISTINCT dept FROM depts) TABLESAMPLE BERNOULLI (50 PERCENT) "
           "USING (dept) GROUP BY dept")
    exact = run_sql(sql, small, backend="spark", spark=spark).controller_only.exact
    assert within_binomial(len(exact), 1000, 0.5) and (exact["n"] == 20).all()


def test_a_sample_below_one_percent_is_kept_and_a_sample_of_rows_is_refused_whole(tables):
    """TABLESAMPLE BERNOULLI (0.5 PERCENT) keeps about 0.5% of the rows (any percentage in (0, 100]);
    BERNOULLI (10 ROWS), which DuckDB reads as a reservoir, is refused with the whole rule it breaks and its remedy."""
    kept = exact_n(run_sql(f"{DPS} {C1} AS n FROM people TABLESAMPLE BERNOULLI (0.5 PERCENT)", tables))
    assert within_binomial(kept, N, 0.005)
    with pytest.raises(dp.DPError) as err:
        compile_statement_for(f"{DPS} {C1} FROM people TABLESAMPLE BERNOULLI (10 ROWS)", tables, epsilon=1.0)
    assert str(err.value) == (
        "the DP SELECT: 'TABLESAMPLE RESERVOIR (10 ROWS)': a sample of n ROWS (RESERVOIR) is not supported: it keeps "
        "n rows chosen among all units' rows, so one unit's rows change which of the others' are kept (the per-unit "
        "bound breaks); use TABLESAMPLE BERNOULLI (p PERCENT)")


def test_a_sampled_public_table_in_a_scalar_subquery_of_the_select_list_runs(tables):
    """The select list's subqueries are post-processing over public rows: a sample there is decided
    with the release's key like any other (DuckDB had refused the bare placeholder function)."""
    sub = "(SELECT dept FROM depts TABLESAMPLE BERNOULLI (50 PERCENT) ORDER BY dept LIMIT 1)"
    result = run_sql(f"{DPS} dept, {C1} AS n, {sub} AS first_kept FROM people GROUP BY dept", tables)
    kept = result.table["first_kept"].unique().tolist()
    assert len(kept) == 1  # one sample decision for every row of the output
    # the least kept of 1000 rows kept with probability 1/2 each: above 39 with probability 2^-40
    assert 0 <= kept[0] <= 39


@pytest.mark.parametrize("public", ["SELECT *, dept + 1000 FROM depts", "SELECT dept, dept, dept + 1000 FROM depts",
                                    "SELECT dept + 1000 FROM depts UNION ALL SELECT dept + 2000 FROM depts"])
def test_a_sampled_public_subquery_s_unnamed_column_is_read_by_the_name_the_checker_gave_it(tables, public):
    """An unnamed column of a sampled public subquery is read by the name `_col<n>` the refusals list (its
    place among the columns: beside a *, after a name given twice, in a UNION's first branch): the sample's
    rewrite names it so, where DuckDB named it otherwise (DuckDB's binder error before). The departments kept
    by half a sample of the 1,000 (read back from dept + 1000), each of 100 rows of `many`, are counted."""
    name = "_col0" if public.startswith("SELECT dept +") else "_col1" if "*" in public else "_col2"
    sql = (f"{DPS} {C1} AS n FROM many WHERE dept IN "
           f"(SELECT {name} - 1000 FROM ({public}) TABLESAMPLE BERNOULLI (50 PERCENT))")
    n = exact_n(run_sql(sql, tables))
    assert n % 100 == 0 and within_binomial(n / 100, 1000, 0.5), n  # not 0: the column read is dept + 1000


@pytest.mark.parametrize("public", ["depts AS d(k)", "(SELECT dept + 1000 - 1000 AS dept FROM depts) AS d(k)",
                                    "(SELECT * REPLACE (dept + 0 AS dept) FROM depts) AS d(k)",
                                    "(SELECT dept FROM depts UNION ALL BY NAME SELECT dept FROM depts WHERE false) AS d(k)"])
def test_a_sampled_public_table_or_subquery_with_a_column_list_is_read_by_the_listed_names(tables, public):
    """A column list renames the sampled rows' columns after the sample, which reads them by their own
    names (until 2026-11-25 it listed the new names inside, and DuckDB's binder refused `k`); a * REPLACE
    and a UNION BY NAME keep names the check knows. The
    departments kept by half a sample of the 1,000, each of 100 rows of `many`, are counted."""
    sql = f"{DPS} {C1} AS n FROM many WHERE dept IN (SELECT k FROM {public} TABLESAMPLE BERNOULLI (50 PERCENT))"
    n = exact_n(run_sql(sql, tables))
    assert n % 100 == 0 and within_binomial(n / 100, 1000, 0.5), n


@pytest.mark.parametrize("public", ["SELECT * RENAME (dept AS k) FROM depts", "SELECT * EXCLUDE (dept), dept AS k FROM depts",
                                    "SELECT COLUMNS('de.*') FROM depts", "SELECT UNNEST({'k': dept}) FROM depts",
                                    "SELECT * ILIKE 'de%' FROM depts"])
def test_a_sample_of_public_rows_whose_names_duckdb_gives_is_refused_in_one_line(tables, public):
    """The sample reads each row's columns by name; these names are DuckDB's, which the check cannot tell:
    refused before anything runs, in the check's words (DuckDB's binder error until 2026-11-25). The same
    subquery unsampled is read as it is (the 100 rows of department 1)."""
    sql = f"{DPS} {C1} AS n FROM many WHERE dept IN (SELECT 1 FROM ({public}) TABLESAMPLE BERNOULLI (50 PERCENT))"
    with pytest.raises(dp.UnsupportedError) as refused:
        run_sql(sql, tables)
    assert "TABLESAMPLE reads each row's columns by name" in str(refused.value)
    assert "select the columns by name, with AS, in that subquery" in str(refused.value)
    assert exact_n(run_sql(sql.replace(" TABLESAMPLE BERNOULLI (50 PERCENT)", ""), tables)) == 100


@pytest.mark.parametrize("sql, words", [
    (f"WITH p AS (SELECT dept, dept + 1 FROM depts) {DPS} {C1} AS n FROM many WHERE dept IN "
     "(SELECT dept FROM p TABLESAMPLE BERNOULLI (50 PERCENT))",
     "TABLESAMPLE reads each row's columns by name, and _col1 is an unnamed expression, which DuckDB names by its "
     "text: not supported (name it with AS where it is computed)"),
    (f"{DPS} {C1} AS n FROM many WHERE dept IN (SELECT dept FROM (SELECT dept + 0, dept FROM depts UNION BY NAME "
     "SELECT dept + 0, dept FROM depts) TABLESAMPLE BERNOULLI (50 PERCENT))",
     "TABLESAMPLE reads each row's columns by name, and _col0 is an unnamed expression, which DuckDB names by its "
     "text: not supported (name it with AS where it is computed)"),
    (f"{DPS} {C1} AS n FROM many WHERE dept IN (SELECT _col0 FROM (SELECT dept + 0 FROM depts) "
     "TABLESAMPLE BERNOULLI (100 PERCENT))",
     "is an unnamed expression (the check lists it by its place), which DuckDB names by its text: name it with AS "
     "in that subquery and use that name"),
    (f"WITH a AS (SELECT dept + 0 FROM depts), b AS (SELECT * FROM a) {DPS} {C1} AS n FROM many WHERE dept IN "
     "(SELECT _col0 FROM b)",
     "column '_col0' of 'b' is an unnamed expression (the check lists it by its place), which DuckDB names by its "
     "text: name it with AS in that subquery and use that name"),
])
def test_an_unnamed_public_column_is_never_read_by_a_name_duckdb_does_not_give_it(tables, sql, words):
    """The check lists an unnamed public column as `_col<n>`, which only a sample's rewrite writes in: a
    sampled CTE or BY NAME branch (not rewritten there), a 100 PERCENT sample (not rewritten at all) and
    a * over such rows would have had DuckDB bind `_col<n>` to nothing or to a column of the query
    around it (until 2026-11-25: a wrong sample, or `people._col0` read). Refused, before anything runs."""
    with pytest.raises(dp.DPError) as refused:
        run_sql(sql, tables)
    assert words in str(refused.value)


def test_a_real_column_named_like_the_check_s_name_for_an_unnamed_one_is_read_as_itself():
    """`SELECT dept + 100, _col0 FROM codes`: the check would call the first column `_col0` too, but DuckDB
    names it by its text and reads the table's own `_col0` for `s._col0`: so does the check (it was
    refused as an unnamed expression). Departments 0 and 1 have codes 10 and 11: 2 of 4 people kept."""
    people = pd.DataFrame({"uid": np.arange(400), "dept": np.arange(400) % 4})
    codes = pd.DataFrame({"dept": [0, 1, 2, 3], "_col0": [10, 11, 99, 99]})
    tables = {"people": Table(people, "uid"), "codes": Table(codes)}
    sql = (f"{DPS.replace('epsilon = 1', 'epsilon = 100')} {C1} AS n FROM people WHERE dept + 10 IN "
           "(SELECT s._col0 FROM (SELECT dept + 100, _col0 FROM codes) s)")
    assert exact_n(run_sql(sql, tables)) == 200
