"""A request's column types, judged before any data is read: the engine's own column checks
(dp_core.engine.check_columns: an average, sum, variance or quantile reads a numeric column) on a
spec's query or each DP SELECT's input, evaluated by DuckDB over empty tables typed as the release
will see them.

What the release's engine sees for a column is its escrowed Arrow type, read by DuckDB; the store
keeps, per column, the pandas dtype name that type maps to (admin._schema_names). That name tells
the engine's type exactly for integers, floats, booleans and durations. It leaves a choice for

- `datetime64[ms]`: an Arrow date32 (DATE: a CSV's dates) or a timestamp in ms (TIMESTAMP_MS);
- `object`: text (VARCHAR), and also a decimal (DECIMAL, numeric) or a time, a zoned timestamp,
  binary, a list, nothing (not numeric). Registration's checks give every numeric column, decimals
  included, the check `expect_column_values_to_be_between` (checks.DatasetProfile), a text column
  never: an `object` column with it is a decimal; one without it is not numeric, and stands in as
  text. The unit column has no such check: it may be either. (A suite given by hand through the
  Python API decides the same way: a decimal column left without that check counts as text.)

A request is refused here only when the engine refuses it for every type its columns may have (the
choices of the columns the SQL names, or of every column when an alias renames them by position: at
most MAX_CHOICES combinations, else no verdict), and only when every DP SELECT's input binds over
the stand-ins. Anything else is left to the release, which checks again on the data, as before. The
message is the engine's for the first choice (text, DATE): the one a CSV's column gets (a time or
a zoned timestamp refused as text is named VARCHAR here, by its own type on the data).
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable

import pyarrow as pa
from sqlglot import exp

from dp_core.engine import check_columns
from dp_core.errors import InvalidDataError
from dp_core.query import Query
from dp_core.sql import CompiledStatement
from dp_core.sql.outer import part_schemas
from dp_core.sql.syntax import parse_statement

#: the most type combinations tried for one request (each is one DuckDB bind of every DP SELECT)
MAX_CHOICES = 16
#: the numeric type an `object` column may be (precision and scale do not change the verdict)
DECIMAL = pa.decimal128(18, 3)


def check_sql_types(sql: str, statement: CompiledStatement, datasets: dict[str, object]) -> None:
    """Raise the engine's InvalidDataError when every type the registered schemas allow makes the
    engine refuse a DP SELECT's column; return when one passes or one cannot be judged here.
    datasets: the SQL's table name -> the registered dataset record it reads (protected and public)."""
    tree = parse_statement(sql).tree
    words = named(tree)
    everything = renames_by_position(tree)

    def judge(tables: dict[str, pa.Table]) -> InvalidDataError | None:
        schemas = part_schemas(statement, tables)  # InvalidDataError: a source that does not bind
        return next(filter(None, (column_refusal(part.query, schema) for part, schema in zip(statement.parts, schemas))),
                    None)

    refuse_if_every_type_refuses({name: column_choices(ds) for name, ds in datasets.items()},
                                 lambda col: everything or col.lower() in words, judge)


def check_query_types(query: Query, ds) -> None:
    """The same for a spec request's typed query, read straight from its dataset `ds`."""
    from dp_core.backend import DuckDBBackend
    from dp_core.row_filter import compile_filter

    words = {query.privacy_unit, *query.group_by, *(a.column for a in query.aggregates if a.column)}
    if query.where is not None:
        words |= set(compile_filter(query.where)[1])

    def judge(tables: dict[str, pa.Table]) -> InvalidDataError | None:
        backend = DuckDBBackend.for_input(tables[ds.name])
        try:
            return column_refusal(query, backend.schema())
        finally:
            backend.close()

    refuse_if_every_type_refuses({ds.name: column_choices(ds)}, lambda col: col in words, judge)


