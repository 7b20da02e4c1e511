"""Safe SQL text pieces: quoted identifiers and exact literals (DuckDB dialect, the plan's source
dialect; `bounding.render` transpiles the finished plan to other dialects with sqlglot)."""

from __future__ import annotations

import datetime as _dt
import math
import uuid as _uuid

from .errors import InvalidQueryError


def ident(name: str) -> str:
    """A double-quoted identifier; embedded quotes are doubled, so any column name is safe."""
    if not isinstance(name, str) or not name:
        raise InvalidQueryError(f"column names must be non-empty strings, got {name!r}")
    return '"' + name.replace('"', '""') + '"'


def literal(x: object) -> str:
    """An exact SQL literal: integers stay integers (integer sums stay exact), floats use repr
    (round-trips exactly) cast to DOUBLE, strings are quoted, None is NULL; dates, timestamps, times,
    UUIDs and bytes as the values of such key columns come back from the engine."""
    if x is None:
        return "NULL"
    if isinstance(x, bool):
        return "TRUE" if x else "FALSE"
    if isinstance(x, int):
        return str(x)
    if isinstance(x, float):
        x = float(x)  # a NumPy float64 is a float whose repr is "np.float64(...)"
        if not math.isfinite(x):
            raise InvalidQueryError(f"non-finite number {x!r} in a query")
        if x.is_integer() and abs(x) < 2**53:
            return str(int(x))
        return f"CAST({x!r} AS DOUBLE)"
    if isinstance(x, str):
        return "'" + x.replace("'", "''") + "'"
    if isinstance(x, _dt.datetime):
        return f"TIMESTAMP '{x.isoformat(sep=' ')}'"
    if isinstance(x, _dt.date):
        return f"DATE '{x.isoformat()}'"
    if isinstance(x, _dt.time) and x.tzinfo is None:
        return f"TIME '{x.isoformat()}'"
    if isinstance(x, _uuid.UUID):  # a UUID column's value: compared as text, or cast to the column's type
        return f"'{x}'"
    if isinstance(x, (bytes, bytearray, memoryview)):  # a BLOB's value, in hex (any byte is safe)
        return f"unhex('{bytes(x).hex()}')"
    if hasattr(x, "item"):  # numpy scalar
        return literal(x.item())
    raise InvalidQueryError(f"cannot use {x!r} ({type(x).__name__}) as a partition key or bound")
