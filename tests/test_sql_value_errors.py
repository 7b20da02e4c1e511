"""One person's value cannot make a DP SELECT fail (dp_core/no_value_errors.py, docs/sql.md "A value
the query cannot compute"; docs/engine.md "Data rules": group keys).

Until 2026-11-29 an expression that DuckDB cannot compute on one row's value (a cast that does not
parse, an overflow, a date, a regular expression or a JSON text that does not parse) failed the whole
query: an analyst who aimed it at one person (`CAST(CASE WHEN name = 'p7' AND age > 40 THEN 'x' ELSE
'1' END AS INTEGER)`) learned a fact about that person from whether the release failed, without noise
and without a controller's approval (the platform shows the release Failed, refunded). Here each such
expression, in each place a DP SELECT evaluates row-level expressions, is run on two neighbouring
datasets that differ by one person whose value the expression cannot compute: both must run."""

from __future__ import annotations

import re

import numpy as np
import pandas as pd
import pytest

from dp_core.sql import Table, run_sql

N = 200
TARGET = 7  # the person whose value the expression cannot compute
C = "COUNT(*, contribution_bounds_per_group => (0, 1))"
DP = "SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS (epsilon = 1, delta = 1e-6) "

#: (an expression of the text column v that DuckDB fails on, a value it computes, the target's value it fails on)
FAILING = [
    ("CAST(v AS INTEGER)", "1", "x"),  # Conversion Error
    ("CAST(CAST(v AS INTEGER) AS TINYINT)", "1", "200"),  # Conversion Error: out of the type's range
    ("CAST(v AS INTEGER) * 9223372036854775807", "1", "3"),  # Out of Range Error: overflow
    ("strptime(v, '%Y-%m-%d')", "2020-01-02", "x"),  # Invalid Input Error
    ("regexp_matches('a', v)", "a", "("),  # Invalid Input Error: a regular expression that does not parse
    ("json_extract(v, '$.a')", '{"a": 1}', "{"),  # Invalid Input Error: malformed JSON
    ("make_date(2000, CAST(v AS INTEGER), 1)", "1", "13"),  # Conversion Error: a date out of range
    ("CAST(v AS DATE)", "2020-01-02", "2020-13-01"),
    ("from_base64(v)", "YQ==", "!"),
    ("chr(CAST(v AS INTEGER))", "65", "-5"),
]

#: every place a DP SELECT evaluates a row-level expression, {e} the failing expression
PLACES = {
    "WHERE": DP + f"{C} AS n FROM people WHERE {{e}} IS NOT NULL",
    "GROUP BY key": DP + f"k, {C} AS n FROM (SELECT uid, {{e}} AS k FROM people) GROUP BY k",
    "GROUP BY expression": DP + f"{{e}} AS k, {C} AS n FROM people GROUP BY {{e}}",
    "aggregate argument": DP + "SUM(CASE WHEN {e} IS NULL THEN 0 ELSE 1 END, "
                               "contribution_bounds_per_group => (0, 1)) AS s FROM people",
    "join condition": DP + f"region, {C} AS n FROM people p JOIN depts d ON p.dept = d.dept AND {{e}} IS NOT NULL "
                           "GROUP BY region",
    "per-unit HAVING": DP + f"{C} AS n FROM (SELECT uid FROM people GROUP BY uid HAVING MAX({{e}}) IS NOT NULL)",
    "CTE": f"WITH c AS (SELECT uid, {{e}} AS k FROM people) {DP} {C} AS n FROM c WHERE k IS NOT NULL",
    "CASE aimed at one person": DP + f"{C} AS n FROM people "
                                     f"WHERE (CASE WHEN uid = {TARGET} THEN {{e}} END) IS NULL",
    # {m}: the expression over a per-unit aggregate's result (MAX(v)), where TRY cannot hold the aggregate
    "over a per-unit aggregate": DP + "SUM(CASE WHEN k IS NULL THEN 0 ELSE 1 END, contribution_bounds_per_group => "
                                      "(0, 1)) AS s FROM (SELECT uid, {m} AS k FROM people GROUP BY uid)",
    "per-unit HAVING over an aggregate": DP + f"{C} AS n FROM (SELECT uid FROM people GROUP BY uid "
                                              "HAVING {m} IS NOT NULL)",
}


