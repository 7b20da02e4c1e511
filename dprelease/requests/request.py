"""A release request: what an analyst asks for, as SQL or as a spec, and how epsilon is chosen.

    dataset: adult
    title: Hours worked by education
    sql: |
      SELECT WITH ANONYMIZATION education, ANON_COUNT(*, 1) AS people FROM adult GROUP BY education
    epsilon: 1.0                       # fixed; or
    # epsilon: {pri: {p: 50}}          # chosen from the privacy risk indicator (public mode); or
    # epsilon: {risk: {trust: low, sensitivity: high, max_risk: 0.2, max_noise: 10, n: 2}}
    delta: 1.0e-6
    max_partitions_contributed: 1

Instead of `sql`, a `query` mapping may list `group_by` and `aggregates` (each with kind, column,
lower, upper, q, name). The request is data-free; it is checked before any data is read.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path

import yaml

from dp_core import Aggregate, InvalidQueryError, Query
from dp_core.input_checks import check_delta, check_epsilon
from dp_core.query import AggregateKind

from . import epsilon as epsilon_choice


class RequestError(InvalidQueryError):
    """The release request is malformed; the message names the field."""


@dataclass(frozen=True)
class ReleaseRequest:
    dataset: str
    title: str = ""
    sql: str | None = None
    query: dict | None = None
    epsilon: float | None = None
    epsilon_mode: str = "fixed"  # fixed | pri | risk
    pri: dict = field(default_factory=dict)
    risk: dict = field(default_factory=dict)
    delta: float = 1e-6
    max_partitions_contributed: int = 1
    requested_by: str | None = None
    backend: str = "auto"  # the engine: auto (the dataset's own), duckdb or spark (dprelease.external)

    def to_json(self) -> str:
        fields = asdict(self)
        if fields["backend"] == "auto":  # the default is left out: a request's JSON (and digest) as before
            del fields["backend"]
        return json.dumps(fields, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> ReleaseRequest:
        return cls(**json.loads(text))

    def to_spec(self) -> dict:
        """The request in the request format, what a request file holds (`parse_request` reads it
        back to this request); `to_json` is the store's record, which a request file may not be."""
        spec = {"dataset": self.dataset, "title": self.title}
        spec.update({"sql": self.sql} if self.sql is not None else {"query": self.query})
        epsilon = epsilon_choice.to_parameter(self)
        if epsilon is not None:
            spec["epsilon"] = epsilon
        spec.update(delta=self.delta, max_partitions_contributed=self.max_partitions_contributed)
        if self.requested_by is not None:
            spec["requested_by"] = self.requested_by
        if self.backend != "auto":
            spec["backend"] = self.backend
        return spec

    @property
    def text(self) -> str:
        """What was asked, for reports."""
        return self.sql.strip() if self.sql else yaml.safe_dump(self.query, sort_keys=False).strip()


