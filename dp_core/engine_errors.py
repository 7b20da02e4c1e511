"""Engine errors without the data's values.

A query that fails on one value of the data (a cast that does not parse, a number out of range,
an overflow) makes DuckDB and Spark put that value in their message: "Could not convert string
'alice' to INT32", "Type INT64 with value 1000 can't be cast", "[CAST_INVALID_INPUT] The value
'a' of the type STRING cannot be cast". That message would travel to the store, the logs and the
Prefect UI in plain text, outside the escrow. For such failures the message keeps the engine's
name for the failure and the remedy, and drops the engine's words (which may hold the value)."""

from __future__ import annotations

import re

#: DuckDB's errors raised on a value of the data, by exception class, with the name DuckDB prints
DUCKDB_VALUE_ERRORS = {"ConversionException": "Conversion Error", "OutOfRangeException": "Out of Range Error",
                       "InvalidInputException": "Invalid Input Error"}
#: Spark's error conditions (ANSI mode) whose messages quote the value that failed
SPARK_VALUE_ERRORS = frozenset({
    "CAST_INVALID_INPUT", "CAST_OVERFLOW", "CAST_OVERFLOW_IN_TABLE_INSERT", "NUMERIC_VALUE_OUT_OF_RANGE",
    "NUMERIC_OUT_OF_SUPPORTED_RANGE", "ARITHMETIC_OVERFLOW", "BINARY_ARITHMETIC_OVERFLOW", "DATETIME_OVERFLOW",
    "CANNOT_PARSE_TIMESTAMP", "CANNOT_PARSE_DECIMAL", "CONVERSION_INVALID_INPUT", "INVALID_ARRAY_INDEX",
    "INVALID_ARRAY_INDEX_IN_ELEMENT_AT", "INVALID_FRACTION_OF_SECOND", "INVALID_URL", "INVALID_PARAMETER_VALUE",
    "DUPLICATED_MAP_KEY", "ILLEGAL_DAY_OF_WEEK"})
REMEDY = ("a value of the data does not fit the query (not shown: it is the data's); check the query's casts, "
          "arithmetic and formats, or filter such rows out")
_QUOTED = re.compile(r"'(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\"")  # 'value' or "value"


def duckdb_message(err: BaseException) -> str | None:
    """The message for a DuckDB error raised on a value of the data; None for any other error
    (a query's own mistakes: the engine's words name only the query's parts)."""
    name = DUCKDB_VALUE_ERRORS.get(type(err).__name__)
    return f"{name}: {REMEDY}" if name is not None else None


def spark_message(condition: str | None, first_line: str) -> str:
    """A Spark failure's first line without the data's values: a condition that quotes the failing
    value is named with the remedy; any other keeps its words, quoted literals blanked."""
    if condition in SPARK_VALUE_ERRORS:
        return f"[{condition}] {REMEDY}"
    return blank_quoted(first_line)


def blank_quoted(text: str) -> str:
    """`text` with every quoted literal ('...' or "...") blanked: what an engine quotes may be a value."""
    return _QUOTED.sub(lambda m: m.group(0)[0] + "…" + m.group(0)[0], text)