def people_with(good: str, target: str | None) -> dict:
    """N people whose v is `good`, the target's `target`; None: the target is not in the data."""
    people = pd.DataFrame({"uid": np.arange(N), "dept": np.array(["a", "b"])[np.arange(N) % 2],
                           "v": np.array([good] * N, dtype=object)})
    if target is None:
        people = people[people["uid"] != TARGET]
    else:
        people.loc[people["uid"] == TARGET, "v"] = target
    return {"people": Table(people.reset_index(drop=True), "uid"),
            "depts": Table(pd.DataFrame({"dept": ["a", "b"], "region": ["N", "S"]}))}


def refused_alike(sql: str, error: type) -> str:
    """The one-line refusal of `sql` on the neighbour without the target, the same as on the one with her."""
    refusals = []
    for target in (None, "target"):
        with pytest.raises(error) as caught:
            run_sql(sql, people_with("other", target), epsilon=1.0)
        refusals.append(str(caught.value))
    assert refusals[0] == refusals[1] and "\n" not in refusals[0]
    return refusals[0]


@pytest.mark.parametrize("place", PLACES)
@pytest.mark.parametrize(("expression", "good", "bad"), FAILING, ids=[f[0] for f in FAILING])
def test_a_value_the_query_cannot_compute_does_not_fail_the_release(place, expression, good, bad):
    sql = PLACES[place].format(e=expression, m=re.sub(r"\bv\b", "MAX(v)", expression))
    without = run_sql(sql, people_with(good, None), epsilon=1.0)  # the neighbour without the target
    with_target = run_sql(sql, people_with(good, bad), epsilon=1.0)  # raised a DuckDB value error until the fix
    assert list(with_target.table.columns) == list(without.table.columns)


@pytest.mark.parametrize(("expression", "good", "bad"), FAILING, ids=[f[0] for f in FAILING])
def test_a_row_filter_the_target_fails_does_not_fail_the_release(expression, good, bad):
    """The engine's own row filter (Query.where, a release spec's `where`) likewise: a row whose value
    the filter cannot compute is filtered out."""
    import dp_core as dp

    query = dp.Query([dp.count(upper=1, name="n")], privacy_unit="uid", group_by=("dept",), epsilon=1.0, delta=1e-6,
                     where=f"{expression} IS NOT NULL", public_partitions=["a", "b"])
    for target in (None, bad):  # the neighbour without the target, then with it (raised until the fix)
        people = people_with(good, target)["people"].data
        assert list(dp.execute(query, people).table["dept"]) == ["a", "b"]


#: group keys a released table cannot hold, as one person's value (the others' is 2020-01-01)
UNHOLDABLE_KEYS = ["DATE 'infinity'", "DATE '-infinity'", "DATE '295000-01-01'", "DATE '-295000-01-01'",
                   "TIMESTAMP 'infinity'", "TIMESTAMPTZ 'infinity'", "TIMESTAMP_S '-infinity'", "TIMESTAMP_MS 'infinity'",
                   "TIMESTAMP_NS 'infinity'"]


@pytest.mark.parametrize("key", UNHOLDABLE_KEYS)
def test_a_date_key_no_table_can_hold_does_not_fail_the_release(key):
    """A DATE or TIMESTAMP key computed from one person's row that pandas cannot hold ('infinity', a
    date beyond +-292,000 years): reading the candidate partitions failed on it (a Conversion Error,
    or a NotImplementedError of pandas), before any selection; the row is now dropped (bounding.py)."""
    kind = key.split()[0]
    sql = DP + (f"k, {C} AS n FROM (SELECT uid, CASE WHEN v = 'target' THEN {key} ELSE {kind} '2020-01-01' END AS k "
                "FROM people) GROUP BY k")
    for target in (None, "target"):  # the neighbour without the target, then with it (failed until the fix)
        released = run_sql(sql, people_with("other", target), epsilon=1.0).table
        assert len(released) == 1 and str(released["k"].iloc[0]).startswith("2020-01-01")


