"""Release requests and data checks: malformed requests are refused by field name."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from dp_core import InvalidQueryError
from dprelease import checks
from dprelease.requests import RequestError, load_request, parse_request, query_from_spec

SQL = "SELECT WITH ANONYMIZATION ANON_COUNT(*, 1) FROM adult"


@pytest.mark.parametrize("data,words", [
    ({"sql": SQL}, "registered dataset"),
    ({"dataset": "adult"}, "exactly one of `sql`"),
    ({"dataset": "adult", "sql": SQL, "query": {}}, "exactly one of `sql`"),
    ({"dataset": "adult", "sql": SQL, "epsilon": -1}, "epsilon must be a finite number > 0"),
    ({"dataset": "adult", "sql": SQL, "epsilon": "lots"}, "epsilon must be a finite number"),
    ({"dataset": "adult", "sql": SQL, "epsilon": {"magic": 1}}, "epsilon must be a number"),
    ({"dataset": "adult", "sql": SQL, "epsilon": {"risk": {"trust": "low"}}}, "epsilon.risk needs"),
    ({"dataset": "adult", "sql": SQL, "max_partitions_contributed": 0}, "max_partitions_contributed"),
    ({"dataset": "adult", "sql": SQL, "colour": "red"}, "unknown field(s) ['colour']"),
    ({"dataset": "adult", "query": {"aggregates": []}}, "non-empty list `aggregates`"),
    ({"dataset": "adult", "query": {"aggregates": [{"kind": "sum", "column": "x", "lower": 5, "upper": 1}]}}, "exceeds"),
])
def test_malformed_requests_are_refused_by_name(data, words):
    with pytest.raises(InvalidQueryError) as info:  # RequestError, or the engine's own check
        parse_request(data)
    assert words in str(info.value)


def test_request_modes_and_round_trip(tmp_path):
    r = parse_request({"dataset": "adult", "sql": SQL, "epsilon": {"pri": {"p": 30}}})
    assert r.epsilon_mode == "pri" and r.pri == {"p": 30, "mode": "public", "beta": 0.5}
    assert type(r).from_json(r.to_json()) == r
    spec = tmp_path / "r.yaml"
    spec.write_text("dataset: adult\nquery:\n  group_by: [sex]\n  aggregates:\n    - {kind: count, upper: 1, name: n}\nepsilon: 0.5\n")
    req = load_request(spec)
    q = query_from_spec(req.query, "person_id", req.epsilon)
    assert q.group_by == ("sex",) and q.aggregates[0].name == "n"
    bad = tmp_path / "bad.yaml"
    bad.write_text("dataset: [unclosed\n")
    with pytest.raises(RequestError, match="not valid YAML"):
        load_request(bad)


def test_default_checks_catch_null_units_infinities_and_unknown_categories():
    df = pd.DataFrame({"uid": [1, 2, 3, 4], "x": [1.0, 2.0, 3.0, 4.0], "c": ["a", "b", "a", "b"]})
    suite = checks.default_expectations(df, "uid")
    assert checks.validate(df, suite).success
    bad = df.assign(uid=[1, None, 3, 4], x=[1.0, np.inf, 3.0, 4.0], c=["a", "b", "zz", "b"])
    report = checks.validate(bad, suite)
    assert not report.success
    text = report.summary()
    assert "FAIL expect_column_values_to_not_be_null [uid]" in text
    assert "FAIL expect_column_values_to_be_between [x]" in text
    assert "FAIL expect_column_values_to_be_in_set [c]" in text
    renamed = df.rename(columns={"x": "y"})
    assert not checks.validate(renamed, suite).success
