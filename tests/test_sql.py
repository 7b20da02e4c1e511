"""The DP SQL front end: both syntaxes, row ownership (seed Table 4.3), compilation, fuzzing."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import dp_core as dp
from dp_core.sql import Table, compile_for, run_sql


@pytest.fixture(scope="module")
def company():
    rng = np.random.default_rng(11)  # test data only
    n = 400
    employee = pd.DataFrame({"uid": np.arange(n), "dept": rng.choice(["Sales", "HR", "IT"], n, p=[0.6, 0.395, 0.005]),
                             "age": rng.integers(20, 65, n)})
    order = pd.DataFrame({"uid": rng.integers(0, n, 3000), "val": rng.uniform(0, 150, 3000), "k": rng.integers(0, 3, 3000)})
    t1 = pd.DataFrame({"uid": np.arange(n), "partition_key": np.arange(n) % 4})
    t2 = pd.DataFrame({"uid": np.arange(2 * n) % n, "val": rng.uniform(0, 1, 2 * n)})
    other = pd.DataFrame({"person": np.arange(n), "dept": "x"})
    return {"Employee": Table(employee, "uid"), "Order": Table(order, "uid"), "Table1": Table(t1, "uid"),
            "Table2": Table(t2, "uid"), "Other": Table(other, "person")}


def test_listing_4_5_runs_end_to_end(company):
    sql = """SELECT WITH ANONYMIZATION
               T1.partition_key,
               ANON_SUM(T2.val, 0, 1)
             FROM Table1 T1 JOIN Table2 T2 USING(uid)
             GROUP BY T1.partition_key"""
    r = run_sql(sql, company, epsilon=1.0)
    assert list(r.table.columns) == ["partition_key", "sum_val", "sum_val_ci_low", "sum_val_ci_high", "sum_val_noise_sd"]
    assert sorted(r.table["partition_key"]) == [0, 1, 2, 3]
    assert (r.table["sum_val_ci_low"] <= r.table["sum_val"]).all() and (r.table["sum_val"] <= r.table["sum_val_ci_high"]).all()


def test_listing_4_8_drops_the_tiny_department(company):
    sql = 'SELECT WITH ANONYMIZATION dept, ANON_COUNT(*, 5) AS c FROM Employee E JOIN "Order" O USING(uid) GROUP BY dept'
    r = run_sql(sql, company, epsilon=1.0)
    assert set(r.table["dept"]) == {"Sales", "HR"}  # IT has ~2 employees: dropped, as in Figure 4.9
    assert {"c", "c_ci_low", "c_ci_high"} <= set(r.table.columns)
    assert r.controller_only.partitions_nonempty == 3


PAIRS = [
    ("ANON_COUNT(*, 5) AS c", "COUNT(*, contribution_bounds_per_group => (0, 5)) AS c"),
    ("ANON_COUNT(val, 3) AS c", "COUNT(val, contribution_bounds_per_group => (0, 3)) AS c"),
    ("ANON_COUNT(DISTINCT uid) AS n", "COUNT(DISTINCT uid) AS n"),
    ("ANON_SUM(val, 0, 100) AS s", "SUM(val, contribution_bounds_per_group => (0, 100)) AS s"),
    ("ANON_AVG(val, -1, 100)", "AVG(val, contribution_bounds_per_group => (-1, 100))"),
    ("ANON_VAR(val, 0, 100) AS v", "VAR_POP(val, contribution_bounds_per_row => (0, 100)) AS v"),
    ("ANON_STDDEV(val, 0, 100) AS sd", "STDDEV_POP(val, contribution_bounds_per_row => (0, 100)) AS sd"),
    ("ANON_MEDIAN(val, 0, 100) AS m", "PERCENTILE_CONT(val, 0.5, contribution_bounds_per_row => (0, 100)) AS m"),
    ("ANON_NTILE(val, 0.9, 0, 100) AS p90", "PERCENTILE_CONT(val, 0.9, contribution_bounds_per_row => (0, 100)) AS p90"),
    ("ANON_SUM(val) AS s", "SUM(val) AS s"),  # automatic bounds in both
]


@pytest.mark.parametrize("seed,bigquery", PAIRS)
def test_both_syntaxes_compile_to_the_same_typed_query(company, seed, bigquery):
    a = compile_for(f'SELECT WITH ANONYMIZATION dept, {seed} FROM Employee E JOIN "Order" O USING (uid) GROUP BY dept',
                    company, epsilon=1.0, delta=1e-6, max_partitions_contributed=2)
    b = compile_for(
        "SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS (epsilon = 1, delta = 1e-6, max_groups_contributed = 2, "
        f'privacy_unit_column = uid) dept, {bigquery} FROM Employee E JOIN "Order" O USING (uid) GROUP BY dept',
        company)
    assert a.query == b.query
    assert a.source_sql() == b.source_sql()
    assert a.source_sql("spark")  # the same source renders for another engine


def test_unit_is_carried_through_projections_and_subqueries_run(company):
    sql = """SELECT WITH ANONYMIZATION d, ANON_AVG(total, 0, 2000) AS avg_total
             FROM (SELECT E.dept AS d, sum(O.val) AS total FROM Employee E JOIN "Order" O ON E.uid = O.uid
                   WHERE O.k <> 2 GROUP BY E.uid, E.dept) AS per_person
             GROUP BY d"""
    c = compile_for(sql, company, epsilon=1.0)
    assert '"uid"' in c.source_sql()  # added automatically: the analyst did not select it
    r = run_sql(sql, company, epsilon=1.0)
    assert set(r.table["d"]) <= {"Sales", "HR", "IT"}
    cte = """WITH big AS (SELECT uid, val FROM "Order" WHERE val > 10)
             SELECT WITH ANONYMIZATION ANON_COUNT(*, 10) AS n FROM big"""
    assert run_sql(cte, company, epsilon=1.0).table["n"].iloc[0] > 0


def test_order_by_and_limit_are_post_processing(company):
    sql = ('SELECT WITH ANONYMIZATION dept, ANON_COUNT(*, 5) AS c FROM Employee E JOIN "Order" O USING (uid) '
           "GROUP BY dept ORDER BY c DESC LIMIT 1")
    r = run_sql(sql, company, epsilon=2.0)
    assert len(r.table) == 1



def test_an_aggregate_inside_an_expression_is_named_after_what_was_written(company):
    """Aggregates used only inside an expression or HAVING are named for a person: the output using
    them (or HAVING) and the aggregate as written without its bounds; a name taken gets a number.
    The typed query is otherwise the one the names `__agg0`, `__agg1`, ... stood for."""
    sql = ("SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS (epsilon = 1, max_groups_contributed = 1) dept, "
           "ROUND(AVG(age, contribution_bounds_per_group => (20, 65)), 1) AS a, "
           "2 * PERCENTILE_CONT(age, 0.5, contribution_bounds_per_row => (20, 65)), "
           "COUNT(*, contribution_bounds_per_group => (0, 1)) AS `a (AVG(age))` "
           "FROM Employee GROUP BY dept HAVING COUNT(DISTINCT uid) > 3")
    query = compile_for(sql, company).query
    assert [a.label for a in query.aggregates] == [
        "a (AVG(age)) #2", "_col2 (PERCENTILE_CONT(age, 0.5))", "a (AVG(age))", "HAVING (COUNT(DISTINCT uid))"]
    assert [a.kind for a in query.aggregates] == ["avg", "quantile", "count", "count_units"]
    result = run_sql(sql, company)
    assert [s.part for s in result.budget][1:] == [a.label for a in query.aggregates]
    assert [c for c in result.table.columns if not c.endswith(("_ci_low", "_ci_high", "_noise_sd"))] == [
        "dept", "a", "_col2", "a (AVG(age))"]


FORBIDDEN = [
    ('SELECT WITH ANONYMIZATION dept, ANON_COUNT(*, 5) FROM Employee E JOIN "Order" O ON E.age = O.k GROUP BY dept',
     "does not join on the unit"),
    ('SELECT WITH ANONYMIZATION dept, ANON_COUNT(*, 5) FROM Employee E CROSS JOIN "Order" O GROUP BY dept',
     "cross or comma join"),
    ('SELECT WITH ANONYMIZATION dept, ANON_COUNT(*, 5) FROM Employee E, "Order" O GROUP BY dept', "cross or comma join"),
    ("SELECT WITH ANONYMIZATION ANON_SUM(t, 0, 9) FROM (SELECT dept, count(*) AS t FROM Employee GROUP BY dept)",
     "must group by the unit"),
    ("SELECT WITH ANONYMIZATION ANON_SUM(t, 0, 9) FROM (SELECT count(*) AS t FROM Employee)", "must group by the unit"),
    ("SELECT WITH ANONYMIZATION ANON_SUM(r, 0, 9) FROM (SELECT uid, rank() OVER (ORDER BY age) AS r FROM Employee)",
     "window function"),
    ("SELECT WITH ANONYMIZATION ANON_COUNT(*, 1) FROM (SELECT * FROM Employee LIMIT 10)", "LIMIT inside a subquery"),
    ("SELECT WITH ANONYMIZATION ANON_COUNT(*, 1) FROM (SELECT * FROM Employee ORDER BY age)", "ORDER inside a subquery"),
    ("SELECT WITH ANONYMIZATION dept, age, ANON_COUNT(*, 1) FROM Employee GROUP BY dept",
     "neither a GROUP BY key nor a DP aggregate"),
    ("SELECT WITH ANONYMIZATION dept, ANON_COUNT(*, 1) FROM Employee WHERE ANON_COUNT(*, 1) > 3 GROUP BY dept",
     "is an aggregate, which is not allowed here"),
    ("SELECT WITH ANONYMIZATION ANON_SUM(ANON_COUNT(*, 1), 0, 1) FROM Employee", "nested inside a DP aggregate"),
    ("SELECT WITH ANONYMIZATION ANON_SUM(max(age), 0, 1) FROM Employee", "nested inside a DP aggregate"),
    ("SELECT WITH ANONYMIZATION ANON_COUNT(*, 1) FROM (SELECT uid FROM Employee UNION SELECT uid FROM \"Order\")",
     None),  # allowed: a set operation of protected rows, each keeping its unit
    ("SELECT WITH ANONYMIZATION ANON_COUNT(*, 1) FROM Employee UNION SELECT 1", None),
    ("SELECT WITH ANONYMIZATION ANON_FOO(age, 0, 1) FROM Employee", "unknown DP function ANON_FOO"),
    ("SELECT WITH ANONYMIZATION dept, my_udf(age) FROM Employee GROUP BY dept", "unknown function"),
    ("SELECT WITH ANONYMIZATION ANON_COUNT(*, 1) FROM Nowhere", "unknown table 'Nowhere'"),
    ("SELECT WITH ANONYMIZATION ANON_SUM(salary, 0, 1) FROM Employee", "unknown column 'salary'"),
    ("SELECT WITH ANONYMIZATION ANON_COUNT(*, 1) FROM Employee E JOIN Other X USING (uid)", "not in both joined relations"),
    ("SELECT WITH ANONYMIZATION ANON_COUNT(*, 1) FROM Employee E JOIN Other X ON E.uid = X.person AND E.dept = X.dept",
     None),  # allowed: the units are equal, another term may follow
    ("SELECT WITH ANONYMIZATION ANON_COUNT(*, 1) FROM (SELECT WITH ANONYMIZATION ANON_COUNT(*, 1) FROM Employee)",
     "inside another DP SELECT"),
    ("SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS (epsilon = 0) COUNT(*, contribution_bounds_per_group => (0, 1)) FROM Employee",
     "epsilon must be a finite number > 0"),
    ("SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS (epsilon = 1, max_groups_contributed = 0) COUNT(*) FROM Employee",
     "max_groups_contributed must be a whole number in [1, 2147483647]"),
    ("SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS (epsilon = 1, budget = 3) COUNT(*) FROM Employee", "unknown OPTIONS entry"),
    ("SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS (epsilon = 1, privacy_unit_column = dept) COUNT(*) FROM Employee",
     "does not match the registered privacy unit"),
    ("SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS (epsilon = 1, delta = 2) COUNT(*) FROM Employee",
     "delta = 2 is above the maximum 0.001"),
    ("SELECT WITH ANONYMIZATION ANON_COUNT(DISTINCT dept) FROM Employee", "cannot be bounded"),
    ("SELECT WITH ANONYMIZATION ANON_COUNT(DISTINCT uid, dept) FROM Employee", "cannot be bounded"),  # unit-dept pairs
    ("SELECT WITH ANONYMIZATION uid, ANON_COUNT(*, 1) FROM Employee GROUP BY uid", "one row per unit"),
    ("SELECT WITH ANONYMIZATION ANON_SUM(age, 9, 1) FROM Employee", "exceeds upper bound"),
    ("SELECT WITH ANONYMIZATION dept, ANON_COUNT(*, 1) FROM Employee GROUP BY dept HAVING ANON_COUNT(*, 1) > 2",
     None),  # allowed: HAVING filters the released (noisy) values: post-processing
    ("SELECT WITH ANONYMIZATION dept, ANON_COUNT(*, 1) FROM Employee GROUP BY dept HAVING max(age) > 2",
     "is not a DP aggregate"),
    ("SELECT WITH ANONYMIZATION ANON_COUNT(*, 1) FROM Employee WHERE age IN (SELECT age FROM Employee)", "subquery"),
    ("SELECT WITH ANONYMIZATION dept, ANON_COUNT(*, 1) FROM (SELECT uid, dept FROM Employee GROUP BY uid, dept "
     "HAVING MAX(age) IN (SELECT age FROM Employee)) s GROUP BY dept", "HAVING: '(SELECT age FROM Employee)' is not allowed"),
    ('SELECT WITH ANONYMIZATION ANON_COUNT(*, 1) FROM Employee E RIGHT JOIN "Order" O USING (uid)', None),
    ("SELECT age FROM Employee", "not a DP query"),
    ("SELECT WITH ANONYMIZATION ANON_COUNT(*, 1.5) FROM Employee", "whole number"),
]


@pytest.mark.parametrize("sql,message", FORBIDDEN)
def test_forbidden_queries_are_refused_with_their_reason(company, sql, message):
    if message is None:
        compile_for(sql, company, epsilon=1.0)
        return
    with pytest.raises(dp.DPError) as info:
        compile_for(sql, company, epsilon=1.0)
    assert message in str(info.value), str(info.value)


def test_at_least_twenty_distinct_refusals():
    assert len({m for _, m in FORBIDDEN if m}) >= 20


# ------------------------------------------------------------------------- fuzzing

FRAGMENTS = ["SELECT", "WITH", "ANONYMIZATION", "DIFFERENTIAL_PRIVACY", "OPTIONS", "(", ")", ",", "*", "FROM",
             "Employee", '"Order"', "E", "O", "JOIN", "USING", "ON", "uid", "dept", "age", "val", "=", "AND", "GROUP",
             "BY", "WHERE", "ANON_COUNT", "ANON_SUM", "ANON_AVG", "COUNT", "SUM", "0", "1", "5", "-", "epsilon",
             "DISTINCT", "UNION", "LIMIT", "ORDER", "OVER", "HAVING", "'x'", "E.uid", "O.uid", ";", "=>",
             "contribution_bounds_per_group", "SELECT WITH ANONYMIZATION"]
VALID = [s for s, m in FORBIDDEN if m is None] + [
    'SELECT WITH ANONYMIZATION dept, ANON_COUNT(*, 5) AS c FROM Employee E JOIN "Order" O USING (uid) GROUP BY dept',
    "SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS (epsilon = 1) dept, SUM(age, contribution_bounds_per_group => (0, 9)) "
    "FROM Employee GROUP BY dept",
]


def _compile_or_refuse(company, sql):
    from dp_core.sql.ownership import TableInfo
    from dp_core.sql.statement import compile_statement

    catalog = {n: TableInfo(n, tuple(t.data.columns), t.privacy_unit) for n, t in company.items()}
    try:
        compile_statement(sql, catalog, epsilon=1.0)
    except dp.DPError:
        pass


@settings(max_examples=int(__import__("os").environ.get("FUZZ_EXAMPLES", 150)), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.sampled_from(FRAGMENTS), min_size=1, max_size=25))
def test_fuzz_generated_sql_compiles_or_raises_our_error(company, words):
    _compile_or_refuse(company, " ".join(words))


@settings(max_examples=int(__import__("os").environ.get("FUZZ_EXAMPLES", 150)), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(base=st.sampled_from(VALID + [s for s, _ in FORBIDDEN]), cut=st.integers(0, 400), insert=st.sampled_from(FRAGMENTS),
       drop=st.integers(0, 12))
def test_fuzz_mutated_sql_compiles_or_raises_our_error(company, base, cut, insert, drop):
    cut = min(cut, len(base))
    _compile_or_refuse(company, base[:cut] + " " + insert + " " + base[cut + drop:])


def test_a_table_whose_privacy_unit_is_none_of_its_columns_is_refused_naming_the_unit():
    """The unit column is what bounds each person's contribution: a table registered with a unit it does not
    have is refused, never released with some other expression standing in for the unit."""
    df = pd.DataFrame({"uid": np.arange(50), "dept": ["a", "b"] * 25})
    sql = "SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS (epsilon = 1) dept, COUNT(*) AS n FROM E GROUP BY dept"
    with pytest.raises(dp.DPError, match='does not have a column named "person"'):
        run_sql(sql, {"E": Table(df, "person")}, epsilon=1.0)


def test_a_non_finite_number_is_refused_as_sql_naming_it():
    from dp_core.sql_text import literal

    for value, shown in ((float("inf"), "inf"), (float("-inf"), "-inf"), (float("nan"), "nan")):
        with pytest.raises(dp.DPError) as caught:
            literal(value)
        assert str(caught.value) == f"non-finite number {shown} in a query"


def test_a_text_value_with_quotes_is_one_sql_string_of_that_text():
    """sql_text.literal doubles each single quote: DuckDB reads back exactly the text given (a key value
    like O'Brien, or one that tries to close the string)."""
    import duckdb

    from dp_core.sql_text import literal

    for text in ("O'Brien", "''", "x' OR '1' = '1", "plain"):
        assert duckdb.sql(f"SELECT {literal(text)} AS v").fetchall() == [(text,)]


def test_every_kind_of_key_value_is_read_back_by_duckdb_as_itself():
    """sql_text.literal writes each value a key column can hold (NULL, booleans, integers past 2^53,
    doubles, text, dates, timestamps, times, UUIDs, bytes with a quote and a zero byte) so that DuckDB
    reads back exactly that value: the keys of public partitions, per-partition bounds and MAD's second
    round are written so."""
    import datetime as dt
    import uuid

    import duckdb

    from dp_core.sql_text import literal

    values = [None, True, False, 2**60 + 1, -7, 0.1, 1e300, "naïve 'x'", dt.date(2024, 2, 29),
              dt.datetime(2024, 2, 29, 13, 5, 7, 123456), dt.time(23, 59, 58, 1), uuid.UUID(int=2**100 + 5),
              b"\x00'\xff", np.int64(-3), np.float64(2.5)]
    for v in values:
        ((back,),) = duckdb.sql(f"SELECT {literal(v)} AS v").fetchall()
        expected = v.item() if isinstance(v, np.generic) else str(v) if isinstance(v, uuid.UUID) else v
        assert back == expected and type(back) is type(expected), (v, back)


@pytest.mark.parametrize("sql", [
    "SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS(epsilon=1, delta=1e-6, max_groups_contributed=1) secret AS _n_units, "
    "COUNT(*, contribution_bounds_per_group => (0, 1)) AS c FROM t GROUP BY secret",
    "SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS(epsilon=1, delta=1e-6, max_groups_contributed=1) _N_UNITS, "
    "COUNT(*, contribution_bounds_per_group => (0, 1)) AS c FROM (SELECT uid, secret AS _N_UNITS FROM t) GROUP BY _N_UNITS",
])
def test_a_group_key_named_like_the_plan_s_own_count_of_units_is_refused_and_releases_no_one_s_value(sql):
    """The bounding plan names its per-partition count of units `_n_units`, and private partition
    selection reads that column from the plan's rows. A group key the analyst named `_n_units`
    (DuckDB names are case-blind, so `_N_UNITS` too) came out under that name first, so selection read
    the key's value as the number of units: one person's value 1,000,000 was released as a partition
    of its own at epsilon 1 until 2026-11-25. Such names are refused before any data is read."""
    df = pd.DataFrame({"uid": [1, 2, 3], "secret": [1_000_000, 5, 7]})
    with pytest.raises(dp.InvalidQueryError, match="(?i)_n_units.*internal column"):
        run_sql(sql, {"t": Table(df, privacy_unit="uid")}, epsilon=1.0, delta=1e-6)


@pytest.mark.parametrize("name", ["_n_units", "_rk", "_w1", "_dropped_pairs", "_a0_raw", "_pid", "_Mad_R1"])
def test_a_typed_query_refuses_group_keys_and_units_named_like_the_plan_s_internal_columns(name):
    """The same refusal on the typed API, for every column name the bounding plan, the selections
    and MAD give their own columns (a clash lets the plan read the data's column for its own), on
    both the group keys and the privacy unit; a name that merely starts with "_" is accepted."""
    with pytest.raises(dp.InvalidQueryError, match="internal column"):
        dp.Query([dp.count(upper=1, name="n")], privacy_unit="uid", epsilon=1.0, group_by=(name,)).validate()
    with pytest.raises(dp.InvalidQueryError, match="internal column"):
        dp.Query([dp.count(upper=1, name="n")], privacy_unit=name, epsilon=1.0, group_by=("g",)).validate()
    dp.Query([dp.count(upper=1, name="n")], privacy_unit="_uid", epsilon=1.0, group_by=("_run",)).validate()


ADULT_COLUMNS = ["age", "workclass", "education", "education_num", "marital_status", "occupation", "relationship",
                 "race", "sex", "capital_gain", "capital_loss", "hours_per_week", "native_country", "income"]


def _one_letter_typos(name: str) -> list[str]:
    """A letter dropped, doubled, changed or two swapped: the typos a person makes in a column name."""
    i = len(name) // 2
    return [name[:i] + name[i + 1:], name[:i] + name[i] + name[i:], name[:i] + ("x" if name[i] != "x" else "y")
            + name[i + 1:], name[:i] + name[i + 1] + name[i] + name[i + 2:]]


@pytest.mark.parametrize("column", [c for c in ADULT_COLUMNS if len(c) >= 5])
def test_a_misspelt_column_is_answered_with_the_column_meant(column):
    """A typo in a column name (`educaton`) said 'a subquery may not refer to the columns of the query
    around it' of a query without a subquery; it now names the column meant, for every typo of one
    letter in any of Adult's column names of five letters or more."""
    frame = pd.DataFrame({"uid": [1, 2], **{c: [1, 2] for c in ADULT_COLUMNS}})
    tables = {"adult": Table(frame, privacy_unit="uid")}
    for typo in {t for t in _one_letter_typos(column) if t not in ADULT_COLUMNS}:
        with pytest.raises(dp.InvalidQueryError) as caught:
            run_sql(f"SELECT WITH ANONYMIZATION {typo}, ANON_COUNT(*, 1) AS n FROM adult GROUP BY {typo}", tables,
                    epsilon=1.0)
        assert str(caught.value).startswith(f"unknown column {typo!r}: did you mean {column!r}? (available: "), typo
        assert "subquery" not in str(caught.value)


@pytest.mark.parametrize("param, value", [("epsilon", v) for v in (0, -1, "abc", float("nan"), float("inf"), True,
                                                                    1e9, "1")]
                         + [("delta", v) for v in (-1e-6, "tiny", float("nan"), True, 0.5)])
def test_run_sql_refuses_a_bad_epsilon_or_delta_in_the_engine_s_words(param, value):
    """run_sql(epsilon="abc") said "the request's epsilon must be a number" where dp.Query (and a request
    file, and the CLI) say "epsilon must be a finite number > 0, got 'abc'": the same input, the same line."""
    frame = pd.DataFrame({"uid": range(40), "g": ["a", "b"] * 20})
    budget = {"epsilon": 1.0, "delta": 1e-6, param: value}
    with pytest.raises(dp.InvalidQueryError) as by_query:
        dp.execute(dp.Query([dp.count(upper=1)], privacy_unit="uid", group_by=("g",), **budget), frame)
    with pytest.raises(dp.InvalidQueryError) as by_sql:
        run_sql("SELECT WITH ANONYMIZATION g, ANON_COUNT(*, 1) AS n FROM t GROUP BY g",
                {"t": Table(frame, privacy_unit="uid")}, **budget)
    assert str(by_sql.value) == str(by_query.value)


QUOTED_NUMBERS = [  # (a statement with {} where a number literal goes, what the message calls it)
    ("SELECT WITH ANONYMIZATION g, ANON_AVG(age, {}, 90) AS a FROM t GROUP BY g", "ANON_AVG(...): the lower bound"),
    ("SELECT WITH ANONYMIZATION g, ANON_SUM(age, 0, {}) AS a FROM t GROUP BY g", "ANON_SUM(...): the upper bound"),
    ("SELECT WITH ANONYMIZATION g, ANON_COUNT(*, 1) AS n FROM t GROUP BY g LIMIT {}", "LIMIT"),
    ("SELECT WITH ANONYMIZATION g, ANON_COUNT(*, 1) AS n FROM t TABLESAMPLE SYSTEM ({} PERCENT) GROUP BY g",
     "the sample's percentage"),
    ("SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS (privacy_unit_column = uid) APPROX_QUANTILES(age, {}) FROM t",
     "the number of quantiles"),
]


@pytest.mark.parametrize("sql, what", QUOTED_NUMBERS, ids=[w for _, w in QUOTED_NUMBERS])
@pytest.mark.parametrize("written, fix", [("'5'", "write 5 without quotes"),
                                          ("'five'", "write a number, without quotes")])
def test_a_number_written_in_quotes_is_refused_with_the_fix(sql, what, written, fix):
    """A bound, LIMIT, sample percentage or quantile count written as text ('5') was refused without
    saying why a 5 is not a number here: the line now says to write it without quotes."""
    frame = pd.DataFrame({"uid": range(40), "g": ["a", "b"] * 20, "age": [30] * 40})
    with pytest.raises(dp.InvalidQueryError) as caught:
        run_sql(sql.format(written), {"t": Table(frame, privacy_unit="uid")}, epsilon=1.0)
    message = str(caught.value)
    assert what in message and f"must be a number literal, got the string {written}: {fix}" in message, message
