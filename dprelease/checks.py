"""Data checks with great-expectations before anything is computed (platform.md, step 2).

An expectation suite is stored with each dataset at registration (`DatasetProfile`, built batch
by batch while the file is sealed): the column set, a non-null privacy unit, finite numeric
columns, and the categories of low-cardinality text columns. A failure ends the release with the
validation summary; nothing is spent.

At scale the rows never reach pandas: the data engine (DuckDB, fed the decrypted Arrow batches)
computes one aggregate per expectation in a single scan (null, out-of-range and out-of-set
counts) and a small *witness* table holding, per column, its minimum, maximum, a NULL when it
has any, and its distinct values outside the expected set (a few). great-expectations then runs
the suite on the witness table: for these row-wise expectations the verdict on the witness equals
the verdict on the whole data (every value lies between min and max; every unexpected value has a
representative), and the counts shown are the engine's exact ones. When the escrow's Parquet
footer already answers every expectation exactly (NULL counts, integer ranges inside their bounds:
`_answered_by_statistics`), no row is decoded for the checks at all.
great-expectations takes seconds to import: it judges in a process of its own when a command
started one ahead, else here, imported on first use (`dprelease.checks_judge`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

from dprelease import checks_judge

MAX_CATEGORIES = 50
FINITE = 1.7976931348623157e308  # the largest float: anything beyond is infinite
WITNESSES = 20  # distinct unexpected values kept per column for great-expectations to see
SUPPORTED = ("expect_table_columns_to_match_set", "expect_column_values_to_not_be_null",
             "expect_column_values_to_be_between", "expect_column_values_to_be_in_set")


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


# -- the suite registered with a dataset ---------------------------------------------------------

@dataclass
class DatasetProfile:
    """What registration learns about the columns, one Arrow batch at a time (bounded memory:
    at most MAX_CATEGORIES + 1 values kept per text column)."""

    columns: list[str] = field(default_factory=list)
    numeric: set[str] = field(default_factory=set)
    categories: dict[str, set | None] = field(default_factory=dict)  # None: too many values
    unit: str | None = None  # the privacy-unit column, whose empty cells the suite's first check refuses
    rows: int = 0  # rows seen so far
    unit_missing: int = 0  # rows whose unit is empty (null)
    first_unit_missing: int | None = None  # the first such row, 1-based (the header is not a row)

    @classmethod
    def for_schema(cls, schema, unit: str | None = None) -> DatasetProfile:
        import pyarrow as pa

        profile = cls(columns=list(schema.names), unit=unit if unit in schema.names else None)
        for f in schema:
            if pa.types.is_nested(f.type):
                continue  # lists and structs: carried along, checked by the column set only
            if (pa.types.is_integer(f.type) or pa.types.is_floating(f.type) or pa.types.is_decimal(f.type)):
                profile.numeric.add(f.name)
            else:
                profile.categories[f.name] = set()
        return profile

    def add(self, batch) -> None:
        import pyarrow.compute as pc

        if self.unit is not None and (missing := batch.column(self.unit).null_count):
            if self.first_unit_missing is None:
                first = pc.index(pc.is_null(batch.column(self.unit)), True).as_py()
                self.first_unit_missing = self.rows + first + 1
            self.unit_missing += missing
        self.rows += batch.num_rows

        for name, seen in self.categories.items():
            if seen is None:
                continue
            seen.update(str(v) for v in pc.unique(batch.column(name).drop_null()).to_pylist())
            if len(seen) > MAX_CATEGORIES:
                self.categories[name] = None

    def expectations(self, privacy_unit: str) -> list[dict]:
        out: list[dict] = [
            {"type": "expect_table_columns_to_match_set", "kwargs": {"column_set": list(self.columns), "exact_match": True}},
            {"type": "expect_column_values_to_not_be_null", "kwargs": {"column": privacy_unit}},
        ]
        for col in self.columns:
            if col == privacy_unit:
                continue
            if col in self.numeric:
                out.append({"type": "expect_column_values_to_be_between",
                            "kwargs": {"column": col, "min_value": -FINITE, "max_value": FINITE}})
            elif self.categories.get(col) is not None:
                out.append({"type": "expect_column_values_to_be_in_set",
                            "kwargs": {"column": col, "value_set": sorted(self.categories[col])}})
        return out


def default_expectations(df, privacy_unit: str) -> list[dict]:
    """The suite for a DataFrame or Arrow table held in memory (small data; registration streams)."""
    import pyarrow as pa

    table = df if isinstance(df, pa.Table) else pa.Table.from_pandas(df, preserve_index=False)
    profile = DatasetProfile.for_schema(table.schema)
    for batch in table.to_batches():
        profile.add(batch)
    return profile.expectations(privacy_unit)


# -- validation: aggregates in the engine, verdicts by great-expectations --------------------------

def _sql_literal(value) -> str:
    from dp_core.sql_text import literal

    return literal(value)


def _unexpected_sql(e: dict, columns: set[str]) -> str | None:
    """SQL for the count of rows breaking a row-wise expectation (None: nothing to count)."""
    from dp_core.sql_text import ident

    kind, kw = e["type"], e["kwargs"]
    col = kw.get("column")
    if col is not None and col not in columns:
        return None
    if kind == "expect_column_values_to_not_be_null":
        return f"count(*) FILTER (WHERE {ident(col)} IS NULL)"
    if kind == "expect_column_values_to_be_between":
        tests = []
        if kw.get("min_value") is not None:
            tests.append(f"{ident(col)} >= {_sql_literal(kw['min_value'])}")
        if kw.get("max_value") is not None:
            tests.append(f"{ident(col)} <= {_sql_literal(kw['max_value'])}")
        inside = " AND ".join(tests) or "true"
        return f"count(*) FILTER (WHERE {ident(col)} IS NOT NULL AND NOT ({inside}))"
    if kind == "expect_column_values_to_be_in_set":
        values = ", ".join(_sql_literal(str(v)) for v in kw["value_set"]) or "NULL"
        return f"count(*) FILTER (WHERE {ident(col)} IS NOT NULL AND CAST({ident(col)} AS VARCHAR) NOT IN ({values}))"
    return None


def _column_summary_sql(columns: list[str]) -> list[str]:
    from dp_core.sql_text import ident

    out = []
    for k, col in enumerate(columns):
        c = ident(col)
        out += [f"min({c}) AS lo{k}", f"max({c}) AS hi{k}", f"count(*) FILTER (WHERE {c} IS NULL) AS nulls{k}"]
    return out


def _witness(backend, expectations: list[dict], columns: list[str], summary, counts: dict):
    """Per column: min, max, a NULL if any, and (for an in-set column with unexpected values) up
    to WITNESSES distinct values outside the set; padded by repeating the first value (repeats
    change no row-wise verdict)."""
    import pandas as pd

    from dp_core.bounding import INPUT_NAME
    from dp_core.sql_text import ident

    in_sets = {e["kwargs"]["column"]: (i, e["kwargs"]["value_set"]) for i, e in enumerate(expectations)
               if e["type"] == "expect_column_values_to_be_in_set"}
    values: dict[str, list] = {}
    for k, col in enumerate(columns):
        vals = [v for v in (summary[f"lo{k}"], summary[f"hi{k}"])
                if not _nested_value(v) and (not pd.isna(v) or isinstance(v, float))]
        if col in in_sets:
            index, allowed_values = in_sets[col]
            if counts.get(index, 0) > 0:  # only a failing column needs a scan for its odd values
                c = ident(col)
                allowed = ", ".join(_sql_literal(str(v)) for v in allowed_values) or "NULL"
                odd = backend.run(f"SELECT DISTINCT {c} AS v FROM {INPUT_NAME} WHERE {c} IS NOT NULL AND "
                                  f"CAST({c} AS VARCHAR) NOT IN ({allowed}) LIMIT {WITNESSES}")
                vals += list(odd["v"])
            vals = [str(v) for v in vals]  # the set holds the values as text (registration)
        if int(summary[f"nulls{k}"]) > 0:
            vals.append(None)
        values[col] = vals or [None]
    return _witness_frame(values)


def _witness_frame(values: dict[str, list]):
    """The witness table: each column's values, padded by repeating its first (a repeat changes no
    row-wise verdict)."""
    import pandas as pd

    length = max((len(v) for v in values.values()), default=0)
    return pd.DataFrame({c: v + [v[0]] * (length - len(v)) for c, v in values.items()}, columns=list(values))


def _nested_value(value) -> bool:
    """A list, struct or array value (a nested column's min/max): no scalar to witness."""
    import numpy as np

    return isinstance(value, (list, tuple, dict, np.ndarray))


def _answered_by_statistics(data, expectations: list[dict]):
    """(counts, witness) from the Parquet footer's per-column statistics (`EscrowRows`), when they
    give every expectation's exact count without a scan, else None. Exact means: a NULL count for
    a column that holds no NaN (a NaN is missing, as a NULL is, but the footer does not count it),
    and a range check on an integer column whose least and greatest values lie inside the range
    (count 0; any value outside, and the scan counts how many). Set membership and every other
    kind need the rows. The witness is the scan's: per column its minimum, maximum and a NULL
    when it has any, so great-expectations judges exactly what it judges after a scan."""
    read = getattr(data, "column_statistics", None)
    stats = read() if callable(read) else None
    if not stats:
        return None
    counts: dict[int, int] = {}
    for i, e in enumerate(expectations):
        kind, kw = e["type"], e["kwargs"]
        if kind == "expect_table_columns_to_match_set":
            continue
        column = stats.get(kw.get("column"))
        if column is None:
            return None
        if kind == "expect_column_values_to_not_be_null" and set(kw) == {"column"} and column.kind != "float":
            counts[i] = column.nulls
        elif (kind == "expect_column_values_to_be_between" and set(kw) <= {"column", "min_value", "max_value"}
              and column.kind == "integer" and _inside(column, kw.get("min_value"), kw.get("max_value"))):
            counts[i] = 0
        else:
            return None
    values = {}
    for name, column in stats.items():
        seen = [] if column is None or column.minimum is None else [column.minimum, column.maximum]
        if column is not None and column.nulls > 0:
            seen.append(None)
        values[name] = seen or [None]  # a column no expectation reads: its values are never judged
    return counts, _witness_frame(values)


def _inside(column, low, high) -> bool:
    """Every value of the column lies in [low, high] (a missing bound is no limit; all-NULL: yes)."""
    if column.minimum is None:
        return True
    for bound in (low, high):
        if bound is not None and (isinstance(bound, bool) or not isinstance(bound, (int, float))
                                  or not math.isfinite(bound)):
            return False  # a bound that is not a finite number: the scan judges it (and words the refusal)
    return (low is None or column.minimum >= low) and (high is None or column.maximum <= high)


def validate(data, expectations: list[dict], progress: Callable[[str], None] | None = None,
             threads: int | None = None) -> CheckReport:
    """Run the suite on `data` (any engine input: the escrow's replayable stream of decrypted
    batches, a DataFrame, an Arrow table, a path; a Spark DataFrame or a prepared backend). The
    rows go to the engine, never to pandas: one scan computes every count and every column's
    min, max and nulls. On Spark (an external dataset) the scan runs in Spark and
    great-expectations judges the witness through its Spark datasource."""
    from dp_core.bounding import INPUT_NAME
    from dp_core.engine_backend import open_backend

    say = progress or (lambda _msg: None)
    spark = None
    from_footer = _answered_by_statistics(data, expectations)
    if from_footer is not None:
        counts, witness = from_footer
        say("data checks: answered by the dataset's Parquet statistics (no row decoded)")
    else:
        backend = open_backend(data, threads=threads)
        spark = getattr(backend, "spark", None) if backend.dialect == "spark" else None
        try:
            columns = list(backend.schema())
            counted = {i: sql for i, e in enumerate(expectations) if (sql := _unexpected_sql(e, set(columns)))}
            say(f"data checks: {len(counted)} expectation count(s) and {len(columns)} column summaries in one scan")
            select = [f"{sql} AS c{i}" for i, sql in counted.items()] + _column_summary_sql(columns)
            summary = backend.run(f"SELECT {', '.join(select)} FROM {INPUT_NAME}").iloc[0]
            counts = {i: int(summary[f"c{i}"]) for i in counted}
            witness = _witness(backend, expectations, columns, summary, counts)
        finally:
            if backend is not data:  # a backend handed in is its owner's to close
                backend.close()
    say(f"data checks: great-expectations on the engine's aggregates ({'Spark' if spark else 'pandas'} datasource)")
    results = checks_judge.judge(witness, expectations, spark)
    lines, success = [], True
    for i, (e, r) in enumerate(zip(expectations, results, strict=True)):
        target = e["kwargs"].get("column", "table")
        ok = bool(r.success) and counts.get(i, 0) == 0
        detail = ""
        if not ok:
            if i in counts:
                detail = f": {counts[i]} unexpected value(s)"
            elif e["type"] not in SUPPORTED:
                detail = ": not supported at scale (checked on the engine's per-column summary only)"
            else:
                detail = f": observed {r.result.get('observed_value')}"
        success &= ok
        lines.append(f"{'ok  ' if ok else 'FAIL'} {e['type']} [{target}]{detail}")
    return CheckReport(success, tuple(lines))
