"""The vetted catalogue of evaluation functions for utility signaling (pri.md, "Utility signaling").

An evaluation function f takes a released-style table (group keys and aggregate columns) and
returns one number. The platform computes f(DP output) and f(raw output) on the same groups;
f(DP output) is post-processing, f(raw output) is not DP: each function says what its raw value
can reveal, so that a controller reviews it once. New functions come only through the Python entry
point group `dprelease.evaluators`, and an analyst may only use the names a controller enabled in
a policy, with parameters checked against the function's declared ones.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from importlib.metadata import entry_points

import numpy as np
import pandas as pd

from dp_core import InvalidQueryError

GROUP = "dprelease.evaluators"


@dataclass(frozen=True)
class Evaluator:
    """An evaluation function with its parameters and what its value on raw data can reveal."""

    name: str
    function: object  # (table, **params) -> float
    params: dict  # name -> (type, required)
    reveals: str
    description: str

    def check_params(self, params: dict) -> dict:
        unknown = set(params) - set(self.params)
        if unknown:
            raise InvalidQueryError(f"evaluator {self.name!r}: unknown parameter(s) {sorted(unknown)} "
                                    f"(allowed: {sorted(self.params)})")
        out = {}
        for key, (kind, required) in self.params.items():
            if key not in params:
                if required:
                    raise InvalidQueryError(f"evaluator {self.name!r} needs the parameter {key!r}")
                continue
            value = params[key]
            if kind is float and isinstance(value, int) and not isinstance(value, bool):
                value = float(value)
            if not isinstance(value, kind) or isinstance(value, bool) and kind is not bool:
                raise InvalidQueryError(f"evaluator {self.name!r}: {key!r} must be {kind.__name__}, got {value!r}")
            out[key] = value
        return out

    def __call__(self, table: pd.DataFrame, params: dict) -> float:
        return float(self.function(table, **self.check_params(params)))


def _column(table: pd.DataFrame, column: str) -> np.ndarray:
    if column not in table.columns:
        raise InvalidQueryError(f"the output has no column {column!r} (columns: {list(table.columns)})")
    return table[column].to_numpy(dtype=np.float64)


def _against(table: pd.DataFrame, column: str, reference: list) -> tuple[np.ndarray, np.ndarray]:
    """The column and the analyst's reference values (one per group, in the table's row order)."""
    values, ref = _column(table, column), np.asarray(reference, dtype=np.float64)
    if ref.size != values.size:
        raise InvalidQueryError(f"reference has {ref.size} values for {values.size} groups")
    return values, ref


def mean_relative_error(table: pd.DataFrame, column: str, reference: list, floor: float = 1.0) -> float:
    """Mean of |value - reference| / max(|reference|, floor) over groups, against reference values
    the analyst supplies (e.g. last year's published figures)."""
    values, ref = _against(table, column, reference)
    return float(np.mean(np.abs(values - ref) / np.maximum(np.abs(ref), floor)))


def l1_distance(table: pd.DataFrame, column: str, reference: list) -> float:
    """Sum of |value - reference| over groups (reference supplied by the analyst)."""
    values, ref = _against(table, column, reference)
    return float(np.abs(values - ref).sum())


def l2_distance(table: pd.DataFrame, column: str, reference: list) -> float:
    """Euclidean distance between the column and the analyst's reference values."""
    values, ref = _against(table, column, reference)
    return float(np.sqrt(((values - ref) ** 2).sum()))


def spearman_rank(table: pd.DataFrame, column: str, other: str) -> float:
    """Spearman rank correlation between two columns of the output (e.g. the relation the analyst
    studies: count against average income, across groups)."""
    a, b = pd.Series(_column(table, column)).rank(), pd.Series(_column(table, other)).rank()
    if len(a) < 3:
        raise InvalidQueryError("rank agreement needs at least 3 groups")
    r = np.corrcoef(a, b)[0, 1]
    return 0.0 if math.isnan(r) else float(r)


def top_k_groups(table: pd.DataFrame, column: str, k: int, key: str, expected: list) -> float:
    """Share of the analyst's expected groups (values of the group key `key`) that are in the
    output's top k by `column`."""
    if key not in table.columns:
        raise InvalidQueryError(f"the output has no group key {key!r}")
    top = set(table.sort_values(column, ascending=False)[key].head(k).astype(str))
    return len(top & {str(x) for x in expected}) / max(len(expected), 1)


def threshold_share(table: pd.DataFrame, column: str, threshold: float) -> float:
    """Share of groups whose value is at least the threshold (the decision the analyst takes)."""
    return float((_column(table, column) >= threshold).mean())


def majority_classifier_accuracy(table: pd.DataFrame, label: str, count: str, features: list, test: list) -> float:
    """Accuracy, on the analyst's public labelled test records, of a majority-vote classifier
    trained on the output's counts: for each combination of the feature keys, predict the label
    with the largest count. test: records {feature: value, ..., label: value}."""
    for col in [label, count, *features]:
        if col not in table.columns:
            raise InvalidQueryError(f"the output has no column {col!r}")
    best = table.sort_values(count, ascending=False).drop_duplicates(features)
    rule = {tuple(str(r[f]) for f in features): str(r[label]) for _, r in best.iterrows()}
    if not test:
        raise InvalidQueryError("the classifier needs public test records")
    hits = [rule.get(tuple(str(rec.get(f)) for f in features)) == str(rec.get(label)) for rec in test]
    return float(np.mean(hits))


BUILTIN = {
    "mean_relative_error": Evaluator(
        "mean_relative_error", mean_relative_error,
        {"column": (str, True), "reference": (list, True), "floor": (float, False)},
        "on raw data: the average relative gap between the true values and the analyst's reference, "
        "one number over all groups", "mean relative error against reference values"),
    "l1_distance": Evaluator(
        "l1_distance", l1_distance, {"column": (str, True), "reference": (list, True)},
        "on raw data: the total absolute gap to the reference; with one group it is that group's exact gap",
        "L1 distance to reference values"),
    "l2_distance": Evaluator(
        "l2_distance", l2_distance, {"column": (str, True), "reference": (list, True)},
        "on raw data: the Euclidean gap to the reference; with one group it is that group's exact gap",
        "L2 distance to reference values"),
    "spearman_rank": Evaluator(
        "spearman_rank", spearman_rank, {"column": (str, True), "other": (str, True)},
        "on raw data: how well the true values of two columns agree in rank across groups (one number "
        "in [-1, 1]); reveals the ordering only in aggregate", "Spearman rank agreement of two output columns"),
    "top_k_groups": Evaluator(
        "top_k_groups", top_k_groups,
        {"column": (str, True), "k": (int, True), "key": (str, True), "expected": (list, True)},
        "on raw data: how many of the listed groups are truly among the top k: with k = 1 and one key it "
        "says whether that group is the largest", "top-k overlap with the analyst's expected groups"),
    "threshold_share": Evaluator(
        "threshold_share", threshold_share, {"column": (str, True), "threshold": (float, True)},
        "on raw data: the share of groups truly above the threshold: with one group it says whether that "
        "group is above it", "agreement of a threshold decision"),
    "majority_classifier_accuracy": Evaluator(
        "majority_classifier_accuracy", majority_classifier_accuracy,
        {"label": (str, True), "count": (str, True), "features": (list, True), "test": (list, True)},
        "on raw data: the accuracy of the majority rule learned from the true counts on the analyst's test "
        "records; with few records it can hint at the true majority label of a group",
        "accuracy of a majority-vote classifier trained on the released counts"),
}


def catalogue() -> dict[str, Evaluator]:
    """The built-in evaluators plus those installed through the `dprelease.evaluators` entry point
    (each entry point loads an Evaluator)."""
    out = dict(BUILTIN)
    for ep in entry_points(group=GROUP):
        obj = ep.load()
        if not isinstance(obj, Evaluator):
            raise InvalidQueryError(f"entry point {ep.name!r} of {GROUP} is not a dprelease Evaluator")
        out[ep.name] = obj
    return out


def enabled_evaluator(name: str, enabled: list[str]) -> Evaluator:
    """The evaluator `name` if a controller enabled it (in a policy); refused otherwise."""
    if name not in enabled:
        raise InvalidQueryError(
            f"evaluator {name!r} is not enabled for this dataset and analyst (enabled: {sorted(enabled) or 'none'}); "
            "a controller enables evaluators by name in a policy"
        )
    available = catalogue()
    if name not in available:
        raise InvalidQueryError(f"evaluator {name!r} is enabled but not installed (catalogue: {sorted(available)})")
    return available[name]
