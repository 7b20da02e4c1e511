"""One delta rule (dp_core.input_checks.check_delta: 0 or from MIN_DELTA to MAX_DELTA = 1e-3) with
one message in the Python API, the SQL OPTIONS and request values, a statement's total, the
platform's requests (files and the release flow's form) and the dataset and series caps. A delta
near 1 released a group made of one person's single row."""

from __future__ import annotations

import math

import pandas as pd
import pytest
from test_store import sqlite_store  # noqa: F401 - the store fixture

import dp_core as dp
from dp_core.errors import InvalidQueryError
from dp_core.input_checks import MAX_DELTA, MIN_DELTA
from dp_core.sql import Table, run_sql
from dprelease.requests import RequestError, parse_request
from dprelease.store import series as store_series

REFUSED = (1.0000001e-3, 2e-3, 0.01, 0.5, 0.999999, 1.0, 1.5, 1e-101, 5e-324, -1e-9, math.inf, math.nan)
ACCEPTED = (0.0, MIN_DELTA, 1e-12, 1e-6, MAX_DELTA)

#: one person, one row: the group "a" exists only because of them
ONE_ROW = pd.DataFrame({"uid": [7], "g": ["a"]})


def _verdict(check) -> str | None:
    try:
        check()
    except (InvalidQueryError, ValueError) as err:
        return str(err)
    return None


def _sql(delta: float) -> str:
    return f"SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS (epsilon = 1, delta = {delta!r}) COUNT(*) AS n FROM t"


def test_the_rule_s_numbers():
    assert (MIN_DELTA, MAX_DELTA) == (1e-100, 1e-3)


@pytest.mark.parametrize("delta", REFUSED + ACCEPTED)
def test_the_api_sql_and_requests_give_one_verdict_in_one_line(delta):
    tables = {"t": Table(ONE_ROW, privacy_unit="uid")}
    verdicts = {
        "api": _verdict(lambda: dp.Query([dp.count()], privacy_unit="uid", epsilon=1.0, delta=delta).validate()),
        "sql options": _verdict(lambda: dp.sql.compile_statement_for(_sql(delta), tables)),
        "sql request": _verdict(lambda: dp.sql.compile_statement_for(
            "SELECT WITH DIFFERENTIAL_PRIVACY COUNT(*) AS n FROM t", tables, epsilon=1.0, delta=delta)),
        "request": _verdict(lambda: parse_request({"dataset": "d", "sql": "SELECT 1", "epsilon": 1, "delta": delta})),
    }
    if delta in ACCEPTED:
        assert set(verdicts.values()) == {None}, verdicts
        return
    assert None not in verdicts.values(), verdicts
    if not math.isfinite(delta):  # OPTIONS and request files refuse a non-number in their own words first
        return
    assert len(set(verdicts.values())) == 1, verdicts
    (message,) = set(verdicts.values())
    assert message and "\n" not in message
    if delta < 0:
        assert message.startswith("delta must be 0 or a number from 1e-100 to 0.001, got "), message
    elif delta > MAX_DELTA:
        assert message.startswith(f"delta = {delta:g} is above the maximum 0.001: delta is the chance that the "
                                   "guarantee fails outright"), message
    else:
        assert message.startswith(f"delta = {delta:g} is below the minimum 1e-100"), message


@pytest.mark.parametrize("delta", [0.999999, 0.5, 2e-3])
def test_a_group_of_one_person_s_single_row_is_never_released_at_a_delta_near_one(delta):
    """The issue's case, through the API, SQL OPTIONS and the request's delta: refused before the
    data is read (a release would publish the group with probability about delta)."""
    with pytest.raises(InvalidQueryError, match="is above the maximum 0.001"):
        dp.execute(dp.Query([dp.count()], privacy_unit="uid", group_by=("g",), epsilon=1.0, delta=delta), ONE_ROW)
    with pytest.raises(InvalidQueryError, match="is above the maximum 0.001"):
        run_sql(f"SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS (epsilon = 1, delta = {delta}) g, COUNT(*) AS n "
                "FROM t GROUP BY g", {"t": Table(ONE_ROW, privacy_unit="uid")})
    with pytest.raises(InvalidQueryError, match="is above the maximum 0.001"):
        run_sql("SELECT WITH DIFFERENTIAL_PRIVACY g, COUNT(*) AS n FROM t GROUP BY g",
                {"t": Table(ONE_ROW, privacy_unit="uid")}, epsilon=1.0, delta=delta)


def test_a_statement_s_total_delta_is_held_to_the_ceiling():
    """Two DP SELECTs of 8e-4 each are 1.6e-3 together: the statement's guarantee is their sum."""
    sql = ("WITH a AS (SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS (epsilon = 1, delta = 0.0008) g, COUNT(*) AS n FROM t "
           "GROUP BY g), b AS (SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS (epsilon = 1, delta = 0.0008) g, COUNT(*) "
           "AS m FROM t GROUP BY g) SELECT * FROM a JOIN b USING (g)")
    with pytest.raises(InvalidQueryError, match=r"^the statement's total delta \(summed over its DP SELECTs\) = "
                                                r"0.0016 is above the maximum 0.001"):
        dp.sql.compile_statement_for(sql, {"t": Table(ONE_ROW, privacy_unit="uid")})


@pytest.mark.parametrize("delta", REFUSED + ACCEPTED)
def test_dataset_and_series_caps_and_reservations_follow_the_same_rule(sqlite_store, delta):  # noqa: F811
    """A cap is the total delta a dataset (or a series) may ever spend: the same ceiling, the same words."""
    engine = _verdict(lambda: dp.Query([dp.count()], privacy_unit="uid", epsilon=1.0, delta=delta).validate())
    schema = {"uid": "int64"}
    cap = _verdict(lambda: sqlite_store.add_dataset("d", privacy_unit="uid", blob_path="-", fingerprint="-",
                                                    file_format="csv", schema=schema, epsilon_cap=1.0,
                                                    delta_cap=delta))
    assert cap == (None if engine is None else engine.replace("delta", "delta_cap", 1))
    series = _verdict(lambda: store_series.add_series(sqlite_store, "s", privacy_unit="uid", schema=schema,
                                                      budget_mode="series_cap", epsilon_cap=1.0, delta_cap=delta))
    assert series == (None if engine is None else engine.replace("delta", "the series delta", 1))
    if cap is None:
        return
    sqlite_store.add_dataset("ok", privacy_unit="uid", blob_path="-", fingerprint="-", file_format="csv",
                             schema=schema, epsilon_cap=1.0, delta_cap=MAX_DELTA)
    assert _verdict(lambda: sqlite_store.reserve("ok", "r1", 0.5, delta)) == engine


def test_the_examples_requests_keep_to_the_rule():
    from pathlib import Path

    from dprelease.requests import load_request

    for path in sorted((Path(__file__).parent.parent / "examples" / "requests").glob("*.yaml")):
        assert load_request(path).delta <= MAX_DELTA, path


def test_request_errors_are_the_engine_s():
    with pytest.raises(RequestError, match="is above the maximum 0.001"):
        parse_request({"dataset": "d", "sql": "SELECT 1", "epsilon": 1, "delta": 0.5})
