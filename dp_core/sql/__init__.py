"""The DP SQL front end: both syntaxes, row-ownership checks, compilation to typed queries,
outer queries over DP results.

    from dp_core.sql import Table, run_sql
    result = run_sql(
        "SELECT WITH ANONYMIZATION education, ANON_AVG(age, 17, 90) AS age FROM adult GROUP BY education",
        {"adult": Table(df, privacy_unit="person_id"), "regions": Table(regions_df)}, epsilon=1.0)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, TypeVar

import pandas as pd

from ..backend import DuckDBBackend
from ..bounding import INPUT_NAME
from ..engine import check_rows, rules_hold_by_statistics
from ..errors import DPError, InvalidQueryError
from ..result import DPResult
from ..sql_text import ident
from .compile import CompiledQuery
from .outer import StatementResult, check_executable, postprocess, run_statement
from .ownership import TableInfo
from .sample import render
from .statement import CompiledStatement, compile_statement

T = TypeVar("T")
#: how a check reads one table: its SQL runner and the table's name in that SQL
TableRelation = tuple[Callable[[str], pd.DataFrame], str]


@dataclass(frozen=True)
class Table:
    """A registered input: the data (DataFrame, Arrow table, CSV/Parquet path) and its unit
    column; privacy_unit=None declares a public table (no one's rows: joins and outer queries
    may read it freely, and reading it spends nothing)."""

    data: object
    privacy_unit: str | None = None


def catalog_of(backend: DuckDBBackend, tables: dict[str, Table]) -> dict[str, TableInfo]:
    return {name: TableInfo(name, tuple(backend.columns(name)), t.privacy_unit) for name, t in tables.items()}


def _guarded(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """Every refusal is the project's own error: an unexpected exception in the front end is
    reported as an invalid query naming it (never a bare traceback from the parser)."""
    try:
        return fn(*args, **kwargs)
    except DPError:
        raise
    except RecursionError:
        raise InvalidQueryError("the query is nested too deeply") from None
    except Exception as err:  # the contract: a plan or a DPError (the fuzz tests call the unguarded compiler)
        raise InvalidQueryError(f"the query could not be compiled ({type(err).__name__}: {err})") from err


def compile_statement_for(sql: str, tables: dict[str, Table], **request: Any) -> CompiledStatement:
    """Compile a whole statement against these tables (their columns are read, not their rows)."""
    backend = DuckDBBackend.for_tables({name: t.data for name, t in tables.items()})
    try:
        statement = _guarded(compile_statement, sql, catalog_of(backend, tables), **request)
        _guarded(check_executable, statement, backend, sql)
        return statement
    finally:
        backend.close()


def compile_for(sql: str, tables: dict[str, Table], **request: Any) -> CompiledQuery:
    """Compile a statement and return its first DP SELECT (the statement has at least one)."""
    statement = compile_statement_for(sql, tables, **request)
    if not statement.parts:
        raise InvalidQueryError("not a DP query: write SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS (...) ... or "
                                "SELECT WITH ANONYMIZATION ...")
    return statement.parts[0]


def compile_sql(sql: str, catalog: dict[str, TableInfo], **request: Any) -> CompiledQuery:
    """The first DP SELECT of `sql` compiled against a catalog (kept for callers of issue 4)."""
    statement = _guarded(compile_statement, sql, catalog, **request)
    if not statement.parts:
        raise InvalidQueryError("not a DP query: the statement has no SELECT WITH DIFFERENTIAL_PRIVACY / ANONYMIZATION")
    return statement.parts[0]


def run_sql(sql: str, tables: dict[str, Table], *, threads: int | None = None, backend: str | None = None,
            spark: Any = None, **request: Any) -> DPResult:
    """Compile and execute a statement. request: epsilon, delta, max_partitions_contributed (the
    statement's totals when its OPTIONS do not give them) and any other Query field (noise,
    public_partitions, selection, confidence, ...). Returns the DPResult of a single plain DP
    SELECT, else a StatementResult (outer table, summed budget, each part's result).
    backend="spark" (or Spark DataFrames as tables): the tables are Spark DataFrames, table names
    or lake paths; the statement is compiled against their schemas and each DP SELECT runs on Spark."""
    from ..backend_spark import is_spark_input

    if backend == "spark" or spark is not None or any(is_spark_input(t.data) for t in tables.values()):
        return _run_sql_on_spark(sql, tables, spark, **request)
    if backend not in (None, "duckdb"):
        raise InvalidQueryError(f"unknown backend {backend!r}: choose one of duckdb, spark")
    compiled = compile_statement_for(sql, tables, **request)
    whole = DuckDBBackend.for_tables({name: tables[name].data for name in protected_tables(compiled)}, threads=threads)
    try:
        check_tables(compiled, tables, lambda name: (whole.run, ident(name)))
    finally:
        whole.close()
    result = run_statement(compiled, {name: t.data for name, t in tables.items()}, threads=threads)
    return replace(result, tables_read=compiled.tables_read({n: t.privacy_unit for n, t in tables.items()}))


def protected_tables(compiled: CompiledStatement) -> list[str]:
    """The tables with a privacy unit that the statement's DP SELECTs read."""
    return sorted({name for part in compiled.parts for name in part.protected_tables})


def check_tables(compiled: CompiledStatement, tables: dict[str, Table],
                 relation_of: Callable[[str], TableRelation]) -> None:
    """The whole-input rules (engine.check_rows) on each protected table the statement reads: the
    caller's own data, checked whole (not empty, a unit id on every row), so that the verdict never
    depends on the rows a DP SELECT selects from it (no scan where the table's own exact statistics
    prove them: engine.rules_hold_by_statistics). relation_of: name -> (run, its SQL name)."""
    for name in protected_tables(compiled):
        unit = tables[name].privacy_unit
        if unit is None:  # protected_tables: only tables with a unit
            raise InvalidQueryError(f"table {name!r} has no privacy unit, yet the statement reads it as protected")
        if rules_hold_by_statistics(tables[name].data, unit):
            continue
        run, relation = relation_of(name)
        check_rows(run, relation, unit, label=f"table {name!r}")


def _run_sql_on_spark(sql: str, tables: dict[str, Table], spark: Any, **request: Any) -> DPResult:
    """Compile against empty stand-ins of the Spark tables (their schemas), run each DP SELECT on
    Spark, and the outer query (over partition-sized released tables) in DuckDB."""
    from ..backend_spark import SparkBackend, SparkTables

    views = SparkTables.open({name: t.data for name, t in tables.items()}, spark)
    try:
        stand_ins = {name: Table(views.empty(name), t.privacy_unit) for name, t in tables.items()}
        compiled = compile_statement_for(sql, stand_ins, **request)
        for part in compiled.parts:  # what Spark cannot compute without failing on a value: refused first
            views.source(render(part.source_sql("duckdb"), "spark", 0))  # a sample's stand-in key
        check_tables(compiled, tables, lambda name: (SparkBackend(views.spark, views.views[name]).run, INPUT_NAME))
        local = set(compiled.public_tables) | {t for p in compiled.parts for t in p.public_groups_tables + p.output_tables}
        public = {name: views.local(name) for name in sorted(local)}  # outer query and PUBLIC_GROUPS keys
        result = run_statement(compiled, public, part_backend=views.backend_for, part_dialect="spark")
        return replace(result, tables_read=compiled.tables_read({n: t.privacy_unit for n, t in tables.items()}))
    finally:
        views.close()


__all__ = ["CompiledQuery", "CompiledStatement", "StatementResult", "Table", "compile_for", "compile_sql",
           "compile_statement_for", "postprocess", "run_sql"]