#: key types no partition can be keyed by, with two values of each (one person's, everyone else's)
NESTED_KEYS = [("[1, 2]", "[1]"), ("[1, 2]::INTEGER[2]", "[1, 3]::INTEGER[2]"), ("{'x': 1}", "{'x': 2}"),
               ("MAP {'x': 1}", "MAP {'y': 2}"), ("TIMETZ '01:00+02'", "TIMETZ '01:00+03'"),
               ("1::UHUGEINT", "2::UHUGEINT")]


@pytest.mark.parametrize(("target_key", "other_key"), NESTED_KEYS, ids=[k[0] for k in NESTED_KEYS])
def test_a_key_type_no_partition_can_be_keyed_by_is_refused_whatever_the_values(target_key, other_key):
    """Grouping by a list, array, struct or map failed in pandas (ordering the partitions compares
    keys) only once the data held two distinct keys: one person's row decided whether the release
    failed. Now such a key type is refused by its type, the same way on both neighbours."""
    from dp_core import InvalidDataError

    sql = DP + (f"k, {C} AS n FROM (SELECT uid, CASE WHEN v = 'target' THEN {target_key} ELSE {other_key} END AS k "
                "FROM people) GROUP BY k")
    refusal = refused_alike(sql, InvalidDataError)
    assert "group-by key column 'k' has type" in refusal


#: per-unit sums over a type that can overflow: (the aggregate, the target's value, everyone else's)
OVERFLOWING_SUMS = [
    ("SUM", "170141183460469231731687303715884105727::HUGEINT", "1::HUGEINT"),
    ("AVG", "170141183460469231731687303715884105727::HUGEINT", "1::HUGEINT"),
    ("SUM", "99999999999999999999999999999999999999::DECIMAL(38, 0)", "1::DECIMAL(38, 0)"),
    ("AVG", "9999999999999999999::DECIMAL(19, 0) * 9999999999999999999", "1::DECIMAL(19, 0)"),
    ("SUM", "340282366920938463463374607431768211455::UHUGEINT", "1::UHUGEINT"),
    ("AVG", "INTERVAL 2000000000 MONTH", "INTERVAL 1 MONTH"),
    ("MEDIAN", "INTERVAL 2000000000 MONTH", "INTERVAL 1 DAY"),  # Conversion Error: months to microseconds
]


@pytest.mark.parametrize(("aggregate", "target_value", "other_value"), OVERFLOWING_SUMS,
                         ids=[f"{a} {t.split('::')[-1]}" for a, t, _ in OVERFLOWING_SUMS])
def test_a_per_unit_sum_that_can_overflow_is_refused_by_its_type(aggregate, target_value, other_value):
    """TRY cannot hold an aggregate: a per-unit SUM, AVG or MEDIAN over HUGEINT, UHUGEINT, a DECIMAL of
    more than 18 digits or an INTERVAL overflowed on the target's two rows and failed the release, and
    ran without her. Now it is refused by its argument's type, the same way on both neighbours."""
    from dp_core import InvalidQueryError

    doubled = "(SELECT uid, v FROM people UNION ALL SELECT uid, v FROM people)"  # two rows per person
    sql = DP + (f"{C} AS n FROM (SELECT uid, {aggregate}(CASE WHEN v = 'target' THEN {target_value} ELSE "
                f"{other_value} END) AS s FROM {doubled} GROUP BY uid) WHERE s IS NOT NULL")
    assert f"{aggregate} over " in refused_alike(sql, InvalidQueryError)


@pytest.mark.parametrize("aggregate", ["SUM", "AVG", "MEDIAN"])
@pytest.mark.parametrize("value", ["CAST(uid AS BIGINT)", "CAST(uid AS DOUBLE)", "CAST(uid AS DECIMAL(18, 2))",
                                   "CAST(uid AS UBIGINT)", "MAX(CAST(uid AS HUGEINT))"])
def test_a_per_unit_aggregate_that_cannot_overflow_runs(aggregate, value):
    """The types whose sums DuckDB keeps in HUGEINT or DOUBLE without overflow, and MIN / MAX over any
    type, run as before."""
    if value.startswith("MAX"):
        aggregate, value = "MAX", value[4:-1]
    sql = DP + (f"SUM(s, contribution_bounds_per_group => (0, 1000)) AS total FROM (SELECT uid, {aggregate}({value}) AS s "
                "FROM people GROUP BY uid)")
    assert len(run_sql(sql, people_with("other", None), epsilon=1.0).table) == 1


