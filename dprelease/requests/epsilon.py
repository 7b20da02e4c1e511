"""How epsilon is chosen, as one typed choice: a fixed value, the privacy risk indicator (PRI), or the
risk model, each with only its own fields.

The release flow's `epsilon` parameter is this choice, so the Prefect run form shows one selector
(Fixed value | Privacy risk indicator | Risk model) and below it only the chosen method's fields.
The request format (`epsilon: 1.0`, `epsilon: {pri: {...}}`, `epsilon: {risk: {...}}`) is checked
by the same models (`parse_spec`), so a request file, the CLI, the Python API and the form accept and
refuse the same values. Plain numbers and the request format are accepted wherever the choice is
(`epsilon=1.0` stays a fixed epsilon).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, model_validator

from dp_core.errors import InvalidQueryError

#: a risk-model field left to the dataset: its registered risk profile (`dprelease dataset register
#: --trust/--sensitivity/--max-risk`) gives the value when the release is planned (pipeline.risk_fields)
REGISTERED = "registered"
#: the level names of the risk model (dp_core.risk.LEVELS), offered as a list in the form after
#: `registered`, the form's default
Level = Literal["registered", "very low", "low", "medium", "high", "very high"]
LevelOrNumber = Annotated[Level, Field(title="level")] | Annotated[float, Field(title="number in [0, 1]")]


class _Choice(BaseModel):
    # strict: a string is never read as a number, as in a request file; unknown fields are refused
    model_config = ConfigDict(strict=True, extra="forbid")


class FixedEpsilon(_Choice):
    """Spend exactly this epsilon."""

    model_config = ConfigDict(title="Fixed value")
    epsilon: float = Field(description="the total epsilon of the release: a number > 0 (typically 0.1 to 10)")

    def to_spec(self):
        return self.epsilon


class PriEpsilon(_Choice):
    """Let the platform choose epsilon from the privacy risk indicator (docs/privacy.md)."""

    model_config = ConfigDict(title="Privacy risk indicator (PRI)")
    p: float = Field(description="the share p (percent, 0 to 100) of people whose privacy risk indicator must "
                     "fall below its threshold (50: half of them)")
    mode: Literal["public", "data"] = Field("public", description="public: chosen without reading the data "
                                            "(the guarantee holds end to end); data: reads the data (a query spec only)")
    beta: float = Field(0.5, description="public mode: the quantile of the simulated chance that the search stops "
                        "(0.5: the median)")

    def to_spec(self):
        return {"pri": self.model_dump()}


class GroupsNeed(_Choice):
    """The partition selection's need: a group of `units` people released with probability >= `probability`."""

    model_config = ConfigDict(title="Groups to release")
    units: int = Field(description="a group of this many people (each in at most C_u groups) ...")
    probability: float | None = Field(None, description="... is released with at least this probability "
                                      "(default: the confidence)")

    @model_validator(mode="after")
    def _the_engine_s_rule(self):
        """The engine's own check (dp_core.split.GroupNeed), so a request and the API refuse alike."""
        from dp_core.split import GroupNeed

        try:
            GroupNeed(self.units, 0.5 if self.probability is None else self.probability).check()
        except InvalidQueryError as err:
            raise ValueError(str(err)) from None
        return self


class RiskEpsilon(_Choice):
    """Let the platform choose epsilon from the risk model: your trust in the recipient, the data's
    sensitivity, the tolerable risk and the tolerable noise (docs/privacy.md section 2)."""

    model_config = ConfigDict(title="Risk model")
    trust: LevelOrNumber = Field(REGISTERED, description="your trust in the recipient (registered: the dataset's "
                                 "risk profile)")
    sensitivity: LevelOrNumber = Field(REGISTERED, description="how sensitive the data is (registered: the dataset's "
                                       "risk profile)")
    max_risk: LevelOrNumber = Field(REGISTERED, description="the tolerable risk, e.g. 0.2 (registered: the dataset's "
                                    "risk profile)")
    max_noise: float | str | dict[str, float | str] = Field(
        description="the tolerable half-width of the headline statistic's interval: a number, a percentage of "
        "reference_value (\"10%\"), or a mapping statistic -> tolerance")
    n: int = Field(ge=2, description="how many values the attacker's target (one person's sensitive value) can take "
                   "(>= 2)")
    m: int = Field(1, ge=1, description="1: the attacker learns whether a person is in the data; 2: a person's value")
    confidence: float = Field(0.9, description="the confidence of the intervals (0.9: 90%)")
    prefer: Literal["privacy", "accuracy"] = Field(
        "privacy", description="privacy: the smallest epsilon that meets the noise; accuracy: the largest within the risk")
    headline: str | None = Field(None, description="the statistic a single max_noise applies to "
                                 "(default: the first count, sum or average)")
    reference_value: float = Field(100.0, gt=0, allow_inf_nan=False,
                                   description="what a percentage max_noise is a percentage of")
    reference_count: float | None = Field(None, description="the group size an average's promise is stated for "
                                          "(default: reference_value)")
    split: Literal["equal", "need"] = Field(
        "equal", description="equal: every part (the selection, each statistic) gets the same share; need: each gets "
        "what its tolerance needs, for the smallest total epsilon (dp_core/split.py)")
    groups: GroupsNeed | None = Field(None, description="the selection's need: {units: N, probability: p}")

    def to_spec(self):
        risk = self.model_dump(exclude_none=True)
        risk["p"] = risk.pop("confidence")
        return {"risk": risk}


