"""Grouping by the privacy unit is refused however the key is written (issue 35, item 15; docs/sql.md,
"Grouping by the unit"): by position, alias, parentheses, a cast, a copy made in a subquery, CTE, set
operation or `*`, a column a join or WHERE equates with the unit, and a PUBLIC_GROUPS join that
lists unit ids. Keys merely computed from the unit stay accepted (partition selection keeps only
groups enough units share), and so do public groups joined on other columns."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

import dp_core as dp
from dp_core.sql import Table, compile_statement_for, run_sql

N = 300
DP = "SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS (epsilon = 1, privacy_unit_column = uid) "
PG = "SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS (epsilon = 1, group_selection_strategy = PUBLIC_GROUPS) "
RULE = "grouping by the privacy unit would publish one row per unit"


@pytest.fixture(scope="module")
def tables():
    rng = np.random.default_rng(5)  # test data only
    people = pd.DataFrame({"uid": np.arange(N), "dept": rng.choice(["a", "b", "c"], N), "age": rng.integers(20, 60, N)})
    visits = pd.DataFrame({"uid": np.arange(N // 2), "cost": rng.integers(0, 10, N // 2)})
    return {"people": Table(people, "uid"), "visits": Table(visits, "uid"),
            "depts": Table(pd.DataFrame({"dept": ["a", "b", "c"], "region": ["N", "S", "N"]})),
            "ids": Table(pd.DataFrame({"uid": np.arange(N), "id": np.arange(N)}))}  # a public list of unit ids


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
