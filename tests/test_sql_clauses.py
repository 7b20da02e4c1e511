"""Every clause of a DP SELECT is read or refused, grouping by the unit is refused however it is
written, and nothing reaches the analyst as DuckDB's raw binder error (issue 35, items 15 and 16;
docs/sql.md, "Clauses a DP SELECT refuses", "Grouping by the unit"): QUALIFY and the other clauses the
compiler does not compile are refused before anything runs, as are column patterns in a DP SELECT,
SELECT AS STRUCT read as rows, a name given to two relations of one FROM, and an aggregating subquery
grouped by the unit of an outer join's optional side or listing a column it does not group; a key
that is the unit by position, alias, parentheses, cast, copy or join equality, and a PUBLIC_GROUPS
join that lists unit ids, are refused naming the rule; what DuckDB still cannot bind is refused in the
project's words, quoting the statement."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

import dp_core as dp
from dp_core.sql import Table, compile_statement_for, run_sql

N = 300
DP = "SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS (epsilon = 1, privacy_unit_column = uid) "
PG = "SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS (epsilon = 1, group_selection_strategy = PUBLIC_GROUPS) "
C = "COUNT(*, contribution_bounds_per_group => (0, 1))"
RULE = "grouping by the privacy unit would publish one row per unit"


@pytest.fixture(scope="module")
def tables():
    rng = np.random.default_rng(5)  # test data only
    people = pd.DataFrame({"uid": np.arange(N), "dept": rng.choice(["a", "b", "c"], N), "age": rng.integers(20, 60, N)})
    visits = pd.DataFrame({"uid": np.arange(N // 2), "cost": rng.integers(0, 10, N // 2)})
    return {"people": Table(people, "uid"), "visits": Table(visits, "uid"),
            "depts": Table(pd.DataFrame({"dept": ["a", "b", "c"], "region": ["N", "S", "N"]})),
            "ids": Table(pd.DataFrame({"uid": np.arange(N), "id": np.arange(N)}))}  # a public list of unit ids


def refusal(tables, sql) -> str:
    with pytest.raises(dp.DPError) as caught:
        compile_statement_for(sql, tables, epsilon=1.0)
    message = str(caught.value)
    assert "\n" not in message and "Binder Error" not in message, message
    return message


CLAUSES = {  # a clause of a DP SELECT that would change which groups or rows are released -> words of its refusal
    "QUALIFY on a released value": (f"{DP} dept, {C} AS n FROM people GROUP BY dept QUALIFY n > 50",
                                    "QUALIFY in a DP SELECT is not supported: filter the released values with HAVING"),
    "QUALIFY on a key": (f"{DP} dept, {C} AS n FROM people GROUP BY dept QUALIFY dept = 'a'", "QUALIFY in a DP SELECT"),
    "QUALIFY with a window": (f"{DP} dept, {C} AS n FROM people GROUP BY dept QUALIFY row_number() OVER () = 1",
                              "QUALIFY in a DP SELECT"),
    "a named WINDOW": (f"{DP} dept, {C} AS n FROM people GROUP BY dept WINDOW w AS (PARTITION BY dept)",
                       "WINDOW in a DP SELECT is not supported"),
    "LIMIT p PERCENT": (f"{DP} dept, {C} AS n FROM people GROUP BY dept LIMIT 10%", "write LIMIT n"),
    "FETCH FIRST": (f"{DP} dept, {C} AS n FROM people GROUP BY dept ORDER BY n FETCH FIRST 1 ROWS ONLY",
                    "FETCH FIRST in a DP SELECT is not supported: write LIMIT n"),
    "GROUP BY ALL": (f"{DP} dept, {C} AS n FROM people GROUP BY ALL", "name each GROUP BY key"),
    "QUALIFY over protected rows in a subquery": (
        f"{DP} {C} AS n FROM (SELECT uid, dept FROM people QUALIFY age > 30) s", "QUALIFY inside a subquery over protected rows"),
    "GROUP BY ALL over protected rows in a subquery": (
        f"{DP} {C} AS n FROM (SELECT uid, max(age) AS a FROM people GROUP BY ALL) s", "group by the unit and named columns"),
}


@pytest.mark.parametrize("clause", list(CLAUSES))
def test_a_clause_the_dp_select_does_not_compile_is_refused_before_anything_runs(tables, clause):
    sql, words = CLAUSES[clause]
    assert words in refusal(tables, sql)


PATTERNS = [  # a column pattern anywhere in a DP SELECT (its list, an aggregate's input, WHERE, HAVING)
    f"{DP} COLUMNS('dept'), {C} AS n FROM people GROUP BY dept",
    f"{DP} COLUMNS('dept|age'), {C} AS n FROM people GROUP BY dept",
    f"{DP} SUM(COLUMNS('age|uid')) AS s FROM people",
    f"{DP} {C} AS n FROM people WHERE COLUMNS('age') > 30",
    f"{DP} dept, {C} AS n FROM people GROUP BY dept HAVING COLUMNS('n') > 1",
    f"{DP} *, {C} AS n FROM people GROUP BY dept",
    f"{DP} people.*, {C} AS n FROM people GROUP BY dept",
    f"{DP} * EXCLUDE (uid, age), {C} AS n FROM people GROUP BY dept",
    f"{DP} * LIKE 'd%', {C} AS n FROM people GROUP BY dept",
]


@pytest.mark.parametrize("sql", PATTERNS)
def test_a_column_pattern_in_a_dp_select_is_refused_naming_it(tables, sql):
    message = refusal(tables, sql)
    assert "in a DP SELECT" in message and ("name each column instead" in message or "instead of *" in message), message


STRUCT_ROWS = [  # SELECT AS STRUCT read as rows: one STRUCT column, not the columns it lists
    f"{DP} {C} AS n FROM (SELECT AS STRUCT uid, dept FROM people)",
    f"WITH c AS (SELECT AS STRUCT uid, dept FROM people) {DP} {C} AS n FROM c",
    f"{DP} {C} AS n FROM people JOIN (SELECT AS STRUCT dept FROM depts) d ON TRUE",
    f"{DP} {C} AS n FROM people WHERE dept IN (SELECT AS STRUCT dept FROM depts)",
    f"{DP} {C} AS n FROM (SELECT uid FROM people UNION ALL SELECT AS STRUCT uid FROM visits) s",
]


@pytest.mark.parametrize("sql", STRUCT_ROWS)
def test_select_as_struct_read_as_rows_is_refused_in_the_rule_s_words(tables, sql):
    assert "SELECT AS STRUCT read as rows is one STRUCT column per row" in refusal(tables, sql)


def test_select_as_struct_as_one_value_in_a_select_list_is_still_computed(tables):
    sql = f"{DP} {C} AS n, (SELECT AS STRUCT 'a' AS x, 1 AS y) AS s FROM people"
    assert run_sql(sql, tables, epsilon=1.0).table["s"].tolist() == [{"x": "a", "y": 1}]


DUPLICATE_ALIASES = [  # one name for two relations of a FROM clause, wherever the FROM is
    f"{DP} {C} AS n FROM people p JOIN depts p ON p.dept = p.dept",
    f"{DP} {C} AS n FROM people p JOIN visits p ON p.uid = p.uid",
    f"{DP} {C} AS n FROM people JOIN people USING (uid)",
    f"{DP} {C} AS n FROM people p JOIN (SELECT d.dept FROM depts d JOIN depts d ON TRUE) s ON p.dept = s.dept",
    f"{DP} {C} AS n FROM (SELECT p.uid FROM people p JOIN visits P USING (uid)) s",
]


@pytest.mark.parametrize("sql", DUPLICATE_ALIASES)
def test_a_name_given_to_two_relations_of_one_from_is_refused_with_its_remedy(tables, sql):
    message = refusal(tables, sql)
    assert "is given to two relations of one FROM clause" in message and "its own alias with AS" in message, message


GROUPED_SUBQUERIES = {  # an aggregating subquery over protected rows -> words of its refusal
    "grouped by the unit of a LEFT JOIN's optional side": (
        f"{DP} c, {C} AS n FROM (SELECT p.uid, COUNT(*) AS c FROM people p LEFT JOIN visits v ON p.uid = v.uid "
        "GROUP BY v.uid) s GROUP BY c", "group by the kept side's unit"),
    "grouped by the unit of a RIGHT JOIN's optional side": (
        f"{DP} {C} AS n FROM (SELECT v.uid, COUNT(*) AS c FROM people p RIGHT JOIN visits v ON p.uid = v.uid "
        "GROUP BY p.uid) s", "group by the kept side's unit"),
    "listing a unit it does not group by": (
        f"{DP} c, {C} AS n FROM (SELECT p.uid, COUNT(*) AS c FROM people p JOIN visits v ON p.uid = v.uid "
        "GROUP BY v.uid) s GROUP BY c", "'p.uid' is neither grouped nor aggregated"),
    "listing a column it does not group by": (
        f"{DP} {C} AS n FROM (SELECT uid, dept FROM people GROUP BY uid) s", "'dept' is neither grouped nor aggregated"),
    "a HAVING on a column it does not group by": (
        f"{DP} {C} AS n FROM (SELECT uid FROM people GROUP BY uid HAVING age > 3) s", "'age' is neither grouped"),
}


@pytest.mark.parametrize("case", list(GROUPED_SUBQUERIES))
def test_an_aggregating_subquery_over_protected_rows_is_refused_in_the_rule_s_words(tables, case):
    sql, words = GROUPED_SUBQUERIES[case]
    assert words in refusal(tables, sql)


def test_an_aggregating_subquery_grouped_by_the_unit_runs_with_the_unit_it_groups_by(tables):
    """Grouped by the joined table's unit of an inner join (the same unit on every row), the subquery
    carries that key as its unit: one row per person who visited."""
    sql = (f"{DP} {C} AS n FROM (SELECT COUNT(*) AS c FROM people p JOIN visits v ON p.uid = v.uid "
           "GROUP BY v.uid) s")
    assert abs(run_sql(sql, tables, epsilon=50.0).table["n"][0] - N // 2) < 20


CANNOT_BIND = [  # past every check, DuckDB still cannot compute the rows: the last guard's refusal
    f"{DP} {C} AS n FROM people\nWHERE dept + 1 > 0",
    f"{DP} {C} AS n FROM people GROUP BY lower(age)",
    f"{DP} {C} AS n FROM people p JOIN depts d ON p.dept = d.dept WHERE region - 1 > 0",
]


@pytest.mark.parametrize("sql", CANNOT_BIND)
def test_what_duckdb_cannot_bind_is_refused_quoting_the_statement_as_written(tables, sql):
    message = refusal(tables, sql)
    assert message.startswith("DP SELECT 1 is refused: the rows it reads cannot be computed ("), message
    assert f"(the statement as written: {' '.join(sql.split())!r})" in message, message


UNIT_KEYS = {  # how the key is the unit -> the DP SELECT (each grouped by it)
    "a position": f"{DP}uid, COUNT(*) AS n FROM people GROUP BY 1",
    "a position in parentheses": f"{DP}uid, COUNT(*) AS n FROM people GROUP BY (1)",
    "a position naming a parenthesized unit": f"{DP}(uid), COUNT(*) AS n FROM people GROUP BY 1",
    "a position naming a cast of the unit": f"{DP}CAST(uid AS VARCHAR) AS u, COUNT(*) AS n FROM people GROUP BY 1",
    "a select-list alias": f"{DP}p.uid AS u, COUNT(*) AS n FROM people p GROUP BY u",
    "parentheses": f"{DP}COUNT(*) AS n FROM people GROUP BY ((uid))",
    "a cast": f"{DP}COUNT(*) AS n FROM people GROUP BY uid::VARCHAR",
    "a TRY_CAST": f"{DP}COUNT(*) AS n FROM people GROUP BY TRY_CAST(uid AS BIGINT)",
    "a copy in a subquery": f"{DP}x, COUNT(*) AS n FROM (SELECT uid, uid AS x FROM people) s GROUP BY x",
    "a parenthesized copy in a subquery": f"{DP}x, COUNT(*) AS n FROM (SELECT uid, (uid) AS x FROM people) s GROUP BY x",
    "a cast copy in a CTE": f"WITH c AS (SELECT uid, CAST(uid AS VARCHAR) AS x FROM people) {DP} x, COUNT(*) AS n "
                            "FROM c GROUP BY x",
    "a copy through a *": f"{DP}x, COUNT(*) AS n FROM (SELECT * FROM (SELECT uid, uid AS x FROM people) a) b GROUP BY x",
    "a copy in one branch of a set operation": (
        f"{DP}x, COUNT(*) AS n FROM (SELECT uid, dept AS x FROM people UNION ALL "
        "SELECT uid, CAST(uid AS VARCHAR) FROM visits) s GROUP BY x"),
    "the other protected table's unit, inner-joined": (
        f"{DP}COUNT(*) AS n FROM people p JOIN visits v ON p.uid = v.uid GROUP BY v.uid"),
    "a public column joined on the unit": f"{DP}i.id AS k, COUNT(*) AS n FROM people p JOIN ids i ON p.uid = i.id GROUP BY k",
    "a public column joined on a cast of the unit": (
        f"{DP}COUNT(*) AS n FROM people p JOIN ids i ON CAST(p.uid AS BIGINT) = i.id GROUP BY i.id"),
    "a public column joined through another public column": (
        f"{DP}COUNT(*) AS n FROM people p JOIN ids i ON p.uid = i.uid JOIN ids j ON j.id = i.uid GROUP BY j.id"),
    "a public column USING the unit": f"{DP}i.uid AS k, COUNT(*) AS n FROM people p JOIN ids i USING (uid) GROUP BY k",
    "a public column NATURAL-joined on the unit": (
        f"{DP}COUNT(*) AS n FROM people p NATURAL JOIN (SELECT uid, id FROM ids) i GROUP BY i.uid"),
    "a public column a WHERE equates with the unit": (
        f"{DP}COUNT(*) AS n FROM people p, ids i WHERE p.uid = i.id AND p.age > 0 GROUP BY i.id"),
    "a public column joined on the unit in a subquery": (
        f"{DP}k, COUNT(*) AS n FROM (SELECT p.uid, i.id AS k FROM people p JOIN ids i ON p.uid = i.id) s GROUP BY k"),
    "the unit named over a public table, by position": (
        "SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS (epsilon = 1, privacy_unit_column = ids.uid) uid, COUNT(*) AS n "
        "FROM ids GROUP BY 1"),
    "the ANONYMIZATION syntax, by position": "SELECT WITH ANONYMIZATION uid, ANON_COUNT(*) AS n FROM people GROUP BY 1",
}


@pytest.mark.parametrize("how", list(UNIT_KEYS))
def test_grouping_by_the_unit_is_refused_however_the_key_spells_it(tables, how):
    with pytest.raises(dp.DPError) as caught:
        compile_statement_for(UNIT_KEYS[how], tables, epsilon=1.0)
    message = str(caught.value)
    assert message.startswith("GROUP BY ") and RULE in message and "\n" not in message, message


PUBLIC_UNIT_GROUPS = {  # a PUBLIC_GROUPS join that lists unit ids: every group one unit's, with no selection
    "RIGHT JOIN on the unit": f"{PG} id, COUNT(*) AS n FROM people RIGHT JOIN (SELECT DISTINCT id FROM ids) g "
                              "ON people.uid = g.id GROUP BY id",
    "RIGHT JOIN on an expression of the unit": f"{PG} id, COUNT(*) AS n FROM people RIGHT JOIN (SELECT DISTINCT id "
                                               "FROM ids) g ON people.uid + 0 = g.id GROUP BY id",
    "LEFT JOIN, the groups first": f"{PG} id, COUNT(*) AS n FROM (SELECT DISTINCT id FROM ids) g LEFT JOIN people "
                                   "ON g.id = CAST(people.uid AS BIGINT) GROUP BY id",
    "USING the unit": f"{PG} uid, COUNT(*) AS n FROM people RIGHT JOIN (SELECT DISTINCT uid FROM ids) USING (uid) "
                      "GROUP BY uid",
    "NATURAL on the unit": f"{PG} uid, COUNT(*) AS n FROM people NATURAL RIGHT JOIN (SELECT DISTINCT uid FROM ids) g "
                           "GROUP BY uid",
    "one subquery down": f"{PG} id, COUNT(*) AS n FROM (SELECT uid, id FROM people RIGHT JOIN (SELECT DISTINCT id FROM "
                         "ids) g ON people.uid = g.id - 0) s GROUP BY id",
}


@pytest.mark.parametrize("how", list(PUBLIC_UNIT_GROUPS))
def test_public_groups_that_list_unit_ids_are_refused_naming_the_rule(tables, how):
    with pytest.raises(dp.DPError) as caught:
        compile_statement_for(PUBLIC_UNIT_GROUPS[how], tables, epsilon=1.0)
    message = str(caught.value)
    assert ("grouping by the privacy unit is not allowed" in message or RULE in message) and "\n" not in message, message


ACCEPTED = {  # keys that are not the unit, beside the refusals above
    "a key computed from the unit (partition selection keeps groups many units share)":
        f"{DP}uid % 3 AS b, COUNT(*) AS n FROM people GROUP BY 1",
    "a position naming another column": f"{DP}dept, COUNT(*) AS n FROM people GROUP BY 1",
    "a public column joined on another column": f"{DP}region, COUNT(*) AS n FROM people p JOIN depts d "
                                                "ON p.dept = d.dept GROUP BY region",
    "public groups joined on another column": f"{PG} dept, COUNT(*) AS n FROM people RIGHT JOIN (SELECT DISTINCT dept "
                                              "FROM depts) USING (dept) GROUP BY dept",
    "a join on the unit beside a key of the other table": f"{DP}cost, COUNT(*) AS n FROM people p JOIN visits v "
                                                          "ON p.uid = v.uid GROUP BY cost",
}


@pytest.mark.parametrize("what", list(ACCEPTED))
def test_keys_that_are_not_the_unit_are_still_released(tables, what):
    result = run_sql(ACCEPTED[what], tables, epsilon=1.0)
    assert len(result.table.columns) >= 2
