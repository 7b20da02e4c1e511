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


@pytest.mark.parametrize("data", [
    {"dataset": "adult", "sql": SQL, "epsilon": 0.5},
    {"dataset": "adult", "sql": SQL},
    {"dataset": "adult", "sql": SQL, "epsilon": {"pri": {"p": 30, "mode": "data"}}, "title": "t", "delta": 0.0},
    {"dataset": "adult", "sql": SQL, "epsilon": {"risk": {"trust": "low", "sensitivity": 0.7, "max_risk": 0.2,
                                                          "max_noise": "10%", "n": 4, "p": 0.95}}},
    {"dataset": "adult", "query": {"group_by": ["sex"], "aggregates": [{"kind": "count", "upper": 1}]},
     "epsilon": 1, "max_partitions_contributed": 2, "requested_by": "ana", "backend": "duckdb"},
], ids=["fixed", "no epsilon", "pri", "risk", "spec"])
def test_a_request_written_in_the_request_format_reads_back_as_itself(tmp_path, data):
    """What the inbox writes (to_spec) is a request file: `dprelease release` reads it back to the
    same request, whichever way epsilon is chosen (the store's record, to_json, is not one)."""
    import json

    request = parse_request(data)
    assert parse_request(request.to_spec()) == request
    path = tmp_path / "r.json"
    path.write_text(json.dumps(request.to_spec()))
    assert load_request(path) == request
    with pytest.raises(RequestError, match="unknown field"):
        parse_request(json.loads(request.to_json()))


def test_the_inbox_holds_request_files_named_by_id_found_by_any_unique_start(tmp_path):
    import json

    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from dprelease.prefixes import AmbiguousPrefix
    from dprelease.requests import inbox
    from dprelease.settings import Settings

    settings = Settings.from_env({"DPRELEASE_HOME": str(tmp_path)})
    asked = parse_request({"dataset": "adult", "sql": SQL, "epsilon": {"pri": {"p": 30}},
                           "requested_by": "someone@else"})
    key = Ed25519PrivateKey.generate()  # whose it is, is checked when a controller runs it (test_request_inbox.py)
    first = inbox.submit(settings, asked, "ana", key)
    assert first.request.requested_by == "ana"  # the submitter's name, whatever the file said
    assert load_request(first.path) == first.request  # a request file, as `dprelease release FILE` reads it
    assert inbox.find(settings, first.id) == first.path
    others = [inbox.submit(settings, asked, "bo", key) for _ in range(40)]
    ids = [first.id] + [o.id for o in others]
    for entry in [first, *others]:
        unique = next(entry.id[:n] for n in range(1, 13) if sum(i.startswith(entry.id[:n]) for i in ids) == 1)
        assert inbox.find(settings, unique) == entry.path
    shared = next(i[:1] for i in ids if sum(j.startswith(i[:1]) for j in ids) > 1)
    with pytest.raises(AmbiguousPrefix, match=f"'{shared}' is the start of .* inbox requests"):
        inbox.find(settings, shared)
    assert inbox.find(settings, "zz") is None and inbox.find(settings, "") is None
    assert sorted(w.id for w in inbox.waiting(settings)) == sorted(ids)
    with pytest.raises(RequestError, match="--as takes your name"):
        inbox.submit(settings, asked, " ", key)
    # a request submitted by an earlier version (the store's record) is still read as the request it was
    old = settings.inbox_dir / "0ld0ld0ld0ld.json"
    old.write_text(json.dumps({**json.loads(asked.to_json()), "requested_by": "cy"}))
    assert inbox.read(old) == parse_request({**asked.to_spec(), "requested_by": "cy"})
    inbox.mark_decided(settings, first.path)
    assert first.id not in [w.id for w in inbox.waiting(settings)] and not first.path.exists()
