"""How epsilon is chosen, as one typed choice: the run form shows one selector with only the chosen
method's fields, and the form, the Python API and a request file (the CLI) give the same verdicts."""

from __future__ import annotations

import pytest

from dprelease.requests import RequestError, parse_request
from dprelease.requests.epsilon import FixedEpsilon, PriEpsilon, RiskEpsilon, to_parameter

SQL = "SELECT WITH ANONYMIZATION ANON_COUNT(*, 1) AS n FROM adult"
RISK = {"trust": "low", "sensitivity": "high", "max_risk": 0.2, "max_noise": 10, "n": 16}


def test_the_form_offers_one_choice_with_only_its_fields():
    from dprelease.flows.release import release_flow

    schema = release_flow.parameters.model_dump()
    props = schema["properties"]
    assert not {"pri_p", "pri_mode", "pri_beta", "risk", "auto_approve_policy", "poll_interval"} & set(props)
    assert "epsilon" in schema["required"]  # nothing pre-filled: the controller picks a method
    choice = props["epsilon"]
    # anyOf (not oneOf): both Prefect UIs render it as one selector of the options' titles
    assert [option["$ref"].rsplit("/", 1)[1] for option in choice["anyOf"]] == ["FixedEpsilon", "PriEpsilon",
                                                                                 "RiskEpsilon"]
    defs = schema["definitions"]
    assert [defs[n]["title"] for n in ("FixedEpsilon", "PriEpsilon", "RiskEpsilon")] == [
        "Fixed value", "Privacy risk indicator (PRI)", "Risk model"]
    assert set(defs["FixedEpsilon"]["properties"]) == {"epsilon"}
    assert set(defs["PriEpsilon"]["properties"]) == {"p", "mode", "beta"} and defs["PriEpsilon"]["required"] == ["p"]
    assert {"trust", "sensitivity", "max_risk", "max_noise", "n", "m", "confidence"} <= set(defs["RiskEpsilon"]["properties"])
    assert set(defs["RiskEpsilon"]["required"]) == {"max_noise", "n"}  # the rest: defaults, the dataset's profile
    assert {defs["RiskEpsilon"]["properties"][f]["default"] for f in ("trust", "sensitivity", "max_risk")} == {
        "registered"}
    for name in ("FixedEpsilon", "PriEpsilon", "RiskEpsilon"):  # every field says what it is
        assert defs[name]["additionalProperties"] is False
        assert all(p.get("description") for p in defs[name]["properties"].values()), name
    assert all(p.get("description") for p in props.values())


#: what a user might send, in the request format or as the form's value; (input, accepted mode or None)
CASES = [
    (1.0, "fixed"), (2, "fixed"), (-1, None), (0, None), (1000.0, None), ("lots", None), ("1.5", None), (True, None),
    ({"magic": 1}, None), ({}, None), ({"pri": {"p": 30}}, "pri"), ({"pri": {}}, "pri"), ({"pri": {"p": "x"}}, None),
    ({"pri": {"mode": "foo"}}, None), ({"pri": {"p": 50, "colour": 1}}, None), ({"risk": {"trust": "low"}}, None),
    ({"risk": RISK}, "risk"), ({"risk": {**RISK, "p": 0.8, "m": 2}}, "risk"), ({"risk": {**RISK, "n": 2.5}}, None),
    ({"risk": {**RISK, "trust": "lowish"}}, None), ({"risk": {**RISK, "max_noise": "10%"}}, "risk"),
    ({"risk": {**RISK, "max_noise": {"n": 5}}}, "risk"), ({"risk": {**RISK, "confidence": 0.8}}, None),
    ({"epsilon": 0.5}, "fixed"), ({"epsilon": 0.5, "p": 3}, None), ({"p": 40, "mode": "public", "beta": 0.5}, "pri"),
    ({"p": 40, "mode": "data"}, "pri"), ({"mode": "public"}, None), ({**RISK, "confidence": 0.8}, "risk"), ({**RISK, "p": 0.8}, None),
]


def _request_verdict(epsilon):
    try:
        return parse_request({"dataset": "adult", "sql": SQL, "epsilon": epsilon})
    except RequestError as err:
        return err


def _flow_verdict(epsilon):
    """What the flow makes of the same value: Prefect's parameter validation (the form's and the
    Python API's first check), then the request it builds, judged by parse_request."""
    from prefect.exceptions import ParameterTypeError

    from dprelease.flows.release import release_flow, request_fields

    try:
        params = release_flow.validate_parameters({"dataset": "adult", "sql": SQL, "epsilon": epsilon})
    except ParameterTypeError as err:
        return err
    try:
        return parse_request(request_fields("adult", SQL, None, "", epsilon=params["epsilon"], delta=1e-6, cu=1, requested_by=None))
    except RequestError as err:
        return err


@pytest.mark.parametrize("epsilon,mode", CASES)
def test_the_form_the_api_and_a_request_file_give_the_same_verdict(epsilon, mode):
    by_file, by_flow = _request_verdict(epsilon), _flow_verdict(epsilon)
    if mode is None:
        assert isinstance(by_file, Exception) and isinstance(by_flow, Exception), (by_file, by_flow)
        assert str(by_file).split(": ")[-1] in str(by_flow)  # the same reason, in one line
    else:
        assert not isinstance(by_file, Exception), by_file
        assert by_file == by_flow and by_file.epsilon_mode == mode
        # and a parsed request goes back to the flow unchanged (the CLI and the scheduled flow)
        assert _flow_verdict(to_parameter(by_file)) == by_file


def test_refusals_name_the_method_and_the_field():
    with pytest.raises(RequestError, match=r"^epsilon\.risk \(Risk model\): n: Input should be a valid integer$"):
        parse_request({"dataset": "adult", "sql": SQL, "epsilon": {"risk": {**RISK, "n": 2.5}}})
    with pytest.raises(RequestError, match=r"epsilon\.pri: unknown field\(s\) \['colour'\]"):
        parse_request({"dataset": "adult", "sql": SQL, "epsilon": {"pri": {"colour": 1}}})
    with pytest.raises(RequestError, match=r"epsilon must be a finite number > 0, got -1$"):
        parse_request({"dataset": "adult", "sql": SQL, "epsilon": -1})


def test_models_convert_to_the_request_format():
    assert FixedEpsilon(epsilon=0.5).to_spec() == 0.5
    assert PriEpsilon(p=30).to_spec() == {"pri": {"p": 30.0, "mode": "public", "beta": 0.5}}
    risk = RiskEpsilon(**RISK, confidence=0.8).to_spec()["risk"]
    assert risk["p"] == 0.8 and "confidence" not in risk and "headline" not in risk
