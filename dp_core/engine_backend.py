"""The one interface between the DP engine and a data engine, and the choice of which one runs.

Everything DP (bounds, selection, noise, intervals, reports) stays above this interface; a backend
only makes the input visible as `dp_input`, describes it, and runs SQL whose results are
partition-sized (the bounding plan, its histograms, the checks' aggregates). The engine writes
that SQL in DuckDB's syntax with the backend's dialect pieces (bounding.DIALECT_PIECES: the keyed
hash, the per-unit cutoff); a backend that speaks another dialect transpiles it (sqlglot).
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import pandas as pd

from .errors import InvalidQueryError

BACKENDS = ("duckdb", "spark")


@runtime_checkable
class Backend(Protocol):
    """A data engine holding the input as `dp_input`."""

    dialect: str  # the plan's dialect pieces ("duckdb", "spark")
    derived: bool  # `dp_input` is rows a query selected, not the caller's whole input (engine.check_values)

    def schema(self) -> dict[str, str]:
        """Column name -> type name in DuckDB's words (BIGINT, DOUBLE, VARCHAR, ...)."""

    def run(self, sql: str) -> pd.DataFrame:
        """Run one statement (DuckDB syntax) and return its partition-sized result."""

    def close(self) -> None:
        """Release what the backend holds for this input (connection, temporary view)."""


def open_backend(data, backend: str | None = None, *, spark=None, threads: int | None = None) -> Backend:
    """The backend for `data`: a prepared backend as is; Spark for a Spark DataFrame or when
    backend="spark" (a table name or a lake path then names Spark's data); DuckDB otherwise."""
    from .backend import DuckDBBackend
    from .backend_spark import SparkBackend, is_spark_input

    if isinstance(data, (DuckDBBackend, SparkBackend)):
        if backend is not None and data.dialect != backend:
            raise InvalidQueryError(f"backend={backend!r} was asked for, but the input is a prepared {data.dialect} backend")
        return data
    if backend not in (None, *BACKENDS):
        raise InvalidQueryError(f"unknown backend {backend!r}: choose one of {', '.join(BACKENDS)}")
    if backend == "spark" or spark is not None or is_spark_input(data):
        if backend == "duckdb":
            raise InvalidQueryError("backend='duckdb' cannot read a Spark DataFrame: use backend='spark'")
        return SparkBackend.for_input(data, spark=spark)
    return DuckDBBackend.for_input(data, threads=threads)