def refuse_if_every_type_refuses(choices: dict[str, dict[str, tuple[pa.DataType, ...]]], matters,
                                 judge: Callable[[dict[str, pa.Table]], InvalidDataError | None]) -> None:
    """Call `judge` (its refusal, or None) on stand-ins of every combination of the types the columns
    for which `matters` holds may have (the others at their most likely type); raise the first
    combination's refusal when every one is refused, return as soon as one passes or does not bind
    (`judge` raises InvalidDataError), or when there are over MAX_CHOICES."""
    open_columns = sorted((name, col) for name, cols in choices.items() for col, types in cols.items()
                          if len(types) > 1 and matters(col))
    combinations = list(itertools.islice(itertools.product(*(choices[n][c] for n, c in open_columns)), MAX_CHOICES + 1))
    if len(combinations) > MAX_CHOICES:
        return  # too many types to try: the release decides on the data
    refusals = []
    for combination in combinations:
        picked = dict(zip(open_columns, combination))
        tables = {name: stand_in({col: picked.get((name, col), types[0]) for col, types in cols.items()})
                  for name, cols in choices.items()}
        try:
            refusal = judge(tables)
        except InvalidDataError:
            return  # an input that does not bind over these types: not a verdict on them
        if refusal is None:
            return  # these types pass: the request may work
        refusals.append(refusal)
    raise refusals[0]


def column_refusal(query: Query, schema: dict[str, str]) -> InvalidDataError | None:
    """The engine's column checks (check_columns) of `query` on an input of this schema: its refusal, or None."""
    try:
        check_columns(query, schema)
    except InvalidDataError as err:
        return err
    return None


def column_choices(ds) -> dict[str, tuple[pa.DataType, ...]]:
    """Column -> the Arrow types the release's engine may read it as, from the registered record
    (most likely first): one for every kind but `datetime64[ms]` and some `object` columns."""
    numbers = {e["kwargs"].get("column") for e in json.loads(ds.expectations_json)
               if e.get("type") == "expect_column_values_to_be_between"}
    out = {}
    for col, kind in json.loads(ds.schema_json).items():
        if kind == "object":
            out[col] = ((DECIMAL,) if col in numbers else
                        (pa.string(), DECIMAL) if col == ds.privacy_unit else (pa.string(),))
        elif kind == "datetime64[ms]":
            out[col] = (pa.date32(), pa.timestamp("ms"))
        else:
            out[col] = exact_type(kind)
    return out


def exact_type(kind: str) -> tuple[pa.DataType, ...]:
    """The Arrow type of a numpy kind (an integer, float, bool, datetime or duration: DuckDB reads
    it as the escrow's column); a half float is read as a float (numeric either way). A kind this
    does not know may be anything: text or a decimal."""
    import numpy as np

    if kind == "float16":
        return (pa.float32(),)
    try:
        return (pa.from_numpy_dtype(np.dtype(kind)),)
    except (TypeError, pa.ArrowNotImplementedError):
        return (pa.string(), DECIMAL)


def planning_stand_in(ds) -> pa.Table:
    """The empty table a SQL request is compiled against while planning (pipeline.plan): each column
    as the engine will read it where the record says exactly, a DATE for `datetime64[ms]` (DuckDB
    casts a DATE to a timestamp wherever one is needed), and DuckDB's NULL type for a column that may
    be text or something else (it binds wherever text, a decimal or a time would: an unknown type
    never refuses a request that works on the data; check_sql_types judges its aggregates)."""
    types = {}
    for col, choices in column_choices(ds).items():
        first = choices[0]
        types[col] = first if len(choices) == 1 and first != pa.string() or first == pa.date32() else pa.null()
    return stand_in(types)


def stand_in(types: dict[str, pa.DataType]) -> pa.Table:
    """An empty Arrow table of these column types: DuckDB reads its schema and no row."""
    return pa.table({col: pa.array([], type=t) for col, t in types.items()})


def named(tree: exp.Expression) -> set[str]:
    """Every identifier the SQL's tree writes (lower case): the columns whose type can matter."""
    return {i.name.lower() for i in tree.find_all(exp.Identifier)}


def renames_by_position(tree: exp.Expression) -> bool:
    """An alias with a column list (`t(a, b)`, a CTE's `c(a, b)`) names columns without writing
    theirs: then any column's type can matter."""
    return any(alias.columns for alias in tree.find_all(exp.TableAlias))
