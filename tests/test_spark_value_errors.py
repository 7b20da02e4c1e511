"""One person's value cannot make a DP SELECT fail on the Spark backend either
(dp_core/spark_no_value_errors.py; the DuckDB side: tests/test_sql_value_errors.py).

Until 2026-11-30 the Spark backend ran the analyst's expressions as written, under Spark's ANSI
mode: a cast, an overflow, a date, an array index or an implicit conversion (`v = 1` over a text)
that one row's value did not fit failed the whole release, so an analyst who aimed it at one person
learned a fact about her from whether the release failed. Here the failing expressions of the DuckDB
tests, in the same places, run on Spark on two neighbouring datasets that differ by one person whose
values they cannot compute: both must run, with the same columns, as on DuckDB. One statement holds
all the expressions of a place (one column each), so that the class costs a few Spark jobs."""

from __future__ import annotations

import re

import numpy as np
import pandas as pd
import pytest
from test_sql_value_errors import DP, FAILING, PLACES, TARGET, C

import dp_core as dp
from dp_core.sql import Table, run_sql

pytestmark = pytest.mark.xdist_group("spark")  # one worker, one SparkSession (pyproject: --dist loadgroup)

N = 60
#: the DuckDB class's expressions whose pattern Spark reads as a regular expression from the data:
#: refused by name on Spark (test_a_pattern_read_from_the_data_is_refused_alike), computed on DuckDB
PATTERNS = {"regexp_matches('a', v)"}
#: and what Spark alone failed on: implicit conversions of a text to a number, a sum of BIGINTs
#: (DuckDB sums them in a HUGEINT), an index past an array's end
SPARK_FAILING = [
    ("CASE WHEN v = 1 THEN 1 END", "1", "x"),  # CAST_INVALID_INPUT: the text cast to BIGINT to compare
    ("CASE WHEN v IN (1, 2) THEN 1 END", "1", "x"),
    ("[1, 2][CAST(v AS INTEGER)]", "1", "5"),  # INVALID_ARRAY_INDEX
    ("CAST(v AS BIGINT) * 2 + 1", "1", "9223372036854775807"),  # ARITHMETIC_OVERFLOW
    ("epoch_ms(CAST(v AS BIGINT))", "1", "9223372036854775000"),  # DATETIME_OVERFLOW, ANSI or not
]
EXPRESSIONS = [f for f in FAILING if f[0] not in PATTERNS] + SPARK_FAILING


def on_column(expression: str, i: int) -> str:
    """`expression` reading the column v<i>."""
    return re.sub(r"\bv\b", f"v{i}", expression)


def all_of(over) -> str:
    """One expression that computes every expression of EXPRESSIONS, each over its own column (`over`:
    the column's index -> what the expression reads for `v`): it fails when any of them does. Joined
    by || (NULL when one is), not concat_ws (never NULL): Spark drops `concat_ws(...) IS NOT NULL`
    as always true, and with it the expressions."""
    parts = ["CAST(" + re.sub(r"\bv\b", over(i), e) + " AS VARCHAR)" for i, (e, _, _) in enumerate(EXPRESSIONS)]
    return "(" + " || '|' || ".join(parts) + ")"


def people_with(target: bool) -> dict:
    """N people whose values each expression computes; with target=True, one more whose values no
    expression can: the two neighbouring datasets."""
    uids = np.arange(N)
    people = pd.DataFrame({"uid": uids, "dept": np.array(["a", "b"])[uids % 2]})
    for i, (_, good, bad) in enumerate(EXPRESSIONS):
        people[f"v{i}"] = np.array([bad if target and u == TARGET else good for u in uids], dtype=object)
    if not target:
        people = people[people["uid"] != TARGET]
    return {"people": Table(people.reset_index(drop=True), "uid"),
            "depts": Table(pd.DataFrame({"dept": ["a", "b"], "region": ["N", "S"]}))}


@pytest.fixture(scope="module")
def neighbours(spark):
    """The two neighbouring datasets as Spark DataFrames (shipped once for the module's statements)."""
    found = {}
    for target in (False, True):
        found[target] = {name: Table(spark.createDataFrame(t.data), t.privacy_unit)
                         for name, t in people_with(target).items()}
    return found


def run_alike(sql: str, neighbours, spark):
    """`sql` on Spark on both neighbours: both release, with the same columns; the one with the target."""
    without = run_sql(sql, neighbours[False], backend="spark", spark=spark)
    with_target = run_sql(sql, neighbours[True], backend="spark", spark=spark)  # failed on her values until the fix
    assert list(with_target.table.columns) == list(without.table.columns)
    return with_target


def refused_alike(sql: str, neighbours, spark) -> str:
    """The one-line refusal of `sql` on Spark, the same on both neighbours."""
    refusals = []
    for target in (False, True):
        with pytest.raises(dp.InvalidQueryError) as caught:
            run_sql(sql, neighbours[target], backend="spark", spark=spark)
        refusals.append(str(caught.value))
    assert refusals[0] == refusals[1] and "\n" not in refusals[0]
    return refusals[0]


