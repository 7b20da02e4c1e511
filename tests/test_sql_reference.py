"""DP SQL v2, agreement with the reference (issue 16, second part): OPTIONS (group_selection_strategy =
PUBLIC_GROUPS), report formats, the reference's other accepted forms (docs/sql.md, "More of the
reference's syntax"), and public tables read by a statement. Each rule of docs/sql.md has its example
here; accepted PUBLIC_GROUPS statements run on data and are checked against the plain SQL answer
within the reported confidence interval."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

import dp_core as dp
from dp_core.sql import Table, compile_statement_for, run_sql

N = 3000
PG = "SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS (epsilon = {e}, group_selection_strategy = PUBLIC_GROUPS)"
C1 = "COUNT(*, contribution_bounds_per_group => (0, 1))"


@pytest.fixture(scope="module")
def tables():
    rng = np.random.default_rng(11)  # test data only
    people = pd.DataFrame({"uid": np.arange(N), "dept": rng.choice(["a", "b", "c", "x"], N),
                           "age": rng.integers(20, 60, N)})
    visits = pd.DataFrame({"uid": np.arange(N), "cost": rng.integers(0, 10, N)})
    depts = pd.DataFrame({"dept": ["a", "b", "c", "z"], "region": ["N", "S", "N", "S"]})  # z: nobody; x: not public
    ages = pd.DataFrame({"band": [2, 3, 4, 5]})
    return {"people": Table(people, "uid"), "visits": Table(visits, "uid"), "depts": Table(depts), "ages": Table(ages)}


def plain(tables, sql):
    import duckdb

    con = duckdb.connect()
    for name, t in tables.items():
        con.register(name, t.data)
    return con.sql(sql).df()


# ------------------------------------------------------------------ PUBLIC_GROUPS

PUBLIC_GROUPS_ACCEPTED = {  # docs/sql.md, "Public groups": DP statement, plain SQL over the public groups
    "RIGHT OUTER JOIN a SELECT DISTINCT of a public table, USING": (
        f"{PG.format(e=1)} dept, {C1} AS n FROM people RIGHT OUTER JOIN (SELECT DISTINCT dept FROM depts) "
        "USING (dept) GROUP BY dept",
        "SELECT d.dept, count(p.uid) AS n FROM (SELECT DISTINCT dept FROM depts) d LEFT JOIN people p USING (dept) "
        "GROUP BY d.dept"),
    "the public groups first, LEFT JOIN, ON": (
        f"{PG.format(e=1)} g.dept, SUM(age, contribution_bounds_per_group => (0, 60)) AS s FROM "
        "(SELECT DISTINCT dept FROM depts WHERE region = 'N') g LEFT JOIN people p ON p.dept = g.dept GROUP BY g.dept",
        "SELECT g.dept, coalesce(sum(age), 0) AS s FROM (SELECT DISTINCT dept FROM depts WHERE region = 'N') g "
        "LEFT JOIN people p ON p.dept = g.dept GROUP BY g.dept"),
    "two public-groups subqueries (every combination), a GROUP BY subquery as groups": (
        f"{PG.format(e=1)} dept, band, {C1} AS n FROM people "
        "RIGHT JOIN (SELECT DISTINCT dept FROM depts) USING (dept) "
        "RIGHT JOIN (SELECT band FROM ages GROUP BY band) b ON b.band = people.age // 10 GROUP BY dept, band",
        "SELECT d.dept, b.band, count(p.uid) AS n FROM (SELECT DISTINCT dept FROM depts) d CROSS JOIN ages b "
        "LEFT JOIN people p ON p.dept = d.dept AND p.age // 10 = b.band GROUP BY d.dept, b.band"),
    "the public groups join one subquery down, under plain columns": (
        f"{PG.format(e=1)} d2, {C1} AS n FROM (SELECT uid, dept AS d2 FROM people "
        "RIGHT OUTER JOIN (SELECT DISTINCT dept FROM depts) USING (dept)) GROUP BY d2",
        "SELECT d.dept AS d2, count(p.uid) AS n FROM (SELECT DISTINCT dept FROM depts) d LEFT JOIN people p "
        "USING (dept) GROUP BY d.dept"),
    "groups listed by a GROUP BY of an expression": (
        f"{PG.format(e=1)} decade, {C1} AS n FROM people "
        "RIGHT JOIN (SELECT band * 10 AS decade FROM ages GROUP BY band * 10) b ON b.decade = people.age // 10 * 10 "
        "GROUP BY decade",
        "SELECT b.decade, count(p.uid) AS n FROM (SELECT DISTINCT band * 10 AS decade FROM ages) b "
        "LEFT JOIN people p ON p.age // 10 * 10 = b.decade GROUP BY b.decade"),
    "groups listed by a GROUP BY naming the selected column qualified and in another case": (
        f"{PG.format(e=1)} dept, {C1} AS n FROM people "
        "RIGHT JOIN (SELECT DEPT FROM depts GROUP BY depts.dept) g USING (dept) GROUP BY dept",
        "SELECT d.dept, count(p.uid) AS n FROM (SELECT DISTINCT dept FROM depts) d LEFT JOIN people p USING (dept) "
        "GROUP BY d.dept"),
    "two public-groups subqueries with a column of the same name": (
        f"{PG.format(e=1)} b1.band AS tens, b2.band AS ones, {C1} AS n FROM people "
        "RIGHT JOIN (SELECT DISTINCT band FROM ages) b1 ON b1.band = people.age // 10 "
        "RIGHT JOIN (SELECT DISTINCT band FROM ages) b2 ON b2.band = people.age % 10 GROUP BY b1.band, b2.band",
        "SELECT b1.band AS tens, b2.band AS ones, count(p.uid) AS n FROM (SELECT DISTINCT band FROM ages) b1 "
        "CROSS JOIN (SELECT DISTINCT band FROM ages) b2 LEFT JOIN people p ON p.age // 10 = b1.band "
        "AND p.age % 10 = b2.band GROUP BY b1.band, b2.band"),
}


@pytest.mark.parametrize("rule", list(PUBLIC_GROUPS_ACCEPTED))
def test_public_groups_release_every_public_group_within_the_reported_interval(tables, rule):
    sql, reference = PUBLIC_GROUPS_ACCEPTED[rule]
    # intervals at confidence 1 - 1e-9 per value: a false failure over these few values is < 1e-7
    result = run_sql(sql, tables, confidence=1 - 1e-9)
    truth = plain(tables, reference)
    keys = [c for c in truth.columns if c not in ("n", "s")]
    value = "n" if "n" in truth.columns else "s"
    merged = truth.merge(result.table, on=keys, how="left", suffixes=("_true", ""))
    assert len(result.table) == len(truth) and merged[value].notna().all(), (result.table, truth)
    inside = (merged[f"{value}_ci_low"] <= merged[f"{value}_true"]) & (merged[f"{value}_true"] <= merged[f"{value}_ci_high"])
    assert inside.all(), merged
    assert "PUBLIC_GROUPS" in result.partition_selection and "no selection" in result.partition_selection


def test_public_groups_spend_no_selection_budget_and_list_the_empty_group(tables):
    sql = PUBLIC_GROUPS_ACCEPTED["RIGHT OUTER JOIN a SELECT DISTINCT of a public table, USING"][0]
    compiled = compile_statement_for(sql, tables)
    part = compiled.parts[0]
    assert part.public_groups_sql is not None and part.public_groups_tables == ("depts",)
    assert compiled.public_reads == ("depts",) and compiled.epsilon == 1.0
    result = run_sql(sql, tables)
    assert sorted(result.table["dept"]) == ["a", "b", "c", "z"]  # z: no rows, released; x: not public, not released
    assert [s.part for s in result.budget] == ["n"] and result.budget[0].epsilon == pytest.approx(1.0)
    assert result.epsilon_spent == pytest.approx(1.0)


def test_public_groups_with_delta_zero_are_released_under_pure_epsilon(tables):
    """OPTIONS (delta = 0) with PUBLIC_GROUPS: no groups are selected (they are read from public data), so
    no delta is needed; Laplace noise at epsilon 100 releases every public group, the empty one too, with
    its count (noise far below 0.5), and delta 0 is spent. Without public groups delta = 0 is refused."""
    sql = ("SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS (epsilon = 100, delta = 0, group_selection_strategy = "
           f"PUBLIC_GROUPS) dept, {C1} AS n FROM people RIGHT OUTER JOIN (SELECT DISTINCT dept FROM depts) "
           "USING (dept) GROUP BY dept ORDER BY dept")
    result = run_sql(sql, tables)
    exact = plain(tables, "SELECT d.dept, count(p.uid) AS n FROM (SELECT DISTINCT dept FROM depts) d "
                          "LEFT JOIN people p USING (dept) GROUP BY d.dept ORDER BY d.dept")
    assert result.table["dept"].tolist() == ["a", "b", "c", "z"]
    assert np.allclose(result.table["n"], exact["n"], atol=0.5)
    assert result.delta_spent == 0
    selected = (f"SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS (epsilon = 100, delta = 0) dept, {C1} AS n FROM people "
                "GROUP BY dept")
    with pytest.raises(dp.DPError, match="delta = 0 is impossible with private partitions"):
        compile_statement_for(selected, tables)


def test_public_groups_without_group_by_is_one_partition(tables):
    result = run_sql(f"{PG.format(e=1)} {C1} AS n FROM people", tables)
    assert len(result.table) == 1


PUBLIC_GROUPS_REFUSED = {
    "GROUP BY a column of the protected table": (
        f"{PG.format(e=1)} {C1} FROM people GROUP BY dept", "public-groups subquery"),
    "GROUP BY an expression of the public column": (
        f"{PG.format(e=1)} {C1} FROM people RIGHT JOIN (SELECT DISTINCT dept FROM depts) g USING (dept) "
        "GROUP BY dept || 'x'", "an expression is not such a column"),
    "the public groups read a protected table": (
        f"{PG.format(e=1)} {C1} FROM people RIGHT JOIN (SELECT DISTINCT dept FROM people) g USING (dept) GROUP BY dept",
        "does not join on the unit"),
    "a public table that is not a SELECT DISTINCT": (
        f"{PG.format(e=1)} dept, {C1} FROM people RIGHT JOIN depts USING (dept) GROUP BY dept", "RIGHT OUTER join"),
    "a UNION ALL of public rows as the groups (they may repeat)": (  # each repeat would count a unit's rows again
        f"{PG.format(e=1)} dept, {C1} FROM people RIGHT JOIN (SELECT dept FROM depts UNION ALL SELECT dept FROM depts) "
        "g USING (dept) GROUP BY dept", "the right table in a RIGHT OUTER join must contain user data"),
    "a FULL OUTER join with the public groups": (
        f"{PG.format(e=1)} {C1} FROM people FULL JOIN (SELECT DISTINCT dept FROM depts) g USING (dept) GROUP BY dept",
        "FULL OUTER"),
    "WHERE between the public groups join and the aggregation": (
        f"{PG.format(e=1)} dept, {C1} FROM people RIGHT JOIN (SELECT DISTINCT dept FROM depts) USING (dept) "
        "WHERE age > 30 GROUP BY dept", "does not allow WHERE"),
    "a join after the public groups join": (
        f"{PG.format(e=1)} dept, {C1} FROM people RIGHT JOIN (SELECT DISTINCT dept FROM depts) USING (dept) "
        "JOIN visits USING (uid) GROUP BY dept", "does not allow JOIN"),
    "a GROUP BY subquery that drops one of its keys (its rows repeat)": (
        f"{PG.format(e=1)} dept, {C1} FROM (SELECT dept FROM depts GROUP BY dept, region) g LEFT JOIN people "
        "USING (dept) GROUP BY dept", "LEFT OUTER join"),
    "a long join after the public groups join, quoted in its first 60 characters": (
        f"{PG.format(e=1)} dept, {C1} FROM people RIGHT JOIN (SELECT DISTINCT dept FROM depts) USING (dept) "
        "JOIN visits AS the_visits_of_every_person_who_enrolled_in_the_2026_study USING (uid) GROUP BY dept",
        "and the aggregation ('visits AS the_visits_of_every_person_who_enrolled_in_the_202'): join it inside"),
    "a join after public groups that come first and are LEFT JOINed to the protected rows": (
        f"{PG.format(e=1)} dept, {C1} FROM (SELECT DISTINCT dept FROM depts) g LEFT JOIN people USING (dept) "
        "JOIN visits USING (uid) GROUP BY dept",
        "OPTIONS group_selection_strategy = PUBLIC_GROUPS does not allow JOIN operations between the public groups "
        "join and the aggregation ('visits'): join it inside a subquery of the protected side instead"),
    "DISTINCT between the nested public groups join and the aggregation": (
        f"{PG.format(e=1)} dept, {C1} FROM (SELECT DISTINCT uid, dept FROM people "
        "RIGHT JOIN (SELECT DISTINCT dept FROM depts) USING (dept)) GROUP BY dept",
        "does not allow operations between the public groups join and the aggregation (distinct in "),
    "a computed column between the nested public groups join and the aggregation": (
        f"{PG.format(e=1)} dept, {C1} FROM (SELECT uid, dept, upper(dept) AS u FROM people "
        "RIGHT JOIN (SELECT DISTINCT dept FROM depts) USING (dept)) GROUP BY dept",  # whole: public_groups _nested 68
        "OPTIONS group_selection_strategy = PUBLIC_GROUPS does not allow operations between the public groups join and "
        "the aggregation (a computed column in 'SELECT uid, dept, UPPER(dept) AS u FROM people JOIN (SELECT '): select "
        "plain columns there, or join the public groups in the DP SELECT itself"),
    "OFFSET alone between the nested public groups join and the aggregation": (
        f"{PG.format(e=1)} dept, {C1} FROM (SELECT uid, dept FROM people RIGHT JOIN (SELECT DISTINCT dept FROM depts) "
        "USING (dept) OFFSET 5) GROUP BY dept",
        "OPTIONS group_selection_strategy = PUBLIC_GROUPS does not allow operations between the public groups join "
        "and the aggregation (offset in 'SELECT uid, dept FROM people JOIN (SELECT DISTINCT dept FROM'): select "
        "plain columns there, or join the public groups in the DP SELECT itself"),
    "a join after the nested public groups join": (
        f"{PG.format(e=1)} dept, {C1} FROM (SELECT uid, dept FROM people RIGHT JOIN (SELECT DISTINCT dept FROM depts) "
        "USING (dept)) s JOIN visits USING (uid) GROUP BY dept",
        "the right table in a RIGHT OUTER join must contain user data (a protected table)"),
    "an unknown strategy": ("SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS (group_selection_strategy = OTHER) COUNT(*) "
                            "FROM people", "must be LAPLACE_THRESHOLD or PUBLIC_GROUPS"),
    # the CTE has no dept (EXCLUDE): joined to people, DuckDB reads `dept` as the person's; listed alone, the
    # groups cannot be computed: refused before any budget is spent, with DuckDB's reason whole
    "public groups that DuckDB cannot list on their own": (
        f"WITH pd AS (SELECT * EXCLUDE (dept) FROM depts) {PG.format(e=1)} region, {C1} AS n FROM people "
        "RIGHT JOIN (SELECT DISTINCT region FROM pd WHERE dept = 'a') g ON g.region = people.dept GROUP BY region",
        'DP SELECT 1: its public groups (PUBLIC_GROUPS): Binder Error: Referenced column "dept" not found in FROM '
        "clause!"),
}


@pytest.mark.parametrize("rule", list(PUBLIC_GROUPS_REFUSED))
def test_public_groups_refusals_name_the_rule(tables, rule):
    sql, message = PUBLIC_GROUPS_REFUSED[rule]
    with pytest.raises(dp.DPError) as info:
        compile_statement_for(sql, tables, epsilon=1.0)
    assert message in str(info.value), str(info.value)


@pytest.mark.parametrize("sql", [
    f'{PG.format(e=100)} "my dept", {C1} AS n FROM people RIGHT JOIN (SELECT DISTINCT dept AS "my dept" FROM depts) g '
    'ON people.dept = g."my dept" GROUP BY "my dept"',
    f"WITH pd AS (SELECT * FROM depts WHERE region = 'N') {PG.format(e=100)} dept, {C1} AS n FROM people "
    "RIGHT JOIN (SELECT DISTINCT dept FROM pd) USING (dept) GROUP BY dept",
])
def test_public_groups_named_with_quotes_or_read_from_a_cte_are_each_released(tables, sql):
    """A public-groups key whose name needs quoting, and public groups selected from a CTE of the statement:
    every public group is released (an empty one too), with its count."""
    released = run_sql(sql, tables).table
    key = released.columns[0]
    exact = plain(tables, sql.split(" FROM people")[0].replace(PG.format(e=100), "SELECT").replace(
        C1, "COUNT(people.uid)") + " FROM people" + sql.split(" FROM people")[1])
    assert sorted(released[key]) == sorted(exact[key])
    merged = released.merge(exact, on=key, suffixes=("", "_exact"))
    assert np.allclose(merged["n"], merged["n_exact"], atol=1)


def test_a_group_key_of_a_using_join_between_protected_tables_is_refused_with_the_rule(tables):
    """GROUP BY a column two protected tables are joined USING (not one the public groups list): the
    one-line refusal of the rule, naming the column, whichever way the public groups are joined."""
    jobs = Table(pd.DataFrame({"uid": np.arange(100), "age": 30, "title": "x"}), "uid")
    with_jobs = {**tables, "jobs": jobs}
    for join in ("USING (dept)", "ON people.dept = g.dept"):
        sql = (f"{PG.format(e=1)} age, {C1} FROM people JOIN jobs USING (uid, age) RIGHT JOIN "
               f"(SELECT DISTINCT dept FROM depts) g {join} GROUP BY age")
        with pytest.raises(dp.DPError) as info:
            compile_statement_for(sql, with_jobs, epsilon=1.0)
        assert str(info.value) == (
            "GROUP BY age: OPTIONS group_selection_strategy = PUBLIC_GROUPS needs each GROUP BY column to be a "
            "column of a public-groups subquery: (SELECT DISTINCT cols FROM <public table>) outer-joined to the "
            "protected rows (RIGHT JOIN (SELECT DISTINCT ...) or (SELECT DISTINCT ...) LEFT JOIN ...); 'age' comes "
            "from another relation")


def test_public_groups_as_a_string_and_in_the_anonymization_syntax(tables):
    for sql in (
        'SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS (group_selection_strategy = "PUBLIC_GROUPS") dept, COUNT(*) '
        "FROM people RIGHT JOIN (SELECT DISTINCT dept FROM depts) USING (dept) GROUP BY dept",
        "SELECT WITH ANONYMIZATION OPTIONS (group_selection_strategy = PUBLIC_GROUPS, kappa = 1) dept, "
        "ANON_COUNT(* CLAMPED BETWEEN 0 AND 1) FROM (SELECT DISTINCT dept FROM depts) LEFT JOIN people USING (dept) "
        "GROUP BY dept",
    ):
        assert compile_statement_for(sql, tables, epsilon=1.0).parts[0].public_groups_sql is not None


# ------------------------------------------------------------------ report formats

@pytest.mark.parametrize("call", ['COUNT(*, report_format => "JSON")', "SUM(age, report_format => 'PROTO')",
                                  'AVG(age, contribution_bounds_per_group => (0, 90), report_format => "json")'])
def test_report_format_is_accepted_and_changes_nothing(tables, call):
    sql = f"SELECT WITH DIFFERENTIAL_PRIVACY {call} AS v FROM people"
    plain_call = call.split(", report_format")[0] + ")"
    with_format = compile_statement_for(sql, tables, epsilon=1.0).parts[0]
    without = compile_statement_for(sql.replace(call, plain_call), tables, epsilon=1.0).parts[0]
    assert with_format.query == without.query


@pytest.mark.parametrize("sql,message", [
    ('SELECT WITH DIFFERENTIAL_PRIVACY COUNT(*, report_format => "XML") FROM people', 'must be "JSON" or "PROTO"'),
    ("SELECT WITH DIFFERENTIAL_PRIVACY COUNT(*, report_format => 1) FROM people", 'must be "JSON" or "PROTO"'),
    ("SELECT WITH ANONYMIZATION ANON_COUNT(* WITH REPORT) FROM people", "WITH REPORT needs its format"),
    ("SELECT WITH ANONYMIZATION ANON_COUNT(* WITH REPORT(style = json)) FROM people", "unknown report option"),
    ('SELECT WITH ANONYMIZATION ANON_SUM(age, report_format => "JSON") FROM people', "belongs to WITH DIFFERENTIAL"),
    ("SELECT WITH DIFFERENTIAL_PRIVACY COUNT(* WITH REPORT(FORMAT = JSON)) FROM people", "belongs to WITH ANONYMIZATION"),
])
def test_bad_report_formats_are_refused(tables, sql, message):
    with pytest.raises(dp.DPError, match=message.replace("(", r"\(")):
        compile_statement_for(sql, tables, epsilon=1.0)


def test_with_report_in_the_anonymization_syntax(tables):
    sql = "SELECT WITH ANONYMIZATION ANON_SUM(age CLAMPED BETWEEN 0 AND 90 WITH REPORT(FORMAT = PROTO)) AS s FROM people"
    part = compile_statement_for(sql, tables, epsilon=1.0).parts[0]
    assert (part.query.aggregates[0].lower, part.query.aggregates[0].upper) == (0, 90)


# ------------------------------------------------------------------ more of the reference's syntax

DPS = "SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS (epsilon = 50, delta = 1e-6)"
MORE_ACCEPTED = {  # docs/sql.md, "More of the reference's syntax": DP statement, plain SQL, tolerance
    "COUNT bounds (L, U) with L > 0: each unit's count clamped to [L, U]": (
        f"{DPS} COUNT(*, contribution_bounds_per_group => (2, 5)) AS n FROM people",
        "SELECT 2 * count(DISTINCT uid) AS n FROM people", 20),  # one row per unit: each counts 2
    "a WITH clause inside a FROM subquery": (
        f"{DPS} {C1} AS n FROM (WITH young AS (SELECT uid FROM people WHERE age < 40) SELECT * FROM young) y",
        "SELECT count(*) AS n FROM people WHERE age < 40", 20),
    "a DP SELECT with its own WITH clause, as a subquery": (
        f"SELECT n FROM (WITH young AS (SELECT * FROM people WHERE age < 40) {DPS} {C1} AS n FROM young) r",
        "SELECT count(*) AS n FROM people WHERE age < 40", 20),
    "a parenthesized join first in FROM, and AND-ed unit terms in parentheses": (
        f"{DPS} {C1} AS n FROM (people p JOIN visits v ON (p.uid = v.uid AND (v.cost > 2 AND p.uid = v.uid))) "
        "JOIN depts d ON d.dept = p.dept",
        "SELECT count(*) AS n FROM people p JOIN visits v ON p.uid = v.uid AND v.cost > 2 JOIN depts d ON d.dept = p.dept",
        20),
    "columns that copy the unit (grouping by either is grouping by the unit)": (
        f"{DPS} {C1} AS n FROM (SELECT count(*) AS c, y FROM (SELECT uid AS x, uid AS y FROM people) GROUP BY y) t",
        "SELECT count(DISTINCT uid) AS n FROM people", 20),
    "max_rows_contributed (read as max_groups_contributed)": (
        "SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS (epsilon = 50, max_rows_contributed = 1) dept, "
        f"{C1} AS n FROM people GROUP BY dept ORDER BY dept",
        "SELECT dept, count(*) AS n FROM people GROUP BY dept ORDER BY dept", 20),
    "AS STRUCT after the DP clause (released as a table)": (
        f"SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS (epsilon = 50) AS STRUCT {C1} AS n FROM people",
        "SELECT count(*) AS n FROM people", 20),
    "an uncorrelated subquery over a public table in the DP SELECT list": (
        f"{DPS} dept, {C1} AS n, EXISTS (SELECT 1 FROM depts WHERE region = 'S') AS has_south FROM people "
        "GROUP BY dept ORDER BY dept",
        "SELECT dept, count(*) AS n, true AS has_south FROM people GROUP BY dept ORDER BY dept", 20),
    "a FROM-less SELECT's double-quoted names are strings (BigQuery)": (
        f'{DPS} {C1} AS n FROM people CROSS JOIN (SELECT "a" AS tag UNION ALL SELECT "b") t WHERE t.tag = \'a\'',
        "SELECT count(*) AS n FROM people", 20),
}


@pytest.mark.parametrize("rule", list(MORE_ACCEPTED))
def test_more_reference_syntax_runs_and_matches_the_plain_answer(tables, rule):
    sql, reference, tolerance = MORE_ACCEPTED[rule]
    result = run_sql(sql, tables, epsilon=50.0)
    truth = plain(tables, reference)
    got = result.table[list(truth.columns)]
    assert len(got) == len(truth)
    for col in truth.columns:
        if truth[col].dtype.kind in "if":
            # epsilon 50: a count's noise sd is < 0.1 (the COUNT-as-SUM with bound 5: < 0.3); 20 is > 60 sd
            assert np.allclose(got[col].astype(float), truth[col].astype(float), atol=tolerance), (got, truth)
        else:
            assert list(got[col]) == list(truth[col])


def test_approx_quantiles_is_the_array_of_its_quantiles(tables):
    sql = f"{DPS} APPROX_QUANTILES(age, 2, contribution_bounds_per_row => (20, 60)) AS q FROM people"
    result = run_sql(sql, tables)
    quantiles = list(result.table["q"][0])
    assert len(quantiles) == 3 and quantiles == sorted(quantiles) and 20 <= quantiles[0] and quantiles[-1] <= 60
    assert abs(quantiles[1] - 40) < 5  # ages uniform in [20, 60): the median is about 40
    compiled = compile_statement_for(sql, tables)
    assert [a.q for a in compiled.parts[0].query.aggregates] == [0.0, 0.5, 1.0]  # three shares of the budget
    anon = compile_statement_for("SELECT WITH ANONYMIZATION ANON_QUANTILES(age, 4 CLAMPED BETWEEN 20 AND 60) "
                                 "FROM people", tables, epsilon=1.0)
    assert len(anon.parts[0].query.aggregates) == 5


@pytest.mark.parametrize("sql,message", [
    (f"{DPS} APPROX_QUANTILES(age, 0) FROM people", "number of quantiles must be in"),
    (f"{DPS} APPROX_QUANTILES(age, 1000) FROM people", "number of quantiles must be in"),
    (f"{DPS} APPROX_QUANTILES(*, 4) FROM people", "only COUNT takes"),
    ("SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS (max_rows_contributed = 2, max_groups_contributed = 1) COUNT(*) "
     "FROM people", "at most one of max_groups_contributed"),
    (f"{DPS} COUNT(*, contribution_bounds_per_group => (0, 0)) FROM people", "let no unit count"),
    (f"{DPS} COUNT(*, contribution_bounds_per_group => (2, 5.5)) FROM people", "whole-number"),
    (f"{DPS} COUNT(*) FROM (SELECT p.uid FROM people p RIGHT JOIN visits v ON p.uid = v.uid) t",
     "is not the privacy unit"),  # the dropped side's unit may be NULL: not the row's unit
    (f"{DPS} {C1}, EXISTS (SELECT 1 FROM visits) AS x FROM people", "reads a protected table"),
    (f"{DPS} COUNT(*) FROM people p WHERE EXISTS (SELECT \"uid\" FROM depts)", "unknown column"),  # has a FROM
    (f"{DPS} COUNT(*) FROM people TABLESAMPLE RESERVOIR (10 ROWS)", "per-unit bound breaks"),
    (f"{DPS} COUNT(*) FROM people USING SAMPLE 10%", "USING SAMPLE is not supported"),  # was silently dropped
    # a join inside parentheses after another relation: its joins were read unchecked (visits paired
    # with every unit's rows was accepted); now refused, and the first-in-FROM form is flattened in place
    (f"{DPS} COUNT(*) FROM people JOIN ((SELECT DISTINCT dept FROM depts) CROSS JOIN visits) USING (dept)",
     "parenthesized join after another relation"),
    (f"{DPS} COUNT(*) FROM people, ((SELECT DISTINCT dept FROM depts) x CROSS JOIN visits)",
     "parenthesized join after another relation"),
    (f"{DPS} COUNT(*) FROM ((SELECT DISTINCT dept FROM depts) CROSS JOIN visits) JOIN people USING (dept)",
     "does not join on the unit"),
    # clauses hung on a parenthesized query or a table, outside the SELECT the rules check (were accepted)
    (f"{DPS} COUNT(*) FROM ((SELECT * FROM people) ORDER BY age LIMIT 3) x", "LIMIT, ORDER applied to protected rows"),
    (f"WITH c AS ((SELECT * FROM people) LIMIT 2) {DPS} COUNT(*) FROM c", "LIMIT applied to protected rows"),
    (f"{DPS} COUNT(*) FROM people PIVOT (sum(age) FOR dept IN ('a', 'b')) AS people", "PIVOT applied to protected"),
    ("SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS (privacy_unit_column = s) COUNT(*) FROM "
     "(SELECT (SELECT AS STRUCT 1 AS a) AS s, 'g' AS grp FROM depts) t", "STRUCT or an ARRAY"),
])
def test_more_reference_syntax_refusals(tables, sql, message):
    with pytest.raises(dp.DPError, match=message):
        compile_statement_for(sql, tables, epsilon=1.0)


def test_a_public_column_named_like_the_engine_s_marker_is_read_as_a_column(tables):
    """The engine marks each DP SELECT with a function `__dpmark_<n>()`; a public table's column of
    that name is only a column, read first in a plain SELECT or beside a DP SELECT's results (epsilon
    100: the counts' noise is far below 0.5)."""
    marked = {**tables, "codes": Table(pd.DataFrame({"__dpmark_0": ["a", "b"], "region": ["N", "S"]}))}
    plain_read = run_sql("SELECT __dpmark_0, region FROM codes ORDER BY 1", marked)
    assert plain_read.table.to_dict("list") == {"__dpmark_0": ["a", "b"], "region": ["N", "S"]}
    dp_select = (f"SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS (epsilon = 100, delta = 1e-6) dept, {C1} AS n "
                 "FROM people GROUP BY dept")
    joined = run_sql(f"SELECT c.__dpmark_0, n FROM codes c JOIN ({dp_select}) r ON r.dept = c.__dpmark_0 ORDER BY 1",
                     marked)
    counts = plain(tables, "SELECT dept, count(*) AS n FROM people WHERE dept IN ('a', 'b') GROUP BY dept "
                           "ORDER BY dept")
    assert joined.table["__dpmark_0"].tolist() == ["a", "b"]
    assert joined.table["n"].round().tolist() == counts["n"].astype(float).tolist()


def test_aggregates_after_one_with_a_report_are_read_as_written(tables):
    """WITH REPORT on one ANON_ aggregate: the aggregates after it in the list keep their own syntax
    (CLAMPED BETWEEN) and bounds."""
    sql = ("SELECT WITH ANONYMIZATION ANON_SUM(age CLAMPED BETWEEN 0 AND 90 WITH REPORT(FORMAT = JSON)) AS s, "
           "ANON_AVG(age CLAMPED BETWEEN 10 AND 80) AS m FROM people")
    part = compile_statement_for(sql, tables, epsilon=1.0).parts[0]
    assert [(a.kind, a.lower, a.upper) for a in part.query.aggregates] == [("sum", 0, 90), ("avg", 10, 80)]
