"""The DP SQL front end: both syntaxes, row-ownership checks, compilation to the typed query.

    from dp_core.sql import Table, run_sql
    result = run_sql(
        "SELECT WITH ANONYMIZATION education, ANON_AVG(age, 17, 90) AS age FROM adult GROUP BY education",
        {"adult": Table(df, privacy_unit="person_id")}, epsilon=1.0)
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from ..backend import DuckDBBackend
from ..engine import execute
from ..result import DPResult
from .compile import CompiledQuery, compile_sql
from .ownership import TableInfo


@dataclass(frozen=True)
class Table:
    """A registered input: the data (DataFrame, Arrow table, CSV/Parquet path) and its unit column."""

    data: object
    privacy_unit: str


def catalog_of(backend: DuckDBBackend, tables: dict[str, Table]) -> dict[str, TableInfo]:
    return {name: TableInfo(name, tuple(backend.columns(name)), t.privacy_unit) for name, t in tables.items()}


def compile_for(sql: str, tables: dict[str, Table], **request) -> CompiledQuery:
    """Compile `sql` against these tables (their columns are read, not their rows)."""
    backend = DuckDBBackend.for_tables({name: t.data for name, t in tables.items()})
    try:
        return compile_sql(sql, catalog_of(backend, tables), **request)
    finally:
        backend.close()


def run_sql(sql: str, tables: dict[str, Table], *, threads: int | None = None, **request) -> DPResult:
    """Compile and execute an anonymized SELECT. request: epsilon, delta,
    max_partitions_contributed (when the query's OPTIONS do not give them) and any other Query
    field (noise, public_partitions, selection, confidence, ...)."""
    backend = DuckDBBackend.for_tables({name: t.data for name, t in tables.items()}, threads=threads)
    compiled = compile_sql(sql, catalog_of(backend, tables), **request)
    backend.define_input(compiled.source_sql("duckdb"))
    result = execute(compiled.query, backend)
    return postprocess(result, compiled)


def postprocess(result: DPResult, compiled: CompiledQuery) -> DPResult:
    """ORDER BY and LIMIT of the anonymized SELECT, applied to the released table."""
    table = result.table
    if compiled.order_by:
        table = table.sort_values([c for c, _ in compiled.order_by],
                                  ascending=[not desc for _, desc in compiled.order_by], kind="stable")
    if compiled.limit is not None:
        table = table.head(compiled.limit)
    return replace(result, table=table.reset_index(drop=True))


__all__ = ["CompiledQuery", "Table", "compile_for", "compile_sql", "run_sql"]