@pytest.mark.parametrize("place", PLACES)
def test_a_value_spark_cannot_compute_does_not_fail_the_release(place, neighbours, spark):
    sql = PLACES[place].format(e=all_of(lambda i: f"v{i}"), m=all_of(lambda i: f"MAX(v{i})"))
    run_alike(sql, neighbours, spark)


def test_a_row_filter_spark_cannot_compute_does_not_fail_the_release(spark):
    """The engine's own row filter (Query.where, a release spec's `where`) on Spark: the row whose
    values the filter cannot compute is filtered out, as on DuckDB."""
    condition = " AND ".join(f"{on_column(e, i)} IS NOT NULL" for i, (e, _, _) in enumerate(EXPRESSIONS))
    query = dp.Query([dp.count(upper=1, name="n")], privacy_unit="uid", group_by=("dept",), epsilon=1.0, delta=1e-6,
                     where=condition, public_partitions=["a", "b"])
    for target in (False, True):  # the neighbour without the target, then with it (failed until the fix)
        people = spark.createDataFrame(people_with(target)["people"].data)
        assert sorted(dp.execute(query, people, backend="spark", spark=spark).table["dept"]) == ["a", "b"]


@pytest.mark.parametrize("key", ["date_add(DATE '2020-01-01', 3000000)", "make_date(-5, 1, 1)"])
def test_a_date_key_python_cannot_hold_does_not_fail_the_release_on_spark(key, spark):
    """A DATE key computed from one person's row beyond Python's dates (years 1 to 9999), which
    Spark computes: reading the candidate partitions back failed the release ("year 10233 is out of
    range", a bare ValueError) only when she was in the data. Her row is now dropped (bounding.py)."""
    sql = DP + (f"k, {C} AS n FROM (SELECT uid, CASE WHEN v0 = 'x' THEN {key} ELSE DATE '2020-01-01' END AS k "
                "FROM people) GROUP BY k")
    for target in (False, True):  # without her, then with her (failed until the fix)
        people = {"people": Table(spark.createDataFrame(people_with(target)["people"].data), "uid")}
        released = run_sql(sql, people, backend="spark", spark=spark).table
        assert [str(k) for k in released["k"]] == ["2020-01-01"]


def test_the_engine_s_own_per_unit_sum_of_one_person_s_bigints_does_not_fail_on_spark(spark):
    """The engine sums each unit's values before clamping them: on Spark a BIGINT in a BIGINT, so
    two of the target's rows near 2^62 overflowed under ANSI mode and failed the release only when
    she was in the data. Its statements run with ANSI off: her sum is clamped like any other."""
    query = dp.Query([dp.sum_("x", 0, 10, name="s")], privacy_unit="uid", epsilon=1.0, delta=1e-6)
    for target in (False, True):  # without her, then with her (failed until the fix)
        others = [u for u in range(N) if u != TARGET]
        rows = pd.DataFrame({"uid": others + [TARGET, TARGET] * target, "x": [1] * len(others) + [2**62, 2**62] * target})
        released = dp.execute(query, spark.createDataFrame(rows), backend="spark", spark=spark).table
        assert list(released.columns[:1]) == ["s"]


def test_a_per_unit_sum_of_bigints_does_not_fail_the_release_on_spark(neighbours, spark):
    """Spark sums a BIGINT in a BIGINT (DuckDB in a HUGEINT, never overflowing): two of the target's
    rows near 2^63 overflowed her per-unit SUM and failed the release. Now her sum is NULL (try_sum)."""
    i = [e for e, _, _ in EXPRESSIONS].index("CAST(v AS BIGINT) * 2 + 1")
    doubled = f"(SELECT uid, v{i} FROM people UNION ALL SELECT uid, v{i} FROM people)"  # two rows per person
    sql = DP + (f"{C} AS n FROM (SELECT uid, SUM(TRY_CAST(v{i} AS BIGINT)) AS s, AVG(TRY_CAST(v{i} AS BIGINT)) AS a "
                f"FROM {doubled} GROUP BY uid) WHERE s IS NOT NULL")
    run_alike(sql, neighbours, spark)