def _number(value, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise RequestError(f"{name} must be a finite number, got {value!r}")
    return float(value)


def parse_request(data: dict) -> ReleaseRequest:
    """A request from a mapping (a YAML or JSON spec file); every field is checked by name."""
    if not isinstance(data, dict):
        raise RequestError("a release request must be a mapping (YAML or JSON object)")
    known = {"dataset", "title", "sql", "query", "epsilon", "delta", "max_partitions_contributed", "requested_by",
             "backend"}
    unknown = set(data) - known
    if unknown:
        raise RequestError(f"unknown field(s) {sorted(unknown)} in the request (allowed: {sorted(known)})")
    if not isinstance(data.get("dataset"), str) or not data["dataset"]:
        raise RequestError("the request must name a registered dataset: dataset: <name>")
    if (data.get("sql") is None) == (data.get("query") is None):
        raise RequestError("give exactly one of `sql` (a DP SQL query) or `query` (group_by and aggregates)")
    eps = data.get("epsilon")
    mode, pri, risk, fixed = "fixed", {}, {}, None
    if eps is not None:  # checked by the same models as the release form's choice
        mode, fixed, pri, risk = epsilon_choice.parse_spec(eps, RequestError)
    if fixed is not None:
        try:
            fixed = check_epsilon(eps if isinstance(eps, (int, float)) else fixed)  # the engine's rule, the engine's message
        except InvalidQueryError as err:
            raise RequestError(str(err)) from None
    try:
        delta = check_delta(_number(data.get("delta", 1e-6), "delta"))  # the engine's rule, the engine's message
    except InvalidQueryError as err:
        raise RequestError(str(err)) from None
    cu = data.get("max_partitions_contributed", 1)
    if isinstance(cu, bool) or not isinstance(cu, int) or cu < 1:
        raise RequestError(f"max_partitions_contributed must be a whole number >= 1, got {cu!r}")
    backend = data.get("backend") or "auto"
    if backend not in ("auto", "duckdb", "spark"):
        raise RequestError(f"backend must be one of auto, duckdb, spark, got {backend!r}")
    if data.get("query") is not None:
        query_from_spec(data["query"], "unit", 1.0)  # checks the spec's shape now
    return ReleaseRequest(
        dataset=data["dataset"], title=str(data.get("title") or ""), sql=data.get("sql"), query=data.get("query"),
        epsilon=fixed, epsilon_mode=mode, pri=pri, risk=risk, delta=delta, max_partitions_contributed=cu,
        requested_by=data.get("requested_by"), backend=backend,
    )


def load_request(path: Path) -> ReleaseRequest:
    """A request from a .yaml/.yml/.json file, or a .sql file (then dataset/epsilon come separately)."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise RequestError(f"{path}: not UTF-8 text: a request is a .yaml or .json file") from None
    try:
        data = json.loads(text) if str(path).endswith(".json") else yaml.safe_load(text)
    except (json.JSONDecodeError, yaml.YAMLError) as err:
        raise RequestError(f"{path}: not valid YAML/JSON: {err}") from None
    try:
        return parse_request(data)
    except RequestError as err:  # say where: the request file
        raise RequestError(f"{path}: {err}") from None


def query_from_spec(spec: dict, privacy_unit: str, epsilon: float, **fields) -> Query:
    """The typed query of a `query:` spec: group_by, aggregates, and optional engine fields."""
    if not isinstance(spec, dict) or not isinstance(spec.get("aggregates"), list) or not spec["aggregates"]:
        raise RequestError("query: needs a non-empty list `aggregates` (each: kind, column, lower, upper, ...)")
    aggs = []
    for i, a in enumerate(spec["aggregates"]):
        if not isinstance(a, dict) or "kind" not in a:
            raise RequestError(f"query.aggregates[{i}] needs at least `kind`")
        extra = set(a) - {"kind", "column", "lower", "upper", "q", "name", "weight"}
        if extra:
            raise RequestError(f"query.aggregates[{i}]: unknown field(s) {sorted(extra)}")
        kind: AggregateKind = a["kind"]
        aggs.append(Aggregate(kind, column=a.get("column"), lower=a.get("lower"), upper=a.get("upper"), q=a.get("q"),
                              name=a.get("name"), weight=a.get("weight", 1.0)))
    extra = set(spec) - {"aggregates", "group_by", "where", "public_partitions", "noise", "selection"}
    if extra:
        raise RequestError(f"query: unknown field(s) {sorted(extra)}")
    options = {k: spec[k] for k in ("where", "noise", "selection") if k in spec}
    if "public_partitions" in spec:
        options["public_partitions"] = [tuple(k) if isinstance(k, list) else k for k in spec["public_partitions"]]
    query = Query(tuple(aggs), privacy_unit=privacy_unit, epsilon=epsilon, group_by=tuple(spec.get("group_by") or ()),
                  **options, **fields)
    query.validate()
    return query