#: {f}: an expression of the released count n that DuckDB cannot compute (a cast of text that is no number)
FAILS_ON_RELEASED = "CAST('x' || CAST(n AS VARCHAR) AS INTEGER)"
INNER = DP + f"dept, {C} AS n FROM people GROUP BY dept"
#: every place post-processing computes over a released value
POST_PROCESSING = {
    "outer select list": f"SELECT {{f}} AS t FROM ({INNER})",
    "outer WHERE": f"SELECT dept FROM ({INNER}) WHERE {{f}} IS NULL",
    "outer ORDER BY": f"SELECT dept FROM ({INNER}) ORDER BY {{f}}",
    "ORDER BY of a UNION": f"SELECT dept, n FROM ({INNER}) UNION ALL SELECT 'z', 1 ORDER BY {{f}}",
    "outer window": f"SELECT SUM({{f}}) OVER () AS t FROM ({INNER})",
    "outer aggregate": f"SELECT SUM({{f}}) AS t FROM ({INNER})",
    "outer GROUP BY": f"SELECT {{f}} AS k, count(*) AS c FROM ({INNER}) GROUP BY {{f}}",
    "over an outer aggregate": f"SELECT CAST('x' || CAST(SUM(n) AS VARCHAR) AS INTEGER) AS t FROM ({INNER})",
    "DP SELECT list": DP + f"dept, CAST('x' || CAST({C} AS VARCHAR) AS INTEGER) AS t FROM people GROUP BY dept",
    "DP SELECT HAVING": DP + f"dept, {C} AS n FROM people GROUP BY dept HAVING {{f}} IS NULL",
}


@pytest.mark.parametrize("place", POST_PROCESSING)
def test_post_processing_cannot_fail_on_a_released_value(place):
    """Post-processing runs on the released (noisy) values: an expression that failed on one (a cast
    that failed once the noise pushed a count past 127) failed the release, refunded, so each run was
    a noisy sample the analyst saw for free, as often as asked (until 2026-11-29). Now it is NULL."""
    sql = POST_PROCESSING[place].format(f=FAILS_ON_RELEASED)
    people = people_with("other", None)
    people["people"].data["dept"] = "a"  # one group, which 199 people make sure is released
    released = run_sql(sql, people, epsilon=1.0).table  # raised until the fix
    expected = 0 if "WHERE" in place or "HAVING" in place else 2 if "UNION" in place else 1  # a condition is NULL
    assert len(released) == expected


GROUPED = f"(SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS (epsilon = 1) dept, {C} AS n FROM people GROUP BY dept) x"


@pytest.mark.parametrize(("clauses", "rows"), [
    ("GROUP BY dept ORDER BY dept", ["a", "b"]),
    ("GROUP BY dept ORDER BY dept DESC LIMIT 1", ["b"]),
    ("GROUP BY dept ORDER BY SUM(n) + 0 DESC, dept LIMIT 1 OFFSET 1", None),
    ("GROUP BY dept HAVING SUM(n) > 0 ORDER BY 1", ["a", "b"]),
    ("GROUP BY dept ORDER BY twice, dept", None),
])
def test_an_outer_query_computing_over_its_aggregates_keeps_its_order_and_limit(clauses, rows):
    """An outer query that computes with its aggregates' results (`SUM(n) * 2`) is run as two SELECTs
    so that TRY can hold the computation (no_value_errors._split); its ORDER BY (by name, position,
    key or aggregate), LIMIT and OFFSET apply after the computation, as written."""
    people = people_with("other", None)
    sql = f"SELECT dept, SUM(n) * 2 AS twice FROM {GROUPED} {clauses}"
    released = run_sql(sql, people, epsilon=1.0).table
    assert list(released.columns) == ["dept", "twice"]
    if rows is not None:
        assert list(released["dept"]) == rows
    assert len(released) == (1 if "LIMIT" in clauses else 2)