@pytest.mark.parametrize(("written", "refusal"), [
    ("regexp_matches(dept, v0)", "a pattern (regular expression, LIKE) must be a literal string"),
    ("dept LIKE v0", "a pattern (regular expression, LIKE) must be a literal string"),
    ("regexp_replace(dept, v0, 'x')", "a pattern (regular expression, LIKE) must be a literal string"),
    ("len(range(0, CAST(v0 AS BIGINT)))", "a series (range, generate_series) must have literal bounds"),
], ids=["regexp_matches", "LIKE", "regexp_replace", "range"])
def test_what_spark_fails_on_whatever_ansi_says_is_refused_alike(written, refusal, neighbours, spark):
    """Spark compiles a pattern row by row and fails on one that does not parse, and fails on a
    series of more than 2^31 elements, ANSI or not: such a call whose pattern or bounds are not
    literals is refused by name, before anything runs, on both neighbours."""
    sql = DP + f"{C} AS n FROM people WHERE {written} IS NOT NULL"
    assert f"on the Spark backend {refusal}" in refused_alike(sql, neighbours, spark)


@pytest.mark.parametrize("pattern", ["regexp_matches(dept, '(?P<d>a)')", "regexp_replace(dept, '(?P<d>a)', 'x')",
                                     "dept LIKE 'a\\'", "dept LIKE 'a!' ESCAPE '!'"])
def test_a_literal_pattern_spark_cannot_compile_is_refused_whatever_the_rows(pattern, neighbours, spark):
    """A pattern DuckDB compiles (RE2's `(?P<name>...)`, a LIKE ending in a backslash) that Spark's
    Java syntax cannot: Spark failed only when a row reached it (here the target's, the only one
    the WHERE keeps). Now it is compiled once over a constant row and refused alike on both."""
    sql = DP + f"{C} AS n FROM people WHERE uid = {TARGET} AND {pattern}"
    assert "does not compile on Spark" in refused_alike(sql, neighbours, spark)


def test_a_literal_pattern_spark_compiles_runs(neighbours, spark):
    """The patterns Spark compiles run as written, an ESCAPE with its escape character."""
    sql = DP + f"{C} AS n FROM people WHERE dept LIKE 'a!%' ESCAPE '!' OR regexp_matches(dept, '^[ab]$')"
    run_alike(sql, neighbours, spark)


def test_a_join_comparing_a_text_with_a_number_is_refused_on_spark_as_on_duckdb(spark):
    """The DuckDB refusal of a join key converted row by row (refuse_converting_join_keys) is the
    Spark backend's too: the same verdict, on both neighbours; the join cast by hand runs on both."""
    sql = DP + f"region, {C} AS n FROM people p JOIN codes c ON p.v0 = c.code GROUP BY region"

    def tables(target):
        found = people_with(target)
        found["codes"] = Table(pd.DataFrame({"code": [1, 2], "region": ["N", "S"]}))
        return found
    refusals = []
    for target in (False, True):
        with pytest.raises(dp.InvalidQueryError) as caught:
            run_sql(sql, tables(target), backend="spark", spark=spark)
        refusals.append(str(caught.value))
    assert refusals[0] == refusals[1] and "compares a VARCHAR with a BIGINT" in refusals[0], refusals[0]
    fixed = sql.replace("p.v0 = c.code", "CAST(p.v0 AS BIGINT) = c.code")
    for target in (False, True):
        assert list(run_sql(fixed, tables(target), backend="spark", spark=spark).table["region"]) == ["N"]


def test_post_processing_cannot_fail_on_a_released_value_on_spark(neighbours, spark):
    """Post-processing (a DP SELECT's list and HAVING, the outer query) runs in DuckDB under TRY on
    the Spark backend too: a cast that fails on a released count is NULL, not a refunded failure."""
    from test_sql_value_errors import FAILS_ON_RELEASED, INNER

    sql = (f"SELECT {FAILS_ON_RELEASED} AS t, SUM({FAILS_ON_RELEASED}) OVER () AS w FROM ({INNER}) "
           f"WHERE {FAILS_ON_RELEASED} IS NULL ORDER BY {FAILS_ON_RELEASED}")
    released = run_sql(sql, neighbours[True], backend="spark", spark=spark).table
    assert list(released.columns) == ["t", "w"] and released["t"].isna().all()


def test_the_session_keeps_its_ansi_setting_and_threads_sharing_it_see_it_off_until_the_last_is_done(spark):
    """The backend turns ANSI mode off for its statements only: the session's own setting is back
    afterwards. Two threads of one session (a flow's tasks) interleaved: the one still running keeps
    ANSI off after the other is done (the first to leave restored ANSI under the second's statement
    until the blocks were counted), and the session ends with its own setting."""
    import threading

    from dp_core.spark_no_value_errors import ANSI, ansi_off

    assert spark.conf.get(ANSI) == "true"
    first_in, second_in, first_out, seen = threading.Event(), threading.Event(), threading.Event(), []

    def second():
        first_in.wait()
        with ansi_off(spark):
            second_in.set()
            first_out.wait()
            seen.append(spark.conf.get(ANSI))  # the first thread has left its block

    thread = threading.Thread(target=second)
    thread.start()
    with ansi_off(spark):
        first_in.set()
        second_in.wait()
    first_out.set()
    thread.join()
    assert seen == ["false"] and spark.conf.get(ANSI) == "true"