#: which model each method name is
METHODS = {"fixed": FixedEpsilon, "pri": PriEpsilon, "risk": RiskEpsilon}
#: the request format's name for a form field (the risk model's confidence is `p` in a request file)
SPEC_NAMES = {"risk": {"confidence": "p"}}


def _method(value) -> str | None:
    """The method a value is (the form's selector): by its model, or by the fields it holds."""
    if isinstance(value, BaseModel):
        return next((name for name, model in METHODS.items() if isinstance(value, model)), None)
    if not isinstance(value, dict):
        return None
    keys = set(value)
    if "epsilon" in keys:
        return "fixed"
    if keys & (set(RiskEpsilon.model_fields) - {"confidence"}):
        return "risk"
    return "pri"


def as_choice(value):
    """Any accepted form of the choice as its model: a model, the form's value (a mapping of one
    method's fields), a number (a fixed epsilon) or the request format ({pri: {...}}, {risk: {...}}).
    ValueError names the method and each wrong field, in one line."""
    if isinstance(value, _Choice):
        return value
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        value, where = {"epsilon": value}, "epsilon"
    elif isinstance(value, dict) and len(value) == 1 and next(iter(value)) in ("pri", "risk"):
        (method, fields), = value.items()
        where = f"epsilon.{method}"
        if not isinstance(fields, dict):
            raise ValueError(NOT_A_CHOICE)
        if method == "risk":
            missing = {"max_noise", "n"} - set(fields)  # trust, sensitivity, max_risk: the dataset's profile
            if missing:
                raise ValueError(f"epsilon.risk needs {sorted(missing)}")
        allowed = {SPEC_NAMES.get(method, {}).get(k, k) for k in METHODS[method].model_fields}
        unknown = set(fields) - allowed
        if unknown:
            raise ValueError(f"{where}: unknown field(s) {sorted(unknown)} (allowed: {sorted(allowed)})")
        renamed = {v: k for k, v in SPEC_NAMES.get(method, {}).items()}
        value = {renamed.get(k, k): v for k, v in fields.items()}
        if method == "pri":  # a request file's default; the form asks for p
            value = {"p": 50, **value}
        return _validate(METHODS[method], value, where)
    elif isinstance(value, dict) and value and set(value) <= ALL_FIELDS:
        where = "epsilon"
    elif isinstance(value, dict):
        raise ValueError(NOT_A_CHOICE)
    else:
        raise ValueError(f"epsilon must be a finite number > 0, got {value!r}")
    return _validate(METHODS[_method(value)], value, where)


def _validate(model, value: dict, where: str):
    try:
        return model.model_validate(value)
    except ValidationError as err:
        raise ValueError(f"{where} ({model.model_config['title']}): {describe(err)}") from None


#: every field of any method
ALL_FIELDS = frozenset().union(*(m.model_fields for m in METHODS.values()))
NOT_A_CHOICE = "epsilon must be a number, {pri: {p: ...}} or {risk: {trust: ..., ...}}"

#: the release flow's `epsilon` parameter: one choice, only its fields. A plain union (JSON schema
#: anyOf: both Prefect UIs show it as one selector of the three titles); `as_choice` picks the
#: member by the fields given, so the errors are those of the chosen method only
EpsilonChoice = Annotated[
    FixedEpsilon | PriEpsilon | RiskEpsilon,
    BeforeValidator(as_choice),
    Field(description="How epsilon is chosen: a fixed value, from the privacy risk indicator (PRI), or from the risk "
          "model. Pick one; only its fields apply."),
]


def parse_spec(value, error) -> tuple[str, float | None, dict, dict]:
    """A request's `epsilon` (a number, {pri: {...}}, {risk: {...}} or a form choice) checked by the
    form's models: (mode, fixed epsilon, pri fields, risk fields) in the request format. `error` is
    the exception class raised with the one-line message. The fixed number's range is the
    engine's rule (checked by the caller), as for every epsilon."""
    try:
        return from_choice(as_choice(value))
    except ValueError as err:
        raise error(str(err)) from None


def from_choice(choice) -> tuple[str, float | None, dict, dict]:
    """(mode, fixed epsilon, pri fields, risk fields) of a validated choice, in the request format."""
    spec = choice.to_spec()
    if isinstance(choice, FixedEpsilon):
        return "fixed", spec, {}, {}
    if isinstance(choice, PriEpsilon):
        return "pri", None, spec["pri"], {}
    return "risk", None, {}, spec["risk"]


def to_parameter(request) -> Any:
    """The flow's `epsilon` value for a parsed request (what the CLI and the scheduled flow pass):
    the request format, which the parameter accepts as it is. None when the request fixes none."""
    if request.epsilon_mode == "pri":
        return {"pri": dict(request.pri)}
    if request.epsilon_mode == "risk":
        return {"risk": dict(request.risk)}
    return request.epsilon


def describe(err: ValidationError) -> str:
    """One line for a model's validation error: each field and what is wrong with it."""
    parts = []
    for e in err.errors():
        field = next((str(p) for p in e["loc"] if isinstance(p, str) and p in ALL_FIELDS), "")
        parts.append(f"{field + ': ' if field else ''}{e['msg']}")
    return "; ".join(dict.fromkeys(parts))
