"""Data checks with great-expectations before anything is computed (platform.md, step 2).

An expectation suite is stored with each dataset at registration (`default_expectations`): the
column set, a non-null privacy unit, finite numeric columns, and the categories of low-cardinality
text columns. A failure ends the release with the validation summary; nothing is spent.
great-expectations takes seconds to import, so it is imported inside `validate`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

MAX_CATEGORIES = 50
FINITE = 1.7976931348623157e308  # the largest float: anything beyond is infinite


@dataclass(frozen=True)
class CheckReport:
    success: bool
    lines: tuple[str, ...]  # one line per expectation: what it checks and how it went

    def summary(self) -> str:
        head = "Data checks passed" if self.success else "Data checks FAILED"
        return "\n".join([head, *self.lines])

    def failure(self, dataset: str) -> str:
        """One line: which checks failed on which dataset, and what to do (the CLI prints it as is)."""
        failed = "; ".join(line.removeprefix("FAIL").strip() for line in self.lines if line.startswith("FAIL"))
        return (f"Data checks FAILED on dataset {dataset!r}: {failed}. Nothing was computed: register the data "
                "again with checks that fit it, or fix the data")


def default_expectations(df: pd.DataFrame, privacy_unit: str) -> list[dict]:
    """The suite registered with a dataset (controller side: it may hold category values)."""
    out: list[dict] = [
        {"type": "expect_table_columns_to_match_set", "kwargs": {"column_set": list(df.columns), "exact_match": True}},
        {"type": "expect_column_values_to_not_be_null", "kwargs": {"column": privacy_unit}},
    ]
    for col in df.columns:
        if col == privacy_unit:
            continue
        if pd.api.types.is_numeric_dtype(df[col]) and not pd.api.types.is_bool_dtype(df[col]):
            out.append({"type": "expect_column_values_to_be_between",
                        "kwargs": {"column": col, "min_value": -FINITE, "max_value": FINITE}})
        elif _nested(df[col]):
            continue  # lists and structs: carried along, checked by the column set only
        elif df[col].nunique(dropna=True) <= MAX_CATEGORIES:
            values = sorted(str(v) for v in df[col].dropna().unique())
            out.append({"type": "expect_column_values_to_be_in_set", "kwargs": {"column": col, "value_set": values}})
    return out


def _nested(values: pd.Series) -> bool:
    """A column of lists, arrays or dicts (Parquet list/struct): no categories to check."""
    sample = values.dropna().head(100)
    return any(isinstance(v, (list, dict, tuple, np.ndarray)) for v in sample)


def validate(df: pd.DataFrame, expectations: list[dict]) -> CheckReport:
    """Run the suite on an in-memory DataFrame (an ephemeral context: nothing written to disk)."""
    import great_expectations as gx
    from great_expectations.data_context.types.base import ProgressBarsConfig
    from great_expectations.expectations.expectation_configuration import ExpectationConfiguration

    context = gx.get_context(mode="ephemeral")
    context.variables.progress_bars = ProgressBarsConfig(globally=False, metric_calculations=False)
    batch = context.data_sources.add_pandas("dprelease").add_dataframe_asset("data").add_batch_definition_whole_dataframe("all")
    suite = gx.ExpectationSuite(name="dataset-checks")
    for e in expectations:
        suite.add_expectation_configuration(ExpectationConfiguration(type=e["type"], kwargs=e["kwargs"]))
    suite = context.suites.add(suite)
    definition = context.validation_definitions.add(gx.ValidationDefinition(name="checks", data=batch, suite=suite))
    result = definition.run(batch_parameters={"dataframe": df}, result_format="SUMMARY")
    lines = []
    for r in result.results:
        cfg = r.expectation_config
        target = cfg.kwargs.get("column", "table")
        detail = ""
        if not r.success:
            n = r.result.get("unexpected_count")
            detail = f": {n} unexpected value(s)" if n is not None else f": observed {r.result.get('observed_value')}"
        lines.append(f"{'ok  ' if r.success else 'FAIL'} {cfg.type} [{target}]{detail}")
    return CheckReport(bool(result.success), tuple(lines))