def test_an_outer_query_s_unnamed_columns_keep_the_names_duckdb_gives_them():
    """TRY around an unnamed expression of the outer query renames nothing a person reads: each column
    is named as DuckDB names the query as written."""
    import duckdb

    expressions = "dept, n * 2, upper(dept), CAST(n AS INTEGER), n + 1 > 3, coalesce(n, 0)"
    released = run_sql(f"SELECT {expressions} FROM ({INNER})", people_with("other", None), epsilon=1.0).table
    written = duckdb.connect().sql(f"SELECT {expressions} FROM (SELECT 'a' AS dept, 1 AS n)").columns
    assert list(released.columns) == written


#: joins as analysts write them: each must stay a hash join under the guards (never_failing), where
#: TRY(p.dept = d.dept) whole is no join key and DuckDB joined every pair of rows by a nested loop
HASH_JOINS = [
    "SELECT p.uid FROM people p JOIN depts d ON p.dept = d.dept",
    "SELECT p.uid FROM people p JOIN depts d ON (p.dept = d.dept)",
    "SELECT p.uid FROM people p JOIN depts d ON p.dept = d.dept AND CAST(p.v AS INTEGER) > 3",
    "SELECT p.uid FROM people p JOIN depts d ON lower(p.dept) = d.dept",
    "SELECT p.uid FROM people p LEFT JOIN depts d ON d.dept = p.dept AND d.region <> 'x'",
    "SELECT p.uid FROM people p JOIN people q ON p.uid = q.uid AND p.dept = q.dept",
]


@pytest.mark.parametrize("sql", HASH_JOINS)
def test_a_guarded_join_on_keys_stays_a_hash_join(sql):
    import duckdb
    import sqlglot

    from dp_core.no_value_errors import never_failing

    con = duckdb.connect()
    tables = people_with("1", "x")
    for name, table in tables.items():
        con.register(name, table.data)
    guarded = never_failing(sqlglot.parse_one(sql, read="duckdb")).sql("duckdb")
    plan = "\n".join(row[1] for row in con.execute("EXPLAIN " + guarded).fetchall())
    assert "Hash Join" in plan and "Nested Loop" not in plan and "Blockwise" not in plan, (guarded, plan)
    assert con.execute(guarded).fetchall() == con.execute(sql.replace("CAST(p.v AS INTEGER)", "TRY_CAST(p.v AS INTEGER)")).fetchall()


def test_a_join_comparing_a_text_with_a_number_is_refused_whatever_the_values():
    """DuckDB would convert the text row by row (failing on one person's 'x'): refused before any
    row is read, the same on both neighbours, saying how to cast."""
    sql = DP + f"region, {C} AS n FROM people p JOIN codes c ON p.v = c.code GROUP BY region"

    def tables(target):
        found = people_with("1", target)
        found["codes"] = Table(pd.DataFrame({"code": [1, 2], "region": ["N", "S"]}))
        return found
    from dp_core.errors import InvalidQueryError

    refusals = []
    for target in (None, "x"):
        with pytest.raises(InvalidQueryError) as caught:
            run_sql(sql, tables(target), epsilon=1.0)
        refusals.append(str(caught.value))
    assert refusals[0] == refusals[1]
    assert "compares a VARCHAR with a BIGINT" in refusals[0] and "CAST(... AS BIGINT)" in refusals[0], refusals[0]
    fixed = sql.replace("p.v = c.code", "CAST(p.v AS BIGINT) = c.code")
    for target in (None, "x"):
        assert run_sql(fixed, tables(target), epsilon=1.0) is not None


@pytest.mark.parametrize("join", ["JOIN codes c USING (v)", "NATURAL JOIN codes c"])
def test_a_join_by_name_comparing_a_text_with_a_number_is_refused_whatever_the_values(join):
    """USING and NATURAL convert the text row by row as ON does: refused alike on both neighbours."""
    from dp_core.errors import InvalidQueryError

    sql = DP + f"region, {C} AS n FROM people p {join} GROUP BY region"
    refusals = []
    for target in (None, "x"):
        tables = people_with("1", target)
        tables["codes"] = Table(pd.DataFrame({"v": [1, 2], "region": ["N", "S"]}))
        with pytest.raises(InvalidQueryError) as caught:
            run_sql(sql, tables, epsilon=1.0)
        refusals.append(str(caught.value))
    assert refusals[0] == refusals[1]
    assert "compares column v as a VARCHAR with a BIGINT" in refusals[0], refusals[0]
